"""The runs a validation compares: one workload through the simulator and through the real engine.

1. **Simulator** (calibrated cost model, parallel samples all of the trace's length, as the engine
   ignores EOS): its decision log, its per-request metrics, and for each request the step whose
   ``schedule()`` first saw it (``RequestMetrics.release_step``).
2. **Engine in lockstep** (validation mode: freed blocks poisoned): each request released before
   the step the simulator released it at, so the two must make the same decisions; its outputs
   are checked against the no-paging reference.
3. **Engine on the wall clock** (no poisoning; requests released at their arrival times): the
   measurement the simulator's timing is compared with, including the cost model's prediction for
   every step the engine actually ran;
4. for the noise floor: the engine **replaying** run 3 step for step (its releases, lockstep), and
   run 3 **again** on the wall clock.

Both halves use one ``SchedulerConfig`` and one scheduler class (a user's plug-in included).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import numpy as np

from pagesim.engine.policy import Request, SchedulerConfig
from pagesim.sim.cost.base import CostModel, StepWork
from pagesim.sim.metrics import COMPLETED, REJECTED, RequestMetrics
from pagesim.sim.simulator import SimOptions, SimResult, Simulation
from pagesim.traces.trace import Trace


@dataclass
class SimRun:
    result: SimResult
    log: list[dict]

    @property
    def release_steps(self) -> dict[str, int]:
        return {f"r{i}": int(s) for i, s in enumerate(self.result.requests.release_step)}


def simulate(trace: Trace, config: SchedulerConfig, scheduler_cls, cost_model: CostModel, *, seed: int = 0) -> SimRun:
    lines: list[str] = []
    scheduler = scheduler_cls(config)
    sim = Simulation(trace, scheduler, cost_model, SimOptions(seed=seed, sample_lengths="same"),
                     decision_sink=lines.append)
    result = sim.run()
    return SimRun(result, [json.loads(line) for line in lines])


def engine_requests(trace: Trace, vocab_size: int) -> list[Request]:
    return [trace.request(i, vocab_size=vocab_size) for i in range(len(trace))]


def run_lockstep(model, config: SchedulerConfig, scheduler_cls, requests: list[Request], release_steps: dict[str, int],
                 *, backend: str, validate: bool = True):
    """The engine releasing each request before the step ``release_steps`` names: the simulator's
    decisions (in validation mode), or, with ``validate=False`` and an earlier engine run's
    releases, that run's steps again, to time them one by one (the per-step noise floor)."""
    from pagesim.engine.runtime import Engine

    engine = Engine(model, config, backend=backend, validate=validate, scheduler_cls=scheduler_cls,
                    keep_outputs=validate)  # (validate: the simulator's steps, which validate also costs)
    engine.run_lockstep([copy.deepcopy(r) for r in requests], release_steps)
    return engine


def run_wall_clock(model, config: SchedulerConfig, scheduler_cls, requests: list[Request], *, backend: str):
    from pagesim.engine.runtime import Engine

    engine = Engine(model, config, backend=backend, validate=False, keep_outputs=True, scheduler_cls=scheduler_cls)
    engine.run([copy.deepcopy(r) for r in requests])
    return engine


def engine_metrics(engine, num_requests: int) -> RequestMetrics:
    """The engine's request records as the simulator's ``RequestMetrics`` (row ``i`` is ``r{i}``),
    so both are summarised by the same definitions."""
    m = RequestMetrics(num_requests)
    for rid, r in engine.records.items():
        i = int(rid[1:])
        m.arrival_s[i] = r.arrival_s
        m.prompt_tokens[i] = r.prompt_tokens
        m.n[i], m.beam_width[i], m.preemptions[i] = r.n, r.beam_width, r.preemptions
        if r.first_scheduled_s is not None:
            m.first_scheduled_s[i] = r.first_scheduled_s
        if r.status == "completed":
            m.status[i] = COMPLETED
            m.first_token_s[i], m.finish_s[i] = r.first_token_s, r.finish_s
            m.output_tokens[i] = r.output_tokens
            m.generation_len[i] = max((len(t) for t in r.outputs.values()), default=0)
        elif r.status == "rejected":
            m.status[i] = REJECTED
    return m


def step_times(engine, cost_model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(measured, predicted) seconds of every step the engine ran."""
    block_size = engine.config.block_size
    window = cost_model.attention_window
    measured = np.array([s.duration_s for s in engine.steps])
    predicted = np.array([cost_model.step_cost(StepWork.from_output(out, block_size, window)).total_s
                          for out in engine.outputs])
    return measured, predicted
