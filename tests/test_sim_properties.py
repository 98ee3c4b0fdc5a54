"""Properties of whole simulation runs on random small workloads and configurations.

Workloads mix single requests, parallel sampling (n > 1, sample lengths "drawn" or "same"), beam
search and shared prefixes (prefix identities), arriving in bursts. Configurations range from a
roomy pool to one so tight that requests are preempted (swap or recompute) or can never fit,
under the paged scheduler and the contiguous baselines (max / pow2 / oracle). Every run must:

- end, with every request completed or rejected, and the counts adding up;
- generate exactly the tokens the trace asks for (each sample its own length);
- never hold more KV memory than it has (used <= allocated <= total, per step);
- keep time consistent (steps back to back or idle between, arrival <= first scheduled <= first
  token <= finish);
- be deterministic: the same trace and seed give the same summary and decision log.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import ContiguousScheduler, Scheduler, make_config
from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.metrics import COMPLETED, REJECTED
from pagesim.sim.simulator import SimOptions, Simulation
from tests.conftest import pure_python_only, scaled_examples
from pagesim.traces.trace import Trace

PREFIX_BLOCK_TOKENS = 4


class LinearCost(CostModel):
    """1 s per step + 0.1 s per token; 0.5 s per swapped block."""

    def step_cost(self, work: StepWork) -> StepCost:
        terms = dict.fromkeys(TERMS, 0.0)
        if work.num_tokens:
            terms["linear"] = 1.0 + 0.1 * work.num_tokens
        terms["swap"] = 0.5 * (work.num_swap_out_blocks + work.num_swap_in_blocks)
        return StepCost(terms)


# --------------------------------------------------------------------------- strategies
def shared_prefix_columns(draw, prompts: list[int], *, max_shared_blocks: int) -> dict:
    """Trace columns giving each prompt one of two system prompts' first 1..``max_shared_blocks``
    prefix identities, then private ones."""
    values, offsets = [], [0]
    for i, prompt in enumerate(prompts):
        system = draw(st.integers(0, 1))
        shared = draw(st.integers(1, max_shared_blocks))
        blocks = -(-prompt // PREFIX_BLOCK_TOKENS)
        values += [100 * system + k if k < shared else 1000 * (i + 1) + k for k in range(blocks)]
        offsets.append(len(values))
    return {"prefix_id_values": np.array(values), "prefix_id_offsets": np.array(offsets),
            "prefix_block_tokens": PREFIX_BLOCK_TOKENS}


@st.composite
def workloads(draw, *, beams: bool = True) -> Trace:
    num = draw(st.integers(1, 6))
    arrivals = sorted(draw(st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5, 6.0, 0.0]), min_size=num, max_size=num)))
    prompts = draw(st.lists(st.integers(1, 20), min_size=num, max_size=num))
    outputs = draw(st.lists(st.integers(1, 12), min_size=num, max_size=num))
    kind = draw(st.sampled_from(["single", "parallel", "beam"] if beams else ["single", "parallel"]))
    samples = draw(st.lists(st.integers(1, 3), min_size=num, max_size=num))
    n = samples if kind == "parallel" else [1] * num
    beam_width = samples if kind == "beam" else [1] * num
    columns = shared_prefix_columns(draw, prompts, max_shared_blocks=4) if draw(st.booleans()) else {}
    return Trace(arrival_s=np.array(arrivals), prompt_len=np.array(prompts), output_len=np.array(outputs),
                 n=np.array(n), beam_width=np.array(beam_width), **columns)


@st.composite
def setups(draw, trace: Trace, *, allocators=("paged", "paged", "max", "pow2", "oracle")) -> dict:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    # The pool, in token slots, relative to the trace's demand: too small for its largest request
    # (rejections), just that request (the others queue or preempt), between that and all of them
    # at once (preemption), or roomy.
    need = (trace.prompt_len + trace.output_len) * np.maximum(trace.n, trace.beam_width)
    largest, demand = int(need.max()), int(need.sum())
    between = [(largest * (4 - k) + demand * k) // 4 for k in (1, 2, 3)]
    slots = draw(st.sampled_from([largest // 2, largest, *between, 2 * demand]))
    return {
        "allocator": draw(st.sampled_from(allocators)),
        "policy": draw(st.sampled_from(["pagesim", "vllm-v1"])),
        "block_size": block_size,
        "num_gpu_blocks": max(2, -(-slots // block_size)),
        "num_cpu_blocks": draw(st.sampled_from([0, 4, 64])),
        "preemption_mode": draw(st.sampled_from(["swap", "recompute"])),
        "max_num_batched_tokens": draw(st.sampled_from([8192, 8, 32])),
        "max_model_len": draw(st.sampled_from([8192, 24])),
        "enable_prefix_caching": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
        "sample_lengths": draw(st.sampled_from(["drawn", "same"])),
        "overlap_swaps": draw(st.booleans()),
    }


@st.composite
def cases(draw, *, beams: bool = True, allocators=("paged",)) -> tuple[Trace, dict]:
    trace = draw(workloads(beams=beams))
    return trace, draw(setups(trace, allocators=allocators))


def build(setup: dict, *, record_decisions: bool = True):
    config = make_config(
        setup["policy"], block_size=setup["block_size"], num_gpu_blocks=setup["num_gpu_blocks"],
        num_cpu_blocks=setup["num_cpu_blocks"], preemption_mode=setup["preemption_mode"],
        max_num_batched_tokens=setup["max_num_batched_tokens"], max_model_len=setup["max_model_len"],
        enable_prefix_caching=setup["enable_prefix_caching"], record_decisions=record_decisions,
    )
    if setup["allocator"] == "paged":
        return Scheduler(config)
    return ContiguousScheduler(config, reservation=setup["allocator"])


def options(setup: dict) -> SimOptions:
    return SimOptions(seed=setup["seed"], sample_lengths=setup["sample_lengths"],
                      overlap_swaps=setup["overlap_swaps"])


def run(trace: Trace, setup: dict):
    records: list[str] = []
    scheduler = build(setup)
    result = Simulation(trace, scheduler, LinearCost(), options(setup), decision_sink=records.append).run()
    return result, records


def sample_lengths(trace: Trace, seed: int, mode: str) -> list[list[int]]:
    """Each request's per-sample output lengths, as the workload module documents them: sample 0
    keeps the trace's length; with "drawn", samples 1..n-1 of an n > 1 request draw theirs from
    the trace's output-length column, rows in arrival order, from default_rng([seed, 1])."""
    rng = np.random.default_rng([seed, 1])
    lengths = []
    for i in range(len(trace)):
        length, n, width = int(trace.output_len[i]), int(trace.n[i]), int(trace.beam_width[i])
        if n > 1 and mode == "drawn":
            drawn = trace.output_len[rng.integers(0, len(trace), size=n - 1)]
            lengths.append([length, *(int(x) for x in drawn)])
        else:
            lengths.append([length] * max(n, width))
    return lengths


