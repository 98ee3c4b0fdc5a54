"""Any CSV or JSONL trace, given which column holds what; length-only files with an arrival process.

A ``ColumnMap`` names the file's column for each trace field. ``prompt`` and ``output`` are
required; ``arrival`` may be absent (a length-only file such as the ShareGPT length table,
``num_prefill_tokens, num_decode_tokens``), in which case arrivals come from an arrival process
(``pagesim.traces.generate.arrivals``) or, with none given, every request arrives at 0 and the trace says
it has no arrivals. Arrival stamps are in ``time_unit`` (s, ms or us) and become seconds from the
first request. Without an explicit map, common column names are recognised
(``pagesim.traces.loaders.names.ALIASES``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.build import build_trace
from pagesim.traces.loaders.columns import ChunkedColumns, Column, Identities, Numbers, clip, names_said
from pagesim.traces.loaders.names import ALIASES, known_column_names
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.loaders.text import csv_header, read_csv, read_jsonl
from pagesim.traces.trace import Trace

TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}

_INTEGER_FIELDS = ("n", "beam_width", "priority", "conversation_id", "turn")


@dataclass(frozen=True)
class ColumnMap:
    prompt: str
    output: str
    arrival: str | None = None
    prefix_ids: str | None = None  # JSONL only: a list of integer identities per row
    n: str | None = None
    beam_width: str | None = None
    priority: str | None = None
    conversation_id: str | None = None
    turn: str | None = None
    time_unit: str = "s"

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS_S:
            raise ValueError(f"time unit must be one of {', '.join(TIME_UNITS_S)}, got {self.time_unit!r}")

    @classmethod
    def parse(cls, text: str, *, time_unit: str = "s") -> ColumnMap:
        """``"arrival=ts,prompt=in,output=out"`` (the CLI's ``--columns``)."""
        known = {f.name for f in fields(cls)} - {"time_unit"}
        mapping: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, column = part.partition("=")
            if not eq or not column.strip():
                raise ValueError(f"--columns: expected FIELD=COLUMN, got {part!r}")
            if key.strip() not in known:
                raise ValueError(f"--columns: unknown field {key.strip()!r} (fields: {', '.join(sorted(known))})")
            mapping[key.strip()] = column.strip()
        for required in ("prompt", "output"):
            if required not in mapping:
                raise ValueError(f"--columns: needs {required}=COLUMN")
        return cls(**mapping, time_unit=time_unit)

    @classmethod
    def guess(cls, names: list[str] | set[str], *, time_unit: str = "s") -> ColumnMap | None:
        """A map from recognised column names, or None if prompt or output is not recognised."""
        present = set(names)
        found = {name: next((a for a in aliases if a in present), None) for name, aliases in ALIASES.items()}
        if found["prompt"] is None or found["output"] is None:
            return None
        return cls(**{k: v for k, v in found.items() if v is not None}, time_unit=time_unit)

    def used(self) -> dict[str, str]:
        """field -> column for every mapped field."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "time_unit" and getattr(self, f.name) is not None}


def field_kinds(columns: ColumnMap) -> dict[str, Column]:
    """How each mapped field's column is read: field -> ``Column`` (in the order they are checked)."""
    named = columns.used()
    kinds: dict[str, Column] = {"prompt": Numbers(named["prompt"], integer=True, minimum=1),
                                "output": Numbers(named["output"], integer=True, minimum=1)}
    for name in _INTEGER_FIELDS:
        if name in named:
            kinds[name] = Numbers(named[name], integer=True, minimum=None if name == "priority" else 0)
    if "arrival" in named:
        kinds["arrival"] = Numbers(named["arrival"], integer=False, minimum=None)
    if "prefix_ids" in named:
        kinds["prefix_ids"] = Identities(named["prefix_ids"])
    return kinds


def columns_to_trace(path, lines: np.ndarray, values: dict, columns: ColumnMap, *, arrivals, seed: int,
                     prefix_block_tokens: int, source: str, rebase: bool = True,
                     has_arrivals: bool | None = None) -> Trace:
    """A ``Trace`` from the fields ``field_kinds`` read (``values``: field -> column)."""
    data: dict = {"prompt_len": values["prompt"], "output_len": values["output"]}
    for name in _INTEGER_FIELDS:
        if name in values:
            data[name] = values[name]
    if "arrival" in values:
        data["arrival_s"] = values["arrival"] * TIME_UNITS_S[columns.time_unit]
    elif arrivals is not None:
        data["arrival_s"] = arrivals.times(len(lines), np.random.default_rng(seed))
        source += f" with {arrivals.describe()} arrivals (seed {seed})"
        data["metadata"] = {"arrival_process": arrivals.describe()}
    else:
        data["arrival_s"] = np.zeros(len(lines))
    if "prefix_ids" in values:
        if prefix_block_tokens < 1:
            raise TraceFormatError(path, "prefix identities need --prefix-block-tokens (tokens per identity)")
        data["prefix_id_values"], data["prefix_id_offsets"] = values["prefix_ids"]
        data["prefix_block_tokens"] = prefix_block_tokens
    if ("conversation_id" in values) != ("turn" in values):
        raise TraceFormatError(path, "conversation_id and turn columns come together")
    if has_arrivals is None:
        has_arrivals = "arrival" in values or arrivals is not None
    rebase = rebase and "arrival" in values  # drawn arrivals keep the process's own start
    return build_trace(path, lines, rebase=rebase, has_arrivals=has_arrivals, source=source, **data)


def _guess_csv_columns(path: PathArg, *, time_unit: str = "s") -> ColumnMap:
    """The column map recognised from a CSV's header, or an error at the header's line."""
    line, header = csv_header(path)
    columns = ColumnMap.guess(header, time_unit=time_unit)
    if columns is None:
        raise TraceFormatError(path, f"cannot tell which columns hold prompt and output lengths (the header has "
                               f"{names_said(header, known_column_names())}); pass --columns prompt=COL,output=COL",
                               line)
    return columns


def load_csv(path: PathArg, columns: ColumnMap | None = None, *, arrivals=None, seed: int = 0,
             time_unit: str = "s", source_kind: str = "csv") -> Trace:
    """A CSV trace with a header; ``columns`` says which column is which (guessed if None)."""
    if columns is None:
        columns = _guess_csv_columns(path, time_unit=time_unit)
    if columns.prefix_ids is not None:
        raise TraceFormatError(path, "prefix identities need JSONL (a list per row), not CSV")
    table = read_csv(path, field_kinds(columns))
    return columns_to_trace(path, table.lines, table.columns, columns, arrivals=arrivals, seed=seed,
                            prefix_block_tokens=0, source=f"{source_kind}:{path}")


def load_jsonl(path: PathArg, columns: ColumnMap | None = None, *, arrivals=None, seed: int = 0,
               prefix_block_tokens: int = 0, time_unit: str = "s") -> Trace:
    """A JSONL trace, one object per line; ``columns`` says which key is which (guessed from the
    first object's keys if None)."""
    table = keys = None
    for line, obj in read_jsonl(path):
        if table is None:
            if columns is None:
                columns = ColumnMap.guess(obj.keys(), time_unit=time_unit)
                if columns is None:
                    raise TraceFormatError(path, "cannot tell which keys hold prompt and output lengths (the line "
                                           f"has {names_said(obj, known_column_names(), noun='key')}); pass "
                                           "--columns prompt=KEY,output=KEY", line)
            kinds = field_kinds(columns)
            table, keys = ChunkedColumns(path, kinds), [kind.column for kind in kinds.values()]
        try:
            table.add_row(line, [obj[key] for key in keys])
        except KeyError as exc:
            raise TraceFormatError(path, f"missing key {clip(repr(exc.args[0]))}", line) from None
    if table is None:
        raise TraceFormatError(path, "no requests")
    values, lines = table.finish()
    return columns_to_trace(path, lines, values, columns, arrivals=arrivals, seed=seed,
                            prefix_block_tokens=prefix_block_tokens, source=f"jsonl:{path}")


def load_lengths(path: PathArg, *, arrivals=None, seed: int = 0, columns: ColumnMap | None = None) -> Trace:
    """A length-only CSV (e.g. ``num_prefill_tokens, num_decode_tokens``; columns recognised by
    ``ALIASES`` or mapped)."""
    if columns is None:
        columns = replace(_guess_csv_columns(path), arrival=None)
    if columns.arrival is not None:
        raise ValueError("a length-only file has no arrival column; use --format csv for one that does")
    return load_csv(path, columns, arrivals=arrivals, seed=seed, source_kind="lengths")
