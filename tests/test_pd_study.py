"""P:D-split studies (issue 62, studies and reports): the settings ``gpus``, ``pd_split``, the KV
links, the routers and each pool's own settings parsed and refused in one line; the colocated run
shared by every bandwidth and old studies' run ids unchanged; a tiny study run end to end (a P:D
split and colocated on the same GPUs: goodput per GPU on both, the TTFT split and the transfer bytes
on the split); the page "P:D split vs goodput per GPU, TTFT and TPOT" drawn from it, readable, and
its verdict words."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pytest

from pagesim.reports import pd
from pagesim.reports.execute import run_study
from pagesim.reports.findings import findings
from pagesim.reports.noise import Estimate
from pagesim.reports.pd_pages import TITLE, pd_pages
from pagesim.reports.pd_run import pool_specs
from pagesim.reports.pd_study import SplitSweep, Verdict, moves, pd_findings, split_grids
from pagesim.reports.pdf import build_report
from pagesim.reports.results import load_study, metric
from pagesim.reports.run_config import run_id
from pagesim.reports.spec import SpecError, parse_spec
from tests.report_layout import layout_problems

HEAD = ('[source]\nworkload = "shared-system-prompt"\nrate = 8.0\nnum_requests = 40\n'
        '[base]\nmodel = "llama-125m"\ngpu = "h100-sxm"\nnum_gpu_blocks = 600\n')
SPLITS = HEAD + 'gpus = 2\n[[grid]]\npd_split = ["1:1", "colocated"]\nkv_link_bandwidth = [450, 12.5]\n'
# (SMALL of tests/test_study.py with replicas and a router: its run ids as pagesim 3d077ec gave them)
OLD = ('[source]\nworkload = "shared-system-prompt"\nrate = 6.0\nnum_requests = 30\n[base]\nkv_cache_gb = 1.0\n'
       'replicas = 2\nrouter = "least-kv"\n[[grid]]\nblock_size = [8, 16]\npreemption = ["recompute", "swap"]\n')
OLD_IDS = ["47b7ff02e4947daa", "8f6d8bba23b069e9", "b46ab5ef00f304c7", "e9bd3fe81acb9e50"]


def test_colocated_is_one_run_for_every_bandwidth_and_old_ids_stay():
    runs = parse_spec(SPLITS).runs()
    by = {(c["pd_split"], c.get("kv_link_bandwidth")) for c in runs}
    assert by == {("1:1", 450.0), ("1:1", 12.5), ("colocated", None)}
    colocated = next(c for c in runs if c["pd_split"] == "colocated")
    assert colocated["router"] == "round-robin" and not set(pd.PD_ONLY) & set(colocated)
    split = next(c for c in runs if c["pd_split"] == "1:1")
    assert "router" not in split  # (the P:D run's routers are prefill_router and decode_router)
    # a study that uses none of the new settings keeps its configs and run ids
    old = parse_spec(OLD).runs()
    assert sorted(run_id(c) for c in old) == OLD_IDS
    assert not any(k in c for c in old for k in (*pd.SETTINGS, "slo_ttft_s", "slo_tpot_s"))


def test_pool_settings_reach_each_pool_and_the_budget_counts_their_tp():
    text = (HEAD.replace('"llama-125m"', '"llama3-8b"') + 'gpus = 6\npd_split = "2:4"\nprefill_kv_cache_gb = 4.0\n'
            'prefill_max_num_batched_tokens = 4096\ndecode_max_num_seqs = 64\ndecode_num_gpu_blocks = 900\n')
    (config,) = parse_spec(text).runs()
    specs = pool_specs(config)
    # (a pool sizing its cache in GiB drops the run's block count, as simulate --prefill kv_cache_gb=... does)
    assert specs["prefill"].kv_cache_gb == 4.0 and specs["prefill"].num_gpu_blocks is None
    assert specs["prefill"].overrides["max_num_batched_tokens"] == 4096
    assert specs["decode"].overrides["max_num_seqs"] == 64 and specs["decode"].num_gpu_blocks == 900
    assert "max_num_seqs" not in specs["prefill"].overrides
    assert all(s.overrides["kv_connector"] == "nixl" for s in specs.values())
    assert pd.split_of(config) == pd.Split(6, prefill=2, decode=4)
    # a pool's tp counts in the budget: 2 prefill x tp 2 + 4 decode x tp 1 = 8 GPUs
    assert pd.split_of(dict(config, prefill_tp=2, gpus=8)) == pd.Split(8, prefill=2, decode=4)


BAD = [
    ('gpus = 8\npd_split = "3:4"\n', re.escape("uses 7 GPUs (3 prefill x tp 1 + 4 decode x tp 1), not the budget gpus = 8")),
    ('gpus = 8\npd_split = "0:8"\n', 'give "P:D"'),
    ('gpus = 8\npd_split = "half"\n', 'give "P:D"'),
    ('pd_split = "1:1"\n', "needs gpus"),
    ('gpus = 2\n', "GPU budget a pd_split shares"),
    ('gpus = 2\npd_split = "1:1"\nreplicas = 2\n', "leave replicas out"),
    ('gpus = 3\ntp = 2\npd_split = "colocated"\n', "not a whole number of replicas of tp 2"),
    ('gpus = 4\npd_split = "2:2"\nprefill_tp = 2\n', re.escape("uses 6 GPUs (2 prefill x tp 2 + 2 decode x tp 1)")),
    ('gpus = 2\npd_split = "1:1"\nkv_link_bandwidth = 0\n', "kv_link_bandwidth must be a positive number"),
    ('gpus = 2\npd_split = "1:1"\nkv_link_latency_us = -1\n', "kv_link_latency_us must be a finite number"),
    ('gpus = 2\npd_split = "1:1"\ngpus_per_node = 0\n', "gpus_per_node must be >= 1"),
    ('gpus = 4\npd_split = "1:1"\nprefill_tp = 2\ndecode_tp = 2\ngpus_per_node = 1\n', "does not fit a node"),
    ('gpus = 2\npd_split = "1:1"\ndecode_router = "random"\n', "decode_router = 'random' is not one of"),
    ('gpus = 2\npd_split = "1:1"\ndecode_max_num_seqs = 0\n', r"max_num_seqs must be >= 1.*the decode pool"),
    ('gpus = 2\npd_split = "1:1"\nn = 2\n', "one sequence per request"),
    ('gpus = 2\npd_split = "1:1"\nallocator = "max"\n', "paged KV blocks"),
    ('gpus = 2\npd_split = "1:1"\nslo_ttft_s = 0\n', "slo_ttft_s must be a positive"),
    ('gpus = 2\npd_split = "colocated"\nkv_link_bandwidth = 12.5\n', "kv_link_bandwidth is set, but no run"),
    ('gpus = 2\npd_split = "1:1"\nprefill_tp = "two"\n', "prefill_tp: expected int"),
    ('gpus = 2\npd_split = "1:1"\npolicy = "vllm-v0"\n', "needs the vllm-v1 step order"),
]


@pytest.mark.parametrize("body, message", BAD)
def test_bad_settings_are_refused_in_one_line(body, message):
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(HEAD + body)
    assert "\n" not in str(info.value)


def test_a_bad_split_in_a_grid_is_named_with_its_grid():
    with pytest.raises(SpecError, match=r"grid\[0\]: pd_split = '2-6'"):
        parse_spec(HEAD + 'gpus = 8\n[[grid]]\npd_split = ["1:7", "2-6"]\n')


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pd-study")
    spec = parse_spec(SPLITS + 'slo_ttft_s = [0.5]\nslo_tpot_s = [0.05]\n')
    outcome = run_study(spec, out, workers=2, progress=False)
    assert outcome.failed == 0
    return out


def test_a_tiny_study_runs_a_split_and_colocated_on_the_same_gpus(study_dir):
    study = load_study(study_dir)
    assert len(study.ok) == 3 and not study.failed
    for r in study.ok:
        s = r["summary"]
        assert s["gpus"] == 2 and s["requests_completed"] == 40
        assert s["slo"]["ttft_s"] == 0.5 and s["slo"]["tpot_s"] == 0.05
        assert metric(r, "goodput_rps_per_gpu") == pytest.approx(s["goodput_rps"] / 2, rel=1e-4)
        assert r["series"]["latency_quantiles"]["ttft_s"]
    split = [r for r in study.ok if r["config"]["pd_split"] == "1:1"]
    assert len(split) == 2
    for r in split:
        d = r["summary"]["disaggregated"]
        assert (d["prefill_replicas"], d["decode_replicas"], d["gpus"]) == (1, 1, 2)
        assert d["transfers"]["bytes"] > 0 and d["transfers"]["transfers"] == 40
        assert set(d["ttft_split_s"]) == {"prefill_queue", "prefill", "decode_queue", "transfer", "decode_first_token"}
        parts = sum(v["mean"] for v in d["ttft_split_s"].values())
        assert parts == pytest.approx(r["summary"]["ttft_s"]["mean"], rel=1e-3)
        assert "pool_summaries" not in d
    slow, fast = sorted(split, key=lambda r: r["config"]["kv_link_bandwidth"])
    transfer = [r["summary"]["disaggregated"]["ttft_split_s"]["transfer"]["mean"] for r in (slow, fast)]
    assert transfer[0] > transfer[1]  # 12.5 GB/s moves the same bytes slower than 450
    (colocated,) = [r for r in study.ok if r["config"]["pd_split"] == "colocated"]
    assert "disaggregated" not in colocated["summary"]
    assert colocated["summary"]["replicas"] and len(colocated["summary"]["replicas"]) == 2


def test_the_page_is_drawn_readable_with_a_verdict_per_bandwidth(study_dir, tmp_path):
    study = load_study(study_dir)
    assert [i for i, _, _ in split_grids(study)] == [0]
    pages = list(pd_pages(study))
    try:
        (page,) = pages
        assert page.title == TITLE
        assert {k: v for k, v in layout_problems(page.figure, page.title).items() if v} == {}
        page.figure.savefig(tmp_path / "page.png", dpi=40)
        rows = {(row[0], row[1]): row for row in page.table.rows}
        assert set(rows) == {("1:1", "450 GB/s"), ("1:1", "12.5 GB/s"), ("colocated", "-")}
        assert rows[("colocated", "-")][3] == "0.0%"
        assert len(page.notes) == 3 and all("colocated" in n for n in page.notes)
        assert page.notes[0].startswith("at 450 GB/s") and page.notes[1].startswith("at 12.5 GB/s")
        assert page.notes[2].startswith("from 450 GB/s to 12.5 GB/s the best split stays 1:1")
    finally:
        for p in pages:
            plt.close(p.figure)
    (found,) = pd_findings(study)
    assert found.head.startswith("P:D split (2 GPUs, splits 1:1, colocated; KV links 450 GB/s, 12.5 GB/s; "
                                 "goodput per GPU under TTFT <= 0.5 s and TPOT <= 50 ms")
    assert any(line.startswith("P:D split (2 GPUs") for line in findings(study))
    titles = build_report(study_dir, tmp_path / "report.pdf")
    assert TITLE in titles and (tmp_path / "report.pdf").stat().st_size > 0


def test_a_study_without_a_split_has_no_split_page(tmp_path):
    out = tmp_path / "plain"
    run_study(parse_spec(HEAD.replace("num_requests = 40", "num_requests = 10") + 'replicas = 2\n'), out, workers=1,
              progress=False)
    study = load_study(out)
    assert study.ok[0]["summary"]["goodput_rps_per_gpu"] is not None and study.ok[0]["summary"]["gpus"] == 2
    assert split_grids(study) == [] and list(pd_pages(study)) == []
    assert SplitSweep.of(study.ok).colocated is None


def _verdict(beats: int, tied=()) -> Verdict:
    return Verdict(12.5, "3:5", Estimate(0.33, None, 1), list(tied), Estimate(0.30, None, 1), beats)


@pytest.mark.parametrize("verdict, words", [
    (_verdict(1), "at 12.5 GB/s, split 3:5 wins: 0.330 requests/s per GPU, 10.0% higher than colocated "
                  "(0.300 requests/s per GPU)"),
    (_verdict(1, ["4:4"]), "at 12.5 GB/s, split 3:5 wins: 0.330 requests/s per GPU, 10.0% higher than colocated "
                           "(0.300 requests/s per GPU); 4:4 within noise of it"),
    (_verdict(0), "at 12.5 GB/s, the best split, 3:5 (0.330 requests/s per GPU), and colocated (0.300 requests/s per "
                  "GPU) are within noise of each other"),
    (Verdict(None, "1:7", Estimate(0.2, None, 1), [], Estimate(0.3, None, 1), -1),
     "at preset links, colocated wins (0.300 requests/s per GPU): the best split, 1:7, is 33.3% lower than "
     "colocated (0.200 requests/s per GPU)"),
])
def test_verdict_words(verdict, words):
    assert verdict.words() == words


def test_the_best_split_moves_only_beyond_noise():
    fast = Verdict(450.0, "2:6", Estimate(0.39, None, 1), ["4:4"], Estimate(0.39, None, 1), 0)
    slow = Verdict(12.5, "4:4", Estimate(0.389, None, 1), ["2:6"], Estimate(0.39, None, 1), 0)
    assert moves([fast, slow]) == ["from 450 GB/s to 12.5 GB/s the best split is 2:6, then 4:4, within noise of "
                                    "each other, the best goodput per GPU 0.26% lower, level with colocated at both"]
    moved = Verdict(12.5, "5:3", Estimate(0.3, None, 1), [], Estimate(0.39, None, 1), -1)
    assert moves([fast, moved])[0].startswith("from 450 GB/s to 12.5 GB/s the best split moves from 2:6 to 5:3")
    assert moves([fast, moved])[0].endswith("level with colocated at 450 GB/s and behind it at 12.5 GB/s")
