"""The report's figure pages. Each page function returns a matplotlib Figure, or None when the
study has no runs for it (the cover then says which pages were left out and why).

Every page: a title, one sentence saying what it shows, axes with units, a legend. A page compares
runs that differ only in the axes it plots (``Study.slice``), every other setting at the base.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reports.results import Study, metric  # noqa: E402

PAGE = (11.69, 8.27)  # A4 landscape, inches


def _name(value: Any) -> str:
    return "preset default" if value is None else str(value)


def order(value: Any) -> tuple:
    """Sort key putting numbers in numeric order, then everything else by name."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def new_page(title: str, sentence: str, nrows: int = 1, ncols: int = 2):
    fig, axes = plt.subplots(nrows, ncols, figsize=PAGE, squeeze=False)
    fig.suptitle(title, fontsize=15, fontweight="bold", x=0.02, ha="left", y=0.975)
    fig.text(0.02, 0.915, sentence, fontsize=10.5, wrap=True, va="top")
    fig.subplots_adjust(top=0.80, bottom=0.10, left=0.07, right=0.98, wspace=0.25, hspace=0.45)
    return fig, axes.ravel()


def _lines(ax, records, x_axis: str, group_axis: str, key: str, *, ylabel: str, xlabel: str, title: str,
           scale: float = 1.0, group_label: str = "") -> None:
    groups: dict[Any, list] = {}
    for r in records:
        v = metric(r, key)
        if v is not None:
            groups.setdefault(r["config"][group_axis], []).append((r["config"][x_axis], v * scale))
    for g in sorted(groups, key=order):
        pts = sorted(groups[g])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{group_label}{_name(g)}")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _bars(ax, records, x_axis: str, group_axis: str, key: str, *, ylabel: str, xlabel: str, title: str,
          scale: float = 1.0, group_label: str = "") -> None:
    xs = sorted({r["config"][x_axis] for r in records}, key=order)
    groups = sorted({r["config"][group_axis] for r in records}, key=order)
    width = 0.8 / max(len(groups), 1)
    for j, g in enumerate(groups):
        vals = []
        for x in xs:
            match = [metric(r, key) for r in records if r["config"][x_axis] == x and r["config"][group_axis] == g]
            match = [m for m in match if m is not None]
            vals.append(np.mean(match) * scale if match else np.nan)
        ax.bar(np.arange(len(xs)) + (j - (len(groups) - 1) / 2) * width, vals, width,
               label=f"{group_label}{_name(g)}")
    ax.set_xticks(np.arange(len(xs)), [_name(x) for x in xs])
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def throughput_vs_rate(study: Study):
    runs = study.slice("block_size", "rate_scale")
    if not (study.varies("rate_scale") and len({r["config"]["rate_scale"] for r in runs}) > 1):
        return None
    source_rate = study.meta["source"].get("rate")
    known = source_rate is not None or all(r["config"].get("rate") is not None for r in runs)
    xlabel = "request rate (requests/s)" if known else "request-rate scale (x the trace's rate)"
    for r in runs:
        rate = r["config"].get("rate") if r["config"].get("rate") is not None else source_rate
        r["config"]["_rate"] = r["config"]["rate_scale"] * (rate if known and rate is not None else 1.0)
    fig, (a, b) = new_page("Throughput and latency vs load",
                           "As requests arrive faster, throughput rises until the KV cache or compute saturates, "
                           "and normalized latency (end-to-end time per output token) climbs; one line per "
                           "block size, every other setting at the study's base.")
    _lines(a, runs, "_rate", "block_size", "throughput_tokens_s", ylabel="throughput (tokens/s)", xlabel=xlabel,
           title="Throughput", group_label="block size ")
    _lines(b, runs, "_rate", "block_size", "normalized_latency_s_per_token", ylabel="normalized latency (s/token)",
           xlabel=xlabel, title="Normalized latency (mean)", group_label="block size ")
    return fig


def latency_cdfs(study: Study):
    axis = "block_size" if study.varies("block_size") else next((k for k in study.axes() if study.varies(k)), None)
    runs = study.slice(axis) if axis else study.ok[:1]
    runs = [r for r in runs if r["series"]["latency_quantiles"]["ttft_s"]]
    if not runs:
        return None
    fig, axes = new_page("Latency distributions",
                         f"Cumulative distributions of time to first token, time per output token and end-to-end "
                         f"latency over all completed requests, one line per {axis or 'run'} (others at base).",
                         ncols=3)
    q = np.linspace(0, 1, 101)
    for ax, (key, label) in zip(axes, (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "end-to-end (s)"))):
        for r in sorted(runs, key=lambda r: order(r["config"].get(axis))):
            values = r["series"]["latency_quantiles"][key]
            if values:
                ax.plot(values, q, label=f"{axis} {_name(r['config'].get(axis))}" if axis else "run")
        ax.set(xlabel=label, ylabel="fraction of requests", title=label.split(" (")[0] + " CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def memory_over_time(study: Study):
    runs = study.slice("allocator") if study.varies("allocator") else study.slice()[:1]
    empty = [r["config"]["allocator"] for r in runs if not r["series"]["memory"]["time_s"]]
    runs = [r for r in runs if r["series"]["memory"]["time_s"]]
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: ["paged", "oracle", "pow2", "max"].index(r["config"]["allocator"])
                  if r["config"]["allocator"] in ("paged", "oracle", "pow2", "max") else 9)
    ncols = min(len(runs), 4)
    fig, axes = new_page("KV-cache memory over time",
                         "Where the KV cache's token slots go during the run: holding tokens (used), allocated but "
                         "empty (internal fragmentation: partly filled last blocks under paging, reservations for "
                         "tokens not yet generated under the contiguous Orca baselines), kept by the prefix cache, "
                         "and free." + (f" Not shown ({', '.join(empty)}): no request was ever admitted." if empty else ""),
                         ncols=ncols)
    colors = {"used": "#2b8a3e", "fragmentation": "#e8590c", "cached": "#1c7ed6", "free": "#dee2e6"}
    labels = ["used (holding tokens)", "allocated, empty", "prefix-cached", "free"]
    for ax, r in zip(axes, runs):
        mem = r["series"]["memory"]
        if mem["time_s"]:
            ax.stackplot(mem["time_s"], *(np.array(mem[k]) * 100 for k in colors), labels=labels,
                         colors=list(colors.values()))
        name = r["config"]["allocator"]
        ax.set(xlabel="simulated time (s)", ylabel="share of KV slots (%)", ylim=(0, 100),
               title=("paged (pagesim)" if name == "paged" else f"Orca {name}"))
        ax.legend(fontsize=7, loc="lower right")
    return fig


