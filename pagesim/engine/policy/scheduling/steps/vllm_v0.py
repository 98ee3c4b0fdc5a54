"""The ``vllm-v0`` step order: vLLM 0.6.3's ``Scheduler._schedule_default`` (chunked prefill off)
and ``_schedule_chunked_prefill`` with ``SelfAttnBlockSpaceManager`` and no prefix caching, as
the oracle README (``shared/oracle/README.md`` §5) describes them and vLLM's own logs pin down.

Without chunked prefill, one step:

1. **prefills**, only while nothing is swapped out: the waiting head is admitted if its whole
   sequence fits above the watermark and in both budgets; the first that does not stops the pass;
2. **decodes**, only if step 1 admitted nothing: running groups from the front; while one cannot
   append, the *last* unprocessed group is preempted (or the group itself when none is left);
   decodes are not limited by the token budget;
3. **swap-ins**, only if step 2 ran and preempted nothing.

With chunked prefill: running groups first (a single-sequence group's prefill is chunked to the
remaining budget; the pass stops at the first group that gets no tokens), then swap-ins (only if
nothing was preempted; never chunked), then prefills, *always*, even after a preemption and while
groups are swapped out.

Preemption victims rejoin their queues only after the step (recompute victims at the front of
``waiting``, the last preempted first; swap victims at the back of ``swapped``), and ``running``
and the output are reassembled in vLLM's orders (see ``_reassemble``).

Accounting, vLLM 0.6.3's (pagesim's own policy counts what a step really needs instead):

- ``touched(s) = 1 + ceil((u - f) / block_size)`` with ``u`` the tokens not yet written into the
  table and ``f`` the free slots of its last block: a decoding sequence counts 1 whether or not it
  needs a new block;
- *can_append*: the touched blocks of the group's running sequences fit in the free blocks (no
  watermark);
- *swap need*: touched blocks plus full table entries, once per sequence even when shared; a swap-out
  that needs more CPU blocks than are free raises (``on_swap_exhausted="raise"``), a swap-in
  must leave the watermark free;
- *can_allocate*: ``ceil(len / block_size)`` blocks above the watermark; the whole sequence gets
  blocks at admission even when only a chunk is computed;
- the budget (``SchedulingBudget``) keys tokens and sequences by request id; a multi-sequence
  group counts ``n`` sequences before its fork.

Where vLLM 0.6.3 stops, so does this order: swap space running out raises ``SwapSpaceExhausted``
and recomputing a request with several running sequences raises ``VllmV0Abort`` (vLLM asserts);
the queues are left consistent (the step's partial work is not undone: an abort is final).
Where vLLM would provably wait or repeat forever, pagesim lets the request through instead:

- a prefill alone in the pool that would recompute itself only because v0 counts a touched block
  it does not need runs (``_would_thrash``);
- a swapped request that needs more than the pool above the watermark comes back once no block is
  held;
- a request swapped out mid-prefill whose remaining prompt exceeds the whole token budget comes
  back with its prefill chunked (vLLM never chunks a swap-in).

Beam search is not modelled under this order; such requests are rejected on arrival.
"""

from __future__ import annotations

from collections import deque

from pagesim.engine.policy.scheduling.errors import VllmV0Abort
from pagesim.engine.policy.memory.kv_manager import cdiv
from pagesim.engine.policy.scheduling.planning import Plan
from pagesim.engine.policy.scheduling.preemption import Mode
from pagesim.engine.policy.scheduling.request import Request, Sequence
from pagesim.engine.policy.scheduling.steps.base import Step, StepOrder
from pagesim.engine.policy.memory.swap_pool import SwapSpaceExhausted

#: A group scheduled by a pass and whether it was a prefill (in the pass's processing order).
Ran = tuple[Request, bool]


def touched_blocks(seq: Sequence, block_size: int) -> int:
    """vLLM 0.6.3's ``get_num_blocks_touched_by_append_slots`` for the sequence's unwritten tokens."""
    filled = seq.num_filled_tokens
    unwritten = seq.num_tokens - filled
    first_chunk = block_size - filled % block_size
    return 1 + cdiv(unwritten - first_chunk, block_size)


