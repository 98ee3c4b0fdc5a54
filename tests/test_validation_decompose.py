"""Validation errors that add up (``pagesim.reports.validation.decompose``).

On synthetic timelines the parts are known exactly: a cost model off by a factor gives latency
errors of that factor, the engine's waits between steps are their own part, and the decisions
part is zero when the simulator made the engine's decisions. On the real engine (tiny model), a
cost model predicting each step at a known factor of its measured time gives the simulator TPOT
and e2e exactly that factor of the engine's busy time, with nothing left to decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from pagesim.reports.validation.decompose import EngineTimeline, decompose
from pagesim.sim.metrics import COMPLETED, RequestMetrics


@dataclass
class Step:
    start_s: float
    duration_s: float


def _timeline(durations, waits, lives, arrivals):
    """Engine steps with ``durations`` and ``waits[k]`` before step k; request i is first scheduled
    at step ``lives[i][0]``, gets its first token at ``lives[i][1]`` and finishes at ``lives[i][2]``
    (generation length = finish - first token + 1)."""
    steps, t = [], 0.0
    for d, w in zip(durations, waits):
        t += w
        steps.append(Step(t, d))
        t += d
    m = RequestMetrics(len(lives))
    for i, ((fs, ft, fin), a) in enumerate(zip(lives, arrivals)):
        m.arrival_s[i] = a
        m.first_scheduled_s[i] = steps[fs].start_s
        m.first_token_s[i] = steps[ft].start_s + steps[ft].duration_s
        m.finish_s[i] = steps[fin].start_s + steps[fin].duration_s
        m.generation_len[i] = fin - ft + 1
        m.status[i] = COMPLETED
    return steps, m


def _simulated(durations, lives, arrivals):
    """The simulator's records of the same decisions with ``durations``, steps back to back from 0."""
    steps, m = _timeline(durations, [0.0] * len(durations), lives, arrivals)
    return m


LIVES = [(0, 0, 9), (0, 0, 5), (2, 3, 11), (4, 5, 14), (6, 6, 6)]
ARRIVALS = [0.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.55, 3.0])
def test_a_cost_model_off_by_a_factor_gives_latency_errors_of_that_factor(factor):
    rng = np.random.default_rng(1)
    d = rng.uniform(1e-3, 5e-3, 15)
    steps, engine = _timeline(d, [0.0] * 15, LIVES, ARRIVALS)
    sim = _simulated(d * factor, LIVES, ARRIVALS)
    parts = decompose(sim, engine, EngineTimeline(steps, engine), d * factor)
    for name in ("ttft", "tpot", "e2e"):
        p = parts[name]
        assert p["mean_error"] == pytest.approx(factor - 1, abs=1e-3), name
        assert p["step_time"] == pytest.approx(factor - 1, abs=1e-3), name
        assert p["decisions"] == pytest.approx(0, abs=1e-9) and p["queue_wait"] == pytest.approx(0, abs=1e-9)
        assert p["between_steps"] == pytest.approx(0, abs=1e-9)


def test_waits_between_steps_are_their_own_part_and_the_parts_sum_to_the_error():
    rng = np.random.default_rng(2)
    d = rng.uniform(1e-3, 5e-3, 15)
    waits = rng.uniform(0, 4e-4, 15)
    arrivals = [0.0, 0.0, 0.0, 0.0, 0.0]
    steps, engine = _timeline(d, waits, LIVES, arrivals)
    sim = _simulated(d * 1.2, LIVES, arrivals)
    parts = decompose(sim, engine, EngineTimeline(steps, engine), d * 1.2)
    for name in ("ttft", "tpot", "e2e"):
        p = parts[name]
        assert p["between_steps"] < 0  # the simulator has no waits: the engine's were extra time
        assert p["decisions"] == pytest.approx(0, abs=1e-9)
        total = p["between_steps"] + p["step_time"] + p["queue_wait"] + p["decisions"]
        assert total == pytest.approx(p["mean_error"], abs=2e-3), name
        busy, measured = p["engine_busy_mean_s"], p["engine_mean_s"]
        assert p["simulator_mean_s"] == pytest.approx(1.2 * busy, rel=1e-3)
        assert busy < measured


def test_a_request_arriving_inside_a_step_waits_its_share_of_it():
    d = np.full(6, 2e-3)
    steps, engine = _timeline(d, [0.0] * 6, [(0, 0, 3), (2, 2, 5)], [0.0, 3e-3])  # r1 arrives halfway into step 1
    timeline = EngineTimeline(steps, engine)
    busy = timeline.latencies()
    assert busy["queue"][1] == pytest.approx(1e-3)  # the second half of step 1
    assert busy["ttft"][1] == pytest.approx(3e-3) and busy["e2e"][1] == pytest.approx(9e-3)
    twice = timeline.latencies(d * 2)
    assert twice["queue"][1] == pytest.approx(2e-3) and twice["ttft"][1] == pytest.approx(6e-3)
    assert np.allclose(busy["ttft"], engine.ttft_s()) and np.allclose(busy["e2e"], engine.e2e_s())


