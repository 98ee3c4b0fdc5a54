"""Trace loaders: one module per file format, one entry point, ``load_trace``.

``load_trace(path, format=None, ...)`` reads a trace file into a ``Trace``. The format is the one
named, or detected from the first line (a JSON object's keys, a CSV header's names): see
``detect_format``. Any of them may be gzip-compressed (``.gz``). Every problem is a
``TraceFormatError`` naming the file and line; safe repairs are ``TraceWarning``s.
"""

from __future__ import annotations

import gc
import zlib
from contextlib import contextmanager
from os import PathLike

from pagesim.engine.files import InputFileError, loads_json
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.azure import load_azure
from pagesim.traces.loaders.burstgpt import load_burstgpt
from pagesim.traces.loaders.generic import ColumnMap, load_csv, load_jsonl, load_lengths
from pagesim.traces.loaders.mooncake import load_mooncake
from pagesim.traces.loaders.names import AZURE_COLUMNS, BURSTGPT_COLUMNS, MOONCAKE_KEYS
from pagesim.traces.loaders.pagesim_jsonl import is_header, load_pagesim, write_jsonl
from pagesim.traces.loaders.stream import PathArg, open_text
from pagesim.traces.loaders.text import header_names, numbered_first_line
from pagesim.traces.trace import Trace

FORMATS: dict[str, str] = {
    "azure": "Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
    "mooncake": "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids of 512 tokens)",
    "burstgpt": "BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, Log Type)",
    "lengths": "length-only CSV (num_prefill_tokens, num_decode_tokens) + an arrival process",
    "csv": "any CSV with a header; --columns says which column is which",
    "jsonl": "any JSONL; --columns says which key is which",
    "pagesim": "pagesim's own JSONL (written by `pagesim trace gen`)",
    "sharegpt": "ShareGPT JSON array of conversations (first two turns; lengths by tokenizer or estimate)",
}


# formats whose columns and arrival times are fixed (no --columns, --time-unit or --arrival)
FIXED_FORMATS = ("azure", "mooncake", "burstgpt", "pagesim")


def detect_format(path: PathArg) -> str:
    """The format of ``path`` judged from its first line (a JSON array: from its first element)."""
    if _starts_json_array(path):
        return _array_format(path)
    number, line = numbered_first_line(path)
    if line.lstrip().startswith("{"):
        try:
            obj = loads_json(line, path=path, line=number)
        except InputFileError as exc:
            if exc.problem.startswith("not JSON"):
                raise TraceFormatError(path, "looks like JSON but does not parse", number) from None
            raise TraceFormatError(path, exc.problem, number) from None
        if not isinstance(obj, dict):
            return "jsonl"
        if is_header(obj):
            return "pagesim"
        if "hash_ids" in obj and len(MOONCAKE_KEYS & obj.keys()) >= 3:
            return "mooncake"  # a missing key is then reported by name
        return "jsonl"
    names = set(header_names(line))
    # most of a format's distinctive columns: that format (a missing one is then named)
    if len(AZURE_COLUMNS & names) >= 2:
        return "azure"
    if len(BURSTGPT_COLUMNS & names) >= 3:
        return "burstgpt"
    guessed = ColumnMap.guess(names)
    if guessed is not None and guessed.arrival is None:
        return "lengths"
    return "csv"


def _starts_json_array(path: PathArg) -> bool:
    """Whether the first non-space character of ``path`` is ``[`` (read a little at a time)."""
    handle = open_text(path)
    try:
        with handle:
            while True:
                chunk = handle.read(4096)
                if not chunk:
                    return False
                stripped = chunk.lstrip()
                if stripped:
                    return stripped[0] == "["
    except (OSError, EOFError, zlib.error, UnicodeDecodeError):
        return False  # the line reader reports it


def _array_format(path: PathArg) -> str:
    """``sharegpt`` if the array's first element is an object with ``conversations``."""
    from pagesim.traces.bench.reading import iter_json_array

    for index, line, entry in iter_json_array(path, what="entry"):
        if isinstance(entry, dict) and "conversations" in entry:
            return "sharegpt"
        raise TraceFormatError(path, "a JSON array whose first entry is not a ShareGPT conversation (an object "
                               "with \"conversations\"); trace files are CSV, JSONL or ShareGPT JSON", line)
    raise TraceFormatError(path, "an empty JSON array: no requests")


