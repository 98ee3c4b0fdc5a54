"""A cluster run: a trace replayed through N replicas behind a router.

Building is separate from running: ``Cluster(trace, replicas, router, options)`` wires one SimPy
environment with N ``Replica`` processes (each its own scheduler, cost model, step table and
beam-survival stream) and one router process that replaces the single-replica arrival process:
at each arrival it asks the ``Router`` (``pagesim.sim.router``) for a replica and submits the request
there. ``run()`` advances time until every request has completed or been rejected and returns a
``ClusterResult`` (``pagesim.sim.cluster_metrics`` defines the summary).

From Python::

    builts = build_replicas(RunSpec(tp=2), 4)
    cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router("least-kv"),
                      SimOptions(seed=1), tp=2)
    result = cluster.run()  # result.summary["replicas"][k], result.replica_of[row]

Invariants:
- The router process sets every replica's ``next_arrival_s`` to the next arrival (any replica
  may receive it) before waiting for it, and to ``inf`` after the last; rows sharing an
  arrival time are routed and submitted together, in row order (as ``pagesim.sim.replica.arrival_process``).
- A router that reads the schedulers finds each replica, at every arrival, in the state
  step-by-step simulation would have it: the replicas are marked ``observed``, so skip-ahead
  applies no step that ends after the next arrival.
- Routing is deterministic: routers draw nothing at random, requests are made by one seeded
  ``RequestFactory`` in row order, and replica k's beams draw from stream k of the run's seed.
  The same trace, replicas, router and seed give the same run.
- With one replica the route is trivial (the router is not asked) and the run, its decisions and
  its summary are exactly those of ``pagesim.sim.simulator.Simulation``.
- The trace's arrival column is read in chunks, never converted to one Python list.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from pagesim.engine.policy import Request
from pagesim.sim.cluster_metrics import ClusterSteps, cluster_summary
from pagesim.sim.cost.base import CostModel
from pagesim.sim.gc_policy import collecting_less
from pagesim.sim.metrics import RequestMetrics, StepMetrics
from pagesim.sim.replica import Replica, arrival_process, iter_chunked
from pagesim.sim.client import ClosedLoopClient
from pagesim.sim.router import Router, RoundRobin
from pagesim.sim.simulator import SimOptions
from pagesim.sim.token_runs import TokenRuns
from pagesim.sim.workload import BeamModel, RequestFactory
from pagesim.traces.trace import Trace

@dataclass
class ClusterResult:
    summary: dict
    requests: RequestMetrics  # all rows
    steps: ClusterSteps  # every replica's steps, replica by replica
    replica_of: np.ndarray  # row -> replica index
    replicas: list[Replica]
    wall_s: float


#: The most replicas a cluster run builds (each a scheduler, KV cache and SimPy process of its own).
MAX_REPLICAS = 1024


def build_replicas(spec, num_replicas: int) -> list:
    """``pagesim.sim.setup.build(spec)`` once per replica: each gets its own scheduler and cost model.
    The count, and the KV blocks of all replicas together (``pagesim.sim.setup.MAX_KV_BLOCKS``), are
    checked before a second replica is built."""
    from pagesim.sim.setup import build, check_kv_blocks

    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {num_replicas!r}")
    if num_replicas > MAX_REPLICAS:
        raise ValueError(f"--replicas {num_replicas} is more than the {MAX_REPLICAS} this simulator builds "
                         f"(each replica is a scheduler and KV cache of its own)")
    first = build(spec)
    config = first.scheduler.config
    check_kv_blocks(config.num_gpu_blocks, config.num_cpu_blocks + config.num_offload_blocks, num_replicas, source=first.kv_cache_source)
    builts = [first]
    try:
        builts.extend(build(spec) for _ in range(num_replicas - 1))
    except MemoryError:
        raise MemoryError(f"out of memory building replica {len(builts) + 1} of {num_replicas} "
                          f"({config.num_gpu_blocks:,} GPU and {config.num_cpu_blocks:,} CPU blocks each)") from None
    return builts


class Cluster:
    def __init__(self, trace: Trace, replicas: Sequence[tuple[object, CostModel]], router: Router | None = None,
                 options: SimOptions | None = None, *, tp: int = 1,
                 decision_sinks: Sequence[Callable[[str], object] | None] | None = None,
                 progress: Callable[[int], object] | None = None, block_bytes: int | None = None):
        """``replicas``: one ``(scheduler, cost_model)`` per replica, none shared; ``tp`` is what
        the summary states per replica (the cost models already account for it); ``block_bytes``:
        one KV block over a replica's GPUs, to state offload traffic in bytes;
        ``decision_sinks``: one per replica (or ``None``), each receiving its replica's log."""
        if not replicas:
            raise ValueError("a cluster needs at least one replica")
        if len({id(sched) for sched, _ in replicas}) != len(replicas):
            raise ValueError("each replica needs its own scheduler (build one per replica)")
        sinks = list(decision_sinks) if decision_sinks is not None else [None] * len(replicas)
        if len(sinks) != len(replicas):
            raise ValueError(f"{len(sinks)} decision sinks for {len(replicas)} replicas")
        self.trace = trace
        self.router = router or RoundRobin()
        self.options = options or SimOptions()
        self.tp = tp
        self.block_bytes = block_bytes
        self.env = simpy.Environment()
        try:
            self.request_metrics = RequestMetrics(len(trace))
            self.replica_of = np.full(len(trace), -1, np.int32)  # -1: not routed yet
            token_runs = TokenRuns(len(trace), len(replicas))
        except MemoryError:
            raise MemoryError(f"out of memory allocating the per-request results of {len(trace):,} requests") from None
        opts = self.options
        closed_loop = opts.max_concurrency is not None
        # NOTE: a closed-loop client sends a request when any replica finishes one, at an instant no
        # other replica can foresee, so with several replicas none may skip ahead past it.
        skip_ahead = opts.skip_ahead and not (closed_loop and len(replicas) > 1)
        self.replicas = [
            Replica(self.env, sched, cost_model, requests=self.request_metrics, steps=StepMetrics(keep_rows=opts.step_rows),
                    beam_model=BeamModel(opts.seed, opts.beam_stay_prob, replica=k),
                    overlap_swaps=opts.overlap_swaps, decision_sink=sinks[k], on_done=progress,
                    skip_ahead=skip_ahead, replica_index=k, token_runs=token_runs,
                    serving_path=opts.serving_path, request_timeout_s=opts.request_timeout_s)
            for k, (sched, cost_model) in enumerate(replicas)
        ]
        self.schedulers = [r.scheduler for r in self.replicas]
        if len(self.replicas) > 1 and self.router.reads_state:
            for replica in self.replicas:  # skip-ahead then stops short of every arrival
                replica.observed = True
        factory = RequestFactory(trace, seed=opts.seed, sample_lengths=opts.sample_lengths)
        self.client = None
        if closed_loop:
            self.client = ClosedLoopClient(self.env, opts.max_concurrency, self._route)
            for replica in self.replicas:
                replica.on_request_done = self.client.finished
            self.env.process(arrival_process(self.env, trace.arrival_s, factory.make, self.replicas, self.client.send))
        elif len(self.replicas) > 1 and not self.router.reads_state:
            self.env.process(self._arrivals_routed_ahead(trace.arrival_s, factory.make))
        else:
            self.env.process(arrival_process(self.env, trace.arrival_s, factory.make, self.replicas, self._route))

    def _arrivals_routed_ahead(self, arrival_s: np.ndarray, make_request: Callable[[int], Request]):
        """The arrival process for a router that never reads the replicas (round-robin): its choice
        cannot depend on when it is asked, so requests are made and routed, in row order, as they
        enter a lookahead window, and each replica is told when *its* next request arrives (or a
        bound: the window's last arrival). Requests reach replicas at their arrival times, rows
        sharing a time together, exactly as ``arrival_process`` submits them; a replica's
        skip-ahead is then bounded by its own arrivals, not by every replica's."""
        env = self.env
        replicas = self.replicas
        times = iter_chunked(arrival_s)
        window: deque[tuple[float, int, Request, int]] = deque()  # (time, row, request, replica)
        size = 8 * len(replicas)
        row = 0
        exhausted = False
        while True:
            while not exhausted and len(window) < size:
                t = next(times, None)
                if t is None:
                    exhausted = True
                    break
                request = make_request(row)
                k = self.router.route(request, self.schedulers)
                if not 0 <= k < len(replicas):
                    raise ValueError(f"router {self.router.name!r} chose replica {k} of {len(replicas)}")
                window.append((t, row, request, k))
                row += 1
            if not window:
                break
            t = window[0][0]
            delay = t - env.now
            if delay > 0 and not math.isclose(t, env.now, rel_tol=0.0, abs_tol=1e-12):
                upcoming: dict[int, float] = {}
                for when, _, _, k in window:
                    upcoming.setdefault(k, when)
                bound = math.inf if exhausted else window[-1][0]
                for k, replica in enumerate(replicas):
                    replica.next_arrival_s = upcoming.get(k, bound)
                yield env.timeout(delay)
            while window and window[0][0] <= t:
                _, r, request, k = window.popleft()
                self.replica_of[r] = k
                replicas[k].submit(r, request)
            # (rows sharing time t beyond the window are submitted next round, with no wait)
        for replica in replicas:
            replica.next_arrival_s = math.inf

    def _route(self, row: int, request: Request) -> None:
        num = len(self.replicas)
        k = 0 if num == 1 else self.router.route(request, self.schedulers)
        if not 0 <= k < num:
            raise ValueError(f"router {self.router.name!r} chose replica {k} of {num}")
        self.replica_of[row] = k
        self.replicas[k].submit(row, request)

    # ----------------------------------------------------------------- run
    def run(self) -> ClusterResult:
        started = time.perf_counter()
        try:
            with collecting_less():
                self.env.run()
        except MemoryError:
            raise MemoryError(f"out of memory simulating {len(self.trace):,} requests on {len(self.replicas)} "
                              f"replica(s), at simulated time {self.env.now:.1f} s") from None
        wall_s = time.perf_counter() - started
        for k, sched in enumerate(self.schedulers):
            if sched.has_unfinished_requests:  # the event queue ran dry with work left: a policy bug
                raise RuntimeError(f"simulation ended with {len(sched.requests)} requests unfinished on replica {k}")
        summary = cluster_summary(self.request_metrics, self.replicas, self.replica_of, slo=self.options.slo,
                                  percentiles=self.options.percentiles, router_name=self.router.name, tp=self.tp,
                                  block_bytes=self.block_bytes, trace=self.trace,
                                  request_timeout_s=self.options.request_timeout_s)
        return ClusterResult(summary, self.request_metrics, ClusterSteps([r.steps for r in self.replicas]),
                             self.replica_of, self.replicas, wall_s)
