"""The report's figure pages about one aspect each: latency distributions, memory and activity over
time, preemption, prefix caching. Each returns a ``Page``, or None when the study has nothing for
it (the cover then says which pages were left out and why).

A page shows a slice (``Study.slice``: the runs that differ from the base only in the axes it
plots) and its caption says how many completed runs are elsewhere. Titles name only what the
study varies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagesim.reports.grid_pages import axis_label, axis_title
from pagesim.reports.results import Study, metric, order
from pagesim.reports.run_config import value_label
from pagesim.reports.style import Page, from_zero, legend_rows, new_page, page_legend, plain_ticks, short


def elsewhere(study: Study, shown: int) -> str:
    rest = len(study.ok) - shown
    return (f" Shows {shown} of the {len(study.ok)} completed runs; the other {rest} are in the all-runs table and "
            "the grid pages." if rest > 0 else " Shows every completed run.")


def _label(study: Study, record: dict[str, Any], axes: tuple[str, ...]) -> str:
    parts = [f"{a}={value_label(record['config'].get(a))}" for a in axes]
    if study.seeded:
        parts.append(f"seed={record['config'].get('seed')}")
    return ", ".join(parts) or "base settings"


def _base_seed(study: Study, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of each setting's seeds, the base seed's run (a page of one bar or line per run)."""
    if not study.seeded:
        return runs
    seed = study.base.get("seed")
    return [r for r in runs if r["config"].get("seed") == seed]


def _replica_words(runs: list[dict[str, Any]]) -> str:
    replicas = max((r["config"].get("replicas") or 1 for r in runs), default=1)
    return f" With {replicas} replicas, the series are replica 0's." if replicas > 1 else ""


def latency_cdfs(study: Study) -> Page | None:
    preferred = ("block_size", "preemption", "eviction", "kv_cache_gb", "kv_offloading_size", "pd_split")
    axes = sorted((a for a in study.varying() if a not in ("rate_scale", "rate")),
                  key=lambda a: preferred.index(a) if a in preferred else len(preferred))
    axis = axes[0] if axes else None
    runs = study.slice(axis) if axis else study.slice()
    runs = [r for r in runs if (r.get("series") or {}).get("latency_quantiles", {}).get("ttft_s")]
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: order(r["config"].get(axis)))[:12]
    what = f"one line per {axis_label(axis).lower()}" if axis else "the base run"
    title = "Latency distributions" + (f" per {axis_label(axis).lower()}" if axis else "")
    caption = ("Cumulative distributions of time to first token, time per output token and end-to-end latency over "
               f"each run's completed requests, {what} (every other setting at the base)." + elsewhere(study, len(runs)))
    fig, axes = new_page(title, caption, ncols=3, legend_rows=legend_rows(len(runs)))
    q = np.linspace(0, 100, 101)
    for ax, (key, label) in zip(axes, (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "end-to-end (s)"))):
        for r in runs:
            values = r["series"]["latency_quantiles"][key]
            if values:
                ax.plot(values, q, label=_label(study, r, (axis,) if axis else ()))
        ax.set(xlabel=label, ylabel="requests at or below (%)", title=label.split(" (")[0] + " CDF", ylim=(0, 100))
        ax.grid(alpha=0.3)
        from_zero(ax, x=True, y=False)
        plain_ticks(ax, "x")
    page_legend(fig, axes)
    return Page(title, caption, fig)


MEMORY_COLORS = {"used": "#2b8a3e", "fragmentation": "#e8590c", "cached": "#1c7ed6", "free": "#dee2e6"}
MEMORY_LABELS = ("used (holding tokens)", "allocated, empty", "prefix-cached", "free")
ALLOCATORS = ("paged", "oracle", "pow2", "max")


