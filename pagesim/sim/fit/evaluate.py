"""The simulator in the fit's loop: a measurement simulated at a parameter point, its rows compared.

Each measurement is set up once as ``pagesim replay`` would simulate it (its model, tensor
parallelism and vLLM limits from its files, the GPU and the server flags the fit was given) and
then simulated at whatever parameter points the optimizer asks for, in ``jobs`` worker processes
(each reads the measurements once). Every run is kept, keyed by measurement, fidelity and the
exact parameter values, so no point is simulated twice: the leave-one-out folds and the held-out
measurements reuse the fit's own runs.

Two fidelities: ``full`` is the run as configured; ``fast`` is the same run without the KV
offloading tier, which the simulator can skip ahead through. The fit takes its sensitivities
from fast runs when the configuration offloads (``pagesim.sim.fit.fit``); otherwise the two are
one and the same.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from pagesim.sim.fit.measurements import Measurement, bench_measured, read_measurement
from pagesim.sim.fit.params import simulation_settings

FULL, FAST = "full", "fast"


def replay_args(measurement: Measurement, *, gpu: str, model: str | None, tp: int | None,
                server_flags: list[str], seed: int) -> argparse.Namespace:
    """The replay command line ``measurement`` is simulated under, parsed and filled from its files."""
    from pagesim.sim import replay_cli

    parser = argparse.ArgumentParser(prog="pagesim", add_help=False, exit_on_error=False)
    replay_cli.add_parser(parser.add_subparsers())
    argv = ["replay", str(measurement.path), "--gpu", gpu, "--seed", str(seed), "--no-progress", *server_flags]
    if model is not None:
        argv += ["--model", model]
    if tp is not None:
        argv += ["--tp", str(tp)]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # (argparse's usage text: the error line alone is kept)
            args = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        lines = said.getvalue().strip().splitlines()
        why = lines[-1].split("error: ", 1)[-1] if lines else str(exc)
        raise ValueError(f"--server-flags {' '.join(server_flags)!r}: not flags pagesim replay takes ({why})") from None
    if args.profile is not None:
        raise ValueError("--server-flags: --profile is what the fit makes, not a server flag")
    if model is not None and measurement.model:
        _same_model(measurement, model)
    if measurement.kind == "inference-perf":
        replay_cli.fill_from_run(args, measurement.run)
    else:
        if args.model is None:
            args.model = measurement.model
            if args.model is None:
                raise ValueError(f"{measurement.path}: the file names no model_id: give --model")
        args.tp = args.tp or 1
    return args


def _same_model(measurement: Measurement, model: str) -> None:
    """Refuse ``--model`` where the measurement names a model of other shapes (both known)."""
    from pagesim.engine.catalog.lookup import get_model_preset, resolve_model_name

    if resolve_model_name(measurement.model) is None:
        return  # (a name the catalog does not know: --model says what it is)
    try:
        theirs, ours = get_model_preset(measurement.model), get_model_preset(model)
    except (ValueError, OSError):
        return  # (an unknown --model is refused, naming it, when the run is built)
    shape = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "intermediate_size", "moe")
    if any(getattr(theirs, k) != getattr(ours, k) for k in shape):
        raise ValueError(f"{measurement.path}: measured on {measurement.model} ({theirs.name}), but --model {model} "
                         f"is {ours.name}, of other shapes: leave --model out, or give the model it ran")


def fast_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` without the KV offloading tier (the ``fast`` fidelity)."""
    fast = copy.copy(args)
    fast.kv_offloading_size = None
    fast.num_offload_blocks = None
    return fast


def offloads(args: argparse.Namespace) -> bool:
    return bool(args.kv_offloading_size or args.num_offload_blocks)


