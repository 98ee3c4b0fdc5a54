"""What the prefix cache evicted lately, so a later miss can tell a lost hit from plain recycling.

An eviction hands a cached block to a new owner; whether that cost anything shows only later: if a
request then asks for the content the block held and misses, the eviction cost a hit; if nobody
ever asks for it again, the block was just recycled. ``BlockPool`` records the content key of
every block it evicts here (``add`` / ``add_many``, with the eviction's index: the pool's
eviction count before it), and the KV manager, at an admission's miss, asks whether the missed
key was evicted (``take``): each such eviction is counted once, as "asked for again", and
forgotten.

Memory is bounded and small. Only the keys' 64-bit hashes are kept (never the keys, which would
keep their whole chains alive), and only for about the last ``window`` evictions: a key asked for
after more evictions than that counts as recycled. Evictions are cut into chunks of ``chunk``
consecutive indices (an eighth of the window): the current chunk's hashes sit in a set; a past
chunk is frozen into a sorted ``array('q')`` (8 bytes a hash, searched by bisection) with a
``bytearray`` of "taken" marks, and dropped once it lies wholly more than ``window`` evictions
back. So an eviction is remembered through at least ``window - chunk`` later ones; at most
``window + chunk`` hashes are held, in about ``18 * window`` bytes (9 a frozen hash, about 70 a
set entry and its int); a miss searches one set and at most ``window // chunk`` arrays.

Everything here is a function of eviction indices, not of the order of calls: which chunk a hash
joins, when a chunk is frozen or dropped (``take`` is told the current index). The step-by-step
path and the fast path make the same evictions in the same order, in different calls, and may
differ in evictions nobody can ask for (a block of content unique to a finished sequence, lazily
keyed on one path: not recorded); the keys a request can ask for sit at the same indices on both,
so both count the same.

A hash stands for its key: two keys with equal 64-bit hashes would be taken for one another here
(a statistic only; the prefix cache itself verifies every key, ``engine/policy/block_key.py``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque


class EvictedKeys:
    __slots__ = ("window", "chunk", "_recent", "_chunk_id", "_frozen")

    def __init__(self, window: int, chunk: int | None = None) -> None:
        if window < 1 or (chunk is not None and chunk < 1):
            raise ValueError(f"the eviction window and chunk must be at least 1 eviction, got {window}, {chunk}")
        self.window = window
        self.chunk = min(window, chunk if chunk is not None else max(1, window // 8))
        self._recent: set[int | None] = set()  # the hashes of the current chunk's evictions
        self._chunk_id = 0  # the current chunk: evictions chunk_id * chunk .. (chunk_id + 1) * chunk - 1
        # past chunks, oldest first: (chunk id, sorted hashes, a nonzero mark where one was taken)
        self._frozen: deque[tuple[int, array, bytearray]] = deque()

    def __len__(self) -> int:
        """Hashes held (taken ones included: at most ``window + chunk``)."""
        return len(self._recent) + sum(len(hashes) for _, hashes, _ in self._frozen)

    def __bool__(self) -> bool:
        return bool(self._recent) or bool(self._frozen)

    @property
    def nbytes(self) -> int:
        """About how many bytes the record holds (a set entry and an int for each recent hash)."""
        return 70 * len(self._recent) + sum(9 * len(hashes) for _, hashes, _ in self._frozen)

    def add(self, key_hash: int, index: int) -> None:
        """Record eviction number ``index`` (``index`` never decreases), of the key whose hash is
        ``key_hash``."""
        if index // self.chunk != self._chunk_id:
            self._move_to(index)
        self._recent.add(key_hash)

    def add_many(self, key_hashes: list[int | None], first: int) -> None:
        """``add`` each of ``key_hashes`` at indices ``first, first + 1, ...``; ``None`` stands for
        an eviction with nothing to remember."""
        chunk = self.chunk
        at = 0
        while at < len(key_hashes):
            index = first + at
            if index // chunk != self._chunk_id:
                self._move_to(index)
            end = min(len(key_hashes), (self._chunk_id + 1) * chunk - first)  # (this chunk's part of the batch)
            self._recent.update(key_hashes[at:end])
            at = end
        self._recent.discard(None)

    def take(self, key_hash: int, now: int) -> bool:
        """Whether the key whose hash is ``key_hash`` was evicted lately, ``now`` being the index
        the next eviction will get; if so, forget it (an eviction is asked for again at most
        once). Newest first."""
        if now // self.chunk != self._chunk_id:
            self._move_to(now)
        recent = self._recent
        if key_hash in recent:
            recent.discard(key_hash)
            return True
        for _, hashes, taken in reversed(self._frozen):
            at = bisect_left(hashes, key_hash)
            if at < len(hashes) and hashes[at] == key_hash and not taken[at]:
                taken[at] = 1
                return True
        return False

    def _move_to(self, index: int) -> None:
        """Make the chunk of eviction ``index`` the current one: freeze the current one, drop what
        lies wholly past the window."""
        if self._recent:
            hashes = sorted(h for h in self._recent if h is not None)
            self._frozen.append((self._chunk_id, array("q", hashes), bytearray(len(hashes))))
            self._recent = set()
        self._chunk_id = index // self.chunk
        oldest = self._chunk_id - self.window // self.chunk  # (the oldest chunk still held)
        frozen = self._frozen
        while frozen and frozen[0][0] < oldest:
            frozen.popleft()
