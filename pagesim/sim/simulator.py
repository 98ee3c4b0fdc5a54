"""A simulation run: a trace replayed through one replica's scheduler on a modelled deployment.

Building is separate from running (desmod's habit): ``Simulation(trace, scheduler, cost_model,
options)`` wires a SimPy environment with an arrival process (one per trace) and a replica
process; ``run()`` advances simulated time until every request has completed or been rejected and
returns a ``SimResult`` (summary, per-request and per-step metrics, the scheduler as it ended).

Every random choice (parallel-sample lengths, beam survival) flows from ``options.seed``; the
same trace, configuration and seed give the same decisions and the same summary, byte for byte
(wall-clock time is reported apart from it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from pagesim.sim.bench_args import check_request_timeout
from pagesim.sim.bench_metrics import DEFAULT_PERCENTILES, Slo
from pagesim.sim.client import ClosedLoopClient
from pagesim.sim.cluster_metrics import ideal_figures, replica_itl, scheduler_figures
from pagesim.sim.cost.base import CostModel
from pagesim.sim.gc_policy import collecting_less
from pagesim.sim.metrics import RequestMetrics, StepMetrics, admitted_rows, summarize
from pagesim.sim.serving_path import ServingPath
from pagesim.sim.replica import Replica, arrival_process
from pagesim.sim.workload import BeamModel, RequestFactory
from pagesim.traces.trace import Trace


@dataclass(frozen=True, slots=True)
class SimOptions:
    seed: int = 0
    sample_lengths: str = "drawn"  # parallel samples: "drawn" from the workload, or "same"
    beam_stay_prob: float = 0.8
    overlap_swaps: bool = False
    skip_ahead: bool = True  # advance pure decode stretches at once (pagesim/sim/skip_ahead.py); same results
    # goodput SLOs in seconds (None: not asked); vLLM bench's --goodput sets only those it names
    slo_ttft_s: float | None = 2.0  # time to first token at most this
    slo_tpot_s: float | None = 0.1  # and time per output token at most this
    slo_e2el_s: float | None = None  # and end-to-end latency at most this
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES  # of every latency in the summary
    max_concurrency: int | None = None  # a closed-loop client (pagesim/sim/client.py): at most this many in flight
    # the client gives up on a request unfinished this many seconds after sending it; the replica
    # aborts it at the next step boundary (pagesim/sim/replica.py; None: no timeout)
    request_timeout_s: float | None = None
    # keep every step's row (the --out tables, reports); False: only what the summary reads
    # (StepMetrics(keep_rows=False): start and duration per step, sums per chunk), same summary
    step_rows: bool = True
    # the time outside the forward pass (pagesim/sim/serving_path.py); None: none (a request enters the next
    # step, its tokens reach the client as the step ends)
    serving_path: ServingPath | None = None

    def __post_init__(self) -> None:
        self.slo  # checks the SLOs
        if not 0.0 <= self.beam_stay_prob <= 1.0:
            raise ValueError(f"beam stay probability must be in [0, 1], got {self.beam_stay_prob}")
        if self.max_concurrency is not None and (isinstance(self.max_concurrency, bool) or self.max_concurrency < 1):
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency!r}")
        check_request_timeout(self.request_timeout_s)

    @property
    def slo(self) -> Slo:
        return Slo(self.slo_ttft_s, self.slo_tpot_s, self.slo_e2el_s)


@dataclass
class SimResult:
    summary: dict
    requests: RequestMetrics
    steps: StepMetrics
    scheduler: object
    wall_s: float
    extra: dict = field(default_factory=dict)


class Simulation:
    def __init__(self, trace: Trace, scheduler, cost_model: CostModel, options: SimOptions | None = None, *,
                 decision_sink: Callable[[str], object] | None = None,
                 progress: Callable[[int], object] | None = None, block_bytes: int | None = None):
        """``block_bytes``: one KV block over the replica's GPUs, to state offload traffic in bytes."""
        self.trace = trace
        self.block_bytes = block_bytes
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.options = options or SimOptions()
        self.env = simpy.Environment()
        self.request_metrics = RequestMetrics(len(trace))
        self.step_metrics = StepMetrics(keep_rows=self.options.step_rows)
        factory = RequestFactory(trace, seed=self.options.seed, sample_lengths=self.options.sample_lengths)
        self.replica = Replica(
            self.env, scheduler, cost_model, requests=self.request_metrics, steps=self.step_metrics,
            beam_model=BeamModel(self.options.seed, self.options.beam_stay_prob),
            overlap_swaps=self.options.overlap_swaps, decision_sink=decision_sink, on_done=progress,
            skip_ahead=self.options.skip_ahead, serving_path=self.options.serving_path,
            request_timeout_s=self.options.request_timeout_s,
        )
        send = self.replica.submit
        self.client = None
        if self.options.max_concurrency is not None:
            self.client = ClosedLoopClient(self.env, self.options.max_concurrency, self.replica.submit)
            self.replica.on_request_done = self.client.finished
            send = self.client.send
        self.env.process(arrival_process(self.env, trace.arrival_s, factory.make, [self.replica], send))

    def run(self) -> SimResult:
        started = time.perf_counter()
        with collecting_less():
            self.env.run()
        wall_s = time.perf_counter() - started
        sched = self.scheduler
        if sched.has_unfinished_requests:  # the event queue ran dry with work left: a policy bug
            raise RuntimeError(f"simulation ended with {len(sched.requests)} requests unfinished")
        ideal = ideal_figures(self.trace, sched, admitted_rows(self.request_metrics), self.request_metrics)
        summary = summarize(
            self.request_metrics, self.step_metrics, slo=self.options.slo, percentiles=self.options.percentiles,
            itl=replica_itl(self.replica), preemptions=self.replica.preemptions, **scheduler_figures(sched, ideal),
            ideal=ideal, offload=self.replica.offload_totals(), block_bytes=self.block_bytes,
            request_timeout_s=self.options.request_timeout_s,
        )
        return SimResult(summary, self.request_metrics, self.step_metrics, sched, wall_s)
