"""A disaggregated run: a prefill pool and a decode pool, a proxy between them, KV over a network.

Each request goes as vLLM 0.33's disaggregated proxy sends it
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``): to a prefill replica
(``prefill_router``) with ``max_tokens`` 1 and ``do_remote_decode`` (``RemoteDecode``); when it
finishes there (its response reaches the proxy: the prefill replica's serving-path terms after
its step), to a decode replica (``decode_router``) with the original request and the
``RemotePrefill`` its blocks make. The prefill's token is discarded; the request's times are the
decode replica's (the client sees its stream). The decode replica reads the prompt's KV over the
network (``KvNetwork``: NVLink within a node, RDMA between nodes, ports contended) when the step
that parks it starts, and tells the prefill replica when it is done, which frees its blocks. A
request the decode replica rejects frees them at once (vLLM: its notify-only receive).

Which public router each rule follows: ``round-robin`` is the proxy's (``itertools.cycle`` over
prefill and decode instances, independently); ``least-outstanding-tokens`` and ``least-kv`` are
load scorers of llm-d's endpoint picker (queue and KV-utilization scorers); ``prefix-affinity``
for prefill is SGLang's cache-aware router, llm-d's prefix-cache scorer in spirit
(``pagesim.sim.router`` states each rule exactly).

Skip-ahead: prefill replicas step one by one (every step of theirs admits or finishes requests);
decode replicas keep the fast path, bounded by ``_handover_bound``: the earliest instant a
prefill could hand *that* replica a request (``pagesim.sim.replica``'s ``arrival_bound``). Every
request still to be handed over gets a lower bound on when: a handover the proxy has still to
make, at its time; a request finishing in a prefill step running now, at that step's end; any
other request in a prefill replica, at the end of the step it runs now (or, for one idling with
requests queued while held blocks wait to be freed, at the earliest transfer end or decode step
end: the next read could start then); a request yet to arrive, at its arrival. Behind a
round-robin decode router, the replica's next request is the m-th handover from now (m known
from the handovers so far), so its bound is the m-th smallest of those; behind a router that
reads the replicas, any handover could be its own: the smallest. Requests reaching a decode
replica at the very instant one of its steps ends (equal floating-point times) may be seen one
step apart with the fast path on and off; nothing else differs.

Invariants: every prefill send is freed exactly once (a read's end, or the decode side's
rejection); a row's status is the decode side's, or REJECTED with the prefill side's reason.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from pagesim.engine.policy import Request
from pagesim.engine.policy.disagg import KvReceive, RemoteDecode
from pagesim.engine.policy.memory.block_key import default_hash
from pagesim.sim.client import ClosedLoopClient
from pagesim.sim.cost.base import CostModel
from pagesim.sim.disagg.network import KvNetwork, NetworkSpec
from pagesim.sim.gc_policy import collecting_less
from pagesim.sim.metrics import REJECTED, RequestMetrics, StepMetrics
from pagesim.sim.replica import Replica, arrival_process
from pagesim.sim.router import RoundRobin, Router
from pagesim.sim.simulator import SimOptions
from pagesim.sim.token_runs import TokenRuns
from pagesim.sim.workload import BeamModel, RequestFactory
from pagesim.traces.trace import Trace


@dataclass
class Pool:
    """One pool's replicas as built: ``(scheduler, cost model)`` each, their GPU presets, TP, the
    bytes of one KV block over a replica's GPUs."""

    replicas: Sequence[tuple[object, CostModel]]
    gpu: object
    tp: int
    block_bytes: int


@dataclass
class DisaggResult:
    requests: RequestMetrics  # the client's view (decode replicas' times)
    prefill_requests: RequestMetrics  # the prefill leg of each row
    prefill_of: np.ndarray
    decode_of: np.ndarray
    handover_s: np.ndarray  # when each row reached its decode replica
    read_start_s: np.ndarray
    read_end_s: np.ndarray
    prefill: list[Replica]
    decode: list[Replica]
    network: KvNetwork
    wall_s: float
    summary: dict


@dataclass
class _Transfer:
    seconds: float
    began_s: float | None = None

    def end_bound(self, now: float) -> float:
        return (self.began_s if self.began_s is not None else now) + self.seconds


