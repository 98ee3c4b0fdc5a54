"""The Orca baselines' scheduler: contiguous slabs, FCFS admission, per-sequence reservations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import ContiguousScheduler, Request, RequestStatus, Scheduler, SchedulerConfig
from tests.conftest import scaled_examples


def config(**overrides) -> SchedulerConfig:
    """Capacity 64 slots (4 blocks of 16), max_model_len 32, generous budget and batch."""
    base = dict(
        block_size=16,
        num_gpu_blocks=4,
        max_model_len=32,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        enable_prefix_caching=False,
    )
    base.update(overrides)
    return SchedulerConfig(**base)


def make(reservation: str = "oracle", capacity_slots: int | None = None, **overrides) -> ContiguousScheduler:
    return ContiguousScheduler(config(**overrides), reservation=reservation, capacity_slots=capacity_slots)


def step(sched: ContiguousScheduler, sampled=None):
    out = sched.schedule()
    sched.check()
    finished = sched.update(out, sampled)
    sched.check()
    return out, finished


def run_to_end(sched: ContiguousScheduler, max_steps: int = 1000) -> list:
    outputs = []
    while sched.has_unfinished_requests:
        assert len(outputs) < max_steps, "did not finish"
        outputs.append(step(sched)[0])
    return outputs


def max_concurrent(outputs) -> int:
    return max(len(out.num_scheduled_tokens) for out in outputs)


# ------------------------------------------------------------------ reservation modes


@pytest.mark.parametrize(("reservation", "concurrent", "slab"), [("max", 2, 32), ("pow2", 5, 12), ("oracle", 7, 9)])
def test_reservation_mode_decides_the_batch(reservation, concurrent, slab):
    # prompt 4 + output 5: Max reserves 32, Pow2 4 + 8 = 12 (the output rounded up), Oracle 9 of 64 slots
    sched = make(reservation)
    for i in range(8):
        assert sched.add_request(Request(f"r{i}", prompt_len=4, max_tokens=5))
    outputs = run_to_end(sched)
    assert max_concurrent(outputs) == concurrent
    first = sched.decision_log[0]
    assert first["new"] == {f"r{i}": 0 for i in range(concurrent)}
    assert first["slabs"] == {f"r{i}": [[i * slab, slab]] for i in range(concurrent)}
    assert first["block_ids"] == {f"r{i}": {"0": []} for i in range(concurrent)}
    assert sched.num_finished_requests == 8 and not sched.requests
    assert sched.allocator.num_reserved_slots == 0


def test_kv_usage_counts_reserved_and_written_slots():
    sched = make("max")
    sched.add_request(Request("a", prompt_len=8, max_tokens=4))
    out = sched.schedule()
    assert out.num_free_blocks == (64 - 32) // 16
    usage = sched.kv_usage()
    assert (usage.total_slots, usage.allocated_slots, usage.used_slots) == (64, 32, 8)
    assert usage.cached_slots == 0 and usage.unshared_slots == 32
    sched.update(out)
    assert sched.kv_usage().used_slots == 9  # the sampled token is recorded in the slab
    assert sched.kv_usage().internal_fragmentation_slots == 23


# ------------------------------------------------------------------ FCFS and first fit


def test_head_of_line_blocking():
    sched = make("oracle", max_model_len=64, num_gpu_blocks=4, max_num_batched_tokens=2048)
    sched.add_request(Request("a", prompt_len=30, max_tokens=10))  # 40 slots
    sched.add_request(Request("b", prompt_len=30, max_tokens=20))  # 50: does not fit beside a
    sched.add_request(Request("c", prompt_len=4, max_tokens=4))  # 8: would fit, but waits behind b
    out, _ = step(sched)
    assert dict(out.new) == {"a": 0}
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    outputs = [out] + run_to_end(sched)
    admitted = {rid: out.step for out in outputs for rid in out.new}
    assert admitted == {"a": 0, "b": 10, "c": 10}  # a finishes after 10 outputs (steps 0-9)
    assert sched.decision_log[10]["slabs"] == {"b": [[0, 50]], "c": [[50, 8]]}


def test_first_fit_and_external_fragmentation():
    sched = make("oracle")
    sched.add_request(Request("a", prompt_len=10, max_tokens=6))  # 16 slots, ends after step 5
    sched.add_request(Request("b", prompt_len=4, max_tokens=12))  # 16, ends after step 11
    sched.add_request(Request("c", prompt_len=10, max_tokens=6))  # 16, ends after step 5
    sched.add_request(Request("d", prompt_len=2, max_tokens=14))  # 16, ends after step 13
    sched.add_request(Request("e", prompt_len=16, max_tokens=16))  # 32
    outputs = run_to_end(sched)
    assert sched.decision_log[0]["slabs"] == {"a": [[0, 16]], "b": [[16, 16]], "c": [[32, 16]], "d": [[48, 16]]}
    assert [r for r in sched.decision_log[5]["finished"]] == ["a", "c"]
    # steps 6-11: 32 slots free in two holes of 16, so e (32) still waits
    assert all(not out.new for out in outputs[6:12])
    assert sched.decision_log[6]["num_free_blocks"] == 2
    assert sched.decision_log[12]["slabs"] == {"e": [[0, 32]]}  # b's slab coalesced holes 0-48


def test_fragmentation_is_visible_in_the_allocator():
    sched = make("oracle")
    for rid, prompt, out_len in (("a", 10, 6), ("b", 4, 12), ("c", 10, 6), ("d", 2, 14), ("e", 16, 16)):
        sched.add_request(Request(rid, prompt_len=prompt, max_tokens=out_len))
    for _ in range(7):
        step(sched)
    assert sched.allocator.holes == [(0, 16), (32, 16)]
    assert sched.allocator.external_fragmentation_slots == 16
    assert [r.request_id for r in sched.waiting] == ["e"]


# ------------------------------------------------------------------ multiple sequences


def test_parallel_samples_take_one_slab_each():
    sched = make("oracle")
    sched.add_request(Request("a", prompt_len=8, max_tokens=4, n=3))
    out, _ = step(sched, sampled=lambda seq, k: 100 + k)
    assert sched.decision_log[0]["slabs"] == {"a": [[0, 12], [12, 12], [24, 12]]}
    assert [(s.seq_index, s.num_new_tokens, s.samples) for s in out.scheduled] == [(0, 8, True)]
    request = sched.requests["a"]
    assert [s.output_token_ids for s in request.seqs] == [[100], [101], [102]]
    assert sched.kv_usage().used_slots == 3 * 9  # the prompt counted in every slab: no sharing
    out, _ = step(sched)
    assert [(s.seq_index, s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [
        (0, 8, 1),
        (1, 8, 1),
        (2, 8, 1),
    ]
    outputs = run_to_end(sched)
    assert len(outputs) == 2 and request.status is RequestStatus.FINISHED
    assert [len(s.output_token_ids) for s in request.seqs] == [4, 4, 4]


def test_sampled_tokens_by_sequence_id():
    sched = make("oracle")
    sched.add_request(Request("a", prompt_len=4, max_tokens=2, n=2))
    step(sched, sampled={"a#0": [5, 6]})  # the first sample: one token per sample
    seqs = sched.requests["a"].seqs
    step(sched, sampled={"a#0": 7, "a#1": 8})
    assert [s.output_token_ids for s in seqs] == [[5, 7], [6, 8]]
    assert [s.finish_reason for s in seqs] == ["length", "length"]


def test_max_model_len_caps_the_output():
    sched = make("oracle")
    request = Request("a", prompt_len=30, max_tokens=10)
    assert sched.add_request(request)
    out, _ = step(sched)
    assert sched.decision_log[0]["slabs"] == {"a": [[0, 32]]}  # 30 + 2, not 30 + 10
    run_to_end(sched)
    assert request.seqs[0].num_output_tokens == 2 and request.seqs[0].finish_reason == "max_model_len"


def test_beams_continue_themselves():
    sched = make("max")
    sched.add_request(Request("a", prompt_len=4, max_tokens=3, beam_width=2))
    sched.add_request(Request("b", prompt_len=4, max_tokens=3))
    out, _ = step(sched)
    assert dict(out.new) == {"a": 0}  # 2 x 32 slots: nothing left for b
    assert sched.decision_log[0]["slabs"] == {"a": [[0, 32], [32, 32]]}
    beams = sched.requests["a"].seqs
    outputs = [out] + run_to_end(sched)
    assert [len(s.output_token_ids) for s in beams] == [3, 3]
    assert {rid: o.step for o in outputs for rid in o.new} == {"a": 0, "b": 3}


def test_beam_choices_are_refused():
    sched = make("max")
    sched.add_request(Request("x", prompt_len=4, max_tokens=3, beam_width=2))
    with pytest.raises(ValueError, match="beam_choices"):
        sched.update(sched.schedule(), beam_choices={"x": [(0, 1), (0, 2)]})


def test_sample_lengths_free_slabs_early():
    sched = make("oracle", capacity_slots=40)
    sched.add_request(Request("a", prompt_len=8, max_tokens=5, n=3, sample_max_tokens=(2, 5, 3)))
    sched.add_request(Request("b", prompt_len=6, max_tokens=4))  # 10 slots; 6 free beside a
    step(sched)
    assert sched.decision_log[0]["slabs"] == {"a": [[0, 10], [10, 13], [23, 11]]}
    step(sched)  # sample 0 has its 2 tokens: its slab is freed at once
    assert sched.allocator.holes == [(0, 10), (34, 6)]
    assert [s.finish_reason for s in sched.requests["a"].seqs] == ["length", None, None]
    out, _ = step(sched)
    assert sched.decision_log[2]["slabs"] == {"b": [[0, 10]]}
    seqs = sched.requests["a"].seqs
    run_to_end(sched)
    assert [len(s.output_token_ids) for s in seqs] == [2, 5, 3]


def test_sequence_limit_counts_samples():
    sched = make("oracle", seq_limit_counts="sequences", max_num_seqs=4)
    sched.add_request(Request("a", prompt_len=2, max_tokens=2, n=3))
    sched.add_request(Request("b", prompt_len=2, max_tokens=2, n=2))  # 3 + 2 > 4
    sched.add_request(Request("c", prompt_len=2, max_tokens=2))  # would fit, waits behind b
    out, _ = step(sched)
    assert dict(out.new) == {"a": 0}
    outputs = [out] + run_to_end(sched)
    assert {rid: o.step for o in outputs for rid in o.new} == {"a": 0, "b": 2, "c": 2}  # b + c = 3 sequences


def test_running_request_waits_when_its_samples_do_not_fit_the_budget():
    sched = make("oracle", max_num_batched_tokens=4)
    sched.add_request(Request("a", prompt_len=6, max_tokens=5))
    sched.add_request(Request("b", prompt_len=1, max_tokens=2, n=4))
    outputs = run_to_end(sched)
    assert [dict(o.num_scheduled_tokens) for o in outputs[:3]] == [{"a": 4}, {"a": 2, "b": 1}, {"a": 1}]
    assert [dict(o.num_scheduled_tokens) for o in outputs[5:]] == [{"a": 1}, {"b": 4}]


# ------------------------------------------------------------------ prefill and budget


def test_chunked_prefill_fills_the_budget():
    sched = make("oracle", max_num_batched_tokens=8)
    sched.add_request(Request("a", prompt_len=20, max_tokens=2))
    sched.add_request(Request("b", prompt_len=6, max_tokens=1))
    outputs = run_to_end(sched)
    assert [dict(o.num_scheduled_tokens) for o in outputs] == [{"a": 8}, {"a": 8}, {"a": 4, "b": 4}, {"a": 1, "b": 2}]
    assert [o.scheduled[0].samples for o in outputs[:3]] == [False, False, True]


def test_unchunked_prefill_needs_the_whole_prompt_in_the_budget():
    sched = make("oracle", max_num_batched_tokens=32, enable_chunked_prefill=False)
    sched.add_request(Request("a", prompt_len=20, max_tokens=2))
    sched.add_request(Request("b", prompt_len=16, max_tokens=1))
    outputs = run_to_end(sched)
    assert [dict(o.num_scheduled_tokens) for o in outputs] == [{"a": 20}, {"a": 1, "b": 16}]


# ------------------------------------------------------------------ rejection and abort


def test_rejections_have_reasons():
    sched = make("max", max_num_batched_tokens=2)
    long = Request("long", prompt_len=32, max_tokens=1)
    big = Request("big", prompt_len=4, max_tokens=1, n=2)  # 2 x 32 fits exactly
    wide = Request("wide", prompt_len=4, max_tokens=1, n=3)
    assert not sched.add_request(long) and "leaves no room for output" in long.reject_reason
    assert sched.add_request(big)
    assert not sched.add_request(wide) and "cannot decode within max_num_batched_tokens 2" in wide.reject_reason
    huge = Request("huge", prompt_len=4, max_tokens=1, n=3)
    assert not make("max").add_request(huge)
    assert "need 96 slots (first-fit placement) and cannot all be placed in 64" in huge.reject_reason
    assert all(r.status is RequestStatus.REJECTED for r in (long, wide, huge))
    assert sched.num_rejected_requests == 2
    out = sched.schedule()
    assert dict(out.rejected) == {"long": long.reject_reason, "wide": wide.reject_reason}
    assert sched.decision_log[0]["rejected"] == dict(out.rejected)
    assert not sched.schedule().rejected  # reported once


def test_rejection_of_too_many_samples_for_the_sequence_limit():
    sched = make("oracle", seq_limit_counts="sequences", max_num_seqs=2)
    request = Request("many", prompt_len=2, max_tokens=1, n=3)
    assert not sched.add_request(request)
    assert "exceed max_num_seqs" in request.reject_reason
    assert dict(sched.schedule().rejected) == {"many": request.reject_reason}


def test_duplicate_and_rescheduled_requests_are_errors():
    sched = make()
    request = Request("a", prompt_len=4, max_tokens=2)
    assert sched.add_request(request)
    with pytest.raises(ValueError, match="already in the scheduler"):
        sched.add_request(Request("a", prompt_len=4, max_tokens=2))
    run_to_end(sched)
    with pytest.raises(ValueError, match="already scheduled"):
        sched.add_request(request)


def test_abort_frees_slabs():
    sched = make("oracle")
    sched.add_request(Request("a", prompt_len=4, max_tokens=8, n=2))
    sched.add_request(Request("b", prompt_len=4, max_tokens=8))
    step(sched)
    sched.abort_request("a")
    sched.check()
    assert list(sched.allocator.holes) == [(0, 24), (36, 28)]
    sched.abort_request("b")
    sched.check()
    assert sched.allocator.holes == [(0, 64)] and not sched.has_unfinished_requests


def test_no_decision_records_when_turned_off():
    sched = make(record_decisions=False)
    sched.add_request(Request("a", prompt_len=4, max_tokens=2))
    run_to_end(sched)
    assert len(sched.decision_log) == 0 and sched.num_finished_requests == 1


# ------------------------------------------------------------------ one interface


def test_same_driver_runs_paged_and_contiguous():
    def drive(sched) -> list[str]:
        for i in range(5):
            sched.add_request(Request(f"r{i}", prompt_len=8, max_tokens=4, n=1 + i % 2))
        done = []
        while sched.has_unfinished_requests:
            out = sched.schedule()
            sched.check()
            done += [r.request_id for r in sched.update(out)]
            usage = sched.kv_usage()
            assert usage.used_slots <= usage.allocated_slots <= usage.total_slots
        return sorted(done)

    contiguous = make("oracle")
    assert drive(Scheduler(config())) == drive(contiguous) == [f"r{i}" for i in range(5)]
    assert contiguous.num_preemptions == 0 and not contiguous.swapped and contiguous.num_prefix_hit_tokens == 0


# ------------------------------------------------------------------ property test

requests_st = st.lists(
    st.tuples(
        st.integers(1, 40),  # prompt
        st.integers(1, 12),  # max tokens
        st.sampled_from(["one", "n", "beam", "lens"]),
        st.integers(2, 3),  # samples when > 1
        st.integers(0, 6),  # arrival step
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=scaled_examples(50))
@given(
    reqs=requests_st,
    reservation=st.sampled_from(["max", "pow2", "oracle"]),
    capacity=st.integers(16, 160),
    chunked=st.booleans(),
    budget=st.integers(1, 64),
    max_num_seqs=st.integers(1, 6),
    counts=st.sampled_from(["requests", "sequences"]),
    data=st.data(),
)
def test_random_workloads_finish_within_limits(reqs, reservation, capacity, chunked, budget, max_num_seqs, counts, data):
    mml = 32
    cfg = config(
        max_model_len=mml,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget if chunked else max(budget, mml),
        max_num_seqs=max_num_seqs,
        seq_limit_counts=counts,
    )
    sched = ContiguousScheduler(cfg, reservation=reservation, capacity_slots=capacity)
    all_requests = []
    for i, (prompt, max_tokens, kind, samples, arrival) in enumerate(reqs):
        kwargs = {}
        if kind == "n":
            kwargs["n"] = samples
        elif kind == "beam":
            kwargs["beam_width"] = samples
        elif kind == "lens":
            lens = data.draw(st.lists(st.integers(1, max_tokens), min_size=samples - 1, max_size=samples - 1))
            kwargs.update(n=samples, sample_max_tokens=(*lens, max_tokens))
        all_requests.append((arrival, Request(f"r{i}", prompt_len=prompt, max_tokens=max_tokens, **kwargs)))
    total_scheduled = 0
    finished_ids = []
    step_no = 0
    while step_no <= 6 or sched.has_unfinished_requests:
        assert step_no < 2000, "no progress"
        for arrival, request in all_requests:
            if arrival == step_no:
                sched.add_request(request)
        out = sched.schedule()
        sched.check()
        assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        if counts == "requests":
            assert len(out.num_scheduled_tokens) <= max_num_seqs
        else:
            assert len(out.scheduled) <= max_num_seqs
        assert set(sched.decision_log[-1]["slabs"]) == set(out.new)
        total_scheduled += out.total_num_scheduled_tokens
        finished = sched.update(out, sampled=lambda seq, k: seq.num_tokens)
        assert sched.decision_log[-1]["finished"] == sorted(r.request_id for r in finished)
        assert all(r.status is RequestStatus.FINISHED for r in finished)
        finished_ids += [r.request_id for r in finished]
        sched.check()
        usage = sched.kv_usage()
        assert 0 <= usage.used_slots <= usage.allocated_slots <= usage.total_slots == capacity
        step_no += 1

    # conservation: every request finished or was rejected; every token was computed once
    assert sched.allocator.num_reserved_slots == 0 and len(sched.allocator) == 0
    assert sched.num_finished_requests + sched.num_rejected_requests == len(all_requests)
    expected_scheduled = 0
    for _, request in all_requests:
        if request.status is RequestStatus.REJECTED:
            assert request.reject_reason and request.request_id not in finished_ids
            continue
        assert request.status is RequestStatus.FINISHED
        assert len(request.seqs) == request.num_samples and not request.live_seqs
        for seq in request.seqs:
            want = min(request.max_tokens_of(seq), mml - request.prompt_len)
            assert seq.num_output_tokens == want
        expected_scheduled += request.prompt_len + sum(s.num_output_tokens - 1 for s in request.seqs)
    assert total_scheduled == expected_scheduled
    assert sorted(finished_ids) == sorted(r.request_id for _, r in all_requests if r.status is RequestStatus.FINISHED)


def test_under_the_v0_step_order_prompts_get_steps_of_their_own():
    from pagesim.engine.policy import make_config

    cfg = make_config("vllm-v0", block_size=16, num_gpu_blocks=4, max_model_len=32, max_num_batched_tokens=2048)
    sched = ContiguousScheduler(cfg, reservation="oracle")
    sched.add_request(Request("r0", prompt_len=4, max_tokens=3))
    orders = [step(sched)[0].num_scheduled_tokens]  # r0's prompt
    orders.append(step(sched)[0].num_scheduled_tokens)  # r0 decodes
    sched.add_request(Request("r1", prompt_len=5, max_tokens=2))
    orders.append(step(sched)[0].num_scheduled_tokens)  # r1's prompt alone: r0 pauses
    orders.append(step(sched)[0].num_scheduled_tokens)  # both decode
    assert [dict(o) for o in orders] == [{"r0": 4}, {"r0": 1}, {"r1": 5}, {"r0": 1, "r1": 1}]
    # the clean order mixes them: r0 decodes in the step that admits r1
    sched = make("oracle")
    sched.add_request(Request("r0", prompt_len=4, max_tokens=3))
    step(sched), step(sched)
    sched.add_request(Request("r1", prompt_len=5, max_tokens=2))
    assert dict(step(sched)[0].num_scheduled_tokens) == {"r0": 1, "r1": 5}
