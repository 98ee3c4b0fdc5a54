"""One P:D-split run of a study: its two pools built and checked, the disaggregated cluster run, its record.

A run with ``pd_split = "P:D"`` (``pagesim.reports.pd``) becomes ``pagesim.sim.disagg``'s
deployment, as ``pagesim simulate --prefill-replicas P --decode-replicas D`` builds it: each pool
from the run's own ``RunSpec`` (``pagesim.reports.runner``) with the pool's settings laid over
(``pd.pool_config``) and vLLM's NixlConnector (``pagesim.sim.disagg.setup.pool_spec``), behind
``prefill_router`` and ``decode_router``, the KV over ``NetworkSpec`` from the link settings.

Its record has what a colocated run's has (``runner._simulate``), read from the decode pool where
it is per replica (the client's request times are the decode replicas'; the memory and
activity series are decode replica 0's), and the summary's ``disaggregated`` block
(``pagesim.sim.disagg.metrics``: the TTFT split, transfer bytes, per-pool figures), without the
two pools' full cluster summaries (``pool_summaries``: a replica table each, which no page reads).
"""

from __future__ import annotations

from typing import Any

from pagesim.reports import pd
from pagesim.reports.run_config import RunConfig


def pool_specs(config: RunConfig) -> dict[str, Any]:
    """Each pool's ``RunSpec`` (name -> spec), with the P/D connector."""
    from pagesim.reports.run_parts import _run_spec
    from pagesim.sim.disagg.setup import pool_spec

    return {pool: pool_spec(_run_spec(pd.pool_config(config, pool, 1)), {}) for pool in pd.POOLS}


def plan(config: RunConfig, split: pd.Split) -> None:
    """What building the run checks, nothing allocated: each pool planned (its KV blocks over its
    replicas), the replicas placed on nodes."""
    from pagesim.sim.disagg.network import NetworkSpec, place
    from pagesim.sim.setup import check_kv_blocks
    from pagesim.sim.setup import plan as plan_spec

    counts = {"prefill": split.prefill, "decode": split.decode}
    for pool, spec in pool_specs(config).items():
        try:
            planned = plan_spec(spec)
            check_kv_blocks(planned.config.num_gpu_blocks, planned.config.num_cpu_blocks, counts[pool],
                            source=planned.kv_cache_source)
        except ValueError as exc:
            raise ValueError(f"the {pool} pool: {exc}") from None
    network = NetworkSpec(**pd.network_kwargs(config))
    place([pd.pool_tp(config, "prefill")] * split.prefill + [pd.pool_tp(config, "decode")] * split.decode,
          network.gpus_per_node)


def simulate(config: RunConfig, split: pd.Split) -> dict[str, Any]:
    """Run it; the record's fields (``runner.run_one`` adds the id, status and timing)."""
    from pagesim.reports.run_parts import (_activity, _latency_quantiles, _memory, _serving_path, build_trace,
                                           slo_options)
    from pagesim.sim.disagg.cluster import DisaggCluster
    from pagesim.sim.disagg.network import NetworkSpec
    from pagesim.sim.disagg.setup import build_pool, check_pools
    from pagesim.sim.router import make_router
    from pagesim.sim.simulator import SimOptions

    trace = build_trace(config)
    specs = pool_specs(config)
    prefill, p_builts = build_pool(specs["prefill"], split.prefill, "prefill")
    decode, d_builts = build_pool(specs["decode"], split.decode, "decode")
    check_pools(p_builts[0], d_builts[0], trace)
    options = SimOptions(seed=config["seed"], sample_lengths=config["sample_lengths"],
                         serving_path=_serving_path(config), **slo_options(config))
    result = DisaggCluster(trace, prefill, decode,
                           prefill_router=make_router(config.get("prefill_router") or "round-robin"),
                           decode_router=make_router(config.get("decode_router") or "round-robin"),
                           options=options, network=NetworkSpec(**pd.network_kwargs(config))).run()
    summary = result.summary
    summary["disaggregated"].pop("pool_summaries", None)
    summary.update(per_gpu(summary, summary["disaggregated"]["gpus"]))
    built = d_builts[0]
    block_bytes = built.deployment.block_bytes_per_gpu(built.scheduler.config.block_size)
    moved = summary["swapped_blocks"]
    return {
        "summary": summary,
        "deployment": {"kv_cache_slots": built.scheduler.kv_usage().total_slots,
                       "num_gpu_blocks": built.scheduler.config.num_gpu_blocks,
                       "kv_cache_source": built.kv_cache_source, "block_bytes": block_bytes,
                       "gpus": summary["disaggregated"]["gpus"],
                       "prefill": {"replicas": split.prefill, "tp": prefill.tp,
                                   "num_gpu_blocks": p_builts[0].scheduler.config.num_gpu_blocks},
                       "decode": {"replicas": split.decode, "tp": decode.tp,
                                  "num_gpu_blocks": built.scheduler.config.num_gpu_blocks}},
        "trace": {"requests": len(trace), "rate_rps": trace.rate_rps, "source": trace.source},
        # preemptions as the decode pool's summary counts them; tokens recomputed on both pools
        "preemption": {**summary["preemptions"],
                       "recomputed_tokens": sum(r.recomputed_tokens for r in (*result.prefill, *result.decode)),
                       "swapped_bytes": (moved["out"] + moved["in"]) * block_bytes},
        "series": {"latency_quantiles": _latency_quantiles(result.requests),
                   "memory": _memory(result.decode[0].steps), "activity": _activity(result.decode[0].steps)},
    }


def per_gpu(summary: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The figures a split is judged by against colocated serving at the same GPU count: the
    run's goodput and throughput over the GPUs it used (top-level summary keys, for both kinds)."""
    def over(key: str) -> float | None:
        value = summary.get(key)
        return None if value is None else round(value / gpus, 6)

    return {"gpus": gpus, "goodput_rps_per_gpu": over("goodput_rps"),
            "throughput_tokens_s_per_gpu": over("throughput_tokens_s")}
