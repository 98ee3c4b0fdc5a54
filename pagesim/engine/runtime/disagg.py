"""Disaggregated prefill/decode on the real engine: two engines in one process, one prefilling and
one decoding, each with its own KV cache and scheduler, the prompt's KV blocks copied from one
cache into the other as the policy's P/D connector (``pagesim.engine.policy.disagg``) decides.

The flow of a request (vLLM 0.33's proxy and ``NixlConnector``, executor side):

1. the **prefill engine** gets a copy with ``max_tokens`` 1 as a ``RemoteDecode`` request; when it
   finishes, its blocks are held (``PdConnector.take_sends``) and its one token is discarded, as
   the proxy discards it;
2. the **decode engine** gets the original request with the send's ``RemotePrefill``
   parameters; the step that admits it allocates its blocks and parks it with a ``KvReceive``;
3. right after that step the driver **copies** tokens ``[first_token, num_tokens)`` of every
   layer's K and V from the prefill cache's ``remote_blocks`` into the decode cache's
   ``local_blocks``, slot by slot (so the two sides may have different block sizes). Not before
   the step: its executor poisons the blocks the decode side released since its last forward
   pass, which may be the very blocks just allocated for the read;
4. at the next step boundary the read is reported done on the decode side (``pd.complete``: the
   next ``schedule()`` promotes the request, which computes its last prompt token again and
   samples its first output token), and the prefill side's blocks are freed (``pd.release``).

A request's output is the decode engine's; the prefill engine's token is dropped. A request the
decode side rejects frees its send unread (vLLM's notify-only receive). In validation mode both
caches poison what their policy released (a freed send at once: no later store reads it), so a
read of blocks the prefill side had freed copies NaN, which the copy refuses (``ExecutionError``),
and a read of the wrong live blocks fails the reference check.

**Lockstep.** ``run_lockstep`` replays a run from a ``PdSchedule``: per instance, the step before
whose ``schedule()`` each event happens (a request released to the prefill engine, added to the
decode engine, its read reported done, its send freed). A request missing from a map has that
event as soon as it can happen (a finished prefill goes to the decode engine at once; a read is
reported done, and its send freed, at the first boundary after the copy), which is how ``run``
(on the wall clock) and an offline run go; ``PdSchedule.of(run)`` is the schedule a run
followed, and replaying it writes the same two decision logs. An engine does not step while an
event due at that step cannot happen yet (the prefill has not finished, the read is not copied):
the other engine steps first. An idle engine takes no steps, so its next event happens as soon as
it is idle, as in ``Engine.run_lockstep``.

A prefill engine whose waiting requests do not fit beside the blocks it holds for the decode side
takes one step that schedules nothing, then takes none until a send is freed or a request
arrives (vLLM's engine would spin on empty steps meanwhile; they change nothing).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from pagesim.engine.policy import Request
from pagesim.engine.policy.disagg import KvReceive, KvSend, RemoteDecode
from pagesim.engine.runtime.engine import Engine, EngineStalled, RequestRecord
from pagesim.engine.runtime.kv_cache import PagedKVCache
from pagesim.engine.runtime.runner import ExecutionError
from pagesim.engine.runtime.sampler import SamplingParams

PREFILL_ENGINE = 0  # the prefill instance's engine index in the transfer parameters


@dataclass(slots=True)
class Transfer:
    """One request's trip from the prefill engine to the decode engine: what moved, and the step
    (of the instance named) before whose ``schedule()`` each event happened (``None``: not yet)."""

    request_id: str
    sent_step: int  # prefill: the step that finished it (its blocks held from then)
    prefill_blocks: int  # blocks the prefill side held for the read
    decode_add_step: int | None = None  # decode: added with its RemotePrefill
    receive_step: int | None = None  # decode: the step that parked it and issued the read
    read_blocks: int = 0  # decode blocks the read filled (after the decode side's own prefix hit)
    read_tokens: int = 0
    read_bytes: int = 0
    read_done_step: int | None = None  # decode: its read reported done (pd.complete)
    freed_step: int | None = None  # prefill: its held blocks freed (pd.release)


@dataclass(frozen=True, slots=True)
class PdSchedule:
    """The release steps per instance of a P/D lockstep run (module docstring): each maps a request
    id to a step of the instance named; at one step, events go in the maps' order."""

    prefill: Mapping[str, int] = field(default_factory=dict)  # released to the prefill engine
    decode: Mapping[str, int] = field(default_factory=dict)  # added to the decode engine
    read_done: Mapping[str, int] = field(default_factory=dict)  # decode: its read reported done
    freed: Mapping[str, int] = field(default_factory=dict)  # prefill: its held blocks freed

    @classmethod
    def of(cls, run: DisaggEngine) -> PdSchedule:
        """The schedule ``run`` followed, each map in the order its events happened."""
        maps: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}, "read_done": {}, "freed": {}}
        for kind, rid, step in run.events:
            maps[kind][rid] = step
        return cls(**maps)


