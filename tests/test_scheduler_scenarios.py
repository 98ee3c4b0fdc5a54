"""Whole decision timelines on small workloads, derived by hand from the rules in scheduler.py.

Blocks are handed out LIFO (a released table goes to the front of the free list, its last block
first), so every block id below is predictable. Each test states the scenario it pins down.
"""

from __future__ import annotations

import pytest

from pagesim.engine.policy import CostPreemption, Request, Scheduler, SwapSpaceExhausted, make_config

TIMELINE_KEYS = (
    "step",
    "scheduled",
    "preempted",
    "preempted_mode",
    "resumed",
    "swapped_in",
    "finished",
    "block_ids",
    "blocks_to_copy",
    "blocks_to_swap_out",
    "blocks_to_swap_in",
    "num_free_blocks",
)


def run_to_end(scheduler: Scheduler, max_steps: int = 1000) -> list[dict]:
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            break
        out = scheduler.schedule()
        scheduler.update(out)
        scheduler.check()
    assert not scheduler.has_unfinished_requests, "did not finish"
    return [{k: r[k] for k in TIMELINE_KEYS if r[k] or k == "step"} for r in scheduler.decision_log]


def small(**overrides) -> Scheduler:
    settings = dict(
        block_size=2,
        num_gpu_blocks=4,
        num_cpu_blocks=4,
        watermark=0.0,
        enable_prefix_caching=False,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
    )
    settings.update(overrides)
    return Scheduler(make_config("pagesim", **settings))


def three_requests(scheduler: Scheduler) -> Scheduler:
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", prompt_len=2, max_tokens=4))
    return scheduler


def test_recompute_preemption_sequence():
    """4 blocks of 2 tokens, three 2-token prompts generating 4 tokens each. At step 1 r1 cannot
    grow: the running tail r2 loses its block and waits at the queue's front; at step 3 r1 is the
    tail and goes too, ahead of r2. Resumed requests re-prefill prompt + generated tokens."""
    assert run_to_end(three_requests(small(preemption_mode="recompute"))) == [
        {"step": 0, "scheduled": {"r0": 2, "r1": 2, "r2": 2},
         "block_ids": {"r0": {"0": [0]}, "r1": {"0": [1]}, "r2": {"0": [2]}}, "num_free_blocks": 1},
        {"step": 1, "scheduled": {"r0": 1, "r1": 1}, "preempted": ["r2"], "preempted_mode": {"r2": "recompute"},
         "block_ids": {"r0": {"0": [0, 3]}, "r1": {"0": [1, 2]}}},
        {"step": 2, "scheduled": {"r0": 1, "r1": 1}, "block_ids": {"r0": {"0": [0, 3]}, "r1": {"0": [1, 2]}}},
        {"step": 3, "scheduled": {"r0": 1}, "preempted": ["r1"], "preempted_mode": {"r1": "recompute"},
         "finished": ["r0"], "block_ids": {"r0": {"0": [0, 3, 2]}}, "num_free_blocks": 1},
        {"step": 4, "scheduled": {"r1": 5}, "resumed": ["r1"], "finished": ["r1"],
         "block_ids": {"r1": {"0": [2, 3, 0]}}, "num_free_blocks": 1},
        {"step": 5, "scheduled": {"r2": 3}, "resumed": ["r2"], "block_ids": {"r2": {"0": [0, 3]}}, "num_free_blocks": 2},
        {"step": 6, "scheduled": {"r2": 1}, "block_ids": {"r2": {"0": [0, 3]}}, "num_free_blocks": 2},
        {"step": 7, "scheduled": {"r2": 1}, "finished": ["r2"], "block_ids": {"r2": {"0": [0, 3, 2]}}, "num_free_blocks": 1},
    ]


