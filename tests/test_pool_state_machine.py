"""The GPU block pool, the CPU swap pool and the KV-cache manager against a trusted simple model.

A Hypothesis ``RuleBasedStateMachine`` drives the real objects (``BlockPool`` with one eviction
policy, ``SwapPool``, ``KVCacheManager`` with prefix caching on, ``Sequence``s of ``Request``s) and
a slow, obvious model side by side, once per policy in ``EVICTION_POLICIES``. The model predicts
every block an operation takes (plain free list first, then the cached block the policy's
*definition* names, computed here from scratch) and keeps its own block tables, reference counts,
keys and the *content* of every physical block, so the invariants can check that:

- every block is in exactly one of free / in use / cached, with the pool's counts;
- a reference count is the number of tables holding the block;
- only full blocks are keyed, and a key names exactly the tokens its block holds;
- writes land only in unshared, unkeyed blocks (copy-on-write copies first), so every sequence
  reads back exactly its own tokens from its table, on the GPU and on the CPU;
- a prefix hit is the longest cached prefix, verified against contents, never covering the last
  token;
- allocations evict in the policy's order.

The model's tokens are prefixes: the content of a block is the tuple of all tokens from position 0
through its last written slot, because a KV entry depends on every token before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import pytest
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagesim.engine.policy.memory.block_key import BlockKey, chain_keys, default_hash
from pagesim.engine.policy.memory.block_pool import BlockPool
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.memory.kv_manager import KVCacheManager, cdiv
from pagesim.engine.policy.scheduling.request import Request, Sequence
from pagesim.engine.policy.memory.swap_pool import SwapPool
from tests.conftest import scaled_examples

VOCAB = 4  # token ids 0..3: prefix hits and duplicate contents are common
MAX_PROMPT_TOKENS = 10
MAX_HISTORY = 24  # token lists new prompts may extend


def tokens_of(seq: Sequence) -> tuple[int, ...]:
    return tuple(seq.request.prompt_token_ids) + tuple(seq.output_token_ids)


def key_tokens(key: BlockKey) -> tuple:
    """The whole token prefix a real key stands for (its chain's contents, root first)."""
    parts = []
    node: BlockKey | None = key
    while node is not None:
        parts.append(node.content)
        node = node.parent
    return tuple(t for content in reversed(parts) for t in content)


class GpuModel:
    """What the pool should hold, computed the slow, obvious way.

    ``key[b]`` is the token prefix a keyed block stands for; ``content[b]`` the tokens its KV was
    computed from (``None``: garbage, just allocated). Release and cache clocks are the model's own.
    """

    def __init__(self, policy: str, num_blocks: int, first_block_id: int, block_size: int):
        self.policy = policy
        self.block_size = block_size
        self.ids = range(first_block_id, num_blocks)
        self.plain_free: deque[int] = deque(self.ids)  # front is taken first
        self.refs = [0] * num_blocks
        self.key: list[tuple | None] = [None] * num_blocks
        self.content: list[tuple | None] = [None] * num_blocks
        self.evictable: set[int] = set()
        self.released_at = [0] * num_blocks
        self.cached_at = [0] * num_blocks
        self.hits = [0] * num_blocks
        self._release_clock = 0
        self._cache_clock = 0

    # ------------------------------------------------------------- eviction order
    def has_cached_child(self, b: int) -> bool:
        k = self.key[b]
        n = len(k) + self.block_size
        return any(c is not None and len(c) == n and c[: len(k)] == k for c in self.key)

    def rank(self, b: int) -> tuple:
        """Smaller goes first, straight from each policy's definition."""
        if self.policy == "lru":  # least recently released
            return (self.released_at[b],)
        if self.policy == "fifo":  # earliest cached
            return (self.cached_at[b],)
        if self.policy == "lfu":  # fewest hits, then least recently released
            return (self.hits[b], self.released_at[b])
        if self.policy == "radix-leaf":  # leaves by release; inner blocks only as a fallback
            return (self.has_cached_child(b), self.released_at[b])
        raise AssertionError(f"no model for eviction policy {self.policy!r}")

    def takes_in_order(self) -> list[int]:
        """Every block allocations would take, in order, if they took them all: evicting a block
        drops its key, which can make its parent a leaf (radix-leaf)."""
        saved_key, saved_evictable = list(self.key), set(self.evictable)
        order = list(self.plain_free)
        while self.evictable:
            b = min(self.evictable, key=self.rank)
            order.append(b)
            self.evictable.remove(b)
            self.key[b] = None
        self.key, self.evictable = saved_key, saved_evictable
        return order

    def next_taken(self) -> int | None:
        if self.plain_free:
            return self.plain_free[0]
        if self.evictable:
            return min(self.evictable, key=self.rank)
        return None

    # -------------------------------------------------------------- operations
    def take(self) -> tuple[int, bool]:
        """The block the next allocation must return, and whether it evicts a cached one."""
        b = self.next_taken()
        assert b is not None, "model: nothing to take"
        evicted = not self.plain_free
        if evicted:
            self.evictable.remove(b)
            self.key[b] = None
        else:
            self.plain_free.popleft()
        self.refs[b] = 1
        self.content[b] = None
        return b, evicted

    def release_table(self, table: list[int]) -> None:
        """Last block first; unkeyed blocks reaching 0 go to the front as a group, in walk order."""
        unkeyed = []
        for b in reversed(table):
            self.refs[b] -= 1
            assert self.refs[b] >= 0
            if self.refs[b] == 0:
                self._release_clock += 1
                self.released_at[b] = self._release_clock
                if self.key[b] is None:
                    unkeyed.append(b)
                else:
                    self.evictable.add(b)
        self.plain_free = deque(unkeyed + list(self.plain_free))

    def touch(self, b: int) -> None:
        assert self.key[b] is not None
        if self.refs[b] == 0:
            self.evictable.remove(b)
        self.refs[b] += 1
        self.hits[b] += 1

    def cache(self, b: int, key: tuple) -> None:
        assert self.key[b] is None
        assert self.content[b] == key, f"block {b} keyed as {key} but holds {self.content[b]}"
        self.key[b] = key
        self._cache_clock += 1
        self.cached_at[b] = self._cache_clock
        self.hits[b] = 0

    def lookup(self, key: tuple) -> int | None:
        holders = [b for b in self.ids if self.key[b] == key]
        return min(holders, key=lambda b: self.cached_at[b]) if holders else None

    def expected_hits(self, tokens: tuple) -> list[int]:
        hits = []
        for j in range((len(tokens) - 1) // self.block_size):
            b = self.lookup(tokens[: (j + 1) * self.block_size])
            if b is None:
                break
            hits.append(b)
        return hits

    def register(self, tokens: tuple, table: list[int], num_tokens: int) -> None:
        """Key every full, unkeyed block within the first ``num_tokens`` tokens, in table order."""
        bs = self.block_size
        for i in range(min(num_tokens, len(tokens)) // bs):
            if self.key[table[i]] is None:
                key = tokens[: (i + 1) * bs]
                if self.lookup(key) is not None:
                    event("two blocks carry one key")
                self.cache(table[i], key)


class CpuModel:
    def __init__(self, num_blocks: int):
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.content: list[tuple | None] = [None] * num_blocks

    def take(self) -> int:
        b = self.free.popleft()
        self.refs[b] = 1
        return b

    def release_table(self, table: list[int]) -> None:
        for b in table:
            self.refs[b] -= 1
            assert self.refs[b] >= 0
            if self.refs[b] == 0:
                self.free.appendleft(b)


def count_holders(tables: Iterable[list[int]], num_blocks: int) -> list[int]:
    counts = [0] * num_blocks
    for table in tables:
        for b in table:
            counts[b] += 1
    return counts


class PoolMachine(RuleBasedStateMachine):
    policy = "lru"  # subclasses below set one per eviction policy

    @initialize(
        block_size=st.integers(2, 3),
        num_blocks=st.integers(6, 12),
        num_cpu_blocks=st.integers(0, 12),
        reserve_null_block=st.booleans(),
        colliding_hashes=st.booleans(),
    )
    def setup(self, block_size, num_blocks, num_cpu_blocks, reserve_null_block, colliding_hashes):
        note(
            f"{self.policy}: block_size {block_size}, {num_blocks} GPU blocks (null block "
            f"{reserve_null_block}), {num_cpu_blocks} CPU blocks, every key hashing to 0: {colliding_hashes}"
        )
        self.bs = block_size
        self.pool = BlockPool(num_blocks, eviction_policy=self.policy, reserve_null_block=reserve_null_block)
        self.swap = SwapPool(num_cpu_blocks)
        self.kv = KVCacheManager(
            self.pool,
            self.swap,
            block_size=block_size,
            enable_prefix_caching=True,
            hash_fn=(lambda parent, content: 0) if colliding_hashes else default_hash,
        )
        self.gpu = GpuModel(self.policy, num_blocks, self.pool.first_block_id, block_size)
        self.cpu = CpuModel(num_cpu_blocks)
        self.requests: list[Request] = []
        self.on_gpu: list[Sequence] = []  # live sequences whose table is on the GPU
        self.swapped: list[Sequence] = []  # live sequences whose table is on the CPU
        self.tables: dict[Sequence, list[int]] = {}  # the model's GPU tables
        self.cpu_tables: dict[Sequence, list[int]] = {}
        self.history: list[tuple[int, ...]] = []
        self.num_requests = 0

    # ------------------------------------------------------------------ helpers
    def allocate_as_predicted(self, n: int) -> list[int]:
        """The next ``n`` blocks the model says an allocation takes (updating the model)."""
        taken = []
        for _ in range(n):
            inner = self.policy == "radix-leaf" and not self.gpu.plain_free and all(
                self.gpu.has_cached_child(c) for c in self.gpu.evictable
            )
            b, evicted = self.gpu.take()
            if evicted:
                event("eviction")
                if inner:
                    event("radix-leaf fallback: an inner block evicted")
            taken.append(b)
        return taken

    def place(self, b: int, tokens: tuple, index: int) -> None:
        """A fresh block becomes block ``index`` of a table: its KV is computed against what precedes it."""
        self.gpu.content[b] = tokens[: index * self.bs]

    def write(self, seq: Sequence, pos: int) -> None:
        """The executor writes token ``pos``'s KV: only ever into an unshared, unkeyed block whose
        content is exactly this sequence's tokens before ``pos``."""
        tokens = tokens_of(seq)
        b = seq.block_table[pos // self.bs]
        assert self.pool.ref_counts[b] == 1 and self.gpu.refs[b] == 1, (
            f"{seq.seq_id} writes token {pos} into block {b} shared by {self.pool.ref_counts[b]} tables"
        )
        assert self.pool.keys[b] is None, f"{seq.seq_id} writes token {pos} into keyed block {b}"
        assert self.gpu.content[b] == tokens[:pos], (
            f"{seq.seq_id} writes token {pos} into block {b} holding {self.gpu.content[b]}"
        )
        self.gpu.content[b] = tokens[: pos + 1]

    def remember(self, tokens: tuple) -> None:
        self.history.append(tokens)
        del self.history[:-MAX_HISTORY]

    def request_of_gpu_seqs(self) -> list[Request]:
        return [r for r in self.requests if any(s in self.tables for s in r.seqs)]

    # -------------------------------------------------------------------- rules
    @rule(data=st.data())
    def new_sequence(self, data):
        prefix: tuple = ()
        if self.history and data.draw(st.booleans(), label="extends an earlier token list"):
            base = data.draw(st.sampled_from(self.history), label="base")
            prefix = base[: data.draw(st.integers(0, len(base)), label="prefix length")]
        suffix = data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=6), label="suffix")
        prompt = (prefix + tuple(suffix))[:MAX_PROMPT_TOKENS] or (0,)
        self.num_requests += 1
        request = Request(f"r{self.num_requests}", len(prompt), 1000, prompt_token_ids=list(prompt))
        seq = request.seqs[0]
        bs, n = self.bs, len(prompt)

        hits = self.kv.find_cached_prefix(seq)
        expected = self.gpu.expected_hits(prompt)
        note(f"new {seq.seq_id} prompt {list(prompt)}: hits {hits} (model {expected})")
        assert hits == expected, f"prefix hit {hits}, model expects {expected}"
        assert len(hits) * bs <= n - 1, "a prefix hit covers the last prompt token"
        for j, b in enumerate(hits):
            assert self.gpu.content[b] == prompt[: (j + 1) * bs], (
                f"false hit: block {b} holds {self.gpu.content[b]}, prompt wants {prompt[: (j + 1) * bs]}"
            )
        if hits:
            event("prefix hit")
        need = cdiv(n, bs) - len(hits) + sum(1 for b in hits if self.gpu.refs[b] == 0)
        if need > self.pool.num_free_blocks:
            event("admission refused")
            note(f"  {seq.seq_id} does not fit: needs {need}, {self.pool.num_free_blocks} free")
            return

        self.kv.touch_prefix(seq, hits)
        for b in hits:
            self.gpu.touch(b)
        table = list(hits)
        assert seq.num_computed_tokens == seq.num_filled_tokens == len(hits) * bs
        num_new = cdiv(n, bs) - len(hits)
        assert self.kv.blocks_to_reserve(seq, seq.num_filled_tokens, n) == num_new
        assert num_new <= self.pool.num_free_blocks
        for index, b in enumerate(self.allocate_as_predicted(num_new), start=len(table)):
            self.place(b, prompt, index)
            table.append(b)
        copies = self.kv.reserve(seq, seq.num_filled_tokens, n)
        assert copies == [], f"a prompt reservation after a prefix hit copied {copies}"
        assert seq.block_table == table, f"table {seq.block_table}, model {table}"
        for pos in range(len(hits) * bs, n):
            self.write(seq, pos)
        seq.num_computed_tokens = n
        self.kv.register(seq, n)
        self.gpu.register(prompt, table, n)
        note(f"  {seq.seq_id} table {table}")

        self.requests.append(request)
        self.on_gpu.append(seq)
        self.tables[seq] = table
        self.remember(prompt)

    @precondition(lambda self: self.on_gpu)
    @rule(data=st.data(), token=st.integers(0, VOCAB - 1))
    def append_token(self, data, token):
        seq = data.draw(st.sampled_from(self.on_gpu), label="sequence")
        table = self.tables[seq]
        bs = self.bs
        pos = seq.num_tokens
        assert seq.num_filled_tokens == pos
        new_block = pos % bs == 0
        cow = not new_block and self.gpu.refs[table[-1]] > 1
        need = int(new_block or cow)
        seq.output_token_ids.append(token)
        assert self.kv.blocks_to_reserve(seq, pos, pos + 1) == need
        if need > self.pool.num_free_blocks:
            seq.output_token_ids.pop()
            note(f"{seq.seq_id} cannot append: needs {need} block, none free")
            return
        tokens = tokens_of(seq)
        expected_copies = []
        if new_block:
            (b,) = self.allocate_as_predicted(1)
            self.place(b, tokens, len(table))
            table.append(b)
        elif cow:
            src = table[-1]
            src_content = self.gpu.content[src]
            (dst,) = self.allocate_as_predicted(1)
            self.gpu.content[dst] = src_content
            self.gpu.refs[src] -= 1
            table[-1] = dst
            expected_copies.append((src, dst))
            event("copy-on-write")
        copies = self.kv.reserve(seq, seq.num_filled_tokens, seq.num_tokens)
        note(f"{seq.seq_id} appends {token} at {pos}: copies {copies}, table {seq.block_table}")
        assert copies == expected_copies, f"copy-on-write {copies}, model {expected_copies}"
        assert seq.block_table == table, f"table {seq.block_table}, model {table}"
        for src, dst in copies:
            assert self.pool.ref_counts[dst] == 1 and self.pool.ref_counts[src] >= 1
            assert self.gpu.content[src] == src_content, "copy-on-write changed the shared block"
            assert self.gpu.content[dst] == src_content
        self.write(seq, pos)
        seq.num_computed_tokens = seq.num_tokens
        self.kv.register(seq, seq.num_tokens)
        self.gpu.register(tokens, table, seq.num_tokens)

    @precondition(lambda self: self.on_gpu)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.on_gpu), label="parent")
        request = parent.request
        child = parent.fork(len(request.seqs))
        request.seqs.append(child)
        self.kv.fork(parent, child)
        note(f"fork {parent.seq_id} -> {child.seq_id} sharing {parent.block_table}")
        table = list(self.tables[parent])
        for b in table:
            self.gpu.refs[b] += 1
        assert child.block_table == table
        assert child.num_filled_tokens == parent.num_filled_tokens
        assert child.num_computed_tokens == parent.num_computed_tokens
        self.tables[child] = table
        self.on_gpu.append(child)

    @precondition(lambda self: self.on_gpu or self.swapped)
    @rule(data=st.data())
    def free_sequence(self, data):
        seq = data.draw(st.sampled_from(self.on_gpu + self.swapped), label="sequence")
        self.remember(tokens_of(seq))
        if seq in self.tables:
            note(f"free {seq.seq_id} (GPU {seq.block_table})")
            self.kv.free(seq)
            self.gpu.release_table(self.tables.pop(seq))
            self.on_gpu.remove(seq)
        else:
            note(f"free {seq.seq_id} (CPU {seq.cpu_block_table})")
            self.kv.free_cpu(seq)
            self.cpu.release_table(self.cpu_tables.pop(seq))
            self.swapped.remove(seq)
        assert not seq.block_table and not seq.cpu_block_table
        seq.finished = True

    @precondition(lambda self: self.on_gpu)
    @rule(data=st.data(), preserve_sharing=st.booleans())
    def swap_out(self, data, preserve_sharing):
        request = data.draw(st.sampled_from(self.request_of_gpu_seqs()), label="request")
        candidates = [s for s in request.seqs if s in self.tables]
        seqs = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True), label="seqs")
        tables = [self.tables[s] for s in seqs]
        need = len({b for t in tables for b in t}) if preserve_sharing else sum(map(len, tables))
        assert self.kv.blocks_to_swap_out(seqs, preserve_sharing=preserve_sharing) == need
        if need > self.swap.num_free_blocks:
            note(f"swap out {[s.seq_id for s in seqs]}: needs {need} CPU blocks, "
                 f"{self.swap.num_free_blocks} free")
            return
        expected: list[tuple[int, int]] = []
        moved: dict[int, int] = {}
        filled = {s: s.num_filled_tokens for s in seqs}
        for seq, table in zip(seqs, tables, strict=True):
            cpu_table = []
            for b in table:
                if preserve_sharing and b in moved:
                    c = moved[b]
                    self.cpu.refs[c] += 1
                else:
                    c = self.cpu.take()
                    self.cpu.content[c] = self.gpu.content[b]
                    moved[b] = c
                    expected.append((b, c))
                cpu_table.append(c)
            self.gpu.release_table(table)
            self.cpu_tables[seq] = cpu_table
        mapping = self.kv.swap_out(seqs, preserve_sharing=preserve_sharing)
        shared = len(moved) < sum(map(len, tables))
        event(f"swap out (sharing {preserve_sharing}, {'shared' if shared else 'unshared'} blocks)")
        note(f"swap out {[s.seq_id for s in seqs]} (sharing {preserve_sharing}): {mapping}")
        assert mapping == expected, f"swap-out copies {mapping}, model {expected}"
        for seq in seqs:
            assert seq.block_table == [] and seq.cpu_block_table == self.cpu_tables[seq]
            assert seq.num_filled_tokens == filled[seq]
            del self.tables[seq]
            self.on_gpu.remove(seq)
            self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data(), preserve_sharing=st.booleans())
    def swap_in(self, data, preserve_sharing):
        request = data.draw(st.sampled_from([s.request for s in self.swapped]), label="request")
        seqs = [s for s in request.seqs if s in self.cpu_tables]
        cpu_tables = [self.cpu_tables[s] for s in seqs]
        need = len({c for t in cpu_tables for c in t}) if preserve_sharing else sum(map(len, cpu_tables))
        assert self.kv.blocks_to_swap_in(seqs, preserve_sharing=preserve_sharing) == need
        if need > self.pool.num_free_blocks:
            note(f"swap in {[s.seq_id for s in seqs]}: needs {need} blocks, {self.pool.num_free_blocks} free")
            return
        expected: list[tuple[int, int]] = []
        moved: dict[int, int] = {}
        for seq, cpu_table in zip(seqs, cpu_tables, strict=True):
            table = []
            for c in cpu_table:
                if preserve_sharing and c in moved:
                    b = moved[c]
                    self.gpu.refs[b] += 1
                else:
                    (b,) = self.allocate_as_predicted(1)
                    self.gpu.content[b] = self.cpu.content[c]
                    moved[c] = b
                    expected.append((c, b))
                table.append(b)
            self.cpu.release_table(cpu_table)
            self.gpu.register(tokens_of(seq), table, seq.num_computed_tokens)
            self.tables[seq] = table
        mapping = self.kv.swap_in(seqs, preserve_sharing=preserve_sharing)
        event(f"swap in (sharing {preserve_sharing})")
        note(f"swap in {[s.seq_id for s in seqs]} (sharing {preserve_sharing}): {mapping}")
        assert mapping == expected, f"swap-in copies {mapping}, model {expected}"
        for seq in seqs:
            assert seq.cpu_block_table == [] and seq.block_table == self.tables[seq]
            del self.cpu_tables[seq]
            self.swapped.remove(seq)
            self.on_gpu.append(seq)

    @rule(extra_evictions=st.integers(1, 3))
    def allocate_until_eviction(self, extra_evictions):
        """Take raw blocks through the plain free list and ``extra_evictions`` cached ones, each
        the one the model names, then give them back."""
        n = min(len(self.gpu.plain_free) + extra_evictions, self.pool.num_free_blocks)
        taken = []
        for _ in range(n):
            cached_before = self.pool.num_cached_free_blocks
            (expected,) = self.allocate_as_predicted(1)
            b = self.pool.allocate()
            taken.append(b)
            assert b == expected, (
                f"allocation took block {b}, model expects {expected} (cached: {cached_before} before)"
            )
        note(f"raw allocation took {taken}; released again")
        if taken:
            self.pool.free_table(taken)
            self.gpu.release_table(taken)

    # --------------------------------------------------------------- invariants
    @invariant()
    def states_partition_the_pool(self):
        gpu, pool = self.gpu, self.pool
        in_use = {b for b in gpu.ids if gpu.refs[b] > 0}
        cached = set(gpu.evictable)
        free = set(gpu.plain_free)
        assert len(free) == len(gpu.plain_free)
        assert not (in_use & cached or in_use & free or cached & free)
        assert len(free) + len(in_use) + len(cached) == pool.num_usable_blocks
        assert pool.num_used_blocks == len(in_use)
        assert pool.num_cached_free_blocks == len(cached)
        assert pool.num_free_blocks == len(free) + len(cached)
        for b in pool.free_block_order():
            assert pool.ref_counts[b] == 0, f"block {b} is free but referenced"

    @invariant()
    def objects_check_themselves(self):
        self.pool.check()
        self.kv.check(self.requests)

    @invariant()
    def tables_and_reference_counts_match_the_model(self):
        for seq, table in self.tables.items():
            assert seq.block_table == table, f"{seq.seq_id}: table {seq.block_table}, model {table}"
            assert not seq.cpu_block_table
        for seq, cpu_table in self.cpu_tables.items():
            assert seq.cpu_block_table == cpu_table and not seq.block_table
        holders = count_holders(self.tables.values(), self.pool.num_blocks)
        assert self.gpu.refs == holders
        assert self.pool.ref_counts[self.pool.first_block_id :] == holders[self.pool.first_block_id :]
        cpu_holders = count_holders(self.cpu_tables.values(), self.swap.num_blocks)
        assert self.swap.ref_counts == cpu_holders == self.cpu.refs

    @invariant()
    def only_full_blocks_are_keyed_and_keys_name_contents(self):
        bs = self.bs
        for b in self.gpu.ids:
            key = self.pool.keys[b]
            assert (key is None) == (self.gpu.key[b] is None), (
                f"block {b}: key {key}, model {self.gpu.key[b]}"
            )
            if key is not None:
                assert key_tokens(key) == self.gpu.key[b] == self.gpu.content[b]
                assert len(self.gpu.key[b]) % bs == 0
        for seq, table in self.tables.items():
            for i, b in enumerate(table):
                if self.pool.keys[b] is not None:
                    assert (i + 1) * bs <= seq.num_filled_tokens, f"{seq.seq_id}: partial block {b} keyed"

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        bs = self.bs
        for tables, content in ((self.tables, self.gpu.content), (self.cpu_tables, self.cpu.content)):
            for seq, table in tables.items():
                tokens = tokens_of(seq)
                assert seq.num_computed_tokens == seq.num_filled_tokens == len(tokens)
                for i, b in enumerate(table):
                    want = tokens[: min((i + 1) * bs, len(tokens))]
                    assert content[b] == want, (
                        f"{seq.seq_id} block {i} = {b} holds {content[b]}, wants {want}"
                    )

    @invariant()
    def waste_is_under_one_block_per_sequence(self):
        for seq, table in list(self.tables.items()) + list(self.cpu_tables.items()):
            assert len(table) == cdiv(seq.num_filled_tokens, self.bs)
            assert 0 <= len(table) * self.bs - seq.num_filled_tokens <= self.bs - 1

    @invariant()
    def free_order_is_the_models(self):
        """Plain free blocks (most recently freed first), then cached ones in eviction order."""
        order = self.pool.free_block_order()
        expected = self.gpu.takes_in_order()
        num_plain = len(self.gpu.plain_free)
        assert order[:num_plain] == expected[:num_plain], (
            f"plain free order {order[:num_plain]}, model {expected[:num_plain]}"
        )
        assert order[num_plain:] == expected[num_plain:], (
            f"eviction order {order[num_plain:]}, model {expected[num_plain:]}"
        )


