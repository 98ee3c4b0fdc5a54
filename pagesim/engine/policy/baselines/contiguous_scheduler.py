"""The pre-PagedAttention baseline: Orca-style batching over contiguous KV-cache reservations.

Kwon et al. (SOSP 2023, §2.3 and §6) compare vLLM with Orca (Max), Orca (Pow2) and Orca (Oracle),
which differ only in how much contiguous memory a request reserves up front (``ContiguousAllocator``'s
``"max"``, ``"pow2"`` and ``"oracle"``). This scheduler has the paged ``Scheduler``'s interface, so
the simulator drives either one unchanged. Each step (iteration-level scheduling, FCFS):

1. the running requests in admission order: sequence 0 continues its prompt with a chunk, each
   decoding sequence computes one token; a request that does not fit what is left of the token
   budget (``max_num_batched_tokens``) skips this step;
2. admissions from the head of ``waiting`` while its slabs fit now (first fit, or buddy allocation
   with ``placement="buddy"``), ``max_num_seqs``
   allows and budget remains (a first chunk with chunked prefill, else the whole prompt). The
   first request that does not fit stops admission (head-of-line blocking).

Under the ``vllm-v0`` step order without chunked prefill the two passes swap and exclude each
other, as in that order: admissions first, and the running requests decode only in a step that
admitted no prompt (prompt-only steps), so a baseline compared with vLLM v0 batches as it does.

Differences from the paged scheduler:

- memory is reserved per *sequence*, for its whole life, at admission: ``num_samples`` slabs
  (``n`` or the beam width), all or nothing, nothing shared; the prompt's KV is modelled as copied
  into every slab. Slab keys are ``(request_id, seq_index)``; sample ``k``'s slab is sized for its
  own output length (``sample_max_tokens[k]``, else ``max_tokens``), capped at ``max_model_len``;
- a running request never needs more memory: no preemption, no swap (``swapped`` stays empty), no
  prefix cache, watermark or eviction;
- the prompt is prefilled once, on sequence 0; the other sequences are forked at its first sample
  and each then decodes on its own (beams are never pruned: ``beam_choices`` are refused);
- ``ScheduledSequence.block_table`` is empty (no block tables, so ``slot_mapping()`` means nothing);
  placement is in each decision record's ``"slabs"``: ``{request: [[start slot, slots], ...]}`` for
  the requests admitted that step.

Accounting is ``ContiguousAllocator``'s: a slab counts the prompt as written from admission (even
while a chunked prefill still computes it) and each sampled token when sampled; a sequence's slab
is freed when it finishes (``max_tokens_of`` outputs, or ``max_model_len`` tokens).

Invariants (``check()``): the allocator's; a waiting request holds no slab; a running one holds one
slab per unfinished sequence (``num_samples`` before its fork); the batch stays within
``max_num_seqs``. A request that could never run is rejected with a reason when added; any other is
admitted eventually, since an idle scheduler always admits the head of the queue.
"""

from __future__ import annotations

from collections import deque

from pagesim.engine.policy.scheduling.admission import limits_reason
from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.baselines.contiguous import ContiguousAllocator
from pagesim.engine.policy.scheduling.output import DecisionLog, ScheduledSequence, SchedulerOutput, frozen_map
from pagesim.engine.policy.scheduling.request import Request, RequestStatus, Sequence
from pagesim.engine.policy.scheduling.sampling import BeamChoices, SampledTokens, finish_reason, sampled_token
from pagesim.engine.policy.scheduling.scheduler import retire_finished
from pagesim.engine.policy.memory.usage import KvUsage


