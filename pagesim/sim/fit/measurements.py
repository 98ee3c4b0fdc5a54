"""Measurements a user already has, read for a fit: inference-perf folders and vLLM bench result files.

A ``Measurement`` is one measured run: what it sent (rebuilt as a ``Trace``), what it measured (as
``pagesim.sim.replay`` compares it) and what it ran on, with a digest of the files read so a
profile can say exactly what it was fitted on.

- **inference-perf**: a results folder or the experiment folder above it, read as ``pagesim
  replay`` reads it (``pagesim.traces.inference_perf``): one comparison row per load stage.
- **vLLM bench result file** (``vllm bench serve --save-result --save-detailed``, or ``pagesim
  simulate`` / ``pagesim run --save-result``): one row, the whole run. The workload is rebuilt
  from the per-request lists: ``input_lens``, and ``output_lens`` for the requests that succeeded
  (a failed request's output length is not recorded: it gets the mean of the successes'); the
  send times are the file's ``start_times`` when it has them and no ``max_concurrency`` (which
  a closed-loop client then enforces on sends drawn from ``request_rate`` and ``burstiness`` with
  ``--seed``, as vLLM draws them). A file without the per-request lists cannot be rebuilt, and
  is refused saying so.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: vLLM bench's per-request lists a fit needs (``--save-detailed``).
BENCH_LISTS = ("input_lens", "output_lens", "ttfts", "latencies")


class MeasurementError(ValueError):
    """A measurement that cannot be fitted to, said in one line naming the file."""


@dataclass
class BenchRun:
    """A vLLM bench result file's run: its requests and what it measured."""

    path: Path
    model_id: str | None
    input_lens: np.ndarray  # int64
    output_lens: np.ndarray  # int64, the rebuilt workload's (a failure's: the successes' mean)
    success: np.ndarray  # bool
    ttfts: np.ndarray  # seconds (a failure's: 0)
    latencies: np.ndarray
    start_times: np.ndarray | None  # seconds since the first send
    request_rate: float  # inf: all at once
    burstiness: float
    max_concurrency: int | None
    vllm_version: str | None

    def trace(self, seed: int):
        """The requests the run sent (``Trace``)."""
        from pagesim.traces.generate.arrivals import Gamma, Poisson
        from pagesim.traces.trace import Trace

        n = len(self.input_lens)
        if self.start_times is not None and self.max_concurrency is None:
            arrival_s, how = self.start_times, "the file's send times"
        elif math.isinf(self.request_rate):
            arrival_s, how = np.zeros(n), "all at once"
        else:
            process = (Poisson(self.request_rate) if self.burstiness == 1.0
                       else Gamma(self.request_rate, cv=1.0 / math.sqrt(self.burstiness)))
            times = process.times(n, np.random.default_rng(seed))
            arrival_s, how = times - times[0], process.describe()
        order = np.argsort(arrival_s, kind="stable")
        return Trace(arrival_s=np.asarray(arrival_s)[order], prompt_len=self.input_lens[order],
                     output_len=self.output_lens[order], source=f"vllm-bench:{self.path} ({how})",
                     metadata={"order": order})


@dataclass
class Measurement:
    """One measured run a fit compares the simulator with."""

    path: Path
    kind: str  # "inference-perf" or "vllm-bench"
    digest: str  # sha256 over the files read
    model: str | None  # as the files name it (None: not stated)
    tp: int | None
    vllm_version: str | None
    run: object = field(repr=False)  # InferencePerfRun or BenchRun

    @property
    def name(self) -> str:
        path = self.path
        if path.name == "results" and path.parent.name:
            path = path.parent
        return path.stem if self.kind == "vllm-bench" else path.name

    def describe(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "sha256": self.digest, "model": self.model,
                "tp": self.tp, "vllm_version": self.vllm_version}


def read_measurement(path: str) -> Measurement:
    """The measurement at ``path``: a vLLM bench result file, or an inference-perf folder."""
    p = Path(path)
    if not p.exists():
        raise MeasurementError(f"{p}: no such file or folder (a vLLM bench result file or an inference-perf folder)")
    if p.is_dir():
        return _inference_perf(p)
    return _bench(p)


