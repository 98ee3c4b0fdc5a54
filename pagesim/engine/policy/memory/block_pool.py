"""The GPU block pool: a fixed set of physical KV blocks, reference counted, with a prefix cache.

Every block is in exactly one of three states:

- **in use**: reference count > 0 (held by that many block tables);
- **free**: count 0 and no content key: on the free list;
- **cached**: count 0 but still carrying a content key, so a later request can hit it; it is free
  to take, and taking it evicts it (vLLM v1's lazy eviction: a cached block is forgotten only when
  it is reused). The eviction policy orders these.

``num_free_blocks`` counts free *and* cached blocks (what an allocation can take), like vLLM's
free-queue length. ``free + cached + in use == num_usable_blocks`` always.

Allocation order (vLLM's, which the oracle logs pin down):
- the free list is taken from the front; a block released with no key goes back to the **front**
  (a stack: v0's LIFO free list, and v1's "unhashed blocks to the front of the free queue");
- a cached block is taken only when the free list is empty, in the eviction policy's order;
- a table is released from its **last** block to its first (v1's ``free_blocks(reversed(...))``):
  keyed blocks join the eviction order in that walk order, so a chain's tail goes before its
  prefix; unkeyed blocks that reach 0 go to the front as a group in walk order, so the table's last
  block is handed out next.

Blocks are ints (their ids); per-block state lives in flat lists indexed by id, which keeps the hot
path (allocate + free) to a few list operations. Block 0 can be reserved as vLLM v1's null block.
The facts eviction policies order by (release and cache ticks, hit counts) are kept only when the
policy reads them (``EvictionPolicy.reads_block_stats``; ``lru`` does not: its queue is the order).

**Lazy keys.** A full block whose content is unique to its own sequence (an unnamed generated
block, a prompt tail no other request can share; ``KVCacheManager`` decides) may be registered
with the marker ``LAZY_KEY`` instead of its key (``cache_lazy``): it is cached all the same (it
joins the eviction order when released, and taking it counts as an eviction), but it is not in the
index, because nobody else could look it up. Its owner asks for the real key (``materialize``)
before it could look the block up itself (a recompute), so a lookup never sees a difference.

``on_release`` (default ``None``) is called with a block id whenever the pool stops caring what
the block holds: it went back to the free list, or its cached content was evicted. The engine's
validation mode fills such blocks with NaN; the policy itself never looks at contents.
"""

from __future__ import annotations

import copy
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import ClassVar

from pagesim.engine.policy.memory.block_key import LAZY_KEY, BlockKey, CacheKey
from pagesim.engine.policy.scheduling.errors import NoFreeBlocksError
from pagesim.engine.policy.memory.eviction import EvictionPolicy, make_eviction_policy
from pagesim.engine.policy.memory.prefix_cache import PrefixCacheIndex


