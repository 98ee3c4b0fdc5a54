"""Per-step metrics whose memory does not grow with the run: a live chunk in memory, the rest on disk.

A run records one row per scheduler step (``STEP_COLUMNS``: start and duration, batch, tokens,
KV slots, swaps, preemptions, each cost term), millions of rows for a long trace. A recorded row
first waits in a row-major ``array('d')`` (one ``extend`` per step, the cheapest append Python
has); a few thousand at a time they are written, transposed, into the *live chunk*: one
column-major array (``[columns, chunk_rows]`` float64, made at the first write), so each column
is contiguous; rows that fit are written there in place, without an intermediate copy. When the
live chunk holds ``chunk_rows`` rows it is appended to one binary file per column (native float64)
in a private temporary directory, made at the first spill (``tempfile.mkdtemp`` under
``spill_dir``) and removed by ``close()``, by leaving a ``with`` block, or when the store is
garbage collected.

**Deferred spans.** A run of steps whose rows follow from a few numbers (skip-ahead's decode
spans: ``pagesim.sim.decode_spans.DecodeSpan``) can be recorded as one object (``record_deferred``): its
rows are written later, many spans at once, by its class's ``fill(spans, offsets, block)``,
vectorized over all of them, into the columns of a column-major block. Rows recorded around
them wait in order with them; every read (and a few thousand waiting rows) writes them out
first. ``len()`` counts them.

``array(name)`` reads one whole column back (disk, then the live chunk): O(steps) memory only
when a caller asks, one column at a time. ``iter_chunks()`` streams the rows in chunks for
writers that need every column; ``chunk_sums()`` gives each chunk's ``pagesim.sim.step_sums`` (the
summary's sums over steps), taken as the chunk leaves memory, as its term sums are, so the
summary reads nothing back from disk.

**Summary stores** (``keep_rows=False``: nothing will read a step's row, only the summary): a
chunk leaving memory writes only ``KEPT_COLUMNS`` (start and duration, which the ITL sample
reads per step) to disk, so a long run writes 2 of the 30 columns (a 1M-request run's 2 GB of
spill files become 128 MB). Every figure of the summary is the same float as a full store's:
the same chunks, the same sums of the same values. Reading any other column is refused by name.

Invariants:
- after every call, ``0 <= num_buffered_rows < chunk_rows`` and fewer than
  ``min(DEFERRED_ROWS, chunk_rows)`` rows wait to be written: memory is two chunks at most;
- ``array(name)`` holds every recorded row in recording order, each value exactly the float64
  the row was given (``array('d')`` and numpy convert ints the same way);
- ``term_totals_s[t]`` is the left-to-right float64 sum ``((0.0 + v0) + v1) + ...`` of the
  term's column: spilled chunks are folded in with ``np.add.accumulate`` (sequential by
  definition, unlike ``np.sum``'s pairwise order), the live chunk when asked;
- ``record_many(columns, k)`` leaves the store exactly as ``k`` calls of ``record`` with the
  same values would, bit for bit, chunk boundaries included; so does ``record_deferred`` with
  the rows its span's ``fill`` writes;
- chunks are ``chunk_rows`` rows in recording order (the last one partial), in both kinds of
  store: ``chunk_sums()`` of a summary store equals a full store's, value for value.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
import weakref
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from pagesim.engine.policy.memory.usage import KvUsage
from pagesim.sim.cost.base import TERMS, StepCost, StepWork
from pagesim.sim.step_sums import SUM_COLUMNS, chunk_sums

STEP_COLUMNS = (
    "step", "start_s", "duration_s", "num_requests", "num_running", "num_waiting", "num_seqs", "num_tokens", "prefill_tokens",
    "decode_seqs", "allocated_slots", "used_slots", "cached_slots", "total_slots", "unshared_slots",
    "swap_out_blocks", "swap_in_blocks", "cow_blocks", "preempted",
) + tuple(f"{t}_s" for t in TERMS)

NUM_COLUMNS = len(STEP_COLUMNS)
_INDEX = {name: j for j, name in enumerate(STEP_COLUMNS)}
COLUMN_INDEX = _INDEX  # a column's position in a row (for span classes' ``fill``)
_COLUMN_SET = frozenset(STEP_COLUMNS)
_TERM_INDEX = [_INDEX[f"{t}_s"] for t in TERMS]
_term_values = operator.itemgetter(*TERMS)  # a StepCost's terms, in TERMS order, as a tuple
DEFAULT_CHUNK_ROWS = 32_768  # 32k rows x 30 columns x 8 bytes: the live chunk, 7.5 MiB
#: Deferred rows (spans' and those waiting behind them) written out at once beyond this.
DEFERRED_ROWS = 8_192  # (rows recorded one by one wait as many)
#: The columns a summary store (``keep_rows=False``) keeps per step: what the ITL sample reads.
KEPT_COLUMNS = ("start_s", "duration_s")


class StepMetrics:
    """One row per step, in memory up to ``chunk_rows`` rows, spilled to disk beyond (with
    ``keep_rows=False``, only what the summary reads: module docstring)."""

    def __init__(self, *, chunk_rows: int = DEFAULT_CHUNK_ROWS, spill_dir: str | os.PathLike | None = None,
                 keep_rows: bool = True):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
        self.chunk_rows = chunk_rows
        self.keep_rows = keep_rows
        self._columns = STEP_COLUMNS if keep_rows else KEPT_COLUMNS  # the columns that can be read back
        self._spilled_sums: list[tuple[float, ...]] = []  # chunk_sums of each spilled chunk, in order
        self._spill_parent = spill_dir
        # the live chunk: column-major ([columns, chunk_rows]), made at the first write; its first
        # ``_num_live`` rows are the rows not yet spilled
        self._chunk: np.ndarray | None = None
        self._num_live = 0
        self._num_spilled = 0
        self._spilled_term_totals = np.zeros(len(TERMS))  # sequential sums over the spilled rows
        self._path: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        # Rows waiting to be written, in order: spans (record_deferred), and ints, each a number of
        # consecutive rows recorded one by one (their values in ``_rows``, row-major)
        self._deferred: list = []
        self._rows = array("d")
        self._num_deferred_rows = 0
        # rows waiting beyond which they are written (0 once closed: the next record() finds it closed)
        self._deferred_limit = min(DEFERRED_ROWS, chunk_rows)

    # ----------------------------------------------------------------- writing
    def record(self, step: int, start_s: float, duration_s: float, num_requests: int, num_running: int,
               num_waiting: int, work: StepWork, usage: KvUsage, num_preempted: int, cost: StepCost) -> None:
        terms = cost.terms
        row = (
            step, start_s, duration_s, num_requests, num_running, num_waiting, work.num_seqs, work.num_tokens,
            work.num_prefill_tokens, work.num_decode_seqs, usage.allocated_slots, usage.used_slots,
            usage.cached_slots, usage.total_slots, usage.unshared_slots, work.num_swap_out_blocks,
            work.num_swap_in_blocks, work.num_cow_blocks, num_preempted, *_term_values(terms),
        )
        # NOTE: one extend of a tuple (one C call) rather than an append per column: this is
        # the simulator's per-step hot path.
        self._rows.extend(row)
        pieces = self._deferred
        if pieces and pieces[-1].__class__ is int:
            pieces[-1] += 1
        else:
            pieces.append(1)
        self._num_deferred_rows = waiting = self._num_deferred_rows + 1
        if waiting >= self._deferred_limit:
            self._write_deferred()

    def record_deferred(self, span) -> None:
        """Record ``span.rows`` steps whose rows ``type(span).fill`` writes later (module docstring)."""
        if self._closed:  # (_check_open, inlined: once per span)
            self._check_open()
        self._deferred.append(span)
        self._num_deferred_rows = waiting = self._num_deferred_rows + span.rows
        if waiting >= self._deferred_limit:
            self._write_deferred()

    def _write_deferred(self) -> None:
        """Write the waiting rows, in recording order, as one column-major block: the rows recorded
        one by one in one transposing copy, and each span class fills its spans' rows at once.
        If a ``fill`` fails, nothing has been taken: the rows still wait, in order."""
        pieces = self._deferred
        if not pieces:
            return
        self._check_open()
        count, live = self._num_deferred_rows, self._num_live
        # (the usual: they fit in the live chunk, and are written there in place; else copied in)
        in_place = live + count <= self.chunk_rows
        block = self._live_chunk()[:, live:live + count] if in_place else np.empty((NUM_COLUMNS, count))
        if len(pieces) == 1 and pieces[0].__class__ is int:  # (only rows: no skip-ahead)
            self._write_rows(block, None)
        else:
            run_at: list[int] = []  # where each run of rows recorded one by one starts among all rows
            run_rows: list[int] = []
            spans: dict[type, tuple[list, list[int]]] = {}
            offset = 0
            for piece in pieces:
                if piece.__class__ is int:
                    run_at.append(offset)
                    run_rows.append(piece)
                    offset += piece
                else:
                    group = spans.get(type(piece))
                    if group is None:
                        group = spans[type(piece)] = ([], [])
                    group[0].append(piece)
                    group[1].append(offset)
                    offset += piece.rows
            if run_at:
                counts = np.array(run_rows, dtype=np.int64)
                self._write_rows(block, np.repeat(np.array(run_at, dtype=np.int64) - (np.cumsum(counts) - counts),
                                                  counts) + np.arange(int(counts.sum())))
            for cls, (group, offsets) in spans.items():
                cls.fill(group, offsets, block)
        del self._rows[:]
        self._deferred = []
        self._num_deferred_rows = 0
        if in_place:
            self._live_grew(count)
        else:
            self._append_block(block)

    def _write_rows(self, block: np.ndarray, at: np.ndarray | None) -> None:
        """The rows recorded one by one, transposed into ``block``'s columns ``at`` (``None``: all).
        NOTE: the view of the row buffer lives only in this call, so no traceback or caller keeps
        it (the buffer is resized next, which a live view would refuse with ``BufferError``)."""
        rows = np.frombuffer(self._rows).reshape(-1, NUM_COLUMNS)
        if at is None:
            block[:] = rows.T
        else:
            block[:, at] = rows.T

    def record_many(self, columns: Mapping[str, np.ndarray | float | int], count: int) -> None:
        """Append ``count`` rows at once: ``columns`` maps every name of ``STEP_COLUMNS`` to an
        array of ``count`` values or to one scalar repeated on every row."""
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"count must be non-negative, got {count}")
        if columns.keys() != _COLUMN_SET:
            missing = [c for c in STEP_COLUMNS if c not in columns]
            unknown = sorted(set(columns) - _COLUMN_SET)
            raise ValueError(f"record_many needs exactly the step columns: missing {missing}, unknown {unknown}")
        values = [np.asarray(columns[name], dtype=np.float64) for name in STEP_COLUMNS]
        for name, value in zip(STEP_COLUMNS, values):
            if value.ndim != 0 and value.shape != (count,):
                raise ValueError(f"column {name!r} has shape {value.shape}, expected a scalar or ({count},)")
        self._check_open()
        block = np.empty((NUM_COLUMNS, count))  # column-major, as the live chunk
        for j, value in enumerate(values):
            block[j] = value
        self._write_deferred()
        self._append_block(block)

    def _append_block(self, block: np.ndarray) -> None:
        """Copy the rows of ``block`` (``[NUM_COLUMNS, rows]`` float64) into the live chunk,
        spilling at each chunk boundary."""
        count = block.shape[1]
        done = 0
        while done < count:  # fill the live chunk, spill, repeat: memory stays one chunk
            live = self._num_live
            rows = min(count - done, self.chunk_rows - live)
            self._live_chunk()[:, live:live + rows] = block[:, done:done + rows]
            done += rows
            self._live_grew(rows)

    def _live_grew(self, rows: int) -> None:
        """The live chunk holds ``rows`` more rows (written there): spilled once it is full."""
        self._num_live += rows
        if self._num_live >= self.chunk_rows:
            self._spill()

    def _live_chunk(self) -> np.ndarray:
        """The live chunk's array (``[NUM_COLUMNS, chunk_rows]``), made on first use."""
        chunk = self._chunk
        if chunk is None:
            chunk = self._chunk = np.empty((NUM_COLUMNS, self.chunk_rows))
        return chunk

    def _spill(self) -> None:
        self._check_open()
        block = self._live_block()
        path = self._directory()
        for name in self._columns:
            with open(path / f"{name}.f64", "ab") as f:
                block[_INDEX[name]].tofile(f)
        self._spilled_sums.append(chunk_sums({name: block[_INDEX[name]] for name in SUM_COLUMNS}))
        self._spilled_term_totals = _fold_terms(self._spilled_term_totals, block)
        self._num_spilled += block.shape[1]
        self._num_live = 0

    def _directory(self) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="pagesim-steps-", dir=self._spill_parent))
            self._finalizer = weakref.finalize(self, _remove_tree, self._path, os.getpid())
        return self._path

    # ----------------------------------------------------------------- reading
    def __len__(self) -> int:
        return self._num_spilled + self._num_live + self._num_deferred_rows

    @property
    def num_buffered_rows(self) -> int:
        """Rows held in memory (the live chunk); always fewer than ``chunk_rows``."""
        self._write_deferred()
        return self._num_live

    @property
    def spill_path(self) -> Path | None:
        """The directory holding the spilled columns; ``None`` until the first spill."""
        return self._path

    @property
    def term_totals_s(self) -> dict[str, float]:
        """Seconds per cost term over all steps, summed row by row in recording order."""
        self._check_open()
        self._write_deferred()
        totals = _fold_terms(self._spilled_term_totals, self._live_block())
        return {t: float(v) for t, v in zip(TERMS, totals)}

    def array(self, name: str) -> np.ndarray:
        """One column, every row in order, as a new float64 array."""
        self._check_readable([name])
        j = _INDEX[name]
        self._write_deferred()
        out = np.empty(len(self))
        spilled = self._num_spilled
        if spilled:
            with open(self._path / f"{name}.f64", "rb") as f:
                num_bytes = f.readinto(memoryview(out[:spilled]).cast("B"))
            assert num_bytes == 8 * spilled, f"{name}: read {num_bytes} bytes of {8 * spilled}"
        if self._num_live:
            out[spilled:] = self._chunk[j, :self._num_live]
        return out

    def iter_chunks(self, columns: Sequence[str] = STEP_COLUMNS) -> Iterator[dict[str, np.ndarray]]:
        """Every row in order, up to ``chunk_rows`` at a time: ``{column: values}`` per chunk,
        for ``columns`` (default all; a reader of a few reads only theirs from disk); for
        writers of whole tables and the summary's sums. Record nothing while iterating."""
        self._check_readable(columns)
        self._write_deferred()
        spilled = self._num_spilled
        if spilled:
            files = [open(self._path / f"{name}.f64", "rb") for name in columns]
            try:
                for start in range(0, spilled, self.chunk_rows):
                    rows = min(self.chunk_rows, spilled - start)
                    yield {name: np.fromfile(f, dtype=np.float64, count=rows) for name, f in zip(columns, files)}
            finally:
                for f in files:
                    f.close()
        if self._num_live:
            yield self._live_columns(columns)

    def chunk_sums(self) -> Iterator[tuple[float, ...]]:
        """``pagesim.sim.step_sums.chunk_sums`` of each chunk of rows, in order: the spilled chunks' as
        the store took them, then the live chunk's."""
        self._check_open()
        self._write_deferred()
        yield from list(self._spilled_sums)
        if self._num_live:
            yield chunk_sums(self._live_columns(SUM_COLUMNS))

    def _live_columns(self, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """The live chunk's ``columns``, each a new contiguous array (a caller may keep it while
        more rows are recorded)."""
        block = self._live_block()
        return {name: block[_INDEX[name]].copy() for name in columns}

    def _check_readable(self, columns: Sequence[str]) -> None:
        self._check_open()
        unknown = [name for name in columns if name not in _COLUMN_SET]
        if unknown:
            raise ValueError(f"unknown step columns {unknown}")
        dropped = [name for name in columns if name not in self._columns]
        if dropped:
            raise ValueError(f"step columns {dropped} were not kept: this store keeps only {list(KEPT_COLUMNS)} "
                             f"per step (keep_rows=False, what the summary reads); record with keep_rows=True "
                             f"(pagesim simulate --out) for every column")

    def _live_block(self) -> np.ndarray:
        """The live chunk's rows (``[columns, rows]``): a view of the live chunk, valid until
        the next write."""
        chunk = self._chunk
        return np.empty((NUM_COLUMNS, 0)) if chunk is None else chunk[:, :self._num_live]

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Remove the spilled files and free the live chunk; the store can no longer be used."""
        if self._finalizer is not None:
            self._finalizer()
        self._chunk = None
        self._num_live = 0
        del self._rows[:]
        self._deferred = []
        self._num_deferred_rows = 0
        self._spilled_sums = []
        self._closed = True
        self._deferred_limit = 0  # so the next record() writes, and _write_deferred raises: no check on the hot path

    def __enter__(self) -> StepMetrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("StepMetrics is closed")


def _fold_terms(totals: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Extend the running term sums over ``block`` (columns, rows), left to right."""
    # A term that is zero on every row (most are, for decode steps) leaves its sum as it is:
    # x + 0.0 and x + -0.0 are x for every x but -0.0, and a sum that starts at +0.0 never is
    # -0.0 (+0.0 + -0.0 is +0.0). NaN counts as nonzero.
    nonzero = [t for t, j in enumerate(_TERM_INDEX) if block[j].any()]
    if not nonzero:  # (no rows, or only zeros)
        return totals
    terms = block[[_TERM_INDEX[t] for t in nonzero]]  # (terms, rows), a copy
    terms[:, 0] += totals[nonzero]  # the running sum's next addition, then the rest in order
    folded = totals.copy()
    folded[nonzero] = np.add.accumulate(terms, axis=1, out=terms)[:, -1]
    return folded


def _remove_tree(path: Path, owner_pid: int) -> None:
    # NOTE: a forked child inherits the finalizer; only the process that made the directory removes it.
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
