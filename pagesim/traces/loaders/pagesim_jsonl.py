"""pagesim's own trace file: JSONL with a header line, written by ``pagesim trace gen``.

Line 1 is a header, ``{"pagesim_trace": 1, "prefix_block_tokens": B, "has_arrivals": true,
"source": "..."}``; every further line is one request, ``{"arrival_s": 0.12, "prompt_len": 161,
"output_len": 338}`` plus, where they differ from the defaults, ``n``, ``beam_width``,
``priority``, ``prefix_ids`` (list of integer identities of B tokens each) and, for multi-turn
workloads, ``conversation_id`` and ``turn``. Reading it back gives the same trace, column for
column. Files are written under a staging name and renamed (``pagesim.engine.outputs``), so a failed
write leaves no half file; a device or FIFO is written as a stream.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np

from pagesim.engine.outputs import OutputFile
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.columns import ChunkedColumns
from pagesim.traces.loaders.generic import ColumnMap, columns_to_trace, field_kinds
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.loaders.text import read_jsonl
from pagesim.traces.trace import Trace

HEADER_KEY = "pagesim_trace"
VERSION = 1
_DEFAULTS = {"n": 1, "beam_width": 1, "priority": 0}
_READ_DEFAULTS = {**_DEFAULTS, "prefix_ids": []}  # a row without the key has these


def is_header(obj: dict) -> bool:
    return HEADER_KEY in obj


def write_jsonl(trace: Trace, path: PathArg | OutputFile) -> Path:
    """Write ``trace`` to ``path`` (gzip if it ends in ``.gz``) whole, or as a stream to a device
    or FIFO (``pagesim.engine.outputs``: only a regular file or nothing is replaced). ``path`` may be an
    ``OutputFile`` checked before the trace was made."""
    output = path if isinstance(path, OutputFile) else OutputFile(path, "-o")
    path = output.path
    header = {HEADER_KEY: VERSION, "prefix_block_tokens": trace.prefix_block_tokens,
              "has_arrivals": trace.has_arrivals, "source": trace.source}
    arrival = trace.arrival_s.tolist()
    prompt, output_len = trace.prompt_len.tolist(), trace.output_len.tolist()
    extras = {name: getattr(trace, name).tolist() for name in _DEFAULTS}
    conv = None if trace.conversation_id is None else (trace.conversation_id.tolist(), trace.turn.tolist())
    try:
        with output.open(text=False) as raw:
            stream = gzip.GzipFile(filename=path.name, mode="wb", fileobj=raw) if path.suffix == ".gz" else raw
            with io.TextIOWrapper(stream, encoding="utf-8") as out:  # (closing it ends the gzip stream)
                out.write(json.dumps(header) + "\n")
                for i in range(len(trace)):
                    parts = [f'"arrival_s": {arrival[i]!r}, "prompt_len": {prompt[i]}, "output_len": {output_len[i]}']
                    for name, default in _DEFAULTS.items():
                        if extras[name][i] != default:
                            parts.append(f'"{name}": {extras[name][i]}')
                    if conv is not None:
                        parts.append(f'"conversation_id": {conv[0][i]}, "turn": {conv[1][i]}')
                    ids = trace.prefix_ids(i)
                    if ids is not None:
                        parts.append(f'"prefix_ids": [{", ".join(map(str, ids.tolist()))}]')
                    out.write("{" + ", ".join(parts) + "}\n")
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def load_pagesim(path: PathArg) -> Trace:
    rows = iter(read_jsonl(path))
    try:
        line, header = next(rows)
    except StopIteration:
        raise TraceFormatError(path, "empty file") from None
    if not is_header(header):
        raise TraceFormatError(path, f"expected a {HEADER_KEY!r} header line", line)
    if header[HEADER_KEY] != VERSION:
        raise TraceFormatError(path, f"its {HEADER_KEY} version is not one this pagesim reads (it reads version "
                               f"{VERSION})", line)
    block_tokens = header.get("prefix_block_tokens", 0)
    if type(block_tokens) is not int or block_tokens < 0:
        raise TraceFormatError(path, "prefix_block_tokens must be a non-negative integer", line)
    table = conversations = None
    for line, obj in rows:
        if table is None:  # the first row says whether rows carry conversation_id and turn
            conversations = "turn" in obj
            columns = _columns(conversations, prefix_ids=True)
            kinds = field_kinds(columns)
            table, keys = ChunkedColumns(path, kinds), [kind.column for kind in kinds.values()]
        if ("conversation_id" in obj) != ("turn" in obj) or ("turn" in obj) != conversations:
            raise TraceFormatError(path, "conversation_id and turn must be on every row or on none", line)
        row = []
        for key in keys:
            value = obj.get(key, _READ_DEFAULTS.get(key))
            if value is None:
                raise TraceFormatError(path, f"missing key {key!r}", line)
            row.append(value)
        table.add_row(line, row)
    if table is None:
        raise TraceFormatError(path, "no requests (only a header)")
    values, lines = table.finish()
    if values["prefix_ids"][0].size == 0:  # no row has identities
        del values["prefix_ids"]
        columns = _columns(conversations, prefix_ids=False)
    return columns_to_trace(path, lines, values, columns, arrivals=None, seed=0,
                            prefix_block_tokens=block_tokens, source=header.get("source") or f"pagesim:{path}",
                            rebase=False, has_arrivals=bool(header.get("has_arrivals", True)))


def _columns(conversations: bool, *, prefix_ids: bool) -> ColumnMap:
    """The file's keys, by the field each holds."""
    return ColumnMap(arrival="arrival_s", prompt="prompt_len", output="output_len", n="n", beam_width="beam_width",
                     priority="priority", conversation_id="conversation_id" if conversations else None,
                     turn="turn" if conversations else None, prefix_ids="prefix_ids" if prefix_ids else None)


def same_columns(a: Trace, b: Trace) -> bool:
    """Whether two traces hold the same requests (for round-trip checks)."""
    names = ("arrival_s", "prompt_len", "output_len", "n", "beam_width", "priority",
             "conversation_id", "turn", "prefix_id_values", "prefix_id_offsets")
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y)):
            return False
    return a.prefix_block_tokens == b.prefix_block_tokens