def test_swap_preemption_sequence():
    """The same workload with swap: victims' blocks go to CPU blocks (LIFO ids from 0) and come
    back to fresh GPU blocks when the swapped queue's head fits, oldest swap first."""
    assert run_to_end(three_requests(small(preemption_mode="swap"))) == [
        {"step": 0, "scheduled": {"r0": 2, "r1": 2, "r2": 2},
         "block_ids": {"r0": {"0": [0]}, "r1": {"0": [1]}, "r2": {"0": [2]}}, "num_free_blocks": 1},
        {"step": 1, "scheduled": {"r0": 1, "r1": 1}, "preempted": ["r2"], "preempted_mode": {"r2": "swap"},
         "block_ids": {"r0": {"0": [0, 3]}, "r1": {"0": [1, 2]}}, "blocks_to_swap_out": [[2, 0]]},
        {"step": 2, "scheduled": {"r0": 1, "r1": 1}, "block_ids": {"r0": {"0": [0, 3]}, "r1": {"0": [1, 2]}}},
        {"step": 3, "scheduled": {"r0": 1}, "preempted": ["r1"], "preempted_mode": {"r1": "swap"},
         "finished": ["r0"], "block_ids": {"r0": {"0": [0, 3, 2]}},
         "blocks_to_swap_out": [[1, 1], [2, 2]], "num_free_blocks": 1},
        {"step": 4, "scheduled": {"r2": 1}, "swapped_in": ["r2"], "block_ids": {"r2": {"0": [2, 3]}},
         "blocks_to_swap_in": [[0, 2]], "num_free_blocks": 2},
        {"step": 5, "scheduled": {"r2": 1}, "block_ids": {"r2": {"0": [2, 3]}}, "num_free_blocks": 2},
        {"step": 6, "scheduled": {"r2": 1}, "finished": ["r2"], "block_ids": {"r2": {"0": [2, 3, 0]}}, "num_free_blocks": 1},
        {"step": 7, "scheduled": {"r1": 1}, "swapped_in": ["r1"], "finished": ["r1"],
         "block_ids": {"r1": {"0": [0, 3, 2]}}, "blocks_to_swap_in": [[1, 0], [2, 3]], "num_free_blocks": 1},
    ]


def fork_run(n: int) -> list[dict]:
    scheduler = small(block_size=4, num_gpu_blocks=16)
    scheduler.add_request(Request("a", prompt_len=6, max_tokens=4, n=n))
    return run_to_end(scheduler)


def test_copy_on_write_pairs_for_two_samples():
    """A 6-token prompt (one full block, one half block) sampled twice: the samples share both
    blocks; the first write into the shared half block copies it for the parent (appended first),
    the child keeps the original; full block 0 stays shared to the end."""
    assert fork_run(2) == [
        {"step": 0, "scheduled": {"a": 6}, "block_ids": {"a": {"0": [0, 1]}}, "num_free_blocks": 14},
        {"step": 1, "scheduled": {"a": 2}, "block_ids": {"a": {"0": [0, 2], "1": [0, 1]}},
         "blocks_to_copy": [[1, 2]], "num_free_blocks": 13},
        {"step": 2, "scheduled": {"a": 2}, "block_ids": {"a": {"0": [0, 2], "1": [0, 1]}}, "num_free_blocks": 13},
        {"step": 3, "scheduled": {"a": 2}, "finished": ["a"],
         "block_ids": {"a": {"0": [0, 2, 3], "1": [0, 1, 4]}}, "num_free_blocks": 11},
    ]


def test_copy_on_write_pairs_for_three_samples():
    """With n = 3 the parent and the first child each copy the shared half block (vLLM v0's order);
    the last holder writes in place."""
    timeline = fork_run(3)
    assert timeline[1]["blocks_to_copy"] == [[1, 2], [1, 3]]
    assert timeline[1]["block_ids"] == {"a": {"0": [0, 2], "1": [0, 3], "2": [0, 1]}}
    assert all("blocks_to_copy" not in t for t in timeline[2:])


def test_prefix_hit_reuses_blocks_and_recomputes_the_last_token():
    """Two requests with the same 8-token prompt (two full blocks of 4): the second hits only the
    first block, because the hit never covers the last prompt token (vLLM v1)."""
    scheduler = Scheduler(make_config("vllm-v1", block_size=4, num_gpu_blocks=16, max_num_batched_tokens=64))
    prompt = list(range(100, 108))
    scheduler.add_request(Request("a", prompt_len=8, prompt_token_ids=prompt, max_tokens=2))
    out = scheduler.schedule()
    scheduler.update(out)
    scheduler.add_request(Request("b", prompt_len=8, prompt_token_ids=prompt, max_tokens=2))
    out = scheduler.schedule()
    assert dict(out.new) == {"b": 4}
    assert dict(out.num_scheduled_tokens) == {"a": 1, "b": 4}
    tables = {s.request_id: s.block_table for s in out.scheduled}
    assert tables["b"][0] == tables["a"][0]  # shared full block
    assert tables["b"][1] != tables["a"][1]
    scheduler.check()


