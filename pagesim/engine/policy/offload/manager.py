"""The scheduler's side of KV offloading: what a request can load from the offload store, the
copies each step names, and when a request may use what it loaded. This is vLLM 0.33's native
``OffloadingConnector``, scheduler side (``distributed/kv_transfer/kv_connector/v1/offloading/
scheduler.py``, "OS" below), with one offload block per GPU block (its default), synchronous
scheduling, one full-attention KV group.

What happens, step by step (``Scheduler`` and the ``vllm-v1`` step order call these):

1. **Lookup** (``lookup``; OS ``get_num_new_matched_tokens``) when a request with nothing computed
   (new, or back after a recompute preemption) reaches the head of the waiting queue: its GPU hit
   (capped at ``num_tokens - 1``) ends at block ``g``; the store is searched from block ``g`` through
   the request's LAST token (``num_tokens // block_size`` blocks: a block-aligned prompt can hit
   its last block too), counting blocks held ready or still being stored, up to the first it does
   not hold. If one of them is still being stored, or is being loaded for another request, or the
   request still has copies in flight, the answer is "not yet" (``None``): the request is skipped
   this step, keeping its place, and the queue goes on behind it. Each lookup starts the request's
   store pointer again from its first block.
2. **Load** (``load``): the hit blocks get fresh GPU blocks; ``(slot, GPU block)`` copies go in the
   step's ``blocks_to_load``. A load is **synchronous** (done before the step's forward pass, the
   request computing its remaining tokens in the same step) only when
   ``offload_sync_load_budget_bytes`` > 0, the hit leaves at least one token to compute and the
   step's synchronous loads still fit the budget (``offload_block_bytes`` per block; OS
   ``_reserve_sync_load``); else it is **asynchronous** (vLLM's default): the request is parked
   (``Request.loading``: holding its blocks, not running, not scheduled, its loaded blocks not in
   the GPU prefix cache yet) until the executor reports the copy done (``complete``).
3. **Promotion** (``promote``; the scheduler's ``_update_waiting_for_remote_kv``): at the first
   ``schedule()`` after that, the request's loaded blocks join the GPU prefix cache, and if they
   cover all its tokens it computes the last one again (``num_tokens - 1`` computed).
4. **Stores** (``end_step``; OS ``_build_store_jobs``): for every request scheduled this step, in
   scheduling order, then every request finished since the last step (in the iteration order of
   a Python ``set`` of their ids, as vLLM walks ``finished_req_ids``), the full blocks from its
   store pointer up to its computed tokens (its prompt only, with ``offload_prompt_only``; a
   finished request up to ``max(prompt, num_tokens - 1)``) are offered. An offer is stored whole
   or refused whole (``OffloadStore.prepare_store``); a refused offer leaves the pointer where it
   was, so the same blocks are offered again the next time the request is scheduled (or once
   more after it finishes). ``(GPU block, slot)`` copies go in ``blocks_to_store``.
5. **Finished requests** (``end_step``, after the stores): the eviction policy hears that a request
   finished (``request_finished``: its keys in block order, those it reused) only in the step
   after it finished, as vLLM's connector does.
6. **Completions** (``complete``): the executor reports each step's loads and stores done (the
   scheduler, by default, at that step's ``update``); a store's keys become ready, a load's unpin,
   and a parked request may be promoted. A request preempted with stores in flight has them
   flushed (done in that step, vLLM's ``jobs_to_flush``), so it can be looked up again.

**vLLM 0.15's connector** (``connector="0.15"``: the ``OffloadingConnector`` of vLLM 0.15.1, as
``vllm serve --kv-offloading-size`` ran it in early 2026) differs in four places, each kept here:

- it stores every full block a request computes, generated ones too (it has no prompt-only mode);
- a store is reported done only once its request has finished (the worker's ``get_finished``
  names a request in ``finished_sending`` only after ``finished_req_ids`` did), or when the
  request is preempted (``build_connector_meta`` completes the victims' stores): until then its
  blocks are neither found by a lookup nor evictable, however long the request runs;
- a lookup counts the blocks ready in the store up to the first that is not, with no "not yet"
  for blocks still being stored (only for blocks being loaded for another request);
- a finished request offers nothing more (``request_finished`` forgets it).

Its CPU manager also finds victims by walking every entry it holds (``OffloadStore``'s
``step_scan_entries``): once running requests' blocks, pinned until they finish, fill the store,
every offer is refused after a walk through all of it, and every running request offers again at
every step. The scheduler's time grows with that walk, which the cost model prices
(``pagesim.sim.cost.roofline``, ``offload_scan_entry_s``).

Invariants: a parked request is in the scheduler's ``kv_holding`` queue and nowhere else; its
keys are pinned in the store until its load is reported done; every copy in flight belongs to a
job the executor has still to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from pagesim.engine.policy.memory.block_key import BlockKey
from pagesim.engine.policy.offload.policies import OffloadLRU
from pagesim.engine.policy.offload.store import OffloadStore
from pagesim.engine.policy.scheduling.request import Request, Sequence
from pagesim.engine.policy.offload.seed0_set import Seed0Str


@dataclass(slots=True)
class _Seen:
    """The keys one request stored or used, for the policy's ``request_finished``."""

    keys: dict = field(default_factory=dict)  # key -> position, in the order first seen
    inserted: set = field(default_factory=set)  # stored by this request
    reused: set = field(default_factory=set)  # used without being stored by this request
    missed: set = field(default_factory=set)  # offered while not stored (the policy hears once)


