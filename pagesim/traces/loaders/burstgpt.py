"""BurstGPT traces (Wang et al., 2024; HPMLL/BurstGPT): Azure OpenAI GPT usage in a campus.

Format: CSV with ``Timestamp`` (seconds from the start), ``Model`` (``ChatGPT`` or ``GPT-4``),
``Request tokens``, ``Response tokens``, ``Total tokens`` and ``Log Type`` (``Conversation log``
or ``API log``). Rows can be kept by model and by log type. A row with zero response tokens is a
request that failed: it is dropped and the loader says how many there were and where the first
one is (a ``TraceWarning``; the count is also in ``trace.metadata["failed_rows"]``). Rows with
zero request tokens are dropped and reported the same way (``empty_prompt_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagesim.traces.errors import TraceFormatError, warn
from pagesim.traces.loaders.build import build_trace
from pagesim.traces.loaders.columns import Numbers, Texts, names_said
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.loaders.text import read_csv
from pagesim.traces.trace import Trace

# The values BurstGPT's release has: an error may name these (never the file's other values)
KNOWN_VALUES = {"Model": ("ChatGPT", "GPT-4"), "Log Type": ("Conversation log", "API log")}


@dataclass(frozen=True)
class _Present:
    """A column that must be in the header but whose values are not kept."""

    column: str

    def convert(self, path, values, lines) -> None:
        return None

    def join(self, chunks: list) -> None:
        return None


def load_burstgpt(path: PathArg, *, model: str | None = None, log_type: str | None = None) -> Trace:
    filters = {"Model": model, "Log Type": log_type}
    # Model and Log Type must be there; their text is kept only to filter by it
    kinds = {"arrival": Numbers("Timestamp", integer=False), "prompt": Numbers("Request tokens", integer=True),
             "output": Numbers("Response tokens", integer=True)}
    kinds.update({column: _Present(column) if wanted is None else Texts(column) for column, wanted in filters.items()})
    table = read_csv(path, kinds)
    cols, lines = table.columns, table.lines
    keep = np.ones(len(table), dtype=bool)
    for column, wanted in filters.items():
        if wanted is not None:
            values = cols[column]
            keep &= values == wanted
            if not (values == wanted).any():
                seen = names_said(np.unique(values).tolist(), KNOWN_VALUES[column], noun="value")
                raise TraceFormatError(path, f"no row has {column} {wanted!r} (the file has {seen})")
    arrival, prompt, output = cols["arrival"], cols["prompt"], cols["output"]
    failed = keep & (output == 0)
    if failed.any():
        first = int(lines[np.flatnonzero(failed)[0]])
        warn(path, f"dropped {int(failed.sum())} failed request(s) with 0 response tokens "
             f"(the first on line {first})")
    empty = keep & ~failed & (prompt == 0)
    if empty.any():
        first = int(lines[np.flatnonzero(empty)[0]])
        warn(path, f"dropped {int(empty.sum())} request(s) with 0 request tokens, which no server "
             f"would run (the first on line {first})")
    keep &= ~failed & ~empty
    if not keep.any():
        raise TraceFormatError(path, "no requests left after filtering")
    lines = lines[keep]
    return build_trace(
        path, lines,
        arrival_s=arrival[keep], prompt_len=prompt[keep], output_len=output[keep],
        source=f"burstgpt:{path}",
        metadata={"failed_rows": int(failed.sum()), "empty_prompt_rows": int(empty.sum()),
                  "model": model, "log_type": log_type},
    )

