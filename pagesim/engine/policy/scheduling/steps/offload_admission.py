"""The ``vllm-v1`` step order's waiting pass with a KV connector: vLLM 0.33's
``Scheduler.schedule()`` waiting loop with its ``OffloadingConnector`` (``vllm/v1/core/sched/
scheduler.py``; the connector's side is ``pagesim/engine/policy/offload/manager.py``) or its
``NixlConnector`` (disaggregated prefill/decode, ``pagesim/engine/policy/disagg/connector.py``).

- With the P/D connector, a request with remote blocks still to read (``do_remote_prefill``)
  takes its local prefix hit, then every other prompt token is loaded asynchronously: it gets
  blocks for its whole prompt (if they fit beside the prefills in flight, as an asynchronous
  load's must), is parked, and is promoted once its read is reported done, computing its last
  prompt token again (vLLM's ``_update_waiting_for_remote_kv``). Its local hit is its admission's
  prefix hit; the tokens it read are not.

- Requests holding blocks (``Scheduler.kv_holding``, vLLM's ``kv_holding_waiting``: parked while
  their KV loads, or loaded and not admitted yet) are taken before ``waiting``.
- A parked request whose load is not reported done, and a request whose lookup says "not yet" (a
  block still being stored or loaded for another request), is skipped: it keeps its place at the
  front of its queue and the pass goes on behind it (vLLM's ``skip_request``).
- A request with nothing computed looks up its GPU prefix hit, then the store's continuation
  (``OffloadManager.lookup``); an asynchronous load allocates the loaded blocks (if they fit beside
  what the prefills in flight still need: ``_inflight_prefill_need``, vLLM's reservation against
  deadlock) and parks the request; a synchronous one is admitted and computes in this step.
- A request whose load is done is promoted (``_promote``, vLLM's ``_update_waiting_for_remote_kv``)
  and admitted with its loaded tokens computed, with no second lookup.
- Admission needs the request's whole known sequence to fit above the watermark less its hits
  (vLLM's ``scheduler_reserve_full_isl``), as in the pass without a store. One sequence per request,
  as in vLLM v1; pagesim's samples and beams (``_admit_samples``) load synchronously.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagesim.engine.policy.scheduling.admission import admission_room, admission_watermark
from pagesim.engine.policy.scheduling.request import Request, RequestStatus
from pagesim.engine.policy.scheduling.steps.base import Step

if TYPE_CHECKING:
    from pagesim.engine.policy.scheduling.steps.vllm_v1 import VllmV1StepOrder


def schedule_waiting_with_offload(order: VllmV1StepOrder, st: Step) -> None:
    """The waiting pass with the offload store (vLLM 0.33's with its OffloadingConnector,
    ``Scheduler.schedule`` and ``pagesim/engine/policy/offload/manager.py``): requests holding blocks
    (``kv_holding``: parked while loading, or loaded) are taken before ``waiting``; a parked
    request whose load is not done, and one whose lookup says "not yet", is skipped, keeping
    its place, and the pass goes on behind it; an asynchronous load parks its request (its
    blocks allocated, if they fit beside what the prefills in flight still need); a request
    whose load is done joins the prefix cache and is admitted with its loaded tokens computed.
    One sequence per request (vLLM v1)."""
    cfg = order.config
    s = order.scheduler
    kv = s.kv
    pool = s.pool
    bs = cfg.block_size
    offload = s.offload
    pd = s.pd
    assert offload is not None or pd is not None
    room = admission_room(cfg, pool.num_usable_blocks)
    used = order._num_batch_slots_used()
    skipped_holding: list[Request] = []
    skipped_waiting: list[Request] = []
    while st.token_budget > 0:
        queue = s.kv_holding if s.kv_holding else s.waiting
        if not queue:
            break
        request = queue[0]
        slots = order._batch_slots(request)
        if used + slots > cfg.max_num_seqs:
            st.waiting_stop = "seq_limit"
            break
        if len(request.live_seqs) > 1:  # (samples or beams of one request)
            outcome = _admit_samples(order, request, st, queue, room)
            if outcome == "skip":
                skipped_waiting.append(queue.popleft())
                continue
            if outcome == "stop":
                break
            if outcome == "admitted":
                used += slots
            continue
        seq = request.live_seqs[0]
        if request.status is RequestStatus.LOADING:
            if not (offload.load_done(request) if offload is not None else pd.load_done(request)):  # type: ignore[union-attr]
                (skipped_holding if queue is s.kv_holding else skipped_waiting).append(queue.popleft())
                continue
            _promote(order, request)
        holding = bool(seq.block_table)  # (its load is done: it holds its blocks)
        if not holding:  # (new, or back after a recompute preemption)
            hit = kv.find_cached_prefix(seq)
            remote = pd.remote_prefill_of(request) if pd is not None else None
            if remote is not None:  # every prompt token after the local hit is read from the prefill instance
                need = -(-request.prompt_len // bs) - len(hit)
                watermark = admission_watermark(cfg, anything_running=bool(s.running))
                evictable = kv.num_evictable(hit)
                if need + evictable + watermark > pool.num_free_blocks - _inflight_prefill_need(order, skipped_holding):
                    if need + len(hit) > room:  # (never fits: refused, as an admission that cannot fit is)
                        s.reject_queued(queue.popleft(), f"its prompt needs {need + len(hit)} blocks; "
                                        f"an admission gets at most {room}")
                        continue
                    st.waiting_stop = "blocks"
                    break
                queue.popleft()
                _touch(order, request, seq, hit)
                s.receive_remote(seq, len(hit), st)
                request.status = RequestStatus.LOADING
                skipped_holding.append(request)
                continue
            found = offload.lookup(seq, len(hit)) if offload is not None else ([], True)
            if found is None:  # not yet: skipped this step, keeping its place
                (skipped_holding if queue is s.kv_holding else skipped_waiting).append(queue.popleft())
                continue
            keys, sync = found
        else:
            hit, keys, sync = list(seq.block_table), [], True
        watermark = admission_watermark(cfg, anything_running=bool(s.running))
        new_blocks, evictable, num_hit_blocks = kv.admission_blocks([seq], [hit], [], request.prompt_len)
        if new_blocks + evictable + watermark > pool.num_free_blocks:  # (its whole known sequence)
            if new_blocks + num_hit_blocks > room and queue is s.waiting:
                s.reject_queued(queue.popleft(), f"after a recompute preemption it needs "
                                f"{new_blocks + num_hit_blocks} blocks to resume; an admission gets at most {room}")
                continue
            st.waiting_stop = "blocks"
            break
        if keys and not sync:  # an asynchronous load: allocate its blocks and park it
            if len(keys) + evictable + watermark > pool.num_free_blocks - _inflight_prefill_need(order, skipped_holding):
                st.waiting_stop = "blocks"
                break
            queue.popleft()
            _touch(order, request, seq, hit)
            s.load_from_offload(seq, keys, st, sync=False)
            request.status = RequestStatus.LOADING
            skipped_holding.append(request)
            continue
        computed = seq.num_computed_tokens if holding else (len(hit) + len(keys)) * bs
        plan = s.planner.plan(request, st.token_budget, [computed])
        if not plan:  # without chunked prefill, the head waits for a step with room
            st.waiting_stop = "no_plan"
            break
        queue.popleft()
        if not holding:
            _touch(order, request, seq, hit)
            if keys:
                s.load_from_offload(seq, keys, st, sync=True)
        s.admit(request, computed if pd is None else pd.local_hit_tokens(request, computed), st)
        s.running.append(request)
        s.run(request, plan, st)
        used += slots
    if skipped_holding:
        s.kv_holding.extendleft(reversed(skipped_holding))
    if skipped_waiting:
        s.waiting.extendleft(reversed(skipped_waiting))
    if skipped_holding or skipped_waiting:
        # (a request was skipped for a copy in flight, or parked: it may go at the next step, once
        # the copy is reported done; not a stop that holds while only decodes run)
        st.waiting_stop = "not_yet"
    elif st.waiting_stop is None:
        st.waiting_stop = "budget" if (s.waiting or s.kv_holding) else "empty"


def _admit_samples(order: VllmV1StepOrder, request: Request, st: Step, queue, room: int) -> str:
    """Admit a request of several sequences (parallel samples, beams) at the head of ``waiting``
    with the offload store: "admitted", "rejected", "skip" (a lookup said not yet) or "stop".
    vLLM v1 serves samples as separate requests, each of which may park; pagesim keeps them
    one request, whose sequences all start in the same step, so their loads are synchronous."""
    cfg = order.config
    s = order.scheduler
    kv, pool, bs = s.kv, s.pool, cfg.block_size
    offload = s.offload
    seqs = list(request.live_seqs)
    hits = [[] if seq.parked else kv.find_cached_prefix(seq) for seq in seqs]
    loads = []
    for seq, h in zip(seqs, hits):
        found = ([], True) if seq.parked or offload is None else offload.lookup(seq, len(h))
        if found is None:
            return "skip"
        loads.append(found[0])
    plan = s.planner.plan(request, st.token_budget, [(len(h) + len(l)) * bs for h, l in zip(hits, loads)])
    if not plan:
        st.waiting_stop = "no_plan"
        return "stop"
    new_blocks, evictable, num_hit_blocks = kv.admission_blocks(seqs, hits, plan, request.prompt_len)
    watermark = admission_watermark(cfg, anything_running=bool(s.running))
    if new_blocks + evictable + watermark > pool.num_free_blocks:
        if new_blocks + num_hit_blocks > room:  # not even into an empty pool
            s.reject_queued(queue.popleft(), f"after a recompute preemption its {len(seqs)} sequence(s) need "
                            f"{new_blocks + num_hit_blocks} blocks to resume; an admission gets at most {room}")
            return "rejected"
        st.waiting_stop = "blocks"
        return "stop"
    queue.popleft()
    hit_tokens = 0
    for seq, h, keys in zip(seqs, hits, loads):
        if request.was_preempted and not seq.parked:
            kv.count_resume_loss(seq, len(h) + len(keys))
        if h:
            kv.touch_prefix(seq, h)
            hit_tokens += len(h) * bs
    for seq, keys in zip(seqs, loads):  # (after every touch: a load's fresh blocks may evict a cached hit)
        if keys:
            s.load_from_offload(seq, keys, st, sync=True)
            hit_tokens += len(keys) * bs
    s.planner.unpark(request)
    s.admit(request, hit_tokens, st)
    s.running.append(request)
    s.run(request, plan, st)
    return "admitted"


def _touch(order: VllmV1StepOrder, request: Request, seq, hit: list) -> None:
    """Take ``seq``'s GPU prefix hit (counting, for a returning request, what it lost)."""
    kv = order.scheduler.kv
    if request.was_preempted:
        kv.count_resume_loss(seq, len(hit))
    if hit:
        kv.touch_prefix(seq, hit)