def memory_over_time(study: Study) -> Page | None:
    if not study.varies("allocator"):
        return None
    runs = [r for r in study.slice("allocator") if r["series"]["memory"]["time_s"]]
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: ALLOCATORS.index(r["config"]["allocator"])
                  if r["config"]["allocator"] in ALLOCATORS else 9)[:4]
    title = "KV-cache memory over time: paging vs contiguous reservation"
    caption = ("Where the KV cache's token slots go during the run: holding tokens (used), allocated but empty "
               "(internal fragmentation: partly filled last blocks under paging, reservations for tokens not yet "
               "generated under the contiguous Orca baselines), kept by the prefix cache, and free."
               + elsewhere(study, len(runs)))
    fig, axes = new_page(title, caption, ncols=len(runs), legend_rows=1)
    for ax, r in zip(axes, runs):
        _memory_stack(ax, r)
        name = r["config"]["allocator"]
        ax.set_title("paged (pagesim)" if name == "paged" else f"Orca {name}")
    page_legend(fig, axes[:1], ncol=4)
    return Page(title, caption, fig)


def _memory_stack(ax, record: dict[str, Any]) -> None:
    mem = record["series"]["memory"]
    ax.stackplot(mem["time_s"], *(np.array(mem[k]) * 100 for k in MEMORY_COLORS), labels=MEMORY_LABELS,
                 colors=list(MEMORY_COLORS.values()))
    ax.set(xlabel="simulated time (s)", ylabel="share of KV slots (%)", ylim=(0, 100))
    from_zero(ax, x=True, y=False)
    plain_ticks(ax, "x")


def activity_over_time(study: Study) -> Page | None:
    """Queue, running, batch and swap pool over time beside the KV memory, for the base run and,
    when the study varies preemption, the same run under each mode."""
    axis = "preemption" if study.varies("preemption") else None
    runs = [r for r in (study.slice(axis) if axis else study.slice())
            if (r.get("series") or {}).get("activity", {}).get("time_s")]
    runs = _base_seed(study, runs)
    if not runs:
        return None
    runs = sorted(runs, key=lambda r: order(r["config"].get(axis)))[:4]
    shown = "the base run" + (" under each preemption mode" if axis else "")
    title = "Queue, batch and memory over time" + (" per preemption mode" if axis else "")
    caption = (f"The life of {shown}: requests waiting for admission (swapped-out requests not counted), running, and "
               "in each step's batch, blocks held in the CPU swap pool, and the KV memory of the first run shown. A "
               "queue that grows to the end of the arrivals means the run is past saturation."
               + _replica_words(runs) + elsewhere(study, len(runs)))
    fig, axes = new_page(title, caption, nrows=2, ncols=3, legend_rows=legend_rows(len(runs) + 4))
    panels = (("waiting", "requests waiting (count)", "Waiting queue"), ("running", "requests running (count)",
              "Running requests"), ("batch_requests", "requests in the step (count)", "Batch size"),
              ("swap_blocks", "blocks in the swap pool (count)", "Swap pool"),
              ("batch_tokens", "tokens in the step (count)", "Batched tokens"))
    for ax, (key, ylabel, name) in zip(axes, panels):
        for r in runs:
            act = r["series"]["activity"]
            ax.plot(act["time_s"], act[key], lw=1, label=_label(study, r, (axis,) if axis else ()))
        ax.set(xlabel="simulated time (s)", ylabel=ylabel, title=name)
        ax.grid(alpha=0.3)
        if not any(any(r["series"]["activity"][key]) for r in runs):
            ax.set_ylim(0, 1)
            ax.set_yticks([0, 1])
            ax.text(0.5, 0.5, "zero throughout", transform=ax.transAxes, ha="center", color="#868e96")
        from_zero(ax, x=True)
        plain_ticks(ax)
        plain_ticks(ax, "x")
    mem_ax = axes[5]
    if runs[0]["series"]["memory"]["time_s"]:
        _memory_stack(mem_ax, runs[0])
        mem_ax.set_title(f"KV memory ({_label(study, runs[0], (axis,) if axis else ())})", fontsize=10)
    else:
        mem_ax.axis("off")
    page_legend(fig, axes, ncol=4)
    return Page(title, caption, fig)


