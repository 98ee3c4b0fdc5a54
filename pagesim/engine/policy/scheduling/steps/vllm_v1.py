"""The ``vllm-v1`` step order (pagesim's default): running, then swapped, then waiting.

This is vLLM v1's ``Scheduler.schedule()`` (0.32, FCFS, synchronous), generalised to swapping and
multi-sequence requests. Within a token budget and a batch limit, in this order:

1. **Running** requests, in running-list order, each get their next tokens (one per sequence for a
   decode; the next prefill chunk otherwise). When one cannot get the blocks it needs, victims are
   preempted (victim policy: which; preemption mode: swap or recompute) until it can; if it is
   itself the victim it is not scheduled. Under ``scheduling_policy="priority"`` (vLLM 0.33's
   ``SchedulerConfig(policy="priority")``) the victim is vLLM's: the largest (priority, arrival
   time) among ALL running requests, a request already scheduled this step included (it is then
   un-scheduled: its tokens back in the budget, its blocks, new ones too, freed).
2. **Swapped** requests, oldest first, are swapped back in while the blocks fit above the
   watermark (skipped in a step that preempted). vLLM v1 has no swapping; this pass follows v0's
   rule for it.
3. **Waiting** requests, FIFO (recompute victims at the front; under priority scheduling by
   (priority, arrival time, id), victims included, ``pagesim/engine/policy/scheduling/waiting_queue.py``): the longest
   cached prefix is reused, and a request is admitted only if its whole known sequence fits above
   the watermark, minus the GPU's hits; the head blocks everyone behind it (no overtaking).
   Skipped in a step that preempted. With an offload store (vLLM 0.33's ``Scheduler.schedule``
   with its ``OffloadingConnector``; ``pagesim/engine/policy/offload/manager.py``), requests holding blocks
   (``kv_holding``: parked while their KV loads, or loaded) are taken first; the GPU hit continues
   with blocks the store can load (fresh GPU blocks); a request parked or told "not yet" by the
   lookup is skipped, keeping its place, and the pass goes on behind it.

The per-step work is proportional to the requests scheduled, preempted or admitted, never to the
number waiting: the waiting pass stops at the first request that does not fit.
"""

from __future__ import annotations

from pagesim.engine.policy.scheduling.admission import admission_room, admission_watermark
from pagesim.engine.policy.scheduling.output import Pair
from pagesim.engine.policy.scheduling.request import Request
from pagesim.engine.policy.scheduling.steps.base import Step, StepOrder
from pagesim.engine.policy.scheduling.steps.offload_admission import schedule_waiting_with_offload


def _victim_key(request: Request) -> tuple[int, float]:
    """vLLM 0.33's priority victim order: the largest (priority, arrival_time) goes first."""
    return (request.priority, request.arrival_time_s)


