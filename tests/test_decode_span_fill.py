"""``DecodeSpan.fill`` writes many logged spans' rows at once, vectorized over the spans: it must
write exactly the rows it writes for each span alone, whatever the mix (terms given as one value,
as an array or as a list per step, gaps between spans for rows recorded in between, hybrid
counts). And the log behind the spans must lose nothing when a store refuses a span, when a
fill fails, or across many writes of a store."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.policy.fast_path.window_decode import HybridCounts
from pagesim.sim.cost.base import TERMS
from pagesim.sim.decode_spans import DecodeSpan, DecodeSpanLog
from pagesim.sim.step_metrics import NUM_COLUMNS, STEP_COLUMNS, StepMetrics
from tests.conftest import scaled_examples
from tests.test_step_metrics import random_row, record_row


class Handles:
    """A stand-in for ``StepMetrics``: keeps the handles ``record`` gives it."""

    def __init__(self):
        self.spans: list[DecodeSpan] = []

    def record_deferred(self, span: DecodeSpan) -> None:
        self.spans.append(span)


@st.composite
def span_args(draw, bs: int, hybrid: bool = False) -> dict:
    """The arguments of one ``DecodeSpanLog.record`` (``rows`` steps)."""
    k = draw(st.integers(1, 40))
    n = draw(st.integers(1, 6))
    start = draw(st.floats(0, 100))
    ends = start + np.cumsum(draw(st.lists(st.floats(1e-4, 1.0), min_size=k, max_size=k)))
    terms = {}
    for i, t in enumerate(TERMS):
        kind = draw(st.sampled_from(["absent", "value", "zero", "array", "list"]))
        if kind == "value":
            terms[t] = float(i) + 0.5
        elif kind == "zero":
            terms[t] = draw(st.sampled_from([0.0, -0.0]))
        elif kind != "absent":
            per_step = np.linspace(0.001, 0.002, k) + i
            terms[t] = per_step if kind == "array" else per_step.tolist()
    allocations = draw(st.lists(st.integers(0, n), min_size=k, max_size=k))
    counts = None
    if hybrid and draw(st.booleans()):
        counts = HybridCounts(k, draw(st.integers(2, 3)))
        for name in ("dropped", "freed", "cached"):
            setattr(counts, name, draw(st.lists(st.integers(0, 2), min_size=k, max_size=k)))
    return dict(
        rows=k, first_step=draw(st.integers(0, 10_000)), start_s=start,
        ends=ends if draw(st.booleans()) else ends.tolist() + [ends[-1] + 1.0],  # (a list may run past the span)
        terms=terms, num_requests=n, num_waiting=3, num_seqs=n, total_slots=64 * bs,
        used_blocks=draw(st.integers(0, 100)), cached_blocks=draw(st.integers(0, 100)),
        table_blocks=draw(st.integers(0, 100)), allocations=allocations,
        evictions=[draw(st.integers(0, a)) for a in allocations],
        sizes=draw(st.lists(st.integers(0, 6), min_size=bs, max_size=bs)), hybrid=counts)


@st.composite
def logged(draw) -> tuple[int, list[dict], list[int]]:
    bs = draw(st.sampled_from([4, 16]))
    hybrid = draw(st.booleans())
    spans, offsets, offset = [], [], 0
    for _ in range(draw(st.integers(1, 8))):
        offset += draw(st.integers(0, 2))  # rows recorded between spans
        spans.append(draw(span_args(bs, hybrid)))
        offsets.append(offset)
        offset += spans[-1]["rows"]
    return bs, spans, offsets


def fill_alone(bs: int, args: dict) -> np.ndarray:
    log, handles = DecodeSpanLog(bs), Handles()
    log.record(handles, **args)
    alone = np.full((NUM_COLUMNS, args["rows"]), np.nan)
    DecodeSpan.fill(handles.spans, [0], alone)
    return alone


@settings(max_examples=scaled_examples(60), deadline=None)
@given(logged())
def test_fill_of_many_spans_is_each_span_filled_alone(drawn):
    bs, spans, offsets = drawn
    log, handles = DecodeSpanLog(bs), Handles()
    for args in spans:
        log.record(handles, **args)
    total = offsets[-1] + spans[-1]["rows"]
    together = np.full((NUM_COLUMNS, total), np.nan)  # (column-major; rows between the spans stay NaN)
    DecodeSpan.fill(handles.spans, offsets, together)
    written = np.zeros(total, dtype=bool)
    for args, offset in zip(spans, offsets):
        alone = fill_alone(bs, args)
        assert not np.isnan(alone).any()  # (every row of the span is written: none keeps its NaN)
        k = args["rows"]
        for name in TERMS:  # a term given as one value (absent: +0.0) is that value on every row, else its steps'
            value = args["terms"].get(name, 0.0)
            want = np.full(k, value) if isinstance(value, float) else np.asarray(value, dtype=np.float64)[:k]
            column = alone[STEP_COLUMNS.index(f"{name}_s")]
            assert np.array_equal(column.view(np.int64), want.view(np.int64)), name
        assert np.array_equal(together[:, offset:offset + k].view(np.int64), alone.view(np.int64))
        written[offset:offset + k] = True
    assert np.isnan(together[:, ~written]).all()  # (and nothing else)


@settings(max_examples=scaled_examples(30), deadline=None)
@given(st.data(), st.sampled_from([1, 5, 8192]))
def test_a_store_holds_each_span_as_filled_alone_across_many_writes(data, limit):
    """Spans and rows recorded one by one, interleaved, written out whenever ``limit`` rows wait:
    the log forgets what was written and each span's rows are those it gives alone."""
    bs = data.draw(st.sampled_from([4, 16]))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    log = DecodeSpanLog(bs)
    expected = []
    with StepMetrics(chunk_rows=data.draw(st.sampled_from([3, 64]))) as store:
        store._deferred_limit = limit
        for _ in range(data.draw(st.integers(1, 10))):
            if data.draw(st.booleans()):
                args = data.draw(span_args(bs))
                log.record(store, **args)
                expected.append(fill_alone(bs, args))
            else:
                row = random_row(rng)
                record_row(store, row)
                expected.append(store_row(row))
        want = np.concatenate(expected, axis=1)
        for j, name in enumerate(STEP_COLUMNS):
            assert np.array_equal(store.array(name).view(np.int64), want[j].view(np.int64)), name
        # every span is written now: the next write forgets them, keeping only its own
        log.record(store, **fixed_args(bs, seed=1))
        store.array("step")
        assert len(log) == 1