def preemption_page(study: Study) -> Page | None:
    axes = tuple(a for a in ("preemption", "block_size") if study.varies(a)) or tuple(study.varying()[:1])
    runs = sorted(_base_seed(study, study.slice(*axes)), key=lambda r: tuple(order(r["config"].get(a)) for a in axes))
    runs = [r for r in runs if "preemption" in r][:16]
    if not any(r["preemption"].get("swap", 0) + r["preemption"].get("recompute", 0) for r in runs):
        return None  # (nothing to split: the all-runs table says how many preemptions each run had)
    labels = ["\n".join(short(value_label(r["config"].get(a)), 12) for a in axes) or "base" for r in runs]
    xlabel = " / ".join(axis_title(a).lower() for a in axes) or "run"
    title = "Preemptions: swap vs recompute, and what they cost"
    caption = ("When the cache runs out a running request is preempted: its blocks are swapped to CPU memory or "
               "dropped and recomputed later (a swap falls back to recompute when the swap pool is full). Per run: "
               "preemptions by the mode actually used, tokens computed again after recompute preemptions, bytes "
               "moved over the host link (out and in), and TTFT p99." + elsewhere(study, len(runs)))
    fig, panels = new_page(title, caption, nrows=2, ncols=2, legend_rows=1)
    fig.subplots_adjust(hspace=0.75)
    x = np.arange(len(runs))
    swap = [r["preemption"].get("swap", 0) for r in runs]
    recompute = [r["preemption"].get("recompute", 0) for r in runs]
    a, b, c, d = panels
    a.bar(x, recompute, color="#1c7ed6", label="recompute")
    a.bar(x, swap, bottom=recompute, color="#f08c00", label="swap")
    a.set(ylabel="preemptions (count)", title="Preemptions by mode")
    b.bar(x, [r["preemption"].get("recomputed_tokens", 0) / 1e3 for r in runs], color="#1c7ed6")
    b.set(ylabel="tokens recomputed (thousands)", title="Recomputation")
    c.bar(x, [r["preemption"].get("swapped_bytes", 0) / 2**30 for r in runs], color="#f08c00")
    c.set(ylabel="swapped per GPU, out + in (GiB)", title="Swap traffic")
    d.bar(x, [metric(r, "ttft_s.p99") or 0 for r in runs], color="#868e96")
    d.set(ylabel="TTFT p99 (s)", title="TTFT p99")
    crowded = len(runs) > 8
    for ax in panels:
        ax.set_xticks(x, [label.replace("\n", " ") if crowded else label for label in labels], fontsize=7,
                      rotation=35 if crowded else 0, ha="right" if crowded else "center")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        from_zero(ax)
        plain_ticks(ax)
    page_legend(fig, [a], ncol=2)
    return Page(title, caption, fig)


