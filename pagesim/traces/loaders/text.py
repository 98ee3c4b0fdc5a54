"""Reading CSV and JSONL trace files line by line, with every problem tied to a file line.

Shared by all loaders: a CSV's header, its wanted columns (``read_csv``: converted a chunk of
rows at a time by ``pagesim.traces.loaders.columns``, each row's first line kept) and the JSON objects of
a JSONL file (``read_jsonl``). Files are read through ``pagesim.traces.loaders.stream``: regular files
only, gzip within a decompression cap, lines of at most ``MAX_LINE_CHARS``, UTF-8; so memory
holds the kept columns and one block of text, whatever the file.

Repairs, each reported as a ``TraceWarning``: a last line that was cut off mid-row (the file does
not end with a newline and the row is short or is not valid JSON) is dropped. Everything else
that is wrong is an error: an empty file, a missing column, a short or long row, a value that is
not a number, a negative or fractional count.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from itertools import chain

from pagesim.engine.files import InputFileError, describe_value, loads_json
from pagesim.traces.errors import TraceFormatError, warn
from pagesim.traces.loaders.columns import CHUNK_ROWS, ChunkedColumns, Column, clip, names_said
from pagesim.traces.loaders.names import known_column_names
from pagesim.traces.loaders.stream import MAX_LINE_CHARS, LineBlocks, PathArg, limit_text


def header_names(line: str) -> list[str]:
    """The column names of a CSV header line (spaces stripped)."""
    return [name.strip() for name in next(csv.reader([line]))]


def csv_header(path: PathArg) -> tuple[int, list[str]]:
    """A CSV's header line number and its column names."""
    number, line = numbered_first_line(path)
    return number, header_names(line)


def numbered_first_line(path: PathArg) -> tuple[int, str]:
    """The first non-blank line and its 1-based number (read no further than its block)."""
    for first, text in LineBlocks(path, max_line_chars=MAX_LINE_CHARS):
        if text.isspace():
            continue
        # lines as csv splits them (\r, \n or \r\n), numbered as the loaders number them
        for number, line in enumerate(io.StringIO(text, newline=""), start=first):
            if line.strip():
                return number, line.rstrip("\r\n")
    raise TraceFormatError(path, "empty file")


# ---------------------------------------------------------------------- CSV
class CsvColumns:
    """A CSV file's wanted columns (converted, by result name) and the line each row began on."""

    def __init__(self, columns: dict, lines):
        self.columns = columns
        self.lines = lines

    def __len__(self) -> int:
        return len(self.lines)


def _is_blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


class _CsvLines:
    """A CSV file's lines, block by block, as ``csv.reader`` wants them (``StringIO(newline="")``:
    ``\\r``, ``\\n`` and ``\\r\\n`` kept), with the file's line numbers.

    Between rows, a block of blank lines only is counted and skipped, not parsed line by line
    (a file of a billion blank lines takes seconds, not minutes). ``line_num`` is the file line
    the reader has read to; the reader's own count misses the skipped lines. The caller sets
    ``row_end`` to the line each row ends on, so that a row still open after more than
    ``MAX_LINE_CHARS`` of text (quoted line ends, field after field) is refused.
    """

    def __init__(self, path: PathArg):
        self.path = path
        self.blocks = LineBlocks(path, max_line_chars=MAX_LINE_CHARS, what="CSV row")
        self.skipped_lines = 0
        self.row_end = 0
        # NOTE: chain() feeds the lines on in C; a quoted field may run from one block into the next
        self.reader = csv.reader(chain.from_iterable(self._blocks()))

    @property
    def line_num(self) -> int:
        return self.reader.line_num + self.skipped_lines

    def _blocks(self):
        open_chars, open_since = 0, self.row_end  # text read since a row last ended
        for _, text in self.blocks:
            if self.row_end == self.line_num and text.isspace():
                self.skipped_lines += text.count("\n") + text.count("\r") - text.count("\r\n")
                self.row_end = self.line_num  # (blank lines are rows of nothing)
                continue
            open_chars = open_chars + len(text) if self.row_end == open_since else len(text)
            open_since = self.row_end
            if open_chars > MAX_LINE_CHARS + len(text):
                raise TraceFormatError(self.path, f"a row longer than the {limit_text(MAX_LINE_CHARS)} limit for "
                                       "one CSV row (a quote that is never closed?)", self.row_end + 1)
            yield io.StringIO(text, newline="")


