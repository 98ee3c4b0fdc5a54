"""Each ``[[grid]]`` of the study drawn whole, so no run is only a row in a table.

- one varying axis: the headline metrics as bars over its values (95% intervals with seeds);
- two: a heatmap per headline metric, the axis values as labels and the number in each cell;
- three or more: small multiples, a page per headline metric with a heatmap of the first two
  axes for each combination of the rest (six to a page).

Seeds are never an axis: a cell is the mean of the setting's seeds. Grids that vary only the load
(``rate_scale`` / ``rate``) are drawn as curves by ``pagesim.reports.load_pages``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from pagesim.reports.findings import AXIS_NAMES
from pagesim.reports.noise import Estimate
from pagesim.reports.results import HEADLINE, RATE_AXES, Metric, Setting, Study, order, settings
from pagesim.reports.run_config import SEED, moot_settings, value_label
from pagesim.reports.style import Page, from_zero, new_page, plain_ticks

PANELS_PER_PAGE = 6


AXIS_UNITS = {"block_size": "tokens", "kv_cache_gb": "GiB per GPU", "rate_scale": "x the source's rate",
              "swap_space_gb": "GiB", "max_num_seqs": "sequences", "max_num_batched_tokens": "tokens",
              "kv_offloading_size": "GiB, 0: off", "kv_link_bandwidth": "GB/s per GPU", "kv_link_latency_us": "us",
              "gpus": "GPUs"}


def axis_label(axis: str) -> str:
    return AXIS_NAMES.get(axis, axis)


def axis_title(axis: str) -> str:
    """A plot axis's label: the setting's name and, for a quantity, its unit."""
    unit = AXIS_UNITS.get(axis)
    return f"{axis_label(axis)} ({unit})" if unit else axis_label(axis)


def grid_axes(grid: dict[str, list]) -> list[str]:
    return [k for k, v in grid.items() if len(v) > 1 and k != SEED]


def _fixed_words(grid: dict[str, list], axes: list[str]) -> str:
    fixed = [f"{k}={value_label(v[0])}" for k, v in grid.items() if k not in axes and k != SEED]
    return ("; fixed in this grid: " + ", ".join(fixed)) if fixed else ""


NO_VALUE = Estimate(float("nan"), None, 0)  # a cell whose runs completed without this metric


def _cell_estimates(group: list[Setting], metric: Metric, row_axis: str, col_axis: str,
                    rows: list, cols: list) -> list[list[Estimate | None]]:
    """Per cell the setting's estimate; None where no run completed, ``NO_VALUE`` where runs did
    but without the metric."""
    out: list[list[Estimate | None]] = [[None] * len(cols) for _ in rows]
    for s in group:
        for i, row in enumerate(rows):
            for j, col in enumerate(cols):
                if _matches(s.config, row_axis, row) and _matches(s.config, col_axis, col):
                    out[i][j] = s.estimate(metric.key) or NO_VALUE
    return out


def _axis_values(group: list[Setting], axis: str) -> list:
    """The values ``axis`` takes in ``group``, in order (a run it is moot for names none)."""
    values = {s.config.get(axis) for s in group if axis not in moot_settings(s.config)}
    return sorted(values, key=order) or [None]


def _matches(config: dict[str, Any], axis: str, value: Any) -> bool:
    """Whether a run belongs at ``value`` of ``axis``: a setting moot for the run (the offload policy
    of a run without an offload store) puts it at every value, as the same run."""
    return axis in moot_settings(config) or config.get(axis) == value


def _top(group: list[Setting], metric: Metric) -> float:
    """The colour scale's top for ``metric`` on a page: its largest value (the bottom is zero)."""
    values = [e.mean for s in group if (e := s.estimate(metric.key)) is not None]
    top = max(values, default=0.0) * (100.0 if metric.fraction else 1.0)
    return top if top > 0 else 1.0


