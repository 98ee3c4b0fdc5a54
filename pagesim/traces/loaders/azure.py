"""Azure LLM inference traces (Patel et al., Splitwise, ISCA 2024; AzurePublicDataset).

Format: CSV with ``TIMESTAMP, ContextTokens, GeneratedTokens``; the timestamp is a naive wall-clock
datetime with seven fractional digits (``2023-11-16 18:15:46.6805900``), one more than Python's
``%f`` takes; numpy parses them whole at nanosecond resolution. The 2023 code and conversation
files share the format. Arrivals become seconds from the first request.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.build import build_trace
from pagesim.traces.loaders.columns import Numbers
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.loaders.text import read_csv
from pagesim.traces.trace import Trace


@dataclass(frozen=True)
class Stamps:
    """A ``Column`` of wall-clock stamps as ``datetime64[ns]``, or an error at the first bad one."""

    column: str = "TIMESTAMP"

    def convert(self, path: PathArg, stamps, lines: np.ndarray) -> np.ndarray:
        return parse_timestamps(path, stamps, lines)

    def join(self, chunks: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(chunks) if chunks else np.zeros(0, "datetime64[ns]")


def parse_timestamps(path: PathArg, stamps, lines: np.ndarray) -> np.ndarray:
    """Wall-clock stamps as ``datetime64[ns]``, or an error at the first bad one."""
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
                raise TraceFormatError(  # (the field is described, not quoted: see columns.py)
                    path, "TIMESTAMP: expected a date and time like 2023-11-16 18:15:46.6805900, found "
                    f"{'text that is not one' if stamp.strip() else 'nothing'}", int(line)) from None
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
        raise TraceFormatError(path, "TIMESTAMP: a date that is not from 1900 to 2200", int(lines[row]))
    return times


def load_azure(path: PathArg) -> Trace:
    table = read_csv(path, {"times": Stamps(), "prompt_len": Numbers("ContextTokens", integer=True, minimum=1),
                            "output_len": Numbers("GeneratedTokens", integer=True, minimum=1)})
    times = table.columns.pop("times")
    return build_trace(path, table.lines, arrival_s=(times - times[0]).astype(np.int64) / 1e9, **table.columns,
                       source=f"azure:{path}")
