"""``DecodeSpan.fill`` writes many spans' rows at once, vectorized over the spans: it must write
exactly the rows it writes for each span alone, whatever the mix (block sizes, terms given as one
value or per step, gaps between spans for rows recorded in between)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost.base import TERMS
from sim.skip_ahead import DecodeSpan
from sim.step_metrics import NUM_COLUMNS
from tests.conftest import scaled_examples


@st.composite
def spans(draw) -> tuple[list[DecodeSpan], list[int]]:
    result, offsets, offset = [], [], 0
    for _ in range(draw(st.integers(1, 8))):
        offset += draw(st.integers(0, 2))  # rows recorded between spans
        k = draw(st.integers(1, 40))
        bs = draw(st.sampled_from([4, 16]))
        n = draw(st.integers(1, 6))
        start = draw(st.floats(0, 100))
        ends = start + np.cumsum(draw(st.lists(st.floats(1e-4, 1.0), min_size=k, max_size=k)))
        terms = tuple(np.linspace(0.001, 0.002, k) + i if draw(st.booleans()) else float(i) for i in range(len(TERMS)))
        allocations = draw(st.lists(st.integers(0, n), min_size=k, max_size=k))
        evictions = [draw(st.integers(0, a)) for a in allocations]
        sizes = draw(st.lists(st.integers(0, 6), min_size=bs, max_size=bs))  # sequences per bucket
        result.append(DecodeSpan(k, draw(st.integers(0, 10_000)), start, ends, terms, (n, n, 3, n, 64 * bs),
                                 draw(st.integers(0, 100)), draw(st.integers(0, 100)), draw(st.integers(0, 100)),
                                 allocations, evictions, bs, sizes))
        offsets.append(offset)
        offset += k
    return result, offsets


@settings(max_examples=scaled_examples(60), deadline=None)
@given(spans())
def test_fill_of_many_spans_is_each_span_filled_alone(drawn):
    group, offsets = drawn
    total = offsets[-1] + group[-1].rows
    together = np.full((NUM_COLUMNS, total), np.nan)  # (column-major; rows between the spans stay NaN)
    DecodeSpan.fill(group, offsets, together)
    written = np.zeros(total, dtype=bool)
    for span, offset in zip(group, offsets):
        alone = np.full((NUM_COLUMNS, span.rows), np.nan)
        DecodeSpan.fill([span], [0], alone)
        assert not np.isnan(alone).any()  # (every row of the span is written: none keeps its NaN)
        assert np.array_equal(together[:, offset:offset + span.rows].view(np.int64), alone.view(np.int64))
        written[offset:offset + span.rows] = True
    assert np.isnan(together[:, ~written]).all()  # (and nothing else)
