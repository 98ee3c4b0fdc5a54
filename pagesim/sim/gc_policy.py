"""The cyclic garbage collector's settings while a simulation runs (``collecting_less``).

A run allocates container objects at a high rate (requests, their sequences, block tables, step
and scheduler outputs), and a request and its sequences form a reference cycle that only the
collector frees. With CPython's default thresholds (700, 10, 10) the Azure conversation trace
(19,366 requests) makes about 540 young-generation collections and 4 full ones, which walk every
long-lived object the set-up made (the trace's columns are arrays, but the replicas' block lists,
the cost model's tables and the modules are not). Measured on that trace (``gc.callbacks``
around ``pagesim simulate``): 0.18-0.21 s of collection in a 4.2 s run; with the set-up's objects
frozen and a young threshold of 10,000, 0.11 s.

``collecting_less()`` does that around a run and puts everything back after it, whatever
happened: the thresholds as they were, and the frozen objects back in the oldest generation. When
the caller has already frozen objects of its own (``gc.get_freeze_count()``), it leaves freezing
to the caller. Garbage cycles wait for fewer, larger collections: a young generation of 10,000
objects holds well under 10 MB.

A process that runs many simulations (a study's worker, a test session) collects in full before it
freezes again once enough may have become garbage: the previous runs' deployments (scheduler,
block pool, prefix cache: a reference cycle, made before their run froze and so unfrozen into the
oldest generation) are garbage by then, and a frozen object is never collected. Without that,
nothing ever collected them: ``gc.freeze()`` also zeroes the young generation's count, so short
runs never reached a threshold, and a study's worker grew by about 7 MB a run (issue 56: 3.25 GB
after 955 runs of ``llama3-8b``). The rule is CPython's own for a full collection (gcmodule.c:
when the objects that reached the oldest generation since the last full collection exceed a
quarter of those it left): the objects frozen are counted (``gc.get_freeze_count()``, a walk of
a list, far cheaper than a collection) and compared with the count frozen right after the last
full collection. So garbage stays under a quarter of what lives, and a process holding a large
heap (a test session: millions of objects) does not walk all of it before every short run, which
collecting before each run did (it doubled the skip-ahead tests' time); a study's worker (~35,000
objects between runs, each run's deployment a good part of that) still collects nearly every run.

Runs in one process may nest (each puts back what it found) but not overlap in threads: the
first to end would put the defaults back while the other still runs (pagesim runs simulations in
processes, one per case or worker).

Invariant: nothing observable by the simulation depends on when objects are collected (no
finalizer decides anything; ``StepMetrics``' finalizer only removes its spill directory), so the
settings change the run's wall time, never its results.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

#: The young generation's threshold during a run (CPython's default: 700).
YOUNG_THRESHOLD = 10_000
#: A full collection before a freeze once the objects to freeze exceed those frozen right after the
#: last one by this share (CPython's rule for its full collections: a quarter).
GROWTH_BEFORE_COLLECTING = 0.25
#: ... or once the process's resident memory exceeds what it was right after the last one by this
#: share, and at least ``RESIDENT_GROWTH_MIN_BYTES``: a run's deployment holds few objects but large
#: lists (a block pool's), so counting objects alone would let a large heap keep hundreds of them.
RESIDENT_GROWTH_MIN_BYTES = 64 * 2**20
#: Objects frozen, and resident bytes, right after this process's last full collection (None: none
#: made yet; the first run's set-up is kept, not collected).
_frozen_after_collecting: int | None = None
_resident_after_collecting: int | None = None


@contextlib.contextmanager
def collecting_less() -> Iterator[None]:
    """Freeze the objects that exist now and collect young objects less often, until the block ends."""
    thresholds = gc.get_threshold()
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        _freeze_collecting_when_grown()
    if thresholds[0]:  # (0: the caller turned automatic collection off; left so)
        gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()


def _freeze_collecting_when_grown() -> None:
    """``gc.freeze()``, after a full collection when the heap's objects or the resident memory grew
    past ``GROWTH_BEFORE_COLLECTING`` since the last one (earlier runs' objects, garbage now,
    would otherwise be frozen forever)."""
    global _frozen_after_collecting, _resident_after_collecting
    gc.freeze()
    frozen, resident = gc.get_freeze_count(), _resident_bytes()
    if _frozen_after_collecting is None:  # a process's first run: what exists is the set-up, kept
        _frozen_after_collecting, _resident_after_collecting = frozen, resident
        return
    grown = frozen > _frozen_after_collecting * (1 + GROWTH_BEFORE_COLLECTING)
    if resident is not None and _resident_after_collecting is not None:
        grown = grown or resident > _resident_after_collecting + max(
            RESIDENT_GROWTH_MIN_BYTES, _resident_after_collecting * GROWTH_BEFORE_COLLECTING)
    if grown:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _frozen_after_collecting, _resident_after_collecting = gc.get_freeze_count(), _resident_bytes()


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc/self/statm``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
