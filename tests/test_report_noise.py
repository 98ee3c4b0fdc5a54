"""The noise rule: a "best" only where a difference exceeds what changing the seed changes."""

from __future__ import annotations

import math

import pytest

from pagesim.reports.execute import run_study
from pagesim.reports.findings import axis_findings, best_settings, findings
from pagesim.reports.noise import Estimate, compare, estimate, t95
from pagesim.reports.results import load_study, settings
from pagesim.reports.spec import SpecError, parse_spec

BASE = """
name = "noise"
[source]
workload = "shared-system-prompt"
rate = 5.0
num_requests = 60
[base]
kv_cache_gb = 1.0
seed = [0, 1, 2]
"""

NOOP_SCHEDULER = """
from pagesim.engine.policy.scheduling.scheduler import Scheduler


class SameAsDefault(Scheduler):
    name = "same-as-default"
"""


def test_estimate_is_the_mean_with_a_student_t_interval():
    est = estimate([1.0, 2.0, 3.0])
    assert est.mean == 2.0 and est.n == 3
    assert est.half_width == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert estimate([5.0]) == Estimate(5.0, None, 1)
    assert estimate([]) is None and estimate([None, float("nan")]) is None
    assert t95(1) == 12.706 and t95(30) == 2.042 and t95(500) == 1.96
    with pytest.raises(ValueError):
        t95(0)


def test_compare_uses_intervals_with_seeds_and_the_threshold_without():
    a, b = Estimate(100.0, 1.0, 3), Estimate(103.0, 1.0, 3)
    assert compare(b, a) == 1 and compare(a, b) == -1  # intervals [99, 101] and [102, 104] separate
    assert compare(Estimate(100.0, 2.0, 3), Estimate(103.0, 2.0, 3)) == 0  # [98, 102] and [101, 105] overlap
    one, other = Estimate(100.0, None, 1), Estimate(101.5, None, 1)
    assert compare(one, other, threshold=0.02) == 0 and compare(one, other, threshold=0.01) == -1
    # rates in points: 0.1% vs 0.2% is a doubling of nothing
    assert compare(Estimate(0.001, None, 1), Estimate(0.002, None, 1), fraction=True) == 0
    assert compare(one, one) == 0


def test_seed_list_repeats_every_grid_and_draws_different_requests():
    spec = parse_spec(BASE + "[[grid]]\nblock_size = [8, 16]\n[[grid]]\nblock_size = [16, 32]\n")
    runs = spec.runs()
    assert sorted({c["seed"] for c in runs}) == [0, 1, 2]
    assert len(runs) == 2 * 3 + 2 * 3 - 3  # block size 16 is in both grids
    with pytest.raises(SpecError, match="lists a seed twice"):
        parse_spec(BASE.replace("seed = [0, 1, 2]", "seed = [0, 0]"))


def _run(tmp_path, text):
    run_study(parse_spec(text, allow_plugins=True), tmp_path, workers=2, progress=False)
    study = load_study(tmp_path)
    assert not study.failed, [r["error"] for r in study.failed]
    return study


def test_identical_settings_under_two_names_never_have_a_best(tmp_path):
    plugin = tmp_path / "same.py"
    plugin.write_text(NOOP_SCHEDULER)
    text = f'plugins = ["{plugin}:SameAsDefault"]\n' + BASE + '[[grid]]\nscheduler = ["default", "same-as-default"]\n'
    study = _run(tmp_path / "study", text)
    assert study.seeded and len(settings(study.ok)) == 2
    seeds = {r["config"]["seed"]: r["summary"]["throughput_tokens_s"] for r in study.ok}
    assert len(set(seeds.values())) > 1, "the seeds must draw different workloads"
    for row in best_settings(study):
        assert row["verdict"].startswith("no measurable difference"), row
    lines = axis_findings(study)
    assert len(lines) == 1 and "best" not in lines[0] and "no measurable difference in throughput" in lines[0]
    assert "95% intervals separate" in findings(study)[-1]