def new_tokens(seq: Sequence) -> int:
    """vLLM 0.6.3's ``get_num_new_tokens``: 1 in the decode stage, else every uncomputed token."""
    return 1 if seq.decoding else seq.num_tokens - seq.num_computed_tokens


def _cap(plan: Plan, tokens: int) -> Plan:
    """The plan cut to ``tokens`` in sequence order (sequences left with nothing are dropped)."""
    capped = []
    for seq, n in plan:
        n = min(n, tokens)
        if n <= 0:
            break
        capped.append((seq, n))
        tokens -= n
    return capped


#: ``VllmV0StepOrder.prefill_pass_stop`` for a prefill pass that admits or rejects its head.
ADMITS = "admits"

#: What this order raises where vLLM 0.6.3 itself stops.
VLLM_V0_ABORTS = (SwapSpaceExhausted, VllmV0Abort)


def abort_words(exc: Exception) -> str:
    """A command's error for a run stopped by one of ``VLLM_V0_ABORTS``, with what lets it go on."""
    hint = ("more --swap-space, or --preemption recompute, lets it go on" if isinstance(exc, SwapSpaceExhausted)
            else "--preemption vllm-v0 or swap lets it go on")
    return f"the run stopped where vLLM 0.6.3 aborts: {exc} ({hint})"


class SchedulingBudget:
    """vLLM 0.6.3's ``SchedulingBudget``: tokens and sequences keyed by request id, so adding a
    request twice counts once and dropping it removes what it added."""

    def __init__(self, token_budget: int, max_num_seqs: int):
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self._tokens: dict[str, int] = {}
        self._seqs: dict[str, int] = {}
        self.num_tokens = 0
        self.num_seqs = 0

    def can_schedule(self, tokens: int, seqs: int) -> bool:
        return self.num_tokens + tokens <= self.token_budget and self.num_seqs + seqs <= self.max_num_seqs

    @property
    def remaining_tokens(self) -> int:
        return self.token_budget - self.num_tokens

    def add_tokens(self, request_id: str, n: int) -> None:
        if request_id not in self._tokens:
            self._tokens[request_id] = n
            self.num_tokens += n

    def add_seqs(self, request_id: str, n: int) -> None:
        if request_id not in self._seqs:
            self._seqs[request_id] = n
            self.num_seqs += n

    def drop(self, request_id: str) -> None:
        self.num_tokens -= self._tokens.pop(request_id, 0)
        self.num_seqs -= self._seqs.pop(request_id, 0)

    @classmethod
    def already_used(cls, token_budget: int, max_num_seqs: int, tokens: int, seqs: int) -> SchedulingBudget:
        """A budget of which ``tokens`` and ``seqs`` are taken by requests it does not key (the
        fast path's decode batch: none of them is added or dropped again in the step)."""
        budget = cls(token_budget, max_num_seqs)
        budget.num_tokens = tokens
        budget.num_seqs = seqs
        return budget


