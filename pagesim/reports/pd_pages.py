"""P:D split vs goodput per GPU, TTFT and TPOT, with colocated serving on the same GPUs beside it.

Drawn for each split grid (``pagesim.reports.pd_study``: a ``[[grid]]`` that varies ``pd_split``
with a completed P:D run), from that grid's own runs, so every setting the grid does not list is at
the base: one page per facet (combination of the grid's other axes, the link bandwidth and the
seed aside), at most ``MAX_PAGES`` per grid. Over the splits (fewest prefill replicas first), one
line per KV link bandwidth, colocated serving as a grey horizontal line (it has no links: one run
for every bandwidth):

- goodput per GPU (requests per second that met the runs' TTFT and TPOT SLO, over the GPUs used);
- TTFT p99 (solid) and p50 (dashed); TPOT p99 (solid) and mean (dashed);
- each split's mean TTFT cut where its requests passed (``pagesim.sim.disagg.metrics``: waiting for
  a prefill replica, the prefill, waiting for a decode replica, the KV transfer, the decode
  replica's first token) as stacked bars, one per bandwidth, the colocated TTFT mean beside them;
- which split wins at each bandwidth and by how much against colocated, and how that moves
  between bandwidths (``pd_study.verdicts``, ``pd_study.moves``).

A split far from the right one queues without bound (seconds to minutes of TTFT): so that such a
split does not flatten every other onto the axis, a latency panel's axis stops at ``CAP`` times
colocated serving's value (or, without it, the splits' median), and what rises past it is
written at the top edge with its value. A setting with seeds is the mean of its runs with the
95% interval (``pagesim.reports.noise``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

from pagesim.reports.noise import Estimate
from pagesim.reports.pd_study import (BANDWIDTH, GOODPUT, SplitSweep, bandwidth_label, facets, moves, slo_words,
                                      split_grids, verdicts)
from pagesim.reports.results import M, Setting, Study, facet_words
from pagesim.reports.run_config import SEED, value_label
from pagesim.reports.style import Page, Table, legend_rows, new_page, page_legend, plain_ticks

MAX_PAGES = 6  # per grid; the rest of its facets are in the all-runs table and the grid pages
TITLE = "P:D split vs goodput per GPU, TTFT and TPOT"
LINK_COLORS = ("#1c7ed6", "#e8590c", "#2b8a3e", "#c92a2a", "#5f3dc4", "#1098ad")
LINK_HATCHES = ("", "//", "..", "xx", "\\\\", "++")
COLOCATED_COLOR = "#495057"
PARTS = {  # the TTFT split's parts (summary disaggregated.ttft_split_s), in the order a request passes them
    "prefill_queue": ("waiting for prefill", "#adb5bd"),
    "prefill": ("prefill", "#1c7ed6"),
    "decode_queue": ("waiting for decode", "#fab005"),
    "transfer": ("KV transfer", "#e8590c"),
    "decode_first_token": ("decode's first token", "#2b8a3e"),
}
CAP = 4.0  # a latency axis stops at this many times its reference (module docstring)
LATENCY_PANELS = (("TTFT", "ttft_s.p99", "ttft_s.p50", "p50"), ("TPOT", "tpot_s.p99", "tpot_s.mean", "mean"))
TABLE_KEYS = ("slo.attained", "ttft_s.p50", "ttft_s.p99", "tpot_s.mean", "tpot_s.p99")


def pd_pages(study: Study) -> Iterator[Page]:
    """The split pages, one at a time (the report closes each once it is written)."""
    for index, grid, records in split_grids(study):
        pages = facets(grid, records)
        for facet, members in pages[:MAX_PAGES]:
            yield _page(study, index, grid, members, facet, len(pages))


def _estimate(setting: Setting | None, key: str) -> Estimate | None:
    return None if setting is None else setting.estimate(key)


def _fixed_words(study: Study, grid: dict[str, list], facet: dict[str, Any], count: int) -> str:
    base = study.base
    return facet_words(grid, facet, count, drawn=(SEED, "pd_split"),
                       base=f"{base.get('model')} on {base.get('gpu')}, tp {base.get('tp')}", max_pages=MAX_PAGES)


def _page(study: Study, index: int, grid: dict[str, list], records: list[dict[str, Any]], facet: dict[str, Any],
          count: int) -> Page:
    sweep = SplitSweep.of(records, grid.get(BANDWIDTH))
    found = verdicts(study, sweep)
    seeded = len(grid.get(SEED, [])) > 1
    title = TITLE + (" (" + ", ".join(f"{k}={value_label(v)}" for k, v in facet.items()) + ")" if facet else "")
    gpus = f"{sweep.gpus} GPUs" if sweep.gpus else "the same GPUs"
    colocated = ("; colocated on the same GPUs in grey (no KV links: one run for every bandwidth)"
                 if sweep.colocated else "")
    caption = (f"Grid {index + 1} of the study, {len(records)} completed runs, each on {gpus}. Goodput per GPU: "
               f"requests/s that met the SLO ({slo_words(records)}) over the GPUs used; a line per KV link "
               f"bandwidth{colocated}. Below, each split's mean TTFT in the parts its requests passed, and the "
               f"winner. A latency past {CAP:g}x colocated's is written at the axis' top."
               + (" Means over seeds with 95% intervals." if seeded else " One run per setting.")
               + _fixed_words(study, grid, facet, count))
    entries = len(sweep.bandwidths) * (2 if len(sweep.bandwidths) > 1 else 1) + 2 + len(PARTS) + bool(sweep.colocated)
    fig, panels = new_page(title, caption, nrows=2, ncols=3, legend_rows=legend_rows(entries, 5))
    _line_panel(panels[0], sweep, GOODPUT.key, None, GOODPUT.unit, "Goodput per GPU")
    for ax, (name, solid, dashed, dashed_name) in zip(panels[1:3], LATENCY_PANELS):
        _line_panel(ax, sweep, solid, dashed, f"{name} (s)", f"{name} p99 (solid), {dashed_name} (dashed)")
    gs = panels[3].get_gridspec()
    for ax in panels[3:5]:
        ax.remove()
    split_ax = fig.add_subplot(gs[1, 0:2])
    _split_panel(split_ax, sweep)
    notes = [v.words() for v in found] + moves(found)
    _verdict_panel(panels[5], notes)
    page_legend(fig, [*panels[:3], split_ax], ncol=5)
    return Page(title, caption, fig, _table(sweep), notes=notes)


def _x_axis(ax, sweep: SplitSweep) -> None:
    ax.set_xticks(range(len(sweep.splits)), sweep.splits, fontsize=8)
    ax.set_xlim(-0.5, len(sweep.splits) - 0.5)
    ax.set_xlabel("P:D split (prefill : decode replicas)")


def _line_panel(ax, sweep: SplitSweep, key: str, dashed: str | None, ylabel: str, title: str) -> None:
    """A line per bandwidth over the splits (``dashed``: a second, dashed line per bandwidth) and
    colocated as horizontal lines."""
    highest = 0.0
    several = len(sweep.bandwidths) > 1
    points: dict[int, float] = {}  # x -> the highest value drawn there (for the capped axis' labels)
    for k, bandwidth in enumerate(sweep.bandwidths):
        color = LINK_COLORS[k % len(LINK_COLORS)]
        for metric, style in ((key, "-"), (dashed, "--")):
            if metric is None:
                continue
            xs, ys, errs = [], [], []
            for i, split in enumerate(sweep.splits):
                est = _estimate(sweep.at(split, bandwidth), metric)
                if est is not None:
                    xs.append(i)
                    ys.append(est.mean)
                    errs.append(est.half_width or 0.0)
            if not xs:
                continue
            highest = max(highest, *(y + e for y, e in zip(ys, errs)))
            for x, y in zip(xs, ys):
                points[x] = max(points.get(x, 0.0), y)
            label = f"lines: KV links {bandwidth_label(bandwidth)}" if style == "-" else "_"
            # NOTE: offset markers so bandwidths with identical values stay visible
            ax.errorbar(xs, ys, yerr=errs if any(errs) else None, marker="osD^v<>"[k % 7], ms=(6 - k) if several else 5,
                        ls=style, alpha=0.85, capsize=3, color=color, label=label)
    reference = None
    if sweep.colocated is not None:
        for metric, style in ((key, "-"), (dashed, "--")):
            est = _estimate(sweep.colocated, metric) if metric else None
            if est is not None:
                highest = max(highest, est.mean)
                reference = est.mean if reference is None else max(reference, est.mean)
                ax.axhline(est.mean, color=COLOCATED_COLOR, ls=style, lw=1.2, alpha=0.8,
                           label="grey: colocated" if style == "-" else "_")
    if dashed is not None:  # (the legend's key to the line styles)
        ax.plot([], [], color=COLOCATED_COLOR, ls="-", label="solid: p99")
        ax.plot([], [], color=COLOCATED_COLOR, ls="--", label="dashed: TTFT p50, TPOT mean")
    _x_axis(ax, sweep)
    ax.set(ylabel=ylabel, title=title)
    _capped_ylim(ax, highest, reference if dashed is not None else None, points, "s")
    ax.grid(alpha=0.3)
    plain_ticks(ax)


def _capped_ylim(ax, highest: float, reference: float | None, points: dict[int, float], unit: str) -> None:
    """The axis from zero to the data, or to ``CAP`` x ``reference`` (None: the median of
    ``points``) when the data rises past that; each x whose value is cut off gets its value
    written at the top edge."""
    if reference is None and points:
        values = sorted(points.values())
        reference = values[len(values) // 2]
    top = highest * 1.08 if highest > 0 else 1.0
    if reference and highest > CAP * reference:
        top = CAP * reference
        for x, value in points.items():
            if value > top:
                ax.text(x, top * 0.97, f"{value:,.3g} {unit}\n(off axis)", ha="center", va="top", fontsize=7,
                        color="#343a40", bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_ylim(0, top)


def _split_panel(ax, sweep: SplitSweep) -> None:
    """Stacked bars of the TTFT split's means: per split one bar per bandwidth; colocated's TTFT mean."""
    n = len(sweep.bandwidths)
    width = 0.8 / n
    highest = 0.0
    totals: dict[int, float] = {}  # split -> its highest bar (for the capped axis' labels)
    for i, split in enumerate(sweep.splits):
        for k, bandwidth in enumerate(sweep.bandwidths):
            setting = sweep.at(split, bandwidth)
            parts = [_estimate(setting, f"disaggregated.ttft_split_s.{p}.mean") for p in PARTS]
            if setting is None or any(p is None for p in parts):
                continue
            x = i - 0.4 + width * (k + 0.5)
            bottom = 0.0
            for (label, color), est in zip(PARTS.values(), parts):
                ax.bar(x, est.mean, width, bottom=bottom, color=color, hatch=LINK_HATCHES[k % len(LINK_HATCHES)],
                       edgecolor="white", linewidth=0.5, label=label)
                bottom += est.mean
            highest = max(highest, bottom)
            totals[i] = max(totals.get(i, 0.0), bottom)
    labels = list(sweep.splits)
    reference = None
    if sweep.colocated is not None:
        est = _estimate(sweep.colocated, "ttft_s.mean")
        if est is not None:
            ax.bar(len(sweep.splits), est.mean, 0.4, color=COLOCATED_COLOR, label="colocated: TTFT mean (no split)")
            highest = max(highest, est.mean)
            reference = est.mean
        labels.append("colocated")
    if n > 1:
        for k, bandwidth in enumerate(sweep.bandwidths):  # (the legend's key to the hatches)
            ax.bar(0, 0, 0, color="white", edgecolor=COLOCATED_COLOR, hatch=LINK_HATCHES[k % len(LINK_HATCHES)],
                   label=f"bars: {bandwidth_label(bandwidth)}")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set(xlabel="P:D split (prefill : decode replicas)", ylabel="mean time (s)",
           title="TTFT split (means: the parts add up to the TTFT mean)")
    _capped_ylim(ax, highest, reference, totals, "s")
    ax.grid(alpha=0.3, axis="y")
    plain_ticks(ax)


def _verdict_panel(ax, lines: list[str]) -> None:
    ax.axis("off")
    ax.set_title("Which split wins (goodput per GPU)", fontsize=10)
    wrapped = [w for line in lines for w in textwrap.wrap("- " + line, 46, subsequent_indent="  ")]
    if len(wrapped) > 16:
        wrapped = wrapped[:15] + ["... the rest in the findings"]
    ax.text(0.0, 1.0, "\n".join(wrapped) or "no completed P:D run", va="top", ha="left", fontsize=8.5,
            transform=ax.transAxes)


def _vs_colocated(setting: Setting | None, colocated: Estimate | None) -> str:
    est = _estimate(setting, GOODPUT.key)
    if est is None or colocated is None or colocated.mean <= 0:
        return "-"
    return f"{(est.mean / colocated.mean - 1) * 100:+.1f}%"


def _table(sweep: SplitSweep) -> Table:
    """The page's numbers, a row per (split, bandwidth), then colocated."""
    header = ["P:D split", "KV links", f"{GOODPUT.label} ({GOODPUT.unit})", "vs colocated",
              *(M[k].label + ("" if M[k].fraction else f" ({M[k].unit})") for k in TABLE_KEYS),
              *(f"TTFT: {label} (s)" for label, _ in PARTS.values()), "KV moved (GB)"]
    colocated = _estimate(sweep.colocated, GOODPUT.key)
    rows = []

    def cells(setting: Setting, keys) -> list[str]:
        return [M[k].format(e.mean, e.half_width) if (e := setting.estimate(k)) else "-" for k in keys]

    for split in sweep.splits:
        for bandwidth in sweep.bandwidths:
            setting = sweep.at(split, bandwidth)
            if setting is None:
                continue
            parts = [_estimate(setting, f"disaggregated.ttft_split_s.{p}.mean") for p in PARTS]
            moved = _estimate(setting, "disaggregated.transfers.bytes")
            rows.append([split, bandwidth_label(bandwidth), *cells(setting, (GOODPUT.key,)),
                         _vs_colocated(setting, colocated), *cells(setting, TABLE_KEYS),
                         *(M["ttft_s.mean"].format(p.mean) if p else "-" for p in parts),
                         f"{moved.mean / 1e9:,.1f}" if moved else "-"])
    if sweep.colocated is not None:
        rows.append(["colocated", "-", *cells(sweep.colocated, (GOODPUT.key,)), "0.0%",
                     *cells(sweep.colocated, TABLE_KEYS), *("-" for _ in PARTS), "-"])
    return Table(header, rows)
