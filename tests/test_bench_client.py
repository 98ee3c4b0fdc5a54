"""The benchmark client in front of the replicas (``pagesim.sim.client``) and vLLM bench's flag names.

A closed-loop client (vLLM bench's ``--max-concurrency N``) sends each request at its trace
arrival time unless N are already in flight; then it waits, in arrival order, for a finish. The
property tests replay generated small workloads (ties and gaps in the arrivals, pools from tight
to roomy so that requests are preempted or rejected, one and two replicas, skip-ahead on and
off) and check the client's contract from the per-request table alone, by an exact sweep over
send and release times:

- never more than N requests in flight (a release and a send at one instant do not overlap);
- no request sent before its trace arrival, and requests sent in row (arrival) order;
- a request that waited was sent at the instant a slot freed, and while it waited every slot
  was taken (the client never idles with work due);
- with N at least the number of requests, the run is the open-loop run, bit for bit; with one
  replica, skip-ahead changes nothing.

The flag tests run ``pagesim simulate`` in-process and check that each vLLM bench name is an
alias of pagesim's own (the same ``--json`` summary) and that bad values are one-line errors.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from pagesim.engine.cli import main
from pagesim.engine.policy import Scheduler, make_config
from pagesim.sim.cluster import Cluster
from pagesim.sim.metrics import COMPLETED, REJECTED
from pagesim.sim.router import make_router
from pagesim.sim.simulator import SimOptions, Simulation
from tests.conftest import scaled_examples
from tests.test_sim_cli import simulate
from tests.test_sim_properties import LinearCost
from pagesim.traces.trace import Trace

REQUEST_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "output_tokens",
                   "generation_len", "preemptions", "status")
# NOTE: a request sent at once keeps its trace arrival (test_a_request_sent_at_once_keeps_its_trace_arrival), but
# the SimPy clock that stamps finishes and releases can stand an ulp, or through the arrival process's 1e-12 s tie
# tolerance up to 1e-12 s, short of it (a request refused at once is released "before" it arrived). The
# properties allow that much.
CLOCK_SLACK_S = 1e-9
PROPERTY_SETTINGS = settings(max_examples=scaled_examples(25), deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- strategies
@st.composite
def workloads(draw) -> Trace:
    """1-8 requests: arrivals with ties (bursts) and gaps, some at arbitrary times; short prompts
    and outputs; a few with parallel samples."""
    num = draw(st.integers(1, 8))
    times = st.one_of(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 6.0, 20.0]), st.floats(0.0, 12.0))
    arrivals = sorted(draw(st.lists(times, min_size=num, max_size=num)))
    prompts = draw(st.lists(st.integers(1, 40), min_size=num, max_size=num))
    outputs = draw(st.lists(st.integers(1, 24), min_size=num, max_size=num))
    n = draw(st.lists(st.sampled_from([1, 1, 1, 2]), min_size=num, max_size=num))
    return Trace(arrival_s=np.array(arrivals), prompt_len=np.array(prompts), output_len=np.array(outputs),
                 n=np.array(n), beam_width=np.ones(num, np.int64))


@st.composite
def setups(draw, trace: Trace) -> dict:
    """A scheduler configuration: the pool from too small for the largest request (rejections)
    through tight (preemptions) to roomy; max_model_len 24 rejects long prompts at submit."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    need = (trace.prompt_len + trace.output_len) * trace.n
    largest, demand = int(need.max()), int(need.sum())
    slots = draw(st.sampled_from([largest // 2, largest, largest + (demand - largest) // 4, (largest + demand) // 2,
                                 2 * demand]))
    chunked = draw(st.booleans())
    return {
        "policy": draw(st.sampled_from(["pagesim", "vllm-v1"])),
        "block_size": block_size,
        "num_gpu_blocks": max(2, -(-slots // block_size)),
        "num_cpu_blocks": draw(st.sampled_from([0, 64])),
        "preemption_mode": draw(st.sampled_from(["swap", "recompute"])),
        "max_model_len": draw(st.sampled_from([256, 256, 256, 24])),
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": draw(st.sampled_from([8, 512])) if chunked else 512,
    }


@st.composite
def cases(draw):
    trace = draw(workloads())
    return trace, draw(setups(trace)), draw(st.integers(1, 4))


def scheduler(setup: dict) -> Scheduler:
    settings_ = {k: v for k, v in setup.items() if k != "policy"}
    return Scheduler(make_config(setup["policy"], **settings_))


def run_cluster(trace: Trace, setup: dict, *, replicas: int = 1, router: str = "round-robin", **options):
    """A run and, per row, the instant the client was told the request finished (completed or
    rejected): the end of its in-flight interval, which the table has no column for when it
    was rejected."""
    cluster = Cluster(trace, [(scheduler(setup), LinearCost()) for _ in range(replicas)], make_router(router),
                      SimOptions(**options))
    released: list[tuple[int, float]] = []
    for replica in cluster.replicas:
        if replica.on_request_done is not None:
            def release(row, done=replica.on_request_done):
                released.append((row, cluster.env.now))
                done(row)

            replica.on_request_done = release
    return cluster.run(), released


# ------------------------------------------------------------------------------ checks
def in_flight_after(times_s: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sweep: event times sorted (releases before sends at one instant) and the count in
    flight after each event."""
    order = np.lexsort((deltas, times_s))
    return times_s[order], np.cumsum(deltas[order])


def settled_count(sends: np.ndarray, releases: np.ndarray, t: float) -> int:
    """Requests in flight once every event at instant ``t`` has happened."""
    return int((sends <= t).sum() - (releases <= t).sum())


def check_closed_loop(trace: Trace, result, released: list[tuple[int, float]], max_concurrency: int) -> None:
    m = result.requests
    num = len(trace)
    note(f"sends {m.arrival_s.tolist()}\nfinish {m.finish_s.tolist()}\nstatus {m.status.tolist()}\n"
         f"released {released}")
    assert set(m.status.tolist()) <= {COMPLETED, REJECTED}
    event(f"waited: {bool((m.arrival_s > trace.arrival_s + CLOCK_SLACK_S).any())}")
    event(f"rejected: {bool((m.status == REJECTED).any())}")
    event(f"preempted: {bool(m.preemptions.any())}")

    # every request sent, once, and released once; a completed one at its finish
    assert np.isfinite(m.arrival_s).all()
    assert sorted(row for row, _ in released) == list(range(num))
    release_s = np.empty(num)
    for row, when in released:
        release_s[row] = when
    done = m.status == COMPLETED
    np.testing.assert_array_equal(release_s[done], m.finish_s[done])
    assert (release_s >= m.arrival_s - CLOCK_SLACK_S).all()
    event(f"rejected mid-run: {bool((release_s[~done] > m.arrival_s[~done]).any())}")

    # never sent before its trace arrival (but for the clock's slack); sent in arrival (row) order
    early = np.flatnonzero(m.arrival_s < trace.arrival_s - CLOCK_SLACK_S)
    assert early.size == 0, f"rows {early.tolist()} sent before their trace arrival"
    assert (np.diff(m.arrival_s) >= 0).all(), "requests not sent in arrival order"

    # the exact sweep: never more than N in flight
    times = np.concatenate((release_s, m.arrival_s))
    deltas = np.concatenate((np.full(num, -1), np.full(num, 1)))
    event_s, count = in_flight_after(times, deltas)
    assert count.max() <= max_concurrency, f"{count.max()} in flight with --max-concurrency {max_concurrency}"
    _, completed_count = in_flight_after(np.concatenate((m.finish_s[done], m.arrival_s[done])),
                                         np.concatenate((np.full(done.sum(), -1), np.full(done.sum(), 1))))
    assert result.summary["max_concurrent_requests"] == (completed_count.max() if done.any() else 0) <= max_concurrency

    # a request that waited was sent as a slot freed, and every slot was taken while it waited
    for row in np.flatnonzero(m.arrival_s > trace.arrival_s + CLOCK_SLACK_S):
        due, sent = float(trace.arrival_s[row]) + CLOCK_SLACK_S, float(m.arrival_s[row])
        assert sent in set(release_s.tolist()), f"row {row} sent at {sent}, when nothing finished"
        waited_through = [due, *event_s[(event_s > due) & (event_s < sent)].tolist()]
        counts = [settled_count(m.arrival_s, release_s, t) for t in waited_through]
        assert all(c == max_concurrency for c in counts), \
            f"row {row} due at {due} waited until {sent} with free slots (in flight {counts} at {waited_through})"


def assert_same_run(first, second) -> None:
    assert first.summary == second.summary
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(getattr(first.requests, name), getattr(second.requests, name), err_msg=name)


def flatten(summary: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):  # a cluster's replicas
            for k, v in enumerate(value):
                flat.update(flatten(v, f"{prefix}{key}.{k}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def assert_same_decisions(first, second) -> None:
    """The same decisions and times; send stamps and the summary's figures within the clock's slack."""
    for name in REQUEST_COLUMNS:
        if name != "arrival_s":
            np.testing.assert_array_equal(getattr(first.requests, name), getattr(second.requests, name), err_msg=name)
    np.testing.assert_allclose(first.requests.arrival_s, second.requests.arrival_s, rtol=0, atol=CLOCK_SLACK_S)
    a, b = flatten(first.summary), flatten(second.summary)
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], float) and isinstance(b[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=CLOCK_SLACK_S), key
        else:
            assert a[key] == b[key], key


# ------------------------------------------------------------------- closed-loop client
@PROPERTY_SETTINGS
@given(case=cases(), skip_ahead=st.booleans())
def test_closed_loop_one_replica(case, skip_ahead):
    trace, setup, max_concurrency = case
    result, released = run_cluster(trace, setup, max_concurrency=max_concurrency, skip_ahead=skip_ahead)
    check_closed_loop(trace, result, released, max_concurrency)


@PROPERTY_SETTINGS
@given(case=cases(), router=st.sampled_from(["round-robin", "least-kv", "least-outstanding-tokens"]))
def test_closed_loop_two_replicas(case, router):
    trace, setup, max_concurrency = case
    result, released = run_cluster(trace, setup, replicas=2, router=router, max_concurrency=max_concurrency)
    check_closed_loop(trace, result, released, max_concurrency)


@PROPERTY_SETTINGS
@given(case=cases())
def test_closed_loop_skip_ahead_changes_nothing_on_one_replica(case):
    trace, setup, max_concurrency = case
    stepped, _ = run_cluster(trace, setup, max_concurrency=max_concurrency, skip_ahead=False)
    skipped, _ = run_cluster(trace, setup, max_concurrency=max_concurrency, skip_ahead=True)
    assert_same_run(stepped, skipped)


@PROPERTY_SETTINGS
@given(case=cases(), replicas=st.sampled_from([1, 2]), extra=st.integers(0, 2))
def test_concurrency_at_least_the_requests_is_the_open_loop(case, replicas, extra):
    """With N >= the number of requests no request ever waits: the decisions are the open loop's."""
    trace, setup, _ = case
    open_loop, _ = run_cluster(trace, setup, replicas=replicas)
    closed, _ = run_cluster(trace, setup, replicas=replicas, max_concurrency=len(trace) + extra)
    assert_same_decisions(open_loop, closed)


@pytest.mark.parametrize("arrivals", [[0.2, 0.9], [0.0, 1e-13]])
def test_a_request_sent_at_once_keeps_its_trace_arrival(arrivals):
    trace = Trace(arrival_s=np.array(arrivals), prompt_len=np.array([4, 4]), output_len=np.array([3, 3]))
    setup = {"policy": "pagesim", "block_size": 4, "num_gpu_blocks": 64, "max_model_len": 256}
    open_loop, _ = run_cluster(trace, setup)
    closed, _ = run_cluster(trace, setup, max_concurrency=2)
    assert closed.requests.arrival_s.tolist() == arrivals  # both sent at once: neither waited
    assert_same_run(open_loop, closed)


def test_simulation_and_one_replica_cluster_agree_under_a_closed_loop():
    """``Simulation`` wires the client itself; it must match the one-replica cluster."""
    trace = Trace(arrival_s=np.array([0.0, 0.0, 0.0, 0.4, 0.4, 5.0]), prompt_len=np.array([12, 30, 7, 18, 3, 25]),
                  output_len=np.array([6, 3, 9, 12, 1, 5]))
    setup = {"policy": "pagesim", "block_size": 2, "num_gpu_blocks": 24, "max_model_len": 256}
    cluster, _ = run_cluster(trace, setup, max_concurrency=2)
    single = Simulation(trace, scheduler(setup), LinearCost(), SimOptions(max_concurrency=2)).run()
    assert_same_run(cluster, single)
    assert cluster.summary["max_concurrent_requests"] == 2


def test_closed_loop_timeline():
    """Two slots, requests all due at 0 and one at 100 s: the whole send timeline, by hand.

    LinearCost: a step takes 1 s + 0.1 s per scheduled token. Rows 0 and 1 (prompts 10, 10,
    2 tokens each) prefill together (2 + 20 * 0.1 = 3 s, first tokens at 3), decode together
    (1.2 s) and finish at 4.2; rows 2 and 3 are sent then, and row 4 at its own arrival, 100 s,
    with nothing in flight (prefill 2 s, decode 1.1 s: done at 103.1)."""
    trace = Trace(arrival_s=np.array([0.0, 0.0, 0.0, 0.0, 100.0]), prompt_len=np.array([10, 10, 10, 10, 10]),
                  output_len=np.array([2, 2, 2, 2, 2]))
    setup = {"policy": "pagesim", "block_size": 4, "num_gpu_blocks": 64, "max_model_len": 256}
    result, _ = run_cluster(trace, setup, max_concurrency=2)
    m = result.requests
    assert m.arrival_s.tolist() == pytest.approx([0.0, 0.0, 4.2, 4.2, 100.0])
    assert m.finish_s.tolist() == pytest.approx([4.2, 4.2, 8.4, 8.4, 103.1])
    # TTFT counts from the send, not from the trace arrival (vLLM bench's clock)
    assert m.ttft_s().tolist() == pytest.approx([3.0, 3.0, 3.0, 3.0, 2.0])
    assert result.summary["max_concurrent_requests"] == 2


# ---------------------------------------------------------------------------- the CLI
def simulate_json(capsys, *args: str) -> dict:
    rc, out, err = simulate(capsys, "--json", *args)
    assert rc == 0, err
    summary = json.loads(out)
    summary.pop("sim_wall_s")
    return summary


def read_requests(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


SHAREGPT = ["--workload", "kwon2023-sharegpt", "--num-requests", "12"]


def test_request_rate_inf_with_one_slot_serves_one_after_another(capsys, tmp_path):
    rc, _, err = simulate(capsys, *SHAREGPT, "--request-rate", "inf", "--max-concurrency", "1",
                          "--num-gpu-blocks", "400", "--out", str(tmp_path))
    assert rc == 0, err
    rows = read_requests(tmp_path / "requests.csv")
    assert len(rows) == 12 and all(r["status"] == "completed" for r in rows)
    sends = [float(r["arrival_s"]) for r in rows]
    finishes = [float(r["finish_s"]) for r in rows]
    assert sends[0] == 0.0
    assert sends[1:] == finishes[:-1]  # exactly: each sent the instant the previous one finished
    assert all(s < f for s, f in zip(sends, finishes))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["max_concurrent_requests"] == 1
    assert summary["queueing_s"]["p99"] == 0.0  # alone in the engine: never queued there


@pytest.mark.parametrize("vllm, pagesim, other", [
    (["--num-prompts", "15"], ["--num-requests", "15"], ["--num-requests", "10"]),
    (["--request-rate", "3"], ["--rate", "3"], ["--rate", "6"]),
    (["-tp", "2"], ["--tp", "2"], ["--tp", "1"]),
    (["--tensor-parallel-size", "2"], ["--tp", "2"], ["--tp", "1"]),
    (["--num-gpu-blocks-override", "300"], ["--num-gpu-blocks", "300"], ["--num-gpu-blocks", "500"]),
    (["--enable-prefix-caching"], ["--prefix-caching", "on"], ["--prefix-caching", "off"]),
    (["--no-enable-prefix-caching"], ["--prefix-caching", "off"], ["--prefix-caching", "on"]),
    (["--enable-chunked-prefill"], ["--chunked-prefill", "on"], ["--chunked-prefill", "off"]),
], ids=lambda a: " ".join(a))
def test_vllm_flag_names_are_aliases(capsys, vllm, pagesim, other):
    """The same --json summary under vLLM bench's name as under pagesim's, and a different one
    under another value of pagesim's flag (so the flag was not ignored)."""
    base = ["--workload", "kwon2023-sharegpt"]
    rest = {"--num-prompts": ["--rate", "3"], "--request-rate": ["--num-requests", "15"]}.get(
        vllm[0], ["--rate", "3", "--num-requests", "15"])
    if vllm[0] == "--enable-chunked-prefill":  # (a budget some prompts exceed, so that chunking matters)
        rest += ["--max-num-batched-tokens", "256", "--max-model-len", "256"]
    theirs = simulate_json(capsys, *base, *rest, *vllm)
    ours = simulate_json(capsys, *base, *rest, *pagesim)
    assert theirs == ours
    assert simulate_json(capsys, *base, *rest, *other) != ours


def test_request_rate_inf_puts_every_arrival_at_zero(capsys, tmp_path):
    rc, _, err = simulate(capsys, *SHAREGPT, "--request-rate", "inf", "--out", str(tmp_path))
    assert rc == 0, err
    sends = [float(r["arrival_s"]) for r in read_requests(tmp_path / "requests.csv")]
    assert sends == [0.0] * 12


@pytest.mark.parametrize("burstiness", ["0.25", "4"])
def test_burstiness_is_gamma_arrivals(capsys, burstiness):
    b = float(burstiness)
    theirs = simulate_json(capsys, *SHAREGPT, "--request-rate", "5", "--burstiness", burstiness)
    ours = simulate_json(capsys, *SHAREGPT, "--rate", "5", "--arrival", f"gamma:cv={1 / math.sqrt(b)!r}")
    poisson = simulate_json(capsys, *SHAREGPT, "--rate", "5")
    assert theirs == ours
    assert theirs != poisson


@pytest.mark.parametrize("flags, words", [
    (["--request-rate", "0"], "--request-rate"),
    (["--rate", "3", "--burstiness", "-1"], "--burstiness"),
    (["--rate", "3", "--max-concurrency", "0"], "--max-concurrency"),
    (["--rate", "3", "--goodput", "foo:1"], "--goodput"),
    (["--rate", "3", "--goodput", "ttft:-5"], "--goodput"),
    (["--rate", "3", "--metric-percentiles", "0"], "--metric-percentiles"),
    (["--rate", "3", "--percentile-metrics", "ttft,latency"], "--percentile-metrics"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_bad_bench_values_are_one_line_errors(capsys, flags, words):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--no-progress", "--workload", "kwon2023-sharegpt", "--num-requests", "5", *flags])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pagesim simulate: error:"), err
    assert words in lines[0]
    assert "Traceback" not in err
