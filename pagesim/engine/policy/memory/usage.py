"""What the KV cache holds at one moment, in token slots: the memory figures a run reports.

Every scheduler (paged or contiguous) answers ``kv_usage()`` with one ``KvUsage``, so an executor
can sample memory without knowing how it is organised:

- ``total_slots``: slots the cache has (usable blocks x block size, or the contiguous capacity);
- ``allocated_slots``: slots held by some request (blocks with a reference, or reserved slabs);
- ``used_slots``: of those, slots holding a token's K/V. ``allocated - used`` is internal
  fragmentation: the idle tail of each last block under paging, and everything reserved for
  tokens not yet generated under contiguous reservation;
- ``cached_slots``: slots of blocks nobody holds but the prefix cache keeps (reclaimable);
- ``unshared_slots``: what the allocated blocks would take if no block were shared (each
  sequence counting its whole table): ``1 - allocated / unshared`` is the share saved by sharing
  (the paper's Fig. 15).

Invariants: ``used <= allocated <= unshared``; ``allocated + cached <= total``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvUsage:
    total_slots: int
    allocated_slots: int
    used_slots: int
    cached_slots: int
    unshared_slots: int

    # Written out as engine.policy.output.ScheduledSequence's is (a plain store in a compiled build).
    def __init__(self, total_slots: int, allocated_slots: int, used_slots: int, cached_slots: int,
                 unshared_slots: int) -> None:
        object.__setattr__(self, "total_slots", total_slots)
        object.__setattr__(self, "allocated_slots", allocated_slots)
        object.__setattr__(self, "used_slots", used_slots)
        object.__setattr__(self, "cached_slots", cached_slots)
        object.__setattr__(self, "unshared_slots", unshared_slots)

    @property
    def free_slots(self) -> int:
        return self.total_slots - self.allocated_slots - self.cached_slots

    @property
    def internal_fragmentation_slots(self) -> int:
        return self.allocated_slots - self.used_slots