class VllmV0StepOrder(StepOrder):
    name = "vllm-v0"

    def rejection_reason(self, request: Request) -> str | None:
        if request.beam_width > 1:
            return "beam search is not modelled under the vllm-v0 step order (use n for parallel samples)"
        return None

    # ----------------------------------------------------------- accounting
    def _can_append(self, request: Request) -> bool:
        bs = self.config.block_size
        need = sum(touched_blocks(seq, bs) for seq in request.live_seqs)
        return need <= self.scheduler.pool.num_free_blocks

    def swap_need(self, request: Request) -> int:
        """Blocks vLLM 0.6.3 asks for to swap ``request`` out or in: touched plus full entries."""
        bs = self.config.block_size
        return sum(touched_blocks(seq, bs) + seq.num_filled_tokens // bs for seq in request.live_seqs)

    def _plan(self, request: Request, budget: SchedulingBudget, chunking: bool) -> Plan:
        seqs = request.live_seqs
        counts = [new_tokens(seq) for seq in seqs]
        if chunking and len(seqs) == 1:
            counts[0] = min(counts[0], budget.remaining_tokens)
        return [(seq, n) for seq, n in zip(seqs, counts) if n > 0]

    def _would_thrash(self, request: Request, plan: Plan) -> bool:
        """Whether preempting ``request`` (the last group left) would only bring it back into this
        same state, forever: it is alone in the pool, what it really needs fits, and it is
        prefilling a sequence too long to finish in the one step of its re-admission, and it
        would be recomputed (a swap keeps its computed tokens, so vLLM progresses). Its blocks
        then come back as they are, and v0's count (a touched block even for a partial last block
        with nothing to write) fails again: vLLM 0.6.3 livelocks here. A decoding request is left
        to vLLM's rule, under which it re-prefills and samples, so it makes progress."""
        s = self.scheduler
        seqs = request.live_seqs
        if len(seqs) > 1 or seqs[0].decoding or seqs[0].num_tokens <= self.config.max_num_batched_tokens:
            return False
        if s.choose_mode(request) == "swap":  # swapped out and back, it keeps its computed tokens
            return False
        free = s.pool.num_free_blocks
        return len(seqs[0].block_table) + free == s.pool.num_usable_blocks and s.planner.blocks_needed(plan) <= free

    def _is_prefill(self, request: Request) -> bool:
        return not request.live_seqs[0].decoding

    # ------------------------------------------------------------------ step
    def schedule(self, st: Step) -> None:
        s = self.scheduler
        cfg = self.config
        chunking = cfg.enable_chunked_prefill
        budget = SchedulingBudget(cfg.max_num_batched_tokens, cfg.max_num_seqs)
        victims: list[tuple[Request, Mode]] = []
        admitted: list[Request] = []
        ran: list[Ran] = []
        swapped_in: list[Ran] = []
        not_reached = list(s.running)
        if chunking:
            not_reached, ran = self._schedule_running(st, budget, chunking, victims)
            if not victims:
                swapped_in = self._schedule_swapped(st, budget)
            admitted = self._schedule_prefills(st, budget, chunking)
        else:
            for request in s.running:
                budget.add_seqs(request.request_id, request.max_running_seqs)
            if not s.swapped:
                admitted = self._schedule_prefills(st, budget, chunking)
            else:  # (for skip-ahead: nothing is admitted while a request is swapped out)
                st.waiting_stop = "swapped"
            if not admitted:
                not_reached, ran = self._schedule_running(st, budget, chunking, victims)
                if not victims:
                    swapped_in = self._schedule_swapped(st, budget)
        self._reassemble(st, chunking, not_reached, admitted, ran, swapped_in, victims)

    def _reassemble(
        self,
        st: Step,
        chunking: bool,
        not_reached: list[Request],
        admitted: list[Request],
        ran: list[Ran],
        swapped_in: list[Ran],
        victims: list[tuple[Request, Mode]],
    ) -> None:
        """Requeue victims and rebuild ``running`` and the output order as vLLM 0.6.3 does."""
        s = self.scheduler
        s.waiting.extendleft([v for v, mode in victims if mode == "recompute"])
        s.swapped.extend([v for v, mode in victims if mode == "swap"])
        if chunking:
            run_prefills = [r for r, prefill in ran if prefill]
            run_decodes = [r for r, prefill in ran if not prefill]
            swap_prefills = [r for r, prefill in swapped_in if prefill]
            swap_decodes = [r for r, prefill in swapped_in if not prefill]
            s.running = not_reached + swap_decodes + swap_prefills + run_decodes + run_prefills + admitted
            order = admitted + run_prefills + swap_prefills + run_decodes + swap_decodes
        else:
            s.running = not_reached + admitted + [r for r, _ in ran] + [r for r, _ in swapped_in]
            order = admitted + [r for r, _ in ran] + [r for r, _ in swapped_in]
        rank = {r.request_id: i for i, r in enumerate(order)}
        st.reorder(rank)
        st.swapped_in.sort(key=rank.__getitem__)  # "scheduled order", as the oracle logs list them

    # ------------------------------------------------------------- passes
    def _schedule_running(
        self, st: Step, budget: SchedulingBudget, chunking: bool, victims: list[tuple[Request, Mode]]
    ) -> tuple[list[Request], list[Ran]]:
        s = self.scheduler
        queue = deque(s.running)
        ran: list[Ran] = []
        try:
            while queue:
                request = queue[0]
                plan = self._plan(request, budget, chunking)
                tokens = sum(n for _, n in plan)
                if tokens <= 0:
                    break
                queue.popleft()
                if self._make_room(request, plan, queue, budget, st, victims):
                    prefill = self._is_prefill(request)
                    s.run(request, plan, st)
                    budget.add_tokens(request.request_id, tokens)
                    if chunking:
                        budget.add_seqs(request.request_id, request.max_running_seqs)
                    ran.append((request, prefill))
        except VLLM_V0_ABORTS:
            # vLLM stops here. Leave the queues as check() expects: this step's victims out of
            # ``running`` and requeued, everything else where it was.
            taken = {id(v) for v, _ in victims}
            s.running = [r for r in s.running if id(r) not in taken]
            for victim, mode in victims:
                s.requeue(victim, mode)
            raise
        return list(queue), ran

    def _make_room(
        self,
        request: Request,
        plan: Plan,
        queue: deque[Request],
        budget: SchedulingBudget,
        st: Step,
        victims: list[tuple[Request, Mode]],
    ) -> bool:
        """Preempt from the back of ``queue`` (or ``request`` itself, last) until ``request`` can
        append; ``False`` if it had to go itself."""
        s = self.scheduler
        while not self._can_append(request):
            if not queue and self._would_thrash(request, plan):
                return True
            budget.drop(request.request_id)
            victim = s.victim_policy.choose(list(queue)) if queue else request
            if victim is not request:
                queue.remove(victim)
            victims.append((victim, self.preempt_victim(victim, st)))
            if victim is request:
                return False
        return True

    def preempt_victim(self, victim: Request, st: Step) -> Mode:
        """Preempt a victim of the running pass as vLLM 0.6.3 does (the caller takes it out of
        the pass and requeues it after the step): in the preemption mode plug-in's mode, swap need
        counted as vLLM counts it; a recompute of several running sequences stops the run
        (``pagesim.engine.policy.fast_path.preempting_decode`` too)."""
        s = self.scheduler
        mode = s.choose_mode(victim)
        if mode == "recompute" and len(victim.live_seqs) > 1:
            raise VllmV0Abort(
                f"vLLM 0.6.3 cannot preempt {victim.request_id!r} by recompute: it has "
                f"{len(victim.live_seqs)} running sequences (vLLM asserts one); use "
                f"preemption_mode 'vllm-v0' or 'swap'"
            )
        return s.preempt(victim, st, mode=mode, swap_need=self.swap_need(victim))

    def _schedule_swapped(self, st: Step, budget: SchedulingBudget) -> list[Ran]:
        s = self.scheduler
        watermark = self.config.watermark_blocks
        usable = s.pool.num_usable_blocks
        swapped_in: list[Ran] = []
        while s.swapped:
            request = s.swapped[0]
            need = self.swap_need(request)
            if need > usable:  # vLLM 0.6.3: AllocStatus.NEVER, the request fails
                s.reject_queued(s.swapped.popleft(), f"swapping it back in needs {need} blocks; the pool has {usable}")
                continue
            if s.pool.num_free_blocks - need < watermark:
                # NOTE: one that needs more than the pool above the watermark would wait forever
                # in vLLM 0.6.3; pagesim brings it back into an idle pool (nothing holds a block).
                if s.pool.num_free_blocks < usable or need <= usable - watermark:
                    st.swapped_stop = "blocks"  # (for skip-ahead; as the waiting pass's below)
                    break
            plan = self._plan(request, budget, chunking=False)
            tokens = sum(n for _, n in plan)
            if tokens > self.config.max_num_batched_tokens:
                # NOTE: vLLM 0.6.3 never chunks a swap-in, so a request swapped out mid-prefill
                # whose remaining prompt exceeds the whole budget would wait forever (vLLM
                # stalls). pagesim chunks this one swap-in to the remaining budget instead.
                plan = _cap(plan, budget.remaining_tokens)
                tokens = sum(n for _, n in plan)
            if tokens <= 0 or not budget.can_schedule(tokens, request.max_running_seqs):
                st.swapped_stop = "budget"
                break
            s.swapped.popleft()
            prefill = self._is_prefill(request)
            s.swap_in(request, st)
            s.run(request, plan, st)
            budget.add_tokens(request.request_id, tokens)
            budget.add_seqs(request.request_id, request.max_running_seqs)
            swapped_in.append((request, prefill))
        return swapped_in

    def _schedule_prefills(self, st: Step, budget: SchedulingBudget, chunking: bool) -> list[Request]:
        s = self.scheduler
        admitted: list[Request] = []
        while s.waiting:
            request = s.waiting[0]
            verdict, detail = self._prefill_verdict(request, budget, chunking)
            if verdict == "reject":
                assert isinstance(detail, str)  # (the reason)
                s.reject_queued(s.waiting.popleft(), detail)
                continue
            if verdict != "admit":
                st.waiting_stop = verdict
                break
            assert isinstance(detail, int)  # (the prompt's tokens)
            leader = request.live_seqs[0]  # the only sequence of a waiting request
            s.waiting.popleft()
            s.admit(request, 0, st)
            s.run(request, [(leader, detail)], st)
            budget.add_tokens(request.request_id, detail)
            budget.add_seqs(request.request_id, request.max_running_seqs)
            admitted.append(request)
        return admitted

    def _prefill_verdict(self, request: Request, budget: SchedulingBudget,
                         chunking: bool) -> tuple[str, str | int | None]:
        """What the prefill pass does with the waiting head ``request``, changing nothing:
        ``("reject", why)``, ``("admit", its tokens)``, or a stop, ``("blocks", None)`` or
        ``("budget", None)``."""
        cfg = self.config
        watermark = cfg.watermark_blocks
        limit = cfg.max_model_len if chunking else min(cfg.max_model_len, cfg.max_num_batched_tokens)
        leader = request.live_seqs[0]  # the only sequence of a waiting request
        tokens = leader.num_tokens - leader.num_computed_tokens
        if chunking:
            tokens = min(tokens, budget.remaining_tokens)
        if tokens > limit:
            return "reject", f"its {tokens} tokens exceed the prompt limit {limit}"
        need = cdiv(leader.num_tokens, cfg.block_size)
        if cfg.num_gpu_blocks - need < watermark:
            return "reject", f"it needs {need} blocks; the pool above the watermark has {cfg.num_gpu_blocks - watermark}"
        # (why the head waits, for skip-ahead: both hold while only decodes run and none
        # finishes, as the free blocks only fall and the running groups and their tokens stay)
        if self.scheduler.pool.num_free_blocks - need < watermark:
            return "blocks", None
        if tokens <= 0 or not budget.can_schedule(tokens, request.max_running_seqs):
            return "budget", None
        return "admit", tokens

    def prefill_pass_stop(self, num_seqs: int) -> str | None:
        """For a step whose running groups are a steady decode batch of ``num_seqs`` sequences
        (``pagesim.engine.policy.fast_path.fast_forward``; every group forked, so its running slots are its
        unfinished sequences), chunked prefill off: the stop its prefill pass (the step's first)
        records when it admits and rejects nothing (``"swapped"``, ``"blocks"``, ``"budget"``, or
        ``None`` with nothing waiting), else ``ADMITS``. Changes nothing."""
        s = self.scheduler
        if s.swapped:
            return "swapped"
        if not s.waiting:
            return None
        cfg = self.config
        budget = SchedulingBudget.already_used(cfg.max_num_batched_tokens, cfg.max_num_seqs, 0, num_seqs)
        verdict, _ = self._prefill_verdict(s.waiting[0], budget, chunking=False)
        return verdict if verdict in ("blocks", "budget") else ADMITS
