"""The PDF report: expected pages and texts (read back with pypdf), figures that hold data."""

from __future__ import annotations

import pytest

from reports.execute import run_study
from reports.pages import FIGURE_PAGES
from reports.pdf import build_report
from reports.results import findings, load_study
from reports.spec import parse_spec
from tests.test_study import SMALL

pypdf = pytest.importorskip("pypdf")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    spec = parse_spec(SMALL + "[[grid]]\nmax_model_len = [100000]\n")  # one run that fails
    run_study(spec, out, workers=2, progress=False)
    return out


def _texts(pdf_path) -> list[str]:
    return [" ".join(page.extract_text().split()) for page in pypdf.PdfReader(pdf_path).pages]


def test_report_pages_and_texts(study_dir, tmp_path):
    pdf = tmp_path / "report.pdf"
    titles = build_report(study_dir, pdf)
    assert titles == ["Cover", "Summary", *(t for t, _, _ in FIGURE_PAGES), "Failed runs"]
    texts = _texts(pdf)
    assert len(texts) == len(titles)
    assert "pagesim study: small" in texts[0] and "14 in the study: 13 completed, 1 failed" in texts[0]
    assert "pagesim 0.1.0" in texts[0] and "workload shared-system-prompt at 6 requests/s" in texts[0]
    assert "Summary: the best setting per metric" in texts[1] and "throughput" in texts[1]
    assert "Findings" in texts[1]
    for (title, _, _), text in zip(FIGURE_PAGES, texts[2:]):
        assert title in text, title
    assert "swapped to CPU memory or dropped and recomputed" in texts[5]
    assert "block size (tokens)" in texts[7] and "request rate (requests/s)" in texts[2]
    assert "Failed runs" in texts[-1] and "max_model_len=100000" in texts[-1]


def test_every_figure_holds_data(study_dir):
    study = load_study(study_dir)
    for title, page, _ in FIGURE_PAGES:
        fig = page(study)
        assert fig is not None, title
        for ax in fig.axes:
            drawn = len(ax.lines) + len(ax.patches) + len(ax.collections)
            assert drawn > 0, f"{title}: an empty axes ({ax.get_title()})"
            assert ax.get_xlabel() and ax.get_ylabel(), f"{title}: unlabelled axes"
            assert ax.get_legend() is not None, f"{title}: no legend"


def test_findings_name_the_settings(study_dir):
    lines = findings(load_study(study_dir))
    assert any(line.startswith("Block size") for line in lines)
    assert any("Preemption by" in line for line in lines)
    assert any(line.startswith("Eviction polic") for line in lines)
    assert any(line.startswith("Paging keeps") and "Orca max" in line for line in lines)
    assert lines[-1] == "1 run(s) failed; the report lists them."


def test_pages_without_data_are_left_out_and_named(tmp_path):
    spec = parse_spec(SMALL.split("[[grid]]")[0] + "[[grid]]\nblock_size = [8, 16]\n")
    run_study(spec, tmp_path, workers=1, progress=False)
    pdf = tmp_path / "r.pdf"
    titles = build_report(tmp_path, pdf)
    assert "Preemption: swap vs recompute" not in titles and "Block-size sensitivity" in titles
    assert "pages left out" in _texts(pdf)[0] and "needs a preemption axis" in _texts(pdf)[0]


def test_kwon2023_preset_prints_the_papers_numbers_beside_ours(tmp_path):
    from reports.presets import KWON2023

    spec = parse_spec(KWON2023, ["source.num_requests=40", "grid.2.block_size=[8, 16]", "grid.3.block_size=[16]",
                                 "grid.4.block_size=[16, 64]"])
    run_study(spec, tmp_path, workers=2, progress=False)
    study = load_study(tmp_path)
    assert not study.failed, [r["error"] for r in study.failed]
    pdf = tmp_path / "kwon.pdf"
    titles = build_report(tmp_path, pdf)
    assert titles[-2:] == ["Paper comparison", "Paper comparison: block size and preemption"]
    text = _texts(pdf)[-2]
    for expected in ("PagedAttention (Kwon et al., SOSP 2023)", "Fig. 2 memory holding tokens", "20.4%", "96.3%",
                     "Fig. 13 batched requests, Alpaca @ 30 req/s", "132.44", "parallel n=6", "beam width=4", "53.1%"):
        assert expected in text, expected
    from reports.paper_pages import comparison_rows

    rows = comparison_rows(study)
    assert len(rows) == 4 + 8 + 6 and all(row[3] != "-" for row in rows), rows
