"""``pagesim.sim.step_sums.chunk_sums`` against its definition: per key, ``math.fsum`` of the products
as a Python list, computed here independently (the shortcuts it takes for all-zero columns and
for chunks whose every step holds blocks must give the same floats, bit for bit)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.sim.step_sums import SUM_COLUMNS, SUM_KEYS, chunk_sums
from tests.conftest import scaled_examples


def reference(c: dict[str, np.ndarray]) -> tuple[float, ...]:
    dur, allocated, used = c["duration_s"], c["allocated_slots"], c["used_slots"]
    total = np.maximum(c["total_slots"], 1)
    held = allocated > 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        parts = (
            dur, dur[held], (used[held] / allocated[held]) * dur[held], (allocated / total) * dur,
            (used / total) * dur, (1.0 - allocated[held] / c["unshared_slots"][held]) * dur[held],
            c["num_requests"] * dur, c["num_running"] * dur, c["swap_out_blocks"], c["swap_in_blocks"],
            c["cow_blocks"],
        )
    return tuple(math.fsum(values.tolist()) for values in parts)


def bits(values) -> list[int]:
    return [struct.unpack("<q", struct.pack("<d", v))[0] for v in values]


counts = st.sampled_from([0.0, -0.0, 1.0, 3.0, 16.0, 160.0, 1e6])
durations = st.one_of(st.sampled_from([0.0, -0.0, 1e-3]), st.floats(1e-9, 10.0))


@st.composite
def chunks(draw):
    n = draw(st.integers(0, 12))
    c = {}
    for name in SUM_COLUMNS:
        elements = durations if name == "duration_s" else counts
        if name in ("swap_out_blocks", "swap_in_blocks", "cow_blocks") and draw(st.booleans()):
            elements = st.sampled_from([0.0, -0.0])  # (no swaps: zeros, of either sign)
        c[name] = np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=np.float64)
    if draw(st.booleans()):  # (the usual chunk: every step holds blocks)
        c["allocated_slots"] = np.maximum(c["allocated_slots"], 16.0)
    if draw(st.booleans()):  # (the usual chunk too: every step's batch is all the running requests)
        c["num_running"] = c["num_requests"].copy()
    return c


@settings(max_examples=scaled_examples(300), deadline=None)
@given(chunks())
def test_chunk_sums_are_the_definitions_exact_sums(c):
    try:
        expected = reference(c)
    except (ValueError, OverflowError) as exc:  # (inf - inf from impossible counts: the same error)
        with pytest.raises(type(exc)):
            chunk_sums(c)
        return
    got = chunk_sums(c)
    assert len(got) == len(SUM_KEYS)
    assert bits(got) == bits(expected)


def test_steps_holding_no_blocks_are_left_out_of_held_time():
    """The case a first version got wrong: held_s (and what is weighted by it) only over steps
    that hold blocks, not busy_s."""
    c = {name: np.array([1.0, 2.0]) for name in SUM_COLUMNS}
    c["allocated_slots"] = np.array([0.0, 5.0])
    sums = dict(zip(SUM_KEYS, chunk_sums(c)))
    assert sums["busy_s"] == 3.0 and sums["held_s"] == 2.0
    assert bits(chunk_sums(c)) == bits(reference(c))


def test_running_counts_equal_but_for_the_sign_of_zero_keep_their_own_sum():
    """running_x_s reuses batched_x_s's sum only for bit-identical columns: -0.0 running
    requests are summed on their own (``math.fsum`` of only -0.0 is -0.0 from Python 3.12,
    +0.0 before), whatever the Python."""
    c = {name: np.array([1.0]) for name in SUM_COLUMNS}
    c["num_requests"], c["num_running"] = np.array([0.0]), np.array([-0.0])
    assert bits(chunk_sums(c)) == bits(reference(c))
