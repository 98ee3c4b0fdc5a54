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

Requests that can never be served are rejected with a reason when added (prompt longer than
``max_model_len``, needing more blocks than the pool has, a prompt over the token budget with
chunked prefill off), or at the head of the queue if a preemption made them unservable; nothing
waits forever.

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

from engine.policy.block_key import HashFn, default_hash
from engine.policy.block_pool import BlockPool
from engine.policy.config import SchedulerConfig
from engine.policy.kv_manager import KVCacheManager, cdiv
from engine.policy.output import DecisionLog, Pair, ScheduledSequence, SchedulerOutput, frozen_map
from engine.policy.preemption import Mode, make_preemption_mode, make_victim_policy
from engine.policy.request import Request, RequestStatus, Sequence
from engine.policy.swap_pool import SwapPool, SwapSpaceExhausted
from engine.policy.sampling import BeamChoices, OutputProcessor, SampledTokens


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
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.decision_log = DecisionLog()
        self.next_step = 0
        self.num_finished_requests = 0
        self.num_rejected_requests = 0
        self.num_preemptions = 0
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
        reason = self._never_fits(request)
        if reason is not None:
            self._reject(request, reason)
            return False
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return True

    def _never_fits(self, request: Request) -> str | None:
        cfg = self.config
        bs = self.block_size
        if request.prompt_len >= cfg.max_model_len:
            # NOTE: a sequence stops on reaching max_model_len tokens, so the prompt must leave
            # room for at least one generated token (vLLM caps max_tokens the same way).
            return (
                f"prompt of {request.prompt_len} tokens leaves no room for output within "
                f"max_model_len {cfg.max_model_len}"
            )
        if not cfg.enable_chunked_prefill and request.prompt_len > cfg.max_num_batched_tokens:
            return (
                f"prompt of {request.prompt_len} tokens exceeds max_num_batched_tokens "
                f"{cfg.max_num_batched_tokens} and chunked prefill is off"
            )
        samples = request.num_samples
        if samples > cfg.max_num_batched_tokens:
            return f"{samples} samples cannot decode within max_num_batched_tokens {cfg.max_num_batched_tokens}"
        if cfg.seq_limit_counts == "sequences" and samples > cfg.max_num_seqs:
            return f"{samples} samples exceed max_num_seqs {cfg.max_num_seqs}"
        longest = min(request.prompt_len + request.max_tokens, cfg.max_model_len)
        shared_prompt_blocks = request.prompt_len // bs if samples > 1 else 0
        peak = shared_prompt_blocks + samples * (cdiv(longest, bs) - shared_prompt_blocks)
        usable = self.pool.num_usable_blocks
        if cdiv(request.prompt_len, bs) > self._admission_room():
            return (
                f"its prompt needs {cdiv(request.prompt_len, bs)} blocks of {bs} tokens but the "
                f"pool admits at most {self._admission_room()} (above the watermark)"
            )
        if peak > usable:
            return (
                f"needs {peak} blocks of {bs} tokens at its longest ({longest} tokens x {samples} "
                f"sample(s)) but the pool has {usable}"
            )
        return None

    def _admission_room(self) -> int:
        """Most blocks an admission can ever get: the pool, less the watermark unless the watermark
        applies only while something runs (then an idle pool admits into it)."""
        cfg = self.config
        watermark = 0 if cfg.watermark_only_when_running else cfg.watermark_blocks
        return self.pool.num_usable_blocks - watermark

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
        for seq in request.seqs:
            self.kv.free(seq)
            self.kv.free_cpu(seq)
            seq.finished = True
            seq.finish_reason = "aborted"
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
            order=tuple(st.tokens_per_request),
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

    def _plan_tokens(self, request: Request, token_budget: int) -> list[tuple[Sequence, int]] | None:
        """Tokens each unfinished sequence computes next, or ``None`` if the request does not fit
        the budget. A request's decoding sequences run together or not at all; a prefilling one
        may be cut to the budget (chunked prefill) or wait for a later step once it is spent."""
        cfg = self.config
        chunked = cfg.enable_chunked_prefill and not self._steps_together(request)
        plan = []
        for seq in request.seqs:
            if seq.finished:
                continue
            remaining = seq.num_tokens - seq.num_computed_tokens
            # NOTE: vLLM v1 caps at max_model_len - 1 - num_computed, so no step computes a
            # token at position max_model_len.
            n = min(remaining, cfg.max_model_len - 1 - seq.num_computed_tokens)
            if n <= 0:
                continue
            if n > token_budget:
                if remaining == 1 or not chunked:
                    return None
                if token_budget == 0:
                    continue
                n = token_budget
            plan.append((seq, n))
            token_budget -= n
        return plan

    @staticmethod
    def _steps_together(request: Request) -> bool:
        """Beams are chosen across all of a request's sequences at once, so a beam group that
        re-prefills after a recompute preemption is never chunked: its beams sample together."""
        return request.beam_width > 1 and sum(1 for s in request.seqs if not s.finished) > 1

    def _blocks_needed(self, plan: list[tuple[Sequence, int]]) -> int:
        cfg = self.config
        need = 0
        for seq, n in plan:
            end = seq.num_tokens if cfg.reserve_extent == "whole" else seq.num_computed_tokens + n
            blocks = self.kv.blocks_to_reserve(seq, seq.num_filled_tokens, end)
            need += max(blocks, 1) if cfg.count_block_per_running_seq else blocks
        return need

    def _run(self, request: Request, plan: list[tuple[Sequence, int]], st: _Step) -> None:
        """Reserve slots for the planned tokens and add them to the step."""
        cfg = self.config
        kv = self.kv
        whole = cfg.reserve_extent == "whole"
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

    def _schedule_running(self, st: _Step) -> None:
        running = self.running
        pool = self.pool
        i = 0
        while i < len(running) and st.token_budget > 0:
            request = running[i]
            plan = self._plan_tokens(request, st.token_budget)
            if plan is None:
                break
            if not plan:
                i += 1
                continue
            need = self._blocks_needed(plan)
            preempted_itself = False
            while need > pool.num_free_blocks:
                victim = self.victim_policy.choose(running[i:])
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
        if self.running and self.running[-1] is victim:
            self.running.pop()
        else:
            self.running.remove(victim)
        seqs = victim.running_seqs
        preserve = cfg.preserve_sharing_on_swap
        num_blocks = kv.blocks_to_swap_out(seqs, preserve_sharing=preserve)
        mode: Mode = self.preemption_mode.choose(
            victim, num_blocks=num_blocks, num_tokens=sum(s.num_tokens for s in seqs)
        )
        if mode == "swap" and num_blocks > self.swap_pool.num_free_blocks:
            if cfg.on_swap_exhausted == "raise":
                raise SwapSpaceExhausted(
                    f"swapping out {victim.request_id!r} needs {num_blocks} CPU blocks, "
                    f"{self.swap_pool.num_free_blocks} free"
                )
            mode = "recompute"
        if mode == "swap":
            st.swap_out.extend(kv.swap_out(seqs, preserve_sharing=preserve))
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
        else:
            for seq in seqs:
                kv.free(seq)
                seq.num_computed_tokens = 0
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

    def _schedule_swapped(self, st: _Step) -> None:
        cfg = self.config
        kv = self.kv
        preserve = cfg.preserve_sharing_on_swap
        used = self._num_batch_slots_used()
        while self.swapped and st.token_budget > 0:
            request = self.swapped[0]
            if used + self._batch_slots(request) > cfg.max_num_seqs:
                break
            seqs = request.running_seqs
            plan = self._plan_tokens(request, st.token_budget)
            if not plan:
                break
            need = kv.blocks_to_swap_in(seqs, preserve_sharing=preserve) + self._blocks_needed_after_swap_in(plan)
            if need > self.pool.num_usable_blocks - cfg.watermark_blocks:
                # Only v0's block accounting can get here (it counts blocks a step does not
                # need); vLLM 0.6.3 fails such a request too (AllocStatus.NEVER on swap-in).
                self._reject_swapped_head(
                    f"swapping it back in needs {need} blocks; the pool has "
                    f"{self.pool.num_usable_blocks - cfg.watermark_blocks} above the watermark"
                )
                continue
            if self.pool.num_free_blocks - need < cfg.watermark_blocks:
                break
            self.swapped.popleft()
            st.swap_in.extend(kv.swap_in(seqs, preserve_sharing=preserve))
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            st.swapped_in.append(request.request_id)
            self._run(request, plan, st)
            used += self._batch_slots(request)

    def _blocks_needed_after_swap_in(self, plan: list[tuple[Sequence, int]]) -> int:
        """New blocks the planned tokens need beyond the swapped tables (no copy-on-write is
        counted: swap-in gives every sequence... the same sharing it had, so a shared partial
        block would need a copy; counted conservatively as one block per such sequence)."""
        cfg = self.config
        bs = self.block_size
        need = 0
        for seq, n in plan:
            end = seq.num_tokens if cfg.reserve_extent == "whole" else seq.num_computed_tokens + n
            blocks = max(0, cdiv(end, bs) - len(seq.cpu_block_table))
            if seq.num_filled_tokens % bs and self.swap_pool.ref_counts[seq.cpu_block_table[-1]] > 1:
                blocks += 1  # copy-on-write of the shared partial block
            need += max(blocks, 1) if cfg.count_block_per_running_seq else blocks
        return need

    def _schedule_waiting(self, st: _Step) -> None:
        cfg = self.config
        kv = self.kv
        pool = self.pool
        bs = self.block_size
        used = self._num_batch_slots_used()
        while self.waiting and st.token_budget > 0:
            request = self.waiting[0]
            slots = self._batch_slots(request)
            if used + slots > cfg.max_num_seqs:
                break
            seqs = request.running_seqs
            hits = [kv.find_cached_prefix(seq) for seq in seqs]
            remaining = [seq.num_tokens - len(h) * bs for seq, h in zip(seqs, hits)]
            if (not cfg.enable_chunked_prefill or self._steps_together(request)) and sum(remaining) > st.token_budget:
                if sum(remaining) > cfg.max_num_batched_tokens:
                    self._reject_waiting_head(
                        f"after a recompute preemption it must prefill {sum(remaining)} tokens in one "
                        f"step (chunked prefill off, or a beam group), over max_num_batched_tokens "
                        f"{cfg.max_num_batched_tokens}"
                    )
                    continue
                break
            whole_need = sum(
                cdiv(min(seq.num_tokens, cfg.max_model_len), bs) - len(h) + kv.num_evictable(h)
                for seq, h in zip(seqs, hits)
            )
            watermark = 0 if cfg.watermark_only_when_running and not self.running else cfg.watermark_blocks
            if whole_need + watermark > pool.num_free_blocks:
                unshared = sum(cdiv(min(s.num_tokens, cfg.max_model_len), bs) for s in seqs)
                if unshared > self._admission_room():
                    self._reject_waiting_head(
                        f"after a recompute preemption its {len(seqs)} sequence(s) need {unshared} "
                        f"blocks to resume; the pool admits at most {self._admission_room()}"
                    )
                    continue
                break
            self.waiting.popleft()
            hit_tokens = 0
            budget = st.token_budget
            plan = []
            for seq, h, rest in zip(seqs, hits, remaining):
                if h:
                    kv.touch_prefix(seq, h)
                    hit_tokens += len(h) * bs
                n = min(rest, budget)
                if n > 0:
                    plan.append((seq, n))
                    budget -= n
            self._num_admissions += 1
            request.admitted_seq_no = self._num_admissions
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.was_preempted:
                st.resumed[request.request_id] = hit_tokens
            else:
                st.new[request.request_id] = hit_tokens
            request.was_preempted = False
            self._run(request, plan, st)
            used += slots

    def _reject_waiting_head(self, reason: str) -> None:
        self._reject_queued(self.waiting.popleft(), reason)

    def _reject_swapped_head(self, reason: str) -> None:
        self._reject_queued(self.swapped.popleft(), reason)

    def _reject_queued(self, request: Request, reason: str) -> None:
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
        assert len(self.running) + len(self.waiting) + len(self.swapped) == len(self.requests)


