"""Assembling a ``Trace`` from a loader's columns, with row errors restated at file lines."""

from __future__ import annotations

import numpy as np

from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.trace import Trace


def build_trace(path: PathArg, lines: np.ndarray, *, rebase: bool = True, **columns) -> Trace:
    """``Trace(**columns)``; a problem with row ``i`` is reported at ``lines[i]`` of ``path``.

    With ``rebase``, arrival times are shifted so the first request arrives at 0 (files hold
    wall-clock or relative stamps; the trace type holds seconds from the first arrival).
    """
    arrival_s = np.asarray(columns.pop("arrival_s"), dtype=np.float64)
    if rebase and arrival_s.size and np.isfinite(arrival_s[0]):
        arrival_s = arrival_s - arrival_s[0]
    try:
        return Trace(arrival_s=arrival_s, **columns)
    except TraceFormatError as exc:
        if exc.row is not None and exc.problem == "arrival times must be sorted":
            row = exc.row
            raise TraceFormatError(
                path, f"arrival times must be sorted: this request arrives "
                f"{arrival_s[row - 1] - arrival_s[row]:.6g} s before the one on line "
                f"{int(lines[row - 1])} (sort the file by time first)", int(lines[row])) from None
        raise exc.at_line_of(path, lines) from None