class BlockPool:
    #: Whether ``free_table`` checks every block of a ``layout`` it is given against the pool
    #: (O(table) reads, what the layout saves): on for the test suite (``tests/conftest.py`` sets
    #: ``PAGESIM_CHECK_LAYOUTS=1``, which the CLI runs it starts inherit), off otherwise.
    check_layouts: ClassVar[bool] = os.environ.get("PAGESIM_CHECK_LAYOUTS") == "1"

    def __init__(
        self,
        num_blocks: int,
        *,
        eviction_policy: str = "lru",
        reserve_null_block: bool = False,
    ):
        if num_blocks < 1 + reserve_null_block:
            raise ValueError(f"num_blocks must be at least {1 + reserve_null_block}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.first_block_id = 1 if reserve_null_block else 0
        self.num_usable_blocks = num_blocks - self.first_block_id  # (every block but the null block)
        self.ref_counts: list[int] = [0] * num_blocks
        self.keys: list[CacheKey | None] = [None] * num_blocks
        # Facts eviction policies order by (see eviction.BlockStats).
        self.release_tick: list[int] = [0] * num_blocks
        self.cached_tick: list[int] = [0] * num_blocks
        self.hit_count: list[int] = [0] * num_blocks
        self._tick = 0
        self._free: deque[int] = deque(range(self.first_block_id, num_blocks))
        self.eviction: EvictionPolicy = make_eviction_policy(eviction_policy, self)
        self.cache = PrefixCacheIndex(track_children=self.eviction.uses_key_tree)
        self._stats = self.eviction.reads_block_stats  # keep release_tick, cached_tick, hit_count
        self.num_evictions = 0
        self.on_release: Callable[[int], None] | None = None

    # ----------------------------------------------------------------- counts
    # (Copies and pickles, free_block_order's: compiled, a pool is made only through __init__, so
    # a throwaway one takes every attribute of the original; pagesim/engine/compiled.py.)
    def __reduce__(self) -> tuple:
        return _blank_pool, (), self.__getstate__()

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free plus cached-but-unreferenced."""
        return len(self._free) + len(self.eviction)

    @property
    def num_plain_free_blocks(self) -> int:
        """Free blocks that carry no key (allocations take these before evicting)."""
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.eviction)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    # ----------------------------------------------------------- allocation
    def allocate(self) -> int:
        """Take one block (reference count 1), evicting a cached block only if none is plain free."""
        free = self._free
        block_id = free.popleft() if free else self._evict()
        self.ref_counts[block_id] = 1
        return block_id

    def allocate_many(self, num_blocks: int) -> list[int]:
        """``num_blocks`` calls of ``allocate``, in one pass: the plain free blocks first, then
        evictions, in the order (and with the hooks) that one-by-one allocation makes them."""
        free = self._free
        plain = len(free)
        if num_blocks == 1 and plain:  # (a decode's new block, with plain free blocks left)
            block_id = free.popleft()
            self.ref_counts[block_id] = 1
            return [block_id]
        if num_blocks > plain:
            if num_blocks > plain + len(self.eviction):
                raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
            if not plain:  # (the pool's steady state with prefix caching: every block cached)
                return self._evict_many(num_blocks)
        else:
            plain = num_blocks
        popleft = free.popleft
        blocks = [popleft() for _ in range(plain)]
        ref_counts = self.ref_counts
        for block_id in blocks:
            ref_counts[block_id] = 1
        if plain < num_blocks:
            blocks += self._evict_many(num_blocks - plain)
        return blocks

    def _evict(self) -> int:
        block_id = self.eviction.pop()
        if block_id is None:
            raise NoFreeBlocksError("no free or cached block left")
        keys = self.keys
        key = keys[block_id]
        assert key is not None and self.ref_counts[block_id] == 0
        keys[block_id] = None
        if key is not LAZY_KEY:
            new_leaf = self.cache.remove(key, block_id)
            if new_leaf is not None:
                self.eviction.on_leaf(new_leaf)
        self.num_evictions += 1
        if self.on_release is not None:
            self.on_release(block_id)
        return block_id

    def _evict_many(self, count: int) -> list[int]:
        """``count`` evictions, as ``count`` calls of ``_evict`` make them, for ``allocate_many``:
        each evicted block leaves with its reference count set to 1."""
        eviction = self.eviction
        ref_counts = self.ref_counts
        if not eviction.batches:  # e.g. a leaf found by one eviction may be the next one's victim
            blocks = [self._evict() for _ in range(count)]
            for block_id in blocks:
                ref_counts[block_id] = 1
            return blocks
        blocks = eviction.pop_many(count)
        if len(blocks) < count:
            raise NoFreeBlocksError("no free or cached block left")
        keys, hook = self.keys, self.on_release
        # (lazy keys are never in the index: with none there, nothing to remove)
        victim_keys = _picked(keys, blocks) if self.cache._blocks else None  # (the index's dict: no call)
        for block_id in blocks:
            keys[block_id] = None
            ref_counts[block_id] = 1
        if victim_keys is not None:
            self.cache.remove_many([(block_id, key) for block_id, key in zip(blocks, victim_keys)
                                    if key is not LAZY_KEY])
        if hook is not None:
            for block_id in blocks:
                hook(block_id)
        self.num_evictions += count
        return blocks

    def incref(self, block_id: int) -> None:
        """Share an in-use block with one more table (fork)."""
        assert self.ref_counts[block_id] > 0, f"block {block_id} is not in use"
        self.ref_counts[block_id] += 1

    def free(self, block_id: int) -> None:
        """Drop one reference; at 0 the block becomes free (front of the list) or cached."""
        count = self.ref_counts[block_id] - 1
        assert count >= 0, f"block {block_id} freed more often than referenced"
        self.ref_counts[block_id] = count
        if count == 0:
            if self._stats:
                self._tick += 1
                self.release_tick[block_id] = self._tick
            if self.keys[block_id] is None:
                self._free.appendleft(block_id)
                if self.on_release is not None:
                    self.on_release(block_id)
            else:
                self.eviction.add(block_id)

    def free_table(self, block_ids: Sequence[int], layout: tuple[int, int] | None = None) -> None:
        """Release a whole block table, last block first (see the module docstring for the order).

        ``layout``, when the caller knows it, is ``(unique_from, num_keyed)``: the table's blocks
        from index ``unique_from`` on are held by this table alone, and its first ``num_keyed``
        blocks carry a key, the others none (``KVCacheManager.free`` knows both for a settled
        sequence); the common case then reads neither per block."""
        if len(block_ids) == 1:  # (a sliding window's drop: what free does for one block)
            self.free(block_ids[0])
            return
        ref_counts, keys, release_tick = self.ref_counts, self.keys, self.release_tick
        eviction = self.eviction
        if layout is not None and self.check_layouts:
            self._check_layout(block_ids, *layout)
        if not self._stats and eviction.batches:
            shared = block_ids if layout is None else block_ids[:layout[0]]  # (the blocks that may be shared)
            if not shared or _picked(ref_counts, shared).count(1) == len(shared):
                # the common case, in bulk: every block leaves use
                self._free_unshared(block_ids, None if layout is None else layout[1])
                return
        unkeyed_in_walk_order = []
        keyed_in_walk_order: list[int] = []
        make_evictable = keyed_in_walk_order.append if eviction.batches else eviction.add
        tick = self._tick
        for block_id in reversed(block_ids):
            count = ref_counts[block_id] - 1
            assert count >= 0, f"block {block_id} freed more often than referenced"
            ref_counts[block_id] = count
            if count == 0:
                tick += 1
                release_tick[block_id] = tick
                if keys[block_id] is None:
                    unkeyed_in_walk_order.append(block_id)
                else:
                    make_evictable(block_id)
        self._tick = tick
        if keyed_in_walk_order:
            eviction.add_many(keyed_in_walk_order)
        # extendleft reverses, so the walk's first block ends up at the very front.
        self._free.extendleft(reversed(unkeyed_in_walk_order))
        if self.on_release is not None:
            for block_id in unkeyed_in_walk_order:
                self.on_release(block_id)

    def _check_layout(self, block_ids: Sequence[int], unique_from: int, num_keyed: int) -> None:
        """Assert that ``(unique_from, num_keyed)`` is the table's layout, block by block."""
        counts = [self.ref_counts[block_id] for block_id in block_ids]
        keyed = [self.keys[block_id] is not None for block_id in block_ids]
        assert all(count == 1 for count in counts[unique_from:]), (
            f"blocks from {unique_from} on should be this table's alone: reference counts {counts}")
        assert keyed == [True] * num_keyed + [False] * (len(block_ids) - num_keyed), (
            f"the first {num_keyed} blocks should carry keys and the rest none: {keyed}")

    def _free_unshared(self, block_ids: Sequence[int], num_keyed: int | None = None) -> None:
        """``free_table`` of a table whose blocks all have one reference, for a policy that
        batches and reads no ticks: the same order, with one pass per list touched. With
        ``num_keyed`` (``free_table``'s layout) no key is read but the two at the boundary."""
        ref_counts, keys = self.ref_counts, self.keys
        for block_id in block_ids:
            ref_counts[block_id] = 0
        walk = block_ids[::-1]
        # The walk's blocks with no key go to the free list, the others to the eviction order.
        # Usually the unkeyed ones are the walk's first (the table's tail: its last block, partly
        # filled), and the walk is cut in two; a layout says so, and how many, without the keys.
        if num_keyed is not None:
            num_unkeyed = len(walk) - num_keyed
            assert (not num_keyed or keys[walk[num_unkeyed]] is not None) and (
                not num_unkeyed or keys[walk[num_unkeyed - 1]] is None), "the table's keys are not as its layout says"
            cut = True
        else:
            walk_keys = _picked(keys, walk)
            num_unkeyed = walk_keys.count(None)
            cut = walk_keys[:num_unkeyed].count(None) == num_unkeyed
        if cut:
            unkeyed = walk[:num_unkeyed]
            if num_unkeyed < len(walk):
                self.eviction.add_many(walk[num_unkeyed:])
        else:
            unkeyed = [block_id for block_id, key in zip(walk, walk_keys) if key is None]
            self.eviction.add_many([block_id for block_id, key in zip(walk, walk_keys) if key is not None])
        if unkeyed:
            self._free.extendleft(reversed(unkeyed))
            if self.on_release is not None:
                for block_id in unkeyed:
                    self.on_release(block_id)

    # --------------------------------------------------------- prefix cache
    def lookup(self, key: CacheKey) -> int | None:
        return self.cache.lookup(key)

    def touch(self, block_id: int) -> None:
        """A prefix-cache hit: take a reference on a cached block (pulling it out of the eviction
        order if nobody held it)."""
        if self.ref_counts[block_id] == 0:
            self.eviction.remove(block_id)
        self.ref_counts[block_id] += 1
        if self._stats:
            self.hit_count[block_id] += 1

    def cache_block(self, block_id: int, key: CacheKey) -> None:
        """Give an in-use, full block its content key (register it in the prefix cache)."""
        assert self.ref_counts[block_id] > 0, f"only an in-use block can be cached ({block_id})"
        keys = self.keys
        assert keys[block_id] is None, f"block {block_id} already carries a key"
        keys[block_id] = key
        if self._stats:
            self._tick = tick = self._tick + 1
            self.cached_tick[block_id] = tick
            self.hit_count[block_id] = 0
        self.cache.insert(key, block_id)

    def cache_unkeyed(self, block_ids: Sequence[int], block_keys: Sequence[BlockKey]) -> None:
        """``cache_block(block_id, key)`` for each pair of ``block_ids`` and ``block_keys`` (in
        step) whose block carries no key yet, in order (one pass)."""
        keys = self.keys
        if self._stats:
            for block_id, key in zip(block_ids, block_keys):
                if keys[block_id] is None:
                    self.cache_block(block_id, key)
            return
        ref_counts = self.ref_counts
        pairs: list[tuple[int, CacheKey]] = []
        for block_id, key in zip(block_ids, block_keys):
            if keys[block_id] is None:
                assert ref_counts[block_id] > 0, f"only an in-use block can be cached ({block_id})"
                keys[block_id] = key
                pairs.append((block_id, key))
        self.cache.insert_many(pairs)

    def cache_lazy_unkeyed(self, block_ids: Sequence[int]) -> None:
        """``cache_lazy`` of those of ``block_ids`` that carry no key yet, in order (one pass)."""
        keys = self.keys
        if self._stats:
            self.cache_lazy([block_id for block_id in block_ids if keys[block_id] is None])
            return
        for block_id in block_ids:
            if keys[block_id] is None:
                keys[block_id] = LAZY_KEY

    def cache_lazy(self, block_ids: Sequence[int]) -> None:
        """``cache_block`` with ``LAZY_KEY`` for each of these in-use, unkeyed, full blocks, in order."""
        keys, cached_tick, hit_count = self.keys, self.cached_tick, self.hit_count
        if not self._stats:
            for block_id in block_ids:
                keys[block_id] = LAZY_KEY
            return
        tick = self._tick
        for block_id in block_ids:
            tick += 1
            keys[block_id] = LAZY_KEY
            cached_tick[block_id] = tick
            hit_count[block_id] = 0
        self._tick = tick

    def materialize(self, block_id: int, key: CacheKey) -> None:
        """Replace a block's ``LAZY_KEY`` by its real key, so a lookup of ``key`` finds it."""
        assert self.keys[block_id] is LAZY_KEY, f"block {block_id} carries no lazy key"
        self.keys[block_id] = key
        self.cache.insert(key, block_id)

    # ------------------------------------------- eviction.BlockStats protocol
    def key_has_children(self, key: CacheKey) -> bool:
        return self.cache.has_children(key)

    def blocks_with_key(self, key: CacheKey) -> Iterable[int]:
        return self.cache.blocks_with(key)

    def block_key(self, block_id: int) -> CacheKey | None:
        return self.keys[block_id]

    # ------------------------------------------------------------ inspection
    def free_block_order(self) -> list[int]:
        """Every block an allocation could take, in the order it would take them: found by
        allocating them all from a copy of the pool (O(num_blocks); for tests and reports)."""
        hook, self.on_release = self.on_release, None  # not the engine's: nothing else to copy
        try:
            clone = copy.deepcopy(self)
        finally:
            self.on_release = hook
        return [clone.allocate() for _ in range(clone.num_free_blocks)]

    def check(self) -> None:
        """Assert the pool's invariants (O(num_blocks); for tests)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        cached = self.eviction.members(range(self.num_blocks))
        assert len(cached) == len(self.eviction)
        assert not free & cached, "a block is both free and cached"
        for block_id in range(self.first_block_id, self.num_blocks):
            count = self.ref_counts[block_id]
            assert count >= 0
            in_use = count > 0
            assert in_use + (block_id in free) + (block_id in cached) == 1, (
                f"block {block_id}: ref {count}, free {block_id in free}, cached {block_id in cached}"
            )
            if block_id in free:
                assert self.keys[block_id] is None, f"free block {block_id} carries a key"
            if block_id in cached:
                assert self.keys[block_id] is not None
            key = self.keys[block_id]
            if key is not None and key is not LAZY_KEY:
                assert block_id in self.cache.blocks_with(key)
        assert self.num_free_blocks + self.num_used_blocks == self.num_usable_blocks


def _picked(values: list, ids: Sequence[int]) -> tuple:
    """``values[i]`` for each of ``ids``, in order, as a tuple: for two or more, one
    ``itemgetter`` (made in C, with no Python call per id), the commonest bulk read of the pool."""
    return itemgetter(*ids)(values) if len(ids) > 1 else tuple([values[i] for i in ids])


def _blank_pool() -> BlockPool:
    return BlockPool(1)