class DisaggCluster:
    def __init__(self, trace: Trace, prefill: Pool, decode: Pool, *, prefill_router: Router | None = None,
                 decode_router: Router | None = None, options: SimOptions | None = None,
                 network: NetworkSpec | None = None,
                 decision_sinks: tuple[Sequence, Sequence] | None = None,
                 progress: Callable[[int], object] | None = None):
        if not prefill.replicas or not decode.replicas:
            raise ValueError("a disaggregated deployment needs at least one prefill and one decode replica")
        for name, pool in (("prefill", prefill), ("decode", decode)):
            for sched, _ in pool.replicas:
                if getattr(sched, "pd", None) is None:
                    raise ValueError(f"every {name} replica needs a P/D connector (kv_connector='nixl')")
        if int(np.max(trace.n, initial=1)) > 1 or int(np.max(trace.beam_width, initial=1)) > 1:
            raise ValueError("disaggregated serving sends one sequence per request (vLLM's proxy sends each sample "
                             "as its own request): the trace has n > 1 or beam search")
        self.trace = trace
        self.prefill_pool, self.decode_pool = prefill, decode
        self.prefill_router = prefill_router or RoundRobin()
        self.decode_router = decode_router or RoundRobin()
        opts = self.options = options or SimOptions()
        if opts.request_timeout_s is not None:
            raise ValueError("client timeouts (--request-timeout) with disaggregated serving are not modelled yet")
        self.env = env = simpy.Environment()
        n = len(trace)
        self.requests = RequestMetrics(n)
        self.prefill_requests = RequestMetrics(n)
        self.prefill_of = np.full(n, -1, np.int32)
        self.decode_of = np.full(n, -1, np.int32)
        self.handover_s = np.full(n, np.nan)
        self.read_start_s = np.full(n, np.nan)
        self.read_end_s = np.full(n, np.nan)
        self._progress = progress or (lambda count: None)
        closed_loop = opts.max_concurrency is not None
        p_sinks, d_sinks = decision_sinks or ([None] * len(prefill.replicas), [None] * len(decode.replicas))
        p_runs, d_runs = TokenRuns(n, len(prefill.replicas)), TokenRuns(n, len(decode.replicas))
        self.prefill = [
            Replica(env, sched, cost, requests=self.prefill_requests, steps=StepMetrics(keep_rows=opts.step_rows),
                    beam_model=BeamModel(opts.seed, opts.beam_stay_prob, replica=k), overlap_swaps=opts.overlap_swaps,
                    decision_sink=p_sinks[k], on_done=self._prefill_step_done, skip_ahead=False, replica_index=k,
                    token_runs=p_runs, serving_path=opts.serving_path, on_request_done=self._prefilled)
            for k, (sched, cost) in enumerate(prefill.replicas)
        ]
        self.decode = [
            Replica(env, sched, cost, requests=self.requests, steps=StepMetrics(keep_rows=opts.step_rows),
                    beam_model=BeamModel(opts.seed, opts.beam_stay_prob, replica=len(prefill.replicas) + k),
                    overlap_swaps=opts.overlap_swaps, decision_sink=d_sinks[k], on_done=self._progress,
                    skip_ahead=opts.skip_ahead and not closed_loop, replica_index=k, token_runs=d_runs,
                    serving_path=opts.serving_path, on_request_done=self._decoded)
            for k, (sched, cost) in enumerate(decode.replicas)
        ]
        for replica in self.prefill:
            replica.tracks_step_end = True
            replica.observed = self.prefill_router.reads_state and len(self.prefill) > 1
        for k, replica in enumerate(self.decode):
            replica.tracks_step_end = True
            replica.kv_reader = self._read
            replica.arrival_bound = functools.partial(self._handover_bound, k)
            replica.observed = self.decode_router.reads_state and len(self.decode) > 1
        self.network = KvNetwork(env, [prefill.gpu] * len(self.prefill) + [decode.gpu] * len(self.decode),
                                 [prefill.tp] * len(self.prefill) + [decode.tp] * len(self.decode),
                                 network or NetworkSpec())
        self._p_schedulers = [r.scheduler for r in self.prefill]
        self._d_schedulers = [r.scheduler for r in self.decode]
        self._p_block_size = self._p_schedulers[0].config.block_size
        # The decode side may take the prefill side's block keys (equal block sizes, the default hash).
        self._same_keys = all(s.config.block_size == self._p_block_size and s.kv.hash_fn is default_hash
                              for s in (*self._p_schedulers, *self._d_schedulers))
        self._rows: dict[str, int] = {}  # request id -> row, from its arrival until its read ends
        self._originals: dict[int, Request] = {}  # row -> the client's request, until handed over
        self._sends: dict[str, object] = {}  # request id -> its KvSend, until handed over
        self._handed: dict[int, str] = {}  # row -> request id, from its handover until it is done
        self._offset_s = self.prefill[0]._client_offset_s
        self._due: list[float] = []  # handovers the proxy has still to make (a heap of times)
        self._transfers: dict[int, _Transfer] = {}
        self._transfer_ids = 0
        self._num_arrived = 0  # rows routed to a prefill replica so far (the next arrival's row)
        self._num_handovers = 0  # decode routes so far (a round-robin router's position)
        self.client = None
        factory = RequestFactory(trace, seed=opts.seed, sample_lengths=opts.sample_lengths)
        if closed_loop:
            self.client = ClosedLoopClient(env, opts.max_concurrency, self._route)
            env.process(arrival_process(env, trace.arrival_s, factory.make, self.prefill, self.client.send))
        else:
            env.process(arrival_process(env, trace.arrival_s, factory.make, self.prefill, self._route))

    # ------------------------------------------------------------- the proxy
    def _route(self, row: int, request: Request) -> None:
        """An arrival: to a prefill replica, with ``max_tokens`` 1 and ``do_remote_decode``."""
        k = 0 if len(self.prefill) == 1 else self.prefill_router.route(request, self._p_schedulers)
        if not 0 <= k < len(self.prefill):
            raise ValueError(f"router {self.prefill_router.name!r} chose prefill replica {k} of {len(self.prefill)}")
        self.prefill_of[row] = k
        self._num_arrived += 1
        self._rows[request.request_id] = row
        self._originals[row] = request
        leg = Request(request.request_id, request.prompt_len, 1, request.arrival_time_s,
                      prompt_token_ids=request.prompt_token_ids, prefix_block_ids=request.prefix_block_ids,
                      prefix_block_tokens=request.prefix_block_tokens, priority=request.priority)
        self.prefill[k].submit(row, leg, RemoteDecode())

    def _prefill_step_done(self, count: int) -> None:
        """A prefill step finished or rejected ``count`` requests: their responses reach the proxy
        after the serving path's terms (``_prefilled`` then)."""
        if self._offset_s > 0:
            due = self.env.now + self._offset_s
            for _ in range(count):
                heapq.heappush(self._due, due)

    def _prefilled(self, row: int) -> None:
        """Row ``row``'s prefill response reached the proxy: on to a decode replica."""
        if self._due:
            heapq.heappop(self._due)
        request = self._originals.pop(row)
        rid = request.request_id
        p = int(self.prefill_of[row])
        m = self.requests
        if self.prefill_requests.status[row] == REJECTED:
            self._rows.pop(rid, None)
            m.arrival_s[row] = request.arrival_time_s
            m.prompt_tokens[row] = request.prompt_len
            m.status[row] = REJECTED
            m.reject_reasons[row] = f"prefill: {self.prefill_requests.reject_reasons.get(row, '')}"
            self._progress(1)
            if self.client is not None:
                self.client.finished(row)
            return
        if rid not in self._sends:
            for send in self._p_schedulers[p].pd.take_sends():
                self._sends[send.request_id] = send
        send = self._sends.pop(rid)
        d = 0 if len(self.decode) == 1 else self.decode_router.route(request, self._d_schedulers)
        self._num_handovers += 1
        if not 0 <= d < len(self.decode):
            raise ValueError(f"router {self.decode_router.name!r} chose decode replica {d} of {len(self.decode)}")
        self.decode_of[row] = d
        self.handover_s[row] = self.env.now
        self._handed[row] = rid
        if self._same_keys and not request.seqs[0].block_keys:  # (content keys: made once, on the prefill side)
            request.seqs[0].block_keys = list(self._p_schedulers[p].pd.held_keys(rid))
        self.prefill[p].kv_wait_started()  # (its blocks are held until the read ends)
        self.decode[d].submit(row, request, send.params(p, self._p_block_size))

    def _decoded(self, row: int) -> None:
        """Row ``row`` completed or was rejected on its decode replica."""
        rid = self._handed.pop(row, None)
        if rid is not None and self.requests.status[row] == REJECTED:  # never read: the prefill side frees its blocks now
            p = int(self.prefill_of[row])
            if self._p_schedulers[p].pd.release(rid):
                self.prefill[p].kv_wait_ended()
            self._rows.pop(rid, None)
        if self.client is not None:
            self.client.finished(row)

    # -------------------------------------------------------------- the reads
    def _read(self, replica: Replica, receives: tuple) -> None:
        """A decode step starts: its reads go over the network."""
        d = replica.index
        for read in receives:
            row = self._rows[read.request_id]
            self.read_start_s[row] = self.env.now
            replica.kv_wait_started()
            self.env.process(self._transfer(read, d, row))

    def _transfer(self, read: KvReceive, d: int, row: int):
        p = read.source.engine
        num_bytes = len(read.local_blocks) * self.decode_pool.block_bytes
        src, dst = p, len(self.prefill) + d
        tid = self._transfer_ids = self._transfer_ids + 1
        entry = self._transfers[tid] = _Transfer(self.network.link(src, dst).seconds(num_bytes))
        yield from self.network.transfer(src, dst, num_bytes, entry)
        del self._transfers[tid]
        self.read_end_s[row] = self.env.now
        self._rows.pop(read.request_id, None)
        self.decode[d].kv_wait_ended(read.request_id)
        if self._p_schedulers[p].pd.release(read.source.request_id):  # (its notification reaches the prefill side)
            self.prefill[p].kv_wait_ended()

    def _handover_bound(self, d: int) -> float:
        """The earliest instant a prefill replica could hand decode replica ``d`` a request
        (module docstring)."""
        num_decode = len(self.decode)
        m = 1 if num_decode == 1 or self.decode_router.reads_state else (d - self._num_handovers) % num_decode + 1
        bounds = heapq.nsmallest(m, self._due) if self._due else []
        blocked_s = None
        for replica in self.prefill:
            queued = len(replica.scheduler.requests) + len(replica._held)
            if not queued:
                continue
            if replica._in_flight:  # (those its running step finishes at its end, the rest later still)
                bounds.extend([replica.step_end_bound_s] * min(m, queued))
            else:  # (idle with requests queued: it waits for a send to be freed)
                if blocked_s is None:
                    blocked_s = self._blocked_bound()
                bounds.extend([blocked_s] * min(m, queued))
        arrivals = self.trace.arrival_s
        upcoming = arrivals[self._num_arrived:self._num_arrived + m]
        bounds.extend(float(t) for t in upcoming)
        if len(bounds) < m:
            return math.inf
        return heapq.nsmallest(m, bounds)[-1]

    def _blocked_bound(self) -> float:
        """The earliest a prefill replica idling with requests queued could run a step again: a
        transfer's end (its send freed), a decode step's end (it may start a read), the next
        arrival or handover due (a rejection frees a send at once)."""
        now = self.env.now
        bound = math.inf
        for transfer in self._transfers.values():
            bound = min(bound, transfer.end_bound(now))
        for replica in (*self.decode, *self.prefill):  # (a prefill step's handover may be rejected: freed at once)
            if replica._in_flight:
                bound = min(bound, replica.step_end_bound_s)
        if self._due:
            bound = min(bound, self._due[0])
        if self._num_arrived < len(self.trace.arrival_s):
            bound = min(bound, float(self.trace.arrival_s[self._num_arrived]))
        return max(bound, now)

    # -------------------------------------------------------------------- run
    def run(self) -> DisaggResult:
        from pagesim.sim.disagg.metrics import disagg_summary

        started = time.perf_counter()
        try:
            with collecting_less():
                self.env.run()
        except MemoryError:
            raise MemoryError(f"out of memory simulating {len(self.trace):,} requests at simulated time "
                              f"{self.env.now:.1f} s") from None
        wall_s = time.perf_counter() - started
        for name, replicas in (("prefill", self.prefill), ("decode", self.decode)):
            for k, replica in enumerate(replicas):
                if replica.scheduler.has_unfinished_requests:
                    raise RuntimeError(f"simulation ended with {len(replica.scheduler.requests)} requests unfinished "
                                       f"on {name} replica {k}")
        for k, sched in enumerate(self._p_schedulers):
            if sched.pd.held_sends():
                raise RuntimeError(f"simulation ended with {len(sched.pd.held_sends())} sends still held on prefill "
                                   f"replica {k} (a read that never ended)")
        result = DisaggResult(self.requests, self.prefill_requests, self.prefill_of, self.decode_of, self.handover_s,
                              self.read_start_s, self.read_end_s, self.prefill, self.decode, self.network, wall_s, {})
        result.summary = disagg_summary(self, result)
        return result

