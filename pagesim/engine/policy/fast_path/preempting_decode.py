"""A decode step that must preempt, or copy on write: vLLM's running pass (v1's, or 0.6.3's) over a
batch of implicit decoders whose next step needs more blocks than are free, or follows a
parallel-sampling fork, in O(sequences that allocate + victims) (with copies, plus one dict of
the running requests, to put them in scheduling order).

Under memory pressure a steady decode batch (``pagesim.engine.policy.fast_path.fast_forward``) soon reaches a step
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
asks for none and preempts nobody. With implicit decoders (``pagesim.engine.policy.fast_path.bulk_decode``) the
sequences that need a block in step ``t`` are exactly bucket ``t % block_size``, in scheduling
order, so the pass visits only them, and every other request is scheduled as ``Scheduler.run``
schedules it without a pool call. A victim is brought up to date (``settle_one``) before it is
preempted, as ``schedule()`` would have found it, and leaves the buckets. The survivors' filled
blocks are then registered (``bulk_decode._register``): for a pool whose eviction order batches
and reads no block stats, a registration commutes with allocations (``bulk_decode``'s argument)
and with frees, which touch only the victims' own blocks. A step that preempted runs no swapped
or waiting pass (``VllmV1StepOrder.schedule``).

vLLM 0.6.3's running pass (``decodes_with_v0_preemptions``, the ``vllm-v0`` order with chunked
prefill off) differs in what it checks: a request may append only while the free blocks cover
one block per sequence of it, needed or not, so a request that allocates nothing may preempt
too, and victims are chosen among the requests after it and rejoin their queues after the pass.
That check fails only where fewer blocks are free than the most sequences a request runs (one,
without parallel samples): the pass visits the sequences that allocate while the blocks cover
any request, and the requests one by one only where they do not. The step's prefill pass (which
comes first and must admit nothing) and its swapped pass are ``fast_forward.schedule_decode_step``'s.

The same pass makes the first decode after a parallel-sampling fork, whose siblings share the
prompt's partly filled last block (``DecodeRun.copies``): the step's takers are then the bucket's
sequences and those, in scheduling order; a request asks for a new block per sequence at a
boundary and a copy per sibling that still shares its block (``Planner.blocks_needed``: the last
holder writes in place), and its copies are made as ``kv_manager.grow_table`` makes them (the copy
allocated, the shared block released) and listed in the step's ``blocks_to_copy``. The batch
never goes through ``schedule()`` for it, preempting or not.

When it applies (``preempts_in_step``): the ``vllm-v1`` step order, or ``vllm-v0`` with chunked
prefill off; one KV group, no offload store, and a built-in victim policy (they read only block
tables, arrival order and priority, which never lag); the batch itself has implicit decoders
(``fast_forward.bulk_ok``).

Invariant: the pool calls (allocations, frees, swaps, registrations) are those of ``schedule()``
in the same order, so block ids, eviction order and every later decision are the same; the
survivors' batch is what ``decode_batch`` would build after the victims left
(``tests/test_fast_path_state.py`` compares the state after every step).
"""

from __future__ import annotations

from dataclasses import replace
from heapq import heapify
from typing import TYPE_CHECKING

from pagesim.engine.policy.fast_path import bulk_decode
from pagesim.engine.policy.scheduling.lag import settle_one
from pagesim.engine.policy.memory.kv_manager import grow_table
from pagesim.engine.policy.scheduling.preemption import VICTIM_POLICIES
from pagesim.engine.policy.scheduling.request import Request
from pagesim.engine.policy.scheduling.steps.base import Step
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS, VllmV0StepOrder
from pagesim.engine.policy.scheduling.steps.vllm_v1 import VllmV1StepOrder

if TYPE_CHECKING:
    from pagesim.engine.policy.fast_path.fast_forward import DecodeRun
    from pagesim.engine.policy.scheduling.scheduler import Scheduler

