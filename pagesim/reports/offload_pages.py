"""KV offloading: prefix hits split by tier, and TTFT, vs the offload store's size per offload policy.

Drawn for each offload grid (``pagesim.reports.offload``: a ``[[grid]]`` that varies
``kv_offloading_size``), from that grid's own runs, so every setting the grid does not list is at
the base: one page per facet (combination of the grid's other axes, the offload policy and the
seed aside), at most ``MAX_PAGES`` per grid. Each page has three panels over the offload sizes
(GiB over the replica's GPUs, as vLLM's ``--kv-offloading-size``):

- the prefix hit rate as stacked bars, the hits served by the GPU's prefix cache (HBM) below those
  loaded from the CPU offload store, one bar per offload policy;
- TTFT mean and TTFT p99, one line per offload policy.

Size 0 is offloading off (HBM only): its one run carries no policy
(``pagesim.reports.run_config.moot_settings``) and is the first point of every policy's line. A
setting with seeds is the mean of its runs with the 95% interval (``pagesim.reports.noise``). Hit
rates are over admitted prompt tokens (the simulator's ``hbm_hit_rate`` + ``offload_hit_rate`` =
``prefix_hit_rate``; a run without an offload store has all its hits in HBM,
``pagesim.reports.results.OFFLOAD_OFF``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pagesim.reports.offload import POLICY, SIZE, Sweep, estimate_of, facets, offload_grids, policy_label
from pagesim.reports.results import M, Study, facet_words
from pagesim.reports.run_config import SEED, value_label
from pagesim.reports.style import Page, Table, legend_rows, new_page, page_legend, plain_ticks

MAX_PAGES = 6  # per grid; the rest of its facets are in the all-runs table and the grid pages
TITLE = "Prefix hits and TTFT vs offload size per offload policy"  # (without "per ..." for one policy)
TIER_COLORS = {"hbm": "#1c7ed6", "cpu": "#f08c00"}
POLICY_HATCHES = ("", "//", "..", "xx", "\\\\", "++")
POLICY_COLORS = ("#5f3dc4", "#2b8a3e", "#c92a2a", "#e8590c", "#1098ad", "#495057")
TTFT_KEYS = ("ttft_s.mean", "ttft_s.p99")
TABLE_KEYS = ("prefix_hit_rate", "hbm_hit_rate", "offload_hit_rate", "ttft_s.mean", "ttft_s.p99",
              "host_link_busy_fraction")


def offload_pages(study: Study) -> Iterator[Page]:
    """The offload pages, one at a time (the report closes each once it is written)."""
    for index, grid, records in offload_grids(study):
        pages = facets(grid, records)
        for facet, members in pages[:MAX_PAGES]:
            yield _page(study, index, grid, members, facet, len(pages))


def _fixed_words(study: Study, grid: dict[str, list], facet: dict[str, Any], count: int) -> str:
    """Which settings the page holds, in words: the grid's single values, the page's facet, the base."""
    base = study.base
    cache = (f"{base['kv_cache_gb']:g} GiB KV cache per GPU" if base.get("kv_cache_gb") is not None else
             f"{base['num_gpu_blocks']:,} GPU blocks" if base.get("num_gpu_blocks") is not None else
             "the KV cache sized from GPU memory")
    return facet_words(grid, facet, count, drawn=(SEED, SIZE, POLICY),
                       base=f"{base.get('model')} on {base.get('gpu')}, {cache}", max_pages=MAX_PAGES)


def _page(study: Study, index: int, grid: dict[str, list], records: list[dict[str, Any]], facet: dict[str, Any],
          count: int) -> Page:
    sweep = Sweep.of(records, grid.get(POLICY))
    seeded = len(grid.get(SEED, [])) > 1
    has_p99 = any(s.estimate("ttft_s.p99") for s in sweep.cells.values())
    title = (TITLE if len(sweep.policies) > 1 else TITLE.removesuffix(" per offload policy")) + (
        " (" + ", ".join(f"{k}={value_label(v)}" for k, v in facet.items()) + ")" if facet else "")
    per = ("one bar and line per offload policy" if len(sweep.policies) > 1
           else f"offload policy {policy_label(sweep.policies[0], study)}")
    caption = (f"Grid {index + 1} of the study, {len(records)} completed runs. Share of admitted prompt tokens served "
               "from the prefix cache, split into hits in the GPU's cache (HBM) and hits loaded back from the CPU "
               "offload store (the number over a bar, where they fit: their sum), and time to first token, as the "
               f"offload store grows ({per})."
               + (" At 0 GiB offloading is off (HBM only)" + (": one run, shared by every policy." if
                                                             len(sweep.policies) > 1 else ".")
                  if sweep.shared(sweep.sizes[0]) else "")
               + (" Means over seeds with 95% intervals." if seeded else " One run per setting.")
               + _fixed_words(study, grid, facet, count))
    ncols = 3 if has_p99 else 2
    entries = 2 + (len(sweep.policies) if len(sweep.policies) > 1 else 0) + len(sweep.policies)
    fig, panels = new_page(title, caption, ncols=ncols, legend_rows=legend_rows(entries, 4))
    _hits_panel(panels[0], sweep, study)
    for ax, key in zip(panels[1:], TTFT_KEYS[:ncols - 1]):
        _ttft_panel(ax, sweep, key, study)
    page_legend(fig, panels, ncol=4)
    return Page(title, caption, fig, _table(sweep, study))


def _x_labels(sizes: list[float]) -> list[str]:
    return [f"{s:g}" + ("\n(off)" if not s else "") for s in sizes]


def _hits_panel(ax, sweep: Sweep, study: Study) -> None:
    """Stacked bars: HBM hits below CPU hits; at a size with offloading, one bar per policy."""
    width = 0.8 / len(sweep.policies)
    numbered = len(sweep.sizes) * len(sweep.policies) <= 10  # (more: the numbers would touch)
    for i, size in enumerate(sweep.sizes):
        members = [None] if sweep.shared(size) else sweep.policies
        for k, policy in enumerate(members):
            setting = sweep.at(size, policy)
            hbm, cpu, total = (estimate_of(setting, key)
                               for key in ("hbm_hit_rate", "offload_hit_rate", "prefix_hit_rate"))
            if hbm is None or cpu is None:
                continue
            shared = policy is None and sweep.shared(size)
            x = i if shared else i - 0.4 + width * (k + 0.5)
            w = min(width, 0.5) if shared else width
            hatch = "" if shared else POLICY_HATCHES[k % len(POLICY_HATCHES)]
            ax.bar(x, hbm.mean * 100, w, color=TIER_COLORS["hbm"], hatch=hatch, edgecolor="white", linewidth=0.5,
                   label="HBM hits (GPU prefix cache)")
            err = None if total is None or total.half_width is None else [[0], [total.half_width * 100]]
            ax.bar(x, cpu.mean * 100, w, bottom=hbm.mean * 100, color=TIER_COLORS["cpu"], hatch=hatch,
                   edgecolor="white", linewidth=0.5, yerr=err, capsize=2, label="CPU hits (offload store)")
            if numbered:
                above = (hbm.mean + cpu.mean) * 100 + (err[1][0] if err else 0.0) + 1.5
                ax.text(x, above, f"{(hbm.mean + cpu.mean) * 100:.0f}", ha="center", va="bottom", fontsize=7,
                        color="#343a40")
    if len(sweep.policies) > 1:
        for k, policy in enumerate(sweep.policies):  # (the legend's key to the hatches)
            ax.bar(0, 0, 0, color="white", edgecolor="#495057", hatch=POLICY_HATCHES[k % len(POLICY_HATCHES)],
                   label=f"bars: policy {policy_label(policy, study)}")
    ax.set_xticks(range(len(sweep.sizes)), _x_labels(sweep.sizes), fontsize=8)
    ax.set(xlabel="offload size (GiB)", ylabel="prefix hit rate (% of prompt tokens)", title="Prefix hits by tier")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3, axis="y")
    plain_ticks(ax)


def _ttft_panel(ax, sweep: Sweep, key: str, study: Study) -> None:
    """A line per policy over the sizes (from the shared HBM-only point at size 0)."""
    label = M[key].label
    highest = 0.0
    for k, policy in enumerate(sweep.policies):
        xs, ys, errs = [], [], []
        for i, size in enumerate(sweep.sizes):
            est = estimate_of(sweep.at(size, policy), key)
            if est is not None:
                xs.append(i)
                ys.append(est.mean)
                errs.append(est.half_width or 0.0)
        if not xs:
            continue
        highest = max(highest, *(y + e for y, e in zip(ys, errs)))
        # NOTE: offset markers so policies with identical values stay visible
        ax.errorbar(xs, ys, yerr=errs if any(errs) else None, marker="osD^v<>"[k % 7], ms=7 - k, alpha=0.85,
                    capsize=3, color=POLICY_COLORS[k % len(POLICY_COLORS)],
                    label=f"lines: policy {policy_label(policy, study)}")
    ax.set_xticks(range(len(sweep.sizes)), _x_labels(sweep.sizes), fontsize=8)
    ax.set_xlim(-0.5, len(sweep.sizes) - 0.5)
    ax.set(xlabel="offload size (GiB)", ylabel=f"{label} (s)", title=label)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, highest * 1.08 if highest > 0 else 1.0)  # (room above the highest marker)
    plain_ticks(ax)


def _table(sweep: Sweep, study: Study) -> Table:
    """The page's numbers, a row per (size, policy); the HBM-only run once."""
    header = ["offload size (GiB)", "offload policy", *(M[k].label for k in TABLE_KEYS)]
    rows = []
    for size in sweep.sizes:
        for policy in [None] if sweep.shared(size) else sweep.policies:
            setting = sweep.at(size, policy)
            if setting is None:
                continue
            values = [M[k].format(e.mean, e.half_width) if (e := setting.estimate(k)) else "-" for k in TABLE_KEYS]
            name = "off (HBM only)" if sweep.shared(size) else policy_label(policy, study)
            rows.append([f"{size:g}", name, *values])
    return Table(header, rows)