def test_a_difference_larger_than_the_seed_spread_is_called(tmp_path):
    study = _run(tmp_path, BASE + '[[grid]]\nkv_cache_gb = [0.5, 4.0]\n')
    (line,) = axis_findings(study)
    assert line.startswith("KV cache size (0.5 GiB, 4 GiB; 6 runs")
    assert "TTFT p99 best at 4 GiB" in line and "throughput best at 4 GiB" in line


def test_seeds_that_change_nothing_and_one_sided_seeds_fall_back_to_the_threshold():
    flat_a, flat_b = Estimate(100.0, 0.0, 3), Estimate(100.5, 0.0, 3)  # e.g. a trace at its own timestamps
    assert compare(flat_a, flat_b) == 0 and compare(flat_a, Estimate(110.0, 0.0, 3)) == -1
    seeded, single = Estimate(1000.0, 745.0, 3), Estimate(1050.0, None, 1)
    assert compare(single, seeded) == 0  # inside the seeded interval: no claim, whatever the threshold says
    assert compare(Estimate(2000.0, None, 1), seeded) == 1


def test_gaps_are_relative_to_the_value_compared_with():
    from pagesim.reports.claims import compared
    from pagesim.reports.results import M

    thr = M["throughput_tokens_s"]
    assert compared(thr, 1270.0, 507.5, "the next") == "2.5x the next"
    assert compared(thr, 110.0, 100.0, "the next") == "10.0% higher than the next"
    assert compared(thr, 90.0, 100.0, "the best") == "10.0% lower than the best"
    assert compared(M["preemptions_total"], 105.0, 0.0, "the next") == "105 against 0 for the next"
    assert compared(M["preemptions_total"], 0.0, 12.0, "the next") == "100.0% lower than the next"  # (never "0x")
    assert compared(M["prefix_hit_rate"], 0.824, 0.764, "the next") == "6 points higher than the next"
    assert compared(thr, 1270.0, 507.5) == "2.5x" and compared(thr, 90.0, 100.0) == "10.0% lower"


def test_a_run_without_preemption_counts_has_none_not_zero():
    from pagesim.reports.results import metric

    assert metric({"summary": {}}, "preemptions_total") is None
    assert metric({"summary": {"preemptions": {}}}, "preemptions_total") == 0.0
    assert metric({"summary": {"preemptions": {"swap": 2, "recompute": 3}}}, "preemptions_total") == 5.0


def test_a_base_value_no_run_has_is_replaced_by_the_runs_value(tmp_path):
    """A grid of rates none of which is the source's: pages and findings still find their runs."""
    study = _run(tmp_path, BASE.replace("seed = [0, 1, 2]\n", "") + "[[grid]]\nrate = [3.0, 6.0]\nblock_size = [8, 16]\n")
    assert study.anchor() == {"rate": 3.0}
    assert len(study.slice("block_size")) == 2
    (line,) = axis_findings(study)
    assert line.startswith("Block size (8, 16; 2 runs at 3 requests/s")


def test_seeds_that_change_nothing_are_named_and_judged_by_the_threshold(tmp_path):
    """A trace rescaled to a rate draws nothing from the seed: the findings say so."""
    from pagesim.reports.findings import noise_rule

    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i // 10:02d}.{(i % 10) * 100000:06d},{200 + 37 * i % 300},{20 + 11 * i % 60}\n"
        for i in range(40)))
    text = (f'name = "t"\n[source]\ntrace = "{trace}"\nrate = 4.0\n[base]\nkv_cache_gb = 1.0\nseed = [0, 1]\n'
            "[[grid]]\nblock_size = [8, 16]\n")
    study = _run(tmp_path / "s", text)
    assert study.seeded and noise_rule(study).startswith("the threshold, as the seeds changed nothing")
    assert findings(study)[-1].startswith("Differences judged with the threshold, as the seeds changed nothing")
