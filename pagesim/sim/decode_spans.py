"""The step rows of skipped decode stretches: logged flat as skip-ahead applies them, written many at once.

Skip-ahead (``pagesim.sim.skip_ahead``) applies a stretch of pure decode steps (a *span*) in one call and
knows its rows from a few numbers: its first step and start, each step's end time and cost terms,
the batch's counts, the blocks allocated and evicted per step, and how many sequences have each
residue of their computed tokens modulo the block size. ``DecodeSpanLog.record`` appends those
numbers to one replica's flat arrays (one C call per field, no object per span but a small
handle) and hands ``StepMetrics.record_deferred`` a ``DecodeSpan`` handle; the store later calls
``DecodeSpan.fill`` with many handles at once, which reads the log's arrays (one copy of each)
and writes every row of every span in vectorized passes. The floats go in ``array('d')``s; the
counts in lists, packed at once when read (``_read``): an ``array('q')`` parses each int it takes
through ``PyArg_Parse`` (2% of a compiled Azure run's time); the counts are mostly small ints, which
Python keeps preallocated (floats in a list would stay allocated until written).

Each row is what the step-by-step loop records for that step:

- cost terms: a term given per step (an array or list of the span's ``rows`` values) or one value
  for every step; start and duration from the running end times;
- KV usage in ``Scheduler.kv_usage``'s terms from the blocks allocated and evicted in each step
  (and, for a hybrid cache, the entries and blocks its windows dropped, every group's table
  counted); the idle slots of step ``j`` follow from the residues (periodic in ``j`` with period
  the block size).

Invariants:
- a log's spans reach ``fill`` in the order they were recorded, each once per write of the store,
  and a handle's entry stays in the log until a later ``fill`` starts past it: a ``fill`` that
  fails (or a store write that fails after it) leaves everything to be written again;
- ``record`` leaves the log as it was when it fails, whether a field is refused halfway or the
  store refuses the span (a closed store);
- ``fill`` of many spans writes exactly the rows it writes for each span alone
  (``tests/test_decode_span_fill.py``).
"""

from __future__ import annotations

import functools
import itertools
import struct
from array import array

import numpy as np

from pagesim.sim.cost.base import TERMS
from pagesim.sim.step_metrics import COLUMN_INDEX, NUM_COLUMNS

#: Per span, the integers ``fill`` reads: its rows, first step, the batch's counts and its block counts.
_INTS = 9
_DECODE_TERM = TERMS.index("decode_attention")


