"""The ``vllm-v0`` step order's rules (vLLM 0.6.3; oracle README §5), each on a workload small
enough to follow by hand. The oracle replay (test_oracle.py) checks the same order against vLLM's
own logs; these tests pin the rules down when ``shared/oracle`` is absent."""

from __future__ import annotations

import pytest

from pagesim.engine.oracle.replay import fake_token
from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.scheduling.steps.vllm_v0 import SchedulingBudget, VllmV0Abort, touched_blocks


def v0(**overrides) -> Scheduler:
    settings = dict(block_size=4, num_gpu_blocks=32, num_cpu_blocks=32, max_num_batched_tokens=64, max_model_len=64, watermark=0.0)
    return Scheduler(make_config("vllm-v0", **{**settings, **overrides}))


def run(scheduler: Scheduler, arrivals: list[tuple[int, Request]], steps: int = 200) -> list:
    """Step the scheduler like the oracle loop; returns (swapped before the step, output) per step."""
    pending = sorted(arrivals, key=lambda a: a[0])
    timeline = []
    for step in range(steps):
        while pending and pending[0][0] == step:
            assert scheduler.add_request(pending.pop(0)[1])
        swapped_before = bool(scheduler.swapped)
        out = scheduler.schedule()
        scheduler.update(out, fake_token)
        scheduler.check()
        timeline.append((swapped_before, out))
        if not pending and not scheduler.has_unfinished_requests:
            break
    return timeline


def test_without_chunking_a_step_that_admits_a_prompt_runs_no_decodes():
    """A is decoding when B arrives: step 1 runs B's prefill alone; step 2 decodes both, A first."""
    timeline = run(v0(), [(0, Request("A", prompt_len=4, max_tokens=5)), (1, Request("B", prompt_len=4, max_tokens=5))])
    assert dict(timeline[1][1].num_scheduled_tokens) == {"B": 4}
    assert timeline[2][1].order == ("A", "B")
    # pagesim's (vLLM v1's) order runs the decode beside the prefill
    v1 = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=32, watermark=0.0))
    timeline = run(v1, [(0, Request("A", prompt_len=4, max_tokens=5)), (1, Request("B", prompt_len=4, max_tokens=5))])
    assert dict(timeline[1][1].num_scheduled_tokens) == {"A": 1, "B": 4}


def test_a_decode_counts_one_touched_block_even_when_it_needs_none():
    """3 blocks of 4: A (5-token prompt) holds 2, B (3 tokens) 1, none free. A's next token fits
    in its partial block, but vLLM 0.6.3's can_append counts 1 touched block > 0 free, so the
    running tail B is preempted (recompute: one sequence) and A appends in place."""
    scheduler = v0(num_gpu_blocks=3)
    timeline = run(scheduler, [(0, Request("A", prompt_len=5, max_tokens=2)), (0, Request("B", prompt_len=3, max_tokens=2))])
    step1 = timeline[1][1]
    assert step1.preempted == (("B", "recompute"),)
    assert dict(step1.num_scheduled_tokens) == {"A": 1} and step1.num_free_blocks == 1
    # A finished at step 1; B comes back with its prompt and its one output, re-prefilled whole
    step2 = timeline[2][1]
    assert dict(step2.resumed) == {"B": 0} and dict(step2.num_scheduled_tokens) == {"B": 4}
    # the clean order sees that A needs no block and preempts nobody
    clean = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=3, watermark=0.0, enable_prefix_caching=False))
    timeline = run(clean, [(0, Request("A", prompt_len=5, max_tokens=2)), (0, Request("B", prompt_len=3, max_tokens=2))])
    assert not any(out.preempted for _, out in timeline)


def test_touched_blocks_follows_vllm_formula():
    """1 + ceil((u - f) / block_size): u unwritten tokens, f free slots in the last block."""
    request = Request("A", prompt_len=6, max_tokens=3)
    seq = request.seqs[0]
    for filled, tokens, expected in [(0, 6, 2), (6, 6, 1), (6, 7, 1), (8, 8, 0), (8, 9, 1), (8, 13, 2), (5, 9, 2), (5, 7, 1)]:
        seq.num_filled_tokens = filled
        seq.output_token_ids = [0] * (tokens - 6)
        assert touched_blocks(seq, 4) == expected, (filled, tokens)