def load_trace(
    path: PathArg,
    format: str | None = None,
    *,
    columns: ColumnMap | None = None,
    model: str | None = None,
    log_type: str | None = None,
    arrivals=None,
    seed: int = 0,
    prefix_block_tokens: int = 0,
    time_unit: str = "s",
    tokenizer=None,
) -> Trace:
    """Read ``path`` as ``format`` (detected if None).

    ``columns`` maps fields to columns for ``csv``, ``jsonl`` and ``lengths``; ``model`` and
    ``log_type`` filter BurstGPT rows; ``arrivals`` (an arrival process) and ``seed`` give a
    length-only file its arrival times; ``prefix_block_tokens`` says how many tokens each
    identity of a generic JSONL's ``prefix_ids`` column stands for; ``time_unit`` is the unit
    of a recognised (not mapped) arrival column of a csv or jsonl file. ``tokenizer`` (a path,
    or a loaded ``pagesim.traces.bench.tokenizer`` object) counts a ShareGPT file's tokens; without one
    they are estimated (1 token per 4 characters), as the trace's metadata says.
    """
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r} (formats: {', '.join(FORMATS)})")
    if (model or log_type) and fmt != "burstgpt":
        raise ValueError(f"--burstgpt-model and --burstgpt-log-type filter BurstGPT traces, not {fmt}")
    if arrivals is not None and fmt in FIXED_FORMATS:
        raise ValueError(f"a {fmt} trace has its own arrival times; an arrival process is for length-only files")
    if columns is not None and fmt in (*FIXED_FORMATS, "sharegpt"):
        raise ValueError(f"--columns is for csv, jsonl and lengths files, not {fmt}")
    if tokenizer is not None and fmt != "sharegpt":
        raise ValueError(f"a tokenizer counts the text of ShareGPT files; a {fmt} trace holds token counts")
    # Loading builds millions of short-lived lists and dicts that hold no cycles; the cyclic
    # garbage collector would otherwise scan them again and again (2-3x the parse time).
    with paused_gc():
        return _load(path, fmt, columns=columns, model=model, log_type=log_type, arrivals=arrivals,
                     seed=seed, prefix_block_tokens=prefix_block_tokens, time_unit=time_unit,
                     tokenizer=tokenizer)


@contextmanager
def paused_gc():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(path, fmt, *, columns, model, log_type, arrivals, seed, prefix_block_tokens, time_unit,
          tokenizer=None) -> Trace:
    if fmt == "sharegpt":
        return _load_sharegpt(path, tokenizer=tokenizer, arrivals=arrivals, seed=seed)
    if fmt == "azure":
        return load_azure(path)
    if fmt == "mooncake":
        return load_mooncake(path)
    if fmt == "burstgpt":
        return load_burstgpt(path, model=model, log_type=log_type)
    if fmt == "lengths":
        return load_lengths(path, arrivals=arrivals, seed=seed, columns=columns)
    if fmt == "csv":
        return load_csv(path, columns, arrivals=arrivals, seed=seed, time_unit=time_unit)
    if fmt == "jsonl":
        return load_jsonl(path, columns, arrivals=arrivals, seed=seed, prefix_block_tokens=prefix_block_tokens,
                          time_unit=time_unit)
    return load_pagesim(path)


def _load_sharegpt(path, *, tokenizer, arrivals, seed) -> Trace:
    """Every valid entry of a ShareGPT file in file order (vLLM's rules, no shuffle, no
    oversampling: ``pagesim.traces.bench.sharegpt``); arrival times from ``arrivals`` if given."""
    from dataclasses import replace

    import numpy as np

    from pagesim.traces.bench.sharegpt import sharegpt_trace
    from pagesim.traces.bench.tokenizer import load_tokenizer

    if tokenizer is None or isinstance(tokenizer, (str, PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    trace = sharegpt_trace(path, tokenizer, num_prompts=None, seed=seed, shuffle=False, oversample=False)
    if arrivals is None:
        return trace
    return replace(trace, arrival_s=arrivals.times(len(trace), np.random.default_rng(seed)), has_arrivals=True,
                   source=f"{trace.source} with {arrivals.describe()} arrivals (seed {seed})",
                   metadata={**trace.metadata, "arrival_process": arrivals.describe()})


__all__ = ["FIXED_FORMATS", "FORMATS", "ColumnMap", "detect_format", "load_trace", "write_jsonl"]
