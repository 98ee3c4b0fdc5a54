"""Opening a trace or dataset file and reading it as blocks of whole lines, within stated bounds.

- Only a regular file is opened (``pagesim.engine.files.open_regular``: a FIFO, a device, a socket or a
  folder is refused by name, without blocking). A gzip file is recognised by its magic bytes.
- Gzip input may decompress to at most ``max(DEFAULT_RATIO x its size, DEFAULT_FLOOR_BYTES)``
  bytes, or to the cap set with ``decompression_cap(max_bytes)`` (the command line's
  ``--max-decompressed-gb``); past it, reading stops with an error naming the file, the cap and
  the flag. A gzip bomb is thus refused after a bounded amount of work, whatever it holds.
- ``LineBlocks`` yields the text as blocks of about ``READ_BYTES`` that end at a line end, each
  with the number of its first line. No line may be longer than ``max_line_chars`` characters:
  the error names the line and the limit. Text must be UTF-8 (a BOM is dropped) without NUL
  bytes; a bad byte is an error naming its line and column. A file is never held whole: at
  most one block and one unfinished line.

The cap is a context variable rather than a parameter so that it reaches every reader a command
runs (trace loaders, dataset readers) without being threaded through each of their signatures.

Every problem is a ``TraceFormatError`` (``FILE[:LINE]: problem``) that quotes none of the file.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from os import PathLike
from pathlib import Path

from pagesim.engine.files import InputFileError, open_regular, size_text
from pagesim.traces.errors import TraceFormatError

PathArg = str | PathLike[str]

MAX_LINE_CHARS = 4 * 2**20  # one line of a trace file (a CSV row, a JSONL object)
READ_BYTES = 2**20  # bytes read per block
DEFAULT_RATIO = 100  # gzip may decompress to this many times its size ...
DEFAULT_FLOOR_BYTES = 2**30  # ... or to this much, whichever is more (real traces: 3-10 x)
CAP_FLAG = "--max-decompressed-gb"
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = codecs.BOM_UTF8

#: bytes a gzip file may decompress to, or None for the default rule (see the module docstring)
_max_decompressed_bytes: ContextVar[int | None] = ContextVar("max_decompressed_bytes", default=None)


@contextmanager
def decompression_cap(max_bytes: int | None):
    """Within the block, gzip input may decompress to at most ``max_bytes`` (None: the default
    rule). The command line sets it from ``--max-decompressed-gb``."""
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"{CAP_FLAG} must be > 0")
    token = _max_decompressed_bytes.set(max_bytes)
    try:
        yield
    finally:
        _max_decompressed_bytes.reset(token)


def limit_text(limit: int) -> str:
    """A size limit in characters, in words: ``4 MiB`` or ``1,000 characters``."""
    return f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit:,} characters"


def require_regular_file(path: PathArg) -> None:
    """A one-line ``TraceFormatError`` unless ``path`` is a regular file (for files a library
    opens itself, such as Parquet)."""
    from pagesim.engine.files import require_regular_file as require

    try:
        require(path, what="trace file")
    except InputFileError as exc:
        raise TraceFormatError(path, exc.problem) from None


def open_binary(path: PathArg) -> io.RawIOBase | io.BufferedIOBase:
    """``path``'s bytes (gzip decompressed, within the cap), or a one-line error."""
    try:
        raw = open_regular(path, what="trace file")
    except InputFileError as exc:
        raise TraceFormatError(path, exc.problem) from None
    try:
        compressed = raw.read(2) == _GZIP_MAGIC  # whatever the file is called
        raw.seek(0)
        if not compressed:
            if Path(path).suffix.lower() == ".gz":
                raise TraceFormatError(path, "cannot read: the name ends in .gz but the file is not gzip data")
            return raw
        size = os.fstat(raw.fileno()).st_size
    except OSError as exc:
        raw.close()
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    except BaseException:
        raw.close()
        raise
    return _CappedGzip(path, gzip.GzipFile(fileobj=raw, mode="rb"), raw, size)


