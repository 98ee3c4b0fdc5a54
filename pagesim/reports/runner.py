"""One run of a study: a ``RunConfig`` in, one JSON-able record out (never an exception).

The record holds the run's summary (``pagesim.sim.metrics.summarize``; with ``replicas`` > 1 the cluster's,
``pagesim.sim.cluster_metrics``, behind the run's ``router``), what its preemptions cost (``preemption``:
tokens recomputed, bytes swapped) and the few series the report draws, kept small whatever the
trace length: 101 quantiles of TTFT, TPOT and end-to-end latency, and, at no more than
``MEMORY_POINTS`` evenly spaced steps, KV-cache occupancy and the activity (waiting queue, running
requests, batch, swap pool). A run that raises is a record too, with ``status = "error"`` and the
error, so a study goes on past it.

The run's ``seed`` seeds the simulator and is added to the source's seed for the workload, so a
study listing seeds repeats each setting on independently drawn requests (seed 0: the source's).

Every summary has the run's GPUs and its goodput and throughput per GPU (``gpus``,
``goodput_rps_per_gpu``, ``throughput_tokens_s_per_gpu``), goodput counted against the run's
``slo_ttft_s`` / ``slo_tpot_s`` (absent: the simulator's defaults). A run with ``pd_split``
(``pagesim.reports.pd``) takes its replicas from its GPU budget: ``"colocated"`` is the cluster
below with ``gpus / tp`` replicas, ``"P:D"`` the disaggregated deployment
(``pagesim.reports.pd_run``, whose record adds the TTFT split and the KV transfers).

Contiguous baselines (``allocator`` max / pow2 / oracle) have no blocks to cache, evict or preempt:
the paged-only settings of the run's config are not passed to them (KV offloading included).
"""

from __future__ import annotations

import argparse
import functools
import time
import traceback
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from pagesim.reports import pd
from pagesim.reports.run_config import RunConfig, moot_settings, offloading, run_id
from pagesim.sim.cost.roofline import RooflineParams
from pagesim.sim.metrics import COMPLETED

QUANTILES = np.linspace(0.0, 1.0, 101)
MEMORY_POINTS = 400
# study setting -> scheduler config field
SCHEDULER_SETTINGS = {"eviction": "eviction_policy", "preemption": "preemption_mode", "victim": "victim_policy",
                      "prefix_caching": "enable_prefix_caching", "max_num_seqs": "max_num_seqs",
                      "max_num_batched_tokens": "max_num_batched_tokens", "chunked_prefill": "enable_chunked_prefill",
                      "kv_offloading_policy": "offload_eviction_policy", "scheduling_policy": "scheduling_policy"}


def run_one(config: RunConfig) -> dict[str, Any]:
    started = time.perf_counter()
    record: dict[str, Any] = {"id": run_id(config), "config": config}
    try:
        record.update(status="ok", **_simulate(config))
    except Exception as exc:  # noqa: BLE001 - a failing run is a result the study records
        record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=6)[-4000:])
    record["wall_s"] = round(time.perf_counter() - started, 3)
    record["pagesim_version"] = _version()
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return record


@functools.lru_cache(maxsize=1)
def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("pagesim")
    except md.PackageNotFoundError:
        return "unknown"


def build_trace(config: RunConfig):
    """The run's requests: the study's source, with the run's workload, rate, rate scale and sampling."""
    from pagesim.traces.generate import generate
    from pagesim.traces.source import trace_from_args

    source, scale = config["source"], config["rate_scale"]
    rate = config["rate"] if config["rate"] is not None else source.get("rate")
    seed = source.get("seed", 0) + config["seed"]
    spec = _workload(config)
    if spec is not None:
        return generate(spec)
    args = argparse.Namespace(
        trace=source["trace"], workload=None, num_requests=source.get("num_requests"), rate=rate, seed=seed,
        arrival=source.get("arrival"), format=source.get("format"), columns=None, time_unit=None,
        burstgpt_model=None, burstgpt_log_type=None, prefix_block_tokens=None, spread_ties=False,
    )
    trace = trace_from_args(args)
    return trace if scale == 1.0 else trace.time_scaled(1.0 / scale)


def _workload(config: RunConfig):
    """The run's ``WorkloadSpec`` (its requests not drawn yet), or None for a trace."""
    from pagesim.traces.generate import workload_spec
    from pagesim.traces.generate.workload import Sampling

    source, scale = config["source"], config["rate_scale"]
    workload = config["workload"] or source.get("workload")
    rate = config["rate"] if config["rate"] is not None else source.get("rate")
    seed = source.get("seed", 0) + config["seed"]
    if workload is None:
        if config["n"] > 1 or config["beam_width"] > 1:
            raise ValueError("n / beam_width apply to a generated workload, not to a trace")
        return None
    spec = workload_spec(workload, rate_rps=None if rate is None else rate * scale,
                         num_requests=source["num_requests"], seed=seed, arrival=source.get("arrival"))
    if config["n"] > 1 or config["beam_width"] > 1:
        spec = replace(spec, sampling=Sampling(n=config["n"], beam_width=config["beam_width"]))
    return spec


