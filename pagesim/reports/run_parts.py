"""What a study run is built from and what its record keeps, shared by both kinds of run
(``pagesim.reports.runner`` for colocated serving, ``pagesim.reports.pd_run`` for a disaggregated
deployment): the run's trace (``build_trace``), its ``RunSpec`` and serving path, its SLO
options, and the small series the report draws (latency quantiles; KV-cache occupancy and
activity at no more than ``MEMORY_POINTS`` evenly spaced steps).
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import replace

import numpy as np

from pagesim.reports.run_config import RunConfig, moot_settings, offloading
from pagesim.sim.cost.roofline import RooflineParams
from pagesim.sim.metrics import COMPLETED

QUANTILES = np.linspace(0.0, 1.0, 101)
MEMORY_POINTS = 400
# study setting -> scheduler config field
SCHEDULER_SETTINGS = {"eviction": "eviction_policy", "preemption": "preemption_mode", "victim": "victim_policy",
                      "prefix_caching": "enable_prefix_caching", "max_num_seqs": "max_num_seqs",
                      "max_num_batched_tokens": "max_num_batched_tokens", "chunked_prefill": "enable_chunked_prefill",
                      "kv_offloading_policy": "offload_eviction_policy", "scheduling_policy": "scheduling_policy"}


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
