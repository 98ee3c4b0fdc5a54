"""Eviction policies of the offload store (the second KV tier): which stored block is given up
when a store needs room.

An offload policy orders *keys* (the prefix cache's chained ``BlockKey``), not slots: ARC keeps
ghosts of keys it evicted, and a slot is reused by unrelated content. The store (``store.py``)
drives it with these calls, which follow vLLM 0.33's CPU offloading manager
(``vllm/v1/kv_offload/cpu/manager.py``) and its policies' hooks:

- ``store_miss(keys)``: a request offered these keys for storing and they were not stored (ARC
  adapts its target here), once per request and key; called before the ``insert`` of those that
  get a slot;
- ``insert(key, request_id, position)``: the key now has a slot (not yet evictable: its copy is
  in flight); ``position`` is the block's index in the request's sequence;
- ``access(keys, request_id, positions)``: a request used keys already stored: it offered them
  again or loads them;
- ``request_finished(request_id, keys, reused)``: the request is done with the store (finished,
  aborted or rejected); ``keys`` are those it inserted or accessed, in prefix order, and
  ``reused`` those of them it accessed without having inserted them;
- ``set_evictable(key, evictable)``: whether the key may be evicted now (ready and not being
  loaded); ``set_evictable_many(keys)`` makes several evictable at once (by default one call each);
- ``evict(count, protected)``: ``count`` evictable keys outside ``protected``, forgotten, or
  ``None`` (and nothing changes) if there are fewer;
- ``len()`` / ``in``: keys held.

Adding a policy is one subclass registered in ``OFFLOAD_POLICIES`` (or a ``--plugin``).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import ClassVar

from pagesim.engine.policy.plugins.lookup import lookup

Key = Hashable


class OffloadPolicy(ABC):
    name: ClassVar[str]

    def __init__(self, capacity: int):
        self.capacity = capacity

    @abstractmethod
    def insert(self, key: Key, request_id: str, position: int) -> None: ...

    @abstractmethod
    def set_evictable(self, key: Key, evictable: bool) -> None: ...

    @abstractmethod
    def evict(self, count: int, protected: set) -> list[Key] | None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    def set_evictable_many(self, keys: list[Key]) -> None:
        """``set_evictable(key, True)`` for each (a policy may do it at once)."""
        for key in keys:
            self.set_evictable(key, True)

    def store_miss(self, keys: list[Key]) -> None:  # noqa: B027 - optional hook
        """Keys a request offered that were not stored (before any of them is inserted)."""

    def access(self, keys: list[Key], request_id: str, positions: list[int]) -> None:  # noqa: B027
        """A request used these stored keys (offered them again, or loads them)."""

    def request_finished(self, request_id: str, keys: list[Key], reused: set) -> None:  # noqa: B027
        """The request is done: ``keys`` in prefix order, ``reused`` those it did not insert."""


class OffloadLRU(OffloadPolicy):
    """Least recently used first, with vLLM 0.33's request-scoped recency (its ``lru``).

    A key's rank orders evictions (smallest first). A request gets one rank number the first time
    it stores or uses a key; while it runs, its keys rank ``(request rank, -position)`` (so its
    tail is evicted before its head, and every key of a request that started later outranks it).
    When it finishes, each of its keys still held gets a fresh rank, walking from its tail to its
    head, so its head is the most recent key of all. Ranks are one int each (``_rank``: the pair,
    packed). Evictable keys wait in a heap with lazy deletion (an entry is current while the key
    is evictable and its rank is the entry's), except that a rank given at a finish is larger than
    every rank before it, so those keys join a FIFO instead (``_finished``; O(1)), and a victim
    is the smaller of the two fronts.
    """

    name = "lru"
    POSITION_BITS = 32  # positions (block indices) below 2**32

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self._rank: dict[Key, int] = {}
        self._priority = self._rank  # what evictions order by (a subclass may keep its own)
        self._evictable: set[Key] = set()
        self._heap: list[tuple[int, int, Key]] = []  # (priority, push number, key): keys never compared
        self._finished: deque[tuple[int, int, Key]] = deque()  # priorities increasing
        self._counter = 0
        self._pushes = 0
        self._request_rank: dict[str, int] = {}

    def _rank_of(self, request_id: str) -> int:
        rank = self._request_rank.get(request_id)
        if rank is None:
            self._counter += 1
            rank = self._request_rank[request_id] = self._counter
        return rank

    def _pack(self, rank: int, position: int) -> int:
        """``(rank, -position)`` as one int with the same order."""
        return (rank << self.POSITION_BITS) | ((1 << self.POSITION_BITS) - 1 - position)

    def _set_rank(self, key: Key, rank: int) -> None:
        self._rank[key] = rank
        if key in self._evictable:
            self._push(key)

    def _push(self, key: Key) -> None:
        self._pushes += 1
        priority = self._priority[key]
        finished = self._finished
        if type(priority) is int and (not finished or priority > finished[-1][0]):
            finished.append((priority, self._pushes, key))
            return
        heapq.heappush(self._heap, (priority, self._pushes, key))
        if len(self._heap) > 2 * len(self._evictable) + 64:
            self._heap = [e for e in self._heap if self._current(e)]
            heapq.heapify(self._heap)

    def _current(self, entry: tuple) -> bool:
        key = entry[2]
        return key in self._evictable and self._priority[key] == entry[0]

    def _forget(self, key: Key) -> None:
        self._evictable.discard(key)
        del self._rank[key]

    def insert(self, key: Key, request_id: str, position: int) -> None:
        rank = self._request_rank.get(request_id) or self._rank_of(request_id)
        self._rank[key] = (rank << self.POSITION_BITS) | ((1 << self.POSITION_BITS) - 1 - position)  # _pack

    def access(self, keys: list[Key], request_id: str, positions: list[int]) -> None:
        rank = self._rank_of(request_id)
        ranks = self._rank
        for key, position in zip(keys, positions):
            new = self._pack(rank, position)
            old = ranks.get(key)
            if old is not None and new > old:
                self._set_rank(key, new)

    def request_finished(self, request_id: str, keys: list[Key], reused: set) -> None:
        self._request_rank.pop(request_id, None)
        ranks = self._rank
        shift = self.POSITION_BITS
        if self._priority is not ranks:  # (a subclass orders by more than the rank)
            for key in reversed(keys):
                if key in ranks:
                    self._counter += 1
                    self._set_rank(key, ((self._counter + 1) << shift) - 1)  # (counter, -0) packed
            return
        # NOTE: _set_rank and _push inlined (one call per stored block is a hot path): each new
        # rank is larger than any before it, so an evictable key joins the FIFO's end.
        counter, pushes = self._counter, self._pushes
        evictable, append = self._evictable, self._finished.append
        for key in reversed(keys):
            if key in ranks:
                counter += 1
                rank = ranks[key] = ((counter + 1) << shift) - 1
                if key in evictable:
                    pushes += 1
                    append((rank, pushes, key))
        self._counter, self._pushes = counter, pushes

    def set_evictable(self, key: Key, evictable: bool) -> None:
        if evictable:
            if key not in self._evictable:
                self._evictable.add(key)
                self._push(key)
        else:
            self._evictable.discard(key)

    def set_evictable_many(self, keys: list[Key]) -> None:
        evictable, push = self._evictable, self._push
        for key in keys:
            if key not in evictable:
                evictable.add(key)
                push(key)

    def evict(self, count: int, protected: set) -> list[Key] | None:
        evictable, priority = self._evictable, self._priority
        if count <= 0:
            return []
        if len(evictable) - sum(1 for k in protected if k in evictable) < count:
            return None
        victims: list[Key] = []
        skipped_heap, skipped_finished = [], []
        heap, finished = self._heap, self._finished
        heappop = heapq.heappop
        while len(victims) < count:
            while heap:  # drop stale fronts (an entry is current while it is the key's priority)
                entry = heap[0]
                if entry[2] in evictable and priority[entry[2]] == entry[0]:
                    break
                heappop(heap)
            while finished:
                entry = finished[0]
                if entry[2] in evictable and priority[entry[2]] == entry[0]:
                    break
                finished.popleft()
            if not finished or (heap and heap[0][0] < finished[0][0]):
                entry = heappop(heap)
                skipped = skipped_heap
            else:
                entry = finished.popleft()
                skipped = skipped_finished
            key = entry[2]
            if key in protected:
                skipped.append(entry)
                continue
            victims.append(key)
            self._forget(key)
        for entry in skipped_heap:
            heapq.heappush(heap, entry)
        finished.extendleft(reversed(skipped_finished))
        return victims

    def __len__(self) -> int:
        return len(self._rank)

    def __contains__(self, key: object) -> bool:
        return key in self._rank


class OffloadARC(OffloadPolicy):
    """Adaptive replacement (Megiddo and Modha, FAST 2003) as vLLM 0.33's ``arc`` runs it.

    ``T1`` holds keys used by one request, ``T2`` keys a later request reused; ``B1`` / ``B2``
    remember (the hashes of) keys evicted from each (ghosts, at most ``capacity`` each). The target size of
    ``T1``, ``p``, grows when a request offers a key that ``B1`` remembers (recency would have
    kept it) and shrinks for ``B2`` (frequency would have). vLLM's variant, kept here: a new key
    always enters ``T1``, even from a ghost list; a key moves to ``T2`` only when a request that
    reused it finishes; eviction takes the least recent evictable key of ``T1`` while ``|T1| >=
    int(p)``, else of ``T2`` (falling back to ``T1``).
    """

    name = "arc"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.t1: OrderedDict[Key, None] = OrderedDict()  # least recent first
        self.t2: OrderedDict[Key, None] = OrderedDict()
        # NOTE: the ghost lists remember a key's hash only, as vLLM's hold block hashes: an
        # evicted key's chain is not kept alive, and looking a key up never compares chains; a
        # collision could only nudge p, never serve wrong content.
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0
        self._evictable: set[Key] = set()

    def store_miss(self, keys: list[Key]) -> None:
        for key in reversed(keys):
            ghost = hash(key)
            if ghost in self.b1:
                self.p = min(self.p + max(1.0, len(self.b2) / len(self.b1)), float(self.capacity))
                self.b1.move_to_end(ghost)
            elif ghost in self.b2:
                self.p = max(self.p - max(1.0, len(self.b1) / len(self.b2)), 0.0)
                self.b2.move_to_end(ghost)

    def insert(self, key: Key, request_id: str, position: int) -> None:
        ghost = hash(key)
        self.b1.pop(ghost, None)
        self.b2.pop(ghost, None)
        self.t1[key] = None

    def request_finished(self, request_id: str, keys: list[Key], reused: set) -> None:
        for key in reversed(keys):
            if key in self.t1:
                if key in reused:
                    del self.t1[key]
                    self.t2[key] = None
                else:
                    self.t1.move_to_end(key)
            elif key in self.t2:
                self.t2.move_to_end(key)

    def set_evictable(self, key: Key, evictable: bool) -> None:
        if evictable:
            self._evictable.add(key)
        else:
            self._evictable.discard(key)

    def evict(self, count: int, protected: set) -> list[Key] | None:
        if count <= 0:
            return []
        evictable = self._evictable
        if len(evictable) - sum(1 for k in protected if k in evictable) < count:
            return None
        victims = []
        t1_size = len(self.t1)
        for _ in range(count):
            first, second = (self.t1, self.t2) if t1_size >= int(self.p) else (self.t2, self.t1)
            key = _first_in(first, evictable, protected)
            if key is None:
                key = _first_in(second, evictable, protected)
            assert key is not None
            evictable.discard(key)
            if key in self.t1:
                del self.t1[key]
                self.b1[hash(key)] = None
                t1_size -= 1
            else:
                del self.t2[key]
                self.b2[hash(key)] = None
            victims.append(key)
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return victims

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, key: object) -> bool:
        return key in self.t1 or key in self.t2


def _first_in(keys: OrderedDict, evictable: set, protected: set) -> Key | None:
    """The least recent of ``keys`` that is evictable and not protected (O(keys skipped))."""
    for key in keys:
        if key in evictable and key not in protected:
            return key
    return None


class OffloadLFU(OffloadLRU):
    """Least frequently used first (pagesim's, not vLLM's): fewest finished requests that reused
    the key since it was stored; ties by least recently used (``OffloadLRU``'s rank)."""

    name = "lfu"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self._uses: dict[Key, int] = {}
        self._priority = {}  # key -> (uses, rank)

    def _set_rank(self, key: Key, rank: int) -> None:
        self._priority[key] = (self._uses[key], rank)
        super()._set_rank(key, rank)

    def insert(self, key: Key, request_id: str, position: int) -> None:
        self._uses[key] = 0
        super().insert(key, request_id, position)
        self._priority[key] = (0, self._rank[key])

    def request_finished(self, request_id: str, keys: list[Key], reused: set) -> None:
        for key in reused:
            if key in self._uses:
                self._uses[key] += 1  # (the rank update below pushes the new priority)
        super().request_finished(request_id, keys, reused)

    def _forget(self, key: Key) -> None:
        super()._forget(key)
        del self._uses[key]
        del self._priority[key]


OFFLOAD_POLICIES: dict[str, type[OffloadPolicy]] = {cls.name: cls for cls in (OffloadLRU, OffloadARC, OffloadLFU)}


def make_offload_policy(name: str, capacity: int) -> OffloadPolicy:
    return lookup(OFFLOAD_POLICIES, name, "offload eviction policy")(capacity)