#: The victim policies whose choice reads nothing a lazy sequence lags on.
_BUILT_IN_VICTIMS = frozenset(VICTIM_POLICIES.values())


def preempts_in_step(s: Scheduler) -> bool:
    """Whether a batch of implicit decoders that cannot take its next step without preempting may
    take it here (module docstring), rather than through ``schedule()``."""
    order = type(s.step_order)
    # NOTE: not under priority scheduling: vLLM 0.33's victim there is chosen among ALL running
    # requests, those already scheduled in the step included (un-scheduled then), which this pass,
    # choosing among the request and those after it, does not model; schedule() does.
    return ((order is VllmV1StepOrder or order is VllmV0StepOrder and not s.config.enable_chunked_prefill)
            and not s.kv.hybrid and s.offload is None and type(s.victim_policy) in _BUILT_IN_VICTIMS
            and s.config.scheduling_policy == "fcfs")


class _Pass:
    """What a preempting running pass over ``run``'s step has done so far: the blocks its
    sequences allocated, the victims and what their sequences computed and held.

    ``takers`` are the sequences that take a block in the step, in scheduling order: those that
    reach a block boundary (bucket ``step % block_size``) and those whose write goes into a
    partly filled block another table holds too (``DecodeRun.copies``: a parallel-sampling
    fork's first decode), which copy it as ``kv_manager.grow_table`` does, while another holder
    is left (of k holders writing, k - 1 copy and the last writes in place)."""

    __slots__ = ("run", "step", "takers", "victims", "gone", "places", "left_context", "left_blocks", "allocated",
                 "evictions_before", "copies")

    def __init__(self, run: DecodeRun, st: Step):
        self.run = run
        self.step = run.step
        self.takers = run.buckets[run.step % run.scheduler.block_size].copy()  # (victims leave the buckets)
        if run.copies:
            self.takers = _in_scheduling_order(run, self.takers + run.copies)
        self.victims: list[Request] = []  # in the order they were chosen
        self.gone: set[int] = set()  # id() of the victims
        self.places: list[int] = []  # the victims' sequences' places in run.seqs
        self.left_context = self.left_blocks = 0  # what the victims' sequences computed and held
        self.allocated = 0
        self.evictions_before = run.scheduler.pool.num_evictions
        self.copies = st.copies  # (the step's (src, dst) copy-on-write pairs, in order)

    def need(self, i: int, j: int) -> int:
        """The blocks ``takers[i:j]`` (sequences of one request, in order) take for their one
        token, counted as ``Planner.blocks_needed`` counts them (``reserve_need``: a new block at a
        boundary, a copy where another holder is left)."""
        if not self.run.copies:  # (every taker is at a block boundary: a new block each)
            return j - i
        s = self.run.scheduler
        step, ref_counts, reserve_need = self.step, s.pool.ref_counts, s.kv.reserve_need
        pending: dict[int, int] = {}  # (a shared block's holders not yet written, as they write in turn)
        return sum(reserve_need(seq.block_table, ref_counts, offset + step, offset + step + 1, pending)
                   for seq, offset in self.takers[i:j])

    def allocate(self, i: int, j: int) -> None:
        """Make ``takers[i:j]`` (sequences of one request, in order) writable for their one token:
        a new block at a boundary, a private copy of a block another table still holds
        (``grow_table``, as ``KVCacheManager.reserve`` makes them)."""
        pool = self.run.scheduler.pool
        if not self.run.copies:  # (every taker is at a block boundary: a new block each)
            for seq, _ in self.takers[i:j]:
                seq.block_table.append(pool.allocate())
                seq.table_snapshot = None
            self.allocated += j - i
            return
        bs, step = self.run.scheduler.block_size, self.step
        for seq, offset in self.takers[i:j]:
            table = seq.block_table
            old_len = len(table)
            copies = grow_table(pool, table, bs, offset + step, offset + step + 1)
            if copies or len(table) != old_len:  # (the last holder of a shared block writes in place)
                seq.table_snapshot = None
                self.copies += copies
                self.allocated += len(table) - old_len + len(copies)

    def take_out(self, victim: Request) -> None:
        """Bring the victim's sequences up to the step's start, as ``schedule()`` finds them (its
        mode and swap need read them), and take them out of the batch, before it is preempted."""
        run = self.run
        s = run.scheduler
        bs = s.block_size
        for seq in victim.live_seqs:
            place = run.seqs.index(seq)
            offset = run.offsets[place]
            settle_one(seq, offset + self.step, bs, s.kv.registered_keys)
            bulk_decode.leave(run.buckets, seq, offset, bs)
            self.places.append(place)
            self.left_context += offset + self.step
            self.left_blocks += len(seq.block_table)
        self.victims.append(victim)
        self.gone.add(id(victim))

    def result(self) -> tuple[DecodeRun, int, int, list[Request]]:
        """The survivors' batch (their filled blocks registered), the blocks they allocated, how
        many of those evicted a cached block, and the victims."""
        run = self.run
        s = run.scheduler
        survivors = _survivors(run, self.victims, self.gone, self.places, self.left_context, self.left_blocks)
        if s.kv.enable_prefix_caching:
            bulk_decode._register(survivors, self.step, 1, s.kv, s.pool, self.step + 1, sampled=0)
        return survivors, self.allocated, s.pool.num_evictions - self.evictions_before, self.victims