def plan_run(config: RunConfig) -> None:
    """Everything building the run checks, nothing allocated (``pagesim.sim.setup.plan``, and its KV
    blocks over its replicas): raises the ``ValueError`` its run would fail with at once."""
    from pagesim.sim.cluster import MAX_REPLICAS
    from pagesim.sim.setup import check_kv_blocks, plan

    _workload(config)  # (the arrivals and sampling: a rate the arrival process needs, ...)
    split = pd.split_of(config)
    if split is not None and split.disaggregated:
        from pagesim.reports.pd_run import plan as plan_disaggregated

        plan_disaggregated(config, split)
        return
    config = pd.colocated_config(config, split)
    planned = plan(_run_spec(config))
    replicas = config["replicas"]
    if replicas > MAX_REPLICAS:  # (the spec refuses this earlier; kept beside the count it bounds)
        raise ValueError(f"replicas = {replicas} is more than the {MAX_REPLICAS} a run may build")
    check_kv_blocks(planned.config.num_gpu_blocks, planned.config.num_cpu_blocks + planned.config.num_offload_blocks,
                    replicas, source=planned.kv_cache_source)


def _run_spec(config: RunConfig):
    from pagesim.sim.setup import PAGED_ONLY, RunSpec

    overrides = {}
    for key, setting in SCHEDULER_SETTINGS.items():
        if key in moot_settings(config):
            continue
        if config.get(key) is not None and (config["allocator"] == "paged" or setting not in PAGED_ONLY):
            overrides[setting] = config[key]
    spec = RunSpec(model=config["model"], gpu=config["gpu"], tp=config["tp"], ep=config.get("ep") or 1,
                   weight_dtype=config.get("dtype") or "auto", kv_cache_dtype=config.get("kv_cache_dtype") or "auto",
                   policy=config["policy"],
                   allocator=config["allocator"], placement=config["placement"], block_size=config["block_size"],
                   num_gpu_blocks=config["num_gpu_blocks"], kv_cache_gb=config["kv_cache_gb"],
                   swap_space_gb=config["swap_space_gb"], max_model_len=config["max_model_len"],
                   kv_offloading_gb=config.get("kv_offloading_size") if offloading(config) else None,
                   overrides=overrides, plugins=_plugins(config),
                   scheduler=(config.get("scheduler") if config["allocator"] == "paged" else None) or "default")
    spec = replace(spec, cost_params=_cost_params(config))
    overhead_s = _engine_overhead_s(config["engine_overhead_ms"], spec)
    if overhead_s:
        cpu_step_s = spec.cost_params.get("cpu_step_s", RooflineParams().cpu_step_s)
        spec = replace(spec, cost_params={**spec.cost_params, "cpu_step_s": cpu_step_s + overhead_s})
    return spec


def _serving_path(config: RunConfig):
    """The run's serving path (``pagesim.sim.serving_path``; None: the plain one)."""
    from pagesim.sim.serving_path import chosen_path

    profile = config.get("profile")  # a fitted profile's frontend terms (spec._profile)
    return chosen_path(config.get("serving_path"), config["policy"], config.get("async_scheduling"),
                       profile["frontend_ms"] if profile else None)


def _cost_params(config: RunConfig) -> dict[str, float]:
    """The roofline's overrides: the serving path's, then the attention kernel's (the paper's own
    kernel when the run reproduces the 2023 engine, ``engine_overhead_ms = "kwon2023"``), then a
    fitted profile's."""
    from pagesim.sim.serving_path import roofline_overrides

    kernel = config.get("attention_kernel") or ("paged-2023" if config["engine_overhead_ms"] == "kwon2023" else "flash")
    profile = config.get("profile")  # a fitted profile's parameters (spec._profile)
    return {**roofline_overrides(_serving_path(config), kernel), **(profile["roofline"] if profile else {})}


def _plugins(config: RunConfig) -> tuple[str, ...]:
    """The run's plug-in specs, loaded here (a worker process has not seen them), and refused if
    a file changed since the study was planned (its runs would not be the ones their ids name)."""
    from pagesim.engine.policy.plugins.user import load_plugins, source_digest

    specs = tuple(config.get("plugins", ()))
    if specs and source_digest(load_plugins(specs)) != config["plugins_digest"]:
        raise ValueError("a plug-in file changed since the study was planned; run the study again (new run ids)")
    return specs


def _engine_overhead_s(value: float | str, spec) -> float:
    """Extra engine seconds per step: given in ms, or derived as the paper reproduction does."""
    if value == "kwon2023":
        return _kwon2023_overhead_s()
    return float(value) / 1e3