def _test_case(policy: str):
    machine = type(f"PoolMachine_{policy.replace('-', '_')}", (PoolMachine,), {"policy": policy})
    case = machine.TestCase
    case.settings = settings(max_examples=scaled_examples(200), stateful_step_count=40)
    return case


TestPoolMachineLRU = _test_case("lru")
TestPoolMachineFIFO = _test_case("fifo")
TestPoolMachineLFU = _test_case("lfu")
TestPoolMachineRadixLeaf = _test_case("radix-leaf")
# lru (vLLM's order) runs in every pytest -q; the other three are among the suite's slowest: CI runs
# them (pytest -m slow); see tests/conftest.py
for _case in (TestPoolMachineFIFO, TestPoolMachineLFU, TestPoolMachineRadixLeaf):
    _case.pytestmark = [pytest.mark.slow]
del _case  # (a module-level TestCase name would be collected a second time)
MODELLED_POLICIES = ("lru", "fifo", "lfu", "radix-leaf")


def test_every_eviction_policy_has_a_model_and_a_machine():
    """A policy added to the registry needs a ``GpuModel.rank`` and a TestCase above."""
    assert set(EVICTION_POLICIES) == set(MODELLED_POLICIES)


# ------------------------------------------------------------------ forced collisions
def test_forced_hash_collisions_give_no_false_prefix_hit():
    """Every key hashes to 0: lookups must fall back to comparing whole chains."""
    bs = 2
    pool = BlockPool(64)
    kv = KVCacheManager(
        pool, SwapPool(0), block_size=bs, enable_prefix_caching=True, hash_fn=lambda parent, content: 0
    )
    holds: dict[int, tuple[int, ...]] = {}  # block -> the token prefix through its end
    prompts = [tuple((i >> k) & 1 for k in range(5)) for i in range(32)]  # all 5-token 0/1 prompts
    cached = prompts[::3]
    for i, prompt in enumerate(cached):
        request = Request(f"c{i}", 5, 1, prompt_token_ids=list(prompt))
        seq = request.seqs[0]
        hits = kv.find_cached_prefix(seq)
        kv.touch_prefix(seq, hits)
        kv.reserve(seq, seq.num_filled_tokens, 5)
        seq.num_computed_tokens = 5
        kv.register(seq, 5)
        for j, b in enumerate(seq.block_table[: 5 // bs]):
            holds.setdefault(b, prompt[: (j + 1) * bs])
        kv.free(seq)
    pool.check()
    assert len(pool.cache) == len({p[:k] for p in cached for k in (2, 4)})  # distinct keys
    for i, prompt in enumerate(prompts):
        seq = Request(f"q{i}", 5, 1, prompt_token_ids=list(prompt)).seqs[0]
        hits = kv.find_cached_prefix(seq)
        for j, b in enumerate(hits):
            assert holds[b] == prompt[: (j + 1) * bs], f"false hit for {prompt}: block {b} holds {holds[b]}"
        expected = 0
        while expected < 2 and any(p[: (expected + 1) * bs] == prompt[: (expected + 1) * bs] for p in cached):
            expected += 1
        assert len(hits) == expected, f"{prompt}: {len(hits)} blocks hit, {expected} cached"


# ------------------------------------------------- free_block_order() is the allocation order
@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_free_block_order_is_the_order_allocations_take(policy):
    """``BlockPool.free_block_order()`` promises "the order it would take them". Under radix-leaf,
    evicting a leaf makes its parent a leaf, so a parent released before an unrelated leaf goes
    before it (an order that popping the policy alone, keys left in place, got wrong)."""
    pool = BlockPool(3, eviction_policy=policy)
    parent, child = chain_keys([(0, 0), (1, 1)])
    (other,) = chain_keys([(2, 2)])
    chain = [pool.allocate(), pool.allocate()]
    pool.cache_block(chain[0], parent)
    pool.cache_block(chain[1], child)
    lone = [pool.allocate()]
    pool.cache_block(lone[0], other)
    pool.free_table(chain)  # child released first, then parent
    pool.free_table(lone)  # the unrelated leaf last
    promised = pool.free_block_order()
    taken = [pool.allocate() for _ in range(3)]
    assert promised == taken, f"free_block_order() {promised}, allocations took {taken}"
