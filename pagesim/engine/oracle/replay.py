"""Run an oracle spec through a preset and write each step in the oracle's record format.

The step loop is the oracle's (README §2): requests are added just before the ``schedule()`` of
their arrival step; every scheduled token is computed; a sequence that has computed all its known
tokens samples one, ``10000 + crc32(f"{id}:{position}") % 40000`` (the same for all ``n``
samples of a step); outputs are processed and finished requests release their blocks; the loop
ends after the last arrival once nothing is unfinished. An idle step still produces a record.

``oracle_record`` projects a ``SchedulerOutput`` onto the oracle's fields for the spec's vLLM
version (README §3). pagesim's own decision log is richer (and counts every decoded token); the
projection only renames and narrows: v0's ``scheduled`` is vLLM's ``token_chunk_size`` (1 for a
decode however many sequences run), v0's ``ignored`` is pagesim's ``rejected``, and v1's
``block_ids`` is the one sequence's table. With more than one KV-cache group (vLLM 0.33's hybrid
specs) v1 also writes ``group_block_ids``, ``{request: [table of group 1, ...]}``, and a table
entry a sliding window released is vLLM's null block ``0`` (pagesim's ``None``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence as SequenceT
from dataclasses import dataclass
from typing import Any

from pagesim.engine.oracle.spec import OracleSpec
from pagesim.engine.policy import Request, Scheduler, SchedulerOutput
from pagesim.engine.policy.scheduling.request import Sequence


def fake_token(seq: Sequence, sample_index: int) -> int:
    """The oracle's model: one token per request and position, the same for every sample."""
    return 10_000 + zlib.crc32(f"{seq.request.request_id}:{seq.num_tokens}".encode()) % 40_000


def _vllm_table(table) -> list[int]:
    """A block table as vLLM logs it: the null block ``0`` where a sliding window released one."""
    return [0 if block is None else block for block in table]


def oracle_record(output: SchedulerOutput, finished: SequenceT[str], *, v0: bool, groups: bool = False,
                  offload: bool = False) -> dict[str, Any]:
    """The step's record in the oracle's format for vLLM v0 (0.6.3) or v1 (0.32, 0.33); ``groups``:
    the cache has several KV-cache groups, whose tables after the first are ``group_block_ids``."""
    tables: dict[str, dict[str, list[int]]] = {}
    chunk: dict[str, int] = {}
    for s in output.scheduled:
        tables.setdefault(s.request_id, {})[str(s.seq_index)] = _vllm_table(s.block_table)
        chunk[s.request_id] = max(chunk.get(s.request_id, 0), s.num_new_tokens)
    record: dict[str, Any] = {
        "step": output.step,
        "order": list(output.order),
        "new": dict(output.new),
        "resumed": list(output.resumed),
        "preempted": [rid for rid, _ in output.preempted],
        "finished": sorted(finished),
        "num_free_blocks": output.num_free_blocks,
    }
    if v0:
        record.update(
            scheduled={rid: chunk[rid] for rid in output.order},
            block_ids=tables,
            swapped_in=list(output.swapped_in),
            preempted_mode=dict(output.preempted),
            ignored=list(output.rejected),
            blocks_to_swap_out=[list(p) for p in output.blocks_to_swap_out],
            blocks_to_swap_in=[list(p) for p in output.blocks_to_swap_in],
            blocks_to_copy=[list(p) for p in output.blocks_to_copy],
            num_free_cpu_blocks=output.num_free_cpu_blocks,
        )
    else:
        record.update(
            scheduled=dict(output.num_scheduled_tokens),
            block_ids={rid: seqs["0"] for rid, seqs in tables.items()},
            resumed_cached=dict(output.resumed),
        )
        if offload:
            record.update(
                blocks_to_load=[list(p) for p in output.blocks_to_load],
                blocks_to_store=[list(p) for p in output.blocks_to_store],
                offload_hits=dict(output.offload_hits),
                parked=list(output.parked),
                num_free_offload_blocks=output.num_free_offload_blocks,
                offload_evictions=output.offload_evictions,
            )
        if groups:
            record["group_block_ids"] = {s.request_id: [_vllm_table(t) for t in s.extra_block_tables]
                                         for s in output.scheduled}
    return record


@dataclass
class ReplayResult:
    spec: OracleSpec
    preset: str
    records: list[dict[str, Any]]  # the oracle-format log
    scheduler: Scheduler  # after the last step (its own decision log, counters)


def replay(spec: OracleSpec, preset: str | None = None) -> ReplayResult:
    """Replay ``spec`` through ``preset`` (default: the one for the spec's vLLM version)."""
    preset = preset or spec.preset
    scheduler = Scheduler(spec.scheduler_config(preset))
    load_steps, store_steps = spec.offload_steps
    offload = scheduler.offload
    if offload is not None:  # the fake worker reports each copy done (README-0.33.md)
        scheduler.complete_offload_in_update = False
    pending = list(spec.requests)
    last_arrival = pending[-1].arrival_step
    records = []
    step = 0
    while step <= last_arrival or scheduler.has_unfinished_requests:
        while pending and pending[0].arrival_step == step:
            r = pending.pop(0)
            # (vLLM 0.33 specs: the request's priority, and its arrival time, float(arrival_step) by default)
            arrival_time_s = float(r.arrival_step) if r.arrival_time is None else r.arrival_time
            request = Request(r.request_id, prompt_len=0, prompt_token_ids=list(r.prompt_token_ids),
                              max_tokens=r.max_tokens, arrival_time_s=arrival_time_s, n=r.n, priority=r.priority)
            if not scheduler.add_request(request):
                raise ValueError(f"{spec.path}: preset {preset} rejects request {r.request_id!r}: {request.reject_reason}")
        output = scheduler.schedule()
        finished = scheduler.update(output, fake_token)
        if offload is not None:
            offload.complete(step - load_steps + 1, loads=True, stores=False)
            offload.complete(step - store_steps + 1, loads=False, stores=True)
        records.append(oracle_record(output, [r.request_id for r in finished], v0=spec.is_v0,
                                     groups=spec.num_kv_groups > 1, offload=offload is not None))
        step += 1
    return ReplayResult(spec, preset, records, scheduler)
