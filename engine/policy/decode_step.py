"""A step that admits requests while a decode batch runs: the batch's decodes at once, the rest
as ``schedule()`` does it.

When the running requests form a steady decode batch (``fast_forward.decode_batch``) but the
waiting queue may admit (so the steps cannot be skipped), the step is still mostly decodes. Here
their pool calls are made as ``fast_forward.advance`` makes them, then the ``vllm-v1`` order's own
swapped and waiting passes run on what is left of the budget, and ``update`` appends the decodes'
tokens and finishes them in scheduling order before the admitted sequences' samples are processed
(``OutputProcessor.process``), the order ``update()`` uses. So a step with an arrival costs
O(admitted + blocks), not O(running). The decision record, when kept, lists the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.policy.fast_forward import DecodeRun, apply_events, decode_events, set_computed
from engine.policy.output import ScheduledSequence, SchedulerOutput, frozen_map
from engine.policy.request import Request, RequestStatus
from engine.policy.sampling import finish_reason
from engine.policy.steps.base import Step


@dataclass(slots=True)
class DecodeStep:
    """One step of a decode batch with the waiting pass run as ``schedule()`` runs it.

    ``output`` is the step's ``SchedulerOutput`` except that ``scheduled`` lists only the
    sequences the waiting pass added (the batch's decodes are ``run``'s); every other field is the
    whole step's. Only an executor that does not need the decodes listed one by one (a simulator)
    may use it; ``update_decode_step`` must follow.
    """

    run: DecodeRun
    output: SchedulerOutput
    allocations: int  # blocks the decodes allocated
    evictions: int


def schedule_decode_step(run: DecodeRun) -> DecodeStep:
    """``schedule()`` for a step whose running pass is ``run``'s decodes (``run.max_steps >= 1``:
    they need no preemption): the decodes' pool calls as ``advance`` makes them, then the
    ``vllm-v1`` order's swapped and waiting passes themselves (admissions, rejections), so a step
    that admits a request costs O(admitted + blocks), not O(running)."""
    s = run.scheduler
    cfg = s.config
    st = Step(step=s.next_step, token_budget=cfg.max_num_batched_tokens - len(run.seqs))
    s.next_step += 1
    allocations, evictions = [0], [0]
    events = decode_events(run.computed, s.block_size, 1, s.kv.enable_prefix_caching)
    apply_events(events, 0, 1, run.seqs, run.computed, s.kv, s.pool, allocations, evictions)
    set_computed(run, 1)
    for request in run.requests:
        st.tokens_per_request[request.request_id] = len(request.live_seqs)
    order = s.step_order
    order._schedule_swapped(st)  # (nothing is swapped: a decode batch requires it)
    order._schedule_waiting(st)
    pure = not (st.new or st.resumed or st.copies or s._pending_rejections)
    s._pure_decode_step = (st.step, st.waiting_stop) if pure else None
    output = SchedulerOutput(
        step=st.step, scheduled=tuple(st.scheduled), num_scheduled_tokens=frozen_map(st.tokens_per_request),
        new=frozen_map(st.new), resumed=frozen_map(st.resumed), swapped_in=(), preempted=(),
        rejected=frozen_map(s._pending_rejections), blocks_to_copy=tuple(st.copies), blocks_to_swap_out=(),
        blocks_to_swap_in=(), num_free_blocks=s.pool.num_free_blocks,
        num_free_cpu_blocks=s.swap_pool.num_free_blocks, num_cached_free_blocks=s.pool.num_cached_free_blocks,
    )
    s._pending_rejections = {}
    if cfg.record_decisions:  # the whole step's record, decodes listed
        bs = s.block_size
        decodes = tuple(ScheduledSequence(seq.request.request_id, seq.index, c, 1, seq.block_table_tuple(), bs, True)
                        for seq, c in zip(run.seqs, run.computed))
        s._last_record = replace(output, scheduled=decodes + output.scheduled).to_record()
        s.decision_log.append(s._last_record)
    return DecodeStep(run, output, allocations[0], evictions[0])


def update_decode_step(step: DecodeStep) -> list[Request]:
    """``update()`` for a ``DecodeStep`` with unnamed tokens: the decodes' tokens and finishes, in
    scheduling order, then the admitted sequences' (``OutputProcessor.process``)."""
    from engine.policy.scheduler import retire_finished

    run = step.run
    s = run.scheduler
    processor = s.output_processor
    retired = processor.num_seqs_finished
    max_model_len = processor.max_model_len
    finished: list[Request] = []
    for request in run.requests:
        for seq in list(request.live_seqs):
            seq.output_token_ids.append(None)
            reason = finish_reason(seq, max_model_len)
            if reason is not None:
                processor._finish(seq, reason)
        if not request.live_seqs:
            request.status = RequestStatus.FINISHED
            finished.append(request)
    finished += processor.process(step.output, s.requests)
    retire_finished(s, step.output.step, finished)
    s._finished_in_last_update = processor.num_seqs_finished != retired
    return finished
