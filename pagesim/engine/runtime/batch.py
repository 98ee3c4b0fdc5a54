"""One step's input, built from the scheduler's output: token ids, positions, slots, kernel metadata.

The scheduler lists sequences in scheduling order; the batch puts them in *kernel order*: every
sequence computing several tokens (a prompt, a chunk of one, or a recompute) first, for the paged
prefill kernel, then every sequence computing one token, for the paged decode kernel (as vLLM v1
reorders its batch). Each sequence's new tokens are ``[num_computed_tokens, num_computed_tokens
+ num_new_tokens)`` of its prompt and outputs; their K/V go to the slots ``slot_mapping()``
names. ``sample_rows`` are the rows whose hidden state gives a sampled token (a sequence's last
new token, when the step ends at its last known token).

Invariants: rows ``[0, num_prefill_tokens)`` are the prefill sequences' tokens, packed in order
(``query_start_loc``); the remaining rows are one token per decode sequence. A hybrid KV cache
(sliding-window layer groups) has a table per group, so the slots and the kernels' block tables
come per group too (``layers(group)``); the rows are the same for every group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pagesim.engine.policy import ScheduledSequence, SchedulerOutput

#: ``(request id, sequence index) -> the sequence's tokens so far`` (prompt then outputs).
TokensOf = Callable[[str, int], Sequence[int]]


@dataclass(frozen=True, slots=True)
class Group:
    """The kernel arguments of one kind of sequence (prefill or decode)."""

    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32: tokens in the cache after this step's writes
    max_seq_len: int
    query_start_loc: torch.Tensor | None = None  # prefill only: [num_seqs + 1] int32
    max_query_len: int = 1


@dataclass(frozen=True, slots=True)
class GroupTables:
    """What differs between the layer groups of one step: slots and block tables."""

    slot_mapping: torch.Tensor  # [T] int64
    prefill: Group | None
    decode: Group | None


@dataclass(frozen=True, slots=True)
class StepBatch:
    seqs: tuple[ScheduledSequence, ...]  # kernel order
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    num_prefill_tokens: int
    prefill: Group | None
    decode: Group | None
    sample_rows: torch.Tensor  # [S] int64: rows of the sampling sequences' last tokens
    sample_seqs: tuple[ScheduledSequence, ...]  # aligned with sample_rows
    extra_groups: tuple[GroupTables, ...] = ()  # layer groups 1.. of a hybrid cache

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def layers(self, group: int) -> GroupTables:
        """Slots and block tables of layer group ``group`` (group 0's are the batch's own fields)."""
        if group == 0:
            return GroupTables(self.slot_mapping, self.prefill, self.decode)
        return self.extra_groups[group - 1]


def build_batch(output: SchedulerOutput, tokens_of: TokensOf, device: torch.device,
                num_groups: int = 1) -> StepBatch | None:
    """The step's batch, or ``None`` if it computes nothing (``num_groups``: the cache's layer groups)."""
    prefill = [s for s in output.scheduled if s.num_new_tokens > 1]
    decode = [s for s in output.scheduled if s.num_new_tokens == 1]
    seqs = prefill + decode
    if not seqs:
        return None
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    sample_seqs: list[ScheduledSequence] = []
    for s in seqs:
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
        tokens = tokens_of(s.request_id, s.seq_index)
        if end > len(tokens):
            raise RuntimeError(f"step {output.step}: {s.seq_id} computes up to position {end} but holds {len(tokens)} tokens")
        ids.extend(tokens[start:end])
        positions.extend(range(start, end))
        slots.extend(s.slot_mapping())
        if s.samples:
            sample_rows.append(len(ids) - 1)
            sample_seqs.append(s)

    def long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    num_prefill_tokens = sum(s.num_new_tokens for s in prefill)
    extra = tuple(
        GroupTables(long([slot for s in seqs for slot in s.slot_mapping(g)]),
                    _group(prefill, device, packed=True, group=g) if prefill else None,
                    _group(decode, device, packed=False, group=g) if decode else None)
        for g in range(1, num_groups)
    )
    return StepBatch(
        seqs=tuple(seqs), input_ids=long(ids), positions=long(positions), slot_mapping=long(slots),
        num_prefill_tokens=num_prefill_tokens,
        prefill=_group(prefill, device, packed=True) if prefill else None,
        decode=_group(decode, device, packed=False) if decode else None,
        sample_rows=long(sample_rows), sample_seqs=tuple(sample_seqs), extra_groups=extra,
    )


def _group(seqs: list[ScheduledSequence], device: torch.device, *, packed: bool, group: int = 0) -> Group:
    lens = [s.num_computed_tokens + s.num_new_tokens for s in seqs]
    rows = [s.group_table(group) for s in seqs]
    width = max(len(row) for row in rows)
    tables = [list(row) + [0] * (width - len(row)) for row in rows]  # padding is never read

    def int32(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    if not packed:
        return Group(int32(tables), int32(lens), max(lens))
    starts = [0]
    for s in seqs:
        starts.append(starts[-1] + s.num_new_tokens)
    return Group(int32(tables), int32(lens), max(lens), query_start_loc=int32(starts),
                 max_query_len=max(s.num_new_tokens for s in seqs))
