"""``pagesim report DIR -o report.pdf``: a study's results as a PDF a serving engineer can forward.

Pages, in order (``report_pages``): cover (what was run, on what, the load regimes, the noise
rule, versions; which pages are absent and why), summary (the best setting per metric, judged
against noise, and the findings in words), the all-runs table, every grid drawn whole, the KV
offloading pages (``pagesim.reports.offload_pages``) for a grid that varies the offload size, the
P:D split pages (``pagesim.reports.pd_pages``) for a grid that varies ``pd_split``, the load
curves (throughput vs tail latency, goodput vs rate), the aspect pages of ``pagesim.reports.pages``, the
paper comparison for a paper preset, and the failed runs if any. Every title and caption is
generated from the study's data. Written under a staging name and renamed, so a report is never
half-written (nor left as a staged file when writing fails), or streamed to a device or FIFO
(``pagesim.engine.outputs``); ``pagesim.reports.html`` writes the same pages as one HTML file.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import platform
import textwrap
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

from pagesim.engine.outputs import OutputFile, writing, written  # noqa: E402
from pagesim.reports.findings import best_settings, findings, load_findings, noise_rule, outline_lines  # noqa: E402
from pagesim.reports.grid_pages import grid_pages  # noqa: E402
from pagesim.reports.load import RULE  # noqa: E402
from pagesim.reports.load_pages import goodput_page, throughput_latency_page  # noqa: E402
from pagesim.reports.noise import DEFAULT_THRESHOLD  # noqa: E402
from pagesim.reports.offload import offload_grids  # noqa: E402
from pagesim.reports.offload_pages import TITLE as OFFLOAD_TITLE  # noqa: E402
from pagesim.reports.offload_pages import offload_pages  # noqa: E402
from pagesim.reports.pages import FIGURE_PAGES  # noqa: E402
from pagesim.reports.pd_pages import TITLE as PD_TITLE  # noqa: E402
from pagesim.reports.pd_pages import pd_pages  # noqa: E402
from pagesim.reports.pd_study import split_grids  # noqa: E402
from pagesim.reports.results import Study, load_study  # noqa: E402
from pagesim.reports.run_config import describe_config  # noqa: E402
from pagesim.reports.style import PAGE, Page, Table, new_page  # noqa: E402
from pagesim.reports.table_pages import table_pages  # noqa: E402

LOAD_PAGES = (
    ("Throughput vs tail latency as the request rate grows", throughput_latency_page,
     "needs a setting run at two or more request rates (a rate_scale or rate axis)"),
    ("Goodput vs request rate", goodput_page, "needs a setting run at two or more request rates"),
)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("pagesim", "simpy", "numpy", "matplotlib"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _text_page(title: str, sentence: str, body: list[str], *, size: float = 9.5):
    fig = plt.figure(figsize=PAGE)
    fig.suptitle(title, fontsize=17, fontweight="bold", x=0.04, ha="left", y=0.95)
    fig.text(0.04, 0.88, sentence, fontsize=11, va="top", wrap=True)
    fig.text(0.04, 0.82, "\n".join(body), fontsize=size, va="top", family="monospace")
    return fig


def _kv_cache_words(study: Study) -> str:
    base = study.base
    if base.get("kv_cache_gb") is not None:
        return f"{base['kv_cache_gb']:g} GiB per GPU"
    if base.get("num_gpu_blocks") is not None:
        return f"{base['num_gpu_blocks']:,} blocks"
    sized = [r["deployment"]["kv_cache_source"] for r in study.slice() if (r.get("deployment") or {}).get("kv_cache_source")]
    return sized[0] if sized else "sized from the GPU memory budget (no run at the base settings completed to say how much)"


def cover_lines(study: Study, omitted: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The cover's fields as (name, value); every value is non-empty."""
    meta = study.meta
    src = meta["source"]
    what = f"workload {src['workload']}" if "workload" in src else f"trace {src['trace']}"
    if src.get("rate"):
        what += f" at {src['rate']:g} requests/s"
    if src.get("num_requests"):
        what += f", {src['num_requests']:,} requests"
    base = meta["base"]
    shown = ("model", "gpu", "tp", "policy", "kv_cache_gb", "swap_space_gb")
    lines = [
        ("date", f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"),
        ("source", what),
        ("deployment", f"{base['model']} on {base['gpu']} (tp {base['tp']}), policy {base['policy']}, KV cache "
                       f"{_kv_cache_words(study)}, swap space {base['swap_space_gb']:g} GiB"),
        ("base settings", ", ".join(f"{k}={v}" for k, v in base.items() if v is not None and k not in shown
                                    and k not in ("plugins", "plugins_digest", "profile")) or "the defaults"),
        ("grid axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in meta["axes"].items()) or "none"),
        ("runs", f"{len(meta['run_ids'])} in the study: {len(study.ok)} completed, {len(study.failed)} failed, "
                 f"{len(meta['run_ids']) - len(study.records)} not run yet"),
        ("load", " ".join(load_findings(study)) or "no completed runs"),
        ("load rule", RULE),
        ("noise rule", noise_rule(study)),
        ("cost model", _cost_model_words(base)),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions().items())),
    ]
    if meta.get("description"):
        lines.append(("about", meta["description"]))
    if omitted:
        lines.append(("pages left out", "; ".join(f"{t} ({why})" for t, why in omitted)))
    return lines