def test_chunked_prefill_splits_a_prompt_over_steps_within_the_token_budget():
    scheduler = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=16, max_num_batched_tokens=5))
    scheduler.add_request(Request("a", prompt_len=12, max_tokens=1))
    chunks = []
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        chunks.append((out.num_scheduled_tokens["a"], [s.samples for s in out.scheduled]))
        scheduler.update(out)
    assert chunks == [(5, [False]), (5, [False]), (2, [True])]


def test_without_chunked_prefill_the_head_waits_for_the_whole_budget():
    scheduler = Scheduler(
        make_config(
            "pagesim", block_size=4, num_gpu_blocks=64, max_num_batched_tokens=10, max_model_len=10, enable_chunked_prefill=False
        )
    )
    scheduler.add_request(Request("a", prompt_len=6, max_tokens=3))
    scheduler.add_request(Request("b", prompt_len=6, max_tokens=3))
    scheduler.add_request(Request("c", prompt_len=2, max_tokens=3))
    out = scheduler.schedule()
    # b does not fit beside a and, FIFO, c may not overtake it
    assert dict(out.num_scheduled_tokens) == {"a": 6}


@pytest.mark.parametrize(
    "request_kwargs, config, reason",
    [
        (dict(prompt_len=100, max_tokens=1), dict(max_model_len=64), "no room for output within max_model_len"),
        (dict(prompt_len=64, max_tokens=1), dict(max_model_len=64), "no room for output within max_model_len"),
        (dict(prompt_len=40, max_tokens=40), dict(max_model_len=128, num_gpu_blocks=8), "at its longest"),
        (dict(prompt_len=12, max_tokens=1), dict(num_gpu_blocks=4, block_size=4, watermark=0.5, watermark_only_when_running=False), "above the watermark"),
    ],
)
def test_requests_that_can_never_fit_are_rejected_with_a_reason(request_kwargs, config, reason):
    settings = dict(block_size=8, num_gpu_blocks=64, max_model_len=256, max_num_batched_tokens=256)
    settings.update(config)
    scheduler = Scheduler(make_config("pagesim", **settings))
    request = Request("x", **request_kwargs)
    assert scheduler.add_request(request) is False
    assert reason in request.reject_reason
    out = scheduler.schedule()
    assert reason in out.rejected["x"]
    assert not scheduler.has_unfinished_requests
    assert scheduler.decision_log[-1]["rejected"] == {"x": request.reject_reason}


def test_watermark_holds_back_admission_but_not_growth():
    scheduler = Scheduler(
        make_config("pagesim", block_size=2, num_gpu_blocks=8, watermark=0.3, max_num_batched_tokens=64)
    )  # floor(0.3 * 8) = 2 blocks of watermark
    scheduler.add_request(Request("a", prompt_len=8, max_tokens=6))  # 4 blocks now, 7 at its longest
    scheduler.add_request(Request("b", prompt_len=8, max_tokens=1))  # needs 4 + 2 free to start
    admitted, free_while_a_runs = [], []
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        admitted.extend(out.new)
        if "a" in out.num_scheduled_tokens:
            free_while_a_runs.append(scheduler.pool.num_free_blocks)
        scheduler.update(out)
    assert admitted == ["a", "b"]
    assert free_while_a_runs == [4, 3, 3, 2, 2, 1]  # a grows into the watermark; b waits for it
    assert scheduler.decision_log[6]["new"] == {"b": 0}


def test_priority_victim_preempts_the_least_important_request():
    scheduler = small(victim_policy="priority")
    scheduler.add_request(Request("r0", prompt_len=2, max_tokens=4, priority=0))
    scheduler.add_request(Request("r1", prompt_len=2, max_tokens=4, priority=5))
    scheduler.add_request(Request("r2", prompt_len=2, max_tokens=4, priority=1))
    scheduler.update(scheduler.schedule())
    out = scheduler.schedule()
    # r0 needs a block (takes the last); r1 needs one: the victim is r1 itself (priority 5)
    assert out.preempted == (("r1", "recompute"),)
    assert list(out.num_scheduled_tokens) == ["r0", "r2"]