def read_csv(path: PathArg, kinds: dict[str, Column]) -> CsvColumns:
    """The columns ``kinds`` names (result name -> ``Column``, whose ``column`` is the header's
    name for it) of a CSV with a header, each converted by its kind.

    Header names are matched after stripping spaces. A missing column is an error naming the
    columns the file does have. A quoted field may span lines; each row is reported at the
    line it began on.
    """
    lines = _CsvLines(path)
    reader = lines.reader
    try:
        header_line, header = _header(path, lines)
        index = _column_index(path, header, kinds, header_line)
        width = len(header)
        table = ChunkedColumns(path, kinds)
        rows: list[list[str]] = []
        starts: list[int] = []
        for row in reader:
            start = lines.row_end + 1
            lines.row_end = reader.line_num + lines.skipped_lines
            if len(row) != width:
                if _is_blank(row):
                    continue
                _check_odd_row_is_last(path, lines, width, len(row), start)
                _last_row_dropped(path, row, width, start, lines.blocks.ends_with_newline)  # dropped, or refused
                break
            rows.append(row)
            starts.append(start)
            if len(rows) > CHUNK_ROWS:  # the last row stays behind: it may turn out to be cut off
                _add_rows(table, rows[:-1], starts[:-1], index)
                del rows[:-1], starts[:-1]
    except csv.Error as exc:
        if "field limit" in str(exc):  # one field past csv.field_size_limit(): name the row, not where csv gave up
            raise TraceFormatError(path, f"a field longer than {csv.field_size_limit():,} characters (a quote that "
                                   "is never closed?)", lines.row_end + 1) from None
        raise TraceFormatError(path, f"cannot parse CSV: {exc}", lines.line_num) from None
    if rows and _last_row_dropped(path, rows[-1], width, starts[-1], lines.blocks.ends_with_newline):
        rows.pop()
        starts.pop()
    _add_rows(table, rows, starts, index)
    columns, row_lines = table.finish()
    if not len(row_lines):
        raise TraceFormatError(path, "no requests (only a header)")
    return CsvColumns(columns, row_lines)


def _header(path: PathArg, lines: _CsvLines) -> tuple[int, list[str]]:
    """The first non-blank row's line and its names (spaces stripped)."""
    try:
        for row in lines.reader:
            start, lines.row_end = lines.row_end + 1, lines.line_num
            if not _is_blank(row):
                return start, [name.strip() for name in row]
    except csv.Error as exc:
        raise TraceFormatError(path, f"cannot parse the header: {exc}", lines.line_num) from None
    raise TraceFormatError(path, "empty file")


def _column_index(path: PathArg, header: list[str], kinds: dict[str, Column], line: int) -> dict[str, int]:
    """Result name -> position of its column in the header, or an error at the header's line."""
    wanted = list(dict.fromkeys(kind.column for kind in kinds.values()))
    repeated = [name for name in wanted if header.count(name) > 1]
    if repeated:
        raise TraceFormatError(path, f"column {clip(repeated[0])!r} appears {header.count(repeated[0])} times in "
                               "the header (which one holds the data?)", line)
    missing = [name for name in wanted if name not in header]
    if missing:
        raise TraceFormatError(
            path, f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(the header has {names_said(header, known_column_names(wanted))})", line)
    return {name: header.index(kind.column) for name, kind in kinds.items()}


def _add_rows(table: ChunkedColumns, rows: list[list[str]], starts: list[int], index: dict[str, int]) -> None:
    if rows:
        fields = list(zip(*rows))
        table.add({name: fields[position] for name, position in index.items()}, starts)


def _check_odd_row_is_last(path: PathArg, lines: _CsvLines, width: int, found: int, line: int) -> None:
    """A row of the wrong width may only be the file's last (cut off): any later row makes it
    an error."""
    for row in lines.reader:
        lines.row_end = lines.line_num
        if not _is_blank(row):
            raise TraceFormatError(path, f"expected {width} fields, found {found}", line)


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


# ---------------------------------------------------------------------- JSONL
def read_jsonl(path: PathArg, *, max_line_chars: int = MAX_LINE_CHARS, what: str = "line",
               cut_off_ok: bool = True) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line, read one block of lines at a time.

    Each line must be a JSON object of at most ``max_line_chars`` characters (``what`` names a
    line in messages), parsed by ``pagesim.engine.files.loads_json`` (so nested at most ``MAX_NESTING``
    levels deep). With ``cut_off_ok``, a last line that is not complete JSON and has no line end
    after it was cut off: it is dropped with a warning. A file of blank lines only is an error
    (``empty file``).
    """
    blocks = LineBlocks(path, max_line_chars=max_line_chars, what=what)
    empty = True
    for first, text in blocks:
        if text.isspace():
            continue  # (quickly: a block of blank lines)
        pieces = text.split("\n")  # not splitlines(): U+2028 may sit inside a JSON string
        if text.endswith("\n"):
            pieces.pop()  # after the last line end
        last = first + len(pieces) - 1
        for number, line in zip(range(first, last + 1), pieces):
            if not line.strip():
                continue
            empty = False
            try:
                obj = loads_json(line, path=path, line=number)
            except InputFileError as exc:
                if exc.problem.startswith("not JSON"):
                    if cut_off_ok and number == last and not text.endswith(("\n", "\r")):
                        warn(path, "last line is cut off (not complete JSON); dropped it", number)
                        return
                    raise TraceFormatError(path, "not valid JSON" + exc.problem.removeprefix("not JSON"),
                                           number) from None
                raise TraceFormatError(path, exc.problem, number) from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, f"expected a JSON object, found {describe_value(obj)}", number)
            yield number, obj
    if empty:
        raise TraceFormatError(path, "empty file")