def copy_prompt_kv(src: PagedKVCache, dst: PagedKVCache, read: KvReceive, *, check: bool = False) -> int:
    """Copy tokens ``[read.first_token, read.num_tokens)`` of every layer's K and V from ``src``'s
    blocks ``read.remote_blocks`` into ``dst``'s ``read.local_blocks``; returns the bytes copied.
    ``check`` (validation mode): refuse KV that is not finite, i.e. memory ``src`` had released."""
    if read.source.block_size != src.block_size:
        raise ExecutionError(f"transfer of {read.request_id}: the remote blocks are of {read.source.block_size} "
                             f"tokens, the prefill cache's of {src.block_size}")
    first, end = read.first_token, read.num_tokens
    if end <= first:
        return 0
    rbs, bs = src.block_size, dst.block_size
    tokens = torch.arange(first, end, dtype=torch.int64)
    remote = torch.tensor(read.remote_blocks, dtype=torch.int64)
    local = torch.tensor(read.local_blocks, dtype=torch.int64)
    src_slots = (remote[tokens // rbs - first // rbs] * rbs + tokens % rbs).to(src.device)  # [T]
    dst_slots = (local[tokens // bs - first // bs] * bs + tokens % bs).to(dst.device)  # [T]
    num_bytes = 0
    for s, d in zip(src.slot_key_caches + src.slot_value_caches, dst.slot_key_caches + dst.slot_value_caches):
        # each [num_blocks, block_size, num_kv_heads, head_dim]; rows: [T, num_kv_heads, head_dim]
        rows = s.view(-1, *s.shape[2:]).index_select(0, src_slots)
        if check and not bool(torch.isfinite(rows).all()):
            raise ExecutionError(f"transfer of {read.request_id}: prefill blocks {list(read.remote_blocks)} hold NaN, "
                                 f"KV the prefill engine had released (validation mode)")
        d.view(-1, *d.shape[2:]).index_copy_(0, dst_slots, rows.to(d.device))
        num_bytes += rows.numel() * rows.element_size()
    return num_bytes


class _Events:
    """One instance's scheduled events: ``(step, order, request id)`` popped in step order once
    ready (``ready``), and those with no step, done as soon as they are ready (``asap``)."""

    def __init__(self, steps: Mapping[str, int]):
        self.steps = steps
        self.heap = [(step, order, rid) for order, (rid, step) in enumerate(steps.items())]
        heapq.heapify(self.heap)
        self._order = itertools.count(len(self.heap))
        self.ready: set[str] = set()
        self.asap: list[str] = []

    def become_ready(self, rid: str, not_before: int | None = None) -> None:
        """``rid``'s event can happen: at its step, else now, or at step ``not_before``."""
        if rid in self.steps:
            self.ready.add(rid)
        elif not_before is None:
            self.asap.append(rid)
        else:
            heapq.heappush(self.heap, (not_before, next(self._order), rid))
            self.ready.add(rid)

    def due(self, horizon: int) -> list[str]:
        """The events ready to happen before step ``horizon``'s ``schedule()``, in order."""
        out, self.asap = self.asap, []
        heap = self.heap
        while heap and heap[0][0] <= horizon and heap[0][2] in self.ready:
            rid = heapq.heappop(heap)[2]
            self.ready.discard(rid)
            out.append(rid)
        return out

    def blocks(self, step: int) -> bool:
        """An event due at ``step`` is not ready: the instance must not take that step yet."""
        return bool(self.heap) and self.heap[0][0] <= step

    def next_step(self) -> int | None:
        return self.heap[0][0] if self.heap else None


class DisaggEngine:
    """A prefill engine and a decode engine over one model, driven together (module docstring)."""

    def __init__(self, prefill: Engine, decode: Engine, *, read_delay_steps: int = 0):
        if prefill.model is not decode.model:
            raise ValueError("the prefill and decode engines must serve the same model object")
        for role, engine in (("prefill", prefill), ("decode", decode)):
            if engine.scheduler.pd is None:
                raise ValueError(f"the {role} engine's scheduler has no KV connector (kv_connector='nixl')")
        if prefill.validate != decode.validate:
            raise ValueError("validation mode must be on for both engines or for neither")
        if read_delay_steps < 0:
            raise ValueError(f"read_delay_steps must be >= 0, got {read_delay_steps}")
        self.prefill = prefill
        self.decode = decode
        # decode steps a read takes beyond its own (0: reported done before the next one; more
        # stands for a slower link: the request stays parked, its send held, that much longer)
        self.read_delay_steps = read_delay_steps
        self.transfers: dict[str, Transfer] = {}  # by request id, in the order the prefills finished
        self.events: list[tuple[str, str, int]] = []  # (PdSchedule map, request id, step), in order
        self._originals: dict[str, Request] = {}  # sent to the prefill engine, not yet to the decode one
        self._sampling: dict[str, SamplingParams | None] = {}
        self._sends: dict[str, KvSend] = {}  # finished on the prefill engine, not yet added to the decode one
        self._in_flight: set[str] = set()  # finished on the prefill engine, its send not yet freed
        self._unread: set[str] = set()  # added to the decode engine, its read not issued yet
        self._prefill_waits = False  # its last step scheduled nothing for want of held blocks
        self._num_ended = 0  # requests finished or rejected (on_finish counts them)

    @property
    def validate(self) -> bool:
        return self.prefill.validate

    @property
    def records(self) -> dict[str, RequestRecord]:
        """Each request's record: the decode engine's once it got there (its outputs are the
        request's, its arrival the prefill engine's), else the prefill engine's, still
        ``waiting`` if its prefill is done (an interrupted run)."""
        decode = self.decode.records
        records = {}
        for rid, record in self.prefill.records.items():
            if rid in decode:
                record = decode[rid]
            elif record.status == "completed":
                record = RequestRecord(rid, record.arrival_s, record.prompt_tokens, record.n, record.beam_width,
                                       first_scheduled_s=record.first_scheduled_s, release_step=record.release_step)
            records[rid] = record
        return records

    # ------------------------------------------------------------------ runs
    def run(self, requests: Iterable[Request], sampling: SamplingParams | None = None, *, on_finish=None) -> None:
        """Serve ``requests`` on the wall clock, each released to the prefill engine at its
        ``arrival_time_s``, every other event as soon as it can happen."""
        self._serve(requests, PdSchedule(), sampling, on_finish, wall=True)

    def run_lockstep(self, requests: Iterable[Request], schedule: PdSchedule | None = None,
                     sampling: SamplingParams | None = None, *, on_finish=None) -> None:
        """Serve ``requests`` by the steps of ``schedule`` (default: every request released at the
        prefill engine's step 0, every other event as soon as it can happen)."""
        self._serve(requests, schedule or PdSchedule(), sampling, on_finish, wall=False)

    def _serve(self, requests: Iterable[Request], schedule: PdSchedule, sampling, on_finish, *, wall: bool) -> None:
        prefill, decode = self.prefill, self.decode
        t0 = time.perf_counter()
        for engine in (prefill, decode):
            engine.start_clock(t0)
        requests = list(requests)
        if wall:
            arrivals = sorted(((r.arrival_time_s, i, r) for i, r in enumerate(requests)), key=lambda x: x[:2])
        else:
            arrivals = sorted((schedule.prefill.get(r.request_id, 0), i, r) for i, r in enumerate(requests))
        arrivals.reverse()  # (popped from the end)
        frees, adds, reads = _Events(schedule.freed), _Events(schedule.decode), _Events(schedule.read_done)
        ended = self._num_ended
        rejected = decode.scheduler.num_rejected_requests
        while arrivals or self._in_flight or prefill.has_unfinished_requests or decode.has_unfinished_requests:
            moved = False
            # ---- the prefill engine's boundary: sends its reader is done with, then arrivals
            step = prefill.scheduler.next_step
            horizon = step
            if not wall and (self._prefill_waits or not prefill.has_unfinished_requests):
                # (an idle or waiting engine takes no steps: its next event comes now)
                nexts = [x for x in (frees.next_step(), arrivals[-1][0] if arrivals else None) if x is not None]
                horizon = max([step, min(nexts)] if nexts else [step])
            for rid in frees.due(horizon):
                self._free_send(rid, step)
                moved = True
            now = prefill.now()
            while arrivals and (arrivals[-1][0] <= now if wall else arrivals[-1][0] <= horizon):
                request = arrivals.pop()[2]  # (on the wall clock, it arrived when it was due)
                self._admit(request, sampling, step, request.arrival_time_s if wall else None)
                moved = True
            if prefill.has_unfinished_requests and not self._prefill_waits and not frees.blocks(step):
                moved = True
                prefill.step()
                self._prefill_waits = (prefill.steps[-1].num_tokens == 0
                                       and bool(prefill.scheduler.pd.held_sends()))
                for send in prefill.scheduler.pd.take_sends():
                    self.transfers[send.request_id] = Transfer(send.request_id, prefill.steps[-1].step,
                                                               len(send.block_ids))
                    self._sends[send.request_id] = send
                    self._in_flight.add(send.request_id)
                    adds.become_ready(send.request_id)
            # ---- the decode engine's boundary: reads done, then requests sent to it
            step = decode.scheduler.next_step
            horizon = step
            if not decode.has_unfinished_requests and adds.next_step() is not None:
                horizon = max(step, adds.next_step())
            for rid in reads.due(step):
                decode.scheduler.pd.complete(rid)
                self._event("read_done", rid, step)
                self.transfers[rid].read_done_step = step
                frees.become_ready(rid)
                moved = True
            for rid in adds.due(horizon):
                self._send_to_decode(rid, step)
                moved = True
            if decode.has_unfinished_requests and not (adds.blocks(step) or reads.blocks(step)):
                moved = True
                decode.step()
                delay = self.read_delay_steps
                for rid in self._copy_reads():
                    reads.become_ready(rid, decode.scheduler.next_step + delay if delay else None)
            if decode.scheduler.num_rejected_requests != rejected:  # before its read: vLLM's notify-only
                rejected = decode.scheduler.num_rejected_requests  # receive frees the send unread
                for rid in [rid for rid in self._unread if decode.records[rid].status == "rejected"]:
                    self._unread.discard(rid)
                    frees.become_ready(rid)
            ended = self._report(on_finish, ended)
            if moved:
                continue
            if wall and arrivals:  # nothing to do before the next arrival
                time.sleep(max(0.0, min(1.0, arrivals[-1][0] - prefill.now() - 1e-3)))
                continue
            raise EngineStalled(
                f"the prefill/decode run cannot go on: {len(arrivals)} requests unreleased, "
                f"{len(self._in_flight)} sends held, prefill {'waiting for a free send' if self._prefill_waits else 'idle'}"
                f" at step {prefill.scheduler.next_step}, decode at step {decode.scheduler.next_step}"
                f"{' (a schedule whose events cannot happen?)' if not wall else ''}")

    def _report(self, on_finish, ended: int) -> int:
        now = (self.prefill.scheduler.num_rejected_requests + self.decode.scheduler.num_rejected_requests
               + self.decode.scheduler.num_finished_requests)
        if on_finish is not None and now > ended:
            on_finish(now - ended)
        self._num_ended = now
        return now

    # ---------------------------------------------------------------- events
    def _event(self, kind: str, rid: str, step: int) -> None:
        self.events.append((kind, rid, step))

    def _admit(self, request: Request, sampling: SamplingParams | None, step: int, arrival_s: float | None) -> None:
        """Release ``request`` to the prefill engine, as vLLM's proxy sends it (``max_tokens`` 1)."""
        rid = request.request_id
        if request.n > 1 or request.beam_width > 1:
            raise ValueError(f"request {rid}: disaggregated serving runs one sequence per request "
                             f"(n={request.n}, beam_width={request.beam_width})")
        self._event("prefill", rid, step)
        first = Request(rid, request.prompt_len, 1, request.arrival_time_s, request.prompt_token_ids,
                        request.prefix_block_ids, request.prefix_block_tokens, priority=request.priority)
        self._prefill_waits = False
        if self.prefill.add_request(first, sampling, kv_transfer=RemoteDecode(), arrival_s=arrival_s):
            self._originals[rid] = copy.deepcopy(request)
            self._sampling[rid] = sampling

    def _send_to_decode(self, rid: str, step: int) -> None:
        """Add the original request to the decode engine with its send's parameters."""
        self._event("decode", rid, step)
        self.transfers[rid].decode_add_step = step
        params = self._sends.pop(rid).params(PREFILL_ENGINE, self.prefill.config.block_size)
        self._unread.add(rid)  # (a rejection now is seen after the decode boundary)
        self.decode.add_request(self._originals.pop(rid), self._sampling.pop(rid), kv_transfer=params,
                                arrival_s=self.prefill.records[rid].arrival_s)

    def _copy_reads(self) -> list[str]:
        """Carry out the reads the decode engine's last step issued; their request ids."""
        copied = []
        for read in self.decode.scheduler.pd.receiving():
            if read.request_id not in self._unread:
                continue  # (copied after an earlier step, its done not reported yet)
            self._unread.discard(read.request_id)
            transfer = self.transfers[read.request_id]
            transfer.receive_step = read.step
            transfer.read_blocks = len(read.local_blocks)
            transfer.read_tokens = read.num_read_tokens
            transfer.read_bytes = copy_prompt_kv(self.prefill.cache, self.decode.cache, read, check=self.validate)
            copied.append(read.request_id)
        return copied

    def _free_send(self, rid: str, step: int) -> None:
        self._event("freed", rid, step)
        self.transfers[rid].freed_step = step
        self._in_flight.discard(rid)
        self.prefill.scheduler.pd.release(rid)
        self.prefill.runner.poison_released(gpu=True)  # (now: the prefill engine may take no further step)
        self._prefill_waits = False