def test_cost_mode_picks_the_cheaper_of_swap_and_recompute():
    calls = []

    def cost(request, mode, num_blocks, num_tokens):
        calls.append((request.request_id, mode, num_blocks, num_tokens))
        return 1.0 if mode == "swap" else 2.0

    scheduler = three_requests(small(preemption_mode=CostPreemption(cost)))
    scheduler.update(scheduler.schedule())
    out = scheduler.schedule()
    assert out.preempted == (("r2", "swap"),)
    assert calls == [("r2", "swap", 1, 3), ("r2", "recompute", 1, 3)]


def test_full_swap_pool_falls_back_to_recompute():
    scheduler = three_requests(small(preemption_mode="swap", num_cpu_blocks=0))
    scheduler.update(scheduler.schedule())
    out = scheduler.schedule()
    assert out.preempted == (("r2", "recompute"),)
    assert out.blocks_to_swap_out == ()


def test_vllm_v0_preset_raises_when_swap_space_runs_out_like_vllm_0_6_3():
    scheduler = Scheduler(
        make_config("vllm-v0", block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_batched_tokens=64, max_model_len=64)
    )
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", prompt_len=2, max_tokens=6, n=2))
    # vLLM 0.6.3's can_swap_out asks, per sequence, for its full entries (1) plus the blocks its
    # next token touches (1): 4 for r2's two sequences, though their one shared block moves twice.
    with pytest.raises(SwapSpaceExhausted, match="swapping out 'r2' needs 4 CPU blocks, 0 free"):
        for _ in range(20):
            scheduler.update(scheduler.schedule())


@pytest.mark.parametrize("order, expected", [(("single", "pair"), {"pair": "swap"}), (("pair", "single"), {"single": "recompute"})])
def test_vllm_v0_rule_swaps_multi_sequence_groups_and_recomputes_single_ones(order, expected):
    """8 blocks of 2 tokens; a single request (4 blocks at its longest) and a request sampled
    twice (7 blocks) cannot both finish: the one admitted second is the running tail and goes."""
    scheduler = Scheduler(
        make_config(
            "pagesim", block_size=2, num_gpu_blocks=8, num_cpu_blocks=8, preemption_mode="vllm-v0",
            watermark=0.0, enable_prefix_caching=False, max_num_batched_tokens=64, max_model_len=64,
        )
    )
    for request_id in order:
        scheduler.add_request(Request(request_id, prompt_len=2, max_tokens=6, n=2 if request_id == "pair" else 1))
    modes = {}
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        modes.update(dict(out.preempted))
        scheduler.update(out)
        scheduler.check()
    assert modes == expected


def test_beam_search_forks_and_frees_through_the_policy():
    scheduler = small(block_size=2, num_gpu_blocks=16)
    scheduler.add_request(Request("b", prompt_len=3, max_tokens=3, beam_width=2))
    out = scheduler.schedule()
    # first sample: both beams continue from the prompt's sequence (two choices of parent 0)
    scheduler.update(out, beam_choices={"b": [(0, 11), (0, 12)]})
    request = scheduler.requests["b"]
    assert [s.output_token_ids for s in request.seqs] == [[11], [12]]
    assert request.seqs[1].block_table == request.seqs[0].block_table  # shared
    out = scheduler.schedule()
    assert out.blocks_to_copy == ((1, 2),)  # parent copies the shared partial block
    # both new beams descend from beam 1: beam 0 is pruned and freed, beam 1 forks a child
    scheduler.update(out, beam_choices={"b": [(1, 21), (1, 22)]})
    assert [(s.index, s.finished, s.finish_reason) for s in request.seqs] == [
        (0, True, "pruned"), (1, False, None), (2, False, None)
    ]
    assert request.seqs[2].output_token_ids == [12, 22] and request.seqs[1].output_token_ids == [12, 21]
    scheduler.check()
    with pytest.raises(ValueError, match="beam choices for beam width"):
        scheduler.update(scheduler.schedule(), beam_choices={"b": [(1, 5)]})