def decodes_with_preemptions(run: DecodeRun, st: Step) -> tuple[DecodeRun, int, int, list[Request]]:
    """The running pass of step ``st.step`` (``run.step``) for ``run``'s implicit decoders, as
    ``VllmV1StepOrder._schedule_running`` makes it: returns the survivors' batch (the decodes this
    step computes; the sequences lag, as after ``apply_lazily``), the blocks they allocated, how
    many of those evicted a cached block, and the victims, in the order they were preempted."""
    s = run.scheduler
    pool = s.pool
    running = s.running
    choose = s.victim_policy.choose
    done = _Pass(run, st)
    takers, gone = done.takers, done.gone
    i, end = 0, len(takers)
    while i < end:
        request = takers[i][0].request
        j = _request_end(takers, i)
        if id(request) not in gone:  # (a victim of this step's pass is left behind)
            need = done.need(i, j)
            while id(request) not in gone and need > pool.num_free_blocks:
                victim = choose(running[running.index(request):])
                done.take_out(victim)
                s.step_order.preempt_running(victim, st)
            if id(request) not in gone:
                done.allocate(i, j)
        i = j
    return done.result()


def _in_scheduling_order(run: DecodeRun, takers: list) -> list:
    """``takers`` (``(sequence, offset)`` pairs of ``run``'s) sorted into scheduling order: by
    their requests' places in ``run.requests``, then by their places among its live sequences."""
    place = {id(request): p for p, request in enumerate(run.requests)}
    return sorted(takers, key=lambda taker: (place[id(taker[0].request)], taker[0].index))


def _request_end(takers: list, i: int) -> int:
    """The place in ``takers`` after the sequences of the request whose first is at ``i`` (a
    request's sequences are consecutive in a bucket)."""
    request = takers[i][0].request
    j = i + 1
    while j < len(takers) and takers[j][0].request is request:
        j += 1
    return j


