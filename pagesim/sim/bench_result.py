"""vLLM bench's result file (``vllm bench serve --save-result``, vLLM 0.33) written from a pagesim run.

``bench_result(PerRequest, ...)`` computes every figure from the per-request lists as vLLM's
``calculate_metrics`` does (``pagesim.sim.bench_metrics`` holds the definitions) and lays them out under
vLLM's keys, in vLLM's units (milliseconds for latencies, requests or tokens per second for
rates): ``duration``, ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``request_goodput`` (``None`` without ``--goodput``, as vLLM writes it),
``output_throughput``, ``total_token_throughput``, ``max_output_tokens_per_s``,
``max_concurrent_requests`` (vLLM's: the most requests active in one whole second since the first
send; the exact peak in flight is ``pagesim.max_concurrent_requests_exact``),
``mean_/median_/std_/p<q>_{ttft,tpot,itl,e2el}_ms`` for the
``--percentile-metrics`` asked (vLLM's default: ttft, tpot, itl) at the ``--metric-percentiles``
asked (default 99), and the per-request lists ``input_lens``, ``output_lens``, ``ttfts``, ``itls``,
``latencies``, ``start_times``, ``errors`` (vLLM writes these with ``--save-detailed``; pagesim
always does, except ``itls`` past ``MAX_DETAILED_TOKENS`` tokens unless ``--save-detailed``).
Where vLLM writes 0 for a figure with no data (``np.mean([0])``), so does this.

A request the policy rejects is a failed request, as a request the server refuses fails in vLLM
bench: it counts in ``failed``, has output length 0 and its reason in ``errors``. pagesim's own
figures go under one key, ``pagesim`` (the run's summary, settings, tokenizer, rejections).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from pagesim.engine.files import InputFileError, loads_json, read_small_bytes
from pagesim.sim import bench_metrics
from pagesim.sim.bench_metrics import Slo, percentile_key

DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # vLLM bench's default for generative models
DEFAULT_METRIC_PERCENTILES = (99.0,)
MAX_DETAILED_TOKENS = 5_000_000  # beyond this many output tokens, itls only with --save-detailed


@dataclass
class PerRequest:
    """One entry per request submitted, in submission order (seconds)."""

    input_lens: list[int]
    output_lens: list[int]  # 0 for a failed request
    success: list[bool]
    start_times: list[float]  # when the client sent it
    ttfts: list[float]  # 0.0 for a failed request
    latencies: list[float]  # end-to-end; 0.0 for a failed request
    itls: list[list[float]] | None  # every gap between tokens; None when left out
    errors: list[str] = field(default_factory=list)  # "" for a success

    def __post_init__(self) -> None:
        n = len(self.input_lens)
        lists = {"output_lens": self.output_lens, "success": self.success, "start_times": self.start_times,
                 "ttfts": self.ttfts, "latencies": self.latencies, "errors": self.errors or [""] * n}
        if self.itls is not None:
            lists["itls"] = self.itls
        for name, values in lists.items():
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} requests")
        self.errors = lists["errors"]


def bench_result(per: PerRequest, *, duration_s: float, percentile_metrics=DEFAULT_PERCENTILE_METRICS,
                 percentiles=DEFAULT_METRIC_PERCENTILES, goodput: Slo | None = None, setup: dict | None = None,
                 pagesim: dict | None = None) -> dict:
    ok = np.asarray(per.success, dtype=bool)
    out_lens = np.asarray(per.output_lens, dtype=np.int64)[ok]
    in_lens = np.asarray(per.input_lens, dtype=np.int64)[ok]
    ttft = np.asarray(per.ttfts, dtype=float)[ok]
    e2el = np.asarray(per.latencies, dtype=float)[ok]
    start = np.asarray(per.start_times, dtype=float)[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_all = np.where(out_lens > 1, (e2el - ttft) / np.maximum(out_lens - 1, 1), 0.0)
    tpot = tpot_all[out_lens > 1]
    itls = [] if per.itls is None else [gap for k, gaps in enumerate(per.itls) if per.success[k] for gap in gaps]
    completed = int(ok.sum())
    total_in, total_out = int(in_lens.sum()), int(out_lens.sum())

    def rate(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    good = int(goodput.meets(ttft, np.where(out_lens > 1, tpot_all, np.nan), e2el).sum()) if goodput else 0
    result = dict(setup or {})
    result.update({
        "duration": duration_s,
        "completed": completed,
        "failed": len(per.success) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": rate(completed),
        "request_goodput": rate(good) if goodput else None,
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
        "input_lens": [int(x) for x in per.input_lens],
        "output_lens": [int(x) for x in per.output_lens],
        "ttfts": [float(x) for x in per.ttfts],
        "latencies": [float(x) for x in per.latencies],
        "start_times": [float(x) for x in per.start_times],
        "errors": list(per.errors),
    })
    if per.itls is not None:
        result["itls"] = per.itls
    token_times, token_counts = _token_events(per, ok)
    end = float((start + e2el).max()) if completed else 0.0
    result["max_output_tokens_per_s"] = (bench_metrics.max_tokens_per_second(token_times, token_counts,
                                                                              float(start.min()), end)
                                         if completed and per.itls is not None else None)
    # vLLM 0.33's measure under its name: requests active in each whole second, the most of any second
    result["max_concurrent_requests"] = bench_metrics.concurrent_per_second_bucket(start, start + e2el)
    values = {"ttft": ttft, "tpot": tpot, "itl": np.asarray(itls, dtype=float), "e2el": e2el}
    for metric in percentile_metrics:
        v = values[metric]
        if metric == "itl" and per.itls is None:
            continue
        v = v if v.size else np.zeros(1)  # vLLM: np.mean(x or 0)
        result[f"mean_{metric}_ms"] = float(np.mean(v)) * 1000
        result[f"median_{metric}_ms"] = float(np.median(v)) * 1000
        result[f"std_{metric}_ms"] = float(np.std(v)) * 1000
        for p in percentiles:
            result[f"{percentile_key(p)}_{metric}_ms"] = float(np.percentile(v, p)) * 1000
    if pagesim is not None:  # the exact peak of requests in flight at once, beside vLLM's per-second count
        # (the run's own count where it has one: start + e2el can miss a finish by an ulp, and a
        # closed loop's next send is at that very instant)
        exact = pagesim.get("summary", {}).get("max_concurrent_requests")
        if exact is None:
            exact = bench_metrics.peak_in_flight(start, start + e2el)
        result["pagesim"] = {**pagesim, "max_concurrent_requests_exact": exact}
    return result


def _token_events(per: PerRequest, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each successful request's token times (send + TTFT, then each gap), as vLLM reconstructs them."""
    if per.itls is None:
        return np.empty(0), np.empty(0, np.int64)
    times = []
    for k in np.flatnonzero(ok):
        first = per.start_times[k] + per.ttfts[k]
        times.append(first + np.concatenate(([0.0], np.cumsum(per.itls[k]))))
    flat = np.concatenate(times) if times else np.empty(0)
    return flat, np.ones(len(flat), np.int64)