@dataclass(slots=True)
class TransferJob:
    """Copies for one request issued in one step: loads (slot -> GPU block) or stores."""

    request_id: str
    step: int
    is_load: bool
    keys: list
    sync: bool = False


@dataclass(slots=True)
class _RequestState:
    """What the connector keeps of a request until it has finished and its copies are done."""

    request: Request
    jobs: set = field(default_factory=set)  # ids of its jobs in flight
    # per sequence index, (the sequence, its GPU blocks as the last step left them): a finished
    # one's blocks are freed, for its last offer (a simulator may drop a finished request's sequences)
    tables: dict = field(default_factory=dict)
    finished: bool = False
    aborted: bool = False
    held: list = field(default_factory=list)  # vLLM 0.15: keys copied, not reported done until it finishes
    # vLLM 0.15: per sequence index, its last refused offer (store generation, first and end
    # block, keys not stored), for the shortcut in _offer_seq
    refused: dict = field(default_factory=dict)


#: The connectors ``OffloadManager`` follows: vLLM 0.33's (the default) and vLLM 0.15.1's.
CONNECTORS = ("0.33", "0.15")


class OffloadManager:
    def __init__(self, store: OffloadStore, kv, *, prompt_only: bool = True,
                 sync_load_budget_bytes: int = 0, block_bytes: int = 0, connector: str = "0.33"):
        if connector not in CONNECTORS:
            raise ValueError(f"unknown offloading connector {connector!r}; known: {', '.join(CONNECTORS)}")
        self.store = store
        self.kv = kv  # KVCacheManager: block keys, the GPU pool
        self.block_size = kv.block_size
        self.v015 = connector == "0.15"
        self.prompt_only = prompt_only and not self.v015  # (0.15 stores generated blocks too)
        if self.v015:
            store.access_on_refusal = False
        # a refused offer met again with the store unchanged is refused again (no key it offered
        # was stored since, no slot freed or unpinned): counted, not recomputed; for the LRU
        # policy, whose eviction only counts the evictable keys outside the offer
        self._shortcut_refusals = self.v015 and type(store.policy) is OffloadLRU and not store._hears_misses
        self.sync_load_budget_bytes = sync_load_budget_bytes
        self.block_bytes = block_bytes
        self._seen: dict[str, _Seen] = {}
        self._states: dict[str, _RequestState] = {}
        self._jobs: dict[int, TransferJob] = {}  # in flight, by id (issue order)
        self._next_job = 0
        self._being_loaded: set = set()  # keys of asynchronous loads in flight
        # finished since the last end_step: a set, walked as vLLM walks its set[str] (seed0_set.py)
        self._finished_ids: set[Seed0Str] = set()
        self._flushed: list[int] = []  # jobs flushed this step: done with it
        self._step_sync_bytes = 0
        self.num_finished_stores = 0  # the last end_step's stores of finished requests (its last ones)
        self.num_stored_blocks = 0
        self.num_loaded_blocks = 0  # at admissions (first ones and resumptions)

    # ----------------------------------------------------------- the step
    def begin_step(self) -> None:
        self._step_sync_bytes = 0
        store = self.store
        store.step_evictions = store.step_scan_entries = store.step_refusals = 0

    def has_unoffered(self, requests) -> bool:
        """Whether one of these (running) requests has blocks it could offer and has not with
        success (a refused offer): it offers them again at every step it is scheduled."""
        bs = self.block_size
        for request in requests:
            for seq in request.live_seqs:
                computed = seq.num_computed_tokens
                end = min(computed if not self.prompt_only or computed < request.prompt_len else request.prompt_len,
                          seq.num_tokens) // bs
                if seq.num_offered_blocks < min(end, len(seq.block_table)):
                    return True
        return False

    @property
    def has_work(self) -> bool:
        """Whether copies are in flight or finished requests wait for the next step's bookkeeping."""
        return bool(self._jobs or self._finished_ids)

    def end_step(self, step: int, scheduled: list[Request], preempted: list[str]) -> list[tuple[int, int]]:
        """The step's stores (``(GPU block, slot)`` copies, in vLLM's job order) for the requests
        ``scheduled`` (in scheduling order) and those finished since the last step (the last
        ``num_finished_stores``, from blocks they freed: the executor copies those before the
        forward pass); then the policy hears of those finished requests. ``preempted``: this
        step's victims, whose stores in flight are flushed."""
        for request_id in preempted:
            state = self._states.get(request_id)
            if state is not None:
                stores = [j for j in state.jobs if not self._jobs[j].is_load]
                self._flushed.extend(stores)
                if self.v015:  # (its stores are reported done at once, flushed ones included)
                    self._release(state, [key for j in stores for key in self._jobs[j].keys])
                    for job in map(self._jobs.__getitem__, stores):  # (done: nothing more to report when the copy ends)
                        job.keys = []
        copies: list[tuple[int, int]] = []
        for request in scheduled:
            state = self._states.get(request.request_id)
            if state is not None:
                self._offer(state, copies, step)
        finished = [str(i) for i in self._finished_ids]  # (the set's order under PYTHONHASHSEED=0)
        self._finished_ids = set()
        num_running_stores = len(copies)
        if not self.v015:  # (0.15: a finished request offers nothing more)
            for request_id in finished:
                state = self._states.get(request_id)
                if state is not None:
                    self._offer(state, copies, step)
        for request_id in finished:
            seen = self._seen.pop(request_id, None)
            if seen is not None:
                keys = sorted(seen.keys, key=seen.keys.__getitem__)  # prefix order
                self.store.policy.request_finished(request_id, keys, seen.reused)
            state = self._states.get(request_id)
            if state is not None and not state.jobs:
                self._release(state)
                del self._states[request_id]
        self.num_stored_blocks += len(copies)
        self.num_finished_stores = len(copies) - num_running_stores
        return copies

    def _offer(self, state: _RequestState, copies: list[tuple[int, int]], step: int) -> None:
        tables = state.tables
        if not state.finished:  # (the live tables; a finished sequence keeps the table it freed)
            for seq in state.request.live_seqs:  # (one in vLLM v1; pagesim's samples and beams: each its own)
                tables[seq.index] = (seq, seq.block_table)
        for seq, table in list(tables.values()):
            if seq.finished and not state.finished:  # (a finished sample's freed table: offered when its request finishes)
                continue
            self._offer_seq(state, seq, table, copies, step)

    def _offer_seq(self, state: _RequestState, seq: Sequence, table: list, copies: list[tuple[int, int]],
                   step: int) -> None:
        request = state.request
        num_tokens = seq.num_tokens
        if not (state.finished or seq.finished) or state.aborted:
            offloadable = seq.num_computed_tokens
        else:
            offloadable = max(request.prompt_len, num_tokens - 1)
        offloadable = min(offloadable, num_tokens)
        if self.prompt_only:
            offloadable = min(offloadable, request.prompt_len)
        end = min(offloadable // self.block_size, len(table), num_tokens // self.block_size)
        start = seq.num_offered_blocks
        if end <= start:
            return
        kv = self.kv
        store = self.store
        if self._shortcut_refusals:
            last = state.refused.get(seq.index)
            if last is not None and last[0] == store.generation and last[1] == start and end >= last[2]:
                # (the same offer, perhaps longer, to an unchanged store: refused again)
                num_new = last[3] + sum(1 for j in range(last[2], end) if kv.block_key(seq, j) not in store)
                store.refuse(num_new)
                state.refused[seq.index] = (store.generation, start, end, num_new)
                return
        keys = [kv.block_key(seq, j) for j in range(start, end)]
        positions = list(range(start, end))
        seen = self._seen_by(request.request_id)
        refused_before = store.num_refused_blocks
        slots = store.prepare_store(keys, request.request_id, positions, seen.missed)
        if slots is None and self.v015:  # refused: offered again next time (0.15: nothing seen)
            state.refused[seq.index] = (store.generation, start, end, store.num_refused_blocks - refused_before)
            return
        state.refused.pop(seq.index, None)
        if slots is None:  # refused: offered again next time (still, the request saw them)
            for j, key in zip(positions, keys):
                if store.is_ready(key):
                    if key not in seen.inserted:
                        seen.reused.add(key)
                elif key in store:  # (being stored by another request)
                    continue
                seen.keys.setdefault(key, j)
            return
        stored = []
        state_of = store.state
        for j, key in zip(positions, keys):
            slot = slots.get(key)
            if slot is not None:
                copies.append((table[j], slot))
                seen.inserted.add(key)
                stored.append(key)
            elif state_of.get(key, -1) >= 0:  # ready: used
                if key not in seen.inserted:
                    seen.reused.add(key)
            else:  # being stored by another request: not this one's
                continue
            seen.keys.setdefault(key, j)
        if stored:
            self._new_job(state, TransferJob(request.request_id, step, False, stored))
        seq.num_offered_blocks = end

    def _new_job(self, state: _RequestState, job: TransferJob) -> int:
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = job
        state.jobs.add(job_id)
        return job_id

    def output_fields(self, loads: list[tuple[int, int]], hits: dict[str, int], stores: list[tuple[int, int]],
                      parked: tuple[str, ...] = ()) -> dict:
        """The step's ``SchedulerOutput`` fields of offloading."""
        store = self.store
        return dict(num_free_offload_blocks=store.num_free_blocks, blocks_to_load=tuple(loads),
                    blocks_to_store=tuple(stores), offload_hits=MappingProxyType(hits),
                    num_finished_stores=self.num_finished_stores, parked=parked,
                    offload_evictions=store.step_evictions,
                    offload_scan_entries=store.step_scan_entries if self.v015 else 0,
                    offload_refusals=store.step_refusals if self.v015 else 0)

    # ------------------------------------------------------------ lookups
    def lookup(self, seq: Sequence, first_block: int) -> tuple[list[BlockKey], bool] | None:
        """The keys ``seq`` can load after a GPU hit of ``first_block`` blocks, and whether the
        load would be synchronous; ``None``: not yet (a block it would load is still being stored
        or loaded for another request, or ``seq``'s own copies are in flight)."""
        request = seq.request
        state = self._state_of(request)
        seq.num_offered_blocks = 0  # (vLLM's next_stored_chunk_idx: the first block not offered with success)
        state.tables.pop(seq.index, None)
        if state.jobs and not self.v015:
            return None
        store = self.store
        kv = self.kv
        keys: list[BlockKey] = []
        pending = False
        num_tokens = seq.num_tokens
        for j in range(first_block, num_tokens // self.block_size):
            key = kv.block_key(seq, j)
            slot = store.slot_of.get(key)
            if slot is None:
                break
            stored = store.key_of[slot]
            if store.is_pending(key):
                if self.v015:  # (0.15: the hit ends at the first block not ready)
                    break
                pending = True
            elif stored is not key:  # (equal: compare later keys in one link, see adopt_key)
                kv.adopt_key(seq, j, stored)
            keys.append(stored)
        if pending:
            return None
        if not keys:
            return keys, True
        being_loaded = self._being_loaded
        if being_loaded and any(key in being_loaded for key in keys):
            return None
        local = first_block * self.block_size
        hit = len(keys) * self.block_size
        budget = self.sync_load_budget_bytes
        if budget == 0 or local + hit >= num_tokens:
            return keys, False
        num_bytes = len(keys) * self.block_bytes
        if self._step_sync_bytes + num_bytes > budget:
            return keys, False
        self._step_sync_bytes += num_bytes
        return keys, True

    def load(self, seq: Sequence, keys: list[BlockKey], gpu_blocks: list[int], first_block: int,
             sync: bool, step: int) -> list[tuple[int, int]]:
        """Pin ``keys`` for loading into ``gpu_blocks`` (the table's blocks from ``first_block``);
        returns the ``(slot, GPU block)`` copies."""
        request = seq.request
        request_id = request.request_id
        positions = list(range(first_block, first_block + len(keys)))
        slots = self.store.prepare_load(keys, request_id, positions)
        seen = self._seen_by(request_id)
        for key, position in zip(keys, positions):
            seen.keys.setdefault(key, position)
            if key not in seen.inserted:
                seen.reused.add(key)
        state = self._state_of(request)
        seq.num_offered_blocks = first_block + len(keys)
        self._new_job(state, TransferJob(request_id, step, True, list(keys), sync))
        if not sync:
            self._being_loaded.update(keys)
        self.num_loaded_blocks += len(keys)
        return list(zip(slots, gpu_blocks))

    def load_done(self, request: Request) -> bool:
        """Whether ``request``'s (asynchronous) load is reported done."""
        state = self._states.get(request.request_id)
        return state is None or not any(self._jobs[j].is_load for j in state.jobs)

    # ---------------------------------------------------------- completions
    def step_loads(self, step: int) -> tuple[int, int]:
        """(synchronous, asynchronous) blocks loaded by the jobs ``step`` issued and not done."""
        sync = async_ = 0
        for job in self._jobs.values():
            if job.is_load and job.step == step:
                if job.sync:
                    sync += len(job.keys)
                else:
                    async_ += len(job.keys)
        return sync, async_

    def complete(self, step: int, *, loads: bool = True, stores: bool = True) -> None:
        """The loads and/or stores issued in ``step`` are done (the executor's report), and so
        are the jobs flushed so far."""
        flushed, self._flushed = set(self._flushed), []
        for job_id, job in list(self._jobs.items()):
            if job_id in flushed or (job.step == step and (loads if job.is_load else stores)) or (job.is_load and job.sync):
                self._finish_job(job_id)

    def _finish_job(self, job_id: int) -> None:
        job = self._jobs.pop(job_id)
        if job.is_load:
            self.store.complete_load(job.keys)
            if not job.sync:
                self._being_loaded.difference_update(job.keys)
        state = self._states.get(job.request_id)
        if not job.is_load:
            if self.v015 and state is not None:  # (reported done once its request has finished)
                state.held.extend(job.keys)
            else:
                self.store.complete_store(job.keys)
        if state is not None:
            state.jobs.discard(job_id)
            if state.finished and not state.jobs:
                self._release(state)  # (0.15: reported now, its request finished, its copies done)
                if Seed0Str(job.request_id) not in self._finished_ids:
                    del self._states[job.request_id]

    def _release(self, state: _RequestState, keys: list | None = None) -> None:
        """vLLM 0.15: the stores ``state``'s request has copied (and ``keys``) are reported done."""
        held = state.held + (keys or [])
        if held:
            state.held = []
            self.store.complete_store(held)

    # ------------------------------------------------------------- requests
    def request_finished(self, request: Request, *, aborted: bool = False) -> None:
        """``request`` finished (or was aborted or rejected): its remaining blocks are offered
        and the policy hears of it at the next ``end_step``."""
        request_id = request.request_id
        state = self._states.get(request_id)
        if state is None:
            if request_id not in self._seen:
                return
            state = self._state_of(request)
        state.finished = True
        state.aborted = aborted
        self._finished_ids.add(Seed0Str(request_id))
        if self.v015 and not state.jobs:  # (its copies done: the worker reports it with its finish)
            self._release(state)

    def _state_of(self, request: Request) -> _RequestState:
        state = self._states.get(request.request_id)
        if state is None:
            state = self._states[request.request_id] = _RequestState(request)
        return state

    def _seen_by(self, request_id: str) -> _Seen:
        seen = self._seen.get(request_id)
        if seen is None:
            seen = self._seen[request_id] = _Seen()
        return seen