class DecodeSpanLog:
    """One replica's decode spans not yet written, in flat arrays (module docstring). All its
    spans have one block size (the replica's scheduler's)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.first_index = 0  # the log's index of its oldest entry still held
        # per span: rows, first step, num_requests (= num_running), num_waiting, num_seqs, total
        # slots, and used, cached and table blocks before its first step
        self._ints: list[int] = []
        self._start = array("d")  # per span: its first step's start
        self._terms = array("d")  # per span, per TERMS: the value of every step (0.0 where given per step)
        self._per_step: list[int] = []  # per span: a bit per TERMS index given per step
        self._sizes: list[int] = []  # per span, per residue: sequences in that bulk_decode bucket
        self._hybrid: list = []  # per span: a hybrid cache's window_decode.HybridCounts, or None
        self._ends = array("d")  # per row: end time
        self._allocations: list[int] = []  # per row: blocks allocated
        self._evictions: list[int] = []  # per row: of those, cached blocks evicted
        self._term_rows = [array("d") for _ in TERMS]  # per row of the spans giving the term per step

    def __len__(self) -> int:
        return len(self._start)

    def record(self, steps, rows: int, first_step: int, start_s: float, ends, terms: dict,
               num_requests: int, num_waiting: int, num_seqs: int, total_slots: int, used_blocks: int,
               cached_blocks: int, table_blocks: int, allocations: list[int], evictions: list[int],
               sizes: list[int], hybrid=None) -> None:
        """Log one span of ``rows`` steps and record it in ``steps`` (``StepMetrics``).
        ``ends``: at least ``rows`` end times (array or list); ``terms``: per TERMS name (absent:
        0.0), one float for every step or exactly ``rows`` values; ``sizes``: ``block_size``
        counts (``bulk_decode.bucket_sizes``); ``allocations`` and ``evictions``: ``rows`` each."""
        held = len(self._start)  # (the per-span start goes in last: it marks the entry complete)
        try:
            values = [terms.get(name, 0.0) for name in TERMS]
            per_step = 0
            attention = values[_DECODE_TERM]
            if type(attention) is list and _others_are_floats(values):
                # (the common span, _plan_short's: decode attention per step, every other term one float)
                _extend(self._term_rows[_DECODE_TERM], attention, rows)
                per_step = 1 << _DECODE_TERM
                values[_DECODE_TERM] = 0.0
            else:
                for t, value in enumerate(values):
                    if value.__class__ is not float and isinstance(value, (np.ndarray, list)):
                        _extend(self._term_rows[t], value, rows)
                        per_step |= 1 << t
                        values[t] = 0.0
            self._terms.fromlist(values)
            self._per_step.append(per_step)
            self._ints.extend((rows, first_step, num_requests, num_waiting, num_seqs, total_slots, used_blocks,
                               cached_blocks, table_blocks))
            self._sizes.extend(sizes)
            self._hybrid.append(hybrid)
            _extend(self._ends, ends, rows)
            self._allocations.extend(allocations)
            self._evictions.extend(evictions)
            self._start.append(start_s)
            steps.record_deferred(DecodeSpan(rows, self, self.first_index + held))
        except BaseException:
            self._truncate(held)
            raise

    def _truncate(self, held: int) -> None:
        """Cut every array back to its first ``held`` (complete) entries: what ``record`` had
        appended of a span it could not log is taken out again."""
        for values, length in zip(self._fields(), self._lengths(held)):
            del values[length:]

    def _drop_before(self, index: int) -> None:
        """Forget the entries before log index ``index`` (written: a later fill has started past them)."""
        drop = index - self.first_index
        if drop <= 0:
            return
        for values, length in zip(self._fields(), self._lengths(drop)):
            del values[:length]
        self.first_index = index

    def _fields(self) -> tuple:
        """Every array of the log, in the order of ``_lengths``."""
        return (self._ints, self._start, self._terms, self._per_step, self._sizes, self._hybrid, self._ends,
                self._allocations, self._evictions, *self._term_rows)

    def _lengths(self, count: int) -> list[int]:
        """How much of each of ``_fields()`` the log's first ``count`` (complete) entries hold."""
        ks = _read(self._ints)[:count * _INTS:_INTS]  # (each entry's rows)
        per_step = _read(self._per_step)[:count]
        rows = int(ks.sum())
        return [count * _INTS, count, count * len(TERMS), count, count * self.block_size, count, rows, rows, rows,
                *(int(ks[(per_step >> t & 1).astype(bool)].sum()) for t in range(len(TERMS)))]


def _read(values: array | list[int]) -> np.ndarray:
    """A copy of ``values`` as a numpy array: float64 for an ``array('d')`` (the log's floats),
    int64 for a list (its counts). NOTE: a copy, never a view: a view left alive (in a traceback,
    say) would make the array refuse to grow or shrink (``BufferError``). A list is packed by
    ``struct`` (a C loop of ``PyLong_AsLongLong``, a fraction of ``np.array``'s cost on a list)."""
    if isinstance(values, list):
        return np.frombuffer(struct.pack(f"{len(values)}q", *values), dtype=np.int64)
    return np.frombuffer(values).copy()


def _others_are_floats(values: list) -> bool:
    """Whether every term but ``decode_attention`` is one float (``record``'s common span)."""
    for t in range(len(values)):
        if t != _DECODE_TERM and type(values[t]) is not float:
            return False
    return True


def _extend(values: array, more, count: int) -> None:
    """Append the first ``count`` of ``more`` (a list or a float64 array) to ``values``."""
    if more.__class__ is list:  # (the usual: _plan_short's; a class check, not isinstance)
        values.fromlist(more if len(more) == count else more[:count])
    else:
        values.frombytes(np.ascontiguousarray(more[:count], dtype=np.float64).tobytes())