class VllmV1StepOrder(StepOrder):
    name = "vllm-v1"

    def schedule(self, st: Step) -> None:
        self._schedule_running(st)
        if not st.preempted:
            self._schedule_swapped(st)
        if not st.preempted:
            self._schedule_waiting(st)

    def _num_batch_slots_used(self) -> int:
        if self.config.seq_limit_counts == "sequences":
            return sum(r.max_running_seqs for r in self.scheduler.running)
        return len(self.scheduler.running)

    def _batch_slots(self, request: Request) -> int:
        return request.max_running_seqs if self.config.seq_limit_counts == "sequences" else 1

    # ---------------------------------------------------------- running
    def _schedule_running(self, st: Step) -> None:
        s = self.scheduler
        running = s.running
        pool = s.pool
        kv = s.kv
        planner = s.planner
        priority = self.config.scheduling_policy == "priority"
        copies_of: dict[str, list[Pair]] = {}  # (priority: the copies on write each run made, to take back)
        i = 0
        while i < len(running) and st.token_budget > 0:
            request = running[i]
            live = request.live_seqs
            if len(live) > 1 or live[0].parked:  # NOTE: a lone unparked sequence has nothing to unpark
                planner.unpark(request)
            plan = planner.plan(request, st.token_budget)
            if not plan:  # nothing fits this step: the next request may still use the budget
                i += 1
                continue
            if kv.hybrid:  # vLLM's allocate_slots: blocks that left a window go before counting
                for seq, _ in plan:
                    kv.remove_skipped_blocks(seq)
            need = planner.blocks_needed(plan)
            preempted_itself = False
            while need and need > pool.num_free_blocks:  # (need 0 always fits: skip the count)
                if priority:
                    # vLLM 0.33 (vllm/v1/core/sched/scheduler.py, schedule(), policy PRIORITY): the
                    # victim is max(self.running, key=(priority, arrival_time)), Python's max: the
                    # first maximal one in running order, over ALL running requests; one already
                    # scheduled this step is un-scheduled, and the index steps back past it.
                    victim = max(running, key=_victim_key)
                    if running.index(victim) < i:
                        i -= 1
                        if victim.request_id in st.tokens_per_request:
                            self._unschedule(victim, st, copies_of.pop(victim.request_id, None))
                else:
                    victim = s.victim_policy.choose(running[i:])
                self.preempt_running(victim, st)
                if victim is request:
                    preempted_itself = True
                    break
            if preempted_itself:
                # (FCFS: the tail preempted itself, nothing follows. Priority: vLLM 0.33 goes on with the
                # requests after it, which are more important and may fit in the blocks it freed.)
                continue
            if priority:
                num_copies = len(st.copies)
                s.run(request, plan, st)
                if len(st.copies) != num_copies:
                    copies_of[request.request_id] = st.copies[num_copies:]
            else:
                s.run(request, plan, st)
            i += 1

    @staticmethod
    def _unschedule(victim: Request, st: Step, copies: list[Pair] | None) -> None:
        """Take back what ``Scheduler.run`` added to the step for ``victim`` (its tokens, its entries,
        its copies on write); its blocks, new ones included, go back when it is preempted. vLLM 0.33
        (vllm/v1/core/sched/scheduler.py, schedule()): ``scheduled_running_reqs.remove``, the budget
        restored, ``req_to_new_blocks.pop``; then ``_preempt_request`` frees every block it holds."""
        rid = victim.request_id
        st.token_budget += st.tokens_per_request.pop(rid)
        st.scheduled = [entry for entry in st.scheduled if entry.request_id != rid]
        if copies:
            dropped = {id(pair) for pair in copies}
            st.copies = [pair for pair in st.copies if id(pair) not in dropped]

    def preempt_running(self, victim: Request, st: Step) -> None:
        """Preempt a running request (the victim policy's choice) and take it off ``running`` to
        its queue, as the running pass does (``pagesim.engine.policy.fast_path.preempting_decode`` too)."""
        s = self.scheduler
        running = s.running
        mode = s.preempt(victim, st)
        if running[-1] is victim:
            running.pop()
        else:
            running.remove(victim)
        s.requeue(victim, mode)

    # ---------------------------------------------------------- swapped
    def _schedule_swapped(self, st: Step) -> None:
        cfg = self.config
        s = self.scheduler
        usable = s.pool.num_usable_blocks
        used = self._num_batch_slots_used()
        while s.swapped and st.token_budget > 0:
            request = s.swapped[0]
            if used + self._batch_slots(request) > cfg.max_num_seqs:
                st.swapped_stop = "seq_limit"
                break
            plan = s.planner.plan(request, st.token_budget)
            if not plan:
                st.swapped_stop = "no_plan"
                break
            need = s.planner.swap_in_need(request, plan)
            if need > usable:
                # Only possible when shared blocks come back once per sequence
                # (preserve_sharing_on_swap off); vLLM 0.6.3 fails such a request too.
                s.reject_queued(s.swapped.popleft(), f"swapping it back in needs {need} blocks; the pool has {usable}")
                continue
            # NOTE: with nothing running, the watermark cannot protect anyone, and a request that
            # grew into it could otherwise never come back (vLLM would wait forever here).
            watermark = cfg.watermark_blocks if s.running else 0
            if s.pool.num_free_blocks - need < watermark:
                st.swapped_stop = "blocks"
                break
            s.swapped.popleft()
            s.swap_in(request, st)
            s.planner.unpark(request)  # parked sequences join from the next step
            s.running.append(request)
            s.run(request, plan, st)
            used += self._batch_slots(request)
        if st.swapped_stop is None:
            st.swapped_stop = "budget" if s.swapped else "empty"

    # ---------------------------------------------------------- waiting
    def _schedule_waiting(self, st: Step) -> None:
        if self.scheduler.offload is not None or self.scheduler.pd is not None:  # (a KV connector's pass)
            schedule_waiting_with_offload(self, st)
            return
        cfg = self.config
        s = self.scheduler
        kv = s.kv
        pool = s.pool
        bs = cfg.block_size
        room = admission_room(cfg, pool.num_usable_blocks)
        used = self._num_batch_slots_used()
        while s.waiting and st.token_budget > 0:
            request = s.waiting[0]
            slots = self._batch_slots(request)
            if used + slots > cfg.max_num_seqs:
                st.waiting_stop = "seq_limit"
                break
            seqs = list(request.live_seqs)
            hits = [[] if seq.parked else kv.find_cached_prefix(seq) for seq in seqs]
            plan = s.planner.plan(request, st.token_budget, [len(h) * bs for h in hits])
            if not plan:  # without chunked prefill, the head waits for a step with room
                st.waiting_stop = "no_plan"
                break
            # Admission needs every sequence's whole known length to fit, less its hits (vLLM v1)
            # and, for parked sequences, less the prompt blocks they will share with the leader.
            new_blocks, evictable, num_hit_blocks = kv.admission_blocks(seqs, hits, plan, request.prompt_len)
            watermark = admission_watermark(cfg, anything_running=bool(s.running))
            if new_blocks + evictable + watermark > pool.num_free_blocks:
                if new_blocks + num_hit_blocks > room:  # not even into an empty pool
                    s.reject_queued(
                        s.waiting.popleft(),
                        f"after a recompute preemption its {len(seqs)} sequence(s) need "
                        f"{new_blocks + num_hit_blocks} blocks to resume; an admission gets at most {room}",
                    )
                    continue
                st.waiting_stop = "blocks"
                break
            s.waiting.popleft()
            if request.was_preempted:  # (back after a recompute preemption: what it lost to evictions)
                for seq, h in zip(seqs, hits):
                    if not seq.parked:  # (a parked sample shares its leader's prompt blocks again)
                        kv.count_resume_loss(seq, len(h))
            hit_tokens = 0
            for seq, h in zip(seqs, hits):
                if h:
                    kv.touch_prefix(seq, h)
                    hit_tokens += len(h) * bs
            s.planner.unpark(request)
            s.admit(request, hit_tokens, st)
            s.running.append(request)
            s.run(request, plan, st)
            used += slots
        if st.waiting_stop is None:
            st.waiting_stop = "budget" if s.waiting else "empty"