def _cost_model_words(base: dict) -> str:
    profile = base.get("profile")
    if profile:
        params = ", ".join(f"{k} {v:.4g}" for k, v in sorted(profile["roofline"].items()))
        return (f"roofline with fitted profile {profile['path']} (pagesim calibrate --from-measurements on "
                f"{profile['gpu']}: {params}, frontend {profile['frontend_ms'][0]:.3g} ms in)")
    return "roofline (no calibration profile: calibration and simulated-vs-measured pages absent)"


def cover(study: Study, omitted: list[tuple[str, str]]) -> Page:
    fields = cover_lines(study, omitted)
    body = [wrapped for name, value in fields
            for wrapped in (textwrap.wrap(f"{name:<15} {value}", 125, subsequent_indent=" " * 16) or [""])]
    title = f"pagesim study: {study.meta['name']}"
    caption = ("What was simulated and how, and in which load regime. Later pages show every run: a table, each grid "
               "whole, and pages that compare runs differing only in the settings they plot.")
    return Page(title, caption, _text_page(title, caption, body), Table(["field", "value"], [list(f) for f in fields]))


def summary_page(study: Study) -> Page:
    rows = best_settings(study)
    title = "Summary: the best setting per metric"
    caption = ("For each metric, the best setting among the runs at the base load, workload, cache size"
               + _offload_size_words(study) + " and allocator "
               "(so they differ in policy only), and whether it is ahead by more than noise ("
               + noise_rule(study) + "). Below, the load each offered rate put on the server.")
    fig, (ax,) = new_page(title, caption, ncols=1)
    ax.set_position([0.02, 0.40, 0.96, 0.40])
    ax.axis("off")
    header = ["metric", "best value", "better", "setting", "verdict"]
    cells = [[r["metric"], r["value"], r["better"], r["setting"], r["verdict"]] for r in rows]
    if cells:
        table = ax.table(cellText=cells, colLabels=header, loc="upper center", cellLoc="left",
                         colWidths=[0.14, 0.15, 0.06, 0.33, 0.32])
        table.auto_set_font_size(False)
        table.set_fontsize(8.5)
        table.scale(1, 1.4)
    load = load_findings(study) or ["No completed run: the load is unknown."]
    wrapped = [w for line in load for w in textwrap.wrap("- " + line, 150, subsequent_indent="  ")]
    fig.text(0.02, 0.33, "Load", fontsize=12, fontweight="bold", va="top")
    fig.text(0.02, 0.29, "\n".join(wrapped[:14] + ([f"... {len(wrapped) - 14} more lines in the HTML report"]
                                                  if len(wrapped) > 14 else [])) + "\n\n" + "\n".join(
        textwrap.wrap("Rule: " + RULE + ".", 150)), fontsize=9.5, va="top")
    return Page(title, caption, fig, Table(header, cells), notes=load)


def _offload_size_words(study: Study) -> str:
    """The offload size the summary's runs share, when the study varies it (a resource, like the cache)."""
    if not study.varies("kv_offloading_size"):
        return ""
    size = {**study.base, **study.anchor()}.get("kv_offloading_size")
    return f", offload size ({size:g} GiB)" if size else ", offload size (none)"


def findings_page(study: Study) -> Page:
    found = findings(study)
    title = "Findings"
    caption = ("What the study found, setting by setting, each claim with its numbers, the runs it rests on and their "
               "load; a difference is named only where it exceeds noise (" + noise_rule(study)
               + ").")
    fig = plt.figure(figsize=PAGE)
    fig.suptitle(title, fontsize=15, fontweight="bold", x=0.02, ha="left", y=0.975)
    fig.text(0.02, 0.925, caption, fontsize=10, wrap=True, va="top")
    wrapped = outline_lines(study, 165)
    # (the 85% of the page below the caption holds 41 lines of 9.5 points, 48 of 8)
    size = 9.5 if len(wrapped) <= 41 else 8
    limit = 41 if size == 9.5 else 47
    body = wrapped[:limit] + ([f"... {len(wrapped) - limit} more lines: the HTML report and `pagesim study` print "
                               "them all"] if len(wrapped) > limit else [])
    fig.text(0.02, 0.85, "\n".join(body), fontsize=size, va="top")
    return Page(title, caption, fig, notes=found)