def setup_keys(*, model_id: str, tokenizer_id: str, num_prompts: int, request_rate: float, burstiness: float,
               max_concurrency: int | None, label: str = "pagesim") -> dict:
    """The keys vLLM bench writes before its metrics (``date`` ... ``max_concurrency``)."""
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "pagesim", "backend": "pagesim", "label": label,
        "model_id": model_id, "tokenizer_id": tokenizer_id, "num_prompts": num_prompts,
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": burstiness, "max_concurrency": max_concurrency,
    }


def result_path(*, result_dir: str | None, result_filename: str | None, date: str, request_rate: float,
                max_concurrency: int | None, model_id: str, label: str = "pagesim") -> Path:
    """Where ``--save-result`` writes: ``--result-filename`` or vLLM's
    ``LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json``, inside ``--result-dir`` when given."""
    if result_filename:
        name = result_filename
    else:
        concurrency = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
        name = f"{label}-{float(request_rate)}qps{concurrency}-{model_id.split('/')[-1]}-{date}.json"
    if result_dir:
        os.makedirs(result_dir, exist_ok=True)
        return Path(result_dir) / name
    return Path(name)


def reserve_result_file(bench) -> None:
    """``--save-result``'s file checked before the run (``pagesim.engine.outputs``): with
    ``--result-filename`` the file itself (held for ``write_result``: a FIFO stays open for its
    reader); otherwise, its name holding the date the run ends, the ``--result-dir`` it goes in."""
    from pagesim.engine.outputs import require_writable_folder, reserve

    if not bench.save_result:
        return
    if bench.result_filename:
        reserve(Path(bench.result_dir or ".") / bench.result_filename, "--result-filename")
    elif bench.result_dir:
        if os.path.exists(bench.result_dir) and not os.path.isdir(bench.result_dir):
            raise ValueError(f"--result-dir {bench.result_dir}: exists and is not a folder")
        require_writable_folder(bench.result_dir, f"--result-dir {bench.result_dir}")


def write_result(path: Path, result: dict) -> None:
    """Write atomically (a kill leaves the old file or the new one, never half of one), or
    stream to a device or FIFO; only a regular file or nothing is replaced (``pagesim.engine.outputs``)."""
    from pagesim.engine.outputs import reserved
    from pagesim.sim.output import atomic_write

    atomic_write(reserved(path, "--result-filename"), lambda f: json.dump(result, f))


MAX_RESULT_BYTES = 1 << 30  # a result with every request's texts and latencies stays far below


def load_result(path: str | os.PathLike) -> dict:
    """A vLLM bench (or pagesim) result file: one JSON object (the last line of an --append-result file)."""
    p = Path(path)
    # a regular file only (a FIFO or /dev/zero is refused by name); errors="replace": a result
    # quotes generated text, whose bytes need not be UTF-8
    data = read_small_bytes(p, limit_bytes=MAX_RESULT_BYTES, what="bench result file")
    text = data.decode("utf-8", errors="replace").strip()
    last_line = text[max(text.rfind("\n"), text.rfind("\r")) + 1:]
    for candidate in (text, last_line):
        try:  # (guarded: nested too deeply, it is refused before it is parsed)
            obj = loads_json(candidate, path=p)
        except InputFileError as exc:
            if "nested" in exc.problem:
                raise ValueError(str(exc)) from None
            continue
        if isinstance(obj, dict):
            return obj
    raise ValueError(f"{p}: not a JSON object as vllm bench serve --save-result writes")
