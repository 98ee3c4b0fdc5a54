"""A study's results: one JSON line per finished run, appended the moment it finishes.

Invariants: a record is written as one line by one ``write`` and flushed to disk (``fsync``) before
the next run's record, so a study killed at any moment loses at most the runs in flight; a line cut
short by the kill (no final newline, or not JSON) is dropped on the next load and, when the study
loads it to append, the file is truncated back to its last whole line first. A study reruns only
failed runs, so an id has at most one successful record; ``load`` returns the last record of each
id (a retried failure's newest attempt).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


class ResultsStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self, *, repair: bool = True) -> dict[str, dict[str, Any]]:
        """The last record of each run id, in first-seen order; ``repair`` truncates a torn last line
        (a study about to append does; a report reading a running study does not)."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        records: dict[str, dict[str, Any]] = {}
        good_end = 0
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break  # no newline: a write cut short
            line = data[pos:end]
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if data.find(b"\n", end + 1) >= 0:
                    raise ValueError(f"{self.path}: line {_line_no(data, pos)} is not JSON; "
                                     "the results file was edited or corrupted") from None
                break
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError(f"{self.path}: line {_line_no(data, pos)} is not a run record")
            records[record["id"]] = record
            pos = good_end = end + 1
        if repair and good_end < len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(good_end)
        return records

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(_finite(record), sort_keys=True, allow_nan=False) + "\n"
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def _line_no(data: bytes, pos: int) -> int:
    return data.count(b"\n", 0, pos) + 1


def _finite(value: Any) -> Any:
    """NaN and infinities become null: JSON has no word for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
