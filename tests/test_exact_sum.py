"""``pagesim.sim.exact_sum.exact_sum`` against ``math.fsum``: the same float, bit for bit (or the same
error), on arrays drawn to be hard: values over hundreds of binades, cancellations to zero and
to one unit in the last place, ties between two floats, subnormals, NaN and infinities, sizes
around powers of two (where the extraction's ``M`` steps) and the ones a step table's chunk has."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.sim.exact_sum import MIN_VECTORIZED, exact_sum
from tests.conftest import scaled_examples


def bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def fsum_or_error(values: np.ndarray):
    try:
        return bits(math.fsum(values.tolist()))
    except (ValueError, OverflowError) as exc:
        return type(exc)


def exact_or_error(values: np.ndarray):
    try:
        return bits(exact_sum(values))
    except (ValueError, OverflowError) as exc:
        return type(exc)


SIZES = st.one_of(st.integers(1, 2 * MIN_VECTORIZED), st.sampled_from([510, 511, 512, 513, 1022, 1023, 1024, 1025,
                                                                       4094, 4095, 4096, 32_766, 32_767, 32_768]))


@st.composite
def arrays(draw) -> np.ndarray:
    n = draw(SIZES)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["uniform", "top", "binades", "cancel", "ties", "grid", "subnormal", "special",
                                 "scaled"]))
    if kind == "uniform":  # (a step table's durations and their products)
        values = rng.random(n) * 10.0 ** draw(st.integers(-12, 12))
    elif kind == "top":  # one sign, all near the largest: the partial sums as large as they get
        values = rng.uniform(0.75, 1.0, n) * 2.0 ** draw(st.integers(-40, 40)) * draw(st.sampled_from([1.0, -1.0]))
    elif kind == "binades":  # signed, over a drawn range of binades
        spread = draw(st.integers(0, 700))
        values = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-spread // 2, spread // 2 + 1, n))
    elif kind == "cancel":  # big values that cancel, leaving the small ones
        big = rng.standard_normal(n // 2) * 1e18
        values = np.concatenate([big, -big, rng.standard_normal(n - 2 * (n // 2))])
        rng.shuffle(values)
    elif kind == "ties":  # an exact sum halfway between two floats
        values = np.zeros(max(n, 2))
        values[0] = 1.0
        values[1] = 2.0**-53 * (1 + 2 * draw(st.integers(0, 3)))  # 1 + an odd number of half-ulps
    elif kind == "grid":  # integers times one power of two: every partial sum near a float's limit
        values = rng.integers(-(2**52), 2**52, n).astype(np.float64) * 2.0 ** draw(st.integers(-80, 80))
    elif kind == "subnormal":
        values = np.ldexp(rng.integers(1, 2**20, n).astype(np.float64), rng.integers(-1100, -1000, n))
        values[rng.random(n) < 0.5] *= -1
    elif kind == "special":  # NaN, infinities and huge values among ordinary ones
        values = rng.standard_normal(n)
        for _ in range(draw(st.integers(1, 3))):
            values[rng.integers(0, n)] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 1.7e308, -1.7e308]))
    else:  # (a few values, many zeros of both signs)
        values = np.where(rng.random(n) < 0.9, rng.choice([0.0, -0.0], n), rng.standard_normal(n) * 1e-300)
    return np.ascontiguousarray(values, dtype=np.float64)


@settings(max_examples=scaled_examples(300), deadline=None)
@given(arrays())
def test_exact_sum_is_fsum_bit_for_bit(values):
    assert exact_or_error(values) == fsum_or_error(values)


@pytest.mark.parametrize("n", [MIN_VECTORIZED, 1000, 32_768])
def test_zeros_only_keep_fsums_sign(n):
    for zero in (0.0, -0.0):
        values = np.full(n, zero)
        assert bits(exact_sum(values)) == bits(math.fsum(values.tolist()))


def test_the_callers_array_is_not_written():
    values = np.random.default_rng(1).standard_normal(5000) * 1e10
    kept = values.copy()
    exact_sum(values)
    assert np.array_equal(values.view(np.int64), kept.view(np.int64))


def test_a_non_contiguous_column_sums_as_its_copy():
    block = np.random.default_rng(2).random((4, 3000))
    assert bits(exact_sum(block[:, 1])) == bits(math.fsum(block[:, 1].tolist()))
    assert bits(exact_sum(block[1, ::3])) == bits(math.fsum(block[1, ::3].tolist()))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_tie_broken_by_a_third_level(sign):
    """1 + 2**-53 is halfway between two floats and 2**-110 breaks the tie upwards: the levels
    (1, 2**-53, 2**-110) must be added exactly, then rounded once (left to right, 1 + 2**-53
    would round to even, to 1, first)."""
    values = np.zeros(MIN_VECTORIZED)
    values[:3] = sign * np.array([1.0, 2.0**-53, 2.0**-110])
    assert exact_sum(values) == math.fsum(values.tolist()) == sign * (1.0 + 2.0**-52)


@pytest.mark.parametrize("n", [1000, 1022, 4094, 32_766])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_values_all_near_the_largest(n, sign):
    """The partial sums of the first level reach their bound here (many values of one sign, all
    near the largest): a ``sigma`` one binade too small makes some of them round."""
    rng = np.random.default_rng(n)
    for _ in range(10):
        values = sign * rng.uniform(0.75, 1.0, n)
        assert bits(exact_sum(values)) == bits(math.fsum(values.tolist()))
