"""A trace file's columns, converted a chunk of rows at a time, so memory holds arrays, not text.

A loader gathers the values of a few thousand rows (strings from a CSV, JSON values from JSONL)
with the line each row began on, and hands them to ``ChunkedColumns.add``, which converts each
column at once with its ``Column`` kind and keeps only the result:

- ``Numbers``: int64 or float64 (``to_numbers``), checked against a minimum;
- ``Texts``: short strings as a numpy string array (BurstGPT's ``Model``, for filtering);
- ``Identities``: a JSON list of integer identities per row, kept as flat values and counts,
  joined into CSR (``values``, ``offsets``) at the end.

Conversion takes a fast path over a whole chunk (numpy) and only walks the rows when that
fails, to name the first bad line, so every error is ``FILE:LINE: column: problem``. The problem
describes the value (``found text that is not one``, ``found NaN``) and never quotes it: a file
named by mistake may hold a secret, and an error may end up in a study's results.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pagesim.engine.files import describe_value
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.stream import PathArg

CHUNK_ROWS = 1 << 16  # rows gathered as Python objects before they are converted
MAX_ECHO_CHARS = 80  # a name (of a column, a key) quoted in an error message is cut to this many characters
INT64_MAX = 2**63 - 1
EXACT_FLOAT_INT = 2**53  # beyond this a float no longer holds every whole number


def clip(text, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` (made a string) cut to ``limit`` characters, an ellipsis marking the cut: a name
    quoted in an error (one the user or pagesim gave, never the file's) stays one short line."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def names_said(names: Iterable[str], known: Iterable[str], *, noun: str = "column") -> str:
    """``names`` (a header's, the keys of a line, a column's values) as an error may give them:
    those pagesim knows itself (``known``: names it reads or was given) by name, the others
    counted, never quoted (``TIMESTAMP, ContextTokens and 1 other column``)."""
    names = list(dict.fromkeys(names))
    known = set(known)
    said = [name for name in names if name in known]
    others = len(names) - len(said)
    other = f"{others} {'other ' if said else ''}{noun}{'s' if others != 1 else ''}"
    if not said:
        return f"{other}, none that pagesim knows" if others else f"no {noun}s"
    return ", ".join(said) + (f" and {other}" if others else "")


class Column(Protocol):
    column: str  # the file's name for it, for messages

    def convert(self, path: PathArg, values: Sequence, lines: np.ndarray) -> Any: ...

    def join(self, chunks: list) -> Any: ...


def _concatenate(chunks: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype)


@dataclass(frozen=True)
class Numbers:
    """A column of numbers: int64 (``integer``) or float64, each ``>= minimum`` (None: any)."""

    column: str
    integer: bool
    minimum: float | None = 0

    def convert(self, path: PathArg, values: Sequence, lines: np.ndarray) -> np.ndarray:
        return to_numbers(path, values, lines, self.column, integer=self.integer, minimum=self.minimum)

    def join(self, chunks: list[np.ndarray]) -> np.ndarray:
        return _concatenate(chunks, np.int64 if self.integer else np.float64)


@dataclass(frozen=True)
class Texts:
    """A column of short strings (spaces stripped), as a numpy string array."""

    column: str

    def convert(self, path: PathArg, values: Sequence, lines: np.ndarray) -> np.ndarray:
        return np.asarray([value.strip() for value in values], dtype=str)

    def join(self, chunks: list[np.ndarray]) -> np.ndarray:
        return _concatenate(chunks, str)


@dataclass(frozen=True)
class Identities:
    """A JSON list of integer identities in ``[0, 2**63)`` per row; joined as CSR
    ``(values, offsets)``."""

    column: str

    def convert(self, path: PathArg, values: Sequence, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for ids, line in zip(values, lines):
            if not isinstance(ids, list) or not all(type(v) is int and 0 <= v <= INT64_MAX for v in ids):
                raise TraceFormatError(path, f"{self.column}: expected a list of non-negative integers below 2**63",
                                       int(line))
        counts = np.fromiter((len(ids) for ids in values), dtype=np.int64, count=len(values))
        flat = [value for ids in values for value in ids]
        return np.asarray(flat, dtype=np.int64) if flat else np.zeros(0, np.int64), counts

    def join(self, chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        values = _concatenate([flat for flat, _ in chunks], np.int64)
        counts = _concatenate([counts for _, counts in chunks], np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return values, offsets


class ChunkedColumns:
    """Columns gathered a chunk at a time (``add``) or a row at a time (``add_row``, converted
    every ``CHUNK_ROWS`` rows), and joined once (``finish``).

    ``kinds`` maps each result name to its ``Column``. Invariant: every column has one entry
    per row added, in the order added, and ``lines`` the file line of each.
    """

    def __init__(self, path: PathArg, kinds: dict[str, Column]):
        self.path = path
        self.kinds = kinds
        self._chunks: dict[str, list] = {name: [] for name in kinds}
        self._lines: list[np.ndarray] = []
        self._rows: list[Sequence] = []  # rows added one by one, not yet converted
        self._row_lines: list[int] = []

    def add(self, values: dict[str, Sequence], lines: Sequence[int] | np.ndarray) -> None:
        """A chunk: each column's values under its name, and each row's line."""
        self._flush_rows()
        self._convert(values, lines)

    def add_row(self, line: int, values: Sequence) -> None:
        """One row: its values in the order of ``kinds``."""
        self._rows.append(values)
        self._row_lines.append(line)
        if len(self._rows) >= CHUNK_ROWS:
            self._flush_rows()

    def finish(self) -> tuple[dict[str, Any], np.ndarray]:
        """``({name: column}, line of each row)``; the chunks are released."""
        self._flush_rows()
        columns = {name: kind.join(self._chunks[name]) for name, kind in self.kinds.items()}
        lines = _concatenate(self._lines, np.int64)
        self._chunks, self._lines = {name: [] for name in self.kinds}, []
        return columns, lines

    def _flush_rows(self) -> None:
        if self._rows:
            self._convert(dict(zip(self.kinds, zip(*self._rows))), self._row_lines)
            self._rows, self._row_lines = [], []

    def _convert(self, values: dict[str, Sequence], lines) -> None:
        lines = np.asarray(lines, dtype=np.int64)
        for name, kind in self.kinds.items():
            self._chunks[name].append(kind.convert(self.path, values[name], lines))
        self._lines.append(lines)


# ---------------------------------------------------------------------- numbers
def to_numbers(
    path: PathArg,
    values: Sequence,
    lines: np.ndarray,
    column: str,
    *,
    integer: bool,
    minimum: float | None = 0,
) -> np.ndarray:
    """``values`` (strings or JSON numbers) as float64 or int64, or an error at the first bad line.

    Integers may be written ``12`` or ``12.0`` but not ``12.5``, and must fit in int64 (a value
    written as a float only up to 2**53, where floats stop being exact); JSON ``true`` is not a
    number; ``minimum`` bounds every value.
    """
    array = _fast_numbers(values, integer=integer)
    if array is not None:
        ok = np.ones(len(array), dtype=bool) if integer else np.isfinite(array)
        if minimum is not None:
            ok &= array >= minimum
        if ok.all():
            return array
    for value, line in zip(values, lines):
        problem = _number_problem(value, integer=integer, minimum=minimum)
        if problem:
            raise TraceFormatError(path, f"{column}: {problem}", int(line))
    raise TraceFormatError(path, f"{column}: cannot convert these values to numbers")  # not seen happen


def _fast_numbers(values: Sequence, *, integer: bool) -> np.ndarray | None:
    """Whole-column conversion, or None when some value needs a closer look."""
    try:
        with np.errstate(all="ignore"):
            if len(values) and isinstance(values[0], str):
                if integer:
                    try:
                        return np.asarray(values).astype(np.int64)
                    except (ValueError, OverflowError):
                        pass  # "12.0" or a bad value: through floats
                floats = np.asarray(values).astype(np.float64)
            else:
                if any(type(v) is bool for v in values):
                    return None
                if integer and all(type(v) is int for v in values):
                    return np.asarray(values, dtype=np.int64)  # OverflowError beyond int64
                floats = np.asarray(values, dtype=np.float64)
            if not integer:
                return floats
            exact = np.isfinite(floats) & (floats == np.floor(floats)) & (np.abs(floats) <= EXACT_FLOAT_INT)
            return floats.astype(np.int64) if exact.all() else None
    except (ValueError, TypeError, OverflowError):
        return None


def _number_problem(value, *, integer: bool, minimum: float | None) -> str | None:
    """What is wrong with one value (a CSV field or a JSON value), described, never quoted: a file
    named by mistake may hold a secret where a number belongs."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return f"expected a number, found {describe_value(value)}"
    number: int | float
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return "expected a number, found text that is not one" if text else "expected a number, found nothing"
    if not integer:
        try:
            number = float(number)
        except OverflowError:
            return "expected a finite number, found one too large for a float"
    if isinstance(number, float):
        if not np.isfinite(number):
            return f"expected a finite number, found {'NaN' if np.isnan(number) else 'an infinity'}"
        if integer and number != int(number):
            return "expected a whole number, found a fraction"
        if integer and abs(number) > EXACT_FLOAT_INT:
            return "a number too large to be an exact whole number (write it without a decimal point)"
    if integer and not -INT64_MAX - 1 <= number <= INT64_MAX:
        return f"a number out of range (at most {INT64_MAX})"
    if minimum is not None and number < minimum:
        found = "a negative number" if number < 0 else "0" if number == 0 else "a smaller number"
        return f"must be >= {minimum:g}, found {found}"
    return None
