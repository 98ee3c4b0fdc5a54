"""Buddy placement of contiguous KV-cache slabs: what the PagedAttention paper assumed Orca used.

Kwon et al. (SOSP 2023, §6.1) implement their Orca baselines "assuming it uses the buddy
allocation algorithm to determine the memory address to store KV cache". A buddy allocator hands
out blocks of ``2**k`` slots: a request for ``n`` slots takes the smallest power of two >= ``n``
(the rounding is one more internal fragmentation), splitting a larger free block in halves
("buddies") as needed; a freed block merges with its buddy whenever that is free too.

The cache's capacity need not be a power of two, so it is cut into *arenas*, its binary
decomposition from slot 0 (15,728 slots = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 32 + 16):
each arena starts at a multiple of its own size, and blocks never merge across arenas.

Choices are deterministic: the lowest-addressed free block of the smallest sufficient order.

Invariants (``check``): free blocks and the allocated blocks the caller holds tile the capacity;
every free block lies in one arena, aligned to its size inside it; no free block's buddy is free
at the same order (merging is eager).
"""

from __future__ import annotations

import bisect


def order_for(num_slots: int) -> int:
    """The order ``k`` of the smallest block (``2**k`` slots) that holds ``num_slots``."""
    return max(0, (num_slots - 1).bit_length())


class BuddySpace:
    def __init__(self, capacity_slots: int):
        if isinstance(capacity_slots, bool) or not isinstance(capacity_slots, int) or capacity_slots <= 0:
            raise ValueError(f"capacity_slots must be a positive int, got {capacity_slots!r}")
        self.capacity_slots = capacity_slots
        self._arena_starts: list[int] = []
        self._arena_orders: list[int] = []
        start, remaining = 0, capacity_slots
        while remaining:
            order = remaining.bit_length() - 1
            self._arena_starts.append(start)
            self._arena_orders.append(order)
            start += 1 << order
            remaining -= 1 << order
        self.max_order = self._arena_orders[0]
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        for s, o in zip(self._arena_starts, self._arena_orders):
            self._free[o].add(s)

    # ------------------------------------------------------------------ queries
    def block_slots(self, num_slots: int) -> int:
        """Slots a request of ``num_slots`` takes (rounded up to a power of two)."""
        return 1 << order_for(num_slots)

    def fits_ever(self, num_slots: int) -> bool:
        return order_for(num_slots) <= self.max_order

    def can_allocate(self, num_slots: int) -> bool:
        k = order_for(num_slots)
        return any(self._free[j] for j in range(k, self.max_order + 1))

    @property
    def largest_free_slots(self) -> int:
        for j in range(self.max_order, -1, -1):
            if self._free[j]:
                return 1 << j
        return 0

    @property
    def num_free_slots(self) -> int:
        return sum(len(blocks) << j for j, blocks in enumerate(self._free))

    def holes(self) -> list[tuple[int, int]]:
        """Free blocks as ``(start_slot, num_slots)``, sorted by start."""
        return sorted((s, 1 << j) for j, blocks in enumerate(self._free) for s in blocks)

    # --------------------------------------------------------------- allocation
    def allocate(self, num_slots: int) -> tuple[int, int] | None:
        """``(start_slot, block_slots)`` of a block holding ``num_slots``, or ``None`` if none is free."""
        k = order_for(num_slots)
        for j in range(k, self.max_order + 1):
            if self._free[j]:
                start = min(self._free[j])
                self._free[j].remove(start)
                while j > k:  # split: keep the lower half, free the upper
                    j -= 1
                    self._free[j].add(start + (1 << j))
                return start, 1 << k
        return None

    def free(self, start_slot: int, block_slots: int) -> None:
        k = block_slots.bit_length() - 1
        assert block_slots == 1 << k, f"not a buddy block: {block_slots} slots"
        arena = bisect.bisect_right(self._arena_starts, start_slot) - 1
        base, arena_order = self._arena_starts[arena], self._arena_orders[arena]
        start = start_slot
        while k < arena_order:
            buddy = base + ((start - base) ^ (1 << k))
            if buddy not in self._free[k]:
                break
            self._free[k].remove(buddy)
            start = min(start, buddy)
            k += 1
        self._free[k].add(start)

    # ------------------------------------------------------------------ checking
    def check(self, allocated: list[tuple[int, int]]) -> None:
        """Assert the invariants, given the blocks the caller holds as ``(start, slots)``."""
        cursor = 0
        for start, size in sorted(self.holes() + list(allocated)):
            assert start == cursor, f"gap or overlap at slot {cursor} (next block starts at {start})"
            cursor = start + size
        assert cursor == self.capacity_slots
        for j, blocks in enumerate(self._free):
            for s in blocks:
                arena = bisect.bisect_right(self._arena_starts, s) - 1
                base, arena_order = self._arena_starts[arena], self._arena_orders[arena]
                assert j <= arena_order and (s - base) % (1 << j) == 0, f"free block {s} of order {j} misplaced"
                if j < arena_order:
                    assert base + ((s - base) ^ (1 << j)) not in blocks, f"free buddies {s} not merged at order {j}"