def preemption_page(study: Study):
    if not study.varies("preemption"):
        return None
    runs = study.slice("preemption", "block_size")
    if not runs:
        return None
    for r in runs:
        moved = r["summary"].get("swapped_blocks") or {}
        r["summary"]["_swap_gb"] = (moved.get("out", 0) + moved.get("in", 0)) * r["deployment"]["block_bytes"] / 2**30
    fig, (a, b, c) = new_page("Preemption: swap vs recompute",
                              "When the cache runs out, a request is preempted: its blocks are swapped to CPU memory "
                              "or dropped and recomputed later. Preemptions, data moved over the host link, and "
                              "the resulting time to first token, per mode and block size.", ncols=3)
    _bars(a, runs, "block_size", "preemption", "preemptions_total", ylabel="preemptions (count)",
          xlabel="block size (tokens)", title="Preemptions")
    _bars(b, runs, "block_size", "preemption", "_swap_gb", ylabel="swap traffic (GiB, out + in)",
          xlabel="block size (tokens)", title="Swap traffic")
    _bars(c, runs, "block_size", "preemption", "ttft_s.p99", ylabel="TTFT p99 (s)", xlabel="block size (tokens)",
          title="TTFT p99")
    return fig


def prefix_cache_page(study: Study):
    if not study.varies("eviction"):
        return None
    runs = study.slice("eviction", "kv_cache_gb")
    if not runs:
        return None
    sized = study.varies("kv_cache_gb")
    fig, (a, b) = new_page("Prefix caching: hit rate vs cache size",
                           "Share of prompt tokens served from the prefix cache, and the resulting throughput, per "
                           "eviction policy" + (" as the KV cache grows." if sized else "."))
    draw = _lines if sized else _bars
    x = "kv_cache_gb" if sized else "eviction"
    draw(a, runs, x, "eviction", "prefix_hit_rate", ylabel="prefix hit rate (%)", scale=100.0,
         xlabel="KV cache (GiB per GPU)" if sized else "eviction policy", title="Prefix hit rate")
    draw(b, runs, x, "eviction", "throughput_tokens_s", ylabel="throughput (tokens/s)",
         xlabel="KV cache (GiB per GPU)" if sized else "eviction policy", title="Throughput")
    return fig


def block_size_page(study: Study):
    runs = study.slice("block_size")
    if not study.varies("block_size") or len(runs) < 2:
        return None
    runs = sorted(runs, key=lambda r: r["config"]["block_size"])
    fig, axes = new_page("Block-size sensitivity",
                         "Small blocks waste less memory in each sequence's last block but cost more in the attention "
                         "kernel (block-table lookups); large blocks share prefixes only in whole blocks. Each metric "
                         "against block size, every other setting at base.", ncols=4)
    xs = [r["config"]["block_size"] for r in runs]
    for ax, (key, label, scale) in zip(axes, (
        ("throughput_tokens_s", "throughput (tokens/s)", 1.0),
        ("normalized_latency_s_per_token", "normalized latency (s/token)", 1.0),
        ("memory_utilization", "KV memory utilization (%)", 100.0),
        ("prefix_hit_rate", "prefix hit rate (%)", 100.0),
    )):
        pts = [(x, metric(r, key)) for x, r in zip(xs, runs)]
        pts = [(x, y * scale) for x, y in pts if y is not None]  # a metric a run lacks is not a zero
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="paged (base settings)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set(xlabel="block size (tokens)", ylabel=label, title=label.split(" (")[0])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


FIGURE_PAGES = (
    ("Throughput and latency vs load", throughput_vs_rate, "needs a rate_scale axis"),
    ("Latency distributions", latency_cdfs, "no completed requests"),
    ("KV-cache memory over time", memory_over_time, "no runs at the base settings"),
    ("Preemption: swap vs recompute", preemption_page, "needs a preemption axis"),
    ("Prefix caching: hit rate vs cache size", prefix_cache_page, "needs an eviction axis"),
    ("Block-size sensitivity", block_size_page, "needs a block_size axis"),
)
