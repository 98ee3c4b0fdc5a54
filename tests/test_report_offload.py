"""KV offloading in studies and reports: the two study axes (``kv_offloading_size``,
``kv_offloading_policy``) parsed, validated and passed to the simulator; a size-0 run shared by
every policy; the page "Prefix hits and TTFT vs offload size per offload policy" drawn from a real
tiny study (and only when a grid varies the size), with the tiers split and readable; the all-runs
table's offload columns; findings that name a best policy only beyond noise."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from pagesim.reports.execute import _write_study, run_study
from pagesim.reports.findings import findings
from pagesim.reports.html import HtmlReport
from pagesim.reports.offload import Sweep, offload_findings, offload_grids
from pagesim.reports.offload_pages import TITLE, offload_pages
from pagesim.reports.pdf import build_report, iter_report_pages
from pagesim.reports.results import load_study, metric
from pagesim.reports.run_config import run_id
from pagesim.reports.runner import _run_spec
from pagesim.reports.spec import SpecError, parse_spec
from pagesim.reports.store import ResultsStore
from pagesim.reports.table_pages import all_runs
from tests.report_layout import layout_problems
from tests.test_report_grids import fake_record

pypdf = pytest.importorskip("pypdf")

HEAD = '[source]\nworkload = "shared-system-prompt"\nrate = 2.0\nnum_requests = 60\n[base]\nnum_gpu_blocks = 400\n'
SWEEP = HEAD + '[[grid]]\nkv_offloading_size = [0, 0.5]\nkv_offloading_policy = ["lru", "arc"]\n'


def _offload(config) -> tuple:
    return config.get("kv_offloading_size"), config.get("kv_offloading_policy")


def test_size_zero_is_one_run_for_every_policy_and_old_ids_stay():
    runs = parse_spec(SWEEP).runs()
    assert sorted(map(_offload, runs), key=str) == [(0.0, None), (0.5, "arc"), (0.5, "lru")]
    assert "kv_offloading_policy" not in runs[0]  # (size 0: no store for the policy to act on)
    # a study that does not use offloading keeps its run ids (the settings stay out of its configs)
    plain = parse_spec(HEAD).runs()[0]
    assert "kv_offloading_size" not in plain and "kv_offloading_policy" not in plain
    # RunSpec's name is accepted too, and gives the same runs
    alias = SWEEP.replace("kv_offloading_size", "kv_offloading_gb")
    assert [run_id(c) for c in parse_spec(alias).runs()] == [run_id(c) for c in runs]


def test_runs_pass_the_store_and_its_policy_to_the_simulator():
    by_setting = {_offload(c): c for c in parse_spec(SWEEP + 'allocator = ["paged", "max"]\n').runs()}
    on = _run_spec(by_setting[(0.5, "arc")])
    assert on.kv_offloading_gb == 0.5 and on.overrides["offload_eviction_policy"] == "arc"
    off = _run_spec(by_setting[(0.0, None)])
    assert off.kv_offloading_gb is None and "offload_eviction_policy" not in off.overrides
    contiguous = [c for c in by_setting.values() if c["allocator"] == "max"]
    assert contiguous and all(_run_spec(c).kv_offloading_gb is None for c in contiguous)


@pytest.mark.parametrize("body, message", [
    ("[[grid]]\nkv_offloading_size = [-1.0, 4]\n", r"kv_offloading_size must be a finite number of GiB >= 0, got -1$"),
    ("[[grid]]\nkv_offloading_size = [4]\nkv_offloading_policy = ['lru', 'clock']\n",
     r"kv_offloading_policy = 'clock' is not one of lru, arc, lfu$"),
    ("kv_offloading_policy = 'fifo'\n", r"kv_offloading_policy = 'fifo' is not one of"),
    ("prefix_caching = false\nkv_offloading_size = 4\n",
     r"kv_offloading_size = 4 needs prefix caching .* but prefix_caching = false$"),
    ("policy = 'vllm-v0'\nkv_offloading_size = 4\n", r"but policy 'vllm-v0' has none$"),
    ("kv_offloading_size = 4\nkv_offloading_gb = 8\n", r"kv_offloading_gb \(another name\) and kv_offloading_size are"),
    ("[[grid]]\nkv_offloading_policy = ['lru', 'arc']\n",
     r"grid\[0\]: kv_offloading_policy varies, but no run of the grid has an offload store"),
])
def test_bad_offload_settings_are_refused_in_one_line(body, message):
    with pytest.raises(SpecError, match=message) as caught:
        parse_spec(HEAD + body)
    assert "\n" not in str(caught.value)


def test_tier_metrics_of_a_run_without_a_store_are_all_hbm():
    off = {"config": {"allocator": "paged"}, "summary": {"prefix_hit_rate": 0.4}}
    assert metric(off, "hbm_hit_rate") == 0.4 and metric(off, "offload_hit_rate") == 0.0
    # a run with a store whose summary does not split the tiers: unknown, not all-HBM
    unsplit = {"config": {"allocator": "paged", "kv_offloading_size": 4.0}, "summary": {"prefix_hit_rate": 0.4}}
    assert metric(unsplit, "hbm_hit_rate") is None and metric(unsplit, "offload_hit_rate") is None
    assert metric({"config": {"allocator": "max"}, "summary": {"prefix_hit_rate": None}}, "hbm_hit_rate") is None


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("offload")
    run_study(parse_spec(SWEEP), out, workers=1, progress=False)
    return out


def _texts(pdf_path) -> list[str]:
    return [" ".join(page.extract_text().split()) for page in pypdf.PdfReader(pdf_path).pages]


def test_a_real_sweep_splits_hits_by_tier_and_renders(sweep_dir, tmp_path):
    study = load_study(sweep_dir)
    assert not study.failed, [r["error"] for r in study.failed]
    by_setting = {_offload(r["config"]): r["summary"] for r in study.ok}
    off, lru, arc = by_setting[(0.0, None)], by_setting[(0.5, "lru")], by_setting[(0.5, "arc")]
    assert "offload_hit_rate" not in off  # (the simulator reports the tiers only with a store)
    assert lru["offload_hit_rate"] > 0 and lru["prefix_hit_rate"] > off["prefix_hit_rate"]
    block_bytes = next(r["deployment"]["block_bytes"] for r in study.ok)  # (tp 1: one GPU's block is the replica's)
    assert lru["offload_loaded_bytes"] == lru["offload_loaded_blocks"] * block_bytes > 0
    off = {**off, "hbm_hit_rate": off["prefix_hit_rate"]}  # (all HBM, as the page draws it)
    assert lru["hbm_hit_rate"] + lru["offload_hit_rate"] == pytest.approx(lru["prefix_hit_rate"], abs=2e-6)

    pdf = tmp_path / "report.pdf"
    titles = build_report(sweep_dir, pdf)
    assert titles.count(TITLE) == 1
    texts = _texts(pdf)
    assert "cache size, offload size (0.5 GiB) and allocator" in texts[1]  # (the summary's runs share one size)
    text = texts[titles.index(TITLE)]
    assert "At 0 GiB offloading is off (HBM only): one run, shared by every policy" in text
    assert "Every other setting at the base (llama3-8b on a100-40gb, 400 GPU blocks)" in text

    (page,) = offload_pages(study)
    try:
        html = HtmlReport(study.meta)
        html.add(page)
        assert TITLE in html.render() and "<td>off (HBM only)</td>" in html.render()
        hits, mean, p99 = page.figure.axes[:3]
        assert [ax.get_title() for ax in (hits, mean, p99)] == ["Prefix hits by tier", "TTFT mean", "TTFT p99"]
        # stacked bars (HBM below CPU): the shared HBM-only run once, then one pair per policy
        drawn = [b for b in hits.patches if b.get_width() > 0]  # (hbm, cpu) per bar, in order
        assert len(drawn) == 2 * 3
        assert [round(b.get_height(), 3) for b in drawn[0::2]] == [round(s["hbm_hit_rate"] * 100, 3)
                                                                   for s in (off, lru, arc)]
        assert [round(b.get_y() + b.get_height(), 3) for b in drawn[1::2]] == [round(s["prefix_hit_rate"] * 100, 3)
                                                                               for s in (off, lru, arc)]
        assert [line.get_ydata()[0] for line in mean.lines] == [off["ttft_s"]["mean"]] * 2  # both from HBM only
        assert page.table.rows[0][:2] == ["0", "off (HBM only)"] and len(page.table.rows) == 3
        problems = layout_problems(page.figure, TITLE)
        assert not any(problems.values()), problems
    finally:
        plt.close(page.figure)


def test_all_runs_table_and_findings_of_a_sweep(sweep_dir):
    study = load_study(sweep_dir)
    table = all_runs(study)
    header = [h.replace("\n", " ") for h in table.header]
    assert {"HBM hits", "CPU hits", "host link busy"} <= set(header)
    policy = header.index("kv_ offloading_policy")
    off = next(row for row in table.rows if row[header.index("kv_ offloading_size")] == "0.0")
    assert off[policy] == "-" and off[header.index("CPU hits")] == "0.0%"
    lines = findings(study)
    sweep = next(line for line in lines if line.startswith("KV offloading (offload size 0, 0.5 GiB, 0 = HBM only"))
    assert "0.5 GiB lru against HBM only" in sweep and "0.5 GiB arc against HBM only" in sweep
    assert not any(line.startswith(("Offload size", "Offload policy")) for line in lines)  # (read as one sweep)


def _made_up_study(tmp_path, grid_toml: str, offload_hits: dict):
    """A study of made-up records (``fake_record``) with the offload keys a run with a store has:
    ``offload_hits`` maps (size, policy) to (HBM, CPU) hit rates."""
    spec = parse_spec(HEAD + grid_toml)
    runs = spec.runs()
    _write_study(tmp_path, spec, runs)
    store, rng = ResultsStore(tmp_path / "results.jsonl"), np.random.default_rng(0)
    for config in runs:
        record = fake_record({**config, "rate_scale": 1.0}, rng)
        record["config"] = config
        hbm, cpu = offload_hits.get(_offload(config), (0.3, 0.0))
        record["summary"]["prefix_hit_rate"] = hbm + cpu
        if config.get("kv_offloading_size"):
            record["summary"].update(hbm_hit_rate=hbm, offload_hit_rate=cpu, host_link_busy_fraction=0.01)
        store.append(record)
    return load_study(tmp_path)


def test_the_page_is_there_only_when_a_grid_varies_the_size(tmp_path):
    fixed = _made_up_study(tmp_path / "a", "kv_offloading_size = 4\n[[grid]]\nkv_offloading_policy = ['lru', 'arc']\n",
                           {})
    assert offload_grids(fixed) == [] and list(offload_pages(fixed)) == []
    pages = list(iter_report_pages(fixed))
    try:
        assert TITLE not in [p.title for p in pages]
        assert "needs a kv_offloading_size axis" in pages[0].table.rows[-1][1]
    finally:
        for p in pages:
            plt.close(p.figure)


def test_other_axes_of_the_grid_give_a_page_each_and_are_named(tmp_path):
    grid = "[[grid]]\nblock_size = [16, 32]\nkv_offloading_size = [0, 4, 16]\nkv_offloading_policy = ['lru', 'arc']\n"
    study = _made_up_study(tmp_path, grid, {})
    pages = list(offload_pages(study))
    try:
        assert [p.title for p in pages] == [f"{TITLE} (block_size=16)", f"{TITLE} (block_size=32)"]
        assert "Fixed on this page: block_size=16; every other setting at the base" in pages[0].caption
        assert "One of 2 such pages, one per block_size." in pages[0].caption
        assert len(pages[0].table.rows) == 1 + 2 * 2
    finally:
        for p in pages:
            plt.close(p.figure)


def test_one_policy_and_no_size_zero_claim_neither(tmp_path):
    study = _made_up_study(tmp_path, "[[grid]]\nkv_offloading_size = [4, 16]\n", {(4.0, None): (0.3, 0.1),
                                                                                (16.0, None): (0.3, 0.2)})
    (page,) = offload_pages(study)
    try:
        assert page.title == "Prefix hits and TTFT vs offload size"
        assert "(offload policy lru (the default))" in page.caption and "offloading is off" not in page.caption
        assert [row[:2] for row in page.table.rows] == [["4", "lru (the default)"], ["16", "lru (the default)"]]
    finally:
        plt.close(page.figure)


@pytest.mark.parametrize("arc_cpu, claim", [
    # 1 point apart: within the 2-point threshold
    (0.10, "no measurable difference between the policies in prefix hit rate"),
    (0.30, "prefix hit rate best with policy arc (60.0%; 21 points higher than lru)"),
])
def test_a_best_policy_is_named_only_beyond_noise(tmp_path, arc_cpu, claim):
    grid = "[[grid]]\nkv_offloading_size = [0, 8]\nkv_offloading_policy = ['lru', 'arc']\n"
    study = _made_up_study(tmp_path, grid, {(0.0, None): (0.3, 0.0), (8.0, "lru"): (0.3, 0.09),
                                            (8.0, "arc"): (0.3, arc_cpu)})
    (found,) = offload_findings(study)
    assert any(claim in c for c in found.claims), found.claims
    sweep = Sweep.of(study.ok, ["lru", "arc"])
    assert sweep.policies == ["lru", "arc"] and sweep.shared(0.0) and not sweep.shared(8.0)


def test_study_json_keeps_the_axes_as_written(sweep_dir):
    meta = json.loads((sweep_dir / "study.json").read_text())
    assert meta["grids"] == [{"kv_offloading_size": [0.0, 0.5], "kv_offloading_policy": ["lru", "arc"]}]
