"""The scheduler: continuous batching over the paged KV cache, one ``schedule()`` per step.

Each step, within a token budget (``max_num_batched_tokens``) and a batch limit
(``max_num_seqs``), in this order:

1. **Running** requests, in running-list order, each gets its next tokens (one per sequence for a
   decode; the next prefill chunk otherwise). When one cannot get the blocks it needs, victims are
   preempted (victim policy: which; preemption mode: swap or recompute) until it can; if it is
   itself the victim it is not scheduled. This is vLLM v1's running pass.
2. **Swapped** requests, oldest first, are swapped back in while the blocks fit above the
   watermark (skipped in a step that preempted).
3. **Waiting** requests, FIFO (recompute victims at the front): the longest cached prefix is
   reused, and a request is admitted only if its whole known sequence fits above the watermark,
   minus cache hits; the head blocks everyone behind it (no overtaking). Skipped in a step that
   preempted, and, with ``admit_while_swapped`` off (vLLM v0), while anything is swapped out.

Requests that can never be served are rejected with a reason when added (admission.py), or at
the head of their queue in the rare case a preemption made them unservable (a resumed request
whose grown sequences no longer fit an admission above the watermark, or a swap-in under v0's
over-counting); nothing waits forever.

A recompute preemption of a multi-sequence request (parallel samples, beams) keeps the samples
sharing the prompt: the first live sequence (the leader) re-prefills, the others wait *parked*
with no blocks until the leader holds the prompt's full blocks again, then share them and
re-prefill only their own tokens. Beams are held one token short until all have caught up, so
they sample in the same step.

``schedule()`` returns a frozen ``SchedulerOutput`` (output.py) and logs one decision record; the
executor runs it and calls ``update()`` with the sampled tokens (sampling.py appends them, forks parallel
samples and beams, and finishes sequences at exactly ``max_tokens``). Tokens
computed this step are counted as computed when ``schedule()`` returns (as vLLM v1 does in
``_update_after_schedule``).

The per-step work is proportional to the requests scheduled, preempted or admitted, never to the
number waiting: the waiting pass stops at the first request that does not fit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.policy.admission import admission_room, admission_watermark, rejection_reason
from engine.policy.block_key import HashFn, default_hash
from engine.policy.block_pool import BlockPool
from engine.policy.config import SchedulerConfig
from engine.policy.kv_manager import KVCacheManager, cdiv
from engine.policy.output import DecisionLog, Pair, ScheduledSequence, SchedulerOutput, frozen_map
from engine.policy.planning import Plan, Planner
from engine.policy.preemption import Mode, make_preemption_mode, make_victim_policy
from engine.policy.request import Request, RequestStatus
from engine.policy.sampling import BeamChoices, OutputProcessor, SampledTokens
from engine.policy.swap_pool import SwapPool, SwapSpaceExhausted



@dataclass(slots=True)
class _Step:
    """What one ``schedule()`` call has decided so far."""

    step: int
    token_budget: int
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    tokens_per_request: dict[str, int] = field(default_factory=dict)
    new: dict[str, int] = field(default_factory=dict)
    resumed: dict[str, int] = field(default_factory=dict)
    swapped_in: list[str] = field(default_factory=list)
    preempted: list[tuple[str, str]] = field(default_factory=list)
    copies: list[Pair] = field(default_factory=list)
    swap_out: list[Pair] = field(default_factory=list)
    swap_in: list[Pair] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, *, hash_fn: HashFn = default_hash):
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks,
            eviction_policy=config.eviction_policy,
            reserve_null_block=config.reserve_null_block,
        )
        self.swap_pool = SwapPool(config.num_cpu_blocks)
        self.kv = KVCacheManager(
            self.pool,
            self.swap_pool,
            block_size=config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            hash_fn=hash_fn,
        )
        self.victim_policy = make_victim_policy(config.victim_policy)
        self.preemption_mode = make_preemption_mode(config.preemption_mode)
        self.output_processor = OutputProcessor(self.kv, max_model_len=config.max_model_len)
        self.planner = Planner(config, self.kv)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.decision_log = DecisionLog()
        self.next_step = 0
        self.num_finished_requests = 0
        self.num_rejected_requests = 0
        self.num_preemptions = 0
        self.num_prompt_tokens_admitted = 0  # first admissions only
        self.num_prefix_hit_tokens = 0  # of those, served from the prefix cache
        self._pending_rejections: dict[str, str] = {}
        self._num_admissions = 0
        self._last_record: dict | None = None

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> bool:
        """Queue ``request`` at the back of the waiting queue; ``False`` if it was rejected (its
        ``reject_reason`` says why, and the next decision record lists it)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.status is not RequestStatus.WAITING or request.has_run:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        reason = rejection_reason(request, self.config, self.pool.num_usable_blocks)
        if reason is not None:
            self._reject(request, reason)
            return False
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return True

    def _reject(self, request: Request, reason: str) -> None:
        request.status = RequestStatus.REJECTED
        request.reject_reason = reason
        self._pending_rejections[request.request_id] = reason
        self.num_rejected_requests += 1

    def abort_request(self, request_id: str) -> None:
        """Drop an unfinished request wherever it is, releasing its GPU and CPU blocks."""
        request = self.requests.pop(request_id)
        for queue in (self.waiting, self.swapped):
            if request in queue:
                queue.remove(request)
        if request in self.running:
            self.running.remove(request)
        for seq in list(request.live_seqs):
            self.kv.free(seq)
            self.kv.free_cpu(seq)
            request.retire_seq(seq, "aborted")
        request.status = RequestStatus.FINISHED

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        st = _Step(step=self.next_step, token_budget=cfg.max_num_batched_tokens)
        self.next_step += 1
        if self.has_unfinished_requests:
            self._schedule_running(st)
            if not st.preempted:
                self._schedule_swapped(st)
            if not st.preempted and (cfg.admit_while_swapped or not self.swapped):
                self._schedule_waiting(st)
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
        )
        self._pending_rejections = {}
        if cfg.record_decisions:
            self._last_record = output.to_record()
            self.decision_log.append(self._last_record)
        return output

    def _run(self, request: Request, plan: Plan, st: _Step) -> None:
        """Reserve slots for the planned tokens and add them to the step."""
        kv = self.kv
        whole = self.config.reserve_extent == "whole"
        total = 0
        for seq, n in plan:
            start = seq.num_computed_tokens
            end = start + n
            st.copies.extend(kv.reserve(seq, seq.num_filled_tokens, seq.num_tokens if whole else end))
            kv.register(seq, end)
            seq.num_computed_tokens = end
            st.scheduled.append(
                ScheduledSequence(
                    request_id=request.request_id,
                    seq_index=seq.index,
                    num_computed_tokens=start,
                    num_new_tokens=n,
                    block_table=seq.block_table_tuple(),
                    block_size=self.block_size,
                    samples=end >= seq.num_tokens,
                )
            )
            total += n
        st.tokens_per_request[request.request_id] = total
        st.token_budget -= total
        request.has_run = True

    # ---------------------------------------------------------- running
    def _schedule_running(self, st: _Step) -> None:
        running = self.running
        pool = self.pool
        i = 0
        while i < len(running) and st.token_budget > 0:
            request = running[i]
            self.planner.unpark(request)
            plan = self.planner.plan(request, st.token_budget)
            if not plan:  # nothing fits this step: the next request may still use the budget
                i += 1
                continue
            need = self.planner.blocks_needed(plan)
            preempted_itself = False
            while need > pool.num_free_blocks:
                candidates = running[i:]
                if len(candidates) == 1 and self.planner.blocks_needed(plan, v0_accounting=False) <= pool.num_free_blocks:
                    # Only v0's over-counting gets here: preempting itself would free what it
                    # does not need and repeat forever, so it runs on the blocks it really needs.
                    break
                victim = self.victim_policy.choose(candidates)
                self._preempt(victim, st)
                if victim is request:
                    preempted_itself = True
                    break
            if preempted_itself:
                continue
            self._run(request, plan, st)
            i += 1

    def _preempt(self, victim: Request, st: _Step) -> None:
        cfg = self.config
        kv = self.kv
        seqs = list(victim.live_seqs)
        preserve = cfg.preserve_sharing_on_swap
        num_blocks = kv.blocks_to_swap_out(seqs, preserve_sharing=preserve)
        mode: Mode = self.preemption_mode.choose(
            victim, num_blocks=num_blocks, num_tokens=sum(s.num_tokens for s in seqs)
        )
        if mode == "swap" and num_blocks > self.swap_pool.num_free_blocks:
            if cfg.on_swap_exhausted == "raise":  # vLLM 0.6.3; nothing has changed yet
                raise SwapSpaceExhausted(
                    f"swapping out {victim.request_id!r} needs {num_blocks} CPU blocks, "
                    f"{self.swap_pool.num_free_blocks} free"
                )
            mode = "recompute"
        if self.running[-1] is victim:
            self.running.pop()
        else:
            self.running.remove(victim)
        if mode == "swap":
            st.swap_out.extend(kv.swap_out(seqs, preserve_sharing=preserve))
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
        else:
            for seq in seqs:
                kv.free(seq)
                seq.num_computed_tokens = 0
            if self.block_size <= victim.prompt_len:
                for seq in seqs[1:]:  # re-share the prompt's full blocks once the leader has them
                    seq.parked = True
            victim.status = RequestStatus.WAITING
            # Victims come off the running tail, so the earliest admitted of several ends first.
            self.waiting.appendleft(victim)
        victim.num_preemptions += 1
        victim.was_preempted = mode == "recompute"
        self.num_preemptions += 1
        st.preempted.append((victim.request_id, mode))

    def _num_batch_slots_used(self) -> int:
        if self.config.seq_limit_counts == "sequences":
            return sum(r.max_running_seqs for r in self.running)
        return len(self.running)

    def _batch_slots(self, request: Request) -> int:
        return request.max_running_seqs if self.config.seq_limit_counts == "sequences" else 1

    # ---------------------------------------------------------- swapped
    def _schedule_swapped(self, st: _Step) -> None:
        cfg = self.config
        kv = self.kv
        preserve = cfg.preserve_sharing_on_swap
        usable = self.pool.num_usable_blocks
        used = self._num_batch_slots_used()
        while self.swapped and st.token_budget > 0:
            request = self.swapped[0]
            if used + self._batch_slots(request) > cfg.max_num_seqs:
                break
            plan = self.planner.plan(request, st.token_budget)
            if not plan:
                break
            seqs = list(request.live_seqs)
            need = self.planner.swap_in_need(request, plan)
            if need > usable:
                # Only v0's accounting can get here (it counts blocks a step does not need);
                # vLLM 0.6.3 fails such a request too (AllocStatus.NEVER on swap-in).
                self._reject_queued(
                    self.swapped.popleft(), f"swapping it back in needs {need} blocks; the pool has {usable}"
                )
                continue
            # NOTE: with nothing running, the watermark cannot protect anyone, and a request that
            # grew into it could otherwise never come back (vLLM would wait forever here).
            watermark = cfg.watermark_blocks if self.running else 0
            if self.pool.num_free_blocks - need < watermark:
                break
            self.swapped.popleft()
            st.swap_in.extend(kv.swap_in(seqs, preserve_sharing=preserve))
            self.planner.unpark(request)  # parked sequences join from the next step
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            st.swapped_in.append(request.request_id)
            self._run(request, plan, st)
            used += self._batch_slots(request)

    # ---------------------------------------------------------- waiting
    def _schedule_waiting(self, st: _Step) -> None:
        cfg = self.config
        kv = self.kv
        pool = self.pool
        bs = self.block_size
        room = admission_room(cfg, pool.num_usable_blocks)
        used = self._num_batch_slots_used()
        while self.waiting and st.token_budget > 0:
            request = self.waiting[0]
            slots = self._batch_slots(request)
            if used + slots > cfg.max_num_seqs:
                break
            seqs = list(request.live_seqs)
            hits = [[] if seq.parked else kv.find_cached_prefix(seq) for seq in seqs]
            plan = self.planner.plan(request, st.token_budget, [len(h) * bs for h in hits])
            if not plan:  # without chunked prefill, the head waits for a step with room
                break
            # Admission needs every sequence's whole known length to fit, less its hits (vLLM v1)
            # and, for parked sequences, less the prompt blocks they will share with the leader.
            shared = request.prompt_len // bs
            new_blocks = sum(
                cdiv(seq.num_tokens, bs) - (shared if seq.parked else len(h)) for seq, h in zip(seqs, hits)
            )
            hit_blocks = {b for h in hits for b in h}
            watermark = admission_watermark(cfg, anything_running=bool(self.running))
            if new_blocks + kv.num_evictable(hit_blocks) + watermark > pool.num_free_blocks:
                if new_blocks + len(hit_blocks) > room:  # not even into an empty pool
                    self._reject_queued(
                        self.waiting.popleft(),
                        f"after a recompute preemption its {len(seqs)} sequence(s) need "
                        f"{new_blocks + len(hit_blocks)} blocks to resume; an admission gets at most {room}",
                    )
                    continue
                break
            self.waiting.popleft()
            hit_tokens = 0
            for seq, h in zip(seqs, hits):
                if h:
                    kv.touch_prefix(seq, h)
                    hit_tokens += len(h) * bs
            self.planner.unpark(request)
            self._num_admissions += 1
            request.admitted_seq_no = self._num_admissions
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.was_preempted:
                st.resumed[request.request_id] = hit_tokens
            else:
                st.new[request.request_id] = hit_tokens
                self.num_prompt_tokens_admitted += request.prompt_len
                self.num_prefix_hit_tokens += hit_tokens
            request.was_preempted = False
            self._run(request, plan, st)
            used += slots

    def _reject_queued(self, request: Request, reason: str) -> None:
        """Reject a request already taken off its queue, releasing whatever it holds."""
        del self.requests[request.request_id]
        for seq in request.seqs:
            self.kv.free(seq)
            self.kv.free_cpu(seq)
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
        finished = self.output_processor.process(output, self.requests, sampled, beam_choices)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            for request in finished:
                del self.requests[request.request_id]
            self.num_finished_requests += len(finished)
        if self._last_record is not None and self._last_record["step"] == output.step:
            self._last_record["finished"] = sorted(r.request_id for r in finished)
        return finished

    # ------------------------------------------------------------ checking
    def check(self) -> None:
        """Assert the policy's invariants (O(blocks + requests); for tests)."""
        self.kv.check(self.requests.values())
        for request in self.running:
            assert request.status is RequestStatus.RUNNING
        for request in self.waiting:
            assert request.status is RequestStatus.WAITING
            assert all(not s.block_table for s in request.seqs), f"{request.request_id} waits holding blocks"
        for request in self.swapped:
            assert request.status is RequestStatus.SWAPPED
            assert all(not s.block_table for s in request.seqs)
        for request in self.requests.values():
            assert request.live_seqs == [s for s in request.seqs if not s.finished]
        assert len(self.running) + len(self.waiting) + len(self.swapped) == len(self.requests)


