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

import functools
import time
import traceback
from datetime import datetime, timezone
from typing import Any

from pagesim.reports import pd
from pagesim.reports.run_config import RunConfig, offloading, run_id
from pagesim.reports.run_parts import (_activity, _latency_quantiles, _memory, _run_spec, _serving_path, _workload,
                                       build_trace, slo_options)


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
