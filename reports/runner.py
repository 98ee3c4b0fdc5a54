"""One run of a study: a ``RunConfig`` in, one JSON-able record out (never an exception).

The record holds the run's summary (``sim.metrics.summarize``) and the few series the report
draws, kept small whatever the trace length: 101 quantiles of TTFT, TPOT and end-to-end latency,
and KV-cache occupancy over time at no more than ``MEMORY_POINTS`` steps. A run that raises is a
record too, with ``status = "error"`` and the error, so a study goes on past it.

Contiguous baselines (``allocator`` max / pow2 / oracle) have no blocks to cache, evict or preempt:
the paged-only settings of the run's config are not passed to them.
"""

from __future__ import annotations

import argparse
import time
import traceback
from datetime import datetime, timezone
from typing import Any

import numpy as np

from reports.spec import RunConfig, run_id

QUANTILES = np.linspace(0.0, 1.0, 101)
MEMORY_POINTS = 400
PAGED_ONLY = {"eviction": "eviction_policy", "preemption": "preemption_mode", "victim": "victim_policy",
              "prefix_caching": "enable_prefix_caching"}


def run_one(config: RunConfig) -> dict[str, Any]:
    started = time.perf_counter()
    record: dict[str, Any] = {"id": run_id(config), "config": config}
    try:
        record.update(status="ok", **_simulate(config))
    except Exception as exc:  # noqa: BLE001 - a failing run is a result the study records
        record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=6)[-4000:])
    record["wall_s"] = round(time.perf_counter() - started, 3)
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return record


def build_trace(source: dict, rate_scale: float, seed: int):
    from traces.source import trace_from_args

    args = argparse.Namespace(
        trace=source.get("trace"), workload=source.get("workload"), num_requests=source.get("num_requests"),
        rate=source.get("rate"), seed=source.get("seed", seed), arrival=source.get("arrival"),
        format=source.get("format"), columns=None, time_unit=None, burstgpt_model=None, burstgpt_log_type=None,
        prefix_block_tokens=None, spread_ties=False,
    )
    if args.workload is not None and args.rate is not None:
        args.rate = args.rate * rate_scale
        return trace_from_args(args)
    trace = trace_from_args(args)
    return trace if rate_scale == 1.0 else trace.time_scaled(1.0 / rate_scale)


def _run_spec(config: RunConfig):
    from sim.setup import RunSpec

    overrides = {}
    for key, setting in (("eviction", "eviction_policy"), ("preemption", "preemption_mode"),
                         ("victim", "victim_policy"), ("prefix_caching", "enable_prefix_caching"),
                         ("max_num_seqs", "max_num_seqs")):
        if config.get(key) is not None and (config["allocator"] == "paged" or key not in PAGED_ONLY):
            overrides[setting] = config[key]
    return RunSpec(model=config["model"], gpu=config["gpu"], tp=config["tp"], policy=config["policy"],
                   allocator=config["allocator"], block_size=config["block_size"],
                   num_gpu_blocks=config["num_gpu_blocks"], kv_cache_gb=config["kv_cache_gb"],
                   swap_space_gb=config["swap_space_gb"], overrides=overrides)


def _simulate(config: RunConfig) -> dict[str, Any]:
    from sim.setup import build
    from sim.simulator import SimOptions, Simulation

    trace = build_trace(config["source"], config["rate_scale"], config["seed"])
    built = build(_run_spec(config))
    result = Simulation(trace, built.scheduler, built.cost_model, SimOptions(seed=config["seed"])).run()
    return {
        "summary": result.summary,
        "deployment": {"kv_cache_slots": built.scheduler.kv_usage().total_slots,
                       "num_gpu_blocks": built.scheduler.config.num_gpu_blocks,
                       "kv_cache_source": built.kv_cache_source,
                       "block_bytes": built.deployment.block_bytes_per_gpu(config["block_size"])},
        "trace": {"requests": len(trace), "rate_rps": trace.rate_rps, "source": trace.source},
        "series": {"latency_quantiles": _latency_quantiles(result.requests), "memory": _memory(result.steps)},
    }


def _quantiles(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    return [round(float(v), 6) for v in np.quantile(values, QUANTILES)] if len(values) else None


def _latency_quantiles(requests) -> dict[str, list[float] | None]:
    return {"ttft_s": _quantiles(requests.ttft_s()), "tpot_s": _quantiles(requests.tpot_s()),
            "e2e_s": _quantiles(requests.e2e_s())}


def _memory(steps) -> dict[str, list[float]]:
    """KV slots over time at evenly spaced steps: used, internal fragmentation, cached, free."""
    n = len(steps)
    if n == 0:
        return {"time_s": [], "used": [], "fragmentation": [], "cached": [], "free": []}
    idx = np.unique(np.linspace(0, n - 1, min(n, MEMORY_POINTS)).astype(np.int64))
    col = {name: steps.array(name)[idx] for name in ("start_s", "allocated_slots", "used_slots", "cached_slots",
                                                      "total_slots")}
    total = col["total_slots"]
    return {
        "time_s": np.round(col["start_s"], 4).tolist(),
        "used": (col["used_slots"] / total).round(5).tolist(),
        "fragmentation": ((col["allocated_slots"] - col["used_slots"]) / total).round(5).tolist(),
        "cached": (col["cached_slots"] / total).round(5).tolist(),
        "free": ((total - col["allocated_slots"] - col["cached_slots"]) / total).round(5).tolist(),
    }