def test_a_closed_store_leaves_the_log_as_it_was():
    bs = 4
    args = fixed_args(bs, seed=0)
    log = DecodeSpanLog(bs)
    store = StepMetrics(chunk_rows=8)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        log.record(store, **args)
    assert len(log) == 0 and arrays_of(log) == arrays_of(DecodeSpanLog(bs))


def test_a_span_that_fails_halfway_is_taken_out_again():
    """Whatever ``record`` appended of a span it could not log (here: ``evictions`` is not a
    list of counts, after every other field went in) is taken out, and the log goes on as before."""
    bs = 4
    log, handles = DecodeSpanLog(bs), Handles()
    first, second = fixed_args(bs, seed=6), fixed_args(bs, seed=7)
    log.record(handles, **first)
    before = arrays_of(log)
    with pytest.raises(TypeError):
        log.record(handles, **{**second, "evictions": None})
    assert arrays_of(log) == before and len(handles.spans) == 1
    log.record(handles, **second)
    block = np.full((NUM_COLUMNS, first["rows"] + second["rows"]), np.nan)
    DecodeSpan.fill(handles.spans, [0, first["rows"]], block)
    assert np.array_equal(block.view(np.int64),
                          np.concatenate([fill_alone(bs, first), fill_alone(bs, second)], axis=1).view(np.int64))


def arrays_of(log: DecodeSpanLog) -> list:
    """Everything a log holds, as lists."""
    attributes = vars(log) if hasattr(log, "__dict__") else log.__getstate__()  # (compiled: no __dict__)
    return [list(values) for name, values in sorted(attributes.items()) if name.startswith("_")
            and name != "_term_rows"] + [list(values) for values in log._term_rows]


def test_a_failing_fill_loses_nothing():
    """A write that fails (here: a block of the wrong shape) leaves every span to be written
    again, and the arrays behind them can still grow (no view of them outlives the failure)."""
    bs = 16
    first, second = fixed_args(bs, seed=2), fixed_args(bs, seed=3, k=7)
    log, handles = DecodeSpanLog(bs), Handles()
    log.record(handles, **first)
    with pytest.raises(IndexError):
        DecodeSpan.fill(handles.spans, [0], np.empty((NUM_COLUMNS, first["rows"] - 1)))
    log.record(handles, **second)  # (grows every array)
    block = np.full((NUM_COLUMNS, first["rows"] + second["rows"]), np.nan)
    DecodeSpan.fill(handles.spans, [0, first["rows"]], block)
    assert np.array_equal(block.view(np.int64),
                          np.concatenate([fill_alone(bs, first), fill_alone(bs, second)], axis=1).view(np.int64))


def test_spans_out_of_their_log_order_are_refused():
    bs = 4
    log, handles = DecodeSpanLog(bs), Handles()
    a, b = fixed_args(bs, seed=4), fixed_args(bs, seed=5)
    log.record(handles, **a)
    log.record(handles, **b)
    with pytest.raises(ValueError, match="not a run of their log's entries"):
        DecodeSpan.fill(handles.spans[::-1], [0, b["rows"]], np.empty((NUM_COLUMNS, a["rows"] + b["rows"])))


def store_row(row: dict[str, float]) -> np.ndarray:
    """``row`` as the one-column block ``record`` writes."""
    return np.array([[row[name]] for name in STEP_COLUMNS], dtype=np.float64)


def fixed_args(bs: int, seed: int, k: int = 5) -> dict:
    """The arguments of a ``record`` of ``k`` steps, from ``seed``: the decode term per step."""
    rng = random.Random(seed)
    ends = np.cumsum([rng.uniform(1e-3, 1e-2) for _ in range(k)])
    allocations = [rng.randint(0, 3) for _ in range(k)]
    return dict(rows=k, first_step=rng.randint(0, 1000), start_s=0.0, ends=ends,
                terms={"linear": 1e-3, "decode_attention": (ends / 7).tolist()}, num_requests=3, num_waiting=0,
                num_seqs=3, total_slots=64 * bs, used_blocks=10, cached_blocks=5, table_blocks=10,
                allocations=allocations, evictions=[min(a, 1) for a in allocations],
                sizes=[rng.randint(0, 2) for _ in range(bs)])
