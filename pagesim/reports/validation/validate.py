"""One validation: the simulator against the real engine on one workload, as a JSON-ready report.

``validate`` runs the runs of ``pagesim.reports.validation.runs`` (unless ``noise_runs`` is 0, also a
step-for-step replay of the engine's wall-clock run and ``noise_runs`` repeats of it, to measure
how far the *same* engine is from itself on this machine: the floor under any simulator error),
then ``pagesim.reports.validation.compare``'s
measures. The report's top-level keys: ``decision_logs_identical`` (with ``first_difference``
when not), ``outputs_match_reference``, ``step_time_mape``, ``ttft`` / ``tpot`` / ``e2e``
(paired MAPE, mean / p50 / p99 errors, KS), ``throughput``, ``noise`` (the same measures between
two engine runs) and ``targets`` (the issue's thresholds, each with its figure).

Why the latency errors are what they are: ``error_parts`` splits each mean latency error into the
part the step errors explain over the steps each request lived through, the decisions part (scheduling differences: zero
when the engine's wall-clock run made the simulator's decisions, which
``wall_clock_decisions_identical`` says), the queue wait's and the engine's time between steps
(``pagesim.reports.validation.decompose``). ``step_time`` is the error over the engine's wall-clock steps;
``simulator_step_time`` over the simulator's own steps, as the lockstep engine timed them (in
validation mode, freed blocks poisoned): where the two differ, the simulator ran its steps in
another regime than the engine did (larger batches, say), and its latencies carry that error.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pagesim.engine.model.weights import dtype_name
from pagesim.engine.policy import SchedulerConfig
from pagesim.reports.validation import compare, decompose, runs
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.metrics import COMPLETED
from pagesim.traces.trace import Trace

#: The issue's targets: (report path, threshold on the absolute value).
TARGETS = {
    "tpot_mean_within_3pct": (("tpot", "mean_error"), 0.03),
    "e2e_mean_within_3pct": (("e2e", "mean_error"), 0.03),
    "step_time_mape_within_5pct": (("step_time_mape",), 0.05),
    "ttft_p50_within_10pct": (("ttft", "p50_error"), 0.10),
}


@dataclass
class Validation:
    report: dict[str, Any]
    sim: runs.SimRun
    engine_metrics: Any
    measured_steps: np.ndarray
    predicted_steps: np.ndarray


def validate(trace: Trace, config: SchedulerConfig, scheduler_cls, model, cost_model: CalibratedCostModel, *,
             backend: str, seed: int = 0, noise_runs: int = 1, check_reference: bool = True,
             log=lambda msg: None) -> Validation:
    if bool((trace.beam_width > 1).any()):
        raise ValueError("validate compares decisions the policy alone determines; beam survival depends on the "
                         "model's scores, which the simulator draws from a seeded model: use a workload without beams")
    if config.enable_prefix_caching and bool((trace.n > 1).any()):
        log("warning: parallel samples under prefix caching: greedy samples of one prompt generate identical "
            "blocks, which the engine's prefix cache can hit and the simulator (no model) cannot foresee; the "
            "decision logs may differ for that reason alone")
    t0 = time.perf_counter()
    log("simulating")
    sim = runs.simulate(trace, config, scheduler_cls, cost_model, seed=seed)
    requests = runs.engine_requests(trace, model.config.vocab_size)

    timed_dtype = model.dtype
    exact_dtype = reference_dtype(timed_dtype) if check_reference else timed_dtype
    log("engine in lockstep with the simulator (validation mode"
        + (f", {dtype_name(exact_dtype)} for the reference check)" if exact_dtype != timed_dtype else ")"))
    with in_dtype(model, exact_dtype):
        lock = runs.run_lockstep(model, config, scheduler_cls, requests, sim.release_steps, backend=backend)
        engine_log = lock.scheduler.decision_log.records
        difference = compare.first_difference(sim.log, engine_log)
        reference = None
        if check_reference:
            from pagesim.engine.runtime.reference import check_outputs

            log("checking the engine's outputs against the no-paging reference")
            outputs = {rid: r.outputs for rid, r in lock.records.items() if r.status == "completed"}
            sampling = lock.sampling
            reference = check_outputs(model, requests, outputs, lambda r: sampling)
    if exact_dtype != timed_dtype:  # the simulator's steps timed in the profile's dtype, not the check's
        del lock
        log(f"engine in lockstep with the simulator again, in {dtype_name(timed_dtype)} (the simulator's steps timed)")
        lock = runs.run_lockstep(model, config, scheduler_cls, requests, sim.release_steps, backend=backend)

    # the simulator's own steps (the ones its latencies are sums of), as the lockstep engine timed them
    usage = cost_model.usage_snapshot()  # (costing them again must not count extrapolations twice)
    lock_measured, lock_predicted = runs.step_times(lock, cost_model)
    cost_model.restore_usage(usage)
    del lock  # what the timed runs keep alive, the cyclic collector scans: keep little
    log("engine on the wall clock")
    wall = _timed(lambda: runs.run_wall_clock(model, config, scheduler_cls, requests, backend=backend))
    n = len(trace)
    engine_m = runs.engine_metrics(wall, n)
    measured, predicted = runs.step_times(wall, cost_model)
    steps = compare.step_time_errors(predicted, measured)
    latency = compare.latency_errors(sim.result.requests, engine_m)
    timeline = decompose.EngineTimeline(wall.steps, engine_m)
    wall_same = compare.first_difference(sim.log, wall.scheduler.decision_log.records) is None
    report: dict[str, Any] = {
        "requests": n,
        "decision_logs_identical": difference is None,
        "decision_log_steps": {"simulator": len(sim.log), "engine": len(engine_log)},
        "first_difference": difference,
        "outputs_match_reference": None if reference is None else reference.match,
        "reference_dtype": dtype_name(exact_dtype) if check_reference else None,
        "reference": None if reference is None else reference.to_dict(limit=5),
        "step_time_mape": steps["mape"],
        "step_time": steps,
        "simulator_step_time": compare.step_time_errors(lock_predicted, lock_measured),
        **latency,
        "throughput": compare.throughput_errors(sim.result.requests, engine_m),
        "error_parts": decompose.decompose(sim.result.requests, engine_m, timeline, predicted),
        "wall_clock_decisions_identical": wall_same,
        "step_time_error_over_lifetimes": decompose.step_error_over_lifetimes(timeline, predicted),
        "engine_steps": len(wall.steps),
        "simulator_steps": int(sim.result.summary["steps"]),
        "completed": {"engine": int((engine_m.status == COMPLETED).sum()), "simulator": int(sim.result.summary["requests_completed"])},
        "preemptions": {"engine": dict(wall.stats.preemptions), "simulator": sim.result.summary["preemptions"]},
        "cost_model": cost_model.describe(),
    }
    report["noise"] = _noise(model, config, scheduler_cls, requests, backend, wall, engine_m, measured, noise_runs,
                             log) if noise_runs else None
    report["targets"] = targets(report)
    report["wall_s"] = round(time.perf_counter() - t0, 3)
    report["threads"] = torch.get_num_threads()
    return Validation(report, sim, engine_m, measured, predicted)


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the reference check runs in: float32 for a 16-bit model (as ``pagesim run
    --check-reference`` does on CUDA): batched paged attention and the one-sequence reference sum
    in other orders, and in 16 bits a greedy token can flip on random weights' near ties; the
    decisions do not depend on the dtype, and the timed runs keep the profile's."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


@contextmanager
def in_dtype(model, dtype: torch.dtype):
    """``model`` in ``dtype`` inside the block, back in its own after (16-bit weights widen and
    narrow back exactly)."""
    own = model.dtype
    if dtype == own:
        yield model
        return
    model.to(dtype)
    try:
        yield model
    finally:
        model.to(own)


def _timed(run):
    """A wall-clock run with every object alive before it frozen out of the cyclic collector's
    scans (vLLM's engine freezes after start-up too): otherwise a run slows as earlier runs'
    objects accumulate, and two runs of one engine differ by what ran before them."""
    gc.collect()
    gc.freeze()
    try:
        return run()
    finally:
        gc.unfreeze()


def _noise(model, config, scheduler_cls, requests, backend, wall, engine_m, measured, noise_runs, log) -> dict:
    """How far the engine is from itself: per step (a replay of the wall-clock run, the same steps
    one by one) and per request (the wall-clock run again, ``noise_runs`` times)."""
    n = len(requests)
    log("engine replaying its wall-clock run step for step (per-step noise)")
    release = {rid: r.release_step for rid, r in wall.records.items()}
    replay = _timed(lambda: runs.run_lockstep(model, config, scheduler_cls, requests, release, backend=backend,
                                              validate=False))
    same = compare.first_difference(wall.scheduler.decision_log.records, replay.scheduler.decision_log.records) is None
    replayed = np.array([step.duration_s for step in replay.steps])
    del replay
    steps = compare.step_time_errors(replayed, measured) if same else {"mape": None}
    repeats = []
    for k in range(noise_runs):
        log(f"engine on the wall clock again (noise run {k + 1} of {noise_runs})")
        again = _timed(lambda: runs.run_wall_clock(model, config, scheduler_cls, requests, backend=backend))
        again_m = runs.engine_metrics(again, n)
        mean_step = float(np.mean([step.duration_s for step in again.steps]))
        del again
        lat = compare.latency_errors(again_m, engine_m)
        repeats.append({
            "step_time_mean_error": compare.relative_error(mean_step, float(measured.mean())),
            **{name: {key: lat[name][key] for key in ("mape", "mean_error", "p50_error", "p99_error", "ks")}
               for name in ("ttft", "tpot", "e2e")},
            "throughput": {key: v for key, v in compare.throughput_errors(again_m, engine_m).items() if key.endswith("error")},
        })
    return {"step_time_mape": steps["mape"], "step_time_total_error": steps.get("total_error"),
            "replay_decisions_identical": same, **repeats[0], "repeats": repeats}


def targets(report: dict) -> dict[str, dict]:
    out = {}
    for name, (path, limit) in TARGETS.items():
        value: Any = report
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        out[name] = {"value": value, "limit": limit, "met": None if value is None else abs(value) <= limit}
    return out
