"""``StepMetrics``: the chunked, spilling per-step store against a trusted in-memory model.

The model is a Python list of rows and, per cost term, ``total += v`` row by row (what the store
did before it spilled). Rows carry values of very different magnitudes and signs (1e-12 to 1e16)
so any change in summation order shows up in the last bit; values are compared as bit patterns.
Tiny ``chunk_rows`` make every few rows a spill and make ``record_many`` batches straddle chunks.
"""

from __future__ import annotations

import gc
import os
import random

import numpy as np
import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagesim.engine.policy.memory.usage import KvUsage
from pagesim.sim.cost.base import TERMS, StepCost, StepWork
from pagesim.sim.bench_metrics import Slo
from pagesim.sim.metrics import COMPLETED, RequestMetrics, summarize
from pagesim.sim.step_metrics import KEPT_COLUMNS, NUM_COLUMNS, STEP_COLUMNS, StepMetrics
from pagesim.sim.step_sums import SUM_COLUMNS, SUM_KEYS, chunk_sums

MAGNITUDES = (1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e4, 1e8, 1e16)


#: The columns a ``KvUsage`` carries: slot counts, ints (a compiled build checks the type).
SLOT_COLUMNS = ("total_slots", "allocated_slots", "used_slots", "cached_slots", "unshared_slots")


def random_row(rng: random.Random) -> dict[str, float]:
    row = {name: rng.choice((1, 1, -1)) * rng.choice(MAGNITUDES) * rng.random() for name in STEP_COLUMNS}
    for name in SLOT_COLUMNS:  # (never 0, as the floats above never are; of magnitudes a float64 holds exactly)
        row[name] = rng.choice((1, 1, -1)) * int(rng.choice((1, 1e3, 1e8, 1e15)) * (1 + rng.random()))
    return row


def record_row(store: StepMetrics, row: dict[str, float]) -> None:
    """One ``record`` call carrying ``row`` through the objects the simulator passes."""
    work = StepWork(num_seqs=row["num_seqs"], num_tokens=row["num_tokens"], num_prefill_tokens=row["prefill_tokens"],
                    num_decode_seqs=row["decode_seqs"], num_cow_blocks=row["cow_blocks"],
                    num_swap_out_blocks=row["swap_out_blocks"], num_swap_in_blocks=row["swap_in_blocks"])
    usage = KvUsage(total_slots=row["total_slots"], allocated_slots=row["allocated_slots"],
                    used_slots=row["used_slots"], cached_slots=row["cached_slots"],
                    unshared_slots=row["unshared_slots"])
    cost = StepCost({t: row[f"{t}_s"] for t in TERMS})
    store.record(row["step"], row["start_s"], row["duration_s"], row["num_requests"], row["num_running"], row["num_waiting"],
                 work, usage, row["preempted"], cost)


def as_columns(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {name: np.array([r[name] for r in rows], dtype=np.float64) for name in STEP_COLUMNS}


def sequential_totals(rows: list[dict[str, float]]) -> dict[str, float]:
    totals = dict.fromkeys(TERMS, 0.0)
    for row in rows:
        for t in TERMS:
            totals[t] += row[f"{t}_s"]
    return totals


def bits(values) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()


def assert_holds(store: StepMetrics, rows: list[dict[str, float]]) -> None:
    assert len(store) == len(rows)
    expected = as_columns(rows)
    for name in STEP_COLUMNS:
        got = store.array(name)
        assert got.dtype == np.float64 and got.shape == (len(rows),)
        assert bits(got) == bits(expected[name]), name
    totals = store.term_totals_s
    reference = sequential_totals(rows)
    assert bits(list(totals.values())) == bits([reference[t] for t in TERMS])


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 64])
@pytest.mark.parametrize("seed", range(4))
def test_record_many_equals_record_row_by_row(chunk_rows: int, seed: int):
    rng = random.Random(seed)
    rows = [random_row(rng) for _ in range(150)]
    one_by_one = StepMetrics(chunk_rows=chunk_rows)
    for row in rows:
        record_row(one_by_one, row)
    batched = StepMetrics(chunk_rows=chunk_rows)
    i = 0
    while i < len(rows):  # batches of 0 to 40 rows, starting anywhere in a chunk
        k = min(rng.randrange(41), len(rows) - i)
        batched.record_many(as_columns(rows[i:i + k]), k)
        i += k
    assert_holds(one_by_one, rows)
    assert_holds(batched, rows)
    with one_by_one, batched:
        for name in STEP_COLUMNS:
            assert bits(batched.array(name)) == bits(one_by_one.array(name))
        assert batched.term_totals_s == one_by_one.term_totals_s