def prefix_cache_page(study: Study) -> Page | None:
    sized = study.varies("kv_cache_gb")
    if not sized:
        return None
    runs = study.slice("eviction", "kv_cache_gb") if study.varies("eviction") else study.slice("kv_cache_gb")
    if not runs:
        return None
    per_policy = study.varies("eviction")
    title = "Prefix hit rate and throughput vs cache size" + (" per eviction policy" if per_policy else "")
    caption = ("Share of admitted prompt tokens served from the prefix cache, and the resulting throughput, as the "
               "KV cache grows" + (", one line per eviction policy" if per_policy else "") + "; where the runs report "
               "it, the best any eviction policy could do at each size (Belady's MIN over the trace, black) and a "
               "cache that never evicts (grey, dashed)." + elsewhere(study, len(runs)))
    groups: dict[Any, list] = {}
    for r in runs:
        groups.setdefault(r["config"].get("eviction"), []).append(r)
    fig, panels = new_page(title, caption, legend_rows=legend_rows(len(groups) + 2))
    for ax, key, ylabel, scale in zip(panels, ("prefix_hit_rate", "throughput_tokens_s"),
                                      ("prefix hit rate (%)", "throughput (output tokens/s)"), (100.0, 1.0)):
        for k, (policy, members) in enumerate(sorted(groups.items(), key=lambda kv: order(kv[0]))):
            by_size: dict[float, list[float]] = {}
            for r in members:
                v = metric(r, key)
                if v is not None:
                    by_size.setdefault(r["config"]["kv_cache_gb"], []).append(v * scale)
            xs = sorted(by_size)
            # NOTE: offset markers so policies with identical values stay visible
            ax.plot(xs, [np.mean(by_size[x]) for x in xs], marker="osD^v<>"[k % 7], ms=7 - k, alpha=0.85,
                    label=f"eviction {value_label(policy)}" if per_policy else "base settings")
        if key == "prefix_hit_rate":  # what the trace allows at each size (sim.ideal_cache), where the runs say
            _ideal_lines(ax, runs)
        ax.set(xlabel="KV cache (GiB per GPU)", ylabel=ylabel, title=ylabel.split(" (")[0])
        ax.grid(alpha=0.3)
        from_zero(ax, x=True)
        plain_ticks(ax)
        if key == "prefix_hit_rate":
            ax.set_ylim(0, 100)
    page_legend(fig, panels)
    return Page(title, caption, fig)


EVICTION_TITLE = "Eviction policies against the best any policy could do"


def eviction_page(study: Study) -> Page | None:
    """Per eviction policy, its prefix hit rate beside the trace's bounds at the run's cache size
    (``pagesim.sim.ideal_cache``: Belady's MIN, knowing the future, and a cache that never evicts), per
    value of the other axis the study varies (cache size, block size, load), so a tie shows why."""
    from pagesim.reports.findings import ideal_figures, ideal_words

    if not study.varies("eviction"):
        return None
    other = next((a for a in ("kv_cache_gb", "num_gpu_blocks", "block_size", "rate_scale", "rate") if study.varies(a)), None)
    runs = [r for r in (study.slice("eviction", other) if other else study.slice("eviction"))
            if ideal_figures([r]) is not None]
    if not runs:
        return None
    policies = sorted({r["config"].get("eviction") for r in runs}, key=order)
    xs = sorted({r["config"].get(other) for r in runs}, key=order) if other else [None]
    title = EVICTION_TITLE
    caption = ("Share of admitted prompt tokens each eviction policy served from the prefix cache (bars), against "
               "what the trace allows at the run's cache size: the best any eviction policy could do (Belady's MIN "
               "over the trace's prefix blocks, knowing the future; black) and a cache that never evicts (grey, "
               "dashed). Policies that tie near the grey line have nothing left to win; near the black line far "
               "below the grey, the reusable blocks (right) outnumber the cache and no order keeps them."
               + (f" One group per {axis_label(other).lower()}." if other else "") + elsewhere(study, len(runs)))
    fig, (hits_ax, blocks_ax) = new_page(title, caption, legend_rows=legend_rows(len(policies) + 2))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        heights = []
        for x in xs:
            members = [r for r in runs if r["config"].get("eviction") == policy and (other is None or r["config"].get(other) == x)]
            heights.append(100 * np.mean([metric(r, "prefix_hit_rate") for r in members]) if members else 0.0)
        hits_ax.bar(np.arange(len(xs)) + (k - (len(policies) - 1) / 2) * width, heights, width,
                    label=f"eviction {value_label(policy)}")
    for i, x in enumerate(xs):
        f = ideal_figures([r for r in runs if other is None or r["config"].get(other) == x])
        if f is None:
            continue
        hits_ax.hlines(100 * f["ideal"], i - 0.45, i + 0.45, colors="black", lw=2.5,
                       label="best any policy could do (MIN)")
        hits_ax.hlines(100 * f["infinite"], i - 0.45, i + 0.45, colors="#868e96", lw=2, linestyles="dashed",
                       label="a cache that never evicts")
        blocks_ax.bar([i - 0.2], [f["reusable"]], 0.4, color="#1c7ed6", label="reusable blocks in the trace")
        blocks_ax.bar([i + 0.2], [f["cache"]], 0.4, color="#adb5bd", label="blocks the cache holds")
    labels = [value_label(x) for x in xs] if other else ["base settings"]
    for ax in (hits_ax, blocks_ax):
        ax.set_xticks(np.arange(len(xs)), labels)
        ax.set_xlabel(axis_label(other) if other else "")
        ax.grid(alpha=0.3, axis="y")
        from_zero(ax)
        plain_ticks(ax)
    hits_ax.set(ylabel="prefix hit rate (%)", title="Prefix hit rate per eviction policy")
    hits_ax.set_ylim(0, 100)
    blocks_ax.set(ylabel="blocks (count)", title="Reusable blocks vs the cache")
    page_legend(fig, [hits_ax, blocks_ax])
    notes = []
    for x in xs:
        members = [r for r in runs if other is None or r["config"].get(other) == x]
        f = ideal_figures(members)
        if f is None:
            continue
        hits = sorted(metric(r, "prefix_hit_rate") or 0.0 for r in members)
        got = (f"{100 * hits[0]:.1f}%" if hits[-1] - hits[0] < 0.0005 else
               f"{100 * hits[0]:.1f}% to {100 * hits[-1]:.1f}%")
        where = f"{axis_label(other)} {value_label(x)}: " if other else ""
        notes.append(f"{where}the policies got {ideal_words(f, study.threshold, got)}")
        costs = [f"{value_label(r['config'].get('eviction'))} {int(metric(r, 'prefix_evictions') or 0):,} evicted, "
                 f"{int(missed):,} hit blocks lost" for r in members
                 if (missed := metric(r, "prefix_hit_blocks_missed")) is not None]
        if costs:
            notes.append(f"{where}cached blocks evicted and the hit blocks later requests asked for after an eviction "
                         f"(the rest of the evictions were plain recycling): {'; '.join(costs)}")
    return Page(title, caption, fig, notes=notes)