def simulate(measurement: Measurement, args: argparse.Namespace, params: dict[str, float]) -> list:
    """``measurement`` simulated under ``args`` with ``params`` (``pagesim.sim.fit.params``): its
    comparison rows (``pagesim.sim.replay.Comparison``)."""
    roofline, frontend = simulation_settings(params)
    run_args = copy.copy(args)
    run_args.cost_param = [f"{k}={v!r}" for k, v in roofline.items()] + list(args.cost_param)
    if frontend is not None and args.frontend_latency_ms is None:
        run_args.frontend_latency_ms = list(frontend)
    if measurement.kind == "inference-perf":
        from pagesim.sim.replay_cli import simulate_run

        return simulate_run(run_args, measurement.run).rows
    return _simulate_bench(measurement.run, run_args)


def _simulate_bench(bench, args: argparse.Namespace) -> list:
    from pagesim.sim.metrics import COMPLETED
    from pagesim.sim.replay import Comparison, predicted_figures
    from pagesim.sim.replay_cli import simulate_trace

    trace = bench.trace(args.seed)
    _, _, result = simulate_trace(args, trace, timeout_s=args.request_timeout, max_concurrency=bench.max_concurrency)
    rows = np.arange(len(trace))
    completed = int((result.requests.status == COMPLETED).sum())
    measured, counts = bench_measured(bench)
    return [Comparison(stage=None, rate_per_s=None if math.isinf(bench.request_rate) else bench.request_rate,
                       num_requests=len(trace), measured=measured,
                       predicted=predicted_figures(result.requests, rows, trace.output_len.astype(np.float64)),
                       measured_counts=counts, predicted_counts=(completed, len(trace) - completed))]


# ---------------------------------------------------------------- worker processes
_WORKER: dict = {}


def _setup(specs: list[tuple[str, dict]]) -> list[tuple[Measurement, argparse.Namespace]]:
    loaded = []
    for path, settings in specs:
        measurement = read_measurement(path)
        loaded.append((measurement, replay_args(measurement, **settings)))
    return loaded


def _init_worker(specs) -> None:
    _WORKER["loaded"] = _setup(specs)


def _run_job(job: tuple[int, str, tuple], loaded=None) -> list:
    index, fidelity, params = job
    measurement, args = (loaded or _WORKER["loaded"])[index]
    return simulate(measurement, fast_args(args) if fidelity == FAST else args, dict(params))


class Evaluator:
    """Simulates measurements at parameter points, ``jobs`` at a time, keeping every run."""

    def __init__(self, specs: list[tuple[str, dict]], jobs: int = 1):
        self.specs = specs
        self.loaded = _setup(specs)  # (read here too: errors surface before any worker starts)
        self.two_fidelities = any(offloads(args) for _, args in self.loaded)
        self.jobs = max(1, min(jobs, len(specs) * 2))
        self._pool = None
        self._runs: dict[tuple, list] = {}
        self.simulations = {FULL: 0, FAST: 0}

    @property
    def measurements(self) -> list[Measurement]:
        return [m for m, _ in self.loaded]

    def rows(self, points: list[tuple[int, str, dict[str, float]]]) -> list[list]:
        """The rows of each ``(measurement index, fidelity, params)``, simulating those not run yet."""
        keys = []
        for index, fidelity, params in points:
            if fidelity == FAST and not self.two_fidelities:
                fidelity = FULL
            keys.append((index, fidelity, tuple(sorted(params.items()))))
        todo = list(dict.fromkeys(k for k in keys if k not in self._runs))
        if todo:
            if self.jobs > 1 and len(todo) > 1:
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(self.jobs, initializer=_init_worker, initargs=(self.specs,))
                results = list(self._pool.map(_run_job, todo))
            else:
                results = [_run_job(k, self.loaded) for k in todo]
            for key, result in zip(todo, results):
                self._runs[key] = result
                self.simulations[key[1]] += 1
        return [self._runs[k] for k in keys]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def default_jobs() -> int:
    """The machine's usable CPUs (``pagesim.engine.threads.usable_cpus``), at most 8."""
    from pagesim.engine.threads import usable_cpus

    return min(usable_cpus(), 8)