@pytest.mark.parametrize("chunk_rows", [1, 4, 64])
def test_term_totals_with_terms_zero_in_whole_chunks(chunk_rows: int):
    """A term that is zero (of either sign) on every row of a chunk leaves its running sum as the
    row-by-row sum leaves it, whether the chunk comes first, between nonzero ones or last."""
    rng = random.Random(11)
    rows = [random_row(rng) for _ in range(40)]
    for i, row in enumerate(rows):
        row["moe_s"] = 0.0  # zero throughout
        row["swap_s"] = -0.0  # negative zero throughout
        row["tp_comm_s"] = (0.0, -0.0)[i % 2] if i < 20 else row["tp_comm_s"]  # zeros, then not
        row["cow_copy_s"] = row["cow_copy_s"] if 8 <= i < 12 else -0.0  # nonzero only between
    for record in ("rows", "many"):
        with StepMetrics(chunk_rows=chunk_rows) as store:
            if record == "rows":
                for row in rows:
                    record_row(store, row)
            else:
                store.record_many(as_columns(rows), len(rows))
            assert_holds(store, rows)
            assert bits([store.term_totals_s["moe"], store.term_totals_s["swap"]]) == bits([0.0, 0.0])


def test_record_many_broadcasts_scalars():
    rng = random.Random(5)
    rows = [random_row(rng) for _ in range(9)]
    for row in rows:  # scalars for a few columns, arrays for the rest
        row.update(step=3, preempted=0, swap_s=0.25)
    columns = as_columns(rows)
    columns.update(step=3, preempted=0, swap_s=np.float64(0.25))
    with StepMetrics(chunk_rows=4) as store:
        store.record_many(columns, 9)
        assert_holds(store, rows)


def test_record_many_rejects_bad_columns():
    store = StepMetrics()
    columns = as_columns([random_row(random.Random(0))] * 2)
    with pytest.raises(ValueError, match="missing"):
        store.record_many({k: v for k, v in columns.items() if k != "step"}, 2)
    with pytest.raises(ValueError, match="unknown"):
        store.record_many({**columns, "bogus": 1.0}, 2)
    with pytest.raises(ValueError, match="shape"):
        store.record_many({**columns, "step": np.zeros(3)}, 2)
    with pytest.raises(ValueError, match="non-negative"):
        store.record_many(columns, -1)
    assert len(store) == 0


TERMS_COLUMN = f"{TERMS[0]}_s"


def test_spills_to_disk_and_reads_back_in_order(tmp_path):
    rng = random.Random(1)
    rows = [random_row(rng) for _ in range(10)]
    store = StepMetrics(chunk_rows=4, spill_dir=tmp_path)
    for i, row in enumerate(rows):
        record_row(store, row)
        assert store.num_buffered_rows == (i + 1) % 4 < store.chunk_rows
    path = store.spill_path
    assert path is not None and path.parent == tmp_path
    files = sorted(p.name for p in path.iterdir())
    assert files == sorted(f"{name}.f64" for name in STEP_COLUMNS)
    assert all((path / f).stat().st_size == 8 * 8 for f in files)  # two chunks of 4 rows on disk
    assert_holds(store, rows)
    chunks = list(store.iter_chunks())
    assert [len(c["step"]) for c in chunks] == [4, 4, 2]
    for name in STEP_COLUMNS:
        assert bits(np.concatenate([c[name] for c in chunks])) == bits(as_columns(rows)[name])
    store.close()


