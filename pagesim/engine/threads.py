"""torch's CPU threads for the engine's commands (``run``, ``calibrate``, ``validate``): how many, set once.

torch starts one intra-op thread per core, whatever else runs on the machine. Its OpenMP workers
meet at the end of every parallel operation, so when another process takes one worker's core,
every operation waits for that worker's next time slice. The engine's operations are small (a
decode step of ``tiny`` is microseconds of arithmetic), so a worker that is not free costs far more
than the parallelism gains. Measured for issue 56 on a 2-core machine shared with other work (load
average 10-12) and two CPU-bound processes beside it, a 16-request ``pagesim run --model tiny
--workload kwon2023-alpaca``'s ``wall_s``: 83, 95 and 102 s with torch's default (2 threads here),
2.7, 3.8 and 3.3 s with one; ``small``, with one CPU-bound process beside it (load about 5): 20 s
and 46 s with 2 threads, 1.0 s with one.

- ``default_threads``: ``OMP_NUM_THREADS`` when set (the user said how many); otherwise the CPUs
  this process may use (its affinity, and a cgroup CPU quota where one is set) less the 1-minute
  load average, rounded, and at least 1: a machine that others keep busy gets one thread, a quiet
  one all its CPUs. ``run`` uses it; ``calibrate`` defaults to 1 (a profile must be steady, and the
  probe's CPU-share check assumes one thread); ``validate`` to the profile's count (the engine is
  timed as the profile was). ``--threads N`` overrides each.
- ``set_threads``: torch's intra-op threads on every call; its inter-op threads too, but only the
  first time in a process and only before any inter-op work (torch refuses it after that: the pool
  then keeps its size, which the engine does not use for its own work).
"""

from __future__ import annotations

import math
import os

THREADS_HELP = "torch's CPU threads"  # the start of each command's --threads help


def add_threads_arg(parser, default_words: str) -> None:
    """``--threads N`` with the command's own default, described in ``default_words``."""
    parser.add_argument("--threads", type=int, metavar="N", help=f"{THREADS_HELP} ({default_words})")


def checked_threads(threads: int | None) -> int | None:
    """``--threads`` as given (None: the command's default), refused below 1."""
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    return threads


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, capped by a cgroup (v2) CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    """``/sys/fs/cgroup/cpu.max`` as CPUs (``200000 100000``: 2.0); None where there is no quota."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    """``OMP_NUM_THREADS`` if set to a positive count; else usable CPUs less the load, at least 1."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, usable_cpus() - round(load))


_interop_set = False  # torch.set_num_interop_threads may be called once per process


def set_threads(threads: int) -> int:
    """Give torch ``threads`` intra-op threads (and, once per process, inter-op threads); returns
    the intra-op count torch now reports."""
    import torch

    global _interop_set
    if not _interop_set:
        _interop_set = True
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # inter-op work already ran in this process (a test suite, a caller of main)
            pass
    torch.set_num_threads(threads)
    return torch.get_num_threads()
