"""vLLM v1's hybrid KV-cache manager: one block table per layer group, all groups in one pool.

A model with sliding-window layers (gpt-oss, Gemma 3, Mistral 7B v0.1) has its layers in KV-cache
groups (``pagesim.engine.catalog.kv_layout``): every block holds one group's layers for ``block_size``
tokens, and a sequence holds a table per group, all of one length. This follows vLLM 0.33
(``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``):

- **Allocation** (``allocate_new_blocks``): a step's new blocks are taken group after group, in
  group order, from the one pool; copy-on-write of a shared partial block (parallel samples) is
  done per group.
- **Leaving the window** (``SlidingWindowManager.remove_skipped_blocks``): before a running
  sequence's blocks are counted for a step, every block of a sliding group that lies wholly before
  ``num_computed_tokens - window + 1`` is released (last first, as vLLM frees them) and its entry
  becomes ``None`` (vLLM's null block). A released block that carries a prefix-cache key stays
  findable until evicted, like any freed block. So a decoding sequence holds at most
  ``ceil(window / block_size) + 1`` blocks in a sliding group, and one computing ``n`` tokens at most
  ``ceil((window - 1 + n) / block_size) + 1``.
- **Prefix hits** (``HybridKVCacheCoordinator.find_longest_cache_hit``): full-attention groups hit
  their longest run of leading cached blocks; each sliding type then searches from the right, within
  that length, for ``ceil((window - 1) / block_size)`` consecutive cached blocks (or a run reaching
  the first block), and the shortest answer wins, repeated until no type shortens it. A block is a
  hit for a set of groups only if every one of them has it cached; a group's key is the block's
  content key tagged with the group (``GroupKey``, vLLM's ``BlockHashWithGroupId``). Of a sliding
  group's hit only the blocks the window still needs are touched; the entries before are ``None``.
- **Which sliding blocks are kept findable** (``SlidingWindowManager.reachable_block_mask`` under
  ``prefix_cache_retention_interval``, 0 by default): a full-attention group keys every full
  block; a sliding group only the ``ceil((window - 1) / block_size)`` blocks that end at a point a
  later request can resume at: the prompt's replay boundary (``prompt_len - 1``) and, when the
  request's lookup found a prefix its full groups had cached but its sliding groups had not, the
  end of that prefix (``Request.shared_prefix_boundary``, vLLM's Marconi-style junction); with an
  interval ``N`` also the tail of every ``N``-token segment; ``None`` keys them all. Blocks left
  unkeyed go back to the front of the free list when the window leaves them, as vLLM's do.
- **Lazy keys** (``KVCacheManager``'s, a simulator's shortcut): a full-attention group's blocks
  whose content is unique to their sequence get ``LAZY_KEY`` and their real key only when the
  sequence is released unfinished (it may look them up after its recompute); a sliding group
  keys its few kept blocks eagerly, since they leave the table while the sequence runs. Lookups
  adopt the stored key they hit, so verifying the next hit compares one link of the chain.
- **Admission** (vLLM 0.33's ``scheduler_reserve_full_isl``, the default): the whole known sequence
  must fit, less its hits, with a sliding group counted at most ``cdiv(min(window - 1 +
  max_num_batched_tokens, max_model_len), block_size) + 1`` blocks (``max_admission_blocks_per_request``
  with one batch in flight: synchronous scheduling, as the ``vllm-v1`` preset models; vLLM 0.33's
  default asynchronous scheduling allows two), and the step's own chunk must fit too.
- **Freeing** a sequence releases each group's table in group order, last block first.

What this cache does not do, as vLLM v1 does not: swap (recompute preemption only), the v0 step
order, and parking the samples of a preempted request (each re-prefills its own sequence).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagesim.engine.policy.memory.block_key import BlockKey, HashFn, default_hash
from pagesim.engine.policy.memory.block_pool import LAZY_KEY, BlockPool
from pagesim.engine.policy.memory.kv_manager import KVCacheManager, cdiv, grow_table
from pagesim.engine.policy.scheduling.request import Request, Sequence
from pagesim.engine.policy.memory.swap_pool import SwapPool


class GroupKey:
    """The prefix-cache key of a block in layer group ``group`` (groups 1..; group 0 uses the plain
    ``BlockKey``): the same content chain, told apart by the group."""

    __slots__ = ("key", "group", "_hash")

    def __init__(self, key: BlockKey, group: int):
        self.key = key
        self.group = group
        self._hash = hash((key._hash, group))

    @property
    def parent(self) -> GroupKey | None:
        parent = self.key.parent
        return None if parent is None else GroupKey(parent, self.group)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupKey):
            return NotImplemented
        return self.group == other.group and self.key == other.key

    def __repr__(self) -> str:
        return f"GroupKey({self.key!r}, group={self.group})"


@dataclass(frozen=True, slots=True)
class HybridHit:
    """A prefix hit in every group: per group, the hit's blocks (``None`` where a sliding window no
    longer needs one), all of one length, the hit's number of blocks."""

    tables: tuple[tuple[int | None, ...], ...]

    def __len__(self) -> int:
        return len(self.tables[0]) if self.tables else 0