def test_iter_chunks_of_a_few_columns_is_those_columns_of_every_chunk(tmp_path):
    rng = random.Random(2)
    rows = [random_row(rng) for _ in range(11)]
    store = StepMetrics(chunk_rows=4, spill_dir=tmp_path)
    for row in rows:
        record_row(store, row)
    few = ("duration_s", "used_slots", TERMS_COLUMN)
    whole = list(store.iter_chunks())
    some = list(store.iter_chunks(few))
    assert [sorted(c) for c in some] == [sorted(few)] * 3  # two spilled chunks and the live one
    for a, b in zip(whole, some):
        for name in few:
            assert bits(a[name]) == bits(b[name])
    with pytest.raises(ValueError, match="unknown step columns"):
        list(store.iter_chunks(("duration_s", "nope")))
    chunks = store.iter_chunks(few)
    for _ in range(3):  # the live chunk's turn, then abandoned: the store must still record
        next(chunks)
    record_row(store, random_row(rng))
    assert len(store) == 12
    store.close()


def test_close_removes_the_directory_and_ends_use(tmp_path):
    store = StepMetrics(chunk_rows=2, spill_dir=tmp_path)
    for row in (random_row(random.Random(i)) for i in range(5)):
        record_row(store, row)
    path = store.spill_path
    assert path.is_dir()
    store.close()
    assert not path.exists()
    with pytest.raises(ValueError, match="closed"):
        store.array("step")
    with pytest.raises(ValueError, match="closed"):
        record_row(store, random_row(random.Random(9)))
    store.close()  # idempotent


def test_garbage_collection_removes_the_directory(tmp_path):
    store = StepMetrics(chunk_rows=1, spill_dir=tmp_path)
    record_row(store, random_row(random.Random(0)))
    path = store.spill_path
    assert path.is_dir()
    del store
    gc.collect()
    assert not path.exists()


def test_empty_store():
    store = StepMetrics()
    assert len(store) == 0 and store.num_buffered_rows == 0
    assert store.spill_path is None  # nothing written, no directory made
    for name in STEP_COLUMNS:
        assert store.array(name).dtype == np.float64 and store.array(name).shape == (0,)
    assert store.term_totals_s == dict.fromkeys(TERMS, 0.0)
    assert list(store.iter_chunks()) == []
    store.record_many(as_columns([]), 0)
    assert len(store) == 0 and store.spill_path is None


def test_array_is_a_copy_the_store_keeps_recording_after():
    store = StepMetrics(chunk_rows=3)
    rows = [random_row(random.Random(i)) for i in range(4)]
    for row in rows[:2]:
        record_row(store, row)
    first = store.array("start_s")
    first[:] = 0.0  # callers may scribble on what they get
    for row in rows[2:]:
        record_row(store, row)
    assert_holds(store, rows)


def test_summary_does_not_depend_on_chunking():
    """The summary reads whole columns: spilling or not, the same rows give the same summary."""
    rng = np.random.default_rng(0)
    n = 500
    columns = {name: rng.integers(0, 50, n).astype(float) for name in STEP_COLUMNS}
    columns["total_slots"] = np.full(n, 64.0)
    columns["duration_s"] = rng.random(n) * 1e-2
    columns["unshared_slots"] = columns["allocated_slots"] + 1
    requests = RequestMetrics(3)
    requests.arrival_s[:] = [0.0, 0.1, 0.2]
    requests.first_token_s[:] = [0.5, 0.6, 0.7]
    requests.first_scheduled_s[:] = [0.1, 0.2, 0.3]
    requests.finish_s[:] = [1.0, 2.0, 3.0]
    requests.generation_len[:] = requests.output_tokens[:] = [4, 5, 6]
    requests.status[:] = COMPLETED
    summaries = []
    for chunk_rows in (7, 10_000):
        for keep_rows in (True, False):  # (a summary store: the same summary)
            with StepMetrics(chunk_rows=chunk_rows, keep_rows=keep_rows) as steps:
                steps.record_many(columns, n)
                summaries.append(summarize(requests, steps, slo=Slo(ttft_s=1.0, tpot_s=1.0),
                                           preemptions={"swap": 0, "recompute": 0}, prefix_hit_rate=None,
                                           num_evictions=0))
    assert all(summary == summaries[0] for summary in summaries)
    assert summaries[0]["steps"] == n