# ------------------------------------------------------------------------------ checks
def check_run(trace: Trace, setup: dict, result, records: list[str]) -> None:
    m = result.requests
    s = result.summary
    total = len(trace)
    bs, mml = setup["block_size"], setup["max_model_len"]

    # every request ends completed or rejected; the counts add up
    assert set(m.status.tolist()) <= {COMPLETED, REJECTED}
    assert s["requests_completed"] + s["requests_rejected"] == s["requests_total"] == total
    assert s["requests_completed"] == int((m.status == COMPLETED).sum())
    assert result.scheduler.num_finished_requests == s["requests_completed"]
    assert result.scheduler.num_rejected_requests == s["requests_rejected"]
    assert not result.scheduler.has_unfinished_requests

    # requests that can never fit are rejected (with a reason); the run still ended
    usable = result.scheduler.config.num_usable_gpu_blocks
    for i in range(total):
        prompt = int(trace.prompt_len[i])
        if prompt >= mml or math.ceil(prompt / bs) > usable:
            assert m.status[i] == REJECTED, f"row {i} cannot fit but was not rejected"
        if m.status[i] == REJECTED:
            assert m.reject_reasons[i]

    # generated tokens: every sample its own length (capped by max_model_len)
    done = m.status == COMPLETED
    expected = np.array([sum(min(x, mml - int(trace.prompt_len[i])) for x in lens)
                         for i, lens in enumerate(sample_lengths(trace, setup["seed"], setup["sample_lengths"]))])
    assert m.output_tokens[done].tolist() == expected[done].tolist()
    assert s["generated_tokens"] == int(expected[done].sum())
    assert (m.output_tokens[~done] == 0).all()

    # KV memory never exceeds capacity
    steps = result.steps
    used, allocated = steps.array("used_slots"), steps.array("allocated_slots")
    cached, capacity = steps.array("cached_slots"), steps.array("total_slots")
    assert (0 <= used).all() and (used <= allocated).all() and (allocated <= capacity).all()
    assert (allocated + cached <= capacity).all()
    assert (allocated <= steps.array("unshared_slots")).all()
    if len(steps):
        assert capacity.max() == usable * bs

    # time: steps back to back or idle between; each request's events in order
    start, duration = steps.array("start_s"), steps.array("duration_s")
    assert (duration > 0).all()
    assert (start[1:] >= start[:-1] + duration[:-1] - 1e-9).all()
    assert s["busy_s"] == pytest.approx(float(duration.sum()), rel=1e-5, abs=1e-9)
    assert s["steps"] == len(steps) == len(records)
    arrival, first, token, finish = m.arrival_s[done], m.first_scheduled_s[done], m.first_token_s[done], m.finish_s[done]
    assert (arrival <= first + 1e-9).all() and (first < token).all() and (token <= finish).all()
    if len(steps):
        assert finish.max() == pytest.approx(float(start[-1] + duration[-1]))
    assert np.isnan(m.finish_s[~done]).all()

    # preemptions counted the same three ways
    per_request = int(m.preemptions.sum())
    assert per_request == sum(s["preemptions"].values()) == int(steps.array("preempted").sum())
    if setup["allocator"] != "paged":
        assert per_request == 0 and s["swapped_blocks"] == {"out": 0, "in": 0}
    if setup["num_cpu_blocks"] == 0:
        assert s["preemptions"]["swap"] == 0

    # the decision log: one record per step, in order, naming each finished request once
    parsed = [json.loads(line) for line in records]
    assert [r["step"] for r in parsed] == list(range(len(parsed)))
    finished = [rid for r in parsed for rid in r["finished"]]
    assert sorted(finished) == sorted(f"r{i}" for i in np.flatnonzero(done))


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_paged_runs_end_and_add_up(case):
    trace, setup = case
    result, records = run(trace, setup)
    check_run(trace, setup, result, records)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(allocators=("max", "pow2", "oracle")))