class DecodeSpan:
    """A logged span as ``StepMetrics.record_deferred`` holds it: its rows and where they are."""

    __slots__ = ("rows", "log", "index")

    def __init__(self, rows: int, log: DecodeSpanLog, index: int):
        self.rows = rows
        self.log = log
        self.index = index  # the span's index in its log

    @staticmethod
    def fill(spans: list[DecodeSpan], offsets: list[int], block: np.ndarray) -> None:
        """Write every span's rows into ``block`` (``[NUM_COLUMNS, rows]``, column-major: the
        protocol of ``StepMetrics.record_deferred``) at its row offset, vectorized over each
        log's spans (they are consecutive entries of it, in order)."""
        by_log: dict[int, tuple[DecodeSpanLog, list[int], list[int]]] = {}
        for span, offset in zip(spans, offsets):
            entry = by_log.get(id(span.log))
            if entry is None:
                entry = by_log[id(span.log)] = (span.log, [], [])
            entry[1].append(span.index)
            entry[2].append(offset)
        for log, indices, log_offsets in by_log.values():
            first = indices[0]
            if indices != list(range(first, first + len(indices))):
                raise ValueError(f"decode spans {indices[:3]}... are not a run of their log's entries in order")
            log._drop_before(first)
            _fill_log(log, len(indices), log_offsets, block)


def _fill_log(log: DecodeSpanLog, count: int, offsets: list[int], block: np.ndarray) -> None:
    """Write the rows of ``log``'s first ``count`` entries at ``offsets`` of ``block``, column by
    column (each a 1-D scatter into one of ``block``'s rows: several times faster than one 2-D
    fancy assignment of every column; a slice when the spans' rows are consecutive), every cell
    of their rows: a column a pure decode step has not gets +0.0. An offset past the block
    raises ``IndexError`` before anything is written."""
    bs = log.block_size
    ints = _read(log._ints).reshape(-1, _INTS)[:count].T
    ks = ints[0]
    total = int(ks.sum())
    first = np.cumsum(ks) - ks  # each span's first row among the spans' rows
    if not total:
        return
    shift = np.asarray(offsets, dtype=np.int64) - first  # row in block = row among the spans' + shift
    if int(shift[-1]) + total > block.shape[1]:  # (shift never decreases: its last is the largest)
        raise IndexError(f"decode spans' rows end at row {int(shift[-1]) + total} of a block of {block.shape[1]}")
    rows: slice | np.ndarray
    if shift[0] == shift[-1]:  # (no rows recorded between the spans: one slice)
        rows = slice(int(shift[0]), int(shift[0]) + total)
    else:
        rows = np.repeat(shift, ks) + np.arange(total)
    sid = np.repeat(np.arange(count), ks)
    j = np.arange(total) - first[sid]  # step within its span, from 0

    def put(column: int, values) -> None:
        block[column][rows] = values

    put(_STEP, ints[1][sid] + j)
    ends = _read(log._ends)[:total]
    starts = np.empty(total)
    starts[1:] = ends[:-1]
    starts[first] = _read(log._start)[:count]
    put(_START, starts)
    put(_DURATION, ends - starts)
    for columns, values in (((_NUM_REQUESTS, _NUM_RUNNING), ints[2]), ((_NUM_WAITING,), ints[3]),
                            ((_NUM_SEQS, _NUM_TOKENS, _DECODE_SEQS), ints[4]), ((_TOTAL_SLOTS,), ints[5])):
        values = values[sid]  # (one value per span, on each of its rows, in every column of the group)
        for column in columns:
            put(column, values)
    for column in _ZERO_COLUMNS:
        put(column, 0.0)
    terms = _read(log._terms).reshape(-1, len(TERMS))[:count]
    per_step = _read(log._per_step)[:count]
    given = int(np.bitwise_or.reduce(per_step))  # the terms some span gives per step
    written = (terms != 0.0).any(axis=0) | np.signbit(terms).any(axis=0)  # (else +0.0 on every row)
    for t, column in enumerate(_TERM_COLUMNS):
        values = terms[:, t][sid] if written[t] else None
        if given >> t & 1:
            if values is None:
                values = np.zeros(total)
            mine = (per_step >> t & 1).astype(bool)
            values[mine[sid]] = _read(log._term_rows[t])[:int(ks[mine].sum())]
        put(column, 0.0 if values is None else values)
    # Blocks allocated and evicted through each step: cumulative sums within each span.
    allocs = _segment_cumsum(_read(log._allocations)[:total], first, sid)
    evicts = _segment_cumsum(_read(log._evictions)[:total], first, sid)
    used_blocks = ints[6][sid] + allocs
    cached_blocks = ints[7][sid] - evicts
    table_blocks = ints[8][sid] + allocs
    groups = None
    hybrid = log._hybrid[:count]
    if any(hybrid):  # drops: entries out of tables, blocks out of use
        dropped, freed, cached = (_segment_cumsum(np.fromiter(itertools.chain.from_iterable(
            [k * (0,) if h is None else getattr(h, name) for h, k in zip(hybrid, ks.tolist())]),
            np.int64, total), first, sid) for name in ("dropped", "freed", "cached"))
        used_blocks -= freed
        cached_blocks += cached
        table_blocks -= dropped
        groups = np.array([1 if h is None else h.groups for h in hybrid], dtype=np.int64)[sid]
    allocated = used_blocks * bs
    put(_ALLOCATED, allocated)
    # Idle slots of step j (1-based): the unfilled tail of each sequence's last block after
    # its step-j write, (-(c + j)) mod bs, summed over sequences; periodic in j with period
    # bs, so one period per span from its count of sequences per residue of c. (In float64,
    # where the product is BLAS's: exact, every sum an integer far below 2**53.)
    sizes = _read(log._sizes).reshape(-1, bs)[:count]  # [spans, bs]
    # sequences per residue c % bs at each span's first step: [m] = sizes[(first - m) % bs]
    by_residue = (ints[1][:, None] - np.arange(bs)[None, :]) % bs
    periods = np.take_along_axis(sizes, by_residue, axis=1).astype(np.float64) @ _idle_pattern(bs)  # [spans, bs]
    idle = periods.ravel()[sid * bs + j % bs]
    if groups is not None:  # (each group's table has the same length and the same last-block tail)
        idle = idle * groups
    put(_USED, allocated - idle)
    put(_CACHED, cached_blocks * bs)
    put(_UNSHARED, table_blocks * bs)