def test_sampled_tokens_are_appended_and_generation_stops_exactly_at_max_tokens():
    scheduler = small(num_gpu_blocks=16)
    scheduler.add_request(Request("a", prompt_len=2, max_tokens=3))
    tokens = iter(range(500, 600))
    steps = 0
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        finished = scheduler.update(out, {s.seq_id: next(tokens) for s in out.scheduled if s.samples})
        steps += 1
    assert steps == 3
    assert [r.request_id for r in finished] == ["a"]
    assert finished[0].seqs[0].output_token_ids == [500, 501, 502]
    assert scheduler.pool.num_free_blocks == 16


def test_decision_log_round_trips_through_jsonl(tmp_path):
    scheduler = three_requests(small(preemption_mode="swap"))
    run_to_end(scheduler)
    path = tmp_path / "log.jsonl"
    scheduler.decision_log.write_jsonl(path)
    from pagesim.engine.policy import DecisionLog

    again = DecisionLog.read_jsonl(path)
    assert again == scheduler.decision_log
    assert again.first_difference(scheduler.decision_log) is None
    again.records[3]["num_free_blocks"] += 1
    assert again != scheduler.decision_log
    assert again.first_difference(scheduler.decision_log)[0] == 3
    assert path.read_text().splitlines()[0].startswith('{"block_ids":')


def test_scheduler_output_is_immutable_and_slot_mapping_follows_the_block_table():
    scheduler = small(num_gpu_blocks=16)
    scheduler.add_request(Request("a", prompt_len=5, max_tokens=2))
    out = scheduler.schedule()
    with pytest.raises(AttributeError):
        out.step = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        out.num_scheduled_tokens["a"] = 1  # type: ignore[index]
    [seq] = out.scheduled
    assert seq.block_table == (0, 1, 2)
    assert seq.slot_mapping() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- regressions from review


def test_two_samples_that_fit_are_never_preempted_by_over_counted_copies():
    """n = 2 on a 6-token prompt needs 3 blocks of 4 (one shared full block, one shared half block
    that one sample copies, the other writes in place): 3 blocks suffice."""
    for extra in ({}, {"enable_prefix_caching": False}, {"preemption_mode": "swap", "num_cpu_blocks": 10}):
        scheduler = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=3, watermark=0.0, **extra))
        scheduler.add_request(Request("a", prompt_len=6, max_tokens=2, n=2))
        timeline = run_to_end(scheduler)
        assert not any("preempted" in t for t in timeline), extra
        assert scheduler.num_finished_requests == 1 and scheduler.num_rejected_requests == 0


def test_peak_counts_written_slots_not_the_last_sampled_token():
    """A 4-token prompt generating 5 writes 8 slots (the 5th output is never computed): 2 blocks."""
    scheduler = Scheduler(make_config("pagesim", block_size=4, num_gpu_blocks=2, watermark=0.0))
    assert scheduler.add_request(Request("a", prompt_len=4, max_tokens=5))
    run_to_end(scheduler)
    assert scheduler.num_finished_requests == 1


def test_raising_on_exhausted_swap_space_leaves_the_scheduler_consistent():
    scheduler = Scheduler(
        make_config("vllm-v0", block_size=2, num_gpu_blocks=8, num_cpu_blocks=1, max_num_batched_tokens=64, max_model_len=64)
    )
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", prompt_len=2, max_tokens=6, n=2))
    with pytest.raises(SwapSpaceExhausted):
        for _ in range(20):
            scheduler.update(scheduler.schedule())
    scheduler.check()  # the would-be victim still runs, holding its blocks


def test_a_request_that_does_not_fit_the_budget_does_not_stop_the_running_pass():
    """Budget 4: a request with 4 samples cannot decode them all beside r1; it decodes what fits and
    r2, behind it, is not skipped while budget remains."""
    scheduler = Scheduler(
        make_config("pagesim", block_size=4, num_gpu_blocks=100, max_num_batched_tokens=4, enable_prefix_caching=False)
    )
    scheduler.add_request(Request("r1", prompt_len=4, max_tokens=50))
    scheduler.add_request(Request("r2", prompt_len=4, max_tokens=50))
    scheduler.add_request(Request("g", prompt_len=4, max_tokens=50, n=2))
    for _ in range(3):
        out = scheduler.schedule()
        scheduler.update(out)
    assert dict(out.num_scheduled_tokens) == {"r1": 1, "r2": 1, "g": 2}