class ContiguousScheduler:
    #: Beams are never pruned here, so an executor must not pass ``beam_choices``.
    supports_beam_choices = False
    #: No block tables: one contiguous slab per sequence (a cost model charges no per-block cost).
    paged = False

    def __init__(self, config: SchedulerConfig, *, reservation: str, capacity_slots: int | None = None,
                 placement: str = "first-fit"):
        self.config = config
        self.block_size = config.block_size
        if capacity_slots is None:
            capacity_slots = config.num_usable_gpu_blocks * config.block_size
        self.allocator = ContiguousAllocator(capacity_slots, reservation, config.max_model_len, placement=placement)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()  # always empty: nothing is ever swapped
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.decision_log = DecisionLog()
        self.next_step = 0
        self.num_finished_requests = 0
        self.num_rejected_requests = 0
        self.num_preemptions = 0  # always 0: a reservation covers the whole sequence
        self.num_prompt_tokens_admitted = 0
        self.num_prefix_hit_tokens = 0  # always 0: no prefix cache
        self._pending_rejections: dict[str, str] = {}
        self.num_aborted_requests = 0
        self._pending_aborts: list[str] = []  # aborted since the last schedule(), in order
        self._num_admissions = 0
        self._last_record: dict | None = None

    # ------------------------------------------------------------ sizing
    def output_len(self, request: Request, sample_index: int) -> int:
        """Output tokens sample ``sample_index``'s slab is sized for (capped by max_model_len)."""
        lens = request.sample_max_tokens
        wanted = request.max_tokens if lens is None else lens[sample_index]
        return min(wanted, self.config.max_model_len - request.prompt_len)

    def slab_sizes(self, request: Request) -> list[int]:
        """Slots of each of the request's ``num_samples`` slabs."""
        return [
            self.allocator.reservation_slots(request.prompt_len, self.output_len(request, k))
            for k in range(request.num_samples)
        ]

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> bool:
        """Queue ``request`` at the back of ``waiting``; ``False`` if it was rejected (its
        ``reject_reason`` says why, and the next output's ``rejected`` lists it)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        if request.status is not RequestStatus.WAITING or request.has_run:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        reason = self.rejection_reason(request)
        if reason is not None:
            request.status = RequestStatus.REJECTED
            request.reject_reason = reason
            self._pending_rejections[request.request_id] = reason
            self.num_rejected_requests += 1
            return False
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return True

    def rejection_reason(self, request: Request) -> str | None:
        """Why the request can never run here, or ``None`` if it will be admitted eventually."""
        reason = limits_reason(request, self.config)
        if reason is not None:
            return reason
        cfg, prompt, samples = self.config, request.prompt_len, request.num_samples
        budget, capacity = cfg.max_num_batched_tokens, self.allocator.capacity_slots
        if not cfg.enable_chunked_prefill and prompt > budget:  # (config validation makes it moot)
            return f"prompt of {prompt} tokens exceeds max_num_batched_tokens {budget} without chunked prefill"
        sizes = self.slab_sizes(request)
        if not self.allocator.could_ever_place(sizes):
            mode, placed = self.allocator.reservation, sum(self.allocator.placed_slots(n) for n in sizes)
            return (f"its {samples} {mode!r} reservation(s) need {placed} slots ({self.allocator.placement} placement) "
                    f"and cannot all be placed in {capacity}")
        return None

    def abort_request(self, request_id: str) -> None:
        """Drop an unfinished request wherever it is, freeing its slabs, between steps (as
        ``Scheduler.abort_request``); the next decision record lists it under ``aborted``."""
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"cannot abort request {request_id!r}: it is not unfinished in this scheduler")
        del self.requests[request_id]
        for queue in (self.waiting, self.running):
            if request in queue:
                queue.remove(request)
        for key in self._held_keys(request):
            self.allocator.free(key)
        for seq in list(request.live_seqs):
            request.retire_seq(seq, "aborted")
        request.status = RequestStatus.FINISHED
        self.num_aborted_requests += 1
        self._pending_aborts.append(request_id)

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        step = self.next_step
        self.next_step += 1
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        tokens: dict[str, int] = {}
        new: dict[str, int] = {}
        slabs: dict[str, list[list[int]]] = {}

        # vLLM v0 without chunked prefill runs prompt-only steps: a baseline compared with it
        # batches the same way (prompts first; decodes only in a step that admitted none).
        prompt_steps = cfg.step_order == "vllm-v0" and not cfg.enable_chunked_prefill
        if not prompt_steps:
            budget = self._schedule_running(budget, scheduled, tokens)
        budget = self._admit_waiting(budget, scheduled, tokens, new, slabs)
        if prompt_steps and not new:
            budget = self._schedule_running(budget, scheduled, tokens)

        output = SchedulerOutput(
            step=step,
            scheduled=tuple(scheduled),
            num_scheduled_tokens=frozen_map(tokens),
            new=frozen_map(new),
            rejected=frozen_map(self._pending_rejections),
            num_free_blocks=self.allocator.num_free_slots // self.block_size,
            # nothing is resumed, swapped, preempted, copied or cached here
            resumed=frozen_map({}), swapped_in=(), preempted=(), blocks_to_copy=(),
            blocks_to_swap_out=(), blocks_to_swap_in=(), num_free_cpu_blocks=0, num_cached_free_blocks=0,
            aborted=tuple(self._pending_aborts),
        )
        self._pending_rejections = {}
        self._pending_aborts = []
        if cfg.record_decisions:
            record = output.to_record()
            record["slabs"] = slabs
            self._last_record = record
            self.decision_log.append(record)
        return output

    def _schedule_running(self, budget: int, scheduled: list, tokens: dict) -> int:
        """The running requests in admission order, each if it fits what is left of the budget."""
        for request in self.running:
            plan = self._running_plan(request, budget)
            if plan:
                budget -= self._run(request, plan, scheduled, tokens)
        return budget

    def _admit_waiting(self, budget: int, scheduled: list, tokens: dict, new: dict, slabs: dict) -> int:
        """Admit from the head of ``waiting`` while its slabs, the batch limit and the budget allow."""
        cfg = self.config
        while self.waiting and budget > 0 and self._batch_has_room(self.waiting[0]):
            request = self.waiting[0]
            prompt = request.prompt_len
            chunk = min(prompt, budget) if cfg.enable_chunked_prefill else prompt
            if chunk > budget:
                break
            placed = self._allocate(request)
            if placed is None:
                break  # head-of-line blocking: FCFS admits no one past the head
            self.waiting.popleft()
            self.running.append(request)
            self._num_admissions += 1
            request.admitted_seq_no = self._num_admissions
            request.status = RequestStatus.RUNNING
            new[request.request_id] = 0
            slabs[request.request_id] = placed
            self.num_prompt_tokens_admitted += prompt
            budget -= self._run(request, [(request.seqs[0], chunk)], scheduled, tokens)
        return budget

    def _running_plan(self, request: Request, budget: int) -> list[tuple[Sequence, int]]:
        """This step's (sequence, tokens) for a running request; empty if it does not fit."""
        seqs = request.live_seqs
        if len(seqs) == 1 and seqs[0].is_prefilling:  # only sequence 0 ever prefills
            seq = seqs[0]
            remaining = seq.num_tokens - seq.num_computed_tokens
            return [(seq, min(remaining, budget))] if budget > 0 else []
        if len(seqs) > budget:
            return []
        return [(seq, 1) for seq in seqs]

    def _run(self, request: Request, plan: list[tuple[Sequence, int]], scheduled: list, tokens: dict) -> int:
        """Add the plan's tokens to the step (counted as computed at once); returns their number."""
        total = 0
        for seq, n in plan:
            start = seq.num_computed_tokens
            seq.num_computed_tokens = end = start + n
            samples = end >= seq.num_tokens
            if samples:
                seq.decoding = True
            # no block table: a slab is one contiguous range (see the decision record's "slabs")
            scheduled.append(
                ScheduledSequence(request.request_id, seq.index, start, n, (), self.block_size, samples)
            )
            total += n
        tokens[request.request_id] = total
        request.has_run = True
        return total

    def _batch_has_room(self, request: Request) -> bool:
        limit = self.config.max_num_seqs
        if self.config.seq_limit_counts == "requests":
            return len(self.running) < limit
        return self.num_running_seqs + request.num_samples <= limit

    @property
    def num_running_seqs(self) -> int:
        """Sequences of the running batch (``num_samples`` for a request not yet forked)."""
        return sum(r.max_running_seqs for r in self.running)

    def _allocate(self, request: Request) -> list[list[int]] | None:
        """Place all of the request's slabs, or none of them."""
        rid = request.request_id
        placed: list[list[int]] = []
        for k in range(request.num_samples):
            start = self.allocator.allocate((rid, k), request.prompt_len, self.output_len(request, k))
            if start is None:
                for j in reversed(range(k)):  # freeing restores the exact holes
                    self.allocator.free((rid, j))
                return None
            placed.append([start, self.allocator.reserved_slots((rid, k))])
        return placed

    def _held_keys(self, request: Request) -> list[tuple[str, int]]:
        """The slabs the request holds: one per unfinished sequence (all samples before the fork)."""
        rid = request.request_id
        return [(rid, k) for k in range(request.num_samples) if (rid, k) in self.allocator]

    # -------------------------------------------------------------- update
    def update(
        self, output: SchedulerOutput, sampled: SampledTokens = None, beam_choices: BeamChoices | None = None
    ) -> list[Request]:
        """Apply one executed step: append the sampled tokens, fork samples at a request's first
        sample, finish and free sequences. Returns the requests that finished, in scheduling
        order, marked ``FINISHED``. ``beam_choices`` must be empty (beams are never pruned)."""
        if beam_choices:
            raise ValueError("ContiguousScheduler does not prune beams: beam_choices are not supported")
        by_request: dict[str, list[Sequence]] = {}
        for s in output.scheduled:
            if s.samples:
                request = self.requests.get(s.request_id)
                if request is not None and request.status is RequestStatus.RUNNING:  # not aborted
                    by_request.setdefault(s.request_id, []).append(request.seqs[s.seq_index])
        finished: list[Request] = []
        for request_id, seqs in by_request.items():
            request = self.requests[request_id]
            if not request.forked and request.num_samples > 1:
                parent = seqs[0]
                request.forked = True
                for k in range(1, request.num_samples):
                    child = parent.fork(index=k)
                    request.add_seq(child)
                    self._append(child, sampled_token(sampled, parent, k))
                self._append(parent, sampled_token(sampled, parent, 0))
            else:
                for seq in seqs:
                    self._append(seq, sampled_token(sampled, seq, 0))
            if not request.live_seqs:
                request.status = RequestStatus.FINISHED
                finished.append(request)
        retire_finished(self, output.step, finished)
        return finished

    def _append(self, seq: Sequence, token: int | None) -> None:
        request = seq.request
        key = (request.request_id, seq.index)
        seq.output_token_ids.append(token)
        self.allocator.append_tokens(key, 1)
        reason = finish_reason(seq, self.config.max_model_len)
        if reason is not None:
            self.allocator.free(key)
            request.retire_seq(seq, reason)

    # --------------------------------------------------------------- usage
    def kv_usage(self) -> KvUsage:
        """Reserved slabs are allocated; written slots are used; nothing is shared or cached."""
        alloc = self.allocator
        reserved = alloc.num_reserved_slots
        return KvUsage(alloc.capacity_slots, reserved, alloc.num_used_slots, cached_slots=0,
                       unshared_slots=reserved)

    # ------------------------------------------------------------ checking
    def check(self) -> None:
        """Assert the invariants (O(slabs + requests); for tests)."""
        self.allocator.check()
        assert not self.swapped
        held = 0
        for request in self.running:
            assert request.status is RequestStatus.RUNNING
            rid = request.request_id
            if request.forked or request.num_samples == 1:
                expected = [(rid, s.index) for s in request.live_seqs]
            else:
                expected = [(rid, k) for k in range(request.num_samples)]
            assert self._held_keys(request) == expected, f"{rid} holds the wrong slabs"
            held += len(expected)
            for seq in request.live_seqs:
                assert seq.num_computed_tokens <= seq.num_tokens <= self.config.max_model_len
        for request in self.waiting:
            assert request.status is RequestStatus.WAITING
            assert not self._held_keys(request), f"{request.request_id} waits holding a slab"
        assert held == len(self.allocator), "a slab belongs to no running sequence"
        for request in self.requests.values():
            assert request.live_seqs == [s for s in request.seqs if not s.finished]
        assert len(self.running) + len(self.waiting) == len(self.requests)
        counts_requests = self.config.seq_limit_counts == "requests"
        assert (len(self.running) if counts_requests else self.num_running_seqs) <= self.config.max_num_seqs

