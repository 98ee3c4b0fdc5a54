"""Skip-ahead: advance a steadily decoding scheduler by k steps at once, deciding exactly what k
``schedule()`` + ``update()`` calls would have decided.

The idea. Most steps of a long run are *pure decode*: every running sequence computes one token
and samples one, nobody is admitted, preempted, swapped, copied or rejected. Over such a stretch
the only things that change are token counts, plus, every ``block_size`` tokens of a sequence, one
new block (allocated) and one full block (registered in the prefix cache). ``decode_run`` checks
that the scheduler is in such a state and says how many steps it stays there; ``advance`` applies
k of them in O(sequences + blocks allocated) instead of O(k x sequences), making the same pool
calls (allocations, prefix-cache registrations) in the same order as the step-by-step path, so
block ids, eviction order and every later decision are identical. When decisions are recorded, it
writes the same decision records too.

When a run is steady (checked by ``decode_run``; any doubt answers "not steady"):

- the scheduler is the built-in ``Scheduler`` (a plug-in subclass is never skipped) with the
  ``vllm-v1`` or the ``vllm-v0`` step order and no rejection is pending; a pure decode step
  makes the same pool calls under both (``Scheduler.run`` of one token per sequence, in running
  order);
- the waiting queue and the swapped queue are each empty, or the last ``schedule()`` was itself
  pure decode for every running request and refused each queue's head for a reason that holds
  while only decodes run (and no sequence finished since): the batch limit (the running set does
  not change), the token budget or no chunk (the decode batch takes the same tokens each step),
  blocks, or (``vllm-v0``'s waiting queue) a request swapped out, since that order admits nothing
  then. Blocks stay refused because during decode-only steps the free count only falls, while
  a waiting head's need can only grow (a decode allocation may evict a cached block the head would
  have hit; generated blocks have contents unique to their sequence, so nothing new becomes a
  hit) and a swapped head's is its CPU tables, which do not change. With sliding-window layer
  groups (a hybrid cache) the decodes also drop the blocks that leave each window, which raises
  the free count: there a head refused for blocks does not stay refused. Under priority
  scheduling (``scheduling_policy="priority"``) the head is the waiting heap's least key, which
  only an arrival, an abort or a preemption changes, none of which a skipped step has; a step
  that must preempt goes through ``schedule()`` there (``preempting_decode.preempts_in_step``);
- every running sequence is decoding (one token left to compute, nothing parked, no beam search,
  parallel samples already forked) and writes into a block only it holds, so no copy-on-write
  (a fork's first decode, which copies its siblings' shared block, is a step of its own: below).
  A hybrid cache's decodes (``pagesim.engine.policy.fast_path.window_decode``) also need one live sequence per
  request, every group's last block its own and the full blocks registered; their drops,
  allocations and registrations are applied event by event with the KV manager's own calls.

How far: up to and including the step in which the first sequence finishes (its output length,
or ``max_model_len``; the finishes of that step are applied as ``update()`` applies them), and
while the blocks the decodes allocate fit in the free (and evictable cached) blocks, so no
preemption (under ``vllm-v0``, while they leave a block free per sequence of the largest running
group: vLLM 0.6.3 lets a group append only if the free blocks cover one per sequence, needed or
not; with a hybrid cache, every group's new block counts, and the drops' blocks are not counted
as room). The executor may stop earlier (the simulator stops before the
next arrival). Generated tokens are left unnamed (``None``), as a simulator reports them; an
executor that samples real tokens cannot skip.

**A step that admits requests while the batch decodes** (``vllm-v1``: a queue may admit or
swap in, so the steps cannot be skipped; ``takes_decode_steps``) is still mostly decodes:
``schedule_decode_step`` makes the decodes' pool calls as ``advance`` makes them, then runs the
``vllm-v1`` order's own swapped and waiting passes on what is left of the budget (``vllm-v0``,
chunked prefill off: its prefill pass first, which must admit nothing, a step that admits
running the prefills alone through ``schedule()``; then the decodes, then its swapped pass);
``update_decode_step`` appends the decodes' tokens and finishes them in scheduling order before
the added sequences' samples are processed (``OutputProcessor.process``), the order ``update()``
uses. So a step with an arrival costs O(admitted + blocks), not O(running). The decision record,
when kept, lists the whole step. Requests aborted since the last step (``abort_request``, which
drops the carried batch) are listed in the record of the next step, whichever path makes it
(``schedule()``, ``schedule_decode_step`` or the first step ``advance`` applies).

**The batch carries over.** ``advance`` and ``update_decode_step`` know the batch they leave:
the survivors' counters moved together, the finished sequences left, the admitted ones joined
(checked as ``decode_batch`` checks every sequence). They leave it in ``Scheduler._decode_run``
for the next ``decode_batch``, which takes it when the scheduler is still at that step with the
same number of running requests (any other step moves the counter; ``abort_request`` drops it),
instead of rebuilding it from every running sequence. A sequence's computed tokens are kept as an
offset from the step number, which carrying leaves alone. ``tests/test_skip_ahead.py`` compares
every carried batch with the one built from the scheduler's state.

**Implicit decoders.** Without recording decisions, with one KV group and an ``lru``-like pool
(``bulk_ok``), the batch keeps its sequences in buckets by the step at which they next reach a
block boundary, and a stretch of steps touches only those (``pagesim.engine.policy.fast_path.bulk_decode``): its
allocations and lazily keyed registrations are made in one pool call each (none at all for the
lazy keys of a batch whose sequences all key lazily: settling gives them), and the sequences'
own counters, outputs and lazy keys lag until something reads them (``Scheduler.settle``). A step of such a
batch then costs O(blocks it allocates and fills), not O(running).

Entry points, in the order an executor uses them (the simulator's one caller is
``pagesim/sim/replica.py`` with ``pagesim/sim/skip_ahead.py``; the engine never takes the fast path, it names
real tokens):

1. ``decode_batch(s)``: the running requests as a steady decode batch, or ``None`` (then
   ``preempting_batch(s)``, a batch of implicit decoders whose next step must preempt
   (``pagesim.engine.policy.fast_path.preempting_decode``), or else ``schedule()`` / ``update()`` as usual);
2. ``queues_stay_refused(s)``: whether its steps may be advanced at once; if so,
   ``advance(run, k)`` applies any ``k <= run.max_steps`` of them (the executor picks ``k``: the
   simulator stops before the next arrival);
3. otherwise, where ``takes_decode_steps(s)``, ``schedule_decode_step(run)`` +
   ``update_decode_step(step)`` stand for one ``schedule()`` + ``update()`` (for a batch from
   ``preempting_batch``, a step that preempts; ``None`` for a ``vllm-v0`` step that admits, which
   then goes through ``schedule()``).

**A step that must preempt.** Under memory pressure a batch soon reaches a step whose new blocks
do not fit (under ``vllm-v0``: a step that may leave fewer blocks free than a request's
sequences, whether it preempts or not). With implicit decoders the batch is kept
(``max_steps == 0``) and its step's running pass preempts as vLLM's does, visiting only the
sequences that allocate and the requests where the free blocks run out
(``pagesim.engine.policy.fast_path.preempting_decode``: ``vllm-v1``, and ``vllm-v0`` with chunked prefill off);
the survivors carry on, instead of a whole ``schedule()`` and a batch built afresh after it.

**A fork's first decode.** After a parallel-sampling fork the siblings share the prompt's partly
filled last block, and their next write copies it on write (``kv_manager.grow_table``: of k
holders, k - 1 copy and the last writes in place). With implicit decoders such sequences join the
batch all the same (``DecodeRun.copies``); its next step is then not skipped but made by the same
running pass (``max_steps == 0``), which takes the copies in scheduling order beside the new
blocks, counting them as the step's need, and preempts only if they do not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, cast

from pagesim.engine.policy.fast_path import bulk_decode
from pagesim.engine.policy.fast_path.bulk_decode import apply_in_bulk, keys_lazily, make_buckets
from pagesim.engine.policy.scheduling.lag import settle, settle_one
from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput, frozen_map
from pagesim.engine.policy.fast_path.preempting_decode import decodes_with_preemptions, decodes_with_v0_preemptions, preempts_in_step
from pagesim.engine.policy.scheduling.request import Request, RequestStatus, Sequence
from pagesim.engine.policy.scheduling.sampling import finish_reason
from pagesim.engine.policy.scheduling.steps.base import Step
from pagesim.engine.policy.scheduling.steps.vllm_v0 import ADMITS, SchedulingBudget, VllmV0StepOrder
from pagesim.engine.policy.scheduling.steps.vllm_v1 import VllmV1StepOrder
from pagesim.engine.policy.memory.usage import KvUsage
from pagesim.engine.policy.fast_path.window_decode import (HybridCounts, apply_hybrid_events, decode_record_tables, hybrid_events,
                                         table_counts)

if TYPE_CHECKING:
    from pagesim.engine.policy.memory.block_pool import BlockPool
    from pagesim.engine.policy.memory.kv_manager import KVCacheManager
    from pagesim.engine.policy.scheduling.sampling import OutputProcessor
    from pagesim.engine.policy.scheduling.scheduler import Scheduler

#: ``DecodeRun.eager`` of a run whose sequences were not counted (registrations made as the steps fill).
UNCOUNTED = 1 << 62

#: Stops of the waiting and swapped passes that stay true while only decodes run and nothing finishes.
STABLE_WAITING_STOPS = frozenset({"seq_limit", "no_plan", "blocks", "budget", "swapped"})


@dataclass(slots=True)
class DecodeRun:
    """A steady decoding state and how far it lasts.

    ``seqs`` are the running sequences in scheduling order; ``offsets[i]`` is such that
    ``seqs[i]`` has computed ``offsets[i] + t`` tokens before the scheduler's step ``t`` (so
    ``computed``, their computed tokens before the run's first step, is ``offsets[i] + step``, and
    the run's step ``j = 1, 2, ...`` computes position ``computed[i] + j - 1``), and
    ``finish_at[i]`` the scheduler's step in which each samples its last token. Both stay the same
    while the batch is carried from step to step, so carrying it copies no list.

    With ``buckets`` (``pagesim.engine.policy.fast_path.bulk_decode``: an ``lru`` pool, decisions not recorded, one
    KV group) the decoders are implicit: the steps touch only the sequences whose block boundary
    they reach, and the sequences' own counters and outputs lag until settled (the scheduler's
    ``_lazy_run``).
    """

    scheduler: Scheduler
    requests: list[Request]  # running order
    seqs: list[Sequence]  # scheduling order (request by request, live sequences in order)
    offsets: list[int]  # computed tokens before scheduler step t: offsets[i] + t
    finish_at: list[int]  # the step (the scheduler's numbers) in which each sequence samples its last token
    first_finish: int  # min(finish_at) - step + 1: the first step (1-based) in which some sequence finishes
    max_steps: int  # steps that can be skipped: no preemption, finishes only in the last
    free_blocks: int  # allocatable blocks (free + cached) before the first skipped step
    plain_free_blocks: int  # of those, never-cached ones (taken first; the rest evict)
    used_blocks: int
    cached_blocks: int
    table_blocks: int  # blocks in the running tables, a shared block once per table
    context_tokens: int  # sum(computed): the batch's cached tokens before the first step
    step: int  # the scheduler's next step when this state was taken (it is stale after any other)
    # ``finish_at`` as a binary heap (``heapq``), so the first finish after a change costs
    # O(changes x log sequences), not a pass over the batch. Unlike the lists it is carried in
    # place (finishes popped, newcomers pushed): a run's heap is valid until it is carried.
    # Every maker of a run sets it (``_run_of``, ``preempting_decode._survivors``).
    finish_heap: list[int]
    dropped_entries: int = 0  # table entries sliding windows dropped (hybrid caches: table_blocks counts the rest)
    released_entries: int = 0  # table entries the sequences it finished held when freed (set by _finish_seqs)
    buckets: list | None = None  # bulk_decode's buckets (None: every step writes every sequence's counters)
    widest: int = 1  # (vllm-v0) at least as many as the most sequences a request of it runs
    # (sequence, offset) pairs, in scheduling order, whose next write goes into a partly filled
    # block that another table holds too: a parallel-sampling fork's first decode, a copy on
    # write. Only with implicit decoders; such a run's first step is never skipped (``max_steps``
    # 0): the running pass of ``preempting_decode`` makes the copies, preempting or not.
    copies: list[tuple[Sequence, int]] | tuple = ()
    # Where the requests came from, for an executor that follows the batch as it changes (the
    # simulator's token runs): ``carried_from`` is the ``requests`` list of the run this one was
    # carried from when the list changed (``None``: built afresh, or the same list), and this
    # run's requests are those less the ones that completed since, plus ``joined`` at the back.
    carried_from: list[Request] | None = None
    joined: list[Request] | tuple = ()
    # {request id: live sequences} in running order, once a step asked for it (schedule_decode_step);
    # a carried run derives its own from it. Never written in place (carried runs share it).
    tokens: dict[str, int] | None = None
    _computed: list[int] | None = None  # (computed, once asked for)
    # The places (in ``seqs``) of the sequences its first finish retired, in order, once
    # ``_finish_seqs`` has (``_carry``, which always comes after it, drops them from the lists).
    finished_places: list[int] | None = None
    # With implicit decoders: how many of ``seqs`` fill blocks that may get real keys (not
    # ``bulk_decode.keys_lazily``), or more (``UNCOUNTED``). At 0 the steps make no registrations:
    # the lazy keys are given when each sequence is settled (``scheduling.lag.settle_one``).
    eager: int = UNCOUNTED

    # Written out, not generated by @dataclass (the same fields, in order; tests/test_compiled_build.py
    # checks): a compiled build compiles it with the class (pagesim/engine/compiled.py).
    def __init__(self, scheduler: Scheduler, requests: list[Request], seqs: list[Sequence], offsets: list[int],
                 finish_at: list[int], first_finish: int, max_steps: int, free_blocks: int, plain_free_blocks: int,
                 used_blocks: int, cached_blocks: int, table_blocks: int, context_tokens: int, step: int,
                 finish_heap: list[int], dropped_entries: int = 0, released_entries: int = 0,
                 buckets: list | None = None, widest: int = 1, copies: list[tuple[Sequence, int]] | tuple = (),
                 carried_from: list[Request] | None = None, joined: list[Request] | tuple = (),
                 tokens: dict[str, int] | None = None, _computed: list[int] | None = None,
                 finished_places: list[int] | None = None, eager: int = UNCOUNTED) -> None:
        self.scheduler = scheduler
        self.requests = requests
        self.seqs = seqs
        self.offsets = offsets
        self.finish_at = finish_at
        self.first_finish = first_finish
        self.max_steps = max_steps
        self.free_blocks = free_blocks
        self.plain_free_blocks = plain_free_blocks
        self.used_blocks = used_blocks
        self.cached_blocks = cached_blocks
        self.table_blocks = table_blocks
        self.context_tokens = context_tokens
        self.step = step
        self.finish_heap = finish_heap
        self.dropped_entries = dropped_entries
        self.released_entries = released_entries
        self.buckets = buckets
        self.widest = widest
        self.copies = copies
        self.carried_from = carried_from
        self.joined = joined
        self.tokens = tokens
        self._computed = _computed
        self.finished_places = finished_places
        self.eager = eager

    @property
    def computed(self) -> list[int]:
        """Each sequence's computed tokens before the run's first step (made once, O(sequences);
        a run's offsets and step never change)."""
        computed = self._computed
        if computed is None:
            step = self.step
            computed = self._computed = [offset + step for offset in self.offsets]
        return computed


@dataclass(slots=True)
class Advanced:
    """What ``advance`` did, per skipped step (index 0 = the first)."""

    first_step: int
    allocations: list[int]  # blocks allocated in each step
    evictions: list[int]  # of those, cached blocks evicted
    finished: list[Request]  # requests finished by the last step, in scheduling order
    hybrid: HybridCounts | None = None  # a hybrid cache's per-step counts (allocations, evictions, drops)

    # Written out, not generated by @dataclass (the same fields, in order; tests/test_compiled_build.py
    # checks): a compiled build compiles it with the class (pagesim/engine/compiled.py).
    def __init__(self, first_step: int, allocations: list[int], evictions: list[int], finished: list[Request],
                 hybrid: HybridCounts | None = None) -> None:
        self.first_step = first_step
        self.allocations = allocations
        self.evictions = evictions
        self.finished = finished
        self.hybrid = hybrid


def decode_run(s: Scheduler) -> DecodeRun | None:
    """The steady decoding state the scheduler is in, or ``None`` (see the module docstring)."""
    run = decode_batch(s)
    return run if run is not None and queues_stay_refused(s) else None


def queues_stay_refused(s: Scheduler) -> bool:
    """The waiting queue and the swapped queue are each empty, or their head was refused by the
    last (pure decode) step for a reason that holds while only decodes run and nothing finishes
    (for a hybrid cache's waiting head, not blocks: windows free blocks as they move)."""
    waiting, swapped = s.waiting, s.swapped
    if s.offload is not None and (s.kv_holding or s.offload.has_work or s.offload.has_unoffered(s.running)):
        # parked requests, copies in flight, finished requests the next step's bookkeeping tells
        # the store's policy of, or a refused offer made again each step: not decodes alone
        return False
    if s.pd is not None and (s.kv_holding or s.pd.has_work):  # (P/D reads parked or in flight)
        return False
    if not waiting and not swapped:
        return True
    hint = s._pure_decode_step
    return (hint is not None and hint[0] == s.next_step - 1 and not s._finished_in_last_update
            and (not waiting or hint[1] in STABLE_WAITING_STOPS and not (hint[1] == "blocks" and s.kv.hybrid))
            and (not swapped or hint[2] in STABLE_WAITING_STOPS))


_Scheduler: type | None = None  # engine.policy.scheduler.Scheduler, once decode_batch has imported it
#: The step orders whose pure decode steps ``advance`` applies (module docstring).
_STEADY_ORDERS = (VllmV1StepOrder, VllmV0StepOrder)


def takes_decode_steps(s: Scheduler) -> bool:
    """Whether ``schedule_decode_step`` may stand for a step of a decode batch that cannot be
    skipped: under ``vllm-v1`` always (a step that admits or swaps in also runs the decodes);
    under ``vllm-v0`` with chunked prefill off, for a step whose prefill pass admits nothing
    (then the step is the decodes and perhaps swap-ins; ``schedule_decode_step`` answers ``None``
    for one that admits, which runs the prefills alone, through ``schedule()``). With chunked
    prefill ``vllm-v0``'s running pass comes first and its prefills always run: no such step."""
    order = type(s.step_order)
    return order is VllmV1StepOrder or order is VllmV0StepOrder and not s.config.enable_chunked_prefill


def runs_prefills_alone(s: Scheduler) -> bool:
    """For a scheduler that ``takes_decode_steps``: whether the next step is a ``vllm-v0`` step
    whose prefill pass admits or rejects, so that it goes through ``schedule()``: asked before a
    decode batch is built for it. Counted with one sequence per running request, at most what the
    pass counts, so a head that the pass refuses for the sequence budget may be taken as admitted
    (the step then goes through ``schedule()``, as it may); ``schedule_decode_step`` counts exactly."""
    order = s.step_order
    return type(order) is VllmV0StepOrder and order.prefill_pass_stop(len(s.running)) == ADMITS


def _retire_finished() -> Callable[[Scheduler, int, list[Request]], None]:
    """``pagesim.engine.policy.scheduling.scheduler.retire_finished`` (imported on first use: a cycle at import time)."""
    global _retire
    if _retire is None:
        from pagesim.engine.policy.scheduling.scheduler import retire_finished
        _retire = retire_finished
    return _retire


_retire: Callable[[Scheduler, int, list[Request]], None] | None = None


def decode_batch(s: Scheduler) -> DecodeRun | None:
    """The running requests as a steady decode batch (every condition of the module docstring but
    the queues'), with how many steps it lasts, or ``None``."""
    global _Scheduler
    carried, s._decode_run = cast("DecodeRun | None", s._decode_run), None  # (the scheduler keeps it untyped)
    if not s.running or s._pending_rejections:
        return None
    if carried is not None and _still_current(s, carried):
        return _steady(s, carried)  # (what advance or update_decode_step left: nothing has happened since)
    if _Scheduler is None:
        from pagesim.engine.policy.scheduling.scheduler import Scheduler as _Scheduler  # (a cycle at import time otherwise)
    if type(s) is not _Scheduler or type(s.step_order) not in _STEADY_ORDERS:
        return None
    if s.offload is not None and not s.offload.prompt_only:
        return None  # decodes would offer their blocks to the offload store
    s.settle()  # (the sequences a lazy batch left behind, before they are read)
    bulk = bulk_ok(s)
    members = _decoders(s, s.running, copies_ok=bulk)  # (_run_of keeps copies only where preempting_decode may)
    if members is None:
        return None
    seqs, offsets, finish_at, table_blocks, dropped_entries, context, copies, eager = members
    buckets = make_buckets(seqs, offsets, s.block_size) if bulk else None
    return _steady(s, _run_of(s, list(s.running), seqs, offsets, finish_at, table_blocks, dropped_entries, context,
                              buckets, copies, eager=eager))


def _still_current(s: Scheduler, run: DecodeRun) -> bool:
    """Whether a batch the fast path left is still the scheduler's: no other step since, the same
    number of running requests (``abort_request`` drops it)."""
    return run.step == s.next_step and len(run.requests) == len(s.running)


def _steady(s: Scheduler, run: DecodeRun | None) -> DecodeRun | None:
    """``run`` if it can take a step; a batch whose next step must preempt (or copy on write) is
    kept for ``preempting_batch`` instead, and ``None`` returned."""
    if run is not None and not run.max_steps:
        s._decode_run = run
        return None
    return run


def preempting_batch(s: Scheduler) -> DecodeRun | None:
    """The running requests as a batch of implicit decoders whose next step cannot take its new
    blocks without preempting, or makes copies on write (``pagesim.engine.policy.fast_path.preempting_decode``), as
    the last ``decode_batch`` left it, or ``None``. Its one step is ``schedule_decode_step`` +
    ``update_decode_step``."""
    run = cast("DecodeRun | None", s._decode_run)
    if run is None or run.max_steps or not _still_current(s, run) or s._pending_rejections:
        return None
    s._decode_run = None
    return run


def bulk_ok(s: Scheduler) -> bool:
    """Whether decode steps may be applied in bulk, with implicit decoders (``bulk_decode``): one
    KV group, decisions not recorded, an eviction order that batches and reads no block stats."""
    eviction = s.pool.eviction
    return not (s.config.record_decisions or s.kv.hybrid) and eviction.batches and not eviction.reads_block_stats


def _decoders(s: Scheduler, requests: list[Request], copies_ok: bool = False
              ) -> tuple[list[Sequence], list[int], list[int], int, int, int, list | None, int] | None:
    """The live sequences of ``requests`` if every one is a steady decoder (module docstring):
    ``(seqs, offsets, finish_at, table blocks, dropped entries, sum(computed), copies, eager)``,
    each offset its sequence's computed tokens less the scheduler's next step
    (``DecodeRun.offsets``); else ``None``. A sequence whose next write would copy on write is not
    one, unless ``copies_ok``: it is then taken, and listed in ``copies`` (``DecodeRun.copies``;
    ``None`` when there is none). ``eager``: how many do not ``bulk_decode.keys_lazily``."""
    if s.kv.hybrid and not _hybrid_decoders(s, requests):
        return None
    bs = s.block_size
    ref_counts = s.pool.ref_counts
    max_model_len = s.config.max_model_len
    step = s.next_step
    last_step = step - 1  # (a sequence with one token left samples it in step last_step + 1)
    seqs: list[Sequence] = []
    offsets: list[int] = []
    finish_steps: list[int] = []
    table_blocks = context = eager = 0
    copies: list[tuple[Sequence, int]] | None = None
    kv = s.kv
    for request in requests:
        if request.beam_width > 1 or (request.n > 1 and not request.forked):
            return None
        prompt_len = request.prompt_len
        lens = request.sample_max_tokens
        for seq in request.live_seqs:
            c = seq.num_computed_tokens
            outputs = len(seq.output_token_ids)
            n = prompt_len + outputs  # seq.num_tokens, spelled out on this hot path
            if seq.parked or not seq.decoding or c != n - 1 or seq.num_filled_tokens != c:
                return None
            table = seq.block_table
            if c % bs and ref_counts[table[-1]] != 1:  # the next write would copy on write
                if not copies_ok:
                    return None
                if copies is None:
                    copies = []
                copies.append((seq, c - step))
            # It finishes at the step whose sample reaches its length (or max_model_len).
            limit = request.max_tokens if lens is None else lens[seq.index]  # request.max_tokens_of(seq)
            seqs.append(seq)
            offsets.append(c - step)
            context += c
            finish_steps.append(last_step + (limit - outputs if limit - outputs < max_model_len - n
                                             else max_model_len - n))
            table_blocks += len(table)
            if not keys_lazily(kv, seq):
                eager += 1
    if s.kv.hybrid:  # (blocks held, each table's count, and entries the windows dropped)
        return seqs, offsets, finish_steps, *table_counts(seqs), context, copies, eager
    return seqs, offsets, finish_steps, table_blocks, 0, context, copies, eager


def _hybrid_decoders(s: Scheduler, requests: list[Request]) -> bool:
    """A hybrid cache's further conditions for steady decoders (``window_decode``): one live
    sequence per request, every group's last block its own when the next write goes into it, the
    full blocks registered."""
    bs = s.block_size
    ref_counts = s.pool.ref_counts
    caching = s.kv.enable_prefix_caching
    for request in requests:
        if len(request.live_seqs) != 1:
            return False
        seq = request.live_seqs[0]
        c = seq.num_computed_tokens
        for table in (seq.block_table, *(seq.extra_tables or ())):
            last = table[-1] if table else None
            if last is None or (c % bs and ref_counts[last] != 1):
                return False
        if caching and seq.num_registered_blocks != c // bs:
            return False
    return True


def _run_of(s: Scheduler, requests: list[Request], seqs: list[Sequence], offsets: list[int], finish_at: list[int],
            table_blocks: int, dropped_entries: int, context: int, buckets: list | None,
            copies: list | None = None, finish_heap: list[int] | None = None, eager: int = UNCOUNTED
            ) -> DecodeRun | None:
    """The ``DecodeRun`` of these decoders (the running requests, in order), or ``None`` when it
    cannot take one step: some would wait for the token budget, or no step fits in the free blocks.
    With ``copies`` (``DecodeRun.copies``) its first step is the preempting pass's, never skipped."""
    if not seqs or len(seqs) > s.config.max_num_batched_tokens:  # some would wait for budget: not the same batch
        return None
    pool = s.pool
    cached = pool.num_cached_free_blocks
    plain = pool.num_plain_free_blocks
    free = plain + cached  # (pool.num_free_blocks)
    if finish_heap is None:  # (built afresh: O(sequences), as the lists were)
        finish_heap = finish_at.copy()
        heapify(finish_heap)
    first_finish = horizon = finish_heap[0] - s.next_step + 1  # (min(finish_at))
    widest = 1  # (vllm-v0: the most sequences a request runs)
    if horizon >= 1:
        # vLLM 0.6.3 lets a group append only while the free blocks cover a block per running
        # sequence of it (``VllmV0StepOrder._can_append``: a decode touches one block, new or not),
        # checked group by group as the step allocates: steps that leave that many free whatever
        # the order pass every check. vLLM v1 needs only the blocks it allocates.
        room = free // s.kv.num_groups  # (a hybrid cache: a new block in every group; drops only add room)
        if type(s.step_order) is VllmV0StepOrder:
            # (as many sequences as requests: one each, since a running request has one at least)
            widest = 1 if len(seqs) == len(requests) else max([len(request.live_seqs) for request in requests])
            room -= widest
        horizon = (_steps_within_blocks(offsets, s.next_step, s.block_size, room, horizon, buckets) if room >= 0
                   else 0)
    if copies:
        horizon = 0  # (a step that copies on write is not a pure decode step: preempting_decode makes it)
    if horizon < 1:
        if first_finish < 1 or buckets is None or not preempts_in_step(s):
            return None
        horizon = 0  # (its next step must preempt: preempting_batch, then schedule_decode_step)
    run = DecodeRun(s, requests, seqs, offsets, finish_at, first_finish, horizon, free, plain,
                    pool.num_usable_blocks - free, cached, table_blocks, context, s.next_step, finish_heap,
                    dropped_entries, buckets=buckets, widest=widest, eager=eager)
    if copies:
        run.copies = copies
    return run


def _carry(run: DecodeRun, k: int, allocated: int, admitted: list[Request] | None = None,
           dropped: int = 0) -> DecodeRun | None:
    """The batch after ``run``'s first ``k`` steps were applied and their finishes retired (and
    ``admitted`` joined it, for a ``DecodeStep``): what ``decode_batch`` would find, built from
    what the run knows (the survivors are still steady decoders: their offsets stay, a block they
    filled was replaced by a fresh one of their own) plus the checks of the newcomers; ``None``
    when it is not a batch (a lazy batch's survivors are then settled). ``allocated``: the blocks
    the steps gave the batch, ``dropped``: the table entries windows dropped from it (hybrid
    caches). Left for the next ``decode_batch`` (``Scheduler._decode_run``), and, with implicit
    decoders, as the scheduler's lazy batch (``Scheduler._lazy_run``)."""
    s = run.scheduler
    bs = s.block_size
    buckets = run.buckets  # (changed in place: the run is stale once carried)
    tokens = run.tokens  # (shared while nothing changes: never written in place)
    heap = run.finish_heap  # (changed in place too)
    eager = run.eager
    owned = run.first_finish == k  # (whether the lists below are copies of our own, extended in place)
    if owned:  # some finished (_finish_seqs retired them): keep the others, in order
        gone = run.finished_places  # their places, in order: the heap's least entries
        assert gone is not None  # (_finish_seqs set them)
        for _ in gone:
            heappop(heap)
        seqs, offsets, finish_at = run.seqs.copy(), run.offsets.copy(), run.finish_at.copy()
        for i in reversed(gone):
            del seqs[i], offsets[i], finish_at[i]
        requests = run.requests
        if tokens is not None:
            tokens = tokens.copy()
        end = run.step + k
        context = run.context_tokens + k * len(run.seqs)
        left = None  # the latest request that left (its samples are consecutive in ``gone``)
        for i in gone:
            seq = run.seqs[i]
            context -= run.offsets[i] + end
            if buckets is not None:
                bulk_decode.leave(buckets, seq, run.offsets[i], bs)
            if eager and not keys_lazily(s.kv, seq):  # (at 0, none was eager: nothing to count off)
                eager -= 1
            request = seq.request
            if request.live_seqs:  # (a request with other samples still running stays)
                if tokens is not None:
                    tokens[request.request_id] = len(request.live_seqs)
            elif request is not left:
                left = request
                if tokens is not None:
                    del tokens[request.request_id]
                if requests is run.requests:
                    requests = requests.copy()
                requests.remove(request)  # (requests compare by identity)
        # (the tables after the steps, less those the finished sequences held when freed)
        table_blocks, dropped_entries = (table_counts(seqs) if s.kv.hybrid
                                         else (run.table_blocks + allocated - run.released_entries, 0))
    else:
        seqs, offsets, finish_at, requests = run.seqs, run.offsets, run.finish_at, run.requests
        table_blocks, dropped_entries = run.table_blocks + allocated - dropped, run.dropped_entries + dropped
        context = run.context_tokens + k * len(seqs)
    copies: list[tuple[Sequence, int]] | None = None  # (the newcomers' copies on write)
    members = _decoders(s, admitted, copies_ok=buckets is not None) if admitted else None
    if admitted and members is not None:
        if buckets is not None:
            bulk_decode.join(buckets, members[0], members[1], bs)
        if owned:
            seqs += members[0]
            offsets += members[1]
            finish_at += members[2]
        else:
            seqs = seqs + members[0]
            offsets = offsets + members[1]
            finish_at = finish_at + members[2]
        for step in members[2]:
            heappush(heap, step)
        table_blocks += members[3]
        dropped_entries += members[4]
        context += members[5]
        copies = members[6]
        eager += members[7]
        if requests is run.requests:
            requests = requests + admitted
        else:  # (a copy of our own: the finishes made it)
            requests += admitted
        if tokens is not None:
            joined = {request.request_id: len(request.live_seqs) for request in admitted}
            if owned:  # (the finishes copied it)
                tokens.update(joined)
            else:
                tokens = tokens | joined
    carried = (None if admitted and members is None  # (a newcomer is not a steady decoder)
               else _run_of(s, requests, seqs, offsets, finish_at, table_blocks, dropped_entries, context, buckets,
                            copies, heap, eager))
    if carried is not None:
        carried.tokens = tokens
        if requests is not run.requests:
            carried.carried_from = run.requests
            if admitted:
                carried.joined = admitted
        if buckets is not None:
            s._lazy_run = carried
    elif buckets is not None:  # nothing carries the survivors: they are brought up to date now
        settle(seqs, offsets, s.next_step, bs, s.kv.registered_keys)
        s._lazy_run = None
    return carried


def _steps_within_blocks(offsets: list[int], step: int, bs: int, free: int, horizon: int,
                         buckets: list | None = None) -> int:
    """The most decode steps from scheduler step ``step``, up to ``horizon``, whose new blocks
    fit in ``free`` (``free >= 0``). A sequence at computed ``c = offset + step`` takes a new
    block in step ``j`` when ``(c + j - 1) % bs == 0``, i.e. in the scheduler steps ``t`` with
    ``t % bs == (-offset) % bs``: step ``j`` allocates as many blocks as there are sequences with
    that residue (``buckets``' sizes, when the batch has them), and every ``bs`` steps each
    sequence one. So whole periods are counted at once and the rest step by step: O(bs), not
    O(sequences) per probe of a search."""
    n = len(offsets)
    if n * (horizon // bs + 1) <= free:  # (each sequence takes at most this many)
        return horizon
    periods = free // n  # whole periods of bs steps that fit: n blocks each
    k = periods * bs
    if k >= horizon:
        return horizon
    sizes = bulk_decode.residue_counts(buckets, offsets, bs)
    left = free - periods * n  # (< n: the next period does not fit whole)
    for j in range(k + 1, min(horizon, k + bs) + 1):
        left -= sizes[(step + j - 1) % bs]
        if left < 0:
            return j - 1
    return horizon  # (reached only when horizon < k + bs)


def advance(run: DecodeRun, k: int) -> Advanced:
    """Apply ``k`` (``1 <= k <= run.max_steps``) pure decode steps, exactly as ``k`` rounds of
    ``schedule()`` and ``update()`` with unnamed tokens would; the run is stale afterwards. A
    hybrid cache's steps are ``window_decode``'s events, applied one at a time by the KV
    manager's own calls. With implicit decoders (``run.buckets``), a stretch of at most
    ``bulk_decode.LAZY_BLOCKS`` blocks' steps touches only the sequences whose block boundary
    it reaches."""
    s = run.scheduler
    if not 1 <= k <= run.max_steps:
        raise ValueError(f"can advance 1 to {run.max_steps} steps, not {k}")
    kv = s.kv
    pool = s.pool
    first_step = s.next_step
    aborted = s._pending_aborts  # (aborts since the last step: the first step's record lists them)
    if aborted:
        s._pending_aborts = []
    seqs = run.seqs
    recording = s.config.record_decisions
    bulk = run.buckets is not None
    computed = None if bulk and k <= bulk_decode.LAZY_BLOCKS * s.block_size else run.computed
    if not bulk:  # (apply_in_bulk appends them itself)
        unnamed = [None] * k
        for seq in seqs:  # the tokens exist before their blocks are registered (contents are by position)
            seq.output_token_ids.extend(unnamed)
    offload = s.offload
    if offload is not None:  # (its copies of the step before are done; decodes store nothing)
        offload.begin_step()
    hybrid = None
    if kv.hybrid:
        hybrid = HybridCounts(k, kv.num_groups)
        allocations, evictions = hybrid.allocations, hybrid.evictions
        assert computed is not None  # (never implicit decoders: one KV group only)
        events = hybrid_events(kv, computed, seqs, k)

        def apply(e: int, through_step: int) -> int:
            return apply_hybrid_events(events, e, through_step, seqs, computed, kv, hybrid)
    else:
        allocations = [0] * k
        evictions = [0] * k
        if bulk:
            if computed is None:  # implicit decoders: the pool calls of the sequences reaching a boundary
                bulk_decode.apply_lazily(run, k, kv, pool, allocations, evictions)
            else:  # (the tokens, the pool calls and set_computed, in one pass over the sequences)
                apply_in_bulk(seqs, computed, k, kv, pool, allocations, evictions)
            s._lazy_run = run
            events = None
        else:
            assert computed is not None  # (not bulk)
            events = decode_events(computed, s.block_size, k, kv.enable_prefix_caching)

            def apply(e: int, through_step: int) -> int:
                return apply_events(events, e, through_step, seqs, computed, kv, pool, allocations, evictions)
    if events is not None:
        if recording:
            free_cpu = s.swap_pool.num_free_blocks
            free_offload = None if offload is None else offload.store.num_free_blocks
            e = 0
            for j in range(1, k + 1):
                e = apply(e, j)
                record = _decode_record(first_step + j - 1, run.requests, pool.num_free_blocks, free_cpu,
                                        free_offload, hybrid=hybrid is not None, pd=s.pd is not None)
                if j == 1 and aborted:
                    record["aborted"] = list(aborted)
                s.decision_log.append(record)
                s._last_record = record
        else:
            e = apply(0, k)
        assert e == len(events)
        set_computed(run, k)
    s.next_step += k
    # As after a pure decode schedule(): the waiting and swapped heads (if any) still refused for
    # their reasons.
    hint = s._pure_decode_step
    if s.waiting or s.swapped:
        assert hint is not None  # (a queue waits behind decodes only after a pure decode schedule() said why)
        s._pure_decode_step = (s.next_step - 1, hint[1] if s.waiting else "empty", hint[2] if s.swapped else "empty")
    else:
        s._pure_decode_step = (s.next_step - 1, "empty", "empty")
    finished = _finish(run, k)
    s._decode_run = _carry(run, k, sum(allocations), dropped=0 if hybrid is None else sum(hybrid.dropped))
    return Advanced(first_step, allocations, evictions, finished, hybrid)


def decode_events(computed: list[int], bs: int, k: int, caching: bool) -> list[int]:
    """The pool calls of ``k`` decode steps, in the order the step-by-step path makes them: step
    by step, sequence by sequence, a sequence's new block before the block it fills is
    registered. Each is one int, ``(step * len(computed) + scheduling position) * 2 + kind``
    (kind 0 allocates, 1 registers), so that sorting the ints sorts the calls; ``divmod(code,
    2 * len(computed))`` gives back the step and ``2 * position + kind``."""
    events: list[int] = []
    width = 2 * len(computed)  # codes of step j are [j * width, (j + 1) * width)
    if k <= bs:  # (the usual skip: at most one event of each kind per sequence)
        append = events.append
        for i, c in enumerate(computed):
            first = (-c) % bs + 1  # the step that allocates
            if first <= k:
                append(first * width + 2 * i)
            if caching:
                fills = first - 1 if first > 1 else bs  # (-c - 1) % bs + 1: the step that fills a block
                if fills <= k:
                    append(fills * width + 2 * i + 1)
        events.sort()
        return events
    end = (k + 1) * width
    stride = bs * width
    for i, c in enumerate(computed):
        first = (-c) % bs + 1
        if first <= k:
            events.extend(range(first * width + 2 * i, end, stride))
        if caching:
            first = (-c - 1) % bs + 1
            if first <= k:
                events.extend(range(first * width + 2 * i + 1, end, stride))
    events.sort()
    return events


def set_computed(run: DecodeRun, k: int) -> None:
    """Each sequence's counters after computing ``k`` more tokens (as ``Scheduler.run`` leaves them)."""
    bs = run.scheduler.block_size
    caching = run.scheduler.kv.enable_prefix_caching
    for seq, c in zip(run.seqs, run.computed):
        end = c + k
        seq.num_computed_tokens = end
        seq.num_filled_tokens = end
        if caching and end // bs > seq.num_registered_blocks:
            seq.num_registered_blocks = end // bs


def _finish(run: DecodeRun, k: int) -> list[Request]:
    """``update()``'s finishes for step ``k``: sequences retire in scheduling order (their blocks
    freed in that order), then the finished requests leave the scheduler (``retire_finished``)."""
    retire_finished = _retire_finished()
    s = run.scheduler
    processor = s.output_processor
    if k < run.first_finish:
        s._finished_in_last_update = False
        retire_finished(s, s.next_step - 1, [])
        return []
    finished = _finish_seqs(run, k, processor)
    s._finished_in_last_update = bool(run.finished_places)  # (always: k is the run's first finish)
    retire_finished(s, s.next_step - 1, finished)
    return finished


def _finish_seqs(run: DecodeRun, k: int, processor: OutputProcessor) -> list[Request]:
    """Retire the sequences whose last token is step ``k``'s, in scheduling order (the run's
    sequences are request by request, each request's live sequences in order); returns the
    requests left with none, in that order. O(finishing) Python work (``list.index`` scans).
    A lazy batch's sequence is settled first: finishing reads its outputs."""
    finish_at, seqs, offsets = run.finish_at, run.seqs, run.offsets
    last = run.step + k - 1
    end = run.step + k  # (the scheduler's next step)
    bs = run.scheduler.block_size
    keys = run.scheduler.kv.registered_keys
    max_model_len = processor.max_model_len
    finished: list[Request] = []
    released = 0
    places = run.finished_places = _places_of(finish_at, last, _least_count(run.finish_heap, last))
    for i in places:
        seq = seqs[i]
        settle_one(seq, offsets[i] + end, bs, keys)
        released += len(seq.block_table)
        reason = finish_reason(seq, max_model_len)
        assert reason is not None  # (this is its last token)
        processor._finish(seq, reason)
        request = seq.request
        if not request.live_seqs:
            request.status = RequestStatus.FINISHED
            finished.append(request)
    run.released_entries = released
    return finished


def _least_count(heap: list[int], value: int) -> int:
    """How many entries of ``heap`` (a ``heapq`` heap) equal ``value`` when none is less: they
    are the root and the subtree of equal entries below it, so O(those), not O(heap)."""
    size = len(heap)
    if not size or heap[0] != value:
        return 0
    if (size < 2 or heap[1] != value) and (size < 3 or heap[2] != value):
        return 1  # (the usual: one finishes)
    count = 0
    below = [0]
    while below:
        i = below.pop()
        if i < size and heap[i] == value:
            count += 1
            below += (2 * i + 1, 2 * i + 2)
    return count


def _places_of(values: list[int], value: int, count: int) -> list[int]:
    """The first ``count`` places of ``value`` in ``values``, in order (``list.index`` scans, in C)."""
    places = []
    i = -1
    for _ in range(count):
        i = values.index(value, i + 1)
        places.append(i)
    return places


def apply_events(events: list[int], e: int, through_step: int, seqs: list[Sequence], computed: list[int],
                 kv: KVCacheManager, pool: BlockPool, allocations: list[int], evictions: list[int]) -> int:
    """Carry out the events of steps up to ``through_step`` from index ``e``; returns the next index."""
    bs = kv.block_size
    num = len(events)
    width = 2 * len(seqs)
    stop = (through_step + 1) * width  # codes of later steps
    while e < num:
        code = events[e]
        if code >= stop:
            break
        j, rest = divmod(code, width)
        i, kind = rest >> 1, rest & 1
        seq = seqs[i]
        if kind == 0:
            evicted = pool.num_evictions
            seq.block_table.append(pool.allocate())
            seq.table_snapshot = None
            allocations[j - 1] += 1
            evictions[j - 1] += pool.num_evictions - evicted
        else:
            kv.register_block(seq, (computed[i] + j) // bs - 1)  # the block its step-j token completes
        e += 1
    return e


def _decode_once(seqs: list[Sequence], computed: list[int], kv: KVCacheManager, pool: BlockPool) -> tuple[int, int]:
    """One decode step's pool calls and counters (``decode_events`` and ``apply_events`` for
    ``k = 1``, then ``set_computed``) in one pass over the sequences in scheduling order: a
    sequence whose next token starts a block allocates it, takes its counters, and registers the
    block its token fills. The pool calls are made in ``decode_events``' order; the counters may
    be set before them (a registration reads a sequence's table, tokens and lazy start, an
    allocation no sequence at all). Returns the blocks allocated and the cached blocks those
    evicted."""
    bs = kv.block_size
    caching = kv.enable_prefix_caching
    allocated = 0
    evicted = pool.num_evictions
    for seq, c in zip(seqs, computed):
        if not c % bs:
            seq.block_table.append(pool.allocate())
            seq.table_snapshot = None
            allocated += 1
        end = c + 1
        seq.num_computed_tokens = end
        seq.num_filled_tokens = end
        if caching:
            if not end % bs:
                kv.register_block(seq, end // bs - 1)  # the block this token completes
            if end // bs > seq.num_registered_blocks:
                seq.num_registered_blocks = end // bs
    return allocated, pool.num_evictions - evicted


def _decode_record(step: int, requests: list[Request], num_free: int, num_free_cpu: int,
                   num_free_offload: int | None, hybrid: bool = False, pd: bool = False) -> dict:
    """The decision record of one pure decode step (``SchedulerOutput.to_record``'s format)."""
    scheduled = {}
    block_ids: dict[str, dict[str, list[int]]] = {}
    group_block_ids = None
    if hybrid:  # (the null block where a window dropped an entry; every group's table)
        block_ids, group_block_ids = decode_record_tables(requests)
    for request in requests:
        rid = request.request_id
        live = request.live_seqs
        scheduled[rid] = len(live)
        if not hybrid:
            block_ids[rid] = {str(seq.index): list(seq.block_table) for seq in live}
    record = {
        "step": step, "scheduled": scheduled, "order": list(scheduled), "new": {}, "resumed": [],
        "resumed_cached": {}, "swapped_in": [], "preempted": [], "preempted_mode": {}, "rejected": {},
        "finished": [], "num_free_blocks": num_free, "num_free_cpu_blocks": num_free_cpu, "block_ids": block_ids,
        "blocks_to_copy": [], "blocks_to_swap_out": [], "blocks_to_swap_in": [],
    }
    if group_block_ids:
        record["group_block_ids"] = group_block_ids
    if num_free_offload is not None:
        record.update(num_free_offload_blocks=num_free_offload, blocks_to_load=[], blocks_to_store=[], offload_hits={},
                      parked=[], offload_evictions=0)
    if pd:  # (a P/D instance's: nothing read, received or freed in a pure decode step)
        record.update(kv_recv={}, kv_received=[], kv_freed=[], parked=[])
    return record


# --------------------------------------------------- a decode step that also admits
@dataclass(slots=True)
class DecodeStep:
    """One step of a decode batch with the swapped and waiting passes run as ``schedule()`` runs
    them.

    ``output`` is the step's ``SchedulerOutput`` except that ``scheduled`` lists only the
    sequences the swapped and waiting passes added (the batch's decodes are ``run``'s); every other
    field is the whole step's. Only an executor that does not need the decodes listed one by one
    (a simulator) may use it; ``update_decode_step`` must follow.
    """

    run: DecodeRun
    output: SchedulerOutput
    allocations: int  # blocks the decodes allocated
    evictions: int
    admitted: list[Request]  # the requests the swapped and waiting passes added to running, in order
    dropped: int = 0  # table entries the decodes' windows dropped (hybrid caches)
    preempted: list[Request] | tuple = ()  # the running pass's victims, in order (``run`` is the survivors')
    copies: int = 0  # of ``allocations``, the decodes' copies on write (they replace a table entry, add none)

    # Written out, not generated by @dataclass (the same fields, in order; tests/test_compiled_build.py
    # checks): a compiled build compiles it with the class (pagesim/engine/compiled.py).
    def __init__(self, run: DecodeRun, output: SchedulerOutput, allocations: int, evictions: int,
                 admitted: list[Request], dropped: int = 0, preempted: list[Request] | tuple = (),
                 copies: int = 0) -> None:
        self.run = run
        self.output = output
        self.allocations = allocations
        self.evictions = evictions
        self.admitted = admitted
        self.dropped = dropped
        self.preempted = preempted
        self.copies = copies


def schedule_decode_step(run: DecodeRun) -> DecodeStep | None:
    """``schedule()`` for a step whose running pass is ``run``'s decodes: the decodes' pool calls
    as ``advance`` makes them, then the ``vllm-v1`` order's swapped and waiting passes themselves
    (swap-ins, admissions, rejections), so a step that admits a request costs O(admitted +
    blocks), not O(running). A batch whose step must preempt (``max_steps == 0``, from
    ``preempting_batch``) makes its running pass with ``preempting_decode``: the step's ``run``
    is then the survivors' and its ``preempted`` the victims; no queue is served after it.

    Under ``vllm-v0`` (chunked prefill off; ``takes_decode_steps``) the step's passes are that
    order's: its prefill pass first, which must admit and reject nothing (else this answers
    ``None`` having changed nothing, and the step goes through ``schedule()``), then the decodes
    (``preempting_decode.decodes_with_v0_preemptions`` when they must preempt), then, if nothing
    was preempted, its swapped pass; the requests swapped in join ``running`` at the back."""
    s = run.scheduler
    cfg = s.config
    st = Step(step=s.next_step, token_budget=cfg.max_num_batched_tokens - len(run.seqs))
    order = s.step_order
    v0 = type(order) is VllmV0StepOrder
    if v0:
        assert isinstance(order, VllmV0StepOrder)
        st.waiting_stop = order.prefill_pass_stop(len(run.seqs))
        if st.waiting_stop == ADMITS:
            return None
    s.next_step += 1
    offload = s.offload
    if offload is not None:
        offload.begin_step()
    if s.pd is not None:
        s.pd.begin_step()
    allocations, evictions = [0], [0]
    dropped = 0
    victims: list[Request] | tuple = ()
    copied = 0
    if s.kv.hybrid:
        counts = HybridCounts(1, s.kv.num_groups)
        apply_hybrid_events(hybrid_events(s.kv, run.computed, run.seqs, 1), 0, 1, run.seqs, run.computed, s.kv, counts)
        allocations, evictions, dropped = counts.allocations, counts.evictions, counts.dropped[0]
        set_computed(run, 1)
    elif run.buckets is not None:  # implicit decoders: those reaching a block boundary
        if run.max_steps:
            bulk_decode.apply_lazily(run, 1, s.kv, s.pool, allocations, evictions, sampled=0)
        else:  # (the step's blocks do not fit, or it copies on write: the running pass; run becomes the survivors')
            preempting = decodes_with_v0_preemptions if v0 else decodes_with_preemptions
            run, allocations[0], evictions[0], victims = preempting(run, st)
            copied = len(st.copies)  # (before the queues' passes add theirs)
        s._lazy_run = run
        s._lazy_mid_step = True  # (until update_decode_step: a reader finds the step's tokens unsampled)
    else:
        allocations[0], evictions[0] = _decode_once(run.seqs, run.computed, s.kv, s.pool)
    tokens = run.tokens
    if tokens is None:
        tokens = run.tokens = {request.request_id: len(request.live_seqs) for request in run.requests}
    st.tokens_per_request = tokens.copy()  # (the waiting pass adds its admissions)
    if not st.preempted:  # (a step that preempted serves no queue, under either order)
        if v0:  # (VllmV0StepOrder.schedule: the swapped pass, on what the decodes left of the budget)
            n = len(run.seqs)
            budget = SchedulingBudget.already_used(cfg.max_num_batched_tokens, cfg.max_num_seqs, n, n)
            assert isinstance(order, VllmV0StepOrder)
            s.running.extend([request for request, _ in order._schedule_swapped(st, budget)])
        else:  # (VllmV1StepOrder.schedule)
            assert isinstance(order, VllmV1StepOrder)
            order._schedule_swapped(st)
            order._schedule_waiting(st)
    stores, offload_fields = s.end_offload_step(st)
    pure = st.only_computes() and not (s._pending_rejections or stores or s.kv_holding)
    s._pure_decode_step = (st.step, st.waiting_stop, st.swapped_stop) if pure else None
    output = SchedulerOutput(
        step=st.step, scheduled=tuple(st.scheduled), num_scheduled_tokens=frozen_map(st.tokens_per_request),
        new=frozen_map(st.new), resumed=frozen_map(st.resumed), swapped_in=tuple(st.swapped_in),
        preempted=tuple(st.preempted), rejected=frozen_map(s._pending_rejections), blocks_to_copy=tuple(st.copies),
        blocks_to_swap_out=tuple(st.swap_out),
        blocks_to_swap_in=tuple(st.swap_in), num_free_blocks=s.pool.num_free_blocks,
        num_free_cpu_blocks=s.swap_pool.num_free_blocks, num_cached_free_blocks=s.pool.num_cached_free_blocks,
        **offload_fields,
        aborted=tuple(s._pending_aborts) if s._pending_aborts else (),
    )
    s._pending_rejections = {}
    if s._pending_aborts:
        s._pending_aborts = []
    if cfg.record_decisions:  # the whole step's record, decodes listed
        bs = s.block_size
        decodes = tuple(ScheduledSequence(seq.request.request_id, seq.index, c, 1, seq.block_table_tuple(), bs, True,
                                          seq.extra_table_tuples() if seq.extra_tables is not None else ())
                        for seq, c in zip(run.seqs, run.computed))
        s._last_record = replace(output, scheduled=decodes + output.scheduled).to_record()
        s.decision_log.append(s._last_record)
    return DecodeStep(run, output, allocations[0], evictions[0], s.running[len(run.requests):], dropped, victims,
                      copied)


def decode_step_usage(step: DecodeStep) -> KvUsage:
    """``Scheduler.kv_usage()`` right after ``schedule_decode_step``, in O(admitted): the batch's
    tables hold ``table_blocks`` plus the step's new blocks (a copy on write replaces an entry), and
    each of its sequences holds ``computed + 1`` tokens with a last block of its own (``decode_batch``
    requires a partly filled one to be unshared, or copied in this step; a full one got a fresh
    block), so their idle slots are the blocks' slots less those tokens. The requests the swapped
    and waiting passes added follow the batch's in the running list, and parked requests hold their
    own; a partly filled block is never shared across requests (a hit takes full blocks only; a
    swap-in takes fresh ones)."""
    run = step.run
    s = run.scheduler
    blocks = run.table_blocks + step.allocations - step.copies
    if s.kv.hybrid:  # every group's table: held entries, and idle slots in each group's last block
        idle = ((blocks + run.dropped_entries) * s.block_size
                - s.kv.num_groups * (run.context_tokens + len(run.seqs)))
        blocks -= step.dropped
    else:
        idle = blocks * s.block_size - run.context_tokens - len(run.seqs)
    if step.admitted or s.kv_holding:  # (and the requests parked while their KV loads: they hold blocks)
        more_blocks, more_idle = s.table_slots([*step.admitted, *s.kv_holding])
        blocks += more_blocks
        idle += more_idle
    return s.usage_with(blocks, idle)


def update_decode_step(step: DecodeStep) -> list[Request]:
    """``update()`` for a ``DecodeStep`` with unnamed tokens: the decodes' tokens and finishes, in
    scheduling order, then the admitted sequences' (``OutputProcessor.process``)."""
    retire_finished = _retire_finished()
    run = step.run
    s = run.scheduler
    processor = s.output_processor
    retired = processor.num_seqs_finished
    finished: list[Request] = []
    if run.buckets is None:  # (implicit decoders get theirs when settled)
        for seq in run.seqs:
            seq.output_token_ids.append(None)
    s._lazy_mid_step = False
    if run.first_finish == 1:  # (some sequence samples its last token in this step)
        finished = _finish_seqs(run, 1, processor)
    finished += processor.process(step.output, s.requests)
    retire_finished(s, step.output.step, finished)
    s._finished_in_last_update = processor.num_seqs_finished != retired
    if s.offload is not None and s.complete_offload_in_update:  # (Scheduler.update's)
        s.offload.complete(step.output.step)
    s._decode_run = _carry(run, 1, step.allocations - step.copies, [r for r in step.admitted if r.live_seqs],
                           step.dropped)
    return finished
