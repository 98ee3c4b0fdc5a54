"""What a disaggregated run measured.

The summary's request figures (throughput, goodput, TTFT, TPOT, ITL, E2E, SLO attainment) are
the client's: each request's times on its decode replica, from its arrival at the proxy. The
step figures, prefix hits and preemptions at the top level are the decode pool's. Beside them,
``disaggregated`` holds:

- ``prefill_replicas``, ``decode_replicas``, their ``tp``, ``gpus`` (all of them), and per GPU
  ``goodput_rps_per_gpu`` and ``throughput_tokens_s_per_gpu``: what a P:D split is judged by
  against colocated serving at the same GPU count;
- ``ttft_split_s``: each completed request's time to first token cut at the instants it passed:
  ``prefill_queue`` (arrival to its first prefill step), ``prefill`` (to the proxy having the
  prefill's response: its steps and the serving path), ``decode_queue`` (to the decode step
  that allocated its blocks and started the read), ``transfer`` (the read, queueing for ports
  included) and ``decode_first_token`` (to its first token: the promotion and the step that
  recomputes the last prompt token). The parts add up to the TTFT (mean, p50, p90, p99 each);
- ``transfers``: the network's figures (``pagesim.sim.disagg.network``);
- ``pools``: per pool, the time its replicas spent computing over the run's span
  (``busy_fraction``), its mean KV-cache occupancy while computing, preemptions, prefix hit
  rate, steps, and its full cluster summary for a closer look (``pagesim.sim.cluster_metrics``).
"""

from __future__ import annotations

from pagesim.sim.bench_metrics import latency_stats
from pagesim.sim.cluster_metrics import cluster_summary
from pagesim.sim.metrics import COMPLETED

SPLIT_PERCENTILES = (50, 90, 99)


def _pool_figures(summary: dict, replicas: int, tp: int, span_s: float) -> dict:
    busy = summary.get("busy_s") or 0.0
    return {
        "replicas": replicas, "tp": tp, "gpus": replicas * tp,
        "busy_fraction": round(busy / (span_s * replicas), 6) if span_s > 0 else None,
        "memory_allocated_fraction": summary.get("memory_allocated_fraction"),
        "memory_used_fraction": summary.get("memory_used_fraction"),
        "avg_batched_requests": summary.get("avg_batched_requests"),
        "preemptions": summary.get("preemptions"),
        "prefix_hit_rate": summary.get("prefix_hit_rate"),
        "steps": summary.get("steps"),
    }


def disagg_summary(cluster, result) -> dict:
    opts = cluster.options
    common = dict(slo=opts.slo, percentiles=opts.percentiles)
    decode = cluster_summary(result.requests, result.decode, result.decode_of, router_name=cluster.decode_router.name,
                             tp=cluster.decode_pool.tp, block_bytes=cluster.decode_pool.block_bytes, **common)
    prefill = cluster_summary(result.prefill_requests, result.prefill, result.prefill_of,
                              router_name=cluster.prefill_router.name, tp=cluster.prefill_pool.tp,
                              block_bytes=cluster.prefill_pool.block_bytes, **common)
    m, pm = result.requests, result.prefill_requests
    done = m.status == COMPLETED
    arrival = m.arrival_s[done]
    cuts = [arrival, pm.first_scheduled_s[done], result.handover_s[done], result.read_start_s[done],
            result.read_end_s[done], m.first_token_s[done]]
    names = ("prefill_queue", "prefill", "decode_queue", "transfer", "decode_first_token")
    split = {name: latency_stats(b - a, SPLIT_PERCENTILES) for name, a, b in zip(names, cuts, cuts[1:])}
    span = decode["duration_s"] or 0.0
    p_pool, d_pool = cluster.prefill_pool, cluster.decode_pool
    gpus = len(result.prefill) * p_pool.tp + len(result.decode) * d_pool.tp

    def per_gpu(value):
        return None if value is None else round(value / gpus, 6)

    held = sum(s.scheduler.pd.num_sent_blocks for s in result.prefill)
    summary = dict(decode)
    summary.pop("replicas", None)
    summary.pop("router", None)
    summary["disaggregated"] = {
        "prefill_replicas": len(result.prefill), "decode_replicas": len(result.decode),
        "prefill_tp": p_pool.tp, "decode_tp": d_pool.tp, "gpus": gpus,
        "prefill_router": cluster.prefill_router.name, "decode_router": cluster.decode_router.name,
        "goodput_rps_per_gpu": per_gpu(decode.get("goodput_rps")),
        "throughput_rps_per_gpu": per_gpu(decode.get("throughput_rps")),
        "throughput_tokens_s_per_gpu": per_gpu(decode.get("throughput_tokens_s")),
        "ttft_split_s": split,
        "transfers": {**result.network.summary(span), "blocks_sent": held,
                      "blocks_received": sum(s.scheduler.pd.num_received_blocks for s in result.decode),
                      "tokens_received": sum(s.scheduler.pd.num_received_tokens for s in result.decode)},
        "pools": {
            "prefill": {**_pool_figures(prefill, len(result.prefill), p_pool.tp, span),
                        "requests_rejected": prefill.get("requests_rejected")},
            "decode": _pool_figures(decode, len(result.decode), d_pool.tp, span),
        },
        "pool_summaries": {"prefill": prefill, "decode": decode},
    }
    return summary
