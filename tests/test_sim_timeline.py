"""Hand-checked simulator timelines: tiny traces, a cost model simple enough to add up by hand.

``LinearCost`` charges ``per_step`` seconds for a step that computes anything, plus ``per_token``
per computed token, plus ``per_swap_block`` per block swapped in or out (the ``swap`` term). So a
step computing 4 prompt tokens takes 1.0 + 0.4 = 1.4 s and a decode step of one sequence 1.1 s.

Each test builds a ``Trace`` of 1-4 requests, runs ``Simulation`` and compares the whole step
timeline (start, duration, tokens, requests in the batch) with the one derived in its comment, as
SimPy's own tests compare event logs (``log == [...]``). Times are rounded to 9 decimals before
comparing, so ``1.4 + 1.1`` and ``2.5`` compare equal.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagesim.engine.policy import ContiguousScheduler, Scheduler, make_config
from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.metrics import COMPLETED, REJECTED
from pagesim.sim.simulator import SimOptions, Simulation
from pagesim.traces.trace import Trace


class LinearCost(CostModel):
    """per_step + per_token x tokens seconds of compute; per_swap_block x blocks of swap."""

    name = "linear (tests)"

    def __init__(self, per_step: float = 1.0, per_token: float = 0.1, per_swap_block: float = 0.5):
        self.per_step = per_step
        self.per_token = per_token
        self.per_swap_block = per_swap_block

    def step_cost(self, work: StepWork) -> StepCost:
        terms = dict.fromkeys(TERMS, 0.0)
        if work.num_tokens:
            terms["linear"] = self.per_step + self.per_token * work.num_tokens
        terms["swap"] = self.per_swap_block * (work.num_swap_out_blocks + work.num_swap_in_blocks)
        return StepCost(terms)


def trace(arrivals, prompts, outputs, **columns) -> Trace:
    return Trace(arrival_s=np.array(arrivals, dtype=float), prompt_len=np.array(prompts),
                 output_len=np.array(outputs), **columns)


def paged(**overrides) -> Scheduler:
    settings = {"num_gpu_blocks": 32, "block_size": 4, "enable_prefix_caching": False, "record_decisions": True}
    settings.update(overrides)
    return Scheduler(make_config("pagesim", **settings))


def simulate(tr: Trace, scheduler=None, cost: CostModel | None = None, **options):
    """(result, decision records) of one run."""
    records: list[str] = []
    sim = Simulation(tr, scheduler if scheduler is not None else paged(), cost or LinearCost(),
                     SimOptions(**options), decision_sink=records.append)
    result = sim.run()
    return result, [json.loads(line) for line in records]


def r9(x: float) -> float:
    return round(float(x), 9)


def timeline(result) -> list[tuple]:
    """(start, duration, tokens, requests in the batch) per step."""
    s = result.steps
    return [(r9(a), r9(d), int(t), int(n)) for a, d, t, n in zip(
        s.array("start_s"), s.array("duration_s"), s.array("num_tokens"), s.array("num_requests"))]


def times(values) -> list[float]:
    return [r9(v) for v in values]


def time_avg(values, weights) -> float:
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


# --------------------------------------------------------------------------- one request
def test_single_request_prefill_then_decodes():
    # Prompt of 4 (one block of 4), 3 output tokens: a 4-token prefill that samples token 1 at
    # t = 1.4, then two decode steps of 1.1 s; it finishes at 3.6.
    result, records = simulate(trace([0.0], [4], [3]))
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.1, 1, 1), (2.5, 1.1, 1, 1)]
    m = result.requests
    assert m.status.tolist() == [COMPLETED]
    assert times(m.first_scheduled_s) == [0.0]
    assert times(m.first_token_s) == [1.4]
    assert times(m.finish_s) == [3.6]
    assert m.output_tokens.tolist() == [3] and m.generation_len.tolist() == [3]

    s = result.summary
    assert s["requests_total"] == 1 and s["requests_completed"] == 1 and s["requests_rejected"] == 0
    assert s["steps"] == 3 and s["generated_tokens"] == 3
    assert s["duration_s"] == pytest.approx(3.6) and s["busy_s"] == pytest.approx(3.6)
    assert s["ttft_s"]["mean"] == pytest.approx(1.4)
    assert s["tpot_s"]["mean"] == pytest.approx((3.6 - 1.4) / 2)  # 1.1: two decode steps
    assert s["e2e_s"]["p50"] == pytest.approx(3.6)
    assert s["queueing_s"]["mean"] == pytest.approx(0.0)
    assert s["normalized_latency_s_per_token"] == pytest.approx(3.6 / 3, rel=1e-5)
    assert s["throughput_rps"] == pytest.approx(1 / 3.6, rel=1e-5)
    assert s["throughput_tokens_s"] == pytest.approx(3 / 3.6, rel=1e-5)
    assert s["avg_batched_requests"] == pytest.approx(1.0)
    # KV slots while each step runs: [4 of 4 used], then 2 blocks (8 slots) holding 5, then 6.
    assert result.steps.array("allocated_slots").tolist() == [4, 8, 8]
    assert result.steps.array("used_slots").tolist() == [4, 5, 6]
    assert result.steps.array("total_slots").tolist() == [128, 128, 128]
    durations = [1.4, 1.1, 1.1]
    assert s["memory_utilization"] == pytest.approx(time_avg([4 / 4, 5 / 8, 6 / 8], durations), rel=1e-5)
    assert s["memory_allocated_fraction"] == pytest.approx(time_avg([4 / 128, 8 / 128, 8 / 128], durations),
                                                           rel=1e-5)
    assert s["time_by_term_s"]["linear"] == pytest.approx(3.6) and s["time_by_term_s"]["swap"] == 0.0
    assert s["preemptions"] == {"swap": 0, "recompute": 0}

    # one decision record per step, streamed with its finished requests filled in
    assert [(r["step"], r["scheduled"], r["finished"]) for r in records] == [
        (0, {"r0": 4}, []), (1, {"r0": 1}, []), (2, {"r0": 1}, ["r0"]),
    ]
    assert records[0]["new"] == {"r0": 0}


def test_output_of_one_token_finishes_at_the_prefill():
    result, _ = simulate(trace([0.0], [8], [1]))
    assert timeline(result) == [(0.0, 1.8, 8, 1)]
    m = result.requests
    assert times(m.first_token_s) == times(m.finish_s) == [1.8]
    # TPOT needs two tokens: none here
    assert np.isnan(m.tpot_s()[0])
    assert result.summary["tpot_s"]["mean"] is None


# ------------------------------------------------------------------------------ arrivals
def test_arrival_during_a_step_is_seen_by_the_next_step():
    # r1 arrives at 0.5 while step 0 (r0's prefill, 0 - 1.4) runs; step 1 at 1.4 batches r0's
    # decode with r1's 8-token prefill (9 tokens, 1.9 s); step 2 decodes both (1.2 s).
    result, records = simulate(trace([0.0, 0.5], [4, 8], [3, 2]))
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.9, 9, 2), (3.3, 1.2, 2, 2)]
    m = result.requests
    assert times(m.arrival_s) == [0.0, 0.5]
    assert times(m.first_scheduled_s) == [0.0, 1.4]
    assert times(m.first_token_s) == [1.4, 3.3]
    assert times(m.finish_s) == [4.5, 4.5]
    assert [r["scheduled"] for r in records] == [{"r0": 4}, {"r0": 1, "r1": 8}, {"r0": 1, "r1": 1}]
    assert records[1]["new"] == {"r1": 0}

    s = result.summary
    assert s["queueing_s"]["mean"] == pytest.approx((0.0 + 0.9) / 2)
    assert s["ttft_s"]["mean"] == pytest.approx((1.4 + 2.8) / 2)
    assert s["e2e_s"]["mean"] == pytest.approx((4.5 + 4.0) / 2)
    assert s["tpot_s"]["mean"] == pytest.approx(((4.5 - 1.4) / 2 + (4.5 - 3.3) / 1) / 2)
    assert s["normalized_latency_s_per_token"] == pytest.approx((4.5 / 3 + 4.0 / 2) / 2, rel=1e-5)
    assert s["throughput_rps"] == pytest.approx(2 / 4.5, rel=1e-5)
    assert s["throughput_tokens_s"] == pytest.approx(5 / 4.5, rel=1e-5)
    durations = [1.4, 1.9, 1.2]
    assert s["avg_batched_requests"] == pytest.approx(time_avg([1, 2, 2], durations), rel=1e-5)
    # step 1: r0 has 5 tokens in 2 blocks, r1 8 in 2; step 2: 6 in 2 and 9 in 3
    assert result.steps.array("allocated_slots").tolist() == [4, 16, 20]
    assert result.steps.array("used_slots").tolist() == [4, 13, 15]
    assert s["memory_utilization"] == pytest.approx(time_avg([1.0, 13 / 16, 15 / 20], durations), rel=1e-5)


def test_requests_arriving_together_share_the_first_step():
    result, records = simulate(trace([0.0, 0.0, 0.0], [4, 4, 8], [1, 2, 1]))
    # one prefill step of 16 tokens (2.6 s) for all three; r1 then decodes once
    assert timeline(result) == [(0.0, 2.6, 16, 3), (2.6, 1.1, 1, 1)]
    assert records[0]["order"] == ["r0", "r1", "r2"]
    assert records[0]["new"] == {"r0": 0, "r1": 0, "r2": 0}
    assert records[0]["finished"] == ["r0", "r2"]
    assert times(result.requests.finish_s) == [2.6, 3.7, 2.6]
    assert result.summary["avg_batched_requests"] == pytest.approx(time_avg([3, 1], [2.6, 1.1]), rel=1e-5)


def test_idle_replica_starts_a_late_request_at_its_arrival():
    # r0 is done at 1.4; the replica then sleeps until r1 arrives at 5.0.
    result, _ = simulate(trace([0.0, 5.0], [4, 4], [1, 2]))
    assert timeline(result) == [(0.0, 1.4, 4, 1), (5.0, 1.4, 4, 1), (6.4, 1.1, 1, 1)]
    m = result.requests
    assert times(m.first_scheduled_s) == [0.0, 5.0]
    assert times(m.finish_s) == [1.4, 7.5]
    s = result.summary
    assert s["duration_s"] == pytest.approx(7.5)  # first arrival to last completion, idle time included
    assert s["busy_s"] == pytest.approx(1.4 + 1.4 + 1.1)
    assert s["throughput_rps"] == pytest.approx(2 / 7.5, rel=1e-5)
    assert s["queueing_s"]["p99"] == pytest.approx(0.0)
    assert s["tpot_s"]["mean"] == pytest.approx(1.1)  # r0 made one token: only r1 counts
    assert s["avg_batched_requests"] == pytest.approx(1.0)  # averaged over busy time only


def test_arrival_at_a_step_end_is_seen_consistently():
    cost = LinearCost(per_step=1.0, per_token=0.25)
    # step 0: r0's prefill [0, 2.0]; step 1: r0 decode + r1's prefill (5 tokens) [2.0, 4.25];
    # r2 arrives at 3.0 (during step 1) and r3 at exactly 4.25: step 2 should admit both.
    result, _ = simulate(trace([0.0, 1.0, 3.0, 4.25], [4, 4, 4, 4], [5, 5, 5, 5]), cost=cost)
    assert timeline(result)[:3] == [(0.0, 2.0, 4, 1), (2.0, 2.25, 5, 2), (4.25, 1.0 + 0.25 * 10, 10, 4)]


def test_arrival_at_a_step_end_is_seen_by_the_next_step():
    # The same tie in the other SimPy history: r1's arrival
    # at 2.0 (when step 0 ends) is in step 1.
    cost = LinearCost(per_step=1.0, per_token=0.25)
    result, _ = simulate(trace([0.0, 2.0], [4, 4], [3, 2]), cost=cost)
    assert timeline(result) == [(0.0, 2.0, 4, 1), (2.0, 2.25, 5, 2), (4.25, 1.5, 2, 2)]


# ------------------------------------------------------------------------ batch limits
def test_batch_limit_queues_the_second_request():
    # max_num_seqs=1: r1 (arrived at 0) waits until r0 finishes at 2.5.
    result, _ = simulate(trace([0.0, 0.0], [4, 4], [2, 2]), paged(max_num_seqs=1))
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.1, 1, 1), (2.5, 1.4, 4, 1), (3.9, 1.1, 1, 1)]
    m = result.requests
    assert times(m.first_scheduled_s) == [0.0, 2.5]
    assert times(m.first_token_s) == [1.4, 3.9]
    assert times(m.finish_s) == [2.5, 5.0]
    s = result.summary
    assert s["queueing_s"]["mean"] == pytest.approx(2.5 / 2)
    assert s["ttft_s"]["mean"] == pytest.approx((1.4 + 3.9) / 2)


def test_chunked_prefill_samples_only_after_the_last_chunk():
    # A 10-token prompt under a 6-token budget: chunks of 6 (1.6 s, nothing sampled) and 4
    # (1.4 s, first token at 3.0), then one decode.
    result, _ = simulate(trace([0.0], [10], [2]), paged(max_num_batched_tokens=6))
    assert timeline(result) == [(0.0, 1.6, 6, 1), (1.6, 1.4, 4, 1), (3.0, 1.1, 1, 1)]
    assert times(result.requests.first_token_s) == [3.0]
    assert times(result.requests.finish_s) == [4.1]
    assert result.steps.array("prefill_tokens").tolist() == [6, 4, 0]
    assert result.steps.array("decode_seqs").tolist() == [0, 0, 1]


# ------------------------------------------------------------------------- preemption
def swap_case(per_swap_block: float, overlap: bool):
    """Two 4-token prompts generating 6 tokens each in 4 blocks of 4: each grows to 2 blocks by
    step 1; at step 5 r0 needs a third block, so r1 (the running tail) is swapped out (2 blocks)
    and r0 decodes alone, finishing; step 6 swaps r1 back in (2 blocks) and it finishes."""
    scheduler = paged(num_gpu_blocks=4, num_cpu_blocks=8, preemption_mode="swap")
    return simulate(trace([0.0, 0.0], [4, 4], [6, 6]), scheduler, LinearCost(per_swap_block=per_swap_block),
                    overlap_swaps=overlap)


@pytest.mark.parametrize(
    ("per_swap_block", "overlap", "swap_step_s"),
    [
        (0.5, False, 1.1 + 1.0),  # synchronous: swap (2 blocks x 0.5) then compute (1.1)
        (0.5, True, 1.1),  # overlapped: max(compute 1.1, swap 1.0)
        (2.0, False, 1.1 + 4.0),
        (2.0, True, 4.0),  # overlapped: max(compute 1.1, swap 4.0)
    ],
)
def test_swap_time_added_or_overlapped(per_swap_block, overlap, swap_step_s):
    result, records = swap_case(per_swap_block, overlap)
    t5 = 6.6  # 1.8 (both prefills) + 4 x 1.2 (both decoding)
    t6 = t5 + swap_step_s
    assert timeline(result) == [
        (0.0, 1.8, 8, 2), (1.8, 1.2, 2, 2), (3.0, 1.2, 2, 2), (4.2, 1.2, 2, 2), (5.4, 1.2, 2, 2),
        (t5, r9(swap_step_s), 1, 1), (r9(t6), r9(swap_step_s), 1, 1),
    ]
    assert records[5]["preempted_mode"] == {"r1": "swap"} and records[5]["finished"] == ["r0"]
    assert records[6]["swapped_in"] == ["r1"] and records[6]["finished"] == ["r1"]
    steps = result.steps
    assert steps.array("swap_out_blocks").tolist() == [0, 0, 0, 0, 0, 2, 0]
    assert steps.array("swap_in_blocks").tolist() == [0, 0, 0, 0, 0, 0, 2]
    assert steps.array("preempted").tolist() == [0, 0, 0, 0, 0, 1, 0]
    assert times(steps.array("swap_s")) == [0.0] * 5 + [r9(2 * per_swap_block)] * 2
    m = result.requests
    assert times(m.finish_s) == [r9(t6), r9(t6 + swap_step_s)]
    assert m.preemptions.tolist() == [0, 1]
    assert m.output_tokens.tolist() == [6, 6]
    s = result.summary
    assert s["preemptions"] == {"swap": 1, "recompute": 0}
    assert s["swapped_blocks"] == {"out": 2, "in": 2}
    # KV memory never beyond the 16 slots
    assert steps.array("allocated_slots").max() <= 16
    # the swap term is reported whether or not it overlapped
    assert s["time_by_term_s"]["swap"] == pytest.approx(4 * per_swap_block)


def test_recompute_preemption_reprefills_prompt_and_outputs():
    # As in the swap case, but r1 is dropped at step 5 and re-prefills its 4 + 5 tokens at
    # step 6 (1.9 s), which samples its 6th and last token.
    scheduler = paged(num_gpu_blocks=4, preemption_mode="recompute")
    result, records = simulate(trace([0.0, 0.0], [4, 4], [6, 6]), scheduler)
    assert timeline(result) == [
        (0.0, 1.8, 8, 2), (1.8, 1.2, 2, 2), (3.0, 1.2, 2, 2), (4.2, 1.2, 2, 2), (5.4, 1.2, 2, 2),
        (6.6, 1.1, 1, 1), (7.7, 1.9, 9, 1),
    ]
    assert records[5]["preempted_mode"] == {"r1": "recompute"}
    assert records[6]["resumed"] == ["r1"] and records[6]["scheduled"] == {"r1": 9}
    m = result.requests
    assert times(m.first_scheduled_s) == [0.0, 0.0]  # a resume is not a first scheduling
    assert times(m.first_token_s) == [1.8, 1.8]  # nor a first token
    assert times(m.finish_s) == [7.7, 9.6]
    assert m.preemptions.tolist() == [0, 1]
    assert result.summary["preemptions"] == {"swap": 0, "recompute": 1}
    assert result.summary["swapped_blocks"] == {"out": 0, "in": 0}


# -------------------------------------------------------------------------- rejection
def test_request_larger_than_the_pool_is_rejected_and_the_rest_runs():
    # 4 blocks of 4 tokens: a 20-token prompt can never fit.
    scheduler = paged(num_gpu_blocks=4)
    result, records = simulate(trace([0.0, 0.0], [20, 4], [2, 2]), scheduler)
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.1, 1, 1)]
    m = result.requests
    assert m.status.tolist() == [REJECTED, COMPLETED]
    assert "blocks" in m.reject_reasons[0]
    assert np.isnan(m.finish_s[0]) and np.isnan(m.first_scheduled_s[0])
    assert list(records[0]["rejected"]) == ["r0"]
    s = result.summary
    assert (s["requests_completed"], s["requests_rejected"], s["requests_total"]) == (1, 1, 2)
    assert s["e2e_s"]["mean"] == pytest.approx(2.5)  # over completed requests only


def test_run_of_only_rejected_requests_ends_without_steps():
    result, records = simulate(trace([0.0, 1.0], [20, 30], [2, 2]), paged(num_gpu_blocks=4))
    assert timeline(result) == [] and records == []
    s = result.summary
    assert (s["requests_completed"], s["requests_rejected"]) == (0, 2)
    assert s["throughput_rps"] is None and s["ttft_s"]["mean"] is None and s["steps"] == 0


# ------------------------------------------------------------------------- contiguous
def test_contiguous_max_reservation_timeline():
    # Orca (Max) with max_model_len 16 in 32 slots: every request reserves 16 slots, so only two
    # of three fit; r2 waits for both (they finish together at 4.2).
    config = make_config("pagesim", num_gpu_blocks=8, block_size=4, max_model_len=16,
                         max_num_batched_tokens=16, record_decisions=True)
    scheduler = ContiguousScheduler(config, reservation="max")
    result, records = simulate(trace([0.0, 0.0, 0.0], [4, 4, 4], [3, 3, 3]), scheduler)
    assert timeline(result) == [
        (0.0, 1.8, 8, 2), (1.8, 1.2, 2, 2), (3.0, 1.2, 2, 2),
        (4.2, 1.4, 4, 1), (5.6, 1.1, 1, 1), (6.7, 1.1, 1, 1),
    ]
    assert records[0]["slabs"] == {"r0": [[0, 16]], "r1": [[16, 16]]}
    assert records[3]["new"] == {"r2": 0}
    m = result.requests
    assert times(m.first_scheduled_s) == [0.0, 0.0, 4.2]
    assert times(m.finish_s) == [4.2, 4.2, 7.8]
    steps = result.steps
    assert steps.array("allocated_slots").tolist() == [32, 32, 32, 16, 16, 16]
    assert steps.array("used_slots").tolist() == [8, 10, 12, 4, 5, 6]
    durations = [1.8, 1.2, 1.2, 1.4, 1.1, 1.1]
    assert result.summary["memory_utilization"] == pytest.approx(
        time_avg([8 / 32, 10 / 32, 12 / 32, 4 / 16, 5 / 16, 6 / 16], durations), rel=1e-5)


def test_contiguous_oracle_reserves_exactly_prompt_plus_output():
    config = make_config("pagesim", num_gpu_blocks=8, block_size=4, max_model_len=16,
                         max_num_batched_tokens=16, record_decisions=True)
    scheduler = ContiguousScheduler(config, reservation="oracle")
    result, records = simulate(trace([0.0, 0.0, 0.0], [4, 4, 4], [3, 3, 3]), scheduler)
    # 7 slots each: all three fit in 32 at once
    assert timeline(result) == [(0.0, 2.2, 12, 3), (2.2, 1.3, 3, 3), (3.5, 1.3, 3, 3)]
    assert records[0]["slabs"] == {"r0": [[0, 7]], "r1": [[7, 7]], "r2": [[14, 7]]}
    assert result.steps.array("allocated_slots").tolist() == [21, 21, 21]
    assert result.steps.array("used_slots").tolist() == [12, 15, 18]


# ----------------------------------------------------------------------- parallel samples
def test_parallel_samples_of_the_same_length_share_the_prompt():
    # n=2, "same": both samples end at 3 tokens. The prefill samples twice (fork), then each
    # decode step computes one token per sample (2 tokens, 1.2 s).
    tr = trace([0.0], [4], [3], n=np.array([2]))
    result, records = simulate(tr, sample_lengths="same")
    assert timeline(result) == [(0.0, 1.4, 4, 1), (1.4, 1.2, 2, 1), (2.6, 1.2, 2, 1)]
    m = result.requests
    assert m.output_tokens.tolist() == [6] and m.generation_len.tolist() == [3]
    assert result.summary["generated_tokens"] == 6
    assert result.summary["throughput_tokens_s"] == pytest.approx(6 / 3.8, rel=1e-5)
    assert records[1]["block_ids"]["r0"].keys() == {"0", "1"}
    # the prompt's full block is shared by both samples, each has its own second block: 3 blocks
    # allocated where 4 would be without sharing
    assert result.steps.array("allocated_slots").tolist() == [4, 12, 12]
    assert result.steps.array("unshared_slots").tolist() == [4, 16, 16]
    assert result.steps.array("used_slots").tolist() == [4, 6, 8]
    assert result.summary["sharing_saved"] == pytest.approx(time_avg([0.0, 0.25, 0.25], [1.4, 1.2, 1.2]),
                                                            rel=1e-5)
