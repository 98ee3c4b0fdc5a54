"""A decode step that must preempt: vLLM v1's running pass over a batch of implicit decoders whose
next step needs more blocks than are free, in O(sequences that allocate + victims).

Under memory pressure a steady decode batch (``engine.policy.fast_forward``) soon reaches a step
whose new blocks do not all fit: ``fast_forward._run_of`` finds no step it can take without
preempting. The step-by-step path then runs the whole ``schedule()``, O(running) (a scheduled
entry and a block-table tuple per sequence), and the batch is built again afresh after it. Here
the batch goes on through that step instead (``fast_forward.schedule_decode_step`` calls
``decodes_with_preemptions`` for a run with ``max_steps == 0``).

vLLM v1's running pass (``VllmV1StepOrder._schedule_running``; vLLM 0.32's ``Scheduler.schedule``
schedules the running requests first): in running order, each request asks for the blocks its
tokens need; while they are more than the free (and evictable cached) blocks, the victim policy
picks a victim among the request and those after it (vLLM: the running tail, ``running.pop()``),
which is preempted (swapped out, or its blocks dropped for a recompute) and leaves the running
list; if the victim is the request itself, it is not scheduled. A decode that needs no new block
asks for none and preempts nobody. With implicit decoders (``engine.policy.bulk_decode``) the
sequences that need a block in step ``t`` are exactly bucket ``t % block_size``, in scheduling
order, so the pass visits only them, and every other request is scheduled as ``Scheduler.run``
schedules it without a pool call. A victim is brought up to date (``settle_one``) before it is
preempted, as ``schedule()`` would have found it, and leaves the buckets. The survivors' filled
blocks are then registered (``bulk_decode._register``): for a pool whose eviction order batches
and reads no block stats, a registration commutes with allocations (``bulk_decode``'s argument)
and with frees, which touch only the victims' own blocks. A step that preempted runs no swapped
or waiting pass (``VllmV1StepOrder.schedule``).

When it applies (``preempts_in_step``): the ``vllm-v1`` step order, one KV group, no offload
store, and a built-in victim policy (they read only block tables, arrival order and priority,
which never lag); the batch itself has implicit decoders (``fast_forward.bulk_ok``).

Invariant: the pool calls (allocations, frees, swaps, registrations) are those of ``schedule()``
in the same order, so block ids, eviction order and every later decision are the same; the
survivors' batch is what ``decode_batch`` would build after the victims left
(``tests/test_fast_path_state.py`` compares the state after every step).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from engine.policy import bulk_decode
from engine.policy.bulk_decode import settle_one
from engine.policy.preemption import VICTIM_POLICIES
from engine.policy.request import Request
from engine.policy.steps.base import Step
from engine.policy.steps.vllm_v1 import VllmV1StepOrder

if TYPE_CHECKING:
    from engine.policy.fast_forward import DecodeRun
    from engine.policy.scheduler import Scheduler

#: The victim policies whose choice reads nothing a lazy sequence lags on.
_BUILT_IN_VICTIMS = frozenset(VICTIM_POLICIES.values())


def preempts_in_step(s: Scheduler) -> bool:
    """Whether a batch of implicit decoders that cannot take its next step without preempting may
    take it here (module docstring), rather than through ``schedule()``."""
    return (type(s.step_order) is VllmV1StepOrder and not s.kv.hybrid and s.offload is None
            and type(s.victim_policy) in _BUILT_IN_VICTIMS)


def decodes_with_preemptions(run: DecodeRun, st: Step) -> tuple[DecodeRun, int, int, list[Request]]:
    """The running pass of step ``st.step`` (``run.step``) for ``run``'s implicit decoders, as
    ``VllmV1StepOrder._schedule_running`` makes it: returns the survivors' batch (the decodes this
    step computes; the sequences lag, as after ``apply_lazily``), the blocks they allocated, how
    many of those evicted a cached block, and the victims, in the order they were preempted."""
    s = run.scheduler
    pool = s.pool
    bs = s.block_size
    step = run.step
    running = s.running
    choose = s.victim_policy.choose
    takers = run.buckets[step % bs].copy()  # (victims leave the buckets as the pass goes)
    victims: list[Request] = []
    gone: set[int] = set()  # id() of the victims
    places: list[int] = []  # the victims' sequences' places in run.seqs
    left_context = left_blocks = 0  # what the victims' sequences computed and held
    evictions_before = pool.num_evictions
    allocated = 0
    i, end = 0, len(takers)
    while i < end:
        request = takers[i][0].request
        j = i + 1
        while j < end and takers[j][0].request is request:  # (a request's sequences are consecutive)
            j += 1
        need = j - i
        while id(request) not in gone and need > pool.num_free_blocks:
            victim = choose(running[running.index(request):])
            for seq in victim.live_seqs:
                place = run.seqs.index(seq)
                offset = run.offsets[place]
                settle_one(seq, offset + step, bs, s.kv.enable_prefix_caching)
                bulk_decode.leave(run.buckets, seq, offset, bs)
                places.append(place)
                left_context += offset + step
                left_blocks += len(seq.block_table)
            s.step_order.preempt_running(victim, st)
            victims.append(victim)
            gone.add(id(victim))
        if id(request) not in gone:
            for seq, _ in takers[i:j]:
                seq.block_table.append(pool.allocate())
                seq.table_snapshot = None
            allocated += need
        i = j
    survivors = _survivors(run, victims, gone, places, left_context, left_blocks)
    if s.kv.enable_prefix_caching:
        bulk_decode._register(survivors, step, 1, s.kv, pool, step + 1, sampled=0)
    return survivors, allocated, pool.num_evictions - evictions_before, victims


def _survivors(run: DecodeRun, victims: list[Request], gone: set[int], places: list[int], left_context: int,
               left_blocks: int) -> DecodeRun:
    """``run`` less the victims, for its one step (their sequences at ``places``). The token runs
    follow it as carried from the batch ``run`` was carried from (or ``run`` itself): the victims
    leave the followed batch, as completed requests do, and none of them joins it."""
    if not victims:  # (the step's blocks fitted after all: the batch as it is, for its one step)
        return replace(run, max_steps=1)
    seqs, offsets, finish_at = run.seqs.copy(), run.offsets.copy(), run.finish_at.copy()
    for place in sorted(places, reverse=True):
        del seqs[place], offsets[place], finish_at[place]
    requests = run.requests.copy()
    for victim in victims:
        requests.remove(victim)  # (requests compare by identity)
    tokens = run.tokens
    if tokens is not None:
        tokens = tokens.copy()
        for victim in victims:
            del tokens[victim.request_id]
    s = run.scheduler
    pool = s.pool
    free = pool.num_free_blocks
    return replace(
        run, requests=requests, seqs=seqs, offsets=offsets, finish_at=finish_at,
        first_finish=min(finish_at) - run.step + 1 if finish_at else 2, max_steps=1, free_blocks=free,
        plain_free_blocks=pool.num_plain_free_blocks, used_blocks=pool.num_usable_blocks - free,
        cached_blocks=pool.num_cached_free_blocks, table_blocks=run.table_blocks - left_blocks,
        context_tokens=run.context_tokens - left_context, tokens=tokens,
        carried_from=run.requests if run.carried_from is None else run.carried_from,
        joined=[r for r in run.joined if id(r) not in gone] if run.joined else (), _computed=None)
