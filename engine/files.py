"""Reading a file the user named: a regular file only, and no more of it than a stated limit.

A FIFO blocks its reader until some writer comes, a device (``/dev/zero``) never ends and a
folder cannot be read, so each is refused by name before a byte is read. The check is made on
the opened descriptor (``open_regular`` opens without blocking, then asks ``fstat``), so a file
swapped for a FIFO after a ``stat`` cannot make the read block. ``require_regular_file`` is the
same check on a path, for files that another library opens itself (pyarrow, safetensors).

``read_small_bytes`` / ``read_small_text`` / ``read_json`` read a configuration-like file (a
spec, a profile, a ``config.json``, a result file) whole, but only after checking its size
against ``limit_bytes``, and never read more than that, so a file that grows while it is read is
refused too.

Every problem is an ``InputFileError``: a ``ValueError`` whose message is one line,
``FILE: problem`` or ``FILE:LINE: problem``, that quotes none of the file's content. Pure Python;
importable from anywhere (engine, sim, traces, reports).
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from typing import Any, BinaryIO

PathArg = str | os.PathLike[str]


class InputFileError(ValueError):
    """A file that cannot be read as asked; the message is ``FILE[:LINE]: problem``."""

    def __init__(self, path: PathArg, problem: str, line: int | None = None):
        self.path = os.fspath(path)
        self.problem = problem
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}")


def size_text(num_bytes: float) -> str:
    """``num_bytes`` in binary units, as messages state limits: ``4 MiB``, ``1.5 GiB``, ``812 bytes``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            value = num_bytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{num_bytes:.0f} bytes"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refusal(path: PathArg, kind: str, what: str) -> InputFileError:
    if kind == "a directory":
        return InputFileError(path, f"is a directory, not a {what}")
    return InputFileError(path, f"is {kind}, not a regular file: refusing to read it as a {what}")


def _os_problem(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    return f"cannot read: {exc.strerror or exc}"


def require_regular_file(path: PathArg, *, what: str = "file") -> None:
    """An ``InputFileError`` unless ``path`` is (a link to) a regular file; ``what`` names what
    the file should have been (``trace file``, ``profile``) in the message."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputFileError(path, _os_problem(exc)) from None
    kind = _kind(mode)
    if kind is not None:
        raise _refusal(path, kind, what)


def open_regular(path: PathArg, *, what: str = "file") -> BinaryIO:
    """``path`` opened for reading bytes, or an ``InputFileError`` if it is not a regular file.

    NOTE: opened with ``O_NONBLOCK`` and checked with ``fstat``: opening a FIFO without it would
    wait for a writer, and checking the path before opening it would leave a window in which
    the file could be replaced. (The flag changes nothing for a regular file.)
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise _refusal(path, "a directory", what) from None
    except OSError as exc:
        raise InputFileError(path, _os_problem(exc)) from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
    except OSError as exc:
        os.close(fd)
        raise InputFileError(path, _os_problem(exc)) from None
    if kind is not None:
        os.close(fd)
        raise _refusal(path, kind, what)
    return os.fdopen(fd, "rb")


def read_small_bytes(path: PathArg, *, limit_bytes: int, what: str) -> bytes:
    """The whole of ``path``, a regular file of at most ``limit_bytes``, else an ``InputFileError``
    naming the file, its size and the limit (``what``: the kind of file, for messages)."""
    with open_regular(path, what=what) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            if size > limit_bytes:
                raise InputFileError(path, f"{size_text(size)}, larger than the {size_text(limit_bytes)} a {what} "
                                     "may be")
            data = handle.read(limit_bytes + 1)
        except OSError as exc:
            raise InputFileError(path, _os_problem(exc)) from None
    if len(data) > limit_bytes:  # it grew after the size was checked
        raise InputFileError(path, f"grew past the {size_text(limit_bytes)} a {what} may be while being read")
    return data


def read_small_text(path: PathArg, *, limit_bytes: int, what: str) -> str:
    """``path`` as UTF-8 text (a leading BOM dropped), read by ``read_small_bytes``.

    A file that is not UTF-8 is one ``InputFileError`` naming the line and column of the first
    bad byte, not the byte's neighbours. Usage: ``read_small_text(spec_path, limit_bytes=16 *
    2**20, what="study spec")``; then parse the text and report its errors as ``FILE:LINE: ...``.
    """
    data = read_small_bytes(path, limit_bytes=limit_bytes, what=what)
    skipped = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skipped:].decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = skipped + exc.start
        line, column = position_of(data, bad)
        raise InputFileError(path, f"not UTF-8 text (byte 0x{data[bad]:02x} at column {column})", line) from None


def read_json(path: PathArg, *, limit_bytes: int, what: str) -> Any:
    """The JSON document ``path`` holds (read by ``read_small_text``); a syntax error is
    ``FILE:LINE: not JSON (problem, column C)``. NaN and Infinity are read as Python reads them:
    a caller that refuses them checks the values."""
    text = read_small_text(path, limit_bytes=limit_bytes, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not JSON ({exc.msg}, column {exc.colno})", exc.lineno) from None
    except RecursionError:
        raise InputFileError(path, "JSON nested too deeply to read") from None


def position_of(data: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, column in bytes) of ``data[offset]``."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1
