"""README §4: vLLM 0.32 v1 (scheduler, block pool with prefix cache)."""

from __future__ import annotations

from collections import deque

from tests.oracle_reference.common import cdiv, sampled_token


class V1BlockPool:
    """README §4 "Block pool": free queue, reference counts, content keys and the prefix cache."""

    def __init__(self, num_blocks: int):
        # Block 0 is the null block: never handed out, never free.
        self.free: list[int] = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.key: list[tuple | None] = [None] * num_blocks
        # key -> blocks carrying it, in the order they got it; lookups return the earliest.
        self.cache: dict[tuple, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def take(self) -> int:
        """§4 *take*: pop the front; drop its key (the only eviction); count becomes 1."""
        block = self.free.pop(0)
        key = self.key[block]
        if key is not None:
            self.key[block] = None
            holders = self.cache[key]
            holders.remove(block)
            if not holders:
                del self.cache[key]
        self.ref[block] = 1
        return block

    def touch(self, block: int) -> None:
        """§4 *touch* (prefix hit): leave the free queue if unused; count + 1."""
        if self.ref[block] == 0:
            self.free.remove(block)
        self.ref[block] += 1

    def release(self, table: list[int]) -> None:
        """§4 *release*: walk last to first; keyed blocks reaching 0 go to the back (walk order),
        unkeyed ones go as a group, in walk order, to the front."""
        to_front: list[int] = []
        for block in reversed(table):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if self.key[block] is not None:
                    self.free.append(block)
                else:
                    to_front.append(block)
        self.free[:0] = to_front

    def lookup(self, key: tuple) -> int | None:
        holders = self.cache.get(key)
        return holders[0] if holders else None

    def give_key(self, block: int, key: tuple) -> None:
        """Part of §4 *register*. A block that already carries a key got it as a prefix hit of this
        very key (taken blocks have none), so it is left alone rather than listed twice."""
        if self.key[block] is not None:
            return
        self.key[block] = key
        self.cache.setdefault(key, []).append(block)


class _V1Request:
    """README §4 "Request state": tokens, num_computed, block table, status."""

    def __init__(self, spec: dict):
        self.id: str = spec["id"]
        self.tokens: list[int] = list(spec["prompt_token_ids"])
        self.max_tokens: int = spec["max_tokens"]
        self.num_outputs = 0
        self.num_computed = 0
        self.table: list[int] = []
        self.num_registered = 0  # this request's own count of registered blocks
        self.has_run = False  # False: never-run; True: running or preempted


class V1Scheduler:
    """README §4: the synchronous FCFS v1 scheduler with one full-attention KV group."""

    def __init__(self, config: dict):
        self.block_size: int = config["block_size"]
        self.num_blocks: int = config["num_blocks"]
        self.max_num_seqs: int = config["max_num_seqs"]
        self.max_batched: int = config["max_num_batched_tokens"]
        self.max_model_len: int = config["max_model_len"]
        self.caching: bool = bool(config.get("enable_prefix_caching", False))
        self.chunked: bool = bool(config.get("enable_chunked_prefill", False))
        # §1 / §4: floor(watermark * num_blocks), null block included. v1 default 0.0.
        self.watermark_blocks = int(config.get("watermark", 0.0) * self.num_blocks)
        self.pool = V1BlockPool(self.num_blocks)
        self.waiting: deque[_V1Request] = deque()
        self.running: list[_V1Request] = []
        self.requests: dict[str, _V1Request] = {}

    # -- §2 hooks ------------------------------------------------------------------------------

    def add_request(self, spec: dict) -> None:
        """§1 ``arrival_step``: added to the back of the waiting queue."""
        req = _V1Request(spec)
        self.requests[req.id] = req
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def idle_record(self, step: int) -> dict:
        """§2 item 2: empty fields, current free-block count."""
        return {
            "step": step, "scheduled": {}, "order": [], "new": {}, "resumed": [],
            "resumed_cached": {}, "preempted": [], "finished": [],
            "num_free_blocks": self.pool.num_free, "block_ids": {},
        }

    # -- §4 helpers ----------------------------------------------------------------------------

    def _key(self, req: _V1Request, index: int) -> tuple:
        """§4: the key of block ``index`` is the whole token sequence through the end of it."""
        return tuple(req.tokens[: (index + 1) * self.block_size])

    def _register(self, req: _V1Request, upto: int) -> None:
        """§4 *register* (prefix caching only): key every not-yet-registered block index ``i`` with
        ``(i+1)*block_size <= min(upto, len(tokens))``, in index order."""
        if not self.caching:
            return
        full = min(upto, len(req.tokens)) // self.block_size
        for i in range(req.num_registered, full):
            self.pool.give_key(req.table[i], self._key(req, i))
        req.num_registered = max(req.num_registered, full)

    def _preempt(self, victim: _V1Request) -> None:
        """§4 *Preempt*: release the table, forget computed tokens and registrations, go to the
        front of ``waiting``."""
        self.pool.release(victim.table)
        victim.table = []
        victim.num_computed = 0
        victim.num_registered = 0
        self.waiting.appendleft(victim)

    def _prefix_hit(self, req: _V1Request) -> list[int]:
        """§4 waiting pass item 1: look up blocks ``0 .. floor((len-1)/bs) - 1``; stop at the
        first miss."""
        hit: list[int] = []
        if not self.caching:
            return hit
        for j in range((len(req.tokens) - 1) // self.block_size):
            block = self.pool.lookup(self._key(req, j))
            if block is None:
                break
            hit.append(block)
        return hit

    # -- one step ------------------------------------------------------------------------------

    def step(self, step: int) -> dict:
        """§4 "One schedule()" followed by §4 "Outputs"."""
        bs = self.block_size
        budget = self.max_batched
        scheduled: dict[str, int] = {}
        order: list[str] = []
        new: dict[str, int] = {}
        resumed: list[str] = []
        resumed_cached: dict[str, int] = {}
        preempted: list[str] = []

        # Running pass.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(len(req.tokens) - req.num_computed, budget,
                    self.max_model_len - req.num_computed - 1)
            if n <= 0:
                i += 1
                continue
            need = cdiv(req.num_computed + n, bs) - len(req.table)
            preempted_itself = False
            while need > self.pool.num_free:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.id)
                if victim is req:
                    preempted_itself = True
                    break
            if preempted_itself:
                break
            for _ in range(max(need, 0)):
                req.table.append(self.pool.take())
            self._register(req, req.num_computed + n)
            scheduled[req.id] = n
            order.append(req.id)
            budget -= n
            i += 1

        # Waiting pass: skipped entirely if anything was preempted this step.
        if not preempted:
            while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                hit = self._prefix_hit(req)
                hit_tokens = len(hit) * bs
                n = len(req.tokens) - hit_tokens
                if not self.chunked and n > budget:
                    break
                n = min(n, budget)
                evictable = sum(1 for b in hit if self.pool.ref[b] == 0)
                wm = self.watermark_blocks if self.running else 0
                whole = cdiv(min(len(req.tokens), self.max_model_len), bs)
                if whole - len(hit) + evictable + wm > self.pool.num_free:
                    break  # the head blocks everyone behind it
                self.waiting.popleft()
                for b in hit:
                    self.pool.touch(b)
                fresh = cdiv(hit_tokens + n, bs) - len(hit)
                req.table = hit + [self.pool.take() for _ in range(fresh)]
                req.num_computed = hit_tokens
                self._register(req, hit_tokens + n)
                self.running.append(req)
                scheduled[req.id] = n
                order.append(req.id)
                budget -= n
                if req.has_run:
                    resumed.append(req.id)
                    resumed_cached[req.id] = hit_tokens
                else:
                    new[req.id] = hit_tokens
                req.has_run = True

        record = {
            "step": step, "scheduled": scheduled, "order": order, "new": new,
            "resumed": resumed, "resumed_cached": resumed_cached, "preempted": preempted,
            "num_free_blocks": self.pool.num_free,
            "block_ids": {rid: list(self.requests[rid].table) for rid in order},
        }

        # Outputs (§4 "Outputs", §2 items 4-5).
        for rid in order:
            self.requests[rid].num_computed += scheduled[rid]
        finished: list[str] = []
        for rid in order:
            req = self.requests[rid]
            if req.num_computed >= len(req.tokens):
                req.tokens.append(sampled_token(req.id, len(req.tokens)))
                req.num_outputs += 1
                if req.num_outputs >= req.max_tokens or len(req.tokens) >= self.max_model_len:
                    self.running.remove(req)
                    self.pool.release(req.table)
                    req.table = []
                    finished.append(rid)
        record["finished"] = sorted(finished)
        return record
