"""What vLLM 0.15's CPU offload manager spends per step when its store is full of pinned blocks:
the two constants of ``pagesim.sim.cost.connector_cpu``, measured on this machine.

vLLM 0.15.1's LRU offloading manager keeps every stored block in an ``OrderedDict`` (block hash ->
a ``ctypes`` structure holding an ``int32`` reference count, -1 while its store is in flight, which
the CPU backend subclasses to add the block's slot) and,
to make room for a store, walks it from the least recently used end for blocks whose count is 0;
when too few are, it has walked all of them and refuses the offer, and the connector writes a
warning line to the log (``Request ...: cannot store N blocks``). This script builds the same
structures (our own code, the same Python operations) and times:

1. the walk, per entry, through a store whose blocks are all pinned (``offload_scan_entry_s``),
   fresh (entries in allocation order) and *touched* (as a long run leaves it: the blocks
   allocated among other objects, the order shuffled by LRU touches), which is the case that
   matters and costs more (the walk follows scattered nodes);
2. a refused offer besides the walk: filtering the offered hashes against the store and the
   warning written through ``logging`` to a file with vLLM's log format (``offload_refusal_s``).

Run it with the Python vLLM's image runs (3.12 for vllm/vllm-openai v0.15.1):
``python3.12 benchmarks/bench_offload_scan.py`` (about 20 s). The constants in
``pagesim/sim/cost/connector_cpu.py`` are its figures for the touched store, rounded, on this
project's x86 machine (Intel Xeon, 2 cores).
"""

from __future__ import annotations

import ctypes
import logging
import random
import sys
import tempfile
import timeit
from collections import OrderedDict
from pathlib import Path


class Status(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32)]

    def __init__(self) -> None:
        super().__init__()
        self.ref_cnt = -1


class Pinned(Status):
    """A CPU block's status as the CPU backend subclasses it: the count, then the slot."""

    _fields_ = Status._fields_ + [("block_id", ctypes.c_int64)]


def walk(blocks: OrderedDict, need: int) -> list | None:
    """Victims with reference count 0, from the least recently used end (None: too few)."""
    found = []
    for key, block in blocks.items():
        if block.ref_cnt == 0:
            found.append(key)
            if len(found) == need:
                return found
    return None


def best_of(fn, repeats: int = 7) -> float:
    """The fastest of ``repeats`` calls of ``fn``, in seconds."""
    return min(timeit.repeat(fn, number=1, repeat=repeats))


def build_store(n: int, touched: bool, rng: random.Random) -> tuple[OrderedDict, list]:
    """A store of ``n`` pinned blocks. ``touched``: as a long run leaves it, each block allocated
    among other objects (the requests' own) and the order shuffled by LRU touches (``move_to_end``
    in random order); else fresh, in allocation order."""
    blocks: OrderedDict = OrderedDict()
    others = []
    for _ in range(n):
        if touched:
            others.append([rng.randbytes(40) for _ in range(20)])
        blocks[rng.randbytes(32)] = Pinned()  # (vLLM 0.15's block hashes: 32-byte digests)
    if touched:
        keys = list(blocks)
        for _ in range(20 * n):
            blocks.move_to_end(rng.choice(keys))
    return blocks, others


def main() -> int:
    rng = random.Random(0)
    print(f"walk through a store of pinned blocks (vLLM 0.15's LRU manager, refused offer), "
          f"Python {sys.version.split()[0]}:")
    touched_ns = []
    for touched in (False, True):
        for n in (1024, 4096, 16384):
            blocks, _others = build_store(n, touched, rng)
            reps = max(1, 200_000 // n)
            seconds = best_of(lambda: [walk(blocks, 1) for _ in range(reps)]) / reps
            if touched:
                touched_ns.append(seconds / n * 1e9)
            print(f"  {'touched' if touched else 'fresh':>7}, {n:>6,} entries: {seconds * 1e3:7.3f} ms a walk, "
                  f"{seconds / n * 1e9:5.1f} ns an entry")
    with tempfile.TemporaryDirectory() as tmp:
        logger = logging.getLogger("bench.offload")
        logger.propagate = False
        handler = logging.FileHandler(Path(tmp) / "vllm.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        blocks, _others = build_store(4096, False, rng)
        offered = [rng.randbytes(32) for _ in range(64)]

        def refuse_rest() -> None:
            for _ in range(2000):
                new = [h for h in offered if h not in blocks]
                logger.warning("Request %s: cannot store %s blocks", "cmpl-0123456789abcdef-0", len(new))

        refusal = best_of(refuse_rest, 5) / 2000
        handler.close()
        logger.removeHandler(handler)
    print(f"a refused offer besides the walk (64 offered hashes filtered, one warning logged to a file): "
          f"{refusal * 1e6:.1f} us")
    print(f"touched store, median: {sorted(touched_ns)[1]:.0f} ns an entry")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
