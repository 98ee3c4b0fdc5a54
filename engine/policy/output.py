"""The seam between policy and execution: the scheduler's frozen output and the decision log.

Each step the scheduler returns one ``SchedulerOutput``: everything an executor needs and nothing
more. The simulator asks a cost model how long it takes; the engine carries it out on tensors, in
this order: swap out, swap in, offload loads, copy-on-write copies, then the forward pass over
``scheduled`` (each sequence's new tokens go to the slots ``slot_mapping()`` names), offload
stores, then sampling for the sequences with ``samples`` set. Both then call ``Scheduler.update``.

Every step also appends one JSON-able record to the ``DecisionLog``, identical in format whichever
half ran the policy, which is what equivalence tests compare. Field meanings follow the vLLM
oracle logs in ``shared/oracle/README.md``: ``scheduled`` tokens computed per request, ``order``,
``new`` (prefix-hit tokens of first admissions), ``resumed`` / ``resumed_cached``, ``swapped_in``,
``preempted`` and ``preempted_mode``, ``finished`` (sorted, filled in by ``update``),
``num_free_blocks`` (free + cached GPU blocks after scheduling), ``num_free_cpu_blocks``,
``block_ids`` (``{request: {sequence index: [block ids]}}``), ``blocks_to_copy``,
``blocks_to_swap_out``, ``blocks_to_swap_in`` and ``rejected`` (``{request: reason}``). With KV
offloading on, also ``blocks_to_load`` (``[slot, GPU block]``), ``blocks_to_store`` (``[GPU
block, slot]``), ``offload_hits`` (``{request: tokens loaded}``) and ``num_free_offload_blocks``. With a
hybrid KV cache (sliding-window layer groups) ``block_ids`` is group 0's table and
``group_block_ids`` holds groups 1.. (``{request: {sequence index: [[ids of group 1], ...]}}``);
entries a window dropped are vLLM's null block, 0.
"""

from __future__ import annotations

import io
import json
import os
from itertools import zip_longest
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from engine.files import InputFileError, open_regular
from engine.policy.request import seq_id_of

Pair = tuple[int, int]
EMPTY: Mapping = MappingProxyType({})
MAX_RECORD_CHARS = 64 * 2**20  # one line of a decision log, when read back


