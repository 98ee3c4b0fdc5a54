"""The report of a fit to measurements (``pagesim calibrate --from-measurements --report DIR``).

Two pages, from the fitted profile's document alone (``pagesim.sim.fit.summary``), as PDF
(``fit.pdf``) and HTML (``fit.html``), written together (neither is left after a failure):

1. **Measured vs predicted, per stage**: E2E, TTFT and per-token error (mean) of every stage of
   every measurement, before the fit (start values) and after, fitted and held-out measurements
   marked apart; and the failures, measured and predicted. The table lists every row's figures.
2. **The fitted parameters** with their uncertainty and bounds, and the median errors per
   measurement (fitted, held out, leave-one-out) before and after.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from pagesim.reports.style import Page, Table, from_zero, new_page

_FIGURES = (("e2e", "E2E"), ("ttft", "TTFT"), ("per_token", "per-token latency"))


def _rows(doc: dict) -> list[dict]:
    """One entry per stage (or whole run, for a file without stages) of the fitted and held-out measurements."""
    out = []
    entries = [(group, e) for group in ("fitted", "held_out") for e in doc["errors"][group]]
    for number, (group, e) in enumerate(entries, 1):
        before = [r for r in e["rows_before"] if r["stage"] is not None] or e["rows_before"]
        after = [r for r in e["rows_after"] if r["stage"] is not None] or e["rows_after"]
        for b, a in zip(before, after):
            stage = "whole" if b["stage"] is None else f"s{b['stage']}"
            out.append({"label": f"{number}: {e['measurement']} {stage}", "short": f"{number}:{stage}",
                        "group": group, "before": b, "after": a})
    return out


def measured_page(doc: dict) -> Page:
    rows = _rows(doc)
    title = "Measured vs predicted, before and after the fit"
    caption = (f"Each stage of {len(doc['fitted_on'])} fitted and {len(doc['held_out'])} held-out measurement(s) on "
               f"{doc['gpu']}: the error of the simulated mean (predicted / measured - 1) with the start values "
               "(before) and the fitted ones (after); failures are counts.")
    fig, axes = new_page(title, caption, 2, 2, legend_rows=1)
    x = np.arange(len(rows))
    held = np.array([r["group"] == "held_out" for r in rows])
    handles = []
    for ax, (figure, name) in zip(axes, _FIGURES):
        for side, color in (("before", "#adb5bd"), ("after", "#1971c2")):
            err = np.array([np.nan if r[side][figure]["mean"]["error"] is None else r[side][figure]["mean"]["error"]
                            for r in rows]) * 100
            for mask, marker, where in ((~held, "o", "fitted"), (held, "s", "held out")):
                h = ax.scatter(x[mask], err[mask], color=color, marker=marker, s=22,
                               label=f"{side}, {where}", zorder=3 if side == "after" else 2)
                if ax is axes[0] and mask.any():
                    handles.append(h)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(f"{name} mean error (%)")
        _stage_axis(ax, rows)
    ax = axes[3]
    measured = [r["before"]["counts"].get("measured", {}).get("failures", 0) for r in rows]
    for side, color in (("before", "#adb5bd"), ("after", "#1971c2")):
        ax.plot(x, [r[side]["counts"]["predicted"]["failures"] for r in rows], color=color, marker=".", lw=0)
    ax.plot(x, measured, color="black", marker="_", ms=10, lw=0, label="measured")
    ax.set_ylabel("failed requests (timeouts)")
    _stage_axis(ax, rows)
    from_zero(ax)
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False)
    table = Table(["row", "set", "E2E measured", "before", "after", "TTFT measured", "before", "after",
                   "per token measured", "before", "after", "failed measured", "before", "after"],
                  [[r["label"], r["group"].replace("_", " "),
                    *[cell for figure, _ in _FIGURES for cell in _cells(r, figure)],
                    str(r["before"]["counts"].get("measured", {}).get("failures", "-")),
                    str(r["before"]["counts"]["predicted"]["failures"]), str(r["after"]["counts"]["predicted"]["failures"])]
                   for r in rows])
    return Page(title, caption, fig, table)


def _stage_axis(ax, rows: list[dict]) -> None:
    ax.set_xticks(np.arange(len(rows)))
    ax.set_xticklabels([r["short"] for r in rows], rotation=90, fontsize=max(4.0, min(8.0, 200 / max(len(rows), 1))))
    ax.set_xlabel("measurement:stage (fitted, then held out; the table names them)")


def _cells(row: dict, figure: str) -> list[str]:
    m = row["before"][figure]["mean"]["measured_s"]
    cells = [_ms(m)]
    for side in ("before", "after"):
        cell = row[side][figure]["mean"]
        cells.append(f"{_ms(cell['predicted_s'])} ({cell['error']:+.1%})" if cell["error"] is not None
                     else _ms(cell["predicted_s"]))
    return cells


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.3f} s"


def params_page(doc: dict) -> Page:
    from pagesim.sim.fit.summary import format_fit

    fig = plt.figure(figsize=(11.69, 8.27))
    title = "The fitted parameters and the errors they leave"
    caption = (f"Fitted on {', '.join(e['measurement'] for e in doc['errors']['fitted'])}"
               f"; {doc['fit']['optimizer']}, {doc['fit']['wall_s']:.0f} s.")
    fig.suptitle(title, fontsize=15, fontweight="bold", x=0.02, ha="left", y=0.975)
    fig.text(0.02, 0.925, caption, fontsize=9, wrap=True, va="top")
    fig.text(0.02, 0.86, format_fit(doc), fontsize=7.5, family="monospace", va="top")
    table = Table(["parameter", "start", "fitted", "std", "lower", "upper", "what"],
                  [[name, f"{p['start']:.4g}", f"{p['value']:.4g}", "inf" if p["std"] is None else f"{p['std']:.3g}",
                    f"{p['lower']:g}", f"{p['upper']:g}", p["what"]] for name, p in doc["params"].items()])
    return Page(title, caption, fig, table)


def write_fit_report(folder: Path, doc: dict) -> list[Path]:
    """``folder``/fit.pdf and ``folder``/fit.html; returns their paths."""
    from matplotlib.backends.backend_pdf import PdfPages

    from pagesim.engine.outputs import OutputFile, writing, written
    from pagesim.reports.html import HtmlReport

    if not folder.is_dir():
        raise ValueError(f"--report {folder}: not a folder (make it first)")
    pdf_out, html_out = OutputFile(folder / "fit.pdf", "--report"), OutputFile(folder / "fit.html", "--report")
    pages = [measured_page(doc), params_page(doc)]
    report = HtmlReport({"name": "fit", "title": f"pagesim calibrate --from-measurements: a fit on {doc['gpu']}"})
    try:
        with written([pdf_out, html_out]) as (pdf_file, html_file):
            with writing(pdf_out.path), contextlib.closing(PdfPages(pdf_file, metadata={
                    "Title": "pagesim fit to measurements", "Creator": "pagesim"})) as pdf:
                for page in pages:
                    pdf.savefig(page.figure)
                    report.add(page)
            with writing(html_out.path):
                report.save(html_file)
    finally:
        for page in pages:
            plt.close(page.figure)
    return [pdf_out.path, html_out.path]
