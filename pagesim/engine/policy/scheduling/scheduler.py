"""The scheduler: continuous batching over the paged KV cache, one ``schedule()`` per step.

Each step a *step order* (``steps/``, chosen by ``SchedulerConfig.step_order``) decides, within a
token budget (``max_num_batched_tokens``) and a batch limit (``max_num_seqs``), which running
requests continue, which are preempted (victim policy: which; preemption mode: swap or
recompute), which swapped requests come back and which waiting ones are admitted. The default,
``vllm-v1``, is running -> swapped -> waiting; ``vllm-v0`` is vLLM 0.6.3's. This class owns what
every order shares: the queues, the block accounting of running a plan, preempting, swapping in,
admitting and rejecting, the frozen output and the decision log.

Requests that can never be served are rejected with a reason when added (admission.py), or at
the head of their queue in the rare case a preemption made them unservable; nothing waits forever.
A request whose client gave up is aborted between steps (``abort_request``: its blocks freed
before the next ``schedule()``, whose record lists it under ``aborted``).

A recompute preemption of a multi-sequence request (parallel samples, beams) keeps the samples
sharing the prompt: the first live sequence (the leader) re-prefills, the others wait *parked*
with no blocks until the leader holds the prompt's full blocks again, then share them and
re-prefill only their own tokens.

``schedule()`` returns a frozen ``SchedulerOutput`` (output.py) and logs one decision record; the
executor runs it and calls ``update()`` with the sampled tokens (sampling.py appends them, forks
parallel samples and beams, and finishes sequences at exactly ``max_tokens``). Tokens computed this
step are counted as computed when ``schedule()`` returns (as vLLM v1 does in
``_update_after_schedule``).
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from mypy_extensions import mypyc_attr

from pagesim.engine.policy.scheduling.admission import rejection_reason
from pagesim.engine.policy.memory.block_key import HashFn, default_hash
from pagesim.engine.policy.memory.block_pool import BlockPool
from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.memory.hybrid_kv import HybridKVCacheManager
from pagesim.engine.policy.memory.kv_manager import KVCacheManager
from pagesim.engine.policy.disagg.connector import PdConnector
from pagesim.engine.policy.offload import OffloadManager, OffloadStore
from pagesim.engine.policy.scheduling.output import DecisionLog, ScheduledSequence, SchedulerOutput, frozen_map
from pagesim.engine.policy.scheduling.planning import Plan, Planner
from pagesim.engine.policy.scheduling.preemption import Mode, make_preemption_mode, make_victim_policy
from pagesim.engine.policy.scheduling.lag import LaggingBatch, settle
from pagesim.engine.policy.scheduling.request import Request, RequestStatus, num_dropped
from pagesim.engine.policy.scheduling.sampling import BeamChoices, OutputProcessor, SampledTokens
from pagesim.engine.policy.scheduling.steps import STEP_ORDERS, Step
from pagesim.engine.policy.memory.swap_pool import SwapPool, SwapSpaceExhausted
from pagesim.engine.policy.memory.usage import KvUsage
from pagesim.engine.policy.scheduling.waiting_queue import PriorityWaitingQueue


# (Compiled builds: plug-ins subclass the scheduler; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    #: KV memory in blocks reached through block tables (the contiguous baseline says False).
    paged: ClassVar[bool] = True  # (a class's: compiled, an instance attribute would hide a subclass's)

    def __init__(self, config: SchedulerConfig, *, hash_fn: HashFn = default_hash):
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks,
            eviction_policy=config.eviction_policy,
            reserve_null_block=config.reserve_null_block,
        )
        self.swap_pool = SwapPool(config.num_cpu_blocks)
        if config.is_hybrid:  # sliding-window layer groups: a table per group (vLLM v1's hybrid manager)
            self.kv: KVCacheManager = HybridKVCacheManager(
                self.pool, self.swap_pool, windows=config.kv_group_windows,
                max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
                retention_interval=config.prefix_cache_retention_interval, block_size=config.block_size,
                enable_prefix_caching=config.enable_prefix_caching, hash_fn=hash_fn,
            )
        else:
            self.kv = KVCacheManager(self.pool, self.swap_pool, block_size=config.block_size,
                                     enable_prefix_caching=config.enable_prefix_caching, hash_fn=hash_fn)
        # The second KV tier (pagesim/engine/policy/offload/), when configured: block keys are then made
        # eagerly, since the store is keyed by them.
        self.offload: OffloadManager | None = None
        if config.num_offload_blocks:
            self.kv.lazy_keys = False
            self.offload = OffloadManager(OffloadStore(config.num_offload_blocks, config.offload_eviction_policy),
                                          self.kv, prompt_only=config.offload_prompt_only,
                                          sync_load_budget_bytes=config.offload_sync_load_budget_bytes,
                                          block_bytes=config.offload_block_bytes,
                                          connector=config.offload_connector)
        # Disaggregated prefill/decode (pagesim/engine/policy/disagg/): vLLM 0.33's NixlConnector,
        # scheduler side. A prefill's finished blocks are held through the output processor.
        self.pd: PdConnector | None = None
        if config.kv_connector == "nixl":
            self.pd = PdConnector(self.kv, config.block_size)
        # Whether update() reports every copy a step issued done (a step's loads and stores take
        # one step, as the engine makes them); else the executor reports them (OffloadManager.complete).
        self.complete_offload_in_update = True
        self.victim_policy = make_victim_policy(config.victim_policy)
        self.preemption_mode = make_preemption_mode(config.preemption_mode)
        self.output_processor = OutputProcessor(self.kv, max_model_len=config.max_model_len)
        self.planner = Planner(config, self.kv)
        self.step_order = STEP_ORDERS[config.step_order](self)
        if self.pd is not None:
            self.output_processor.hold_finished = self.pd.hold
        # FCFS: arrival order, recompute victims at the front; priority scheduling: a heap by
        # (priority, arrival time, id) (pagesim/engine/policy/scheduling/waiting_queue.py, vLLM 0.33's).
        self.waiting: deque[Request] | PriorityWaitingQueue = (
            PriorityWaitingQueue() if config.scheduling_policy == "priority" else deque())
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        # Requests parked while their KV loads from the offload store, and those whose load is done
        # until admitted: vLLM 0.33's kv_holding_waiting, drained before ``waiting``.
        self.kv_holding: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.decision_log = DecisionLog()
        self.next_step = 0
        self.num_finished_requests = 0
        self.num_rejected_requests = 0
        self.num_preemptions = 0
        self.num_prompt_tokens_admitted = 0  # first admissions only
        self.num_prefix_hit_tokens = 0  # of those, served from the prefix cache (either tier)
        self.num_offload_hit_tokens = 0  # of those, loaded from the offload store (pagesim/engine/policy/offload)
        self._pending_rejections: dict[str, str] = {}
        self.num_aborted_requests = 0
        # aborted since the last schedule(), in order: the next decision record lists them
        self._pending_aborts: list[str] = []
        self._num_admissions = 0
        self._last_record: dict | None = None
        # For skip-ahead (fast_forward.py): (step, waiting- and swapped-pass stops) of the last
        # schedule() if it was pure decode for every running request, and whether the last update()
        # finished any sequence (freeing blocks or batch room).
        self._pure_decode_step: tuple[int, str | None, str | None] | None = None
        self._finished_in_last_update = False
        # The decode batch the fast path left after its last step (fast_forward.decode_batch takes it;
        # the scheduler only keeps it, so it does not know its type: the fast path depends on the
        # scheduler, never the other way).
        self._decode_run: object | None = None
        # The fast path's batch whose sequences' counters and outputs lag (bulk_decode: implicit
        # decoders), until ``settle()``; and whether its last step is scheduled but not yet
        # updated (fast_forward's DecodeStep: its token not yet sampled).
        self._lazy_run: LaggingBatch | None = None
        self._lazy_mid_step = False

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request, kv_transfer: object = None) -> bool:
        """Queue ``request`` at the back of the waiting queue; ``False`` if it was rejected (its
        ``reject_reason`` says why, and the next decision record lists it). ``kv_transfer``:
        its P/D role (``pagesim.engine.policy.disagg``'s ``RemoteDecode`` or ``RemotePrefill``;
        vLLM's ``kv_transfer_params``), for an instance with a connector."""
        if kv_transfer is not None and self.pd is None:
            raise ValueError(f"request {request.request_id!r} carries KV transfer parameters, but this instance "
                             f"has no KV connector (kv_connector='nixl')")
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.status is not RequestStatus.WAITING or request.has_run:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        reason = rejection_reason(request, self.config, self.pool.num_usable_blocks)
        if reason is None:
            reason = self.step_order.rejection_reason(request)
        if reason is not None:
            self._reject(request, reason)
            return False
        if kv_transfer is not None:
            assert self.pd is not None  # (checked above)
            self.pd.accept(request, kv_transfer)  # type: ignore[arg-type]
        self.requests[request.request_id] = request
        waiting = self.waiting
        waiting.append(request)
        if waiting[0] is request and len(waiting) > 1:
            # Priority scheduling: a newcomer can go ahead of a head the last step refused, so that
            # refusal says nothing of the new head (the fast path's queues_stay_refused reads it).
            # (FCFS: it joins behind; a newcomer alone at the head needs no hint, the queue was empty.)
            self._pure_decode_step = None
        return True

    def _reject(self, request: Request, reason: str) -> None:
        request.status = RequestStatus.REJECTED
        request.reject_reason = reason
        self._pending_rejections[request.request_id] = reason
        self.num_rejected_requests += 1

    def abort_request(self, request_id: str) -> None:
        """Drop an unfinished request wherever it is (waiting, running, swapped), releasing its GPU
        and CPU blocks, between steps: vLLM V1 (0.15 and 0.33 alike) applies a client's abort from
        the engine core's input queue before the next ``schedule()``, through
        ``Scheduler.finish_requests(..., FINISHED_ABORTED)``, and disturbs nothing else. Its
        sequences keep the tokens they generated (``finish_reason`` "aborted"); the next
        decision record lists it under ``aborted``."""
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"cannot abort request {request_id!r}: it is not unfinished in this scheduler")
        self.settle()  # (the fast path's lagging counters and lazy keys, before its blocks are freed)
        del self.requests[request_id]
        self._decode_run = None
        self._pure_decode_step = None  # (its blocks and batch room free up: no queue head stays refused)
        for queue in (self.waiting, self.swapped, self.kv_holding):
            if request in queue:
                queue.remove(request)
        if request in self.running:  # (a new list, as retire_finished makes: a caller may hold the old one)
            self.running = [r for r in self.running if r is not request]
        # (a P/D read in flight still writes into its blocks: the connector frees them when it ends)
        deferred = self.pd is not None and self.pd.defers_free(request)
        for seq in list(request.live_seqs):
            if not deferred:
                self.kv.free(seq, final=True)
            self.kv.free_cpu(seq)
            request.retire_seq(seq, "aborted")
        request.status = RequestStatus.FINISHED
        if self.offload is not None:
            self.offload.request_finished(request, aborted=True)
        if self.pd is not None:
            self.pd.forget(request)
        self.num_aborted_requests += 1
        self._pending_aborts.append(request_id)

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.kv_holding)

    def settle(self) -> None:
        """Bring the running sequences the fast path left behind (``scheduling.lag``: the fast path's
        implicit decoders) up to date: their counters and outputs as the step-by-step path leaves
        them. Every method here that reads running sequences calls it first; code that reads them
        directly from outside (a router) calls it too. O(1) when nothing lags."""
        run = self._lazy_run
        if run is not None:
            self._lazy_run = None
            settle(run.seqs, run.offsets, self.next_step, self.block_size, self.kv.registered_keys,
                   0 if self._lazy_mid_step else 1)

    # ------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput:
        self.settle()
        cfg = self.config
        st = Step(step=self.next_step, token_budget=cfg.max_num_batched_tokens)
        self.next_step += 1
        offload = self.offload
        if offload is not None:
            offload.begin_step()
        pd = self.pd
        if pd is not None:
            pd.begin_step()
        if self.has_unfinished_requests:
            self.step_order.schedule(st)
        stores, offload_fields = self.end_offload_step(st)
        pure = st.only_computes() and not (self._pending_rejections or stores or self.kv_holding)
        self._pure_decode_step = (
            (st.step, st.waiting_stop, st.swapped_stop)
            if pure and st.scheduled and len(st.scheduled) == cfg.max_num_batched_tokens - st.token_budget
            and len(st.tokens_per_request) == len(self.running) else None
        )
        output = SchedulerOutput(
            step=st.step,
            scheduled=tuple(st.scheduled),
            num_scheduled_tokens=frozen_map(st.tokens_per_request),
            new=frozen_map(st.new),
            resumed=frozen_map(st.resumed),
            swapped_in=tuple(st.swapped_in),
            preempted=tuple(st.preempted),
            rejected=frozen_map(self._pending_rejections),
            blocks_to_copy=tuple(st.copies),
            blocks_to_swap_out=tuple(st.swap_out),
            blocks_to_swap_in=tuple(st.swap_in),
            num_free_blocks=self.pool.num_free_blocks,
            num_free_cpu_blocks=self.swap_pool.num_free_blocks,
            num_cached_free_blocks=self.pool.num_cached_free_blocks,
            **offload_fields,
            aborted=tuple(self._pending_aborts) if self._pending_aborts else (),
        )
        self._pending_rejections = {}
        if self._pending_aborts:
            self._pending_aborts = []
        if cfg.record_decisions:
            self._last_record = output.to_record()
            self.decision_log.append(self._last_record)
        return output

    def end_offload_step(self, st: Step) -> tuple[list[tuple[int, int]], dict]:
        """The KV connector's end of a scheduled step: the offload store's stores
        (``OffloadManager.end_step``) and the ``SchedulerOutput`` fields of the offload store or the
        P/D connector ((), {} without either)."""
        offload = self.offload
        if offload is None:
            pd = self.pd
            if pd is None:
                return [], {}
            fields = pd.output_fields()
            fields["parked"] = tuple(sorted(r.request_id for r in self.kv_holding if r.status is RequestStatus.LOADING))
            return [], fields
        requests = self.requests
        stores = offload.end_step(st.step, [requests[rid] for rid in st.tokens_per_request],
                                  [rid for rid, _ in st.preempted])
        parked = tuple(sorted(r.request_id for r in self.kv_holding if r.status is RequestStatus.LOADING))
        return stores, offload.output_fields(st.loads, st.offload_hits, stores, parked)

    # ------------------------------------------------- primitives of a step
    def run(self, request: Request, plan: Plan, st: Step) -> None:
        """Reserve slots for the planned tokens and add them to the step."""
        kv = self.kv
        whole = self.config.reserve_extent == "whole"
        request_id = request.request_id
        prompt_len = request.prompt_len
        scheduled = st.scheduled
        total = 0
        for seq, n in plan:
            start = seq.num_computed_tokens
            end = start + n
            num_tokens = prompt_len + len(seq.output_token_ids)  # seq.num_tokens (reserving adds none)
            copies = kv.reserve(seq, seq.num_filled_tokens, num_tokens if whole else end)
            if copies:
                st.copies.extend(copies)
            kv.register(seq, end)
            seq.num_computed_tokens = end
            samples = end >= num_tokens
            if samples:
                seq.decoding = True
            scheduled.append(
                ScheduledSequence(
                    request_id=request_id,
                    seq_index=seq.index,
                    num_computed_tokens=start,
                    num_new_tokens=n,
                    block_table=seq.block_table_tuple(),
                    block_size=self.block_size,
                    samples=samples,
                    extra_block_tables=seq.extra_table_tuples() if seq.extra_tables is not None else (),
                )
            )
            total += n
        st.tokens_per_request[request_id] = total
        st.token_budget -= total
        request.has_run = True

    def choose_mode(self, victim: Request, num_blocks: int | None = None) -> Mode:
        """The preemption mode plug-in's choice for ``victim`` (``num_blocks``: the GPU blocks a
        swap would move, if the caller has counted them)."""
        seqs = victim.live_seqs
        if num_blocks is None:
            num_blocks = self.kv.blocks_to_swap_out(seqs, preserve_sharing=self.config.preserve_sharing_on_swap)
        return self.preemption_mode.choose(victim, num_blocks=num_blocks, num_tokens=sum(s.num_tokens for s in seqs))

    def preempt(self, victim: Request, st: Step, *, mode: Mode | None = None, swap_need: int | None = None) -> Mode:
        """Take the victim's GPU blocks: swap them out or drop them (recompute), in ``mode``
        (default: the plug-in's choice). The caller takes it off ``running`` and requeues it
        (``requeue``) when its step order says so. ``swap_need``: the CPU blocks the step order's
        accounting asks for (default: the blocks that actually move)."""
        cfg = self.config
        kv = self.kv
        seqs = list(victim.live_seqs)
        preserve = cfg.preserve_sharing_on_swap
        moved = kv.blocks_to_swap_out(seqs, preserve_sharing=preserve)
        need = moved if swap_need is None else swap_need
        if mode is None:
            mode = self.choose_mode(victim, moved)
        if mode == "swap" and kv.hybrid:
            raise ValueError(f"the preemption mode chose to swap {victim.request_id!r}, but a hybrid KV cache "
                             f"(sliding-window layer groups, vLLM v1) preempts by recompute only")
        if mode == "swap" and need > self.swap_pool.num_free_blocks:
            if cfg.on_swap_exhausted == "raise":  # vLLM 0.6.3; nothing has changed yet
                raise SwapSpaceExhausted(
                    f"swapping out {victim.request_id!r} needs {need} CPU blocks, "
                    f"{self.swap_pool.num_free_blocks} free"
                )
            mode = "recompute"
        if mode == "swap":
            st.swap_out.extend(kv.swap_out(seqs, preserve_sharing=preserve))
            victim.status = RequestStatus.SWAPPED
        else:
            for seq in seqs:
                kv.free(seq)
                seq.num_computed_tokens = 0
                seq.decoding = False
                seq.num_offered_blocks = 0  # (its offers start again as it is recomputed; vLLM resets at the lookup)
            if self.block_size <= victim.prompt_len and not kv.hybrid:
                for seq in seqs[1:]:  # re-share the prompt's full blocks once the leader has them
                    seq.parked = True
            victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        victim.was_preempted = mode == "recompute"
        self.num_preemptions += 1
        st.preempted.append((victim.request_id, mode))
        return mode

    def requeue(self, victim: Request, mode: Mode) -> None:
        """A victim's place: the back of ``swapped``, or the front of ``waiting`` (victims come off
        the running tail, so the earliest admitted of several ends up first); under priority
        scheduling, its place by key in ``waiting`` (vLLM 0.33's ``prepend_request`` is a push)."""
        if mode == "swap":
            self.swapped.append(victim)
        else:
            self.waiting.appendleft(victim)

    def swap_in(self, request: Request, st: Step) -> None:
        """Bring a swapped request's blocks back (the caller took it off ``swapped``)."""
        seqs = list(request.live_seqs)
        st.swap_in.extend(self.kv.swap_in(seqs, preserve_sharing=self.config.preserve_sharing_on_swap))
        request.status = RequestStatus.RUNNING
        st.swapped_in.append(request.request_id)

    def load_from_offload(self, seq, keys: list, st: Step, *, sync: bool = True) -> None:
        """Extend ``seq``'s (touched) prefix hit with blocks loaded from the offload store; an
        asynchronous load's blocks join the prefix cache when the request is promoted."""
        offload = self.offload
        assert offload is not None, "loads come only from a configured offload store"
        first = len(seq.block_table)
        blocks = self.kv.load_prefix(seq, keys, register=sync)
        st.loads.extend(offload.load(seq, keys, blocks, first, sync, st.step))
        rid = seq.request.request_id
        tokens = len(keys) * self.block_size
        st.offload_hits[rid] = st.offload_hits.get(rid, 0) + tokens
        seq.request.num_loaded_tokens += tokens

    def receive_remote(self, seq, first_block: int, st: Step) -> None:
        """Give ``seq`` (its local hit of ``first_block`` blocks touched) fresh blocks for the rest
        of its prompt, which a P/D read fills (``PdConnector.receive``): its prompt counts as
        computed, its new blocks join the prefix cache when the read is done."""
        pd = self.pd
        assert pd is not None, "reads come only through a P/D connector"
        prompt_len = seq.request.prompt_len
        self.kv.reserve(seq, first_block * self.block_size, prompt_len)
        seq.num_computed_tokens = prompt_len
        pd.receive(seq, first_block, st.step)

    def admit(self, request: Request, hit_tokens: int, st: Step) -> None:
        """Record an admission from ``waiting`` (first or after a recompute preemption)."""
        self._num_admissions += 1
        request.admitted_seq_no = self._num_admissions
        request.status = RequestStatus.RUNNING
        if request.was_preempted:
            st.resumed[request.request_id] = hit_tokens
        else:
            st.new[request.request_id] = hit_tokens
            self.num_prompt_tokens_admitted += request.prompt_len
            self.num_prefix_hit_tokens += hit_tokens
            # (a load of every token: the last one is computed again, not a hit)
            self.num_offload_hit_tokens += min(request.num_loaded_tokens, hit_tokens)
        request.num_loaded_tokens = 0
        request.was_preempted = False

    def reject_queued(self, request: Request, reason: str) -> None:
        """Reject a request already taken off its queue, releasing whatever it holds."""
        del self.requests[request.request_id]
        for seq in request.seqs:
            self.kv.free(seq, final=True)
            self.kv.free_cpu(seq)
        if self.offload is not None:
            self.offload.request_finished(request)
        if self.pd is not None:
            self.pd.forget(request)
        self._reject(request, reason)

    # -------------------------------------------------------------- update
    def update(
        self,
        output: SchedulerOutput,
        sampled: SampledTokens = None,
        beam_choices: BeamChoices | None = None,
    ) -> list[Request]:
        """Apply one executed step (see ``OutputProcessor``). Returns the requests that finished,
        in scheduling order; their blocks are released."""
        self.settle()
        processor = self.output_processor
        retired = processor.num_seqs_finished
        finished = processor.process(output, self.requests, sampled, beam_choices)
        retire_finished(self, output.step, finished)
        pd = self.pd
        if pd is not None and self._last_record is not None and self._last_record["step"] == output.step:
            # (the step's finished remote-decode requests whose blocks are held for a reader)
            sends = {r.request_id: list(pd.held_blocks(r.request_id)) for r in finished if pd.is_held(r.request_id)}
            if sends:
                self._last_record["kv_send"] = sends
        self._finished_in_last_update = processor.num_seqs_finished != retired
        if self.offload is not None and self.complete_offload_in_update:
            self.offload.complete(output.step)
        return finished

    # --------------------------------------------------------------- usage
    def kv_usage(self) -> KvUsage:
        """The GPU cache's slots right now (O(running sequences)). A block shared by several
        sequences counts once; only a table's last block can be partly filled. Requests parked
        while their KV loads from the offload store hold their blocks too."""
        self.settle()
        return self.usage_with(*self.table_slots([*self.running, *self.kv_holding] if self.kv_holding else self.running))

    def usage_with(self, unshared: int, idle: int) -> KvUsage:
        """``kv_usage()`` from the running tables' blocks (each table's count) and idle slots."""
        bs = self.block_size
        pool = self.pool
        allocated = pool.num_used_blocks * bs
        return KvUsage(
            total_slots=pool.num_usable_blocks * bs,
            allocated_slots=allocated,
            used_slots=allocated - idle,
            cached_slots=pool.num_cached_free_blocks * bs,
            unshared_slots=unshared * bs,
        )

    def table_slots(self, requests) -> tuple[int, int]:
        """(blocks in the tables of ``requests``' live sequences, each table's count; slots of
        their partly filled last blocks that hold no token, a block shared by several once)."""
        bs = self.block_size
        ref_counts = self.pool.ref_counts
        unshared = 0
        idle = 0
        seen_partial: set[int] = set()
        tables: tuple[list, ...]  # (every group's table; a sliding group's hold None where dropped)
        for request in requests:
            for seq in request.live_seqs:
                if seq.extra_tables is None:
                    tables = (seq.block_table,)
                else:  # a table per layer group (hybrid caches): count the entries that hold a block
                    tables = (seq.block_table, *seq.extra_tables)
                    unshared -= sum(num_dropped(table) for table in tables)
                for table in tables:
                    if not table:
                        continue
                    num_blocks = len(table)
                    unshared += num_blocks
                    tail = num_blocks * bs - seq.num_filled_tokens
                    if tail:
                        last = table[-1]
                        if ref_counts[last] == 1:
                            idle += tail
                        elif last not in seen_partial:
                            seen_partial.add(last)
                            idle += tail
        return unshared, idle

    # ------------------------------------------------------------ checking
    def check(self) -> None:
        """Assert the policy's invariants (O(blocks + requests); for tests)."""
        self.settle()
        if self.pd is not None:  # (blocks held outside the requests: sends, aborted reads; never a hybrid cache)
            self.kv.check(self.requests.values(), self.pd.held_seqs())
        else:
            self.kv.check(self.requests.values())
        if self.offload is not None:
            self.offload.store.check()
        for request in self.running:
            assert request.status is RequestStatus.RUNNING
        for request in self.waiting:
            assert request.status is RequestStatus.WAITING
            assert all(not s.block_table and not any(s.extra_tables or ()) for s in request.seqs), (
                f"{request.request_id} waits holding blocks")
        for request in self.swapped:
            assert request.status is RequestStatus.SWAPPED
            assert all(not s.block_table for s in request.seqs)
        for request in self.kv_holding:  # parked while loading, or loaded and not admitted yet
            assert request.status in (RequestStatus.LOADING, RequestStatus.WAITING)
            assert all(s.block_table for s in request.seqs), f"{request.request_id} is parked without its blocks"
        for request in self.requests.values():
            assert request.live_seqs == [s for s in request.seqs if not s.finished]
        assert len(self.running) + len(self.waiting) + len(self.swapped) + len(self.kv_holding) == len(self.requests)


def retire_finished(scheduler, step: int, finished: list[Request]) -> None:
    """What any scheduler does with the requests step ``step`` finished: off ``running`` and out
    of the unfinished map, counted, and listed in the step's decision record."""
    if finished:
        running = scheduler.running.copy()  # (a new list: a caller may still hold the old one)
        for request in finished:  # (requests compare by identity; O(finished x running) in C)
            if request in running:
                running.remove(request)
        scheduler.running = running
        for request in finished:
            del scheduler.requests[request.request_id]
        scheduler.num_finished_requests += len(finished)
        offload = getattr(scheduler, "offload", None)
        if offload is not None:
            for request in finished:
                offload.request_finished(request)
    record = scheduler._last_record
    if record is not None and record["step"] == step:
        record["finished"] = sorted(r.request_id for r in finished)
