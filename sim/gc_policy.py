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

A process that runs many simulations (a study's worker) collects in full before it freezes again
(``_collect_before_freezing``): the previous run's deployment (scheduler, block pool, prefix cache:
a reference cycle, made before that run froze and so unfrozen into the oldest generation) is
garbage by then, and a frozen object is never collected. Without that, nothing ever collected it:
``gc.freeze()`` also zeroes the young generation's count, so short runs never reached a
threshold, and a study's worker grew by about 7 MB a run (issue 56: 3.25 GB after 955 runs of
``llama3-8b``). The collection walks the ~35,000 objects such a worker holds between runs (about
10 ms; its runs of 100 requests take about 50 ms on a busy 2-core machine).

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
from collections.abc import Iterator

#: The young generation's threshold during a run (CPython's default: 700).
YOUNG_THRESHOLD = 10_000
#: Whether a run of this process has unfrozen objects (which may be garbage now) since the last
#: full collection before a freeze.
_collect_before_freezing = False


@contextlib.contextmanager
def collecting_less() -> Iterator[None]:
    """Freeze the objects that exist now and collect young objects less often, until the block ends."""
    global _collect_before_freezing
    thresholds = gc.get_threshold()
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        if _collect_before_freezing:  # an earlier run's objects, garbage now, would be frozen forever
            gc.collect()
            _collect_before_freezing = False
        gc.freeze()
    if thresholds[0]:  # (0: the caller turned automatic collection off; left so)
        gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()
            _collect_before_freezing = True