def test_without_chunking_nothing_is_admitted_while_a_request_is_swapped_out():
    """r1 (n=2) is swapped out at step 4 and returns at step 9; r2 arrives at step 5 and fits, but
    vLLM 0.6.3 admits no prompt while anything is swapped out."""
    arrivals = [
        (1, Request("r0", prompt_len=5, max_tokens=7, n=2)),
        (2, Request("r1", prompt_len=6, max_tokens=5, n=2)),
        (5, Request("r2", prompt_len=2, max_tokens=2)),
    ]
    timeline = run(v0(block_size=2, num_gpu_blocks=10, max_model_len=32), arrivals)
    assert timeline[4][1].preempted == (("r1", "swap"),)
    blocked = [out.step for swapped, out in timeline if swapped and out.step >= 5]
    assert blocked, "r2 should have waited behind a swapped request"
    for swapped, out in timeline:
        if swapped:
            assert not out.new, f"step {out.step} admitted {dict(out.new)} while a request was swapped out"
    admitted = next(out.step for _, out in timeline if "r2" in out.new)
    assert not timeline[admitted][0] and admitted > 5


def test_with_chunking_prompts_are_admitted_in_a_step_that_preempted_and_come_first():
    """Chunked prefill: vLLM 0.6.3 admits prompts even in a step that preempted; victims rejoin the
    waiting queue only after the step; the output lists admitted prefills before decodes."""
    scheduler = v0(block_size=2, num_gpu_blocks=8, max_num_batched_tokens=16, max_num_seqs=6, max_model_len=32,
                   enable_chunked_prefill=True, preemption_mode="recompute")
    arrivals = [
        (1, Request("r1", prompt_len=4, max_tokens=4)),
        (3, Request("r0", prompt_len=6, max_tokens=8)),
        (3, Request("r2", prompt_len=8, max_tokens=6)),
        (3, Request("r3", prompt_len=6, max_tokens=8)),
    ]
    timeline = run(scheduler, arrivals)
    # step 3: r1 decodes first (running pass), r0 is admitted after, but is listed first
    assert timeline[3][1].order == ("r0", "r1")
    step6 = timeline[6][1]
    assert step6.preempted == (("r2", "recompute"),)
    assert dict(step6.new) == {"r3": 0} and "r2" not in step6.resumed
    assert step6.order == ("r3", "r0")


def test_budget_keys_entries_by_request():
    budget = SchedulingBudget(token_budget=10, max_num_seqs=4)
    budget.add_tokens("a", 6)
    budget.add_tokens("a", 6)  # the same request again: counted once
    budget.add_seqs("a", 3)
    assert (budget.num_tokens, budget.num_seqs, budget.remaining_tokens) == (6, 3, 4)
    assert budget.can_schedule(4, 1) and not budget.can_schedule(5, 1) and not budget.can_schedule(1, 2)
    budget.drop("a")
    budget.drop("never-added")
    assert (budget.num_tokens, budget.num_seqs) == (0, 0)


def test_beam_search_is_rejected_and_prefix_caching_refused_under_the_v0_order():
    scheduler = v0()
    beams = Request("b", prompt_len=4, max_tokens=4, beam_width=2)
    assert not scheduler.add_request(beams)
    assert "beam search is not modelled" in beams.reject_reason
    with pytest.raises(ValueError, match="enable_prefix_caching=False"):
        make_config("vllm-v0", enable_prefix_caching=True)
    with pytest.raises(ValueError, match="step_order must be one of"):
        make_config("pagesim", step_order="vllm-v2")


