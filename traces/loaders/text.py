"""Reading CSV and JSONL trace files line by line, with every problem tied to a file line.

Shared by all loaders: opening plain or ``.gz`` files, reading a CSV's header and rows (keeping
the line each row started on), reading JSON objects from JSONL, and turning columns of text into
numbers. Conversion takes a fast path over whole columns (numpy) and only walks the rows when
that fails, to name the first bad line.

Repairs, each reported as a ``TraceWarning``: a last line that was cut off mid-row (the file does
not end with a newline and the row is short or is not valid JSON) is dropped. Everything else
that is wrong is an error: an empty file, a missing column, a short or long row, a value that is
not a number, a negative or fractional count.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import zlib
from collections.abc import Iterator
from os import PathLike
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError, warn

PathArg = str | PathLike[str]


MAX_ECHO_CHARS = 80  # file content quoted in an error message is cut to this many characters


def clip(text, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` (made a string) cut to ``limit`` characters, an ellipsis marking the cut: file
    content quoted in an error stays one short line, whatever the file holds."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def require_regular_file(path: PathArg) -> None:
    """A one-line error unless ``path`` is a regular file (a FIFO or a device would block or never end)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceFormatError(path, "no such file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise TraceFormatError(path, "is a directory, not a trace file")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise TraceFormatError(path, f"is {kind}, not a regular file: refusing to read it")


def open_text(path: PathArg) -> io.TextIOBase:
    """``path`` opened for reading text (gzip decompressed), or a one-line error."""
    path = Path(path)
    require_regular_file(path)
    try:
        with open(path, "rb") as probe:
            compressed = probe.read(2) == b"\x1f\x8b"  # gzip's magic, whatever the file is called
        if compressed:
            return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
        if path.suffix.lower() == ".gz":
            raise TraceFormatError(path, "cannot read: the name ends in .gz but the file is not gzip data")
        return open(path, encoding="utf-8-sig", newline="")  # -sig: drop a BOM
    except FileNotFoundError:
        raise TraceFormatError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None


def read_all(path: PathArg) -> str:
    """The whole file as text; gzip and encoding problems become one error line."""
    handle = open_text(path)
    try:
        with handle:
            return handle.read()
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise TraceFormatError(path, f"cannot read (damaged gzip?): {exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, f"not UTF-8 text (byte {exc.start})") from None


def _leading_blank_lines(text: str) -> tuple[int, int]:
    """Characters and lines of blank (or whitespace-only) lines before the first other line."""
    position = lines = 0
    while True:
        end = text.find("\n", position)
        if end == -1 or text[position:end].strip():
            return position, lines
        position, lines = end + 1, lines + 1


def header_names(line: str) -> list[str]:
    """The column names of a CSV header line (spaces stripped)."""
    return [name.strip() for name in next(csv.reader([line]))]


def csv_header(path: PathArg) -> tuple[int, list[str]]:
    """A CSV's header line number and its column names."""
    number, line = numbered_first_line(path)
    return number, header_names(line)


def numbered_first_line(path: PathArg) -> tuple[int, str]:
    """The first non-blank line and its 1-based number."""
    handle = open_text(path)
    try:
        with handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    return number, line.strip("\r\n")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"cannot read: {exc}") from None
    raise TraceFormatError(path, "empty file")


# ---------------------------------------------------------------------- CSV
class CsvColumns:
    """A CSV file's wanted columns as lists of strings, plus the line each row began on."""

    def __init__(self, columns: dict[str, tuple[str, ...]], lines):
        self.columns = columns
        self.lines = np.asarray(lines, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lines)


def read_csv(path: PathArg, wanted: list[str], optional: tuple[str, ...] = ()) -> CsvColumns:
    """Columns ``wanted`` (all required) and ``optional`` (if present) of a CSV with a header.

    Header names are matched after stripping spaces. A missing column is an error naming the
    columns the file does have.
    """
    text = read_all(path)
    if not text.strip():
        raise TraceFormatError(path, "empty file")
    ends_with_newline = text.endswith(("\n", "\r"))
    leading_blank, skipped = _leading_blank_lines(text)
    reader = csv.reader(io.StringIO(text[leading_blank:], newline=""))
    try:
        header = [name.strip() for name in next(reader)]
    except csv.Error as exc:
        raise TraceFormatError(path, f"cannot parse the header: {exc}", 1 + skipped) from None
    index = {name: k for k, name in enumerate(header)}
    repeated = [name for name in (*wanted, *optional) if header.count(name) > 1]
    if repeated:
        raise TraceFormatError(path, f"column {clip(repeated[0])!r} appears {header.count(repeated[0])} times in "
                               "the header (which one holds the data?)", 1 + skipped)
    missing = [name for name in wanted if name not in index]
    if missing:
        raise TraceFormatError(
            path, f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(the header has: {clip(', '.join(header)) or 'nothing'})", 1 + skipped)
    names = list(wanted) + [name for name in optional if name in index]
    positions = [index[name] for name in names]
    width = len(header)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise TraceFormatError(path, f"cannot parse CSV: {exc}", reader.line_num + skipped) from None
    if reader.line_num == len(rows) + 1 and rows and rows[-1] and all(len(row) == width for row in rows[:-1]):
        # fast path: one line per row, every row but perhaps the last complete
        lines = np.arange(2, len(rows) + 2, dtype=np.int64) + skipped
        if _last_row_dropped(path, rows[-1], width, int(lines[-1]), ends_with_newline):
            rows.pop()
            lines = lines[:-1]
    else:  # blank lines or quoted newlines: find each row's first line
        rows, lines = _rows_with_lines(path, text[leading_blank:], width, ends_with_newline, skipped)
    if not rows:
        raise TraceFormatError(path, "no requests (only a header)")
    columns = list(zip(*rows))
    return CsvColumns({name: columns[k] for name, k in zip(names, positions)}, lines)


def _last_row_dropped(path: PathArg, row: list[str], width: int, line: int, ends_with_newline: bool) -> bool:
    """Whether the last row was cut off (and is dropped, with a warning); a last row of the
    wrong width that was not cut off is an error.

    The file must end without a newline, and the row must be short or end in an empty field
    (cut right after a comma).
    """
    if not ends_with_newline and (len(row) < width or (len(row) == width and row[-1] == "")):
        kept = len(row) - (row[-1] == "")
        warn(path, f"last line is cut off ({kept} of {width} fields); dropped it", line)
        return True
    if len(row) != width:
        raise TraceFormatError(path, f"expected {width} fields, found {len(row)}", line)
    return False


def _rows_with_lines(path: PathArg, text: str, width: int, ends_with_newline: bool, skipped: int):
    """Rows and the file line each began on (``skipped`` blank lines came before ``text``)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    next(reader)
    rows: list[list[str]] = []
    lines: list[int] = []
    line = reader.line_num
    try:
        for row in reader:
            start, line = line + 1, reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            rows.append(row)
            lines.append(start + skipped)
    except csv.Error as exc:
        raise TraceFormatError(path, f"cannot parse CSV: {exc}", reader.line_num + skipped) from None
    for k, row in enumerate(rows[:-1]):
        if len(row) != width:
            raise TraceFormatError(path, f"expected {width} fields, found {len(row)}", lines[k])
    if rows and _last_row_dropped(path, rows[-1], width, lines[-1], ends_with_newline):
        rows.pop()
        lines.pop()
    return rows, np.asarray(lines, dtype=np.int64)


# ---------------------------------------------------------------------- JSONL
def read_jsonl(path: PathArg) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line; a cut-off last line is dropped."""
    text = read_all(path)
    if not text.strip():
        raise TraceFormatError(path, "empty file")
    lines = text.split("\n")  # not splitlines(): U+2028 may sit inside a JSON string
    last = len(lines)
    while last and not lines[last - 1].strip():
        last -= 1
    cut_off_possible = not text.endswith(("\n", "\r"))
    for number, line in enumerate(lines[:last], start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == last and cut_off_possible:
                warn(path, "last line is cut off (not complete JSON); dropped it", number)
                return
            raise TraceFormatError(path, f"not valid JSON ({exc.msg} at column {exc.colno})", number) from None
        if not isinstance(obj, dict):
            raise TraceFormatError(path, f"expected a JSON object, found {type(obj).__name__}", number)
        yield number, obj


# ---------------------------------------------------------------------- numbers
INT64_MAX = 2**63 - 1
EXACT_FLOAT_INT = 2**53  # beyond this a float no longer holds every whole number


def to_numbers(
    path: PathArg,
    values: list,
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


def _fast_numbers(values, *, integer: bool) -> np.ndarray | None:
    """Whole-column conversion, or None when some value needs a closer look."""
    try:
        with np.errstate(all="ignore"):
            if values and isinstance(values[0], str):
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
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return f"expected a number, found {clip(json.dumps(value))}"
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
                return f"expected a number, found {clip(repr(value))}"
    if not integer:
        try:
            number = float(number)
        except OverflowError:
            return f"expected a finite number, found {clip(repr(value))}"
    if isinstance(number, float):
        if not np.isfinite(number):
            return f"expected a finite number, found {clip(repr(value))}"
        if integer and number != int(number):
            return f"expected a whole number, found {clip(repr(value))}"
        if integer and abs(number) > EXACT_FLOAT_INT:
            return f"{clip(repr(value))} is too large to be an exact whole number (write it without a decimal point)"
    if integer and not -INT64_MAX - 1 <= number <= INT64_MAX:
        return f"{clip(repr(value))} is out of range (at most {INT64_MAX})"
    if minimum is not None and number < minimum:
        return f"must be >= {minimum:g}, found {clip(repr(value))}"
    return None
