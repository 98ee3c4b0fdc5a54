"""Contiguous KV-cache reservation: the pre-PagedAttention baselines (the paper's Orca variants).

Before paging, a serving system gave each request one contiguous slab of KV-cache token slots,
sized at admission because the output length is unknown until the request ends:

- ``"max"``    reserves ``max_model_len`` slots (Orca (Max));
- ``"pow2"``   reserves the prompt plus the next power of two >= the output, capped at
  ``max_model_len`` (Orca (Pow2): "if the true output length is 25, it reserves 32 positions for
  outputs", §6.1: at most a 2x over-reservation of the output);
- ``"oracle"`` reserves exactly prompt + output (Orca (Oracle): knows the output length).

Slabs are placed in ONE linear address space of ``capacity_slots`` slots, first-fit (the
default) or by buddy allocation (``placement="buddy"``, ``buddy.py``: each slab rounded up to a
power of two, as the paper assumed Orca did), so the waste is measured, not assumed: *internal* fragmentation is reserved slots not (yet) holding a token — the
part reserved for future output included — and *external* fragmentation is free slots that lie
outside the largest hole, i.e. free memory that a large request still cannot use.

Accounting: ``allocate`` counts the prompt as written (the prefill that the admission triggers
writes the whole prompt's KV); ``append_tokens`` adds generated tokens, never past the reservation.

Invariants (``check()``): holes are sorted by start, disjoint and non-empty, and under first fit
coalesced (no two touch; buddy blocks merge only with their buddy, see ``buddy.py``); slabs and
holes tile the address space; reserved + free == capacity; each request has written <=
requested <= reserved slots. First fit is O(number of holes) per operation. Under buddy
placement the arena split of a capacity that is not a power of two counts as external
fragmentation even when the cache is empty (no request larger than the largest arena fits).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from pagesim.engine.policy.baselines.buddy import BuddySpace

RESERVATION_MODES = ("max", "pow2", "oracle")
PLACEMENTS = ("first-fit", "buddy")


@dataclass(slots=True)
class _Slab:
    """One request's contiguous reservation [start_slot, start_slot + num_reserved_slots). Under
    buddy placement the reserved block can exceed what the request asked for (``num_requested_slots``),
    and tokens are written only up to the latter."""

    start_slot: int
    num_reserved_slots: int
    num_written_slots: int
    num_requested_slots: int


class ContiguousAllocator:
    """Allocator of contiguous token-slot slabs in one linear address space (first fit or buddy)."""

    def __init__(self, capacity_slots: int, reservation: str, max_model_len: int, *,
                 placement: str = "first-fit") -> None:
        for arg_name, value in (
            ("capacity_slots", capacity_slots),
            ("max_model_len", max_model_len),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg_name} must be a positive int, got {value!r}")
        if reservation not in RESERVATION_MODES:
            raise ValueError(
                f"reservation must be one of {', '.join(RESERVATION_MODES)}, got {reservation!r}"
            )
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        self.capacity_slots = capacity_slots
        self.reservation = reservation
        self.placement = placement
        self._buddy = BuddySpace(capacity_slots) if placement == "buddy" else None
        self.max_model_len = max_model_len
        # Free holes as two parallel lists sorted by start; bisect finds a freed slab's neighbours.
        self._hole_starts: list[int] = [0]
        self._hole_sizes: list[int] = [capacity_slots]
        self._slabs: dict[object, _Slab] = {}
        self._num_reserved_slots = 0
        self._num_written_slots = 0

    # ---- sizing -------------------------------------------------------------------------------

    def reservation_slots(self, prompt_len: int, output_len: int) -> int:
        """Slots this allocator reserves for a request; ValueError for impossible lengths."""
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len <= 0:
            raise ValueError(f"prompt_len must be a positive int, got {prompt_len!r}")
        if isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 0:
            raise ValueError(f"output_len must be a non-negative int, got {output_len!r}")
        total_tokens = prompt_len + output_len
        if total_tokens > self.max_model_len:
            raise ValueError(
                f"prompt_len + output_len = {total_tokens} exceeds "
                f"max_model_len {self.max_model_len}"
            )
        if self.reservation == "max":
            return self.max_model_len
        if self.reservation == "pow2":
            output_slots = 1 << (output_len - 1).bit_length() if output_len else 0
            return min(prompt_len + output_slots, self.max_model_len)
        return total_tokens

    def _checked_reservation_slots(self, prompt_len: int, output_len: int) -> int:
        num_slots = self.reservation_slots(prompt_len, output_len)
        if num_slots > self.capacity_slots or (self._buddy is not None and not self._buddy.fits_ever(num_slots)):
            raise ValueError(
                f"a {self.reservation!r} reservation of {num_slots} slots can never fit in "
                f"capacity_slots={self.capacity_slots}"
            )
        return num_slots

    # ---- allocation ---------------------------------------------------------------------------

    def can_allocate(self, prompt_len: int, output_len: int) -> bool:
        """True when some hole is large enough now; ValueError when the request can never fit."""
        num_slots = self._checked_reservation_slots(prompt_len, output_len)
        if self._buddy is not None:
            return self._buddy.can_allocate(num_slots)
        return self._first_fit_index(num_slots) is not None

    def allocate(self, request_id: object, prompt_len: int, output_len: int) -> int | None:
        """Reserve a slab (first fit, or a buddy block) and return its start slot, or None when
        no hole is big enough.

        Raises ValueError for a duplicate request id or a request that could never fit
        (reservation > capacity, or prompt + output > max_model_len).
        """
        if request_id in self._slabs:
            raise ValueError(f"request {request_id!r} already holds a reservation")
        num_slots = self._checked_reservation_slots(prompt_len, output_len)
        if self._buddy is not None:  # the slab is the whole power-of-two block
            block = self._buddy.allocate(num_slots)
            if block is None:
                return None
            start_slot, block_slots = block
            self._slabs[request_id] = _Slab(start_slot, block_slots, prompt_len, num_slots)
            self._num_reserved_slots += block_slots
            self._num_written_slots += prompt_len
            return start_slot
        hole_index = self._first_fit_index(num_slots)
        if hole_index is None:
            return None
        start_slot = self._hole_starts[hole_index]
        remaining_slots = self._hole_sizes[hole_index] - num_slots
        if remaining_slots == 0:
            del self._hole_starts[hole_index]
            del self._hole_sizes[hole_index]
        else:  # keep the tail of the hole; it stays in sorted position
            self._hole_starts[hole_index] = start_slot + num_slots
            self._hole_sizes[hole_index] = remaining_slots
        self._slabs[request_id] = _Slab(start_slot, num_slots, prompt_len, num_slots)
        self._num_reserved_slots += num_slots
        self._num_written_slots += prompt_len
        return start_slot

    def append_tokens(self, request_id: object, num_tokens: int) -> None:
        """Record ``num_tokens`` generated tokens written into the request's slab."""
        slab = self._slab(request_id)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        if slab.num_written_slots + num_tokens > slab.num_requested_slots:
            raise ValueError(
                f"request {request_id!r}: writing {num_tokens} more tokens would make "
                f"{slab.num_written_slots + num_tokens}, past its reservation of "
                f"{slab.num_requested_slots} slots"
            )
        slab.num_written_slots += num_tokens
        self._num_written_slots += num_tokens

    def free(self, request_id: object) -> None:
        """Release the request's slab and merge it with the holes it touches."""
        slab = self._slab(request_id)
        del self._slabs[request_id]
        self._num_reserved_slots -= slab.num_reserved_slots
        self._num_written_slots -= slab.num_written_slots
        start_slot, num_slots = slab.start_slot, slab.num_reserved_slots
        if self._buddy is not None:
            self._buddy.free(start_slot, num_slots)
            return
        index = bisect.bisect_left(self._hole_starts, start_slot)
        end_slot = start_slot + num_slots
        merges_prev = (
            index > 0 and self._hole_starts[index - 1] + self._hole_sizes[index - 1] == start_slot
        )
        merges_next = index < len(self._hole_starts) and self._hole_starts[index] == end_slot
        if merges_prev and merges_next:
            self._hole_sizes[index - 1] += num_slots + self._hole_sizes[index]
            del self._hole_starts[index]
            del self._hole_sizes[index]
        elif merges_prev:
            self._hole_sizes[index - 1] += num_slots
        elif merges_next:
            self._hole_starts[index] = start_slot
            self._hole_sizes[index] += num_slots
        else:
            self._hole_starts.insert(index, start_slot)
            self._hole_sizes.insert(index, num_slots)

    # ---- queries ------------------------------------------------------------------------------

    def placed_slots(self, num_slots: int) -> int:
        """Slots a reservation of ``num_slots`` occupies once placed (buddy: a power of two)."""
        return num_slots if self._buddy is None else self._buddy.block_slots(num_slots)

    def could_ever_place(self, sizes: list[int]) -> bool:
        """Whether reservations of these sizes fit together in an empty address space."""
        if self._buddy is None:
            return sum(sizes) <= self.capacity_slots
        trial = BuddySpace(self.capacity_slots)
        return all(trial.allocate(size) is not None for size in sorted(sizes, reverse=True))

    def reserved_slots(self, request_id: object) -> int:
        """Slots the request's slab occupies (its block, under buddy placement)."""
        return self._slab(request_id).num_reserved_slots

    def start_slot(self, request_id: object) -> int:
        """First slot of the request's slab."""
        return self._slab(request_id).start_slot

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slabs

    def __len__(self) -> int:
        return len(self._slabs)

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Free holes as (start_slot, num_slots), sorted by start (buddy: the free blocks)."""
        if self._buddy is not None:
            return self._buddy.holes()
        return list(zip(self._hole_starts, self._hole_sizes))

    @property
    def num_used_slots(self) -> int:
        """Slots holding a written token."""
        return self._num_written_slots

    @property
    def num_reserved_slots(self) -> int:
        return self._num_reserved_slots

    @property
    def num_free_slots(self) -> int:
        return self.capacity_slots - self._num_reserved_slots

    @property
    def largest_hole_slots(self) -> int:
        if self._buddy is not None:
            return self._buddy.largest_free_slots
        return max(self._hole_sizes, default=0)

    @property
    def external_fragmentation_slots(self) -> int:
        """Free slots outside the largest hole: free, yet unusable by the largest request."""
        return self.num_free_slots - self.largest_hole_slots

    @property
    def internal_fragmentation_slots(self) -> int:
        """Reserved slots not holding a token, including those reserved for future output."""
        return self._num_reserved_slots - self._num_written_slots

    @property
    def memory_utilization(self) -> float:
        """Written / reserved slots; 0.0 when nothing is reserved."""
        if self._num_reserved_slots == 0:
            return 0.0
        return self._num_written_slots / self._num_reserved_slots

    def check(self) -> None:
        """Assert the module's invariants (O(holes + requests); for tests and debugging)."""
        if self._buddy is not None:
            self._buddy.check([(slab.start_slot, slab.num_reserved_slots) for slab in self._slabs.values()])
            assert self._buddy.num_free_slots == self.num_free_slots
            self._check_accounting()
            return
        assert len(self._hole_starts) == len(self._hole_sizes)
        previous_end = None
        for start, size in zip(self._hole_starts, self._hole_sizes):
            assert size > 0, f"empty hole at {start}"
            assert 0 <= start and start + size <= self.capacity_slots, f"hole {start}+{size}"
            # strictly greater: touching holes should have been coalesced
            assert previous_end is None or start > previous_end, f"holes touch at {start}"
            previous_end = start + size
        intervals = sorted(
            [(slab.start_slot, slab.num_reserved_slots, True) for slab in self._slabs.values()]
            + [(start, size, False) for start, size in zip(self._hole_starts, self._hole_sizes)]
        )
        # slabs and holes must tile [0, capacity) exactly
        cursor = 0
        for start, size, _is_slab in intervals:
            assert start == cursor, f"gap or overlap at slot {cursor} (next starts at {start})"
            cursor = start + size
        assert cursor == self.capacity_slots
        self._check_accounting()
        assert self._num_reserved_slots + sum(self._hole_sizes) == self.capacity_slots

    def _check_accounting(self) -> None:
        assert self._num_reserved_slots == sum(s.num_reserved_slots for s in self._slabs.values())
        assert self._num_written_slots == sum(s.num_written_slots for s in self._slabs.values())
        assert all(0 <= s.num_written_slots <= s.num_reserved_slots for s in self._slabs.values())

    # ---- helpers ------------------------------------------------------------------------------

    def _first_fit_index(self, num_slots: int) -> int | None:
        for index, size in enumerate(self._hole_sizes):
            if size >= num_slots:
                return index
        return None

    def _slab(self, request_id: object) -> _Slab:
        try:
            return self._slabs[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} holds no reservation") from None
