"""Why a latency error is what it is: the parts of it the step errors explain, so the errors add up.

On the engine's wall clock a request's latency is its wait in the queue plus the steps it lived
through, with the engine's waits between steps in between; the simulator's is its queue wait plus
*its* steps, which are the engine's steps only where both made the same decisions. So the error
of a mean latency (TTFT, TPOT, e2e; ``pagesim.sim.metrics`` definitions) splits exactly into four parts,
each a difference of means over the engine's mean, which sum to the total:

- ``between_steps``: the engine's time outside its steps while the request waited or ran (what
  ``run()`` spends outside ``schedule() .. update()``: admitting requests, the loop), which the
  simulator does not model: each latency re-measured on the engine's busy time only, minus the
  latency as measured;
- ``step_time``: that busy time with every step the request lived through (and the busy part of
  the step it arrived in) costed by the cost model's prediction for that very step (its
  ``SchedulerOutput``), minus the measured busy time: the part the step errors explain;
- ``queue_wait``: the simulator's wait from arrival to first scheduling minus the engine's (re-timed
  as above). With the same decisions both wait the same steps and it is only where in a step the
  request arrived (the two clocks drift apart by the step errors); with others it also holds the
  simulator's longer or shorter queueing; TPOT has none;
- ``decisions``: the rest, the simulator's steps from first scheduling on against the engine's
  steps predicted: scheduling differences (other batches, preemptions, step counts, a request
  joining at another step) and whatever the simulator puts between steps. Zero when both made
  the same decisions (the same steps costed the same). The scheduler's own CPU time is not here:
  it is inside a step (``schedule()`` to ``update()``), so in ``step_time``.

Per request the parts are computed on the engine's timeline (steps, their measured and predicted
times) and the simulator's request records; no run is re-simulated, so nothing drifts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagesim.reports.validation.compare import _r
from pagesim.sim.metrics import COMPLETED, RequestMetrics

METRICS = ("ttft", "tpot", "e2e")
PARTS = ("between_steps", "step_time", "queue_wait", "decisions")


def _step_index(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of ``values`` (a step's start or end as the engine recorded it, NaN if none), the
    index of the nearest entry of the ascending ``times``; -1 for NaN."""
    out = np.full(len(values), -1, np.int64)
    ok = np.isfinite(values)
    if not ok.any() or not len(times):
        return out
    i = np.clip(np.searchsorted(times, values[ok]), 1, max(1, len(times) - 1))
    if len(times) > 1:
        i = np.where(np.abs(values[ok] - times[i - 1]) <= np.abs(times[i] - values[ok]), i - 1, i)
    else:
        i = np.zeros(int(ok.sum()), np.int64)
    out[ok] = i
    return out


class EngineTimeline:
    """The engine's wall-clock run as arrays: each step's start and measured duration, and per
    request the steps at which it was first scheduled, got its first token and finished."""

    def __init__(self, steps, metrics: RequestMetrics):
        self.start = np.array([s.start_s for s in steps], float)
        self.duration = np.array([s.duration_s for s in steps], float)
        self.end = self.start + self.duration
        self.metrics = metrics
        self.first_scheduled = _step_index(self.start, metrics.first_scheduled_s)
        self.first_token = _step_index(self.end, metrics.first_token_s)
        self.finish = _step_index(self.end, metrics.finish_s)

    def latencies(self, step_s: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per request: TTFT, TPOT, e2e and the queue wait with the time between steps left out and
        each step taking ``step_s`` (default: its measured time); the step a request arrived in
        counts for its share after the arrival. NaN where the engine did not complete it."""
        v = self.duration if step_s is None else np.asarray(step_s, float)
        before = np.concatenate([[0.0], np.cumsum(v)])  # busy time before step k: before[k]
        m = self.metrics
        n = len(m.arrival_s)
        ok = (m.status == COMPLETED) & (self.first_scheduled >= 0) & (self.first_token >= 0) & (self.finish >= 0)
        nan = np.full(n, np.nan)
        out = {"ttft": nan.copy(), "tpot": nan.copy(), "e2e": nan.copy(), "queue": nan.copy()}
        if not ok.any():
            return out
        a = m.arrival_s[ok]
        j = np.searchsorted(self.end, a, side="right")  # steps ended by the arrival; step j may hold it
        inside = j < len(self.start)
        jj = np.minimum(j, len(self.start) - 1)
        share = np.where(inside, np.clip((a - self.start[jj]) / np.where(self.duration[jj] > 0, self.duration[jj], 1.0),
                                         0.0, 1.0), 0.0)
        at_arrival = before[j] + np.where(inside, v[jj] * share, 0.0)
        fs, ft, fin = self.first_scheduled[ok], self.first_token[ok], self.finish[ok]
        first_token, finish = before[ft + 1], before[fin + 1]
        out["queue"][ok] = before[fs] - at_arrival
        out["ttft"][ok] = first_token - at_arrival
        out["e2e"][ok] = finish - at_arrival
        g = m.generation_len[ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            out["tpot"][ok] = np.where(g >= 2, (finish - first_token) / (g - 1), np.nan)
        return out


def _mean(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return float(v.mean()) if len(v) else None


def decompose(sim: RequestMetrics, engine: RequestMetrics, timeline: EngineTimeline,
              predicted: np.ndarray) -> dict[str, Any]:
    """Per latency metric, the error of the simulator's mean against the engine's and its four
    parts (see the module docstring), over the requests both completed."""
    rows = (sim.status == COMPLETED) & (engine.status == COMPLETED)
    busy = timeline.latencies()
    costed = timeline.latencies(predicted)
    measured = {"ttft": engine.ttft_s(), "tpot": engine.tpot_s(), "e2e": engine.e2e_s()}
    simulated = {"ttft": sim.ttft_s(), "tpot": sim.tpot_s(), "e2e": sim.e2e_s()}
    sim_queue = sim.first_scheduled_s - sim.arrival_s
    out: dict[str, Any] = {"requests": int(rows.sum())}
    for name in METRICS:
        both = rows & np.isfinite(measured[name]) & np.isfinite(simulated[name]) & np.isfinite(costed[name])
        e, w, p, s = (_mean(x[both]) for x in (measured[name], busy[name], costed[name], simulated[name]))
        if None in (e, w, p, s) or e == 0:
            out[name] = None
            continue
        queue = 0.0 if name == "tpot" else float(np.mean(sim_queue[both] - costed["queue"][both]))
        parts = {"between_steps": w - e, "step_time": p - w, "queue_wait": queue, "decisions": s - p - queue}
        out[name] = {"mean_error": _r((s - e) / e), **{k: _r(x / e) for k, x in parts.items()},
                     "engine_mean_s": _r(e), "engine_busy_mean_s": _r(w), "engine_predicted_mean_s": _r(p),
                     "simulator_mean_s": _r(s)}
    return out


def step_error_over_lifetimes(timeline: EngineTimeline, predicted: np.ndarray) -> float | None:
    """The step-time error weighted as the latencies weigh it: over every completed request, the
    predicted over the measured time of the steps from its first scheduling to its finish."""
    m = timeline.metrics
    ok = (m.status == COMPLETED) & (timeline.first_scheduled >= 0) & (timeline.finish >= 0)
    if not ok.any():
        return None
    cm = np.concatenate([[0.0], np.cumsum(timeline.duration)])
    cp = np.concatenate([[0.0], np.cumsum(predicted)])
    a, b = timeline.first_scheduled[ok], timeline.finish[ok] + 1
    measured = (cm[b] - cm[a]).sum()
    return _r((cp[b] - cp[a]).sum() / measured - 1) if measured > 0 else None