def failures_page(study: Study) -> Page:
    lines = []
    for r in study.failed:
        setting = describe_config(r["config"], study.base)
        lines += textwrap.wrap(f"{r['id']}  {setting}: {r['error']}", 140, subsequent_indent="    ")
    title = "Failed runs"
    caption = "Runs that raised; each is recorded with its error and left out of every figure."
    body = lines[:45] + ([f"... and {len(lines) - 45} more lines"] if len(lines) > 45 else [])
    rows = [[r["id"], describe_config(r["config"], study.base), r["error"]] for r in study.failed]
    return Page(title, caption, _text_page(title, caption, body), Table(["run", "settings", "error"], rows))


def iter_report_pages(study: Study) -> Iterator[Page]:
    """Every page of the report, in order, one at a time: the consumer closes each figure once it
    has drawn it, so memory holds one page whatever the study's size. (The cover names the pages
    left out, so the optional pages are made once beforehand to see which exist, and closed.)"""
    present, omitted = [], []
    for title, make, why in (*LOAD_PAGES, *FIGURE_PAGES):
        page = make(study) if study.ok else None
        if page is None:
            omitted.append((title, why))
        else:
            plt.close(page.figure)
            present.append(make)
    if not offload_grids(study):
        omitted.append((OFFLOAD_TITLE, "needs a kv_offloading_size axis"))
    if not split_grids(study):
        omitted.append((PD_TITLE, "needs a pd_split axis with a completed P:D run"))
    yield cover(study, omitted)
    yield summary_page(study)
    yield findings_page(study)
    yield from table_pages(study)
    if study.ok:
        yield from grid_pages(study)
        yield from offload_pages(study)
        yield from pd_pages(study)
    for make in present:
        yield make(study)
    if study.meta.get("paper"):
        from pagesim.reports.paper_pages import paper_pages

        yield from paper_pages(study)
    if study.failed:
        yield failures_page(study)


def report_pages(study: Study) -> list[Page]:
    """Every page of the report, in order, all held (the caller closes their figures)."""
    return list(iter_report_pages(study))


def open_study(study_dir: str | Path, threshold: float = DEFAULT_THRESHOLD) -> Study:
    study = load_study(study_dir, threshold=threshold)
    if not study.records:
        raise ValueError(f"{study_dir}: the study has no finished runs yet")
    return study


def report_outputs(pdf: str | Path | OutputFile | None, html: str | Path | OutputFile | None, *,
                   pdf_flag: str = "-o", html_flag: str = "--html") -> tuple[OutputFile | None, OutputFile | None]:
    """The report's files checked now (``pagesim.engine.outputs``: a regular file or nothing is replaced, a
    device or FIFO streamed to, anything else refused), so a command checks them before its work."""
    pdf_out = pdf if isinstance(pdf, OutputFile) or pdf is None else OutputFile(pdf, pdf_flag)
    html_out = html if isinstance(html, OutputFile) or html is None else OutputFile(html, html_flag)
    if pdf_out is not None and html_out is not None and not (pdf_out.stream or html_out.stream) \
            and os.path.realpath(pdf_out.target) == os.path.realpath(html_out.target):
        raise ValueError(f"{html_out.path}: the same file given twice")
    return pdf_out, html_out


def build_report(study_dir: str | Path, out_pdf: str | Path | OutputFile | None, *,
                 html: str | Path | OutputFile | None = None, threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """Write the PDF (and the HTML report if asked), a page at a time; returns the page titles.
    Each file is written beside its name and both are renamed once both are whole, so a failure
    (a full disk: one ``OSError`` naming the file) leaves neither, nor a temporary file; a device
    or FIFO is written as a stream. The files may be given as ``OutputFile`` s checked before."""
    from pagesim.reports.html import HtmlReport

    study = open_study(study_dir, threshold)
    pdf_out, html_out = report_outputs(out_pdf, html)
    report = HtmlReport(study.meta) if html_out is not None else None
    titles = []
    outputs = [o for o in (pdf_out, html_out) if o is not None]
    with written(outputs) as files:
        handle = dict(zip(map(id, outputs), files))
        with contextlib.ExitStack() as stack:
            pdf = None
            if pdf_out is not None:
                stack.enter_context(writing(pdf_out.path))  # (outermost: it sees the error PdfPages' close raises)
                pdf = stack.enter_context(PdfPages(handle[id(pdf_out)], metadata={
                    "Title": f"pagesim study {study.meta['name']}", "Creator": "pagesim"}))
            for page in iter_report_pages(study):
                try:
                    titles.append(page.title)
                    if pdf is not None:
                        pdf.savefig(page.figure)
                    if report is not None:
                        report.add(page)
                finally:
                    plt.close(page.figure)
        if report is not None:
            with writing(html_out.path):
                report.save(handle[id(html_out)])
    return titles
