"""``pagesim simulate --prefill-replicas P --decode-replicas D``: the disaggregated run's flags and output.

The rest of ``simulate``'s flags describe both pools; ``--prefill KEY=VALUE`` and ``--decode
KEY=VALUE`` set one pool's (``pagesim.sim.disagg.setup``). ``--out DIR`` writes ``summary.json``,
``run_info.json``, ``requests.csv`` (the client's view, with each row's prefill and decode
replica and its TTFT split) and one decision log per replica (``decisions-prefill-K.jsonl``,
``decisions-decode-K.jsonl``).
"""

from __future__ import annotations

import argparse
import sys
import time

#: simulate's flags that a disaggregated run does not take (yet), with why.
REFUSED = {"replicas": "--replicas (colocated replicas; give --prefill-replicas and --decode-replicas)",
           "save_result": "--save-result (vLLM bench's result file of a colocated run)"}


def add_disagg_args(parser) -> None:
    from pagesim.sim.router import ROUTERS

    g = parser.add_argument_group("disaggregated prefill/decode (vLLM's NixlConnector; pagesim/sim/disagg/)")
    g.add_argument("--prefill-replicas", type=int, metavar="P", help="prefill instances (with --decode-replicas)")
    g.add_argument("--decode-replicas", type=int, metavar="D", help="decode instances (with --prefill-replicas)")
    g.add_argument("--prefill-router", default="round-robin", choices=list(ROUTERS),
                   help="which prefill instance takes a request (default round-robin, vLLM's proxy)")
    g.add_argument("--decode-router", default="round-robin", choices=list(ROUTERS),
                   help="which decode instance takes it next (default round-robin, vLLM's proxy)")
    g.add_argument("--prefill", action="append", default=[], metavar="KEY=VALUE",
                   help="a prefill-pool setting: tp, gpu, block_size, num_gpu_blocks, kv_cache_gb, max_num_seqs, "
                        "max_num_batched_tokens, ... (repeatable)")
    g.add_argument("--decode", action="append", default=[], metavar="KEY=VALUE", help="a decode-pool setting (likewise)")
    g.add_argument("--kv-link-bandwidth", type=float, metavar="GB/S",
                   help="every KV link's bandwidth, GB/s per GPU and direction (default: NVLink within a node, "
                        "the GPU's RDMA NIC between nodes)")
    g.add_argument("--kv-link-latency-us", type=float, metavar="US", help="per-transfer latency (default 10 NVLink, 30 RDMA)")
    g.add_argument("--gpus-per-node", type=int, default=8, metavar="N", help="GPUs per node, for placement (default 8)")


def is_disaggregated(args: argparse.Namespace) -> bool:
    p, d = getattr(args, "prefill_replicas", None), getattr(args, "decode_replicas", None)
    if (p is None) != (d is None):
        raise ValueError("give --prefill-replicas and --decode-replicas together")
    if p is None:
        for flag in ("prefill", "decode"):
            if getattr(args, flag):
                raise ValueError(f"--{flag} KEY=VALUE sets a pool of a disaggregated run: give --prefill-replicas "
                                 f"and --decode-replicas")
        return False
    if args.replicas != 1:
        raise ValueError(f"{REFUSED['replicas']} does not apply to a disaggregated run")
    return True


def simulate_disagg(args: argparse.Namespace, bench, trace, out, *, run_spec, options, progress):
    """Build both pools from ``run_spec`` (simulate's settings), check them, run under ``options``
    with ``progress`` (a bar, or None); returns (result, info, wall seconds)."""
    from pagesim.engine.output_folders import create_text
    from pagesim.sim.disagg.cluster import DisaggCluster
    from pagesim.sim.disagg.network import GB, NetworkSpec
    from pagesim.sim.disagg.setup import build_pool, check_pools, parse_settings, pool_spec
    from pagesim.sim.errors import SimulationStalled
    from pagesim.sim.output import write_json
    from pagesim.sim.router import make_router

    if bench.save_result:
        raise ValueError(f"{REFUSED['save_result']} does not apply to a disaggregated run")
    network = NetworkSpec(gpus_per_node=args.gpus_per_node,
                          bandwidth_bytes_per_s=None if args.kv_link_bandwidth is None else args.kv_link_bandwidth * GB,
                          latency_s=None if args.kv_link_latency_us is None else args.kv_link_latency_us * 1e-6)
    base = run_spec
    p_spec = pool_spec(base, parse_settings(args.prefill, "--prefill"))
    d_spec = pool_spec(base, parse_settings(args.decode, "--decode"))
    prefill, p_builts = build_pool(p_spec, args.prefill_replicas, "prefill")
    decode, d_builts = build_pool(d_spec, args.decode_replicas, "decode")
    check_pools(p_builts[0], d_builts[0], trace)
    info = {"trace": f"{len(trace)} requests from {trace.source}",
            "prefill": p_builts[0].describe(), "decode": d_builts[0].describe(),
            "network": {"gpus_per_node": network.gpus_per_node, "bandwidth_bytes_per_s": network.bandwidth_bytes_per_s,
                        "latency_s": network.latency_s},
            "command": sys.argv[1:]}
    names = ([f"decisions-prefill-{k}.jsonl" for k in range(args.prefill_replicas)],
             [f"decisions-decode-{k}.jsonl" for k in range(args.decode_replicas)])
    logs = ([create_text(out / n, encoding="ascii") for n in names[0]],
            [create_text(out / n, encoding="ascii") for n in names[1]]) if out is not None else None
    try:
        cluster = DisaggCluster(trace, prefill, decode, prefill_router=make_router(args.prefill_router),
                                decode_router=make_router(args.decode_router), options=options, network=network,
                                decision_sinks=([f.write for f in logs[0]], [f.write for f in logs[1]]) if logs else None,
                                progress=progress.update if progress else None)
        started = time.perf_counter()
        try:
            result = cluster.run()
        except SimulationStalled as exc:
            raise ValueError(f"the scheduler stopped making progress: {exc}") from None
        wall_s = time.perf_counter() - started
    finally:
        if progress:
            progress.close()
        for f in (logs[0] + logs[1]) if logs else []:
            f.close()
    result.summary["cost_model"] = p_builts[0].cost_model.name
    if out is not None:
        write_json(out / "summary.json", result.summary)
        write_json(out / "run_info.json", {**info, "sim_wall_s": wall_s})
        write_requests(out / "requests.csv", result)
    return result, info, wall_s


