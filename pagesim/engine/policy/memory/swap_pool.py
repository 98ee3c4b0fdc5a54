"""The CPU swap pool: where a preempted request's KV blocks wait when the mode is *swap*.

Its own capacity (``num_cpu_blocks``), its own reference counts (a GPU block shared by two
sequences can go out once and be shared on the CPU too), and a LIFO free list like vLLM v0's CPU
allocator (ids ``0 .. num_cpu_blocks-1``, taken from the front, returned to the front).

Invariants: ``num_free_blocks + num_used_blocks == num_blocks``; a block on the free list has
count 0; every count equals the number of swapped-out tables holding the block. ``on_release``
(default ``None``) is called with a block id when its count reaches 0 (see ``BlockPool``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class SwapSpaceExhausted(RuntimeError):
    """Not enough CPU blocks for a swap-out (the scheduler checks first and falls back)."""


class SwapPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts: list[int] = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self.on_release: Callable[[int], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise SwapSpaceExhausted(f"all {self.num_blocks} CPU swap blocks are in use")
        block_id = self._free.popleft()
        self.ref_counts[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        assert self.ref_counts[block_id] > 0
        self.ref_counts[block_id] += 1

    def free(self, block_id: int) -> None:
        count = self.ref_counts[block_id] - 1
        assert count >= 0, f"CPU block {block_id} freed more often than referenced"
        self.ref_counts[block_id] = count
        if count == 0:
            self._free.appendleft(block_id)
            if self.on_release is not None:
                self.on_release(block_id)

    def check(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free)
        for block_id, count in enumerate(self.ref_counts):
            assert (count == 0) == (block_id in free), f"CPU block {block_id}: ref {count}"
