"""The all-runs table: one row per run of the study, over as many pages as it takes.

Columns: the run's id, the settings the study varies (seed included), the load regime
(``pagesim.reports.load``), then the metrics a serving engineer compares (``COLUMNS``; with KV offloading
in any run, the prefix hits split by tier and the host link's busy share too, ``OFFLOAD_COLUMNS``;
a setting moot for a run, the offload policy without an offload store, is "-"). Failed runs are
rows too, marked "failed", so the table accounts for every run the study holds. ``all_runs``
returns the rows as strings (what the PDF draws and the HTML report sorts).
"""

from __future__ import annotations

from collections.abc import Iterator

from pagesim.reports.load import run_load
from pagesim.reports.results import M, Study, metric
from pagesim.reports.run_config import SEED, moot_settings, offloading, value_label
from pagesim.reports.style import Page, Table, new_page

COLUMNS = (
    ("throughput_tokens_s", "throughput\n(tok/s)"),
    ("goodput_rps", "goodput\n(req/s)"),
    ("ttft_s.p50", "TTFT\np50 (s)"),
    ("ttft_s.p99", "TTFT\np99 (s)"),
    ("tpot_s.p50", "TPOT\np50 (s)"),
    ("tpot_s.p99", "TPOT\np99 (s)"),
    ("e2e_s.p50", "E2E\np50 (s)"),
    ("e2e_s.p99", "E2E\np99 (s)"),
    ("preemptions_total", "preemp-\ntions"),
    ("prefix_hit_rate", "prefix\nhit rate"),
    ("memory_allocated_fraction", "KV cache\nallocated"),
    ("memory_utilization", "allocated\nholding\ntokens"),
)
OFFLOAD_COLUMNS = (
    ("hbm_hit_rate", "HBM\nhits"),
    ("offload_hit_rate", "CPU\nhits"),
    ("host_link_busy_fraction", "host link\nbusy"),
)
ROWS_PER_PAGE = 26


def columns(study: Study) -> tuple[tuple[str, str], ...]:
    """The metric columns: ``COLUMNS``, and the offload tiers' after the prefix hit rate when any
    run of the study has an offload store."""
    if not any(offloading(r["config"]) for r in study.records):
        return COLUMNS
    at = [key for key, _ in COLUMNS].index("prefix_hit_rate") + 1
    return COLUMNS[:at] + OFFLOAD_COLUMNS + COLUMNS[at:]


def table_axes(study: Study) -> list[str]:
    """The settings columns: every axis with more than one value (seed last)."""
    axes = study.varying()
    return axes + [SEED] if study.seeded else axes


def all_runs(study: Study) -> Table:
    axes = table_axes(study)
    shown = columns(study)
    header = ["run", *(a.replace("_", "_\n", 1) if len(a) > 10 else a for a in axes), "load",
              *(label for _, label in shown)]
    rows = []
    for r in study.records:
        config = r["config"]
        moot = moot_settings(config)
        settings = ["-" if a in moot else value_label(config.get(a)) for a in axes]
        if r["status"] != "ok":
            rows.append([r["id"][:8], *settings, "failed", *("-" for _ in shown)])
            continue
        values = [M[key].format(metric(r, key)) for key, _ in shown]
        rows.append([r["id"][:8], *settings, run_load(r).regime, *values])
    return Table(header, rows)


def table_pages(study: Study) -> Iterator[Page]:
    table = all_runs(study)
    chunks = [table.rows[i:i + ROWS_PER_PAGE] for i in range(0, len(table.rows), ROWS_PER_PAGE)] or [[]]
    for k, rows in enumerate(chunks):
        first = k * ROWS_PER_PAGE + 1
        title = "All runs" + (f" ({k + 1} of {len(chunks)})" if len(chunks) > 1 else "")
        caption = (f"Every run of the study, one row each: rows {first}-{first + len(rows) - 1} of {len(table.rows)} "
                   f"({len(study.ok)} completed, {len(study.failed)} failed). Settings columns are the axes the "
                   "study varies; load is the run's regime (below, near or past saturation); latencies are "
                   "percentiles over the run's completed requests; KV cache allocated is the cache's share allocated "
                   "on average, and allocated holding tokens the share of those allocated slots that hold a token.")
        fig, (ax,) = new_page(title, caption, ncols=1)
        ax.axis("off")
        if rows:
            widths = _widths(table.header, rows)
            drawn = ax.table(cellText=rows, colLabels=table.header, loc="upper center", cellLoc="right",
                             colWidths=widths)
            drawn.auto_set_font_size(False)
            drawn.set_fontsize(7 if len(table.header) > 14 else 8)
            drawn.scale(1, 1.25)
            for (row, _col), cell in drawn.get_celld().items():
                if row == 0:
                    cell.set_text_props(fontweight="bold")
                    cell.set_facecolor("#e9ecef")
                    cell.set_height(cell.get_height() * 2)
        yield Page(title, caption, fig, Table(table.header, rows))


def _widths(header: list[str], rows: list[list[str]]) -> list[float]:
    chars = [max(*(len(line) for line in h.split("\n")), *(len(r[j]) for r in rows)) + 2 for j, h in enumerate(header)]
    total = sum(chars)
    return [c / total for c in chars]