@functools.lru_cache(maxsize=1)
def _kwon2023_overhead_s() -> float:
    """Derived from the paper's own vLLM operating point (``pagesim/sim/paper.py``), once per process."""
    from pagesim.sim.paper import PaperSetup

    return PaperSetup().overhead_s


def slo_options(config: RunConfig) -> dict[str, float]:
    """``SimOptions``' SLO arguments the run sets (absent: the simulator's defaults)."""
    return {key: config[key] for key in ("slo_ttft_s", "slo_tpot_s") if config.get(key) is not None}


def _simulate(config: RunConfig) -> dict[str, Any]:
    from pagesim.reports.pd_run import per_gpu
    from pagesim.sim.cli import replica_block_bytes
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.router import make_router
    from pagesim.sim.simulator import SimOptions

    split = pd.split_of(config)
    if split is not None and split.disaggregated:
        from pagesim.reports.pd_run import simulate

        return simulate(config, split)
    config = pd.colocated_config(config, split)
    trace = build_trace(config)
    builts = build_replicas(_run_spec(config), config["replicas"])
    built = builts[0]
    options = SimOptions(seed=config["seed"], sample_lengths=config["sample_lengths"],
                         request_timeout_s=config.get("request_timeout_s"), serving_path=_serving_path(config),
                         **slo_options(config))
    result = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router(config["router"]), options,
                     tp=config["tp"], block_bytes=replica_block_bytes(built)).run()
    result.summary.update(per_gpu(result.summary, config["replicas"] * config["tp"]))
    return {
        "summary": result.summary,
        "deployment": {"kv_cache_slots": built.scheduler.kv_usage().total_slots,
                       "num_gpu_blocks": built.scheduler.config.num_gpu_blocks,
                       "kv_cache_source": built.kv_cache_source,
                       "block_bytes": built.deployment.block_bytes_per_gpu(config["block_size"]),
                       **({"num_offload_blocks": built.scheduler.config.num_offload_blocks} if offloading(config) else {})},
        "trace": {"requests": len(trace), "rate_rps": trace.rate_rps, "source": trace.source},
        # a cluster's memory series is replica 0's (the replicas' steps do not line up in time)
        "preemption": _preemption(result, built.deployment.block_bytes_per_gpu(config["block_size"])),
        "series": {"latency_quantiles": _latency_quantiles(result.requests), "memory": _memory(result.replicas[0].steps),
                   "activity": _activity(result.replicas[0].steps)},
    }


def _preemption(result, block_bytes: int) -> dict[str, Any]:
    """Preemptions by mode and the blocks swapped (both ways), as the summary counts them over all
    replicas, in bytes; and the tokens recomputed after recompute preemptions."""
    moved = result.summary["swapped_blocks"]
    return {**result.summary["preemptions"],
            "recomputed_tokens": sum(replica.recomputed_tokens for replica in result.replicas),
            "swapped_bytes": (moved["out"] + moved["in"]) * block_bytes}


def _quantiles(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    return [round(float(v), 6) for v in np.quantile(values, QUANTILES)] if len(values) else None


def _latency_quantiles(requests) -> dict[str, list[float] | None]:
    """Over completed requests (a timed-out one may have a first token, but is a failure)."""
    done = requests.status == COMPLETED
    return {"ttft_s": _quantiles(requests.ttft_s()[done]), "tpot_s": _quantiles(requests.tpot_s()[done]),
            "e2e_s": _quantiles(requests.e2e_s()[done])}


def _sampled_steps(steps) -> np.ndarray:
    n = len(steps)
    return np.unique(np.linspace(0, n - 1, min(n, MEMORY_POINTS)).astype(np.int64)) if n else np.zeros(0, np.int64)


def _activity(steps) -> dict[str, list[float]]:
    """At the sampled steps: requests waiting, running, in the step's batch; tokens in the batch;
    blocks held in the CPU swap pool (swapped out minus swapped in so far)."""
    idx = _sampled_steps(steps)
    if not len(idx):
        return {"time_s": [], "waiting": [], "running": [], "batch_requests": [], "batch_tokens": [],
                "swap_blocks": []}
    swap = np.cumsum(steps.array("swap_out_blocks") - steps.array("swap_in_blocks"))
    return {"time_s": np.round(steps.array("start_s")[idx], 4).tolist(),
            "waiting": steps.array("num_waiting")[idx].astype(int).tolist(),
            "running": steps.array("num_running")[idx].astype(int).tolist(),
            "batch_requests": steps.array("num_requests")[idx].astype(int).tolist(),
            "batch_tokens": steps.array("num_tokens")[idx].astype(int).tolist(),
            "swap_blocks": swap[idx].astype(int).tolist()}


def _memory(steps) -> dict[str, list[float]]:
    """KV slots over time at evenly spaced steps: used, internal fragmentation, cached, free."""
    idx = _sampled_steps(steps)
    if not len(idx):
        return {"time_s": [], "used": [], "fragmentation": [], "cached": [], "free": []}
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
