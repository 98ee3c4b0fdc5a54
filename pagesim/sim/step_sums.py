"""The sums over steps that the summary's step figures are ratios of, one chunk of rows at a time.

``chunk_sums`` takes one chunk of a step table (``SUM_COLUMNS``, as ``StepMetrics.iter_chunks``
yields them) and returns, per ``SUM_KEYS``, the exact sum (``math.fsum``'s float, computed in
vectorized passes by ``pagesim.sim.exact_sum``) of that chunk's products (duration-weighted memory
fractions, batch sizes, ...); ``total_sums`` adds the chunks' sums exactly again.
``StepMetrics`` takes the sums of a chunk when it leaves memory, so the summary reads no column
back from disk (and a summary store, ``keep_rows=False``, need not write them at all).

Invariants: a chunk's sums depend only on its rows as a multiset (``fsum`` is exact, rounded
once), never on their order within the chunk; the totals depend on how rows are split into
chunks (each chunk's sum is rounded once), which ``StepMetrics`` fixes at ``chunk_rows`` rows
per chunk in recording order, the last one partial.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from pagesim.sim.exact_sum import exact_sum

SUM_COLUMNS = ("duration_s", "allocated_slots", "used_slots", "total_slots", "unshared_slots", "num_requests",
               "num_running", "swap_out_blocks", "swap_in_blocks", "cow_blocks")  # (what chunk_sums reads)
SUM_KEYS = ("busy_s", "held_s", "utilization_x_s", "allocated_fraction_x_s", "used_fraction_x_s",
            "sharing_saved_x_s", "batched_x_s", "running_x_s", "swap_out_blocks", "swap_in_blocks", "cow_blocks")


def chunk_sums(c: Mapping[str, np.ndarray]) -> tuple[float, ...]:
    """Per ``SUM_KEYS``, the exact sum of one chunk's values (``c``: each of ``SUM_COLUMNS``, one
    contiguous float64 array per column, all of one length)."""
    dur = c["duration_s"]
    allocated = c["allocated_slots"]
    used = c["used_slots"]
    total = np.maximum(c["total_slots"], 1)
    held = allocated > 0
    all_held = bool(held.all())
    if all_held:  # (the usual: every step holds blocks; the same values without the copies)
        held_dur, held_allocated, held_used, held_unshared = dur, allocated, used, c["unshared_slots"]
    else:
        held_dur, held_allocated, held_used, held_unshared = dur[held], allocated[held], used[held], c["unshared_slots"][held]
    with np.errstate(invalid="ignore", divide="ignore"):
        batched = c["num_requests"] * dur
        parts = (
            dur,  # busy_s
            held_dur,  # held_s
            (held_used / held_allocated) * held_dur,  # utilization_x_s
            (allocated / total) * dur,  # allocated_fraction_x_s
            (used / total) * dur,  # used_fraction_x_s
            (1.0 - held_allocated / held_unshared) * held_dur,  # sharing_saved_x_s
            batched,  # batched_x_s
            # (the usual: every step's batch is all the running requests: the same values, compared
            # bit for bit, so the same floats)
            batched if np.array_equal(c["num_running"].view(np.int64), c["num_requests"].view(np.int64))
            else c["num_running"] * dur,  # running_x_s
            c["swap_out_blocks"],
            c["swap_in_blocks"],
            c["cow_blocks"],
        )
    sums: list[float] = []
    summed: dict[int, float] = {}  # id of a part already summed -> its sum
    for values in parts:
        if id(values) in summed:  # the same array as an earlier part, so the same sum (held_s
            sums.append(summed[id(values)])  # when every step held blocks, running_x_s as batched_x_s)
            continue
        if values.any() or np.signbit(values).all():  # (math.fsum's float, in a few vectorized passes)
            sums.append(exact_sum(values))
        else:  # (zeros of both signs, or only +0.0, e.g. no swaps: what fsum gives them, without the pass)
            sums.append(0.0)
        summed[id(values)] = sums[-1]
    return tuple(sums)


def total_sums(per_chunk: Iterable[tuple[float, ...]]) -> dict[str, float]:
    """``SUM_KEYS`` -> the exact sum of the chunks' sums (``chunk_sums`` of each chunk, in order)."""
    sums: list[list[float]] = [[] for _ in SUM_KEYS]
    for chunk in per_chunk:
        for values, value in zip(sums, chunk):
            values.append(value)
    return {k: math.fsum(values) for k, values in zip(SUM_KEYS, sums)}