def _promote(order: VllmV1StepOrder, request: Request) -> None:
    """``request``'s load is done: its loaded blocks join the GPU prefix cache; if they hold
    every token, the last one is computed again (vLLM's ``_update_waiting_for_remote_kv``)."""
    kv = order.scheduler.kv
    seq = request.live_seqs[0]
    kv.register(seq, seq.num_computed_tokens)
    if seq.num_computed_tokens >= seq.num_tokens:
        seq.num_computed_tokens = seq.num_tokens - 1
    request.status = RequestStatus.WAITING


def _inflight_prefill_need(order: VllmV1StepOrder, parked_now: list[Request]) -> int:
    """Blocks the prefills in flight (running ones not yet decoding, and those holding blocks
    while or after loading, ``parked_now`` being the ones this pass has taken off the queue)
    still need for their whole known sequence: what an asynchronous load must leave free
    (vLLM 0.33's ``_inflight_prefill_reserved_blocks``)."""
    s = order.scheduler
    bs = order.config.block_size
    max_model_len = order.config.max_model_len
    need = 0
    for request in (*s.running, *s.kv_holding, *parked_now):
        seq = request.live_seqs[0]
        if seq.decoding:
            continue
        blocks = -(-min(seq.num_tokens, max_model_len) // bs) - len(seq.block_table)
        if blocks > 0:
            need += blocks
    return need
