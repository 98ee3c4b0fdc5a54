"""``pagesim report DIR -o report.pdf``: a study's results as a PDF a serving engineer can forward.

Pages, in order: cover (what was run, on what, with which versions, when; which pages are absent
and why), summary (the best setting per metric and the findings in words), the figure pages of
``reports.pages`` that the study has data for, the paper comparison for a paper preset, and the
failed runs if any. Written to a temporary file and renamed, so a report is never half-written.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

from reports.pages import FIGURE_PAGES, PAGE, new_page  # noqa: E402
from reports.results import Study, best_settings, describe_config, findings, load_study  # noqa: E402


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


def cover(study: Study, omitted: list[tuple[str, str]]):
    meta = study.meta
    src = meta["source"]
    what = (f"workload {src['workload']}" if "workload" in src else f"trace {src['trace']}")
    if src.get("rate"):
        what += f" at {src['rate']:g} requests/s"
    if src.get("num_requests"):
        what += f", {src['num_requests']:,} requests"
    base = meta["base"]
    axes = {k: v for k, v in meta["axes"].items()}
    body = [
        f"date            {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"source          {what}",
        f"deployment      {base['model']} on {base['gpu']} (tp {base['tp']}), policy {base['policy']}, "
        f"KV cache {base['kv_cache_gb'] or 'from the memory budget'} GiB, swap {base['swap_space_gb']:g} GiB",
        "base settings   " + ", ".join(f"{k}={v}" for k, v in base.items() if v is not None
                                        and k not in ("model", "gpu", "tp", "policy", "kv_cache_gb", "swap_space_gb")),
        "grid axes       " + ("; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in axes.items()) or "none"),
        f"runs            {len(meta['run_ids'])} in the study: {len(study.ok)} completed, {len(study.failed)} failed, "
        f"{len(meta['run_ids']) - len(study.records)} not run yet",
        "cost model      roofline (no calibration profile: calibration and simulated-vs-measured pages absent)",
        "versions        " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
    ]
    if meta.get("description"):
        body += ["about           " + meta["description"], ""]
    if omitted:
        body.append("pages left out  " + "; ".join(f"{t} ({why})" for t, why in omitted))
    body = [wrapped for line in body
            for wrapped in (textwrap.wrap(line, 125, subsequent_indent=" " * 16) or [""])]
    return _text_page(f"pagesim study: {meta['name']}",
                      "What was simulated and how; every later page compares runs of this study that differ only "
                      "in the settings it plots, all others at the base settings above.", body)


def summary_page(study: Study):
    rows = best_settings(study)
    fig, (ax,) = new_page("Summary: the best setting per metric",
                          "For each metric, the best run among those at the base load, workload, cache size, "
                          "allocator and seed (so they differ in policy only), and the settings that distinguish it "
                          "from the base; below, what the study found, in words.", ncols=1)
    ax.axis("off")
    if rows:
        cells = [[r["metric"], f"{r['value']:,.4g} {r['unit']}", "higher" if r["better"] == "max" else "lower",
                  r["setting"]] for r in rows]
        table = ax.table(cellText=cells, colLabels=["metric", "best value", "better", "setting"], loc="upper center",
                         cellLoc="left", colWidths=[0.18, 0.16, 0.07, 0.59])
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table.scale(1, 1.5)
    found = findings(study) or ["No comparison to draw: the study varies nothing the findings look at."]
    text = "\n".join("- " + "\n  ".join(textwrap.wrap(line, 150)) for line in found)
    fig.text(0.04, 0.30, "Findings", fontsize=12, fontweight="bold", va="top")
    fig.text(0.04, 0.26, text, fontsize=10, va="top")
    return fig


def failures_page(study: Study):
    lines = []
    for r in study.failed:
        setting = describe_config(r["config"], study.base)
        lines += textwrap.wrap(f"{r['id']}  {setting}: {r['error']}", 140, subsequent_indent="    ")
    return _text_page("Failed runs", "Runs that raised; each is recorded with its error and left out of every figure.",
                      lines[:45] + ([f"... and {len(lines) - 45} more lines"] if len(lines) > 45 else []))


def build_report(study_dir: str | Path, out_pdf: str | Path) -> list[str]:
    """Write the PDF; returns the page titles, in order."""
    study = load_study(study_dir)
    if not study.records:
        raise ValueError(f"{study_dir}: the study has no finished runs yet")
    figures, omitted = [], []
    for title, page, why in FIGURE_PAGES:
        fig = page(study) if study.ok else None
        (figures.append((title, fig)) if fig is not None else omitted.append((title, why)))
    pages = [("Cover", cover(study, omitted)), ("Summary", summary_page(study)), *figures]
    if study.meta.get("paper"):
        from reports.paper_pages import paper_pages

        pages += paper_pages(study)
    if study.failed:
        pages.append(("Failed runs", failures_page(study)))
    out = Path(out_pdf)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with PdfPages(tmp, metadata={"Title": f"pagesim study {study.meta['name']}", "Creator": "pagesim"}) as pdf:
        for _, fig in pages:
            pdf.savefig(fig)
            plt.close(fig)
    tmp.replace(out)
    return [title for title, _ in pages]