def test_contiguous_runs_end_and_add_up(case):
    trace, setup = case
    result, records = run(trace, setup)
    check_run(trace, setup, result, records)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_same_trace_and_seed_give_the_same_run(case):
    trace, setup = case
    first, first_log = run(trace, setup)
    second, second_log = run(trace, setup)
    assert first.summary == second.summary
    assert first_log == second_log
    for name in ("first_token_s", "finish_s", "output_tokens"):
        np.testing.assert_array_equal(getattr(first.requests, name), getattr(second.requests, name))


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_summary_is_json_and_invariant_to_the_decision_sink(case):
    """Recording the decision log changes nothing about the run; the summary is plain JSON."""
    trace, setup = case
    with_log, _ = run(trace, setup)
    without = Simulation(trace, build(setup, record_decisions=False), LinearCost(), options(setup)).run()
    assert with_log.summary == without.summary
    text = json.dumps(with_log.summary, allow_nan=False)
    assert json.loads(text) == with_log.summary


# ------------------------------------------------------------------- fixed examples
def fixed_setup(**overrides) -> dict:
    setup = {"allocator": "paged", "policy": "pagesim", "block_size": 4, "num_gpu_blocks": 64, "num_cpu_blocks": 0,
             "preemption_mode": "recompute", "max_num_batched_tokens": 8192, "max_model_len": 8192,
             "enable_prefix_caching": False, "seed": 0, "sample_lengths": "drawn", "overlap_swaps": False}
    setup.update(overrides)
    return setup


def parallel_trace() -> Trace:
    return Trace(arrival_s=np.array([0.0, 0.0, 1.0, 2.0]), prompt_len=np.array([6, 9, 4, 12]),
                 output_len=np.array([3, 17, 8, 40]), n=np.array([4, 4, 4, 4]))


def test_different_seeds_draw_different_sample_lengths():
    setup = fixed_setup(enable_prefix_caching=True)
    tr = parallel_trace()
    runs = {seed: run(tr, {**setup, "seed": seed}) for seed in range(4)}
    tokens = {seed: r.summary["generated_tokens"] for seed, (r, _) in runs.items()}
    assert len(set(tokens.values())) > 1, tokens
    assert len({tuple(log) for _, log in runs.values()}) > 1
    # with "same" the seed does not matter: every sample has the trace's length
    same = {seed: run(tr, {**setup, "seed": seed, "sample_lengths": "same"})[0].summary for seed in range(3)}
    assert same[0] == same[1] == same[2]
    assert same[0]["generated_tokens"] == 4 * (3 + 17 + 8 + 40)
    for seed, (result, records) in runs.items():
        check_run(tr, {**setup, "seed": seed}, result, records)


def test_unservable_request_among_others_is_rejected_and_the_run_ends():
    # 8 blocks of 4 tokens: a 40-token prompt can never fit, nor can 8 + 30 tokens at their longest
    # (unless max_model_len caps them).
    tr = Trace(arrival_s=np.array([0.0, 0.0, 0.5, 0.5, 1.0]), prompt_len=np.array([4, 40, 6, 8, 3]),
               output_len=np.array([5, 2, 4, 30, 2]))
    for allocator in ("paged", "max", "pow2", "oracle"):
        setup = fixed_setup(allocator=allocator, num_gpu_blocks=8, num_cpu_blocks=4, preemption_mode="swap")
        if allocator == "max":
            setup["max_model_len"] = 16
        result, records = run(tr, setup)
        check_run(tr, setup, result, records)
        assert result.requests.status[1] == REJECTED
        if allocator == "max":  # capped at max_model_len 16: 8 outputs in a 16-slot slab
            assert result.requests.status[3] == COMPLETED
            assert result.requests.output_tokens[3] == 8
        else:
            assert result.requests.status[3] == REJECTED
        assert result.summary["requests_completed"] == (4 if allocator == "max" else 3)


