"""Client timeouts (``--request-timeout S``): a request still unfinished S seconds after it was sent
is aborted at the first step boundary at or after that instant, as vLLM V1 applies a client's
abort between steps; it counts as timed out (failed), out of every latency statistic.

Hand-computed timelines use ``LinearCost(per_step=1.0, per_token=0.25)`` (every time exact in
binary): a step computing 4 prompt tokens takes 2.0 s, one decode 1.25 s, 8 tokens 3.0 s. Blocks
hold 4 tokens. Then: a request that finishes in the step running at its deadline has timed out
too (its client had left) but is not aborted; skip-ahead changes no decision with timeouts
(a property test, and the command line with several replicas); the flag's bad values are one-line
errors; a study spec takes the setting; the engine aborts between steps on its clock.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Scheduler, make_config
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VllmV0Abort
from pagesim.engine.policy.memory.swap_pool import SwapSpaceExhausted
from pagesim.sim.metrics import COMPLETED, TIMED_OUT, admitted_rows
from pagesim.sim.simulator import SimOptions, Simulation
from tests.conftest import pure_python_only, scaled_examples
from tests.test_sim_timeline import LinearCost, paged, timeline, times, trace
from tests.test_skip_ahead import ContextCost, assert_same_results, configs, roofline, workloads

COST = LinearCost(per_step=1.0, per_token=0.25)


def simulate(tr, scheduler=None, **options):
    """(result, decision records) of one run with ``COST``."""
    records: list[str] = []
    sim = Simulation(tr, scheduler if scheduler is not None else paged(), COST, SimOptions(**options),
                     decision_sink=records.append)
    return sim.run(), [json.loads(line) for line in records]


def aborted_in(records: list[dict]) -> dict[int, list[str]]:
    """Step -> the requests its record lists as aborted before it."""
    return {r["step"]: r["aborted"] for r in records if "aborted" in r}


# ------------------------------------------------------------------------- hand-computed timelines
def test_a_timeout_mid_decode_aborts_at_the_next_step_boundary():
    # r0 (4 + 10 tokens) and r1 (4 + 2) arrive at 0, r2 (4 + 2) at 4.5; the timeout is 5 s.
    #   step 0 [0, 3.0):     prefill r0, r1 (8 tokens)          r0, r1 first tokens at 3.0
    #   step 1 [3.0, 4.5):   decode r0, r1                      r1 finishes at 4.5 (in time: 4.5 <= 5)
    #   step 2 [4.5, 6.75):  decode r0, prefill r2 (5 tokens)   r0's deadline 5.0 passes mid-step
    #   step 3 [6.75, 8.0):  r0 aborted at 6.75, before this schedule(); decode r2, which finishes
    #                        at 8.0 (its deadline is 9.5)
    result, records = simulate(trace([0.0, 0.0, 4.5], [4, 4, 4], [10, 2, 2]), request_timeout_s=5.0)
    assert timeline(result) == [(0.0, 3.0, 8, 2), (3.0, 1.5, 2, 2), (4.5, 2.25, 5, 2), (6.75, 1.25, 1, 1)]
    assert aborted_in(records) == {3: ["r0"]}
    assert list(records[3]["scheduled"]) == ["r2"] and records[3]["finished"] == ["r2"]

    m = result.requests
    assert m.status.tolist() == [TIMED_OUT, COMPLETED, COMPLETED]
    assert m.timeout_reasons == {0: "timeout after 5 s"}
    assert times(m.first_token_s) == [3.0, 3.0, 6.75]
    assert math.isnan(m.finish_s[0]) and times(m.finish_s[1:]) == [4.5, 8.0]
    assert m.output_tokens.tolist() == [3, 2, 2]  # r0 had three tokens (steps 0-2) when it was aborted

    # its blocks are freed before step 3: r0 held 2 blocks (6 tokens), r2 1 and then 2
    assert result.steps.array("allocated_slots").tolist() == [8, 16, 12, 8]
    assert records[3]["num_free_blocks"] == records[2]["num_free_blocks"] + 2 - 1
    assert "r0" not in records[3]["block_ids"]

    s = result.summary
    assert (s["requests_completed"], s["requests_rejected"], s["requests_timed_out"], s["requests_failed"]) == (2, 0, 1, 1)
    assert s["request_timeout_s"] == 5.0
    assert s["generated_tokens"] == 4 and s["timed_out_output_tokens"] == 3
    assert s["duration_s"] == pytest.approx(8.0) and s["throughput_rps"] == pytest.approx(2 / 8)
    assert s["throughput_tokens_s"] == pytest.approx(4 / 8)
    assert s["ttft_s"]["mean"] == pytest.approx((3.0 + 2.25) / 2)  # r1 and r2 only
    assert s["e2e_s"]["mean"] == pytest.approx((4.5 + 3.5) / 2)
    assert s["itl_s"]["mean"] == pytest.approx((1.5 + 1.25) / 2)  # one gap each
    assert s["slo"]["met"] <= 2 and s["steps"] == 4
    assert result.scheduler.num_aborted_requests == 1


def test_a_request_waiting_in_the_queue_times_out_unscheduled():
    # One request at a time (max_num_seqs 1): r0 (4 + 10) runs, r1 (4 + 2) waits; both time out at
    # 5.0. Steps [0, 2.0) prefill r0, then decodes [2, 3.25), [3.25, 4.5), [4.5, 5.75); at 5.75 both
    # are aborted and the replica idles. r2 arrives at 6.0: its first step's record lists the aborts.
    result, records = simulate(trace([0.0, 0.0, 6.0], [4, 4, 4], [10, 2, 1]), paged(max_num_seqs=1),
                               request_timeout_s=5.0)
    assert timeline(result) == [(0.0, 2.0, 4, 1), (2.0, 1.25, 1, 1), (3.25, 1.25, 1, 1), (4.5, 1.25, 1, 1),
                                (6.0, 2.0, 4, 1)]
    assert aborted_in(records) == {4: ["r0", "r1"]}  # (in deadline order, then row order)
    assert records[4]["new"] == {"r2": 0}
    m = result.requests
    assert m.status.tolist() == [TIMED_OUT, TIMED_OUT, COMPLETED]
    assert m.output_tokens.tolist() == [4, 0, 1]
    assert np.isnan(m.first_scheduled_s[1]) and np.isnan(m.first_token_s[1])  # never scheduled
    assert not any("r1" in r["scheduled"] for r in records)
    assert admitted_rows(m).tolist() == [True, False, True]
    s = result.summary
    assert (s["requests_completed"], s["requests_timed_out"], s["timed_out_output_tokens"]) == (1, 2, 4)
    assert s["ttft_s"]["mean"] == pytest.approx(2.0) and s["queueing_s"]["p99"] == pytest.approx(0.0)


@pytest.mark.parametrize("timeout_s, status", [(4.5, COMPLETED), (4.25, TIMED_OUT)])
def test_finishing_after_the_deadline_is_a_timeout_but_no_abort(timeout_s, status):
    # One request, 4 + 3 tokens: [0, 2.0), [2.0, 3.25), [3.25, 4.5). It finishes at 4.5: in time for a
    # 4.5 s timeout; for 4.25 s its client had left (a failure), though the server finished it.
    result, records = simulate(trace([0.0], [4], [3]), request_timeout_s=timeout_s)
    assert timeline(result) == [(0.0, 2.0, 4, 1), (2.0, 1.25, 1, 1), (3.25, 1.25, 1, 1)]
    assert aborted_in(records) == {} and records[-1]["finished"] == ["r0"]
    m = result.requests
    assert m.status.tolist() == [status] and times(m.finish_s) == [4.5] and m.output_tokens.tolist() == [3]
    s = result.summary
    assert s["requests_timed_out"] == (status == TIMED_OUT) and s["requests_completed"] == (status == COMPLETED)
    assert s["generated_tokens"] == (3 if status == COMPLETED else 0)
    assert s["ttft_s"]["mean"] == (pytest.approx(2.0) if status == COMPLETED else None)


def test_no_timeout_changes_nothing_and_writes_no_aborted_key():
    tr = trace([0.0, 0.0, 4.5], [4, 4, 4], [10, 2, 2])
    result, records = simulate(tr)
    assert aborted_in(records) == {} and all("aborted" not in r for r in records)
    s = result.summary
    assert (s["requests_timed_out"], s["requests_failed"], s["request_timeout_s"], s["timed_out_output_tokens"]) == (
        0, 0, None, 0)
    long_enough, _ = simulate(tr, request_timeout_s=1000.0)
    assert timeline(long_enough) == timeline(result)
    assert {k: v for k, v in long_enough.summary.items() if k != "request_timeout_s"} == {
        k: v for k, v in s.items() if k != "request_timeout_s"}


def test_a_closed_loop_client_sends_the_next_request_when_one_times_out():
    # At most one in flight: r0 (4 + 10) runs; r1 (4 + 2) is due at 0 but sent only when r0 is
    # aborted at 5.75 (its deadline 5.0 passed mid-step); r1 then runs [5.75, 7.75), [7.75, 9.0).
    result, records = simulate(trace([0.0, 0.0], [4, 4], [10, 2]), request_timeout_s=5.0, max_concurrency=1)
    assert timeline(result) == [(0.0, 2.0, 4, 1), (2.0, 1.25, 1, 1), (3.25, 1.25, 1, 1), (4.5, 1.25, 1, 1),
                                (5.75, 2.0, 4, 1), (7.75, 1.25, 1, 1)]
    assert aborted_in(records) == {4: ["r0"]}
    m = result.requests
    assert m.status.tolist() == [TIMED_OUT, COMPLETED] and times(m.arrival_s) == [0.0, 5.75]
    assert result.summary["e2e_s"]["mean"] == pytest.approx(9.0 - 5.75)


def test_the_contiguous_baseline_aborts_alike():
    from pagesim.engine.policy import ContiguousScheduler

    config = make_config("pagesim", num_gpu_blocks=32, block_size=4, enable_prefix_caching=False,
                         record_decisions=True)
    result, records = simulate(trace([0.0, 0.0, 4.5], [4, 4, 4], [10, 2, 2]),
                               ContiguousScheduler(config, reservation="oracle"), request_timeout_s=5.0)
    # (oracle slabs: the three fit at once, so the paged timeline above holds)
    assert timeline(result) == [(0.0, 3.0, 8, 2), (3.0, 1.5, 2, 2), (4.5, 2.25, 5, 2), (6.75, 1.25, 1, 1)]
    assert aborted_in(records) == {3: ["r0"]}
    assert result.requests.status.tolist() == [TIMED_OUT, COMPLETED, COMPLETED]
    result.scheduler.check()


def test_the_scheduler_refuses_to_abort_what_it_does_not_hold():
    s = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=12, max_model_len=256))
    with pytest.raises(ValueError, match="cannot abort request 'x': it is not unfinished"):
        s.abort_request("x")


# --------------------------------------------------------------------------- skip-ahead on and off
def run(tr, preset: str, settings_: dict, cost_model, *, skip_ahead: bool, timeout_s: float,
        record: bool = True):
    """(result or the error it stopped with, decision log lines, token runs, steps skipped)."""
    config = make_config(preset, **settings_, record_decisions=record)
    lines: list[str] = []
    sim = Simulation(tr, Scheduler(config), cost_model, SimOptions(skip_ahead=skip_ahead, seed=3,
                                                                   request_timeout_s=timeout_s),
                     decision_sink=lines.append)
    try:
        result = sim.run()
    except (SwapSpaceExhausted, VllmV0Abort) as exc:
        result = exc
    runs = sim.replica.token_runs.runs(sim.replica.index, np.arange(len(tr))).tolist()
    return result, lines, runs, sim.replica.steps_skipped


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_timeouts_change_no_decision_with_skip_ahead(data):
    """With random timeouts, skip-ahead on (recording decisions, and not: the bulk paths) and off
    give the same decision log, token runs, request and step tables and summary."""
    tr = data.draw(workloads())
    preset, settings_ = data.draw(configs(tr))
    cost = data.draw(st.sampled_from([roofline, ContextCost]))
    # (these runs last about 0.05-2 s: timeouts that cut into most of them, and some that do not)
    timeout_s = data.draw(st.floats(0.005, 0.5) | st.sampled_from([0.02, 0.05, 0.1, 0.2, 3.0]))
    plain, plain_log, plain_runs, none_skipped = run(tr, preset, settings_, cost(), skip_ahead=False,
                                                     timeout_s=timeout_s)
    fast, fast_log, fast_runs, skipped = run(tr, preset, settings_, cost(), skip_ahead=True, timeout_s=timeout_s)
    assert none_skipped == 0
    for i, (a, b) in enumerate(zip(plain_log, fast_log)):
        assert a == b, f"decision record {i} differs:\n{a}\n{b}"
    assert len(plain_log) == len(fast_log)
    assert fast_runs == plain_runs, "the requests got their tokens in other steps"
    quiet, _, quiet_runs, _ = run(tr, preset, settings_, cost(), skip_ahead=True, timeout_s=timeout_s, record=False)
    assert quiet_runs == plain_runs, "the requests got their tokens in other steps (bulk paths)"
    assert_same_results(plain, fast)
    assert_same_results(plain, quiet)
    if not isinstance(plain, Exception):
        assert plain.requests.timeout_reasons == fast.requests.timeout_reasons == quiet.requests.timeout_reasons
        for result in (plain, fast, quiet):  # every abort gave its blocks back
            result.scheduler.check()
            assert result.scheduler.pool.num_used_blocks == 0 and result.scheduler.swap_pool.num_free_blocks == \
                result.scheduler.swap_pool.num_blocks
        timed_out = plain.summary["requests_timed_out"]
        event("some timed out" if timed_out else "none timed out")
        event("aborted" if any('"aborted"' in line for line in plain_log) else "nothing aborted")
    event("skipped steps" if skipped else "no step skipped")


def test_the_property_test_sees_aborts_during_skips():
    """A decode-heavy batch whose deadline falls inside a stretch skip-ahead would pass over: the
    skip stops before it, and the two runs agree."""
    tr = trace([0.0] * 6 + [0.95], [8] * 7, [200] * 6 + [20])  # (r6 arrives just before the others time out)
    settings_ = dict(block_size=4, num_gpu_blocks=600, max_model_len=512)
    plain, plain_log, plain_runs, _ = run(tr, "pagesim", settings_, roofline(), skip_ahead=False, timeout_s=1.0)
    fast, fast_log, fast_runs, skipped = run(tr, "pagesim", settings_, roofline(), skip_ahead=True, timeout_s=1.0)
    assert skipped > 0 and plain_log == fast_log and plain_runs == fast_runs
    assert any('"aborted"' in line for line in fast_log)
    assert_same_results(plain, fast)
    assert plain.summary["requests_timed_out"] == 6 and plain.summary["requests_completed"] == 1


@pure_python_only("pagesim.sim.replica", "the test spies on the fast path's calls")
def test_the_step_after_an_abort_may_be_a_decode_step(monkeypatch):
    """r0 and r1 decode (max_num_seqs 2) while r2 waits; r0 times out, and the next step decodes r1
    and admits r2: with skip-ahead a ``DecodeStep``, whose record lists the abort as
    ``schedule()``'s does."""
    import pagesim.sim.replica
    from pagesim.engine.policy.fast_path import fast_forward

    calls = []

    def spy(run_):
        calls.append(bool(run_.scheduler._pending_aborts))
        return fast_forward.schedule_decode_step(run_)

    monkeypatch.setattr(pagesim.sim.replica, "schedule_decode_step", spy)
    tr = trace([0.0, 0.5, 0.6], [8] * 3, [200, 200, 20])
    settings_ = dict(block_size=4, num_gpu_blocks=600, max_model_len=512, max_num_seqs=2)
    plain, plain_log, plain_runs, _ = run(tr, "pagesim", settings_, roofline(), skip_ahead=False, timeout_s=1.0)
    fast, fast_log, fast_runs, _ = run(tr, "pagesim", settings_, roofline(), skip_ahead=True, timeout_s=1.0)
    assert plain_log == fast_log and plain_runs == fast_runs
    assert_same_results(plain, fast)
    assert calls.count(True) == 1  # (the step after the abort)
    (record,) = [json.loads(line) for line in fast_log if '"aborted"' in line]
    assert record["aborted"] == ["r0"] and record["new"] == {"r2": 0}


