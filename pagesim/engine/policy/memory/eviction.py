"""Eviction policies: which cached, unreferenced block is given up when a fresh block is needed.

A block whose reference count drops to 0 while it carries a content key stays in the prefix cache:
it counts as free (anyone may take it) but a later request can still hit it. Such blocks are the
*evictable* set, and the policy here orders it. The block pool always hands out blocks that carry
no key first (vLLM v1 does the same: its free queue keeps unkeyed blocks at the front and cached
ones at the back), so a policy is consulted only when every free block is a cached one.

Each policy is one small class with five operations, all on block ids:

- ``add(block_id)``: the block became evictable (reference count 0, key still cached);
- ``remove(block_id)``: a cache hit took it back (O(1) for ``lru``, lazy O(1) for the heap ones);
- ``pop()``: choose a victim, forget it and return it (``None`` only when empty);
- ``on_leaf(key)``: the key just lost its last cached child (only ``radix-leaf`` cares);
- ``len()`` / ``in``.

Per-block facts a policy orders by (release tick, cache tick, hit count) are read from the pool
that owns the policy, through ``BlockStats``. Adding a policy is one subclass registered in
``EVICTION_POLICIES``.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from mypy_extensions import mypyc_attr

from pagesim.engine.policy.plugins.lookup import lookup

if TYPE_CHECKING:
    from pagesim.engine.policy.memory.block_key import CacheKey


class BlockStats(Protocol):
    """What a policy may read about blocks (implemented by ``BlockPool``)."""

    release_tick: list[int]  # logical time the block's reference count last reached 0
    cached_tick: list[int]  # logical time the block got its current key
    hit_count: list[int]  # prefix-cache hits on the block since it got its current key

    def key_has_children(self, key: CacheKey) -> bool: ...

    def blocks_with_key(self, key: CacheKey) -> Iterable[int]: ...

    def block_key(self, block_id: int) -> CacheKey | None: ...


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class EvictionPolicy(ABC):
    name: ClassVar[str]
    #: Whether the policy reads the prefix tree (``key_has_children``, ``on_leaf``). A policy that
    #: says ``False`` lets the pool skip the tree's bookkeeping (one dict per key insert/remove).
    uses_key_tree: ClassVar[bool] = True
    #: Whether the policy reads ``BlockStats``' per-block ticks and hit counts. A policy that says
    #: ``False`` lets the pool skip keeping them (three list writes per block released or cached).
    reads_block_stats: ClassVar[bool] = True

    def __init__(self, stats: BlockStats):
        self.stats = stats

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # A class promises to read no block stats only by saying so in its own body: a plug-in
        # that subclasses ``lru`` and orders by hit counts must not inherit ``lru``'s promise, or
        # it would read counts the pool stopped keeping. (A subclass that reads the key tree
        # without saying so fails loudly instead: the index refuses ``has_children``.)
        if "reads_block_stats" not in vars(cls):
            cls.reads_block_stats = True

    @abstractmethod
    def add(self, block_id: int) -> None: ...

    @abstractmethod
    def remove(self, block_id: int) -> None: ...

    @abstractmethod
    def pop(self) -> int | None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, block_id: object) -> bool: ...

    def members(self, block_ids: Iterable[int]) -> set[int]:
        """The blocks of ``block_ids`` the policy holds (for checks: ``BlockPool.check`` passes
        every block). By default ``in`` of each; a policy that can list its own does so at once."""
        return {block_id for block_id in block_ids if block_id in self}

    #: ``add_many`` and ``pop_many`` may stand for a run of ``add`` / ``pop`` calls with the
    #: pool's bookkeeping done before or after the whole run (the policy's order reads nothing
    #: that changes in between). Only built-in policies that know it say so.
    batches: ClassVar[bool] = False

    def add_many(self, block_ids: Sequence[int]) -> None:
        """``add`` each, in order (a policy may do it at once)."""
        for block_id in block_ids:
            self.add(block_id)

    def pop_many(self, count: int) -> list[int]:
        """Up to ``count`` victims, as ``count`` calls of ``pop`` give them (fewer if it runs dry)."""
        victims = []
        for _ in range(count):
            block_id = self.pop()
            if block_id is None:
                break
            victims.append(block_id)
        return victims

    def on_leaf(self, key: CacheKey) -> None:  # noqa: B027 - optional hook
        """``key`` no longer has a cached child. Only structure-aware policies care."""


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class LRUPolicy(EvictionPolicy):
    """Least recently released first: vLLM v1's order.

    Blocks join at the back when their count reaches 0 and leave from the front. Because a finished
    request's table is released tail first, a chain's tail is evicted before its prefix.

    The order is a list of block ids read from ``_head`` on (entries before it have left):
    joining in bulk is one ``extend``, leaving in bulk one slice, both C calls with no Python per
    block. The consumed front is cut off once it is half the list (amortized O(1) a block). A
    cache hit takes a block out of the middle in O(1) by leaving its entry behind as *stale*:
    ``_stale[b]`` counts the stale entries of ``b`` still queued. They are always older than
    ``b``'s live entry (a block has at most one, the one added last), so the front's entry of
    ``b`` is stale exactly when that count is positive, and is skipped. Stale entries are dropped
    in one pass when they outnumber the live ones. (The same order as vLLM's intrusive free-block
    queue, without per-node Python objects.)

    No set of members is kept: the pool knows which blocks are cached (count 0 with a key), and a
    set of tens of thousands of ids costs a hashed write per block joining and leaving, the
    simulator's commonest operations. So ``len`` is the queued entries less the stale ones, and
    ``in`` / ``members`` scan the queue (O(blocks): for checks and tests, never the hot path).
    """

    name = "lru"
    uses_key_tree = False
    reads_block_stats = False  # the queue is the order
    batches = True  # the order is release order alone
    compact_slack = 1024  # stale entries allowed beyond the live ones
    trim_at = 4096  # the queue's consumed front is cut off once it is this long and half the list

    def __init__(self, stats: BlockStats):
        super().__init__(stats)
        self._queue: list[int] = []
        self._head = 0  # the queue's first entry still queued
        self._stale: dict[int, int] = {}
        self._num_stale = 0

    def add(self, block_id: int) -> None:
        self._queue.append(block_id)

    def add_many(self, block_ids: Sequence[int]) -> None:
        self._queue.extend(block_ids)

    def remove(self, block_id: int) -> None:
        # (the pool removes only a cached block: count 0 with a key, which is queued exactly once live)
        stale = self._stale
        stale[block_id] = stale.get(block_id, 0) + 1
        self._num_stale = num_stale = self._num_stale + 1
        if num_stale > len(self._queue) - self._head - num_stale + self.compact_slack:
            self._compact()

    def pop(self) -> int | None:
        victims = self.pop_many(1)
        return victims[0] if victims else None

    def pop_many(self, count: int) -> list[int]:
        queue = self._queue
        head = self._head
        live = len(queue) - head - self._num_stale
        if count > live:
            count = live
        stale = self._stale
        if stale:  # (walk the queue, skipping the stale entries it meets)
            victims: list[int] = []
            take = victims.append
            while count:
                block_id = queue[head]
                head += 1
                if block_id in stale:
                    self._drop_stale(block_id)
                else:
                    take(block_id)
                    count -= 1
        else:
            victims = queue[head:head + count]
            head += count
        # cut off the consumed front once it is at least half the list (and trim_at long)
        if head >= self.trim_at and head + head >= len(queue):
            del queue[:head]
            head = 0
        self._head = head
        return victims

    def _drop_stale(self, block_id: int) -> None:
        left = self._stale[block_id] - 1
        if left:
            self._stale[block_id] = left
        else:
            del self._stale[block_id]
        self._num_stale -= 1

    def _compact(self) -> None:
        stale = self._stale
        kept = []
        for block_id in self._queued():  # oldest first: a block's first entries are its stale ones
            left = stale.get(block_id, 0)
            if left:
                stale[block_id] = left - 1
            else:
                kept.append(block_id)
        self._queue = kept
        self._head = 0
        self._stale = {}
        self._num_stale = 0

    def _queued(self) -> list[int]:
        """The entries still queued, oldest first (stale ones included)."""
        return self._queue[self._head:]

    def __len__(self) -> int:
        return len(self._queue) - self._head - self._num_stale

    def __contains__(self, block_id: object) -> bool:
        """O(queued entries): for checks and tests."""
        return block_id in self._live_entries()

    def members(self, block_ids: Iterable[int]) -> set[int]:
        return self._live_entries().keys() & set(block_ids)

    def _live_entries(self) -> Counter[int]:
        """Each queued block with its live entries (one; stale ones counted off)."""
        live = Counter(self._queued())
        live.subtract(self._stale)
        return +live  # (drops the blocks left with none)


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class _HeapPolicy(EvictionPolicy):
    """A policy that evicts the smallest ``priority(block_id)``; a heap with lazy deletion.

    ``_live[block_id]`` holds the sequence number of the block's one valid heap entry; entries
    whose number no longer matches are stale and skipped when they reach the top.
    """

    def __init__(self, stats: BlockStats):
        super().__init__(stats)
        self._heap: list[tuple] = []
        self._live: dict[int, int] = {}
        self._seq = 0

    @abstractmethod
    def priority(self, block_id: int) -> tuple: ...

    def _push(self, block_id: int) -> None:
        self._seq += 1
        self._live[block_id] = self._seq
        heapq.heappush(self._heap, (*self.priority(block_id), self._seq, block_id))

    def add(self, block_id: int) -> None:
        self._push(block_id)

    def remove(self, block_id: int) -> None:
        del self._live[block_id]
        if len(self._heap) > 4 * len(self._live) + 64:  # keep stale entries bounded
            self._heap = [e for e in self._heap if self._live.get(e[-1]) == e[-2]]
            heapq.heapify(self._heap)

    def _pop_valid(self) -> int | None:
        heap, live = self._heap, self._live
        while heap:
            entry = heapq.heappop(heap)
            block_id = entry[-1]
            if live.get(block_id) == entry[-2]:
                return block_id
        return None

    def pop(self) -> int | None:
        block_id = self._pop_valid()
        if block_id is not None:
            del self._live[block_id]
        return block_id

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._live

    def members(self, block_ids: Iterable[int]) -> set[int]:
        return self._live.keys() & set(block_ids)


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class FIFOPolicy(_HeapPolicy):
    """First cached, first evicted: the block that has carried its key longest goes first,
    however recently it was used."""

    name = "fifo"
    uses_key_tree = False

    def priority(self, block_id: int) -> tuple:
        return (self.stats.cached_tick[block_id],)


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class LFUPolicy(_HeapPolicy):
    """Fewest prefix-cache hits first (since the block got its key); ties by least recently released."""

    name = "lfu"
    uses_key_tree = False

    def priority(self, block_id: int) -> tuple:
        return (self.stats.hit_count[block_id], self.stats.release_tick[block_id])


# (Compiled builds: plug-ins subclass the policies; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class RadixLeafPolicy(_HeapPolicy):
    """Only leaves are candidates, least recently released first, like SGLang's radix cache.

    A leaf is a block whose key no cached key extends, so a cached prefix is never broken in its
    middle while its extension stays cached (an extension whose parent is gone can never be hit
    again). When a leaf is evicted and its parent key thereby becomes a leaf, the parent's
    evictable blocks become candidates (``on_leaf``). If every evictable block is an inner node
    (possible only when a key is carried by two blocks and one of them is in use), the least
    recently released inner block is taken rather than failing an allocation.
    """

    name = "radix-leaf"

    def priority(self, block_id: int) -> tuple:
        return (self.stats.release_tick[block_id],)

    def __init__(self, stats: BlockStats):
        super().__init__(stats)
        self._inner: set[int] = set()  # evictable blocks found not to be leaves; off the heap

    def remove(self, block_id: int) -> None:
        self._inner.discard(block_id)
        super().remove(block_id)

    def pop(self) -> int | None:
        heap, live, stats = self._heap, self._live, self.stats
        victim = None
        while heap:
            entry = heapq.heappop(heap)
            block_id = entry[-1]
            if live.get(block_id) != entry[-2]:
                continue
            key = stats.block_key(block_id)
            if key is not None and stats.key_has_children(key):
                # NOTE: off the heap until on_leaf() puts it back with a fresh entry.
                self._inner.add(block_id)
                continue
            victim = block_id
            break
        if victim is None and self._inner:
            victim = min(self._inner, key=lambda b: stats.release_tick[b])
        if victim is not None:
            self._inner.discard(victim)
            del live[victim]
        return victim

    def on_leaf(self, key: CacheKey) -> None:
        for block_id in self.stats.blocks_with_key(key):
            if block_id in self._live:
                self._inner.discard(block_id)
                self._push(block_id)


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUPolicy, FIFOPolicy, LFUPolicy, RadixLeafPolicy)
}


def make_eviction_policy(name: str, stats: BlockStats) -> EvictionPolicy:
    return lookup(EVICTION_POLICIES, name, "eviction policy")(stats)


__all__ = [
    "EVICTION_POLICIES",
    "BlockStats",
    "EvictionPolicy",
    "FIFOPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "RadixLeafPolicy",
    "make_eviction_policy",
]

