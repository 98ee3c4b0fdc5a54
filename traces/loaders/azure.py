"""Azure LLM inference traces (Patel et al., Splitwise, ISCA 2024; AzurePublicDataset).

Format: CSV with ``TIMESTAMP, ContextTokens, GeneratedTokens``; the timestamp is a naive wall-clock
datetime with seven fractional digits (``2023-11-16 18:15:46.6805900``), one more than Python's
``%f`` takes; numpy parses them whole at nanosecond resolution. The 2023 code and conversation
files share the format. Arrivals become seconds from the first request.
"""

from __future__ import annotations

import warnings

import numpy as np

from traces.errors import TraceFormatError
from traces.loaders.build import build_trace
from traces.loaders.text import PathArg, clip, read_csv, to_numbers
from traces.trace import Trace

COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def parse_timestamps(path: PathArg, stamps: list[str], lines: np.ndarray) -> np.ndarray:
    """Wall-clock stamps as seconds from the first (float64), or an error at the first bad one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy only warns about a time zone suffix
            times = np.asarray(stamps, dtype="datetime64[ns]")
    except (ValueError, UserWarning, DeprecationWarning):
        for stamp, line in zip(stamps, lines):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    np.datetime64(stamp.strip(), "ns")
            except (ValueError, UserWarning, DeprecationWarning):
                raise TraceFormatError(
                    path, f"TIMESTAMP: expected a date and time like 2023-11-16 18:15:46.6805900, "
                    f"found {stamp!r}", int(line)) from None
        raise
    bad = np.flatnonzero(np.isnat(times))
    if bad.size:
        raise TraceFormatError(path, "TIMESTAMP: missing (NaT)", int(lines[bad[0]]))
    # datetime64[ns] spans 1678-2262 and numpy wraps around silently beyond it: check the years
    try:
        years = np.asarray(stamps).astype("U4").astype(np.int64)  # the first four characters
    except ValueError:  # padded stamps: the slow way
        years = np.asarray([int(y) if y.isdigit() else 0 for y in (t.strip()[:4] for t in stamps)])
    wrong = (years < 1900) | (years > 2200)
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        raise TraceFormatError(path, f"TIMESTAMP: {clip(repr(stamps[row].strip()))} is not a date from 1900 to 2200",
                               int(lines[row]))
    return (times - times[0]).astype(np.int64) / 1e9


def load_azure(path: PathArg) -> Trace:
    table = read_csv(path, COLUMNS)
    cols, lines = table.columns, table.lines
    return build_trace(
        path, lines,
        arrival_s=parse_timestamps(path, cols["TIMESTAMP"], lines),
        prompt_len=to_numbers(path, cols["ContextTokens"], lines, "ContextTokens", integer=True, minimum=1),
        output_len=to_numbers(path, cols["GeneratedTokens"], lines, "GeneratedTokens", integer=True, minimum=1),
        source=f"azure:{path}",
    )