@dataclass(frozen=True, slots=True)
class ScheduledSequence:
    request_id: str
    seq_index: int
    num_computed_tokens: int  # tokens already in the cache before this step (start position)
    num_new_tokens: int  # tokens computed this step
    block_table: tuple[int, ...]  # GPU block ids after scheduling, logical order
    block_size: int
    samples: bool  # whether this step ends with a sampled token for this sequence
    # Hybrid KV caches: the tables of layer groups 1.. (block_table is group 0's); the null
    # block (0) stands where a sliding window dropped a block, which no kernel reads.
    extra_block_tables: tuple[tuple[int, ...], ...] = ()

    def group_table(self, group: int) -> tuple[int, ...]:
        return self.block_table if group == 0 else self.extra_block_tables[group - 1]

    @property
    def seq_id(self) -> str:
        return seq_id_of(self.request_id, self.seq_index)

    @property
    def is_prefill(self) -> bool:
        """Prefill-shaped work: several tokens, or a chunk that ends before the last known token."""
        return not self.samples or self.num_new_tokens > 1

    def slot_mapping(self, group: int = 0) -> list[int]:
        """Physical slot (``block_id * block_size + offset``) of each new token, in order, in the
        table of layer group ``group``."""
        bs = self.block_size
        table = self.group_table(group)
        return [
            table[pos // bs] * bs + pos % bs
            for pos in range(self.num_computed_tokens, self.num_computed_tokens + self.num_new_tokens)
        ]


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step: int
    scheduled: tuple[ScheduledSequence, ...]  # in scheduling order
    num_scheduled_tokens: Mapping[str, int]  # request id -> tokens computed this step, in order
    new: Mapping[str, int]  # first admissions -> prefix-cache hit tokens
    resumed: Mapping[str, int]  # re-admissions after recompute -> prefix-cache hit tokens
    swapped_in: tuple[str, ...]
    preempted: tuple[tuple[str, str], ...]  # (request id, "swap" | "recompute") in preemption order
    rejected: Mapping[str, str]  # request id -> reason
    blocks_to_copy: tuple[Pair, ...]  # copy-on-write (src, dst), in order
    blocks_to_swap_out: tuple[Pair, ...]  # (gpu, cpu)
    blocks_to_swap_in: tuple[Pair, ...]  # (cpu, gpu)
    num_free_blocks: int
    num_free_cpu_blocks: int
    num_cached_free_blocks: int
    # KV offloading (engine/policy/offload/; None: off): copies the executor makes this step,
    # loads (slot, GPU block) before the forward pass and stores (GPU block, slot) after it, and
    # the prefix-hit tokens of this step's admissions that are loaded from the offload store.
    num_free_offload_blocks: int | None = None
    blocks_to_load: tuple[Pair, ...] = ()
    blocks_to_store: tuple[Pair, ...] = ()
    offload_hits: Mapping[str, int] = field(default_factory=lambda: EMPTY)

    @property
    def order(self) -> tuple[str, ...]:
        """Request ids in scheduling order."""
        return tuple(self.num_scheduled_tokens)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def to_record(self) -> dict[str, Any]:
        """The step's decision-log record (``finished`` is added by ``Scheduler.update``)."""
        block_ids: dict[str, dict[str, list[int]]] = {}
        group_block_ids: dict[str, dict[str, list[list[int]]]] = {}
        for s in self.scheduled:
            block_ids.setdefault(s.request_id, {})[str(s.seq_index)] = list(s.block_table)
            if s.extra_block_tables:
                group_block_ids.setdefault(s.request_id, {})[str(s.seq_index)] = [list(t) for t in s.extra_block_tables]
        record = {
            "step": self.step,
            "scheduled": dict(self.num_scheduled_tokens),
            "order": list(self.order),
            "new": dict(self.new),
            "resumed": list(self.resumed),
            "resumed_cached": dict(self.resumed),
            "swapped_in": list(self.swapped_in),
            "preempted": [rid for rid, _ in self.preempted],
            "preempted_mode": dict(self.preempted),
            "rejected": dict(self.rejected),
            "finished": [],
            "num_free_blocks": self.num_free_blocks,
            "num_free_cpu_blocks": self.num_free_cpu_blocks,
            "block_ids": block_ids,
            "blocks_to_copy": [list(p) for p in self.blocks_to_copy],
            "blocks_to_swap_out": [list(p) for p in self.blocks_to_swap_out],
            "blocks_to_swap_in": [list(p) for p in self.blocks_to_swap_in],
        }
        if group_block_ids:
            record["group_block_ids"] = group_block_ids
        if self.num_free_offload_blocks is not None:
            record["num_free_offload_blocks"] = self.num_free_offload_blocks
            record["blocks_to_load"] = [list(p) for p in self.blocks_to_load]
            record["blocks_to_store"] = [list(p) for p in self.blocks_to_store]
            record["offload_hits"] = dict(self.offload_hits)
        return record


#: A read-only view of a dict (the type itself: no Python call on a scheduler's hot path).
frozen_map: Callable[[dict], Mapping] = MappingProxyType


def dump_record(record: Mapping[str, Any]) -> str:
    """Canonical one-line JSON (sorted keys, no spaces, ASCII), as the oracle logs are written."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


class DecisionLog:
    """One record per step; serializes to JSONL and compares for equality."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()):
        self.records: list[dict[str, Any]] = list(records)

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecisionLog):
            return NotImplemented
        return self.records == other.records

    def first_difference(self, other: DecisionLog) -> tuple[int, dict | None, dict | None] | None:
        """``(index, ours, theirs)`` of the first differing record, or ``None`` if identical."""
        for i, (a, b) in enumerate(zip_longest(self.records, other.records)):
            if a != b:
                return i, a, b
        return None

    def write_jsonl(self, dest: str | Path | IO[str]) -> None:
        if isinstance(dest, (str, Path)):
            with open(dest, "w", encoding="ascii") as f:
                self.write_jsonl(f)
            return
        for record in self.records:
            dest.write(dump_record(record) + "\n")

    @classmethod
    def read_jsonl(cls, source: str | Path) -> DecisionLog:
        """A log written by ``write_jsonl`` (or the oracle's golden log): a regular file of JSON
        records, one per line, each at most ``MAX_RECORD_CHARS``; else one ``FILE:LINE:`` error."""
        if not os.path.lexists(source):
            raise ValueError(f"{source}: no such log file")
        records = []
        with io.TextIOWrapper(open_regular(source, what="decision log"), encoding="utf-8") as f:
            line_no = 0
            while True:
                try:
                    line = f.readline(MAX_RECORD_CHARS + 1)
                except UnicodeDecodeError:
                    # (decoded a chunk ahead: the bad byte is on this line or a later one)
                    raise InputFileError(source, f"not UTF-8 text (at or after line {line_no + 1})") from None
                if not line:
                    break
                line_no += 1
                if len(line) > MAX_RECORD_CHARS:
                    raise InputFileError(source, f"line longer than {MAX_RECORD_CHARS:,} characters: "
                                         "not a decision record", line_no)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{source}:{line_no}: not a JSON record ({exc.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                    raise ValueError(f"{source}:{line_no}: a decision record is a JSON object with an integer 'step'")
                records.append(record)
        return cls(records)