def _ideal_lines(ax, runs: list[dict[str, Any]]) -> None:
    """On a hit-rate-vs-cache-size panel: the best any eviction policy could do at each size and
    a cache that never evicts (``pagesim.reports.findings.ideal_figures``), for the sizes whose runs have them."""
    from pagesim.reports.findings import ideal_figures

    sizes = sorted({r["config"]["kv_cache_gb"] for r in runs})
    points = [(x, f) for x in sizes if (f := ideal_figures([r for r in runs if r["config"]["kv_cache_gb"] == x]))]
    if points:
        ax.plot([x for x, _ in points], [100 * f["ideal"] for _, f in points], color="black", lw=2,
                label="best any policy could do (MIN)")
        ax.plot([x for x, _ in points], [100 * f["infinite"] for _, f in points], color="#868e96", lw=1.5,
                linestyle="dashed", label="a cache that never evicts")


FIGURE_PAGES = (
    ("Latency distributions", latency_cdfs, "no completed requests"),
    ("Queue, batch and memory over time", activity_over_time,
     "no completed run at the base settings with an activity series (runs recorded by an earlier pagesim lack it: "
     "run the study again into a new folder)"),
    ("KV-cache memory over time: paging vs contiguous reservation", memory_over_time, "needs an allocator axis"),
    ("Preemptions: swap vs recompute, and what they cost", preemption_page,
     "no run at the base settings (or along the preemption and block-size axes) was preempted"),
    ("Prefix hit rate vs cache size", prefix_cache_page, "needs a kv_cache_gb axis"),
    (EVICTION_TITLE, eviction_page, "needs an eviction axis and runs with prefix caching that report the ideal "
     "cache's figures (runs recorded by an earlier pagesim lack them)"),
)