NO_HIT = HybridHit(())


def skipped_blocks(window: int | None, num_computed_tokens: int, block_size: int) -> int:
    """Leading blocks wholly outside the window of the next token (vLLM's
    ``get_num_skipped_tokens // block_size``; 0 for full attention)."""
    if window is None or num_computed_tokens < window:
        return 0
    return (num_computed_tokens - window + 1) // block_size


def admission_cap(window: int, block_size: int, max_num_batched_tokens: int, max_model_len: int) -> int:
    """Most blocks a sliding group counts at admission (vLLM's ``max_admission_blocks_per_request``)."""
    return cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1


class HybridKVCacheManager(KVCacheManager):
    hybrid = True

    def __init__(
        self,
        block_pool: BlockPool,
        swap_pool: SwapPool,
        *,
        block_size: int,
        enable_prefix_caching: bool,
        windows: tuple[int | None, ...],
        max_num_batched_tokens: int,
        max_model_len: int,
        retention_interval: int | None = 0,
        hash_fn: HashFn = default_hash,
    ):
        super().__init__(block_pool, swap_pool, block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                         hash_fn=hash_fn)
        self.windows = windows
        self.num_groups = len(windows)
        self.full_groups = [g for g, w in enumerate(windows) if w is None]
        types: dict[int, list[int]] = {}
        for g, w in enumerate(windows):
            if w is not None:
                types.setdefault(w, []).append(g)
        self.sliding_types = list(types.items())  # (window, its groups), in group order
        self.caps = [None if w is None else admission_cap(w, block_size, max_num_batched_tokens, max_model_len)
                     for w in windows]
        self.retention_interval = retention_interval
        # Blocks a sliding hit needs in a row (vLLM's _contiguous_blocks_for_hit, no EAGLE).
        self.run_blocks = [None if w is None else cdiv(w - 1, block_size) for w in windows]

    # ---------------------------------------------------------------- tables
    def tables(self, seq: Sequence) -> list[list[int | None]]:
        """Every group's table of ``seq`` (created empty on first use)."""
        extra = seq.extra_tables
        if extra is None:
            extra = seq.extra_tables = [[] for _ in range(self.num_groups - 1)]
        return [seq.block_table, *extra]

    def group_key(self, seq: Sequence, group: int, index: int) -> BlockKey | GroupKey:
        key = self.block_key(seq, index)
        return key if group == 0 else GroupKey(key, group)

    @staticmethod
    def _changed(seq: Sequence) -> None:
        seq.table_snapshot = None
        seq.extra_snapshot = None

    # -------------------------------------------------------------- the window
    def remove_skipped_blocks(self, seq: Sequence) -> int:
        """Release the blocks of sliding groups that left the window of ``seq``'s next token;
        returns the table entries dropped."""
        bs = self.block_size
        computed = seq.num_computed_tokens
        dropped = 0
        for window, table in zip(self.windows, self.tables(seq)):
            num = min(skipped_blocks(window, computed, bs), len(table))
            if not num or table[num - 1] is None:  # (none left the window, or an earlier call dropped them)
                continue
            freed = []  # (at least table[num - 1])
            for i in range(num - 1, -1, -1):  # backwards, stopping at what an earlier call dropped
                block_id = table[i]
                if block_id is None:
                    break
                freed.append(block_id)
                table[i] = None
            self.pool.free_table(freed[::-1])  # free_table walks backwards: vLLM's order
            self._changed(seq)
            dropped += len(freed)
        return dropped

    # --------------------------------------------------------------- counting
    def plan_need(self, plan: list[tuple[Sequence, int]]) -> int:
        """Blocks reserving ``plan`` takes in every group (new blocks and copy-on-write copies)."""
        ref_counts = self.pool.ref_counts
        pending: dict[int, int] = {}
        need = 0
        for seq, n in plan:
            end = seq.num_computed_tokens + n
            for table in self.tables(seq):
                need += self.reserve_need(table, ref_counts, seq.num_filled_tokens, end, pending)
        return need

    def blocks_to_reserve(self, seq: Sequence, start: int, end: int) -> int:
        """Blocks ``reserve(seq, start, end)`` would take over every group."""
        ref_counts = self.pool.ref_counts
        return sum(self.reserve_need(table, ref_counts, start, end) for table in self.tables(seq))

    def admission_blocks(self, seqs: list[Sequence], hits: list, plan: list[tuple[Sequence, int]],
                         prompt_len: int) -> tuple[int, int, int]:
        """(new blocks, hit blocks an admission takes off the free count, distinct hit blocks) of
        admitting ``seqs`` with ``hits`` and running ``plan`` (see the module docstring)."""
        bs = self.block_size
        chunk = {id(seq): n for seq, n in plan}
        new_full = new_chunk = 0
        touched: set[int] = set()
        for seq, hit in zip(seqs, hits):
            num_hit = len(hit)
            hit_tokens = num_hit * bs
            full = cdiv(seq.num_tokens, bs)
            chunk_blocks = cdiv(hit_tokens + chunk.get(id(seq), 0), bs)
            for g, window in enumerate(self.windows):
                required = full if window is None else min(full, self.caps[g])
                new_full += max(required - num_hit, 0)
                new_chunk += max(chunk_blocks - num_hit, 0)
                if num_hit:
                    touched.update(hit.tables[g][skipped_blocks(window, hit_tokens, bs):])
        return max(new_full, new_chunk), self.num_evictable(touched), len(touched)

    # --------------------------------------------------------------- reserving
    def reserve(self, seq: Sequence, start: int, end: int) -> list[tuple[int, int]]:
        pool, bs = self.pool, self.block_size
        copies: list[tuple[int, int]] = []
        tables = self.tables(seq)
        length = len(tables[0])  # (every group's table has one length)
        for table in tables:
            copies.extend(grow_table(pool, table, bs, start, end))
        if copies or len(tables[0]) != length:
            self._changed(seq)
        if end > seq.num_filled_tokens:
            seq.num_filled_tokens = end
        return copies

    # ------------------------------------------------------------ prefix cache
    def find_cached_prefix(self, seq: Sequence) -> HybridHit:
        """The longest prefix every group has cached (see the module docstring), never covering
        the last known token. Takes no references (``touch_prefix`` does)."""
        if not self.enable_prefix_caching:
            return NO_HIT
        max_blocks = (seq.num_tokens - 1) // self.block_size
        if max_blocks == 0:
            seq.request.shared_prefix_boundary = 0
            return NO_HIT
        self.block_key(seq, max_blocks - 1)  # the chain up to the last candidate
        keys = seq.block_keys
        hits: dict[int, list[int | None]] = {}
        length = longest = max_blocks
        if self.full_groups:
            found = self._leading_hits(seq, keys, max_blocks, self.full_groups)
            length = longest = len(found[0])
            hits.update(zip(self.full_groups, found))
        while True:
            start = length
            for window, groups in self.sliding_types:
                found = self._window_hits(keys, length, groups, window)
                length = len(found[0])
                hits.update(zip(groups, found))
            if length >= start or not self.sliding_types:
                break
        if not self.full_groups:
            longest = length
        # vLLM: the longest single-type hit, where the sliding groups lag, is a junction to key.
        seq.request.shared_prefix_boundary = longest * self.block_size if longest > length else 0
        return HybridHit(tuple(tuple(hits[g][:length]) for g in range(self.num_groups)))

    def _lookup(self, key: BlockKey, groups: list[int]) -> list[int] | None:
        """The block carrying ``key`` in each of ``groups``, or None unless all have one."""
        lookup = self.pool.lookup
        found = []
        for g in groups:
            block_id = lookup(key if g == 0 else GroupKey(key, g))
            if block_id is None:
                return None
            found.append(block_id)
        return found

    def _leading_hits(self, seq: Sequence, keys: list[BlockKey], max_blocks: int,
                      groups: list[int]) -> list[list[int | None]]:
        found: list[list[int | None]] = [[] for _ in groups]
        stored = self.pool.keys
        for i in range(max_blocks):
            ids = self._lookup(keys[i], groups)
            if ids is None:
                break
            for blocks, block_id in zip(found, ids):
                blocks.append(block_id)
            # As KVCacheManager.find_cached_prefix: chain our next key onto the stored one, so the
            # next lookup verifies one link, not the whole chain (O(n) a prefix, not O(n^2)).
            canonical = stored[ids[0]]
            if groups[0]:
                canonical = canonical.key
            if canonical is not keys[i]:
                self.adopt_key(seq, i, canonical)
        return found

    def _window_hits(self, keys: list[BlockKey], max_blocks: int, groups: list[int],
                     window: int) -> list[list[int | None]]:
        """vLLM's ``SlidingWindowManager.find_longest_cache_hit``: from the right, the first run of
        ``ceil((window - 1) / block_size)`` cached blocks ends the hit; a shorter run that reaches
        block 0 is a hit too."""
        needed = cdiv(window - 1, self.block_size)
        found: list[list[int | None]] = [[None] * max_blocks for _ in groups]
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            ids = self._lookup(keys[i], groups)
            if ids is None:
                run = 0
                continue
            for blocks, block_id in zip(found, ids):
                blocks[i] = block_id
            run += 1
            if run >= needed:
                return [blocks[: i + run] for blocks in found]
        return [blocks[:run] for blocks in found]

    def touch_prefix(self, seq: Sequence, hit: HybridHit) -> None:
        """Start ``seq``'s (empty) tables with the hit: each group's blocks the window still needs,
        ``None`` before them (vLLM's ``add_local_computed_blocks``, group after group)."""
        bs = self.block_size
        pool = self.pool
        num_hit = len(hit)
        hit_tokens = num_hit * bs
        for window, table, blocks in zip(self.windows, self.tables(seq), hit.tables):
            assert not table, "a prefix hit starts empty tables"
            skip = skipped_blocks(window, hit_tokens, bs)
            table.extend([None] * skip)
            for block_id in blocks[skip:]:
                pool.touch(block_id)
                table.append(block_id)
        self._changed(seq)
        seq.num_computed_tokens = seq.num_filled_tokens = hit_tokens
        seq.num_registered_blocks = num_hit

    def register(self, seq: Sequence, num_tokens: int) -> None:
        """Give every group's full blocks within the first ``num_tokens`` their keys (once)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_tokens, seq.num_tokens) // self.block_size
        first = seq.num_registered_blocks
        if num_full <= first:
            return
        pool = self.pool
        keys = pool.keys
        lazy = self._lazy_start(seq)
        for g, table in enumerate(self.tables(seq)):
            full = self.windows[g] is None
            keep = None if full else self._kept_blocks(seq, g, first, num_full)
            eager_end = num_full if not full or num_full < lazy else max(first, lazy)
            for i in range(first, eager_end):
                block_id = table[i]
                if block_id is not None and keys[block_id] is None and (keep is None or i in keep):
                    pool.cache_block(block_id, self.group_key(seq, g, i))
            if eager_end < num_full:  # a full group's blocks unique to this sequence: lazy keys
                pool.cache_lazy_unkeyed(table[eager_end:num_full])
        seq.num_registered_blocks = num_full

    def _kept_blocks(self, seq: Sequence, group: int, first: int, end: int) -> set[int] | None:
        """Which of blocks ``[first, end)`` of sliding group ``group`` get a key (None: all); vLLM
        0.33's ``SlidingWindowManager.reachable_block_mask`` without EAGLE."""
        interval = self.retention_interval
        if interval is None:
            return None
        bs = self.block_size
        need = self.run_blocks[group]
        keep: set[int] = set()
        if interval > 0:
            per_segment = interval // bs
            if need >= per_segment:
                return None
            keep.update(i for i in range(first, end) if i % per_segment >= per_segment - need)
        request = seq.request
        boundaries = [request.prompt_len - 1]
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
        for boundary in boundaries:
            stop = boundary // bs  # the blocks of the window's tail end at the block boundary below it
            keep.update(range(max(first, stop - need), min(end, stop)))
        return keep

    # ---------------------------------------------------------- fork and free
    def fork(self, parent: Sequence, child: Sequence) -> None:
        pool = self.pool
        tables = []
        for table in self.tables(parent):
            for block_id in table:
                if block_id is not None:
                    pool.incref(block_id)
            tables.append(list(table))
        child.block_table = tables[0]
        child.extra_tables = tables[1:]
        self._changed(child)
        child.num_filled_tokens = parent.num_filled_tokens

    def share_prefix(self, leader: Sequence, seq: Sequence, num_blocks: int) -> None:
        raise AssertionError("a hybrid KV cache never parks sequences (each re-prefills its own)")

    def free(self, seq: Sequence, *, final: bool = False) -> None:
        """Release every group's table; unless the sequence leaves for good, its lazily keyed
        blocks (full groups only: a sliding group keys eagerly, and its blocks leave the table
        as the window moves) get their real keys first, as ``KVCacheManager.free`` does."""
        pool = self.pool
        if not final and 0 <= seq.lazy_from < seq.num_registered_blocks and seq.extra_tables is not None:
            keys, tables = pool.keys, self.tables(seq)
            for g in self.full_groups:
                table = tables[g]
                for i in range(seq.lazy_from, seq.num_registered_blocks):
                    if keys[table[i]] is LAZY_KEY:
                        pool.materialize(table[i], self.group_key(seq, g, i))
        for table in (seq.block_table, *(seq.extra_tables or ())):
            held = [b for b in table if b is not None]
            if held:
                pool.free_table(held)
        seq.block_table = []
        seq.extra_tables = None
        self._changed(seq)
        seq.num_filled_tokens = 0
        seq.num_registered_blocks = 0

    # ------------------------------------------------------------- swapping
    def blocks_to_swap_out(self, seqs: Iterable[Sequence], *, preserve_sharing: bool) -> int:
        return len({b for seq in seqs for table in self.tables(seq) for b in table if b is not None})

    def swap_out(self, seqs: list[Sequence], *, preserve_sharing: bool) -> list[tuple[int, int]]:
        raise ValueError("a hybrid KV cache (sliding-window layer groups, vLLM v1) preempts by recompute only")

    swap_in = swap_out

    # --------------------------------------------------------------- checking
    def check(self, requests: Iterable[Request]) -> None:
        """The base invariants for every group's table, plus: dropped entries (None) are a prefix
        of a sliding group's table and never outrun the window; full groups drop nothing."""
        self.pool.check()
        self.swap.check()
        bs = self.block_size
        gpu_refs = [0] * self.pool.num_blocks
        keys = self.pool.keys
        for request in requests:
            for seq in request.seqs:
                tables = [seq.block_table, *(seq.extra_tables or ())]
                assert seq.extra_tables is None or len(tables) == self.num_groups
                for window, table in zip(self.windows, tables):
                    if not table:
                        continue
                    assert len(table) == cdiv(seq.num_filled_tokens, bs), (
                        f"{seq.seq_id}: {len(table)} blocks for {seq.num_filled_tokens} slots")
                    dropped = table.count(None)
                    assert all(b is None for b in table[:dropped]), f"{seq.seq_id}: a dropped entry after a held one"
                    assert dropped <= skipped_blocks(window, seq.num_computed_tokens, bs), (
                        f"{seq.seq_id}: {dropped} blocks dropped, but the window reaches back further")
                    for i, b in enumerate(table):
                        if b is None:
                            continue
                        gpu_refs[b] += 1
                        if keys[b] is not None:
                            assert (i + 1) * bs <= seq.num_filled_tokens, f"partial block {b} is keyed"
        for b in range(self.pool.first_block_id, self.pool.num_blocks):
            assert gpu_refs[b] == self.pool.ref_counts[b], (
                f"block {b}: ref {self.pool.ref_counts[b]} but held by {gpu_refs[b]} tables")