def _heatmap(ax, fig, cells: list[list[Estimate | None]], metric: Metric, rows: list, cols: list,
             row_axis: str, col_axis: str, title: str, top: float) -> None:
    """Colour from zero to ``top``, shared by a page's panels: a 1% difference looks like 1%."""
    scale = 100.0 if metric.fraction else 1.0
    data = np.array([[np.nan if c is None or c is NO_VALUE else c.mean * scale for c in row] for row in cells],
                    dtype=float)
    cmap = "viridis" if metric.better == "max" else "viridis_r"
    lo, hi = 0.0, top
    # NOTE: vector cells (pcolormesh), not imshow: a PDF keeps every image in memory until it is
    # closed, which made a large study's report grow by megabytes per heatmap.
    image = ax.pcolormesh(np.arange(len(cols) + 1) - 0.5, np.arange(len(rows) + 1) - 0.5, np.ma.masked_invalid(data),
                          cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1)
    ax.set_xlim(-0.5, len(cols) - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top, as a table reads
    for i, row in enumerate(cells):
        for j, est in enumerate(row):
            if est is None or est is NO_VALUE:
                ax.text(j, i, "no run" if est is None else "no value", ha="center", va="center", fontsize=7,
                        color="#868e96")
                continue
            text = metric.format(est.mean, est.half_width)
            shade = (est.mean * scale - lo) / (hi - lo) if hi > lo else 0.5
            dark = shade > 0.55 if metric.better == "max" else shade < 0.45
            ax.text(j, i, text.replace(" ± ", "\n± "), ha="center", va="center", fontsize=7.5,
                    color="black" if dark else "white")
    ax.set_xticks(range(len(cols)), [value_label(c) for c in cols], fontsize=8)
    ax.set_yticks(range(len(rows)), [value_label(r) for r in rows], fontsize=8)
    ax.set_xlabel(axis_title(col_axis))
    ax.set_ylabel(axis_title(row_axis))
    ax.set_title(title, fontsize=10)
    for spine in ax.spines.values():
        spine.set_visible(False)
    unit = "%" if metric.fraction else metric.unit
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    if bar.solids is not None:  # vectors: a rasterized colorbar is an image the PDF holds until closed
        bar.solids.set_rasterized(False)
        bar.solids.set_edgecolor("face")  # (no seams between the bands)
    bar.set_label(f"{metric.label} ({unit})", fontsize=7.5)
    bar.ax.tick_params(labelsize=7)


def _caption(study: Study, index: int, grid: dict, axes: list[str], runs: int, what: str) -> str:
    seeded = len(grid.get(SEED, [])) > 1
    over = "the mean of its seeds with the 95% interval" if seeded else "one run"
    values = "; ".join(f"{axis_label(a)}: {', '.join(value_label(v) for v in grid[a])}" for a in axes)
    return (f"Grid {index + 1} of the study, all {runs} of its completed runs ({values}{_fixed_words(grid, axes)}; "
            f"every other setting at the base). {what} Each cell is {over}.")


def _two_axis_page(study: Study, index: int, grid: dict, axes: list[str], records: list) -> Page:
    row_axis, col_axis = axes
    group = settings(records)
    rows, cols = _axis_values(group, row_axis), _axis_values(group, col_axis)
    title = f"{axis_label(row_axis)} × {axis_label(col_axis)}: throughput, goodput and tail latency"
    caption = _caption(study, index, grid, axes, len(records),
                       "One heatmap per headline metric; colour runs from zero to the largest value, bright where better.")
    fig, panels = new_page(title, caption, nrows=2, ncols=2)
    fig.subplots_adjust(right=0.93)  # room for the colorbars' labels
    for ax, metric in zip(panels, HEADLINE):
        cells = _cell_estimates(group, metric, row_axis, col_axis, rows, cols)
        _heatmap(ax, fig, cells, metric, rows, cols, row_axis, col_axis, metric.label, _top(group, metric))
    return Page(title, caption, fig)


def _multi_axis_pages(study: Study, index: int, grid: dict, axes: list[str], records: list) -> Iterator[Page]:
    row_axis, col_axis, *rest = axes
    group = settings(records)
    rows, cols = _axis_values(group, row_axis), _axis_values(group, col_axis)
    combos = list(itertools.product(*(_axis_values(group, a) for a in rest)))
    for metric in HEADLINE:
        for start in range(0, len(combos), PANELS_PER_PAGE):
            chunk = combos[start:start + PANELS_PER_PAGE]
            part = (f" ({start // PANELS_PER_PAGE + 1} of {-(-len(combos) // PANELS_PER_PAGE)})"
                    if len(combos) > PANELS_PER_PAGE else "")
            heading = metric.label[0].upper() + metric.label[1:]
            title = f"{heading}: {axis_label(row_axis)} × {axis_label(col_axis)} per {_join(rest)}{part}"
            caption = _caption(study, index, grid, axes, len(records),
                               f"{metric.label} as a heatmap of {axis_label(row_axis)} and {axis_label(col_axis)}, "
                               f"one panel per {_join(rest)}; colour from zero to the largest value on the page, bright where better"
                               + (f": panels {start + 1}-{start + len(chunk)} of "
                                                                 f"{len(combos)}, the rest on the next page"
                                                                 if part else "") + ".")
            ncols = min(len(chunk), 3)
            nrows = -(-len(chunk) // ncols)
            fig, panels = new_page(title, caption, nrows=nrows, ncols=ncols)
            fig.subplots_adjust(right=0.93)  # room for the colorbars' labels
            for ax, combo in zip(panels, chunk):
                members = [s for s in group if all(_matches(s.config, a, v) for a, v in zip(rest, combo))]
                cells = _cell_estimates(members, metric, row_axis, col_axis, rows, cols)
                name = ", ".join(f"{a}={value_label(v)}" for a, v in zip(rest, combo))
                _heatmap(ax, fig, cells, metric, rows, cols, row_axis, col_axis, name, _top(group, metric))
            for ax in panels[len(chunk):]:
                ax.axis("off")
            yield Page(title, caption, fig)


def _join(axes: list[str]) -> str:
    names = [axis_label(a) for a in axes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _one_axis_page(study: Study, index: int, grid: dict, axis: str, records: list) -> Page:
    group = sorted(settings(records), key=lambda s: order(s.config.get(axis)))
    title = f"Throughput, goodput and tail latency per {axis_label(axis).lower()}"
    caption = _caption(study, index, grid, [axis], len(records),
                       "The headline metrics per value" + (" with 95% intervals over seeds."
                                                           if len(grid.get(SEED, [])) > 1 else "."))
    fig, panels = new_page(title, caption, ncols=4)
    labels = [value_label(s.config.get(axis)) for s in group]
    for ax, metric in zip(panels, HEADLINE):
        ests = [s.estimate(metric.key) for s in group]
        scale = 100.0 if metric.fraction else 1.0
        heights = [np.nan if e is None else e.mean * scale for e in ests]
        errors = [0.0 if e is None or e.half_width is None else e.half_width * scale for e in ests]
        ax.bar(range(len(group)), heights, yerr=errors if any(errors) else None, color="#4c6ef5", capsize=3)
        ax.set_xticks(range(len(group)), labels, rotation=30 if max(map(len, labels)) > 6 else 0,
                      ha="right" if max(map(len, labels)) > 6 else "center", fontsize=8)
        unit = "%" if metric.fraction else metric.unit
        ax.set(xlabel=axis_title(axis), ylabel=f"{metric.label} ({unit})", title=metric.label)
        ax.grid(alpha=0.3, axis="y")
        from_zero(ax)
        plain_ticks(ax)
    return Page(title, caption, fig)


def grid_pages(study: Study) -> Iterator[Page]:
    """The grid pages, one at a time (the report closes each once it is written)."""
    for index, (grid, records) in enumerate(study.grids()):
        axes = grid_axes(grid)
        if not records or not axes or all(a in RATE_AXES for a in axes):
            continue
        if len(axes) == 1:
            yield _one_axis_page(study, index, grid, axes[0], records)
        elif len(axes) == 2:
            yield _two_axis_page(study, index, grid, axes, records)
        else:
            yield from _multi_axis_pages(study, index, grid, axes, records)
