"""Reading a file the user named: a regular file only, and no more of it than a stated limit.

A FIFO blocks its reader until some writer comes, a device (``/dev/zero``) never ends and a
folder cannot be read, so each is refused by name before a byte is read. The check is made on
the opened descriptor (``open_regular`` opens without blocking, then asks ``fstat``), so a file
swapped for a FIFO after a ``stat`` cannot make the read block. ``require_regular_file`` is the
same check on a path, for files that another library opens itself (pyarrow, safetensors).

``read_small_bytes`` / ``read_small_text`` / ``read_json`` / ``read_toml`` read a
configuration-like file (a spec, a profile, a ``config.json``, a result file) whole, but only after
checking its size against ``limit_bytes``, and never read more than that, so a file that grows while
it is read is refused too.

Parsing is guarded as reading is (``loads_json``, ``loads_toml``; the trace and dataset readers
parse each JSONL line and each JSON array element through ``loads_json`` too):

- **depth**: no document may nest arrays, objects or tables more than ``MAX_NESTING`` levels
  deep. The text is measured before it is parsed (``nesting_exceeds``; ``JsonNesting`` for a text
  read in pieces: strings and comments left out, the brackets counted), so a parser that recurses
  (``json``'s, ``tomllib``) never meets 100,000 nested ``[``, and the limit does not hang on the
  interpreter's recursion limit (which depends on how deep the caller already is, and lets
  through documents deeper than code that walks them recursively can take);
- **numbers**: ``number_problem`` says, without quoting it, what keeps a value from being a
  finite number in a range (a string, null, NaN, an infinity, a negative, a fraction, too large);
  ``first_non_finite`` finds a NaN or an infinity anywhere in a document.

Every problem is an ``InputFileError``: a ``ValueError`` whose message is one line,
``FILE: problem`` or ``FILE:LINE: problem``, that quotes none of the file's content. Pure Python
(numpy is imported only to measure a text that holds many brackets); importable from anywhere
(engine, sim, traces, reports).
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import stat
import tomllib
from typing import Any, BinaryIO

PathArg = str | os.PathLike[str]

#: Levels of arrays, objects and tables a document may nest. The files pagesim reads need few: a
#: vLLM result file 2 (``itls``), a ShareGPT entry 3, a ``config.json`` or a profile 4 or 5.
MAX_NESTING = 64


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
    """The JSON document ``path`` holds (read by ``read_small_text``, parsed by ``loads_json``); a
    syntax error is ``FILE:LINE: not JSON (problem, column C)``. NaN and Infinity are read as
    Python reads them: a caller that refuses them checks the values (``first_non_finite``)."""
    return loads_json(read_small_text(path, limit_bytes=limit_bytes, what=what), path=path)


def read_toml(path: PathArg, *, limit_bytes: int, what: str) -> dict[str, Any]:
    """The TOML document ``path`` holds (read by ``read_small_text``, parsed by ``loads_toml``)."""
    return loads_toml(read_small_text(path, limit_bytes=limit_bytes, what=what), path=path)


# ---------------------------------------------------------------------- parsing, guarded
def loads_json(text: str, *, path: PathArg, line: int | None = None, limit: int = MAX_NESTING) -> Any:
    """``text`` (all of ``path``, or its line ``line``) parsed as JSON; an ``InputFileError`` when
    it nests more than ``limit`` levels (measured before parsing) or is not JSON: ``not JSON
    (problem, column C)``, at the line of the problem when ``line`` is None."""
    if nesting_exceeds(text, limit):
        raise _too_deep(path, text, limit, line, "json")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = exc.lineno if line is None else line
        raise InputFileError(path, f"not JSON ({exc.msg}, column {exc.colno})", where) from None
    except ValueError:  # a number of more digits than int() reads (sys.get_int_max_str_digits)
        raise InputFileError(path, "not JSON (a number with too many digits to read)", line) from None
    except RecursionError:  # (not reached under the limit; here so that no parser leaves a traceback)
        raise InputFileError(path, f"JSON nested more than {limit} levels deep", line) from None


def loads_toml(text: str, *, path: PathArg, limit: int = MAX_NESTING) -> dict[str, Any]:
    """``text`` (all of ``path``) parsed as TOML (``tomllib``); an ``InputFileError`` when its
    arrays and inline tables nest more than ``limit`` levels (measured before parsing), its tables
    do (``[a.b.c...]``, measured after), or it is not TOML: ``not valid TOML (problem)``, as
    ``tomllib`` says it (a line and a column, no text)."""
    if nesting_exceeds(text, limit, syntax="toml"):
        raise _too_deep(path, text, limit, None, "toml")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(path, f"not valid TOML ({exc})") from None
    except RecursionError:  # (not reached under the limit; here so that no parser leaves a traceback)
        raise InputFileError(path, f"TOML nested more than {limit} levels deep") from None
    if nesting_depth(document) > limit:
        raise InputFileError(path, f"TOML nested more than {limit} levels deep")
    return document


def _too_deep(path: PathArg, text: str, limit: int, line: int | None, syntax: str) -> InputFileError:
    """The refusal of a text that nests too deeply, at the line and column where it does."""
    offset = first_too_deep(text, limit, syntax=syntax) or 0
    line_start = text.rfind("\n", 0, offset) + 1
    where = text.count("\n", 0, offset) + (line or 1)
    return InputFileError(path, f"{syntax.upper()} nested more than {limit} levels deep (column "
                          f"{offset - line_start + 1})", where)


# What may hold a bracket that is not structure in TOML: its four kinds of string, and comments.
_TOML_NOT_STRUCTURE = re.compile(
    r'"""(?:[^"\\]|\\.|"(?!""))*(?:"""|\\?\Z)'  # multi-line basic string
    r"|'''(?:[^']|'(?!''))*(?:'''|\Z)"  # multi-line literal string
    r'|"(?:[^"\\\n]|\\.)*(?:"|(?=\n)|\\?\Z)'  # basic string
    r"|'[^'\n]*(?:'|(?=\n)|\Z)"  # literal string
    r"|#[^\n]*",  # comment
    re.DOTALL)
_CHUNK_CHARS = 4 * 2**20  # characters measured at a time (memory: a few times this in bytes)


def nesting_exceeds(text: str, limit: int = MAX_NESTING, *, syntax: str = "json") -> bool:
    """Whether ``text`` (JSON, or TOML with ``syntax="toml"``) opens more than ``limit`` arrays,
    objects or tables inside one another, strings (and TOML's comments) left out.

    Cheap when the text holds at most ``limit`` opening brackets (two ``count`` calls); otherwise
    ``JsonNesting`` measures it (TOML: a regular expression removes strings and comments first).
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    return first_too_deep(text, limit, syntax=syntax) is not None


def first_too_deep(text: str, limit: int = MAX_NESTING, *, syntax: str = "json") -> int | None:
    """The index in ``text`` of the first bracket that opens level ``limit + 1``, or None (for a
    message that names the line and column)."""
    if syntax == "json":
        return JsonNesting(limit).feed(text)
    if syntax != "toml":
        raise ValueError(f"syntax must be json or toml, got {syntax!r}")
    if text.count("[") + text.count("{") <= limit:
        return None
    # strings and comments blanked to as many spaces: indices kept (TOML specs are small)
    blanked = _TOML_NOT_STRUCTURE.sub(lambda match: " " * (match.end() - match.start()), text)
    return JsonNesting(limit).feed(blanked)  # (no quote is left in it: brackets only count)


class JsonNesting:
    """How deeply a JSON text read in pieces nests: ``feed(piece)`` measures each character once,
    carrying from piece to piece the depth, whether a string is open and the run of backslashes
    the last piece ended with (an odd run escapes the quote that follows).

    Exact for the part of a text a JSON parser accepts: inside it a quote opens or closes a string
    unless an odd run of backslashes precedes it, and only brackets outside strings are structure.
    Vectorised: numpy finds the few characters that matter (quotes, backslashes, brackets) in
    the UTF-8 bytes (no byte of a longer character is one of them); only those are looked at.
    """

    def __init__(self, limit: int = MAX_NESTING):
        self.limit = limit
        self.depth = 0
        self.in_string = False
        self.backslashes = 0  # length of the run of backslashes the text fed so far ends with

    def feed(self, piece: str) -> int | None:
        """The index in ``piece`` of the first bracket that opens level ``limit + 1``, or None.
        (After a bracket past the limit the state is not kept up: the text is refused.)"""
        for start in range(0, len(piece), _CHUNK_CHARS):
            chunk = piece[start:start + _CHUNK_CHARS]
            data = chunk.encode("utf-8", "surrogatepass")
            past = self._feed_bytes(data)
            if past is not None:
                return start + len(data[:past].decode("utf-8", "surrogatepass"))
        return None

    def _feed_bytes(self, data: bytes) -> int | None:
        import numpy as np

        raw = np.frombuffer(data, np.uint8)
        quotes = np.flatnonzero(raw == ord('"'))
        carried = self.backslashes
        trailing = len(data) - len(data.rstrip(b"\\"))  # the run of backslashes the chunk ends with
        self.backslashes = trailing + (carried if trailing == len(data) else 0)
        if quotes.size and (b'\\"' in data or (carried % 2 and data[:1] == b'"')):
            quotes = quotes[~self._escaped(quotes, np.flatnonzero(raw == ord("\\")), carried)]
        # brackets (a 0/1 mask: numpy finds a bool array's ones fastest), and those outside strings
        brackets = np.flatnonzero(np.frombuffer(data.translate(_BRACKETS), np.bool_))
        outside = (np.searchsorted(quotes, brackets) + self.in_string) % 2 == 0
        self.in_string ^= bool(quotes.size % 2)
        brackets = brackets[outside]
        if not brackets.size:
            return None
        opens = (raw[brackets] == ord("[")) | (raw[brackets] == ord("{"))
        running = self.depth + np.cumsum(np.where(opens, 1, -1), dtype=np.int64)
        past = np.flatnonzero(running > self.limit)
        if past.size:
            return int(brackets[past[0]])
        self.depth = int(running[-1])
        return None

    @staticmethod
    def _escaped(quotes, slashes, carried: int):
        """Which of ``quotes`` (positions) an odd run of backslashes (``slashes``: positions; a run
        from position 0 goes on with ``carried`` from the last chunk) escapes."""
        import numpy as np

        before = np.zeros(quotes.size, np.int64)  # backslashes right before each quote
        if slashes.size:
            # positions minus their rank are equal along a run of consecutive positions
            run_id = slashes - np.arange(slashes.size)
            last = np.minimum(np.searchsorted(slashes, quotes - 1), slashes.size - 1)
            follows = slashes[last] == quotes - 1
            first = np.searchsorted(run_id, run_id[last])
            before = np.where(follows, last - first + 1 + np.where(slashes[first] == 0, carried, 0), 0)
        before = np.where(quotes == 0, carried, before)
        return before % 2 == 1


# The brackets, as a ``bytes.translate`` table: 1 for each, 0 for every other byte.
_BRACKETS = bytes(1 if b in b"[]{}" else 0 for b in range(256))


def nesting_depth(value: Any) -> int:
    """How many lists and dicts ``value`` (a parsed document) holds inside one another, counted
    without recursion."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def first_non_finite(value: Any, where: str = "") -> str | None:
    """The key path (``summary.throughput_rps``, ``ttfts[2]``; ``where`` before it) of the first
    NaN or infinity in ``value``, a parsed document, or None; walked without recursion."""
    pending = [(value, where)]
    while pending:
        item, at = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return at or "the value"
        elif isinstance(item, dict):
            pending.extend((child, f"{at}.{key}" if at else str(key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            pending.extend((child, f"{at}[{k}]") for k, child in reversed(list(enumerate(item))))
    return None


def describe_value(value: Any) -> str:
    """What a parsed JSON or TOML value is, in words (``a string``, ``null``), never the value."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    kinds = {str: "a string", list: "a list", dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def number_problem(value: Any, *, minimum: float | None = 0, maximum: float | None = None,
                   integer: bool = False) -> str | None:
    """What keeps ``value`` (read from a file) from being a finite number in ``[minimum, maximum]``
    (a whole one with ``integer``: an int, or a float such as ``12.0``), or None. The words
    describe the value (``NaN``, ``a negative number``, ``a string``) and never quote it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, found {describe_value(value)}"
    if isinstance(value, float) and math.isnan(value):
        return "must be a number, found NaN"
    if isinstance(value, float) and math.isinf(value):
        return "must be a finite number, found an infinity (or a number too large to hold)"
    if integer and isinstance(value, float) and not value.is_integer():
        return "must be a whole number, found a fraction"
    if minimum is not None and value < minimum:
        return f"must be >= {minimum:g}, found {'a negative' if value < 0 <= minimum else 'a smaller'} number"
    if maximum is not None and value > maximum:
        return f"must be at most {maximum:,}, found a larger number"
    return None


def position_of(data: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, column in bytes) of ``data[offset]``."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1
