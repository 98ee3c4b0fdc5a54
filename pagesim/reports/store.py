"""A study's results: one JSON line per finished run, appended the moment it finishes.

Invariants: a record is written as one line and flushed to disk (``fsync``) before the next run's
record (a write that fails is undone), so a study killed at any moment loses at most the runs in
flight; a line cut short by the kill (no final newline) is dropped on the next load and, when the
study loads it to append, the file is truncated back to its last whole line first. A study reruns
only failed runs, so an id has at most one successful record; ``load`` returns the last record of
each id (a retried failure's newest attempt).

Every whole line is checked (``parse_record``): UTF-8 without NUL bytes, one JSON object, a run
record as ``pagesim.reports.runner.run_one`` writes it (an id, a config whose ``run_id`` is that id, a
status of "ok" with a summary or "error" with the error, no NaN or infinity anywhere). A line that fails is never fatal: its run
counts as not run (so the study runs it again) and a ``ResultsWarning`` says which line and why.
Loading to append (``repair``) also sets it aside: it is appended to ``results.rejected.jsonl``
with its line number, its problem and the line whole (``text``, or ``bytes_base64`` when it is
not UTF-8), then ``results.jsonl`` is rewritten without it (temporary file,
flushed, renamed), so the next load is clean. Loading to read (a report) writes nothing.

Both files are opened to write with ``pagesim.engine.output_folders.own_opener``: never through a symbolic link
(one planted in the study folder would redirect the records to the file it names), and only as
regular files; ``results.jsonl`` is rewritten under a fresh staging name (``staged_files``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import re
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pagesim.engine.atomic import staged_files, writing
from pagesim.engine.files import first_non_finite, open_regular
from pagesim.engine.output_folders import own_opener
from pagesim.reports.run_config import run_id

STATUSES = ("ok", "error")
# NaN, Infinity, or an exponent of 3+ digits (1e400 reads as infinity): only then is a record walked
_MAY_HOLD_NON_FINITE = re.compile(r"NaN|Infinity|[0-9][eE][+-]?[0-9]{3}")
SHOWN = 3  # rejected lines a warning names


class ResultsWarning(UserWarning):
    """Lines of a results file were skipped or set aside; the message says which and why."""


class ResultsStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def rejected_path(self) -> Path:
        """Where ``load(repair=True)`` sets rejected lines aside: ``results.rejected.jsonl``."""
        return self.path.with_name(f"{self.path.stem}.rejected{self.path.suffix}")

    def load(self, *, repair: bool = True) -> dict[str, dict[str, Any]]:
        """The last valid record of each run id, in first-seen order. ``repair`` (a study about to
        append) truncates a torn last line and sets rejected lines aside; without it (a report
        reading a study, perhaps a running one) nothing is written."""
        if not os.path.lexists(self.path):
            return {}
        with open_regular(self.path, what="study's results file") as fh:  # (a FIFO would block, /dev/zero never end)
            data = fh.read()
        records: dict[str, dict[str, Any]] = {}
        kept: list[tuple[int, int]] = []  # where the valid lines are (start, end past the newline)
        rejected: list[tuple[int, bytes, str]] = []  # (line number, line, problem)
        pos = line_no = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break  # no newline: a write cut short
            line_no += 1
            line = data[pos:end]
            record, why = parse_record(line)
            if why is None:
                records[record["id"]] = record
                kept.append((pos, end + 1))
            elif line.strip():  # (a blank line is nothing to report)
                rejected.append((line_no, line, why))
            pos = end + 1
        if rejected:
            self._warn(rejected, repair)
        if repair and rejected:
            with writing(self.rejected_path):
                self._set_aside(rejected)
            with writing(self.path):
                self._rewrite(b"".join(data[start:end] for start, end in kept))
        elif repair and pos < len(data):
            with open(self.path, "r+b", opener=own_opener) as fh:
                fh.truncate(pos)
        return records

    def append(self, record: dict[str, Any]) -> None:
        """``record`` as one line, on disk when this returns; a write that fails (a full disk) is
        undone, so no torn line is left, and raised as one ``OSError`` naming the file."""
        line = (json.dumps(_finite(record), sort_keys=True, allow_nan=False) + "\n").encode()
        with writing(self.path):
            fd = own_opener(str(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # (never through a link)
            try:
                size = os.fstat(fd).st_size
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                    raise
            finally:
                os.close(fd)

    def _warn(self, rejected: list[tuple[int, bytes, str]], repair: bool) -> None:
        """One line: ``FILE:LINE: problem; what was done`` (for several, the first few and a count)."""
        if len(rejected) == 1:
            line_no, _, why = rejected[0]
            where, run, it = f"{self.path}:{line_no}: {why}", "its run counts", "it"
        else:
            shown = "; ".join(f"line {n}: {why}" for n, _, why in rejected[:SHOWN])
            more = f"; and {len(rejected) - SHOWN} more" if len(rejected) > SHOWN else ""
            where = f"{self.path}: {len(rejected)} lines are not run records ({shown}{more})"
            run, it = "their runs count", "them"
        done = (f"set aside in {self.rejected_path.name}; {run} as not run, so this study runs {it} again" if repair
                else f"skipped: {run} as not run until `pagesim study` sets {it} aside and runs {it} again")
        warnings.warn(f"{where}; {done}", ResultsWarning, stacklevel=3)

    def _set_aside(self, rejected: list[tuple[int, bytes, str]]) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entries = []
        for line_no, line, why in rejected:
            entry = {"line": line_no, "problem": why, "set_aside_at": now}
            try:  # the line whole (it leaves results.jsonl): as text, or its bytes when it is not UTF-8
                entry["text"] = line.decode("utf-8")
            except UnicodeDecodeError:
                entry["bytes_base64"] = base64.b64encode(line).decode("ascii")
            entries.append(json.dumps(entry, sort_keys=True) + "\n")
        with open(self.rejected_path, "a", encoding="utf-8", opener=own_opener) as fh:
            fh.write("".join(entries))
            fh.flush()
            os.fsync(fh.fileno())

    def _rewrite(self, data: bytes) -> None:
        """``results.jsonl`` replaced by ``data`` in one step: written beside it, flushed, renamed."""
        with staged_files([self.path]) as staged:
            staged[self.path].write_bytes(data)


def parse_record(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a valid run record, ``(None, problem)`` otherwise."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start})"
    if "\0" in text:
        return None, f"NUL bytes (first at character {text.index(chr(0))})"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting too deep
        return None, f"not JSON ({type(exc).__name__})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not a run record"
    if _MAY_HOLD_NON_FINITE.search(text):  # (pagesim writes none: a figure the report must not draw)
        where = first_non_finite(record)
        if where is not None:
            return None, f"{where} is not a finite number (NaN or an infinity)"
    why = problem(record)
    if why is None and record["id"] != run_id(record["config"]):
        why = f"id {_short(record['id'])} is not its config's ({run_id(record['config'])})"
    return (record, None) if why is None else (None, why)


def problem(record: dict[str, Any]) -> str | None:
    """What makes ``record`` not a run record as ``run_one`` writes it (its id aside), or None."""
    if not isinstance(record.get("id"), str):
        return "no run id"
    if not isinstance(record.get("config"), dict):
        return "no config"
    status = record.get("status")
    if status not in STATUSES:
        return f"status {_short(status)}, not one of {', '.join(STATUSES)}"
    if status == "ok" and not isinstance(record.get("summary"), dict):
        return "status ok without a summary"
    if status == "error" and not isinstance(record.get("error"), str):
        return "status error without the error"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(value: Any) -> Any:
    """NaN and infinities become null: JSON has no word for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
