"""BurstGPT traces (Wang et al., 2024; HPMLL/BurstGPT): Azure OpenAI GPT usage in a campus.

Format: CSV with ``Timestamp`` (seconds from the start), ``Model`` (``ChatGPT`` or ``GPT-4``),
``Request tokens``, ``Response tokens``, ``Total tokens`` and ``Log Type`` (``Conversation log``
or ``API log``). Rows can be kept by model and by log type. A row with zero response tokens is a
request that failed: it is dropped and the loader says how many there were and where the first
one is (a ``TraceWarning``; the count is also in ``trace.metadata["failed_rows"]``). Rows with
zero request tokens are dropped and reported the same way (``empty_prompt_rows``).
"""

from __future__ import annotations

import numpy as np

from traces.errors import TraceFormatError, warn
from traces.loaders.build import build_trace
from traces.loaders.text import PathArg, clip, read_csv, to_numbers
from traces.trace import Trace

COLUMNS = ["Timestamp", "Model", "Request tokens", "Response tokens", "Log Type"]


def load_burstgpt(path: PathArg, *, model: str | None = None, log_type: str | None = None) -> Trace:
    table = read_csv(path, COLUMNS, optional=("Total tokens",))
    cols, lines = table.columns, table.lines
    keep = np.ones(len(table), dtype=bool)
    for column, wanted in (("Model", model), ("Log Type", log_type)):
        if wanted is not None:
            values = np.asarray([v.strip() for v in cols[column]])
            keep &= values == wanted
            if not (values == wanted).any():
                seen = ", ".join(sorted(set(values.tolist()))[:8])
                raise TraceFormatError(path, f"no row has {column} {wanted!r} (the file has: {clip(seen)})")
    arrival = to_numbers(path, cols["Timestamp"], lines, "Timestamp", integer=False)
    prompt = to_numbers(path, cols["Request tokens"], lines, "Request tokens", integer=True)
    output = to_numbers(path, cols["Response tokens"], lines, "Response tokens", integer=True)
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