def test_skipping_past_a_deadline_is_caught(monkeypatch):
    """The comparison has teeth: a skip bounded by the next arrival only runs past the deadline,
    and the abort lands steps late."""
    from pagesim.sim.replica import Replica

    monkeypatch.setattr(Replica, "_next_event_s",  # (deadlines ignored)
                        lambda self, arrivals=True: self.next_arrival_s if arrivals else math.inf)
    tr = trace([0.0] * 6 + [0.95], [8] * 7, [200] * 6 + [20])
    settings_ = dict(block_size=4, num_gpu_blocks=600, max_model_len=512)
    _, plain_log, _, _ = run(tr, "pagesim", settings_, roofline(), skip_ahead=False, timeout_s=1.0)
    _, fast_log, _, _ = run(tr, "pagesim", settings_, roofline(), skip_ahead=True, timeout_s=1.0)
    assert plain_log != fast_log


@pytest.mark.parametrize("extra", [[], ["--replicas", "3", "--router", "least-kv"]])
def test_cli_summary_with_a_timeout_is_the_same_without_skip_ahead(capsys, extra):
    from tests.test_skip_ahead_hybrid import summaries_with_and_without_skip_ahead

    summaries = summaries_with_and_without_skip_ahead(
        capsys, ["simulate", "--workload", "kwon2023-sharegpt", "--rate", "8", "--num-requests", "60", "--json",
                 "--no-progress", "--request-timeout", "3", *extra])
    assert summaries[0] == summaries[1]
    assert 0 < summaries[0]["requests_timed_out"] < 60 and summaries[0]["request_timeout_s"] == 3.0