def test_tight_pool_preempts_and_still_completes_everything():
    # 6 blocks of 2 tokens for four requests growing to 12 tokens: preemption is forced.
    tr = Trace(arrival_s=np.zeros(4), prompt_len=np.array([3, 3, 3, 3]), output_len=np.array([9, 9, 9, 9]))
    for mode, cpu in (("swap", 12), ("recompute", 0), ("swap", 0)):
        setup = fixed_setup(block_size=2, num_gpu_blocks=6, num_cpu_blocks=cpu, preemption_mode=mode)
        result, records = run(tr, setup)
        check_run(tr, setup, result, records)
        assert result.summary["requests_completed"] == 4
        assert sum(result.summary["preemptions"].values()) > 0
        if mode == "swap" and cpu:
            assert result.summary["preemptions"]["swap"] > 0
        else:  # recompute, or swap space too small: falls back to recompute
            assert result.summary["preemptions"]["swap"] == 0


@pytest.mark.parametrize("allocator", ["max", "pow2", "oracle"])
def test_contiguous_baseline_runs_beam_search(allocator):
    """Regression: the replica passed seeded beam choices to every scheduler, and the contiguous
    one refuses them (it never prunes beams), so any beam request crashed the run."""
    tr = Trace(arrival_s=np.array([0.0, 0.0]), prompt_len=np.array([4, 6]), output_len=np.array([5, 3]),
               beam_width=np.array([2, 3]))
    setup = fixed_setup(allocator=allocator, max_model_len=64)
    result, records = run(tr, setup)
    check_run(tr, setup, result, records)


def brute_force_usage(sched: Scheduler):
    """KV usage recounted from every block table: a block holds the tokens its fullest holder wrote."""
    from pagesim.engine.policy.memory.usage import KvUsage

    bs, pool = sched.block_size, sched.pool
    held: dict[int, int] = {}
    unshared = 0
    for request in sched.requests.values():
        for seq in request.live_seqs:
            unshared += len(seq.block_table)
            for i, block in enumerate(seq.block_table):
                held[block] = max(held.get(block, 0), min(bs, seq.num_filled_tokens - i * bs))
    referenced = [b for b in range(pool.first_block_id, pool.num_blocks) if pool.ref_counts[b] > 0]
    assert sorted(held) == referenced
    return KvUsage(total_slots=pool.num_usable_blocks * bs, allocated_slots=len(referenced) * bs,
                   used_slots=sum(held.values()), cached_slots=pool.num_cached_free_blocks * bs,
                   unshared_slots=unshared * bs)


def recounted_run(trace: Trace, setup: dict) -> list:
    scheduler = build(setup)
    fast = scheduler.kv_usage
    checked = []

    def checked_usage():
        usage = fast()
        assert usage == brute_force_usage(scheduler)
        checked.append(usage)
        return usage

    scheduler.kv_usage = checked_usage  # the replica samples memory once per step
    # Skip-ahead counts the usage of the steps it skips without calling kv_usage();
    # tests/test_skip_ahead.py checks those counts equal these, column for column.
    result = Simulation(trace, scheduler, LinearCost(), replace(options(setup), skip_ahead=False)).run()
    assert len(checked) == result.summary["steps"]
    return checked


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@pure_python_only("pagesim.engine.policy.scheduling.scheduler", "the test replaces the scheduler's kv_usage with a checking one")
@settings(max_examples=scaled_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_kv_usage_equals_a_recount_of_every_block_table(case):
    recounted_run(*case)


@pure_python_only("pagesim.engine.policy.scheduling.scheduler", "the test replaces the scheduler's kv_usage with a checking one")
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_kv_usage_recount_with_sharing_and_preemption(mode):
    # four samples per request share their prompt blocks; a tight pool forces preemptions
    setup = fixed_setup(num_gpu_blocks=48, num_cpu_blocks=64, preemption_mode=mode, enable_prefix_caching=True)
    scheduler = build(setup)
    assert Simulation(parallel_trace(), scheduler, LinearCost(), options(setup)).run().summary["preemptions"][mode] == 2
    usages = recounted_run(parallel_trace(), setup)
    assert any(u.unshared_slots > u.allocated_slots for u in usages)  # sharing was there to count
    assert any(u.internal_fragmentation_slots > 0 for u in usages)
