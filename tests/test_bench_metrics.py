"""vLLM bench's figures as pagesim computes them: ITL from token runs, the metric definitions of
``pagesim.sim.bench_metrics``, rejected requests in the summary, and the ``--save-result`` file.

- ITL (``pagesim.sim.token_runs``): a request alone in the simulator has one gap per token after the
  first, each a step's duration, and their mean is its TPOT; on generated workloads with
  preemptions (swap and recompute), vLLM v0's prompt-only steps, chunked prefill and parallel
  samples, every completed request's gaps add up to its last token minus its first, a one-sample
  request has exactly output - 1 of them, and the summary's ``itl_s`` is NumPy's statistics of
  the flattened per-request lists.
- ``pagesim.sim.bench_metrics`` against NumPy and against vLLM 0.33's own per-second rules, written out
  here as vLLM writes them.
- Rejected requests are failed requests: they count in ``failed``, miss every SLO (the SLO share
  is over every request submitted) and are announced.
- The result file has every key of a vLLM 0.33 result file (a fixture written by hand in vLLM's
  format) with the same JSON types, in vLLM's units.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.cli import main
from pagesim.engine.policy import Scheduler, make_config
from pagesim.sim.bench_result import PerRequest, bench_result
from pagesim.sim import bench_metrics
from pagesim.sim.bench_metrics import Slo, latency_stats, peak_in_flight, percentile_key, weighted_percentile
from pagesim.sim.bench_output import per_request
from pagesim.sim.cluster import Cluster
from pagesim.sim.metrics import COMPLETED
from pagesim.sim.router import make_router
from pagesim.sim.simulator import SimOptions, Simulation
from pagesim.sim.token_runs import request_itls
from tests.conftest import scaled_examples
from tests.test_skip_ahead import roofline
from pagesim.traces.trace import Trace

PROPERTY_SETTINGS = settings(max_examples=scaled_examples(25), deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------- vLLM's rules, as written
def vllm_per_second(start_times, ttfts, latencies, itls) -> tuple[float, int]:
    """vLLM 0.33 ``calculate_metrics``: ``max_output_tokens_per_s`` and ``max_concurrent_requests``
    from successful requests, bucketed by whole seconds since the first send (its loops, verbatim
    in substance)."""
    min_start_time = min(start_times)
    max_end_time = max(s + lat for s, lat in zip(start_times, latencies))
    duration_seconds = int(np.ceil(max_end_time - min_start_time)) + 1
    tokens_per_second = np.zeros(duration_seconds)
    concurrent_requests_per_second = np.zeros(duration_seconds)
    for start, ttft, latency, itl in zip(start_times, ttfts, latencies, itls):
        token_times = [start + ttft]
        current_time = token_times[0]
        for itl_value in itl:
            current_time += itl_value
            token_times.append(current_time)
        for token_time in token_times:
            second_bucket = int(token_time - min_start_time)
            if 0 <= second_bucket < duration_seconds:
                tokens_per_second[second_bucket] += 1
        request_start_second = int(start - min_start_time)
        request_end_second = int((start + latency) - min_start_time)
        for second in range(request_start_second, request_end_second + 1):
            concurrent_requests_per_second[second] += 1
    return float(np.max(tokens_per_second)), int(np.max(concurrent_requests_per_second))


# ------------------------------------------------------------------ ITL: a request alone
def scheduler(policy: str = "pagesim", **settings_) -> Scheduler:
    return Scheduler(make_config(policy, **{"block_size": 16, "num_gpu_blocks": 2000, "max_model_len": 8192,
                                            **settings_}))


@pytest.mark.parametrize("skip_ahead", [True, False], ids=["skip-ahead", "step-by-step"])
@pytest.mark.parametrize("prompt, output", [(100, 1), (100, 2), (50, 37), (3000, 20)])
def test_itl_of_a_request_alone(prompt, output, skip_ahead):
    """One gap per token after the first, each the duration of the step that produced it (the
    last ``output - 1`` steps: one token each once the prompt is in), and their mean is TPOT."""
    trace = Trace(arrival_s=np.array([0.25]), prompt_len=np.array([prompt]), output_len=np.array([output]))
    sim = Simulation(trace, scheduler(max_num_batched_tokens=512), roofline(), SimOptions(skip_ahead=skip_ahead))
    result = sim.run()
    replica = sim.replica
    start, duration = replica.steps.array("start_s"), replica.steps.array("duration_s")
    runs = replica.token_runs.runs(replica.index, np.array([0]))
    itls = request_itls(runs, start, duration)[0]
    assert per_request(result, [replica], with_itls=True).itls == [itls]
    m = result.requests
    assert len(itls) == output - 1
    assert itls == duration[len(duration) - (output - 1):].tolist()
    assert m.first_token_s[0] == start[len(duration) - output] + duration[len(duration) - output]
    if prompt > 512:  # a chunked prompt: steps without a token before the first
        assert len(duration) > output
    s = result.summary
    if output == 1:
        assert s["itl_s"]["mean"] is None and s["tpot_s"]["mean"] is None
        return
    assert float(np.mean(itls)) == pytest.approx(float(m.tpot_s()[0]), rel=1e-9)
    assert math.fsum(itls) == pytest.approx(m.finish_s[0] - m.first_token_s[0], rel=1e-12)
    assert s["itl_s"]["mean"] == pytest.approx(s["tpot_s"]["mean"], rel=1e-5)
    assert s["itl_s"]["median"] == pytest.approx(float(np.median(itls)), rel=1e-5)
    if output > 2:
        assert len(set(itls)) > 1  # step times grow with the context: the gaps are not one value


# --------------------------------------------------------- ITL: workloads with preemptions
@st.composite
def itl_cases(draw):
    num = draw(st.integers(1, 8))
    arrivals = sorted(draw(st.lists(st.one_of(st.sampled_from([0.0, 0.0, 0.01]), st.floats(0.0, 0.1)),
                                    min_size=num, max_size=num)))
    prompts = draw(st.lists(st.integers(1, 60), min_size=num, max_size=num))
    outputs = draw(st.lists(st.integers(1, 40), min_size=num, max_size=num))
    n = draw(st.lists(st.sampled_from([1, 1, 1, 2, 3]), min_size=num, max_size=num))
    trace = Trace(arrival_s=np.array(arrivals), prompt_len=np.array(prompts), output_len=np.array(outputs),
                  n=np.array(n), beam_width=np.ones(num, np.int64))
    policy = draw(st.sampled_from(["pagesim", "vllm-v1", "vllm-v0"]))
    block_size = draw(st.sampled_from([1, 2, 4]))
    need = (trace.prompt_len + trace.output_len) * trace.n
    largest, demand = int(need.max()), int(need.sum())
    tight = [largest + (demand - largest) * k // 8 for k in (1, 2, 3, 4)]  # preemptions, mostly
    slots = draw(st.sampled_from([largest, *tight, 2 * demand]))
    setup = {"block_size": block_size, "num_gpu_blocks": -(-slots // block_size) + 1, "max_model_len": 256,
             "num_cpu_blocks": 256}
    if policy != "vllm-v0":
        chunked = draw(st.booleans())
        setup.update(preemption_mode=draw(st.sampled_from(["swap", "recompute"])), enable_chunked_prefill=chunked,
                     max_num_batched_tokens=draw(st.sampled_from([16, 512])) if chunked else 512)
    return trace, policy, setup, draw(st.sampled_from([1, 1, 2])), draw(st.booleans())


@PROPERTY_SETTINGS
@given(case=itl_cases())
def test_itl_on_workloads_with_preemptions(case):
    trace, policy, setup, replicas, skip_ahead = case
    cluster = Cluster(trace, [(scheduler(policy, **setup), roofline()) for _ in range(replicas)],
                      make_router("round-robin"), SimOptions(skip_ahead=skip_ahead))
    result = cluster.run()
    m, s = result.requests, result.summary
    event(f"preempted: {bool(m.preemptions.any())}")
    per = per_request(result, result.replicas, with_itls=True)
    done = np.flatnonzero(m.status == COMPLETED)
    note(f"itls {per.itls}")
    for row in done:
        gaps = per.itls[row]
        assert all(g > 0 for g in gaps), row
        assert math.fsum(gaps) == pytest.approx(m.finish_s[row] - m.first_token_s[row], rel=1e-9, abs=1e-12), row
        if trace.n[row] == 1:  # (samples of one request, recomputed apart, may get tokens in more steps)
            assert len(gaps) == m.output_tokens[row] - 1, row
    for row in np.flatnonzero(m.status != COMPLETED):
        assert per.itls[row] == []

    flat = np.array([g for row in done for g in per.itls[row]])
    itl = s["itl_s"]
    if flat.size == 0:
        assert itl["mean"] is None
        return
    expected = {"mean": np.mean(flat), "median": np.median(flat), "std": np.std(flat),
                **{f"p{q}": np.percentile(flat, q) for q in (50, 90, 99)}}
    for key, value in expected.items():
        assert itl[key] == pytest.approx(float(value), rel=1e-5, abs=1e-12), key

    # the per-second figures, by vLLM's own loops over the per-request lists
    tokens_per_s, concurrent = vllm_per_second(m.arrival_s[done], m.ttft_s()[done], m.e2e_s()[done],
                                               [per.itls[row] for row in done])
    assert s["max_output_tokens_per_s"] == tokens_per_s
    assert s["max_concurrent_requests"] <= concurrent


def test_itl_gaps_span_a_preemption():
    """Two requests in a pool with room for one to finish: the second's gaps include the wait
    while it was preempted, and still add up to its last token minus its first."""
    trace = Trace(arrival_s=np.array([0.0, 0.0]), prompt_len=np.array([16, 16]), output_len=np.array([40, 40]))
    sim = Simulation(trace, scheduler(block_size=4, num_gpu_blocks=15, max_model_len=256,
                                      preemption_mode="recompute"), roofline())
    result = sim.run()
    m = result.requests
    assert m.preemptions.sum() > 0
    per = per_request(result, [sim.replica], with_itls=True)
    durations = set(sim.replica.steps.array("duration_s").tolist())
    for row in range(2):
        gaps = per.itls[row]
        assert len(gaps) == 39
        assert math.fsum(gaps) == pytest.approx(m.finish_s[row] - m.first_token_s[row], rel=1e-12)
    preempted = int(np.flatnonzero(m.preemptions)[0])
    assert any(g not in durations for g in per.itls[preempted])  # the gap across the wait is no one step
    assert max(per.itls[preempted]) > 10 * min(per.itls[preempted])


# ---------------------------------------------------------------------- sim.bench_metrics
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=scaled_examples(200), deadline=None)
@given(data=st.lists(st.tuples(finite, st.integers(0, 5)), min_size=1, max_size=30),
       q=st.floats(0.0, 100.0))
def test_weighted_percentile_is_numpy_on_the_repeated_values(data, q):
    values = np.array([v for v, _ in data])
    weights = np.array([w for _, w in data], np.int64)
    if weights.sum() == 0:
        with pytest.raises(ValueError):
            weighted_percentile(values, weights, q)
        return
    expected = float(np.percentile(np.repeat(values, weights), q))
    scale = max(1.0, float(np.abs(values).max()))
    assert weighted_percentile(values, weights, q) == pytest.approx(expected, rel=1e-12, abs=1e-12 * scale)


@settings(max_examples=scaled_examples(100), deadline=None)
@given(data=st.lists(st.tuples(st.floats(0.0, 1e3, allow_nan=False), st.integers(1, 4)), min_size=1, max_size=30),
       weighted=st.booleans())
def test_latency_stats_are_numpys(data, weighted):
    values = np.array([v for v, _ in data])
    weights = np.array([w for _, w in data]) if weighted else None
    expanded = np.repeat(values, weights) if weighted else values
    percentiles = (50.0, 90.0, 99.0, 99.9)
    stats = latency_stats(values, percentiles, weights)
    assert list(stats) == ["mean", "median", "std", "p50", "p90", "p99", "p99.9"]
    expected = {"mean": np.mean(expanded), "median": np.median(expanded), "std": np.std(expanded),
                **{percentile_key(q): np.percentile(expanded, q) for q in percentiles}}
    for key, value in expected.items():  # (rounded to 6 significant digits)
        assert stats[key] == pytest.approx(float(value), rel=5e-6, abs=1e-9), key


def test_latency_stats_skip_non_finite_and_empty():
    stats = latency_stats([1.0, np.nan, 3.0, np.inf], (99,))
    assert stats == {"mean": 2.0, "median": 2.0, "std": 1.0, "p99": 2.98}
    assert latency_stats([], (50, 99.9)) == {"mean": None, "median": None, "std": None, "p50": None, "p99.9": None}
    assert latency_stats([np.nan], (99,))["mean"] is None
    assert latency_stats([1.0, 5.0], (50,), weights=[0, 2]) == {"mean": 5.0, "median": 5.0, "std": 0.0, "p50": 5.0}
    assert latency_stats([1 / 3], (50,))["mean"] == 0.333333  # six significant digits


def test_percentile_names_are_vllms():
    assert [percentile_key(q) for q in (50, 99.0, 99.9, 99.99, 0.5)] == ["p50", "p99", "p99.9", "p99.99", "p0.5"]
    assert bench_metrics.parse_percentiles("50, 99.9,99") == (50.0, 99.9, 99.0)
    for bad in ("0", "101", "abc", "50,", "-1"):
        with pytest.raises(ValueError, match="--metric-percentiles"):
            bench_metrics.parse_percentiles(bad)
    assert bench_metrics.parse_percentile_metrics("ttft, e2el,ttft") == ("ttft", "e2el")
    for bad in ("", "latency", "ttft,itls"):
        with pytest.raises(ValueError, match="--percentile-metrics"):
            bench_metrics.parse_percentile_metrics(bad)


@pytest.mark.parametrize("intervals, peak", [
    ([], 0),
    ([(0.0, 1.0)], 1),
    ([(0.0, 1.0), (1.0, 2.0)], 1),  # a finish and a send at one instant do not overlap
    ([(0.0, 1.0), (1.0, 2.0), (1.0, 3.0)], 2),
    ([(0.0, 2.0), (1.0, 3.0), (2.0, 4.0)], 2),
    ([(0.0, 5.0), (1.0, 2.0), (1.5, 2.5), (2.0, 3.0)], 3),
    ([(0.0, 2.0), (1.0, 1.0)], 1),  # a zero-length request (rejected at once) never overlaps
    ([(3.0, 4.0)] * 4, 4),
])
def test_peak_in_flight(intervals, peak):
    start = np.array([a for a, _ in intervals])
    finish = np.array([b for _, b in intervals])
    assert peak_in_flight(start, finish) == peak


@settings(max_examples=scaled_examples(150), deadline=None)
@given(data=st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.3, 2.0, 2.7, 3.0]),
                               st.sampled_from([0.0, 0.3, 0.7, 1.0])), min_size=1, max_size=12))
def test_peak_in_flight_and_the_per_second_rule(data):
    """peak_in_flight: the most [start, finish) intervals holding one instant (brute force);
    concurrent_per_second_bucket: vLLM's count of requests active in each whole second, which is
    never below the true peak."""
    start = np.array([a for a, _ in data])
    finish = start + np.array([d for _, d in data])
    brute = max(int(((start <= t) & (t < finish)).sum()) for t in start)
    assert peak_in_flight(start, finish) == brute
    per_second = bench_metrics.concurrent_per_second_bucket(start, finish)
    _, vllm = vllm_per_second(start, np.zeros(len(start)), finish - start, [[] for _ in start])
    assert per_second == vllm
    assert per_second >= brute


def test_per_second_rule_counts_back_to_back_requests_twice():
    start, finish = np.array([0.0, 1.3]), np.array([1.3, 1.9])
    assert peak_in_flight(start, finish) == 1
    assert bench_metrics.concurrent_per_second_bucket(start, finish) == 2


@settings(max_examples=scaled_examples(60), deadline=None)
@given(data=st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 2.0),
                               st.lists(st.floats(0.01, 0.9), max_size=6)), min_size=1, max_size=8))
def test_max_tokens_per_second_is_vllms(data):
    start = np.array([s for s, _, _ in data])
    ttft = np.array([t for _, t, _ in data])
    itls = [gaps for _, _, gaps in data]
    latency = ttft + np.array([math.fsum(g) for g in itls])
    times = np.concatenate([s + t + np.concatenate(([0.0], np.cumsum(g))) for s, t, g in zip(start, ttft, itls)])
    tokens_per_s, _ = vllm_per_second(start, ttft, latency, itls)
    got = bench_metrics.max_tokens_per_second(times, np.ones(len(times), np.int64), float(start.min()),
                                              float((start + latency).max()))
    assert got == tokens_per_s


def test_slo_parse():
    assert Slo.parse(["ttft:500"]) == Slo(ttft_s=0.5)
    assert Slo.parse(["ttft:500", "TPOT:50", "e2el:10000"]) == Slo(0.5, 0.05, 10.0)
    assert Slo.parse(["tpot:2.5"]).to_dict() == {"tpot_s": 0.0025}
    assert Slo.parse(["e2el:1000"]).describe() == "E2EL <= 1 s"


@pytest.mark.parametrize("item, words", [
    ("foo:1", "KEY:MILLISECONDS with KEY one of ttft, tpot, e2el; got 'foo:1'"),
    ("ttft", "KEY:MILLISECONDS"),
    ("ttft=500", "KEY:MILLISECONDS"),
    ("ttft:abc", "'abc' is not a number of milliseconds"),
    ("ttft:", "is not a number of milliseconds"),
    ("ttft:0", "positive number of milliseconds"),
    ("tpot:-5", "positive number of milliseconds"),
    ("e2el:inf", "positive number of milliseconds"),
    ("e2el:nan", "positive number of milliseconds"),
])
def test_slo_parse_refuses(item, words):
    with pytest.raises(ValueError) as exc:
        Slo.parse([item])
    message = str(exc.value)
    assert message.startswith("--goodput")
    assert words in message
    assert "\n" not in message


def test_slo_meets_counts_one_token_requests_as_tpot_zero():
    slo = Slo(ttft_s=1.0, tpot_s=0.05)
    ok = slo.meets(np.array([0.5, 0.5, 1.5, 0.5]), np.array([np.nan, 0.06, 0.01, 0.05]), np.array([9.0] * 4))
    assert ok.tolist() == [True, False, False, True]
    assert Slo(e2el_s=2.0).meets(np.array([5.0]), np.array([5.0]), np.array([2.0])).tolist() == [True]


# --------------------------------------------------------- sim.bench_result by hand
def test_bench_result_by_hand():
    """Four requests: two of several tokens, one of one token, one failed (vLLM's formulas)."""
    per = PerRequest(
        input_lens=[10, 20, 30, 40],
        output_lens=[3, 1, 5, 0],
        success=[True, True, True, False],
        start_times=[0.0, 0.5, 1.0, 1.2],
        ttfts=[0.2, 0.4, 0.3, 0.0],
        latencies=[1.0, 0.4, 2.3, 0.0],
        itls=[[0.3, 0.5], [], [0.5, 0.5, 0.5, 0.5], []],
        errors=["", "", "", "rejected: too long"],
    )
    result = bench_result(per, duration_s=2.5, percentile_metrics=("ttft", "tpot", "itl", "e2el"),
                          percentiles=(50.0, 99.0), goodput=Slo(ttft_s=0.35, tpot_s=0.45),
                          setup={"model_id": "m"}, pagesim={"x": 1})
    tpot = [(1.0 - 0.2) / 2, (2.3 - 0.3) / 4]  # 0.4, 0.5: over requests of more than one token
    itl = [0.3, 0.5, 0.5, 0.5, 0.5, 0.5]
    # goodput: row 0 (ttft 0.2, tpot 0.4) meets; row 1 (ttft 0.4) misses TTFT; row 2 (tpot 0.5) misses TPOT
    expected = {
        "model_id": "m", "duration": 2.5, "completed": 3, "failed": 1,
        "total_input_tokens": 60, "total_output_tokens": 9,
        "request_throughput": 3 / 2.5, "request_goodput": 1 / 2.5,
        "output_throughput": 9 / 2.5, "total_token_throughput": 69 / 2.5,
        "input_lens": [10, 20, 30, 40], "output_lens": [3, 1, 5, 0],
        "ttfts": [0.2, 0.4, 0.3, 0.0], "latencies": [1.0, 0.4, 2.3, 0.0],
        "start_times": [0.0, 0.5, 1.0, 1.2], "errors": ["", "", "", "rejected: too long"],
        "itls": [[0.3, 0.5], [], [0.5, 0.5, 0.5, 0.5], []],
        # token times 0.2, 0.5, 1.0 | 0.9 | 1.3, 1.8, 2.3, 2.8, 3.3: second 0 has 2, second 1 has 3
        "max_output_tokens_per_s": 3.0,
        "max_concurrent_requests": 2,  # [0, 1) [0.5, 0.9) [1.0, 3.3): rows 0 and 1
    }
    for name, values in (("ttft", [0.2, 0.4, 0.3]), ("tpot", tpot), ("itl", itl), ("e2el", [1.0, 0.4, 2.3])):
        expected[f"mean_{name}_ms"] = float(np.mean(values)) * 1000
        expected[f"median_{name}_ms"] = float(np.median(values)) * 1000
        expected[f"std_{name}_ms"] = float(np.std(values)) * 1000
        expected[f"p50_{name}_ms"] = float(np.percentile(values, 50)) * 1000
        expected[f"p99_{name}_ms"] = float(np.percentile(values, 99)) * 1000
    assert result.keys() == expected.keys() | {"pagesim"}
    assert result["pagesim"]["x"] == 1
    # the exact peak goes beside vLLM's per-second count: at most rows 0 and 1 (or 0 and 2) at once
    assert result["pagesim"]["max_concurrent_requests_exact"] == 2
    for key, value in expected.items():
        if isinstance(value, float):
            assert result[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert result[key] == value, key
    assert result["mean_tpot_ms"] == pytest.approx(450.0) and result["median_itl_ms"] == pytest.approx(500.0)


def test_bench_result_without_goodput_or_successes():
    per = PerRequest(input_lens=[5, 6], output_lens=[0, 0], success=[False, False], start_times=[0.0, 0.1],
                     ttfts=[0.0, 0.0], latencies=[0.0, 0.0], itls=[[], []], errors=["rejected: a", "rejected: b"])
    result = bench_result(per, duration_s=0.0)
    assert result["completed"] == 0 and result["failed"] == 2
    assert result["request_goodput"] is None  # vLLM writes None without --goodput
    assert result["request_throughput"] == 0.0
    assert result["mean_ttft_ms"] == 0.0 and result["p99_itl_ms"] == 0.0  # vLLM: np.mean(x or 0)
    assert "mean_e2el_ms" not in result  # not asked: vLLM's default ttft, tpot, itl
    with pytest.raises(ValueError, match="ttfts has 1 entries for 2 requests"):
        PerRequest(input_lens=[5, 6], output_lens=[0, 0], success=[False, False], start_times=[0.0, 0.1],
                   ttfts=[0.0], latencies=[0.0, 0.0], itls=None)


# --------------------------------------------------------------- the CLI: --save-result
# What ``vllm bench serve --save-result --save-detailed`` (vLLM 0.33) writes for a run of three
# requests with --request-rate 4 --max-concurrency 4 --goodput ttft:2000 tpot:100, written by hand.
VLLM_RESULT = {
    # label: null without --label (vLLM 0.33 serve.py:2096, :2309; the file name takes the backend instead)
    "date": "20250101-120000", "endpoint_type": "openai", "backend": "vllm", "label": None,
    "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 3, "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": 4,
    "duration": 2.1234, "completed": 3, "failed": 0, "total_input_tokens": 300, "total_output_tokens": 60,
    "request_throughput": 1.4128, "request_goodput": 1.4128, "output_throughput": 28.256,
    "total_token_throughput": 169.54,
    "input_lens": [100, 120, 80], "output_lens": [20, 25, 15],
    "ttfts": [0.051, 0.048, 0.062], "itls": [[0.021, 0.02], [0.019], [0.022, 0.02]],
    "latencies": [0.45, 0.52, 0.39], "start_times": [1735732800.1, 1735732800.35, 1735732800.6],
    "errors": ["", "", ""], "max_output_tokens_per_s": 120.0, "max_concurrent_requests": 3,
    "mean_ttft_ms": 53.6, "median_ttft_ms": 51.0, "std_ttft_ms": 6.0, "p99_ttft_ms": 61.8,
    "mean_tpot_ms": 20.3, "median_tpot_ms": 20.2, "std_tpot_ms": 0.4, "p99_tpot_ms": 20.9,
    "mean_itl_ms": 20.4, "median_itl_ms": 20.0, "std_itl_ms": 1.1, "p99_itl_ms": 21.9,
}


def json_kind(value):
    """A value's JSON type; a list's with its first element's."""
    if isinstance(value, list):
        return ("array", json_kind(value[0]) if value else None)
    return {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object",
            type(None): "null"}[type(value)]


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


SHAREGPT = ["--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "20"]


def test_result_file_has_vllms_keys_and_types(capsys, tmp_path):
    path = tmp_path / "result.json"
    rc, out, err = simulate(capsys, *SHAREGPT, "--max-concurrency", "4", "--goodput", "ttft:2000", "tpot:100",
                            "--json", "--save-result", "--result-filename", str(path))
    assert rc == 0, err
    summary = json.loads(out)
    result = json.loads(path.read_text())
    for key, value in VLLM_RESULT.items():
        assert key in result, key
        assert json_kind(result[key]) == json_kind(value), f"{key}: {result[key]!r} is not like vLLM's {value!r}"
    assert "pagesim" in result and result["pagesim"]["summary"] == summary
    assert result["num_prompts"] == 20 and result["max_concurrency"] == 4 and result["request_rate"] == 4.0
    assert result["completed"] == summary["requests_completed"] == 20 and result["failed"] == 0
    assert all(len(result[k]) == 20 for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies",
                                              "start_times", "errors"))
    # vLLM's units: milliseconds for latencies, per second for rates
    for metric, ours in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s")):
        assert result[f"mean_{metric}_ms"] == pytest.approx(1000 * summary[ours]["mean"], rel=1e-5), metric
        assert result[f"median_{metric}_ms"] == pytest.approx(1000 * summary[ours]["median"], rel=1e-5), metric
        assert result[f"p99_{metric}_ms"] == pytest.approx(1000 * summary[ours]["p99"], rel=1e-5), metric
    assert result["duration"] == pytest.approx(summary["duration_s"], rel=1e-5)
    assert result["request_throughput"] == pytest.approx(summary["throughput_rps"], rel=1e-5)
    assert result["output_throughput"] == pytest.approx(summary["throughput_tokens_s"], rel=1e-5)
    assert result["total_token_throughput"] == pytest.approx(summary["throughput_total_tokens_s"], rel=1e-5)
    assert result["request_goodput"] == pytest.approx(summary["goodput_rps"], rel=1e-5)
    # the summary's is the exact peak in flight; the file's, vLLM's count per whole second
    assert result["pagesim"]["max_concurrent_requests_exact"] == summary["max_concurrent_requests"] <= 4
    ok = np.asarray(result["errors"]) == ""
    start, latency = np.asarray(result["start_times"])[ok], np.asarray(result["latencies"])[ok]
    assert result["max_concurrent_requests"] == vllm_per_second(start, np.zeros(ok.sum()), latency,
                                                                [[]] * int(ok.sum()))[1]
    assert result["max_concurrent_requests"] >= summary["max_concurrent_requests"]
    assert result["max_output_tokens_per_s"] == summary["max_output_tokens_per_s"]
    assert result["total_output_tokens"] == sum(result["output_lens"]) == summary["generated_tokens"]
    # the per-request lists agree with one another: latency = TTFT + the gaps
    lists = (result["ttfts"], result["latencies"], result["itls"], result["output_lens"])
    for ttft, latency, gaps, out_len in zip(*lists):
        assert latency == pytest.approx(ttft + math.fsum(gaps), rel=1e-9)
        assert len(gaps) == out_len - 1


def test_result_file_percentile_flags(capsys, tmp_path):
    path = tmp_path / "result.json"
    rc, _, err = simulate(capsys, *SHAREGPT, "--save-result", "--result-filename", str(path),
                          "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9")
    assert rc == 0, err
    result = json.loads(path.read_text())
    metric_keys = {k for k in result if k.endswith("_ms")}
    assert metric_keys == {f"{stat}_{m}_ms" for m in ("ttft", "e2el")
                           for stat in ("mean", "median", "std", "p50", "p99.9")}
    assert not any("itl" in k or "tpot" in k for k in result if k.endswith("_ms"))
    ok = [e == "" for e in result["errors"]]
    ttfts = [t for t, good in zip(result["ttfts"], ok) if good]
    latencies = [t for t, good in zip(result["latencies"], ok) if good]
    assert result["p99.9_ttft_ms"] == pytest.approx(1000 * float(np.percentile(ttfts, 99.9)), rel=1e-12)
    assert result["p50_e2el_ms"] == pytest.approx(1000 * float(np.median(latencies)), rel=1e-12)
    assert result["request_goodput"] is None  # no --goodput


# ------------------------------------------------------------------ rejected requests
@pytest.mark.parametrize("limit", [["--max-model-len", "256"], ["--num-gpu-blocks", "30"]],
                         ids=["max-model-len", "tiny-cache"])
def test_rejected_requests_count_as_failed_and_miss_every_slo(capsys, tmp_path, limit):
    path = tmp_path / "result.json"
    args = [*SHAREGPT, *limit, "--goodput", "ttft:2000", "tpot:100"]
    rc, out, err = simulate(capsys, *args, "--json", "--save-result", "--result-filename", str(path))
    assert rc == 0, err
    summary = json.loads(out)
    rejected, total = summary["requests_rejected"], summary["requests_total"]
    assert total == 20 and 0 < rejected < 20
    notes = [line for line in err.splitlines() if ": note: " in line]
    assert notes and notes[0].startswith(f"pagesim simulate: note: {rejected} of 20 requests")

    # the SLO share is over every request submitted; goodput counts none of the rejected
    met = summary["slo"]["met"]
    assert summary["slo"]["attained"] == pytest.approx(met / total, rel=1e-5)
    assert summary["goodput_rps"] == pytest.approx(met / summary["duration_s"], rel=1e-4)

    # the result file: rejected requests are failed ones
    result = json.loads(path.read_text())
    failed = [k for k, e in enumerate(result["errors"]) if e]
    assert result["failed"] == len(failed) == rejected
    assert result["completed"] == 20 - rejected
    for k in failed:
        assert result["errors"][k].startswith("rejected: ") and len(result["errors"][k]) > len("rejected: ")
        assert result["output_lens"][k] == 0 and result["ttfts"][k] == 0.0 and result["itls"][k] == []
    assert result["pagesim"]["rejected"]["count"] == rejected
    good = 0
    for k in range(20):
        if k in failed:
            continue
        out_len = result["output_lens"][k]
        tpot = (result["latencies"][k] - result["ttfts"][k]) / (out_len - 1) if out_len > 1 else 0.0
        good += result["ttfts"][k] <= 2.0 and tpot <= 0.1
    assert good == met
    assert result["request_goodput"] == pytest.approx(met / result["duration"], rel=1e-12)

    # the table says it first
    rc, out, _ = simulate(capsys, *args)
    assert rc == 0
    assert out.splitlines()[0].startswith(f"NOTE: {rejected} of 20 requests")
