"""The PDF report: expected pages and texts (read back with pypdf), figures that hold data, the
all-runs table, grids drawn whole, findings that claim only what exceeds noise."""

from __future__ import annotations

import pytest

from pagesim.reports.execute import run_study
from pagesim.reports.findings import best_settings, findings
from pagesim.reports.pdf import build_report, report_pages
from pagesim.reports.results import load_study
from pagesim.reports.spec import parse_spec
from pagesim.reports.table_pages import all_runs
from tests.test_study import SMALL

# vLLM 0.6.3's swap with no swap space, under load: a run that fails while it runs (one that cannot be
# built, such as a max_model_len past the context, is refused before the study starts)
FAILS_WHILE_RUNNING = ("[[grid]]\nswap_space_gb = [0.0]\nrate_scale = [5.0]\nkv_cache_gb = [0.5]\npolicy = ['vllm-v0']\n"
                       "preemption = ['swap']\nprefix_caching = [false]\n")

pypdf = pytest.importorskip("pypdf")


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    spec = parse_spec(SMALL + FAILS_WHILE_RUNNING)  # one run that fails
    run_study(spec, out, workers=2, progress=False)
    return out


def _texts(pdf_path) -> list[str]:
    return [" ".join(page.extract_text().split()) for page in pypdf.PdfReader(pdf_path).pages]


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_report_pages_and_texts(study_dir, tmp_path):
    pdf = tmp_path / "report.pdf"
    titles = build_report(study_dir, pdf)
    assert titles[:4] == ["pagesim study: small", "Summary: the best setting per metric", "Findings", "All runs"]
    for expected in ("Summary: the best setting per metric", "Findings",
                     "Block size × Preemption mode: throughput, goodput and tail latency",
                     "Throughput, goodput and tail latency per allocator",
                     "Eviction policy × KV cache size: throughput, goodput and tail latency",
                     "Throughput vs tail latency as the request rate grows", "Goodput vs request rate",
                     "Latency distributions per block size", "Queue, batch and memory over time per preemption mode",
                     "KV-cache memory over time: paging vs contiguous reservation",
                     "Preemptions: swap vs recompute, and what they cost",
                     "Prefix hit rate and throughput vs cache size per eviction policy"):
        assert expected in titles, expected
    assert titles[-1] == "Failed runs"
    texts = _texts(pdf)
    assert len(texts) == len(titles)
    assert "pagesim study: small" in texts[0] and "14 in the study: 13 completed, 1 failed" in texts[0]
    assert "pagesim 0.1.0" in texts[0] and "workload shared-system-prompt at 6 requests/s" in texts[0]
    assert "KV cache 1 GiB per GPU" in texts[0] and "saturation" in texts[0]
    assert "throughput" in texts[1] and "Load" in texts[1]
    assert "Findings" in texts[2] and "Block size (8, 16;" in texts[2]
    assert "Failed runs" in texts[-1] and "swap_space_gb=0.0: SwapSpaceExhausted" in texts[-1]
    for title, text in zip(titles, texts):
        assert " ".join(title.split())[:30] in text, title


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_all_runs_table_lists_every_run(study_dir, tmp_path):
    study = load_study(study_dir)
    table = all_runs(study)
    assert len(table.rows) == len(study.records) == 14
    assert {row[0] for row in table.rows} == {r["id"][:8] for r in study.records}
    failed = [row for row in table.rows if "failed" in row]
    assert len(failed) == 1
    pdf = tmp_path / "r.pdf"
    build_report(study_dir, pdf)
    text = _texts(pdf)[3]
    for r in study.records:
        assert r["id"][:8] in text


def test_every_figure_holds_data(study_dir):
    study = load_study(study_dir)
    import matplotlib.pyplot as plt

    for page in report_pages(study)[4:]:
        if page.title == "Failed runs":
            continue
        for ax in page.figure.axes:
            if not ax.axison or ax.get_label() == "<colorbar>":
                continue
            drawn = len(ax.lines) + len(ax.patches) + len(ax.collections) + len(ax.images)
            assert drawn > 0, f"{page.title}: an empty axes ({ax.get_title()})"
            assert ax.get_xlabel() and ax.get_ylabel(), f"{page.title}: unlabelled axes ({ax.get_title()})"
        for word in ("None", "nan", "{", "}"):
            assert word not in page.title and word not in page.caption, (page.title, word)
        plt.close(page.figure)


def test_magnitude_axes_start_at_zero(study_dir):
    import matplotlib.pyplot as plt

    study = load_study(study_dir)
    for page in report_pages(study):
        for ax in page.figure.axes:
            if ax.axison and (ax.lines or ax.patches) and not ax.images and ax.get_yscale() == "linear":
                assert ax.get_ylim()[0] == 0, f"{page.title}: {ax.get_title()} starts at {ax.get_ylim()[0]}"
        plt.close(page.figure)


def test_findings_state_load_and_judge_by_noise(study_dir):
    study = load_study(study_dir)
    lines = findings(study)
    assert any(line.startswith("At ") and "saturation" in line for line in lines)
    assert any(line.startswith("Block size (8, 16;") for line in lines)
    assert any(line.startswith("Preemption mode") for line in lines)
    assert lines[-2].startswith("Differences judged with one run per setting")
    assert lines[-1] == "1 run(s) failed; the report lists them."
    # Raising the threshold to 99% leaves nothing measurable: every verdict says so.
    lenient = load_study(study_dir, threshold=0.99)
    rows = best_settings(lenient)
    assert rows and all(r["verdict"].startswith("no measurable difference") or r["metric"] == "preemptions"
                        for r in rows), rows


def test_pages_without_data_are_left_out_and_named(tmp_path):
    spec = parse_spec(SMALL.split("[[grid]]")[0] + "[[grid]]\nblock_size = [8, 16]\n")
    run_study(spec, tmp_path, workers=1, progress=False)
    pdf = tmp_path / "r.pdf"
    titles = build_report(tmp_path, pdf)
    assert not any("Preemption mode" in t or "cache size" in t or "request rate" in t for t in titles), titles
    assert "Throughput, goodput and tail latency per block size" in titles
    cover = _texts(pdf)[0]
    assert "pages left out" in cover and "needs a kv_cache_gb axis" in cover
    assert "needs a setting run at two or more request rates" in cover


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_kwon2023_preset_prints_the_papers_numbers_beside_ours(tmp_path):
    from pagesim.reports.presets import KWON2023

    spec = parse_spec(KWON2023, ["source.num_requests=40", "grid.2.block_size=[8, 16]", "grid.3.block_size=[16]",
                                 "grid.4.block_size=[16, 64]"])
    run_study(spec, tmp_path, workers=2, progress=False)
    study = load_study(tmp_path)
    assert not study.failed, [r["error"] for r in study.failed]
    pdf = tmp_path / "kwon.pdf"
    titles = build_report(tmp_path, pdf)
    assert titles[-2:] == ["Paper comparison: PagedAttention (Kwon et al., SOSP 2023), the paper's numbers beside ours",
                           "Paper comparison: block size (Fig. 18b) and swap vs recompute (Fig. 19)"]
    text = _texts(pdf)[-2]
    for expected in ("PagedAttention (Kwon et al., SOSP 2023)", "Fig. 2 memory holding tokens", "20.4%", "96.3%",
                     "Fig. 13 batched requests, Alpaca @ 30 req/s", "132.44", "parallel n=6", "beam width=4", "53.1%"):
        assert expected in text, expected
    from pagesim.reports.paper_pages import comparison_rows

    rows = comparison_rows(study)
    assert len(rows) == 4 + 8 + 6 and all(row[3] != "-" for row in rows), rows