def test_a_request_swapped_out_mid_prefill_beyond_the_budget_comes_back_chunked():
    """Budget 4. r2 (9-token prompt) has prefilled 3 tokens when it is swapped out at step 9; its
    other 6 exceed the whole budget, and vLLM 0.6.3 never chunks a swap-in, so it would wait
    forever. pagesim swaps it in with a 4-token chunk and everything finishes."""
    scheduler = v0(block_size=4, num_gpu_blocks=7, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=32,
                   enable_chunked_prefill=True, preemption_mode="swap")
    arrivals = [
        (0, Request("r0", prompt_len=8, max_tokens=6)),
        (1, Request("r1", prompt_len=12, max_tokens=4)),
        (1, Request("r3", prompt_len=6, max_tokens=1)),
        (2, Request("r2", prompt_len=9, max_tokens=3)),
    ]
    timeline = run(scheduler, arrivals)
    assert timeline[8][1].num_scheduled_tokens["r2"] == 3
    assert timeline[9][1].preempted == (("r2", "swap"),)
    step10 = timeline[10][1]
    assert step10.swapped_in == ("r2",) and dict(step10.num_scheduled_tokens) == {"r2": 4}
    assert scheduler.num_finished_requests == 4 and scheduler.num_rejected_requests == 0


def test_a_prefill_alone_in_the_pool_is_not_preempted_for_a_block_it_does_not_need():
    """6 blocks of 2, budget 3: an 11-token prompt takes all 6 blocks (the last half full) and
    prefills 3 tokens a step. vLLM 0.6.3 counts the partial last block as touched (1 > 0 free),
    preempts the request itself, re-admits it into the same state and repeats forever; pagesim
    runs the prefill, since it needs no block. Its first decode (step 4) is preempted as vLLM
    does (a decode re-prefills and samples, so vLLM makes progress there): the 12 tokens fill 6
    blocks exactly, and it finishes."""
    scheduler = v0(block_size=2, num_gpu_blocks=6, max_num_batched_tokens=3, max_model_len=32, enable_chunked_prefill=True)
    request = Request("r", prompt_len=11, max_tokens=2)
    timeline = run(scheduler, [(0, request)], steps=50)
    assert [dict(out.num_scheduled_tokens).get("r") for _, out in timeline] == [3, 3, 3, 2, None, 3, 3, 3, 3]
    assert [out.step for _, out in timeline if out.preempted] == [4]
    assert all(out.num_free_blocks == 0 for _, out in timeline if out.num_scheduled_tokens)
    assert request.status.value == "finished"


def test_a_swapped_request_beyond_the_watermark_comes_back_into_an_idle_pool():
    """9 blocks of 2, watermark 1 block. r2 (n=3) is swapped out at step 7; swapping it back needs
    9 blocks (v0 counts full entries plus a touched block per sequence), more than the 8 above the
    watermark, so vLLM 0.6.3 would leave it swapped forever. pagesim brings it back once no block is
    held (step 10); it then outgrows the pool under v0's count and is failed, as vLLM fails a
    swap-in that exceeds the whole pool. Nothing waits forever."""
    scheduler = v0(block_size=2, num_gpu_blocks=9, max_num_seqs=4, max_model_len=32, max_num_batched_tokens=32, watermark=0.2)
    arrivals = [
        (0, Request("r3", prompt_len=1, max_tokens=7)),
        (1, Request("r1", prompt_len=11, max_tokens=1)),
        (2, Request("r0", prompt_len=11, max_tokens=3)),
        (3, Request("r2", prompt_len=4, max_tokens=4, n=3)),
    ]
    timeline = run(scheduler, arrivals)
    assert timeline[7][1].preempted == (("r2", "swap"),)
    assert timeline[10][1].swapped_in == ("r2",) and len(timeline[10][1].blocks_to_swap_in) == 9
    assert scheduler.num_finished_requests == 3 and scheduler.num_rejected_requests == 1
    assert not scheduler.has_unfinished_requests


def test_recomputing_a_multi_sequence_request_stops_like_vllm_and_leaves_the_queues_consistent():
    """preemption_mode 'recompute' with n=2: vLLM 0.6.3 asserts that a recomputed request runs one
    sequence. pagesim raises VllmV0Abort at that preemption; earlier victims of the step are
    requeued, so the scheduler's invariants hold."""
    scheduler = v0(block_size=2, num_gpu_blocks=8, preemption_mode="recompute")
    for i in range(3):
        assert scheduler.add_request(Request(f"r{i}", prompt_len=2, max_tokens=6, n=2))
    with pytest.raises(VllmV0Abort, match="cannot preempt 'r2' by recompute: it has 2 running sequences"):
        for _ in range(20):
            scheduler.update(scheduler.schedule(), fake_token)
    scheduler.check()