def write_requests(path, result) -> None:
    """One row per request: the client's times, its replicas and its TTFT split."""
    import csv

    from pagesim.engine.output_folders import create_text

    m, pm = result.requests, result.prefill_requests
    with create_text(path) as f:
        w = csv.writer(f)
        w.writerow(["request_id", "arrival_s", "prompt_tokens", "output_tokens", "status", "prefill_replica",
                    "decode_replica", "prefill_start_s", "handover_s", "read_start_s", "read_end_s", "first_token_s",
                    "finish_s", "ttft_s", "e2e_s", "prefill_preemptions", "decode_preemptions"])
        for i in range(len(m.status)):
            w.writerow([f"r{i}", m.arrival_s[i], m.prompt_tokens[i], m.output_tokens[i], int(m.status[i]),
                        int(result.prefill_of[i]), int(result.decode_of[i]), pm.first_scheduled_s[i],
                        result.handover_s[i], result.read_start_s[i], result.read_end_s[i], m.first_token_s[i],
                        m.finish_s[i], m.first_token_s[i] - m.arrival_s[i], m.finish_s[i] - m.arrival_s[i],
                        int(pm.preemptions[i]), int(m.preemptions[i])])


def summary_lines(summary: dict, wall_s: float) -> str:
    """The disaggregated run's summary as a short table."""
    d = summary["disaggregated"]
    split = d["ttft_split_s"]
    t = d["transfers"]
    pools = d["pools"]

    def ms(x):
        return "-" if x is None else f"{x * 1e3:,.1f} ms"

    def frac(x):
        return "-" if x is None else f"{x:.1%}"

    lines = [
        f"disaggregated: {d['prefill_replicas']} prefill x TP{d['prefill_tp']} + {d['decode_replicas']} decode x "
        f"TP{d['decode_tp']} = {d['gpus']} GPUs (routers: {d['prefill_router']} / {d['decode_router']})",
        f"requests: {summary['requests_completed']:,} completed of {summary['requests_total']:,}"
        f" ({summary['requests_rejected']:,} rejected) in {summary['duration_s']:,.1f} s simulated, {wall_s:.1f} s wall",
        f"throughput: {summary['throughput_rps'] or 0:.2f} req/s, {summary['throughput_tokens_s'] or 0:,.0f} output tok/s; "
        f"goodput {summary['goodput_rps'] or 0:.2f} req/s = {d['goodput_rps_per_gpu'] or 0:.3f} req/s per GPU "
        f"(SLO attained {frac(summary['slo']['attained'])})",
        f"TTFT mean {ms(summary['ttft_s']['mean'])}, p99 {ms(summary['ttft_s'].get('p99'))}; "
        f"TPOT mean {ms(summary['tpot_s']['mean'])}",
        "TTFT split (mean): " + ", ".join(f"{k.replace('_', ' ')} {ms(v['mean'])}" for k, v in split.items()),
        f"KV transfers: {t['transfers']:,} ({t['bytes'] / 1e9:,.2f} GB; {t['transfers_by_link']['nvlink']:,} NVLink, "
        f"{t['transfers_by_link']['rdma']:,} RDMA; ports waited {t['port_wait_s']:.3f} s)",
    ]
    for name in ("prefill", "decode"):
        p = pools[name]
        lines.append(f"{name} pool: busy {frac(p['busy_fraction'])}, KV allocated {frac(p['memory_allocated_fraction'])} "
                     f"while computing, {p['avg_batched_requests'] or 0:.1f} requests per step, preemptions "
                     f"{sum((p['preemptions'] or {}).values()):,}, prefix hit rate {frac(p['prefix_hit_rate'])}")
    return "\n".join(lines)
