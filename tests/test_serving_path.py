"""The serving path around the forward pass (pagesim/sim/serving_path.py), on timelines added up by hand.

``LinearCost`` (test_sim_timeline) charges 1.0 s per step plus 0.1 s per computed token: a
4-token prefill takes 1.4 s, a decode of n sequences 1.0 + 0.1 n s. The frontend terms used here
are round numbers (0.25 s in, 0.125 s out) so that every sum is exact.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pagesim.sim.serving_path import SERVING_PATHS, ServingPath, roofline_overrides, serving_path, serving_path_from_args
from tests.conftest import scaled_examples
from tests.test_sim_timeline import LinearCost, paged, r9, simulate, timeline, times, trace

FRONT = ServingPath("test", async_scheduling=False, frontend_in_s=0.25, frontend_out_s=0.125)
ASYNC = ServingPath("test-async", async_scheduling=True)


def test_frontend_terms_shift_the_clients_clock_only():
    # One request on an idle server: prompt 4, 3 tokens. The engine's steps are those of the plain
    # path (1.4, 1.1, 1.1 s from 0); the client sees the first token 0.25 + 1.4 + 0.125 s after it
    # sent the request, and the last 0.25 + 3.6 + 0.125 s after.
    plain, plain_log = simulate(trace([0.0], [4], [3]))
    result, log = simulate(trace([0.0], [4], [3]), serving_path=FRONT)
    assert timeline(result) == timeline(plain) == [(0.0, 1.4, 4, 1), (1.4, 1.1, 1, 1), (2.5, 1.1, 1, 1)]
    assert log == plain_log  # decisions unchanged
    m = result.requests
    assert times(m.ttft_s()) == [r9(0.25 + 1.4 + 0.125)]
    assert times(m.e2e_s()) == [r9(0.25 + 3.6 + 0.125)]
    assert times(m.first_scheduled_s) == [0.25]  # it reached the engine 0.25 s after it was sent
    assert times(m.tpot_s()) == times(plain.requests.tpot_s())  # the offsets cancel between tokens
    assert result.summary["ttft_s"]["mean"] == pytest.approx(1.775)


def test_async_scheduling_idle_engine_schedules_at_once():
    # Nothing runs when the request arrives: vLLM's engine core schedules it straight away.
    plain, _ = simulate(trace([0.5], [4], [2]))
    result, _ = simulate(trace([0.5], [4], [2]), serving_path=ASYNC)
    assert timeline(result) == timeline(plain) == [(0.5, 1.4, 4, 1), (1.9, 1.1, 1, 1)]


def test_async_scheduling_a_request_reaching_a_busy_engine_joins_one_step_later():
    # A (prompt 4, 4 tokens) arrives at 0 and runs alone: prefill [0, 1.4], decodes of 1.1 s.
    # B (prompt 4, 1 token) arrives at 0.5, during A's prefill.
    # Synchronous: B joins the next step, [1.4, 2.9] (A's decode + B's 4-token prefill: 1 + 0.5).
    # Asynchronous: the step after A's prefill was scheduled at t = 0, before B arrived; B joins
    # the one after it: A decodes alone [1.4, 2.5], then A + B [2.5, 4.0].
    sync, sync_log = simulate(trace([0.0, 0.5], [4, 4], [4, 1]))
    assert timeline(sync)[:2] == [(0.0, 1.4, 4, 1), (1.4, 1.5, 5, 2)]
    result, log = simulate(trace([0.0, 0.5], [4, 4], [4, 1]), serving_path=ASYNC)
    assert timeline(result)[:3] == [(0.0, 1.4, 4, 1), (1.4, 1.1, 1, 1), (2.5, 1.5, 5, 2)]
    m = result.requests
    assert times(m.ttft_s()) == [1.4, r9(4.0 - 0.5)]
    assert times(sync.requests.ttft_s()) == [1.4, r9(2.9 - 0.5)]
    # the scheduler decided the same things, one step later for B: the same admissions, in order
    admitted = [[rid for rid in rec.get("new", {})] for rec in log]
    assert [a for a in admitted if a] == [a for a in ([list(rec.get("new", {})) for rec in sync_log]) if a]


def test_async_scheduling_arrivals_during_the_last_running_step_join_at_once_when_it_ends():
    # A (prompt 4, 1 token) runs [0, 1.4] and finishes; B arrives at 0.5. The batch queued behind
    # A's step was empty, so the engine schedules B as soon as A's step ends: [1.4, 2.8].
    result, _ = simulate(trace([0.0, 0.5], [4, 4], [1, 1]), serving_path=ASYNC)
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.4, 4, 1)]


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(40), deadline=None)
@given(arrivals=st.lists(st.floats(0.0, 20.0, allow_nan=False), min_size=1, max_size=8),
       outputs=st.lists(st.integers(1, 12), min_size=8, max_size=8),
       prompts=st.lists(st.integers(1, 12), min_size=8, max_size=8),
       timeout=st.one_of(st.none(), st.floats(2.0, 30.0)))
def test_async_scheduling_changes_no_decision_with_or_without_skip_ahead(arrivals, outputs, prompts, timeout):
    # Skip-ahead passes over pure decode stretches; held-back requests must stop it exactly where
    # the step-by-step loop would let them in.
    arrivals = sorted(arrivals)
    n = len(arrivals)
    tr = trace(arrivals, prompts[:n], outputs[:n])
    path = ServingPath("t", async_scheduling=True, frontend_in_s=0.01, frontend_out_s=0.02)
    fast, fast_log = simulate(tr, serving_path=path, request_timeout_s=timeout)
    slow, slow_log = simulate(tr, serving_path=path, skip_ahead=False, request_timeout_s=timeout)
    assert fast_log == slow_log
    assert timeline(fast) == timeline(slow)
    assert list(fast.requests.status) == list(slow.requests.status)
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert np.array_equal(np.round(getattr(fast.requests, column), 9), np.round(getattr(slow.requests, column), 9),
                              equal_nan=True), column  # (NaN: never scheduled, or aborted before its first token)


def test_named_paths_and_the_cli_default():
    assert serving_path("vllm").async_scheduling and serving_path("vllm").client_offset_s > 0
    assert serving_path("vllm", async_scheduling=False).async_scheduling is False
    assert SERVING_PATHS["none"] == ServingPath("none", async_scheduling=False)
    with pytest.raises(ValueError, match="unknown serving path 'x'"):
        serving_path("x")
    with pytest.raises(ValueError, match="frontend_in_s must be a finite number"):
        ServingPath("bad", False, frontend_in_s=-1.0)

    class Args:
        serving_path = None
        async_scheduling = None
        frontend_latency_ms = None

    assert serving_path_from_args(Args(), "vllm-v1") == SERVING_PATHS["vllm"]
    assert serving_path_from_args(Args(), "pagesim") is None  # the plain path
    Args.async_scheduling = True
    assert serving_path_from_args(Args(), "pagesim") == ServingPath("none", async_scheduling=True)
    Args.frontend_latency_ms = [5.0, 0.5]  # a gateway in front of the server
    assert serving_path_from_args(Args(), "vllm-v1") == ServingPath("vllm", True, 5e-3, 5e-4)
    Args.frontend_latency_ms = [-1.0, 0.0]
    with pytest.raises(ValueError, match="--frontend-latency-ms takes two finite numbers"):
        serving_path_from_args(Args(), "vllm-v1")
    # asynchronous scheduling hides the scheduler's per-request CPU work, not the per-step time
    assert roofline_overrides(SERVING_PATHS["vllm"]) == {"scheduler_overlap": 1.0}
    assert roofline_overrides(None) == {}


def test_simulate_cli_states_the_path(tmp_path, capsys):
    from pagesim.engine.cli import main

    out = tmp_path / "o"
    assert main(["simulate", "--workload", "shared-system-prompt", "--num-requests", "20", "--rate", "4",
                 "--policy", "vllm-v1", "--no-progress", "--out", str(out)]) == 0
    info = json.loads((out / "run_info.json").read_text())
    assert info["options"]["serving_path"]["name"] == "vllm"
    assert info["options"]["serving_path"]["async_scheduling"] is True
    capsys.readouterr()
    assert main(["simulate", "--workload", "shared-system-prompt", "--num-requests", "20", "--rate", "4",
                 "--no-progress", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--workload", "shared-system-prompt", "--num-requests", "20", "--rate", "4",
                 "--no-progress", "--json", "--serving-path", "vllm", "--no-async-scheduling"]) == 0
    shifted = json.loads(capsys.readouterr().out)
    # no async lag: the same engine, every latency 3 ms later (2 ms in + 1 ms out)
    assert shifted["ttft_s"]["mean"] == pytest.approx(plain["ttft_s"]["mean"] + 3e-3, abs=1e-6)
    assert np.isclose(shifted["tpot_s"]["mean"], plain["tpot_s"]["mean"])


def test_a_closed_loop_client_sends_its_next_request_when_the_response_reaches_it():
    # max_concurrency 1: B is due at 0 but sent when A's last token reaches the client, the
    # frontend's 0.375 s after A's last step ends (3.6): so at 3.975, never two in flight.
    result, _ = simulate(trace([0.0, 0.0], [4, 4], [3, 3]), serving_path=FRONT, max_concurrency=1)
    m = result.requests
    assert times(m.finish_s)[0] == r9(3.6 + 0.375)
    assert times(m.arrival_s) == [0.0, r9(3.6 + 0.375)]
    assert result.summary["max_concurrent_requests"] == 1
    assert times(m.ttft_s()) == [r9(0.25 + 1.4 + 0.125)] * 2  # each alone on an idle engine
