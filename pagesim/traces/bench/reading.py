"""Reading dataset files streamed and bounded: a JSON array one element at a time, JSONL one line
at a time, each with a size limit, and errors that say where (entry, line, column) but never
quote the file.

vLLM 0.33 reads a ShareGPT file with ``json.load`` (datasets.py:1344) and a custom JSONL file
with ``pandas.read_json`` (:2457): the whole file at once. Here a file of any size is read in
chunks of ``READ_CHARS`` characters; one array element (one conversation) may be at most
``MAX_ENTRY_CHARS`` characters and one JSONL line at most ``MAX_LINE_CHARS`` (4 MiB, as a trace's
line), so memory stays bounded by what is kept, not by the file. Files may be gzip-compressed (by
their magic bytes, within the decompression cap); FIFOs and devices are refused by name
(``pagesim.traces.loaders.stream``).

No element may nest more than ``pagesim.engine.files.MAX_NESTING`` levels (below the array): every text
read is measured (``pagesim.engine.files.JsonNesting``, each character once) before the decoder, which
recurses, sees it, and an element that goes too deep is refused by its index.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator

from pagesim.engine.files import MAX_NESTING, JsonNesting
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.stream import MAX_LINE_CHARS, PathArg, limit_text, open_text
from pagesim.traces.loaders.text import read_jsonl

MAX_ENTRY_CHARS = 64 * 2**20  # one JSON array element (a whole conversation), in characters
READ_CHARS = 2**20  # characters read per refill
_SPACE = re.compile(r"[ \t\r\n]*")
# a decode error this close to the end of what is buffered may be a cut, not a mistake
_CUT_MARGIN = 8


def _kind(char: str) -> str:
    return {"{": "a JSON object", '"': "a JSON string"}.get(char, "text that is not a JSON array")


class _Buffer:
    """Text read so far from ``handle``, with the line and column of every position.

    ``too_deep_at`` is the position in ``text`` of the first bracket that opens more levels than
    an element may have (None: none does), and ``decodable`` the text before it: all the decoder
    may see. Each read is measured as it comes (``nesting``: the array's ``[`` is one level more
    than an element may open).
    """

    def __init__(self, path: PathArg, handle):
        self.path, self.handle = path, handle
        self.text = ""
        self.eof = False
        self.line_at_start = 1  # line of text[0]
        self.column_at_start = 1  # column of text[0]
        self.nesting = JsonNesting(MAX_NESTING + 1)
        self.too_deep_at: int | None = None
        self.decodable = ""
        self._forget()

    def read_more(self, at_least: int) -> None:
        try:
            more = self.handle.read(max(READ_CHARS, at_least))
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise TraceFormatError(self.path, f"cannot read (damaged gzip?): {exc}") from None
        except UnicodeDecodeError:
            raise TraceFormatError(self.path, "not UTF-8 text") from None
        if more:
            if self.too_deep_at is None:
                deep = self.nesting.feed(more)
                self.too_deep_at = None if deep is None else len(self.text) + deep
            self.text += more
            self._cut_decodable()
        else:
            self.eof = True

    def where(self, pos: int) -> tuple[int, int]:
        """(line, column), both 1-based, of ``text[pos]``; counted on from the last position
        asked (positions are mostly asked in increasing order), so a file costs one scan."""
        if pos < self._pos:
            self._forget()
        newlines = self.text.count("\n", self._pos, pos)
        if newlines:
            self._line += newlines
            self._last_newline = self.text.rfind("\n", self._pos, pos)
        self._pos = pos
        if self._last_newline < 0:
            return self._line, self.column_at_start + pos
        return self._line, pos - self._last_newline

    def _forget(self) -> None:
        self._pos, self._line, self._last_newline = 0, self.line_at_start, -1

    def drop_before(self, pos: int) -> None:
        self.line_at_start, self.column_at_start = self.where(pos)
        self.text = self.text[pos:]
        if self.too_deep_at is not None:
            self.too_deep_at -= pos
        self._cut_decodable()
        self._forget()

    def _cut_decodable(self) -> None:
        self.decodable = self.text if self.too_deep_at is None else self.text[:self.too_deep_at]

    def skip_space(self, pos: int) -> int:
        """The first non-space position at or after ``pos`` (reading on as needed), or
        ``len(text)`` at the end of the file."""
        while True:
            pos = _SPACE.match(self.text, pos).end()
            if pos < len(self.text) or self.eof:
                return pos
            self.read_more(0)


def iter_json_array(path: PathArg, *, what: str = "entry") -> Iterator[tuple[int, int, object]]:
    """``(index, line, element)`` for each element of the JSON array that is ``path``'s whole
    content, parsed one at a time (``json.JSONDecoder.raw_decode`` over a refilled buffer).

    Errors (``TraceFormatError``, one line): not a JSON array, invalid JSON (with line and
    column), an element over ``MAX_ENTRY_CHARS``, an array that is not closed, text after it.
    """
    limit = MAX_ENTRY_CHARS
    decoder = json.JSONDecoder()
    handle = open_text(path)
    with handle:
        buf = _Buffer(path, handle)
        pos = buf.skip_space(0)
        if pos == len(buf.text):
            raise TraceFormatError(path, "empty file")
        if buf.text[pos] != "[":
            line, column = buf.where(pos)
            raise TraceFormatError(path, f"expected a JSON array of {what}s, found {_kind(buf.text[pos])} "
                                   f"(column {column})", line)
        pos = buf.skip_space(pos + 1)
        index = 0
        if pos < len(buf.text) and buf.text[pos] == "]":
            pos = buf.skip_space(pos + 1)
        else:
            while True:
                if pos == len(buf.text):
                    raise TraceFormatError(path, f"the JSON array ends before {what} {index} (file cut off?)",
                                           buf.where(pos)[0])
                if pos > READ_CHARS:  # keep the buffer about one read long
                    buf.drop_before(pos)
                    pos = 0
                value, end = _decode_element(buf, decoder, pos, index, limit, what)
                yield index, buf.where(pos)[0], value
                index += 1
                pos = buf.skip_space(end)
                if pos < len(buf.text) and buf.text[pos] == ",":
                    pos = buf.skip_space(pos + 1)
                    if pos < len(buf.text) and buf.text[pos] == "]":
                        line, column = buf.where(pos)
                        raise TraceFormatError(path, f"not valid JSON: a comma before the closing ] "
                                               f"(column {column})", line)
                    continue
                if pos < len(buf.text) and buf.text[pos] == "]":
                    pos = buf.skip_space(pos + 1)
                    break
                if pos == len(buf.text):
                    raise TraceFormatError(path, f"the JSON array is not closed after {what} {index - 1} "
                                           "(file cut off?)", buf.where(pos)[0])
                line, column = buf.where(pos)
                raise TraceFormatError(path, f"not valid JSON: expected , or ] after {what} {index - 1} "
                                       f"(column {column})", line)
        if pos < len(buf.text):
            line, column = buf.where(pos)
            raise TraceFormatError(path, f"text after the JSON array (column {column})", line)


def _decode_element(buf: _Buffer, decoder: json.JSONDecoder, pos: int, index: int, limit: int, what: str):
    """One element starting at ``buf.text[pos]``: ``(value, end)``, reading on while it may be cut.

    The decoder sees no text past ``buf.too_deep_at``: an element that does not end before it
    is the one that nests too deeply (unless it is not JSON before that point)."""
    while True:
        deep, text = buf.too_deep_at, buf.decodable
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            cut = exc.pos >= len(text) - _CUT_MARGIN or exc.msg.startswith("Unterminated string")
            if deep is not None and cut:
                line, column = buf.where(deep)
                raise TraceFormatError(buf.path, f"{what} {index}: JSON nested more than {MAX_NESTING} levels "
                                       f"deep (column {column})", line) from None
            if not cut or buf.eof:
                line, column = buf.where(exc.pos)
                raise TraceFormatError(buf.path, f"{what} {index}: not valid JSON ({exc.msg}, column {column})",
                                       line) from None
        else:
            # a number (or literal) ending exactly at the buffer's end may go on in the next read
            if end < len(buf.text) or buf.eof:
                if end - pos > limit:
                    _too_large(buf, pos, index, limit, what)
                return value, end
        if len(buf.text) - pos > limit:
            _too_large(buf, pos, index, limit, what)
        buf.read_more(len(buf.text) - pos)  # at least double what this element has so far


def _too_large(buf: _Buffer, pos: int, index: int, limit: int, what: str):
    line, column = buf.where(pos)
    raise TraceFormatError(buf.path, f"{what} {index} (from column {column}) is larger than the "
                           f"{limit_text(limit)} limit for one {what}", line)


def iter_jsonl(path: PathArg, *, what: str = "line") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line, read a block of lines at a time
    (``pagesim.traces.loaders.text.read_jsonl``); a line longer than ``MAX_LINE_CHARS`` (as a trace's),
    nested too deeply or that is not a JSON object is an error naming the line."""
    return read_jsonl(path, max_line_chars=MAX_LINE_CHARS, what=what, cut_off_ok=False)