@functools.lru_cache(maxsize=64)
def _idle_pattern(bs: int) -> np.ndarray:
    """``[r, j] = (-(r + j + 1)) mod bs`` for residues ``r`` and steps ``j + 1 = 1..bs``."""
    r = np.arange(bs, dtype=np.int64)[:, None]
    j = np.arange(1, bs + 1, dtype=np.int64)[None, :]
    return ((-(r + j)) % bs).astype(np.float64)


# The row layout of a span (sim.step_metrics.STEP_COLUMNS); zero where a pure decode step has none.
(_STEP, _START, _DURATION, _NUM_REQUESTS, _NUM_RUNNING, _NUM_WAITING, _NUM_SEQS, _NUM_TOKENS, _DECODE_SEQS,
 _ALLOCATED, _USED, _CACHED, _TOTAL_SLOTS, _UNSHARED) = (COLUMN_INDEX[c] for c in (
    "step", "start_s", "duration_s", "num_requests", "num_running", "num_waiting", "num_seqs", "num_tokens",
    "decode_seqs", "allocated_slots", "used_slots", "cached_slots", "total_slots", "unshared_slots"))
_TERM_COLUMNS = tuple(COLUMN_INDEX[f"{t}_s"] for t in TERMS)
#: The columns that are zero on every pure decode step's row (no prefill, swap, copy or preemption).
_ZERO_COLUMNS = tuple(j for j in range(NUM_COLUMNS) if j not in {
    _STEP, _START, _DURATION, _NUM_REQUESTS, _NUM_RUNNING, _NUM_WAITING, _NUM_SEQS, _NUM_TOKENS, _DECODE_SEQS,
    _ALLOCATED, _USED, _CACHED, _TOTAL_SLOTS, _UNSHARED, *_TERM_COLUMNS})


def _segment_cumsum(values: np.ndarray, first: np.ndarray, sid: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``values`` restarting at each segment's first index (integers: exact)."""
    cum = np.cumsum(values)
    return cum - (cum[first] - values[first])[sid]