def open_text(path: PathArg) -> io.TextIOBase:
    """``path`` opened for reading text (gzip decompressed, a BOM dropped), or a one-line error."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


class _CappedGzip(io.RawIOBase):
    """A gzip stream that stops with an error once it has given more bytes than its cap."""

    def __init__(self, path: PathArg, stream: gzip.GzipFile, raw, compressed_bytes: int):
        self.path, self._stream, self._raw = path, stream, raw
        explicit = _max_decompressed_bytes.get()
        self.explicit = explicit is not None
        self.cap_bytes = explicit if explicit is not None else max(DEFAULT_RATIO * compressed_bytes,
                                                                   DEFAULT_FLOOR_BYTES)
        self.compressed_bytes = compressed_bytes
        self.given_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self._stream.readinto(buffer)
        self.given_bytes += count
        if self.given_bytes > self.cap_bytes:
            raise TraceFormatError(self.path, self._over_cap())
        return count

    def _over_cap(self) -> str:
        if self.explicit:
            return f"decompresses to more than {size_text(self.cap_bytes)}, the cap that {CAP_FLAG} sets"
        return (f"decompresses to more than {size_text(self.cap_bytes)}, the cap for a gzip file of "
                f"{size_text(self.compressed_bytes)} ({DEFAULT_RATIO} x its size, at least "
                f"{size_text(DEFAULT_FLOOR_BYTES)}); if it is a real trace, raise the cap with {CAP_FLAG} GIB")

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                self._raw.close()
        super().close()


class LineBlocks:
    """``path``'s text as ``(first line number, text)`` blocks of whole lines (see the module
    docstring). Every block but perhaps the last ends with ``"\\n"``; after the last one,
    ``ends_with_newline`` says whether the file's last character was a line end (``\\n`` or
    ``\\r``), which tells a row that was cut off from one that was merely short.
    """

    def __init__(self, path: PathArg, *, max_line_chars: int = MAX_LINE_CHARS, what: str = "line"):
        self.path = path
        self.max_line_chars = max_line_chars
        self.what = what
        self.ends_with_newline = True  # set for real once the file has been read

    def __iter__(self) -> Iterator[tuple[int, str]]:
        read_bytes = min(READ_BYTES, self.max_line_chars)  # so a line inside one read is never too long
        pending = b""  # the start of an unfinished line
        line = 1  # the line pending starts on
        first = True
        with open_binary(self.path) as handle:
            while True:
                chunk = self._read(handle, read_bytes, line)
                if not chunk:
                    break
                self.ends_with_newline = chunk.endswith((b"\n", b"\r"))
                data = pending + chunk if pending else chunk
                self._check_no_nul(data, line)
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    self._check_unfinished(data, line)
                    pending = data
                    continue
                if pending:
                    self._check_line(data[:data.find(b"\n") + 1], line)
                block, pending = data[:cut], data[cut:]
                if first:
                    block, first = block.removeprefix(_BOM), False
                yield line, self._decode(block, line)
                line += block.count(b"\n")
                self._check_unfinished(pending, line)
            if pending:
                if first:
                    pending = pending.removeprefix(_BOM)
                yield line, self._decode(pending, line)

    def _read(self, handle, size: int, line: int) -> bytes:
        try:
            return handle.read(size)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            # (the damage lies somewhere in the block being read, not necessarily on one line)
            after = f" after line {line - 1:,}" if line > 1 else ""
            damaged = " (damaged gzip data)" if isinstance(handle, _CappedGzip) else ""
            raise TraceFormatError(self.path, f"cannot read{after}{damaged}: {problem}") from None

    def _too_long(self, line: int) -> TraceFormatError:
        limit = f"the {limit_text(self.max_line_chars)} limit"
        for_what = "" if self.what == "line" else f" for one {self.what}"
        return TraceFormatError(self.path, f"line longer than {limit}{for_what}", line)

    def _check_line(self, data: bytes, line: int) -> None:
        """A whole line (its bytes) within the character limit."""
        if len(data) > self.max_line_chars and len(self._decode(data, line)) > self.max_line_chars:
            raise self._too_long(line)

    def _check_unfinished(self, data: bytes, line: int) -> None:
        """The start of a line, which may end inside a character, within the character limit."""
        if len(data) > self.max_line_chars:
            try:
                chars = codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
            except UnicodeDecodeError as exc:
                raise self._not_utf8(data, exc, line) from None
            if len(chars) > self.max_line_chars:
                raise self._too_long(line)

    def _check_no_nul(self, data: bytes, line: int) -> None:
        """Text has no NUL bytes (numpy would read ``"1\\0\\0"`` as ``1``: padding, to it)."""
        nul = data.find(b"\0")
        if nul >= 0:
            line_start = data.rfind(b"\n", 0, nul) + 1
            raise TraceFormatError(self.path, f"a NUL byte at column {nul - line_start + 1}: binary data, not text",
                                   line + data.count(b"\n", 0, nul))

    def _decode(self, data: bytes, line: int) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._not_utf8(data, exc, line) from None

    def _not_utf8(self, data: bytes, exc: UnicodeDecodeError, line: int) -> TraceFormatError:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        return TraceFormatError(self.path, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column "
                                f"{exc.start - line_start + 1})", line + data.count(b"\n", 0, exc.start))