def assert_summary_store_matches(summary: StepMetrics, full: StepMetrics) -> None:
    """A summary store (``keep_rows=False``) fed what ``full`` was fed gives the same floats for
    everything it keeps, and holds only the kept columns on disk."""
    assert not summary.keep_rows and full.keep_rows
    assert len(summary) == len(full)
    read_back = [bits(chunk_sums(c)) for c in full.iter_chunks(SUM_COLUMNS)]  # (the columns themselves)
    assert [bits(c) for c in full.chunk_sums()] == read_back
    assert [bits(c) for c in summary.chunk_sums()] == [bits(c) for c in full.chunk_sums()]
    assert bits(list(summary.term_totals_s.values())) == bits(list(full.term_totals_s.values()))
    for name in KEPT_COLUMNS:
        assert bits(summary.array(name)) == bits(full.array(name)), name
    assert summary.num_buffered_rows == full.num_buffered_rows < summary.chunk_rows
    if summary.spill_path is not None:
        assert sorted(os.listdir(summary.spill_path)) == sorted(f"{name}.f64" for name in KEPT_COLUMNS)


def test_summary_store_refuses_the_columns_it_did_not_keep(tmp_path):
    rng = random.Random(1)
    with StepMetrics(chunk_rows=3, spill_dir=tmp_path, keep_rows=False) as store:
        for _ in range(10):
            record_row(store, random_row(rng))
        for read in (lambda: store.array("used_slots"), lambda: list(store.iter_chunks(["start_s", "cow_blocks"]))):
            with pytest.raises(ValueError, match=r"\['(used_slots|cow_blocks)'\] were not kept.*--out"):
                read()
        with pytest.raises(ValueError, match="unknown step columns"):
            store.array("no_such_column")
        chunks = list(store.iter_chunks(KEPT_COLUMNS))
        assert [len(c["start_s"]) for c in chunks] == [3, 3, 3, 1]
        assert len(list(store.chunk_sums())) == 4 and len(SUM_KEYS) == len(next(store.chunk_sums()))


class RowsSpan:
    """A deferred span whose rows are given (``StepMetrics.record_deferred``'s protocol)."""

    def __init__(self, rows: list[dict[str, float]]):
        self.rows = len(rows)
        self.values = np.array([[r[name] for name in STEP_COLUMNS] for r in rows], dtype=np.float64)

    @staticmethod
    def fill(spans, offsets, block):
        for span, offset in zip(spans, offsets):  # (block: [columns, rows])
            block[:, offset:offset + span.rows] = span.values.T