def test_other_decisions_land_in_the_decisions_part():
    d = np.full(12, 2e-3)
    steps, engine = _timeline(d, [0.0] * 12, [(0, 0, 5), (0, 0, 8)], [0.0, 0.0])
    sim = _simulated(d, [(0, 0, 7), (0, 0, 8)], [0.0, 0.0])  # the simulator kept r0 two steps longer
    p = decompose(sim, engine, EngineTimeline(steps, engine), d)["e2e"]
    assert p["step_time"] == pytest.approx(0, abs=1e-9) and p["between_steps"] == pytest.approx(0, abs=1e-9)
    assert p["decisions"] == pytest.approx(p["mean_error"]) and p["decisions"] > 0


torch = pytest.importorskip("torch")


class StepTimes:  # (duck-typed: the replica calls step_cost and the usage hooks only)
    """A cost model predicting the engine's i-th measured step time times ``factor`` on its i-th call
    (the simulator costs each step once, in order, with skip-ahead off)."""

    name = "replay"
    attention_window = None

    def __init__(self, measured, factor):
        self.measured, self.factor, self.calls = list(measured), factor, 0

    def step_cost(self, work):
        from pagesim.sim.cost.base import TERMS, StepCost

        seconds = self.factor * self.measured[self.calls]
        self.calls += 1
        return StepCost({**dict.fromkeys(TERMS, 0.0), "linear": seconds})


@pytest.mark.parametrize("factor", [1.0, 2.5])
def test_on_the_engine_a_cost_model_off_by_a_factor_gives_that_factor(factor):
    from pagesim.engine.model import load_model
    from pagesim.engine.policy import make_config
    from pagesim.engine.policy.scheduling.scheduler import Scheduler
    from pagesim.reports.validation import compare, runs
    from pagesim.sim.simulator import SimOptions, Simulation
    from pagesim.traces.generate import generate, workload_spec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trace = generate(workload_spec("kwon2023-alpaca", rate_rps=100.0, num_requests=8, seed=3))
        trace.arrival_s[:] = 0.0  # all at once: the wall-clock engine then makes the simulator's decisions
        model = load_model("tiny", seed=0, dtype=torch.float64)
        config = make_config("pagesim", block_size=8, num_gpu_blocks=64, num_cpu_blocks=0, max_model_len=512,
                             record_decisions=True)
        requests = runs.engine_requests(trace, model.config.vocab_size)
        wall = runs.run_wall_clock(model, config, Scheduler, requests, backend="torch")
    finally:
        torch.set_num_threads(threads)
    measured = np.array([s.duration_s for s in wall.steps])
    cost = StepTimes(measured, factor)
    lines: list[str] = []
    sim = Simulation(trace, Scheduler(config), cost, SimOptions(sample_lengths="same", skip_ahead=False),
                     decision_sink=lines.append).run()
    import json

    assert [json.loads(x) for x in lines] == wall.scheduler.decision_log.records  # the same decisions
    assert cost.calls == len(measured)
    engine = runs.engine_metrics(wall, len(trace))
    parts = decompose(sim.requests, engine, EngineTimeline(wall.steps, engine), measured * factor)
    for name in ("tpot", "e2e"):
        p = parts[name]
        assert p["decisions"] == pytest.approx(0, abs=1e-3) and p["queue_wait"] == pytest.approx(0, abs=1e-3)
        assert p["simulator_mean_s"] == pytest.approx(factor * p["engine_busy_mean_s"], rel=1e-3), name
        # The part and the two means are each reported to 4 significant digits (compare._r, at
        # most 5e-4 relative each): the rounded means' ratio is within 1e-3 of the unrounded one,
        # the part within 5e-4 of itself. An absolute 1e-3 alone failed on an unlucky rounding
        # (1.474 against 1.47505 from the rounded means).
        expected = (factor - 1) * p["engine_busy_mean_s"] / p["engine_mean_s"]
        rounding = max(1e-3, 1e-3 * abs(expected) + 5e-4 * abs(p["step_time"]))
        assert abs(p["step_time"] - expected) <= rounding, (name, p["step_time"], expected)
        assert p["between_steps"] <= 1e-9  # the engine's time between steps: never less than none
    assert compare.latency_errors(sim.requests, engine)["tpot"]["mean_error"] == pytest.approx(
        parts["tpot"]["mean_error"], abs=1e-3)