def _inference_perf(path: Path) -> Measurement:
    from pagesim.traces.inference_perf import read_inference_perf

    run = read_inference_perf(path)
    files = [run.config_file, *sorted(run.results_dir.glob("*_lifecycle_metrics.json"))]
    exp_config = run.results_dir.parent / "exp-config.yaml"
    if exp_config.is_file():
        files.append(exp_config)
    if not run.measured_stages:
        raise MeasurementError(f"{path}: no stage_*_lifecycle_metrics.json: nothing measured to fit to")
    return Measurement(path=run.results_dir, kind="inference-perf", digest=_digest(files),
                       model=run.server.model or run.model_name, tp=run.server.tensor_parallelism,
                       vllm_version=None, run=run)


def _bench(path: Path) -> Measurement:
    from pagesim.sim.bench_check import result_problem
    from pagesim.sim.bench_result import load_result

    result = load_result(path)
    problem = result_problem(result)
    if problem is not None:
        raise MeasurementError(f"{path}: {problem}")
    missing = [key for key in BENCH_LISTS if not isinstance(result.get(key), list)]
    if missing:
        raise MeasurementError(f"{path}: no per-request {', '.join(missing)}: a fit rebuilds the workload and its "
                               f"latencies from them (vllm bench serve --save-result --save-detailed)")
    n = len(result["input_lens"])
    if n == 0:
        raise MeasurementError(f"{path}: the per-request lists are empty")
    errors = result.get("errors")
    success = (np.array([not e for e in errors]) if isinstance(errors, list)
               else np.array(result["output_lens"]) > 0)
    if not success.any():
        raise MeasurementError(f"{path}: every request failed: nothing measured to fit to, and no output length "
                               f"to rebuild the workload from")
    output = np.asarray(result["output_lens"], dtype=np.int64)
    output = np.where(success, output, max(1, round(float(output[success].mean()))))
    if (output[success] < 1).any():
        raise MeasurementError(f"{path}: output_lens: a successful request with no output token")
    rate = result.get("request_rate")
    starts = result.get("start_times")
    if rate is None and not (isinstance(starts, list) and len(starts) == n):
        raise MeasurementError(f"{path}: no request_rate and no start_times: when its requests were sent cannot be "
                               f"rebuilt")
    rate = math.inf if rate in (None, "inf", "Infinity") else rate
    if not isinstance(rate, (int, float)) or not rate > 0:
        raise MeasurementError(f"{path}: request_rate: must be a number > 0 or inf, found {rate!r}")
    burstiness = result.get("burstiness") or 1.0
    if not isinstance(burstiness, (int, float)) or not burstiness > 0:
        raise MeasurementError(f"{path}: burstiness: must be a number > 0, found {burstiness!r}")
    concurrency = result.get("max_concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise MeasurementError(f"{path}: max_concurrency: must be a whole number >= 1 or null, found {concurrency!r}")
    if isinstance(starts, list) and len(starts) == n:
        starts = np.asarray(starts, dtype=np.float64)
        starts = starts - starts.min()
    else:
        starts = None
    version = result.get("vllm_version") or (result.get("pagesim") or {}).get("vllm_version")
    run = BenchRun(path=path, model_id=result.get("model_id"), input_lens=np.asarray(result["input_lens"], np.int64),
                   output_lens=output, success=success, ttfts=np.asarray(result["ttfts"], np.float64),
                   latencies=np.asarray(result["latencies"], np.float64), start_times=starts, request_rate=float(rate),
                   burstiness=float(burstiness), max_concurrency=concurrency,
                   vllm_version=version if isinstance(version, str) else None)
    if (run.input_lens < 1).any():
        raise MeasurementError(f"{path}: input_lens: every request needs a prompt of at least one token")
    return Measurement(path=path, kind="vllm-bench", digest=_digest([path]), model=run.model_id, tp=None,
                       vllm_version=run.vllm_version, run=run)


def bench_measured(run: BenchRun) -> tuple[dict, tuple[int, int]]:
    """A bench run's E2E, TTFT (mean, p90, p99) and per token, and its (successes, failures)."""
    from pagesim.sim.replay import latency_figures

    ok = run.success
    figures = latency_figures(run.latencies[ok], run.ttfts[ok], float(run.output_lens[ok].mean()))
    return figures, (int(ok.sum()), int((~ok).sum()))


def _digest(files) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).name.encode())
        h.update(b"\0")
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