def test_chunked_prefill_off_needs_a_budget_that_holds_a_whole_sequence():
    with pytest.raises(ValueError, match="must be >= max_model_len"):
        make_config("pagesim", enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=4096)


@pytest.mark.parametrize("caching", [False, True])
def test_a_beam_group_preempted_by_recompute_shares_its_prompt_again_and_finishes(caching):
    """9 blocks of 4; beam width 2 on a 6-token prompt needs 9 blocks at its longest only because
    the beams share the prompt's full block. After a recompute preemption the second beam waits
    (parked) until the leader has the prompt block again, then shares it; the beams sample together."""
    scheduler = Scheduler(
        make_config(
            "pagesim", block_size=4, num_gpu_blocks=9, max_num_batched_tokens=16,
            enable_prefix_caching=caching, watermark=0.0,
        )
    )
    scheduler.add_request(Request("a", prompt_len=6, max_tokens=12))
    scheduler.add_request(Request("b", prompt_len=6, max_tokens=12, beam_width=2))
    modes = {}
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        modes.update(dict(out.preempted))
        sampling = [s for s in out.scheduled if s.request_id == "b" and s.samples]
        assert len(sampling) in (0, 1 if not scheduler.requests["b"].forked else 2)
        scheduler.update(out)
        scheduler.check()
    assert modes == {"b": "recompute"}
    assert scheduler.num_finished_requests == 2 and scheduler.num_rejected_requests == 0


def test_vllm_v0_swap_in_need_is_full_entries_plus_touched_blocks():
    """vLLM 0.6.3's can_swap_in counts, per sequence, its full table entries plus the blocks its
    next append touches (1 + ceil((u - f) / block_size)); a partial last entry is not counted twice."""
    bs = 4
    scheduler = Scheduler(
        make_config("vllm-v0", block_size=bs, num_gpu_blocks=12, num_cpu_blocks=40, max_num_batched_tokens=64, max_model_len=64)
    )
    scheduler.add_request(Request("a", prompt_len=7, max_tokens=12, n=2))
    scheduler.add_request(Request("b", prompt_len=7, max_tokens=12, n=2))
    checked = 0
    while scheduler.has_unfinished_requests:
        if scheduler.swapped:
            request = scheduler.swapped[0]
            v0_need = 0
            for seq in request.live_seqs:
                filled = seq.num_filled_tokens
                u, f = seq.num_tokens - filled, bs - filled % bs
                v0_need += 1 + -(-(u - f) // bs) + filled // bs  # ceil, also for u - f < 0
            assert scheduler.step_order.swap_need(request) == v0_need
            checked += 1
        scheduler.update(scheduler.schedule())
        scheduler.check()
    assert checked > 0


def test_a_swapped_request_that_grew_into_the_watermark_comes_back_once_nothing_runs():
    """20 blocks of 2, a watermark of 4. 'big' (30-token prompt) grows to 17 blocks beside 'small';
    when 'small' needs a block, 'big' is swapped out. Its 17+ blocks exceed what the watermark
    leaves, so it returns only once nothing runs, into the whole pool, instead of never."""
    scheduler = Scheduler(
        make_config("pagesim", block_size=2, num_gpu_blocks=20, num_cpu_blocks=32, watermark=0.2,
                    preemption_mode="swap", enable_prefix_caching=False, max_num_batched_tokens=64, max_model_len=64)
    )
    scheduler.add_request(Request("small", prompt_len=2, max_tokens=8))
    scheduler.add_request(Request("big", prompt_len=30, max_tokens=10))
    timeline = run_to_end(scheduler)
    assert [t["step"] for t in timeline if t.get("preempted_mode") == {"big": "swap"}]
    swapped_in = [t for t in timeline if t.get("swapped_in") == ["big"]]
    assert swapped_in and len(swapped_in[0]["blocks_to_swap_in"]) > 20 - 4
    assert scheduler.num_finished_requests == 2 and scheduler.num_rejected_requests == 0
