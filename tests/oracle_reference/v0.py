"""README §5: vLLM 0.6.3 v0 (scheduler, LIFO block stacks, budget, swapping, copy-on-write)."""

from __future__ import annotations

from collections import deque

from tests.oracle_reference.common import SwapSpaceExhausted, cdiv, sampled_token


class V0BlockStack:
    """README §5 "Blocks": a pool whose free blocks form a stack -- allocation pops the front, a
    block whose count drops to 0 is pushed on the front (LIFO)."""

    def __init__(self, num_blocks: int):
        self.free: list[int] = list(range(num_blocks))
        self.ref = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free)

    def take(self) -> int:
        block = self.free.pop(0)
        self.ref[block] = 1
        return block

    def drop(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free.insert(0, block)


class V0Budget:
    """README §5 "Budget": token and sequence budgets keyed by request id."""

    def __init__(self, max_tokens: int, max_seqs: int):
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.tokens: dict[str, int] = {}
        self.seqs: dict[str, int] = {}

    @property
    def used_tokens(self) -> int:
        return sum(self.tokens.values())

    def remaining_tokens(self) -> int:
        return self.max_tokens - self.used_tokens

    def can_schedule(self, t: int, s: int) -> bool:
        return (self.used_tokens + t <= self.max_tokens
                and sum(self.seqs.values()) + s <= self.max_seqs)

    def add(self, rid: str, t: int | None, s: int | None) -> None:
        """Adding the same request twice counts once."""
        if t is not None and rid not in self.tokens:
            self.tokens[rid] = t
        if s is not None and rid not in self.seqs:
            self.seqs[rid] = s

    def drop(self, rid: str) -> None:
        self.tokens.pop(rid, None)
        self.seqs.pop(rid, None)


class _V0Seq:
    """A v0 sequence: tokens, a block table (GPU or CPU ids), ``filled`` tokens written into it."""

    def __init__(self, index: int, tokens: list[int]):
        self.index = index  # 0 = the prompt's sequence, 1.. = forked children in fork order
        self.tokens = tokens
        self.table: list[int] = []
        self.filled = 0
        self.computed = 0
        self.decode = False  # "decode stage": computed all known tokens since last (re)start
        self.num_outputs = 0
        self.finished = False

    def fork(self, index: int) -> _V0Seq:
        child = _V0Seq(index, list(self.tokens))
        child.table = list(self.table)
        child.filled = self.filled
        child.computed = self.computed
        child.decode = self.decode
        child.num_outputs = self.num_outputs
        return child


class _V0Group:
    """A v0 request: a group of sequences (§5 "Blocks")."""

    def __init__(self, spec: dict):
        self.id: str = spec["id"]
        self.n: int = spec.get("n", 1)
        self.max_tokens: int = spec["max_tokens"]
        self.seqs = [_V0Seq(0, list(spec["prompt_token_ids"]))]
        self.has_run = False

    def live(self) -> list[_V0Seq]:
        """The group's unfinished ("running", or swapped / waiting) sequences, in index order."""
        return [s for s in self.seqs if not s.finished]

    def max_running(self) -> int:
        """§5 *max_running*."""
        return self.n if len(self.seqs) < self.n else len(self.live())

    def prefilling(self) -> bool:
        return not all(s.decode for s in self.live())


class V0Scheduler:
    """README §5: vLLM 0.6.3 ``Scheduler`` with the naive ``SelfAttnBlockSpaceManager``."""

    def __init__(self, config: dict):
        self.block_size: int = config["block_size"]
        self.num_blocks: int = config["num_blocks"]
        self.max_num_seqs: int = config["max_num_seqs"]
        self.max_batched: int = config["max_num_batched_tokens"]
        self.max_model_len: int = config["max_model_len"]
        self.chunked: bool = bool(config.get("enable_chunked_prefill", False))
        # §1: v0 default watermark is 0.01.
        self.watermark_blocks = int(config.get("watermark", 0.01) * self.num_blocks)
        self.preemption_mode: str | None = config.get("preemption_mode")
        self.gpu = V0BlockStack(self.num_blocks)
        self.cpu = V0BlockStack(config.get("num_cpu_blocks", 0))
        self.waiting: deque[_V0Group] = deque()
        self.running: list[_V0Group] = []
        self.swapped: deque[_V0Group] = deque()
        self.groups: dict[str, _V0Group] = {}

    # -- §2 hooks ------------------------------------------------------------------------------

    def add_request(self, spec: dict) -> None:
        group = _V0Group(spec)
        self.groups[group.id] = group
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def idle_record(self, step: int) -> dict:
        return {
            "step": step, "scheduled": {}, "order": [], "new": {}, "resumed": [],
            "preempted": [], "finished": [], "swapped_in": [], "preempted_mode": {},
            "ignored": [], "blocks_to_swap_out": [], "blocks_to_swap_in": [],
            "blocks_to_copy": [], "num_free_blocks": self.gpu.num_free,
            "num_free_cpu_blocks": self.cpu.num_free, "block_ids": {},
        }

    # -- §5 block operations -------------------------------------------------------------------

    def _allocate(self, seq: _V0Seq) -> None:
        """§5 *allocate*: blocks for the whole sequence (full blocks, then a partial tail)."""
        seq.table = [self.gpu.take() for _ in range(cdiv(len(seq.tokens), self.block_size))]
        seq.filled = len(seq.tokens)

    def _append(self, seq: _V0Seq, copies: list[list[int]]) -> None:
        """§5 *append*: new blocks first if needed, then write; copy-on-write shared entries."""
        bs = self.block_size
        u = len(seq.tokens) - seq.filled
        if u <= 0:
            return
        empty = len(seq.table) * bs - seq.filled
        if empty < u:
            for _ in range(cdiv(u - empty, bs)):
                seq.table.append(self.gpu.take())
        for entry in range(seq.filled // bs, (seq.filled + u - 1) // bs + 1):
            old = seq.table[entry]
            if self.gpu.ref[old] > 1:
                self.gpu.ref[old] -= 1
                fresh = self.gpu.take()
                copies.append([old, fresh])
                seq.table[entry] = fresh
        seq.filled += u

    def _free(self, seq: _V0Seq) -> None:
        """§5 *free*: entries in table order, pushed on the free stack at count 0."""
        for block in seq.table:
            self.gpu.drop(block)
        seq.table = []
        seq.filled = 0

    def _touched(self, seq: _V0Seq) -> int:
        """§5 *touched*: ``1 + ceil((u - f) / block_size)``."""
        bs = self.block_size
        u = len(seq.tokens) - seq.filled
        f = bs - (seq.filled % bs)
        return 1 + cdiv(u - f, bs)

    def _can_append(self, group: _V0Group) -> bool:
        """§5 *can_append*: no watermark."""
        return sum(self._touched(s) for s in group.live()) <= self.gpu.num_free

    def _swap_need(self, group: _V0Group) -> int:
        """§5 *swap_need*: touched blocks plus full entries, counted per sequence."""
        seqs = group.live()
        return (sum(self._touched(s) for s in seqs)
                + sum(s.filled // self.block_size for s in seqs))

    def _swap_out(self, group: _V0Group, pairs: list[list[int]]) -> None:
        """§5 *swap_out*: per sequence, release its GPU blocks then give each entry a CPU block.
        Sharing is not preserved."""
        if self._swap_need(group) > self.cpu.num_free:
            raise SwapSpaceExhausted(group.id)
        self._move(group, self.gpu, self.cpu, pairs)

    def _swap_in(self, group: _V0Group, pairs: list[list[int]]) -> None:
        """§5 *swap_in*: the mirror of *swap_out*."""
        self._move(group, self.cpu, self.gpu, pairs)

    @staticmethod
    def _move(group: _V0Group, src: V0BlockStack, dst: V0BlockStack, pairs: list[list[int]]) -> None:
        """Per sequence: release its ``src`` blocks (table order), then give each entry a ``dst``
        block (table order), one ``[src, dst]`` pair per entry."""
        for seq in group.live():
            for block in seq.table:
                src.drop(block)
            new_table = [dst.take() for _ in seq.table]
            pairs.extend([s, d] for s, d in zip(seq.table, new_table))
            seq.table = new_table

    def _new_tokens(self, seq: _V0Seq) -> int:
        """§5 *new_tokens*."""
        return 1 if seq.decode else len(seq.tokens) - seq.computed

    # -- one step ------------------------------------------------------------------------------

    def step(self, step: int) -> dict:
        s = _V0Step(self)
        if self.chunked:
            s.schedule_chunked()
        else:
            s.schedule_default()
        record = s.record(step)
        record["finished"] = self._process_outputs(s)
        return record

    def _process_outputs(self, s: _V0Step) -> list[str]:
        """§5 "Outputs" (and §2 items 4-5)."""
        finished_groups: list[_V0Group] = []
        for rid in s.order:
            group = self.groups[rid]
            count = s.scheduled[rid]
            was_prefill = rid in s.prefill_ids
            for seq in group.live():
                seq.computed += count
                if seq.computed >= len(seq.tokens):
                    seq.decode = True
            if group.prefilling():
                continue  # a group still prefilling samples nothing
            if was_prefill and group.n > 1:
                # AMBIGUITY: "prompt step with n > 1" is read literally (the parent is the
                # group's single live sequence; the random workloads never re-prefill a forked
                # group because "recompute" is only used with n = 1).
                (parent,) = group.live()
                children = []
                for k in range(group.n - 1):
                    child = parent.fork(len(group.seqs) + k)
                    self._sample(group, child)
                    children.append(child)
                self._sample(group, parent)
                for child in children:
                    group.seqs.append(child)
                    if child.finished:
                        child.table = []
                        child.filled = 0
                    else:
                        for block in child.table:
                            self.gpu.ref[block] += 1
                if parent.finished:
                    self._free(parent)
            else:
                for seq in group.live():
                    self._sample(group, seq)
                    if seq.finished:
                        self._free(seq)
            if not group.live():
                finished_groups.append(group)
        for group in finished_groups:
            self.running.remove(group)
        return sorted(g.id for g in finished_groups)

    def _sample(self, group: _V0Group, seq: _V0Seq) -> None:
        """Append the sampled token to ``seq`` (not yet to its block table) and check stop."""
        seq.tokens.append(sampled_token(group.id, len(seq.tokens)))
        seq.num_outputs += 1
        if seq.num_outputs == group.max_tokens or len(seq.tokens) > self.max_model_len:
            seq.finished = True


class _V0Step:
    """The working state of one v0 ``schedule()`` (README §5 "One schedule() ...")."""

    def __init__(self, sched: V0Scheduler):
        self.sched = sched
        self.budget = V0Budget(sched.max_batched, sched.max_num_seqs)
        self.scheduled: dict[str, int] = {}
        self.order: list[str] = []
        self.prefill_ids: set[str] = set()  # groups that were prefilling when scheduled
        self.new: dict[str, int] = {}
        self.resumed: list[str] = []
        self.preempted: list[str] = []
        self.preempted_mode: dict[str, str] = {}
        self.ignored: list[str] = []
        self.swapped_in_ids: set[str] = set()
        self.swap_out: list[list[int]] = []
        self.swap_in: list[list[int]] = []
        self.copies: list[list[int]] = []
        self.recompute_victims: list[_V0Group] = []
        self.swap_victims: list[_V0Group] = []

    # -- pieces shared by both schedules -------------------------------------------------------

    def preempt(self, victim: _V0Group) -> None:
        """§5 "Preemption of a group": null mode means recompute iff ``max_running == 1``."""
        sched = self.sched
        mode = sched.preemption_mode
        if mode is None:
            mode = "recompute" if victim.max_running() == 1 else "swap"
        if mode == "recompute":
            for seq in victim.live():
                sched._free(seq)
                seq.computed = 0
                seq.decode = False
            self.recompute_victims.append(victim)
        else:
            sched._swap_out(victim, self.swap_out)
            self.swap_victims.append(victim)
        self.preempted.append(victim.id)
        self.preempted_mode[victim.id] = mode

    def run_running(self, queue: deque[_V0Group], chunked: bool):
        """Take running groups from the front; preempt the last one (or the group itself) while
        *can_append* fails. Returns (decodes, prefill chunks) as lists of (group, tokens)."""
        sched = self.sched
        decodes: list[tuple[_V0Group, int]] = []
        chunks: list[tuple[_V0Group, int]] = []
        while queue:
            group = queue[0]
            live = group.live()
            t = sum(sched._new_tokens(s) for s in live)
            if chunked and len(live) == 1:
                t = min(t, self.budget.remaining_tokens())
            if t == 0:
                break  # it and the rest stay for later
            queue.popleft()
            fits = True
            while not sched._can_append(group):
                self.budget.drop(group.id)
                victim = queue.pop() if queue else group
                self.preempt(victim)
                if victim is group:
                    fits = False
                    break
            if not fits:
                continue
            prefilling = group.prefilling()
            for seq in live:
                sched._append(seq, self.copies)
            # AMBIGUITY: §5 says to add decodes to the budget only in the chunked schedule; the
            # default schedule already counted the sequences, and its tokens are added here too
            # (they are never limited, and only later swap-ins read them).
            self.budget.add(group.id, t, group.max_running())
            if prefilling:
                chunks.append((group, t))
            else:
                decodes.append((group, t))
        return decodes, chunks

    def run_swapped(self):
        """§5 swap-ins: stop at the first group that fails the swap-in check or the budget."""
        sched = self.sched
        decodes: list[tuple[_V0Group, int]] = []
        prefills: list[tuple[_V0Group, int]] = []
        while sched.swapped:
            group = sched.swapped[0]
            if sched.gpu.num_free - sched._swap_need(group) < sched.watermark_blocks:
                break
            t = sum(sched._new_tokens(s) for s in group.live())  # never chunked
            if t == 0 or not self.budget.can_schedule(t, group.max_running()):
                break
            sched.swapped.popleft()
            sched._swap_in(group, self.swap_in)
            prefilling = group.prefilling()
            for seq in group.live():
                sched._append(seq, self.copies)
            self.budget.add(group.id, t, group.max_running())
            self.swapped_in_ids.add(group.id)
            (prefills if prefilling else decodes).append((group, t))
        return decodes, prefills

    def run_waiting(self, chunked: bool) -> list[tuple[_V0Group, int]]:
        """§5 prefills: the head of ``waiting`` is ignored / waits / is admitted."""
        sched = self.sched
        admitted: list[tuple[_V0Group, int]] = []
        while sched.waiting:
            group = sched.waiting[0]
            live = group.live()
            seq = live[0]
            t = sum(len(s.tokens) - s.computed for s in live)
            if chunked:
                if len(live) == 1:
                    t = min(t, self.budget.remaining_tokens())
                limit = sched.max_model_len
            else:
                limit = min(sched.max_model_len, sched.max_batched)
            need = cdiv(len(seq.tokens), sched.block_size)
            if t > limit or sched.num_blocks - need < sched.watermark_blocks:
                sched.waiting.popleft()
                self.ignored.append(group.id)
                for s in live:
                    s.finished = True
                continue
            if sched.gpu.num_free - need < sched.watermark_blocks:
                break
            if t == 0 or not self.budget.can_schedule(t, group.max_running()):
                break
            sched.waiting.popleft()
            for s in live:
                sched._allocate(s)
            self.budget.add(group.id, t, group.max_running())
            if group.has_run:
                self.resumed.append(group.id)
            else:
                self.new[group.id] = 0
            group.has_run = True
            admitted.append((group, t))
        return admitted

    def _schedule(self, entries: list[tuple[_V0Group, int]], log_tokens: bool) -> None:
        for group, t in entries:
            self.order.append(group.id)
            self.scheduled[group.id] = t if log_tokens else 1
            if log_tokens:
                self.prefill_ids.add(group.id)

    def _finish_queues(self) -> None:
        """Recompute victims to the front of ``waiting`` (the last preempted first); swap victims
        to the back of ``swapped``.

        AMBIGUITY: §5 states this "Afterwards" for the default schedule only; it is applied after
        the chunked schedule too, so a victim is not re-admitted by the same step's prefills."""
        for victim in self.recompute_victims:
            self.sched.waiting.appendleft(victim)
        self.sched.swapped.extend(self.swap_victims)

    # -- the two schedules ---------------------------------------------------------------------

    def schedule_default(self) -> None:
        """§5 "One schedule() without chunked prefill"."""
        sched = self.sched
        for group in sched.running:
            self.budget.add(group.id, None, group.max_running())
        prefills: list[tuple[_V0Group, int]] = []
        decodes: list[tuple[_V0Group, int]] = []
        swap_decodes: list[tuple[_V0Group, int]] = []
        if not sched.swapped:
            prefills = self.run_waiting(chunked=False)
        queue = deque(sched.running)
        if not prefills:
            decodes, chunks = self.run_running(queue, chunked=False)
            assert not chunks
            if not self.preempted:
                swap_decodes, swap_prefills = self.run_swapped()
                assert not swap_prefills
        sched.running = (list(queue) + [g for g, _ in prefills] + [g for g, _ in decodes]
                         + [g for g, _ in swap_decodes])
        self._schedule(prefills, log_tokens=True)
        self._schedule(decodes, log_tokens=False)
        self._schedule(swap_decodes, log_tokens=False)
        self._finish_queues()

    def schedule_chunked(self) -> None:
        """§5 "One schedule() with chunked prefill"."""
        sched = self.sched
        queue = deque(sched.running)
        decodes, chunks = self.run_running(queue, chunked=True)
        swap_decodes: list[tuple[_V0Group, int]] = []
        swap_prefills: list[tuple[_V0Group, int]] = []
        if not self.preempted:
            swap_decodes, swap_prefills = self.run_swapped()
        prefills = self.run_waiting(chunked=True)
        sched.running = (list(queue) + [g for g, _ in swap_decodes]
                         + [g for g, _ in swap_prefills] + [g for g, _ in decodes]
                         + [g for g, _ in chunks] + [g for g, _ in prefills])
        self._schedule(prefills, log_tokens=True)
        self._schedule(chunks, log_tokens=True)
        self._schedule(swap_prefills, log_tokens=True)
        self._schedule(decodes, log_tokens=False)
        self._schedule(swap_decodes, log_tokens=False)
        self._finish_queues()

    def record(self, step: int) -> dict:
        groups = self.sched.groups
        return {
            "step": step, "scheduled": self.scheduled, "order": self.order, "new": self.new,
            "resumed": self.resumed, "preempted": self.preempted, "finished": [],
            # AMBIGUITY: "swapped back in this step (scheduled order)" read as their order in
            # ``order`` (swapped-in prefills precede running decodes there).
            "swapped_in": [rid for rid in self.order if rid in self.swapped_in_ids],
            "preempted_mode": self.preempted_mode, "ignored": self.ignored,
            "blocks_to_swap_out": self.swap_out, "blocks_to_swap_in": self.swap_in,
            "blocks_to_copy": self.copies,
            "num_free_blocks": self.sched.gpu.num_free,
            "num_free_cpu_blocks": self.sched.cpu.num_free,
            "block_ids": {
                rid: {str(s.index): list(s.table) for s in groups[rid].live()}
                for rid in self.order
            },
        }