class StoreAgainstModel(RuleBasedStateMachine):
    """Random interleavings of ``record``, ``record_many`` and deferred spans against the list-of-rows model."""

    def __init__(self):
        super().__init__()
        self.rng = random.Random(0)
        self.store: StepMetrics | None = None
        self.summary_store: StepMetrics | None = None  # keep_rows=False, fed the same
        self.rows: list[dict[str, float]] = []

    @precondition(lambda self: self.store is None)
    @rule(chunk_rows=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
    def open(self, chunk_rows: int, seed: int):
        note(f"StepMetrics(chunk_rows={chunk_rows})")
        self.store = StepMetrics(chunk_rows=chunk_rows)
        self.summary_store = StepMetrics(chunk_rows=chunk_rows, keep_rows=False)
        self.rng = random.Random(seed)

    @precondition(lambda self: self.store is not None)
    @rule()
    def record(self):
        row = random_row(self.rng)
        record_row(self.store, row)
        record_row(self.summary_store, row)
        self.rows.append(row)

    @precondition(lambda self: self.store is not None)
    @rule(count=st.integers(0, 15))
    def record_many(self, count: int):
        rows = [random_row(self.rng) for _ in range(count)]
        self.store.record_many(as_columns(rows), count)
        self.summary_store.record_many(as_columns(rows), count)
        self.rows += rows

    @precondition(lambda self: self.store is not None)
    @rule(pieces=st.lists(st.integers(0, 7), max_size=8), limit=st.sampled_from([1, 5, 8192]))
    def record_deferred(self, pieces: list[int], limit: int):
        """A mix of deferred spans (k > 0 rows each) and rows recorded behind them, with nothing
        read in between, written out whenever ``limit`` deferred rows wait."""
        stores = (self.store, self.summary_store)
        saved = [store._deferred_limit for store in stores]
        for store in stores:
            store._deferred_limit = limit
        try:
            for k in pieces:
                rows = [random_row(self.rng) for _ in range(max(k, 1))]
                for store in (self.store, self.summary_store):
                    if k == 0:
                        record_row(store, rows[0])
                    else:
                        store.record_deferred(RowsSpan(rows))
                self.rows += rows
                assert len(self.store) == len(self.summary_store) == len(self.rows)
        finally:
            for store, limit in zip(stores, saved):
                store._deferred_limit = limit

    @invariant()
    def bounded_and_equal(self):
        if self.store is None:
            return
        assert 0 <= self.store.num_buffered_rows < self.store.chunk_rows
        assert_holds(self.store, self.rows)
        assert_summary_store_matches(self.summary_store, self.store)

    def teardown(self):
        if self.store is not None:
            self.store.close()
            self.summary_store.close()


TestStoreAgainstModel = StoreAgainstModel.TestCase
TestStoreAgainstModel.settings = settings(max_examples=50, stateful_step_count=20)


# ----------------------------------------------------------------- found in review
class FailingOnceSpan(RowsSpan):
    """A span whose class's ``fill`` fails the first time it is asked (a bug in a span class)."""

    failures_left = 0

    @staticmethod
    def fill(spans, offsets, block):
        if FailingOnceSpan.failures_left:
            FailingOnceSpan.failures_left -= 1
            raise RuntimeError("fill failed")
        RowsSpan.fill(spans, offsets, block)


def test_a_failing_fill_loses_nothing_and_leaves_the_store_usable():
    """The rows recorded one by one before the span still wait, in order, and the row buffer
    is not held by a view the traceback keeps (the next record would raise BufferError)."""
    rng = random.Random(3)
    rows = [random_row(rng) for _ in range(6)]
    with StepMetrics(chunk_rows=8) as store:
        record_row(store, rows[0])
        record_row(store, rows[1])
        store.record_deferred(FailingOnceSpan(rows[2:4]))
        FailingOnceSpan.failures_left = 1
        with pytest.raises(RuntimeError, match="fill failed") as caught:
            store.array("step")  # (a read writes the waiting rows out)
        assert caught.value.__traceback__ is not None  # (the traceback, with its frames, is still alive here)
        assert len(store) == 4
        record_row(store, rows[4])  # (resizes the row buffer)
        record_row(store, rows[5])
        assert_holds(store, rows)


def test_a_block_larger_than_a_chunk_leaves_only_its_own_rows_live():
    """After a spill splits a block, the live part is a copy in the live chunk (an array of its
    own, one chunk long): nothing keeps the block, whose spilled rows are freed."""
    rng = random.Random(4)
    rows = [random_row(rng) for _ in range(23)]
    with StepMetrics(chunk_rows=5) as store:
        store.record_many(as_columns(rows), len(rows))
        assert store.num_buffered_rows == 3
        assert store._chunk.base is None and store._chunk.shape == (NUM_COLUMNS, 5)
        assert_holds(store, rows)


def test_after_close_nothing_is_recorded_and_nothing_is_buffered(tmp_path):
    store = StepMetrics(chunk_rows=2, spill_dir=tmp_path)
    record_row(store, random_row(random.Random(0)))
    store.close()
    assert store.num_buffered_rows == 0
    with pytest.raises(ValueError, match="closed"):
        store.record_deferred(RowsSpan([random_row(random.Random(1))]))
    assert len(store) == 0