# --------------------------------------------------------------------------------- command line
@pytest.mark.parametrize("value, words", [("-1", "positive, finite number of seconds, got -1.0"),
                                          ("0", "got 0.0"), ("inf", "got inf"), ("nan", "got nan"),
                                          ("soon", "takes a number of seconds, got 'soon'")])
def test_bad_timeouts_are_one_line_errors(capsys, value, words):
    from pagesim.engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--num-requests", "5", "--no-progress", "--request-timeout", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pagesim simulate: error: --request-timeout ") and words in err


def test_the_command_refuses_a_negative_timeout():
    done = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "simulate", "--request-timeout", "-1",
                           "--num-requests", "5", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("pagesim simulate: error: --request-timeout must be a positive, finite number of seconds, "
                           "got -1.0\n")


def test_the_summary_says_how_many_timed_out(tmp_path, capsys):
    from pagesim.engine.cli import main

    out = tmp_path / "out"
    assert main(["simulate", "--workload", "kwon2023-sharegpt", "--rate", "8", "--num-requests", "40",
                 "--no-progress", "--request-timeout", "2.5", "--out", str(out), "--save-result",
                 "--result-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    n = summary["requests_timed_out"]
    assert n > 0 and f"{n:,} timed out after 2.5 s, over " in text
    rows = (out / "requests.csv").read_text().splitlines()
    assert sum(",timed_out," in row and row.endswith(",timeout after 2.5 s") for row in rows) == n
    assert sum('"aborted"' in line for line in (out / "decisions.jsonl").read_text().splitlines()) >= 1
    (result_file,) = tmp_path.glob("*.json")
    bench = json.loads(result_file.read_text())
    assert bench["completed"] == summary["requests_completed"] and bench["failed"] == n
    assert bench["errors"].count("timed out: timeout after 2.5 s") == n
    assert bench["pagesim"]["timed_out"] == {"count": n, "timeout_s": 2.5}


# ------------------------------------------------------------------------------------ study spec
SPEC = """
name = "timeouts"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 20
[base]
kv_cache_gb = 1.0
request_timeout_s = 30
[[grid]]
request_timeout_s = [1.5, 30]
"""


def test_a_study_spec_takes_the_timeout_as_a_setting_and_an_axis():
    from pagesim.reports.run_config import run_id
    from pagesim.reports.spec import SpecError, parse_spec

    spec = parse_spec(SPEC)
    assert sorted(c["request_timeout_s"] for c in spec.runs()) == [1.5, 30.0]
    # inference-perf's name is the same setting
    assert run_id(parse_spec(SPEC.replace("request_timeout_s = 30\n", "request_timeout = 30\n")).runs()[0]) == \
        run_id(spec.runs()[0])
    # a study without it keeps its run ids (absent = no timeout)
    without = parse_spec(SPEC.split("request_timeout_s = 30")[0])
    assert "request_timeout_s" not in without.runs()[0]
    with pytest.raises(SpecError, match="request_timeout_s must be a positive, finite number of seconds"):
        parse_spec(SPEC.replace("[1.5, 30]", "[0, 30]"))
    with pytest.raises(SpecError, match=r"request_timeout_s: expected float"):
        parse_spec(SPEC.replace("[1.5, 30]", '["soon"]'))


def test_a_study_run_applies_its_timeout():
    from pagesim.reports.runner import run_one
    from pagesim.reports.spec import parse_spec

    results = {c["request_timeout_s"]: run_one(c) for c in parse_spec(SPEC).runs()}
    short, long = results[1.5]["summary"], results[30.0]["summary"]
    assert short["request_timeout_s"] == 1.5 and short["requests_timed_out"] > 0
    assert long["requests_timed_out"] == 0 and long["requests_completed"] == 20


# ------------------------------------------------------------------------------------------ engine
def test_the_engine_aborts_between_steps_on_its_clock():
    """The engine's clock made to advance 1 s per step (steps take no time): r0 (5 + 10 tokens),
    sent at 0, times out at 2.5 and is aborted before step 3; r1, released at step 2 (at 2.0),
    finishes in step 3, in time. Validation mode poisons r0's freed blocks: r1's tokens still match
    the reference."""
    pytest.importorskip("torch")
    import copy

    from pagesim.engine.runtime.reference import check_outputs
    from tests.engine_support import make_engine, prompt_of, request

    engine = make_engine(block_size=4, num_gpu_blocks=32, record_decisions=True)
    clock = [0.0]
    engine._clock = lambda: clock[0]
    step = engine.step

    def timed_step():
        finished = step()
        clock[0] += 1.0
        return finished

    engine.step = timed_step
    requests = [request("r0", prompt_of(0, 5), 10), request("r1", prompt_of(1, 5), 2)]
    engine.run_lockstep(copy.deepcopy(requests), {"r1": 2}, request_timeout_s=2.5)
    r0, r1 = engine.records["r0"], engine.records["r1"]
    assert (r0.status, r0.timeout_reason, r0.output_tokens) == ("timed_out", "timeout after 2.5 s", 3)
    assert r1.status == "completed" and r1.finish_s == 3.0
    log = engine.scheduler.decision_log
    assert [r.get("aborted") for r in log] == [None, None, None, ["r0"]]
    assert engine.scheduler.pool.num_used_blocks == 0
    report = check_outputs(engine.model, requests[1:], {"r1": r1.outputs}, lambda r: engine.sampling)
    assert report.match