def decodes_with_v0_preemptions(run: DecodeRun, st: Step) -> tuple[DecodeRun, int, int, list[Request]]:
    """``decodes_with_preemptions`` under ``vllm-v0`` (chunked prefill off): the running pass of
    ``VllmV0StepOrder._schedule_running``. In running order, a request may append only while the
    free blocks cover one block per sequence of it, whether it needs a new one or not (vLLM
    0.6.3's touched blocks); while they do not, the victim policy picks among the requests after
    it (itself when none is left). So while as many blocks are free as the most sequences a
    request runs (``run.widest``), every request up to the next one that allocates (bucket
    ``step % block_size``) appends; with fewer, the requests are visited one by one, and one may
    preempt even if it allocates nothing. The victims leave ``running`` at once and rejoin their
    queues after the pass, as vLLM 0.6.3 requeues them (recompute victims at the front of
    ``waiting``, the last preempted first; swap victims at the back of ``swapped``). Where vLLM
    0.6.3 stops (swap space running out, a recompute of several sequences), the queues are left
    as ``schedule()`` leaves them and the error raised; the sequences are then left settled as of
    the step's start."""
    s = run.scheduler
    pool = s.pool
    running = s.running
    choose = s.victim_policy.choose
    done = _Pass(run, st)
    takers, gone = done.takers, done.gone
    modes: list[str] = []  # each victim's, once preempted
    widest = run.widest
    last = None  # the last request the pass scheduled
    i, end = 0, len(takers)
    try:
        while True:
            while i < end and id(takers[i][0].request) in gone:
                i += 1
            if pool.num_free_blocks >= widest:  # (every request appends: the next to allocate does)
                if i == end:
                    break
                last = takers[i][0].request
                j = _request_end(takers, i)
                done.allocate(i, j)
                i = j
                continue
            p = running.index(last) + 1 if last is not None else 0
            if p == len(running):
                break
            request = running[p]  # (the requests are visited one by one while blocks are short)
            while len(request.live_seqs) > pool.num_free_blocks:
                victim = choose(running[p + 1:]) if p + 1 < len(running) else request
                done.take_out(victim)
                modes.append(s.step_order.preempt_victim(victim, st))
                running.remove(victim)
                if victim is request:
                    break
            if id(request) in gone:
                continue
            # (this step's victims come after it: no victim's place in takers is before its own)
            if i < end and takers[i][0].request is request:  # (it allocates: the blocks are free now)
                j = _request_end(takers, i)
                done.allocate(i, j)
                i = j
            last = request
    except VLLM_V0_ABORTS:  # (as VllmV0StepOrder._schedule_running leaves the queues; an abort is final)
        for victim, mode in zip(done.victims, modes):  # (the last one taken out was not preempted)
            s.requeue(victim, mode)
        for seq, offset in zip(run.seqs, run.offsets):
            if id(seq.request) not in gone:
                settle_one(seq, offset + run.step, s.block_size, s.kv.registered_keys)
        s._lazy_run = None
        raise
    s.waiting.extendleft([v for v, mode in zip(done.victims, modes) if mode == "recompute"])
    s.swapped.extend([v for v, mode in zip(done.victims, modes) if mode == "swap"])
    return done.result()


def _survivors(run: DecodeRun, victims: list[Request], gone: set[int], places: list[int], left_context: int,
               left_blocks: int) -> DecodeRun:
    """``run`` less the victims, for its one step (their sequences at ``places``). The token runs
    follow it as carried from the batch ``run`` was carried from (or ``run`` itself): the victims
    leave the followed batch, as completed requests do, and none of them joins it."""
    if not victims:  # (the step's blocks fitted after all: the batch as it is, for its one step)
        return replace(run, max_steps=1, copies=())
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
    heap = finish_at.copy()  # (run's heap holds the victims' finishes too)
    heapify(heap)
    s = run.scheduler
    pool = s.pool
    free = pool.num_free_blocks
    return replace(
        run, requests=requests, seqs=seqs, offsets=offsets, finish_at=finish_at, finish_heap=heap,
        first_finish=heap[0] - run.step + 1 if heap else 2, max_steps=1, free_blocks=free,
        plain_free_blocks=pool.num_plain_free_blocks, used_blocks=pool.num_usable_blocks - free,
        cached_blocks=pool.num_cached_free_blocks, table_blocks=run.table_blocks - left_blocks, copies=(),
        context_tokens=run.context_tokens - left_context, tokens=tokens,
        carried_from=run.requests if run.carried_from is None else run.carried_from,
        joined=[r for r in run.joined if id(r) not in gone] if run.joined else (), _computed=None)
