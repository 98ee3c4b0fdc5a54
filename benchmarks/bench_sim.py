"""Speed and memory of the simulator at scale, each figure beside a baseline measured in the same run.

Cases (Llama 3 8B on H200, the ``pagesim`` policy; each run in its own process, on one core, so
one case's garbage does not count against the next and peak memory is that run's own):

1. ``azure``: the shared Azure conversation trace (``../shared/traces/azure_llm_2023/``, 19,366
   requests over an hour; a synthetic stand-in of the same size and mean lengths when the folder
   is absent), one replica. Baseline: the same run with skip-ahead off (``--no-skip-ahead``), which
   must give the identical summary (checked and printed).
2. ``scaling``: a ShareGPT-like trace (``kwon2023-sharegpt``: the PagedAttention paper's lengths,
   161 in / 338 out on average) at 20 requests/s on one replica, at 10k, 100k and 1M requests
   (``--sizes``): wall time per request and peak memory, each as a ratio to the smallest size
   (time per request should stay flat, i.e. wall time linear; memory should stay flat apart
   from the trace itself and the per-request results, printed beside it). The 1M point is the
   issue's "1M-request ShareGPT-like trace on one replica". Baseline for the speed-up: skip-ahead
   off on the first 20k requests of the same trace.
3. ``cluster``: the same 1M-request trace at 16x the rate (320 requests/s) on 16 replicas behind
   the round-robin router (each replica sees the single-replica load).

For every run: simulated requests per wall second, steps per wall second, the share of steps
skipped, and peak resident memory, beside a process that only builds the trace ("trace only").
For scale: Vidur runs at about 1,000 simulated requests per wall second on this machine type with
4.5 GB of memory (the issue's figures, not measured here). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AZURE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT_RATE = 20.0


def _trace(case: dict):
    from traces.generate import generate, workload_spec
    from traces.generate.lengths import LogNormal
    from traces.loaders import load_trace

    if case["kind"] == "azure":
        if AZURE.exists():
            return load_trace(str(AZURE)).head(case["requests"])
        from dataclasses import replace

        spec = workload_spec("kwon2023-sharegpt", rate_rps=5.53, num_requests=case["requests"], seed=0)
        spec = replace(spec, prompt=LogNormal(1155.0, 1.0, high=8000), output=LogNormal(211.0, 0.9, high=1000))
        return generate(spec)
    trace = generate(workload_spec("kwon2023-sharegpt", rate_rps=case["rate"], num_requests=case["generate"], seed=0))
    return trace.head(case["requests"]) if case["requests"] < case["generate"] else trace


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _run_case(case: dict, queue) -> None:
    from sim.cluster import Cluster, build_replicas
    from sim.router import make_router
    from sim.setup import RunSpec
    from sim.simulator import SimOptions

    trace = _trace(case)
    if case["mode"] == "trace":
        queue.put({"peak_rss_bytes": _peak_rss_bytes(), "requests": len(trace)})
        return
    replicas = case.get("replicas", 1)
    builts = build_replicas(RunSpec(model="llama3-8b", gpu="h200"), replicas)
    cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router("round-robin"),
                      SimOptions(skip_ahead=case["mode"] != "noskip"))
    t0 = time.perf_counter()
    result = cluster.run()
    wall_s = time.perf_counter() - t0
    summary = dict(result.summary)
    summary.pop("replicas", None)
    queue.put({"wall_s": wall_s, "requests": len(trace), "steps": result.summary["steps"],
               "skipped": sum(r.steps_skipped for r in result.replicas), "peak_rss_bytes": _peak_rss_bytes(),
               "completed": result.summary["requests_completed"],
               "summary": json.dumps(summary, sort_keys=True)})


def run_in_process(case: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run_case, args=(case, queue))
    proc.start()
    while True:  # a child that dies must not leave us waiting forever
        try:
            result = queue.get(timeout=5)
            break
        except Exception:
            if not proc.is_alive():
                raise RuntimeError(f"benchmark case {case} died with exit code {proc.exitcode}") from None
    proc.join()
    return result


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _line(label: str, r: dict, trace_only: dict) -> str:
    return (f"  {label}: {r['requests']:,} requests in {r['wall_s']:.2f} s wall: {r['requests'] / r['wall_s']:,.0f} "
            f"requests/s, {r['steps'] / r['wall_s']:,.0f} steps/s ({r['steps']:,} steps, {r['skipped'] / r['steps']:.0%} "
            f"skipped); peak {_mib(r['peak_rss_bytes'])} (trace only {_mib(trace_only['peak_rss_bytes'])})")


def bench_azure(requests: int, report: dict) -> None:
    label = "Azure conversation trace" + ("" if AZURE.exists() else " (absent: synthetic stand-in)")
    print(f"{label}, one replica", flush=True)
    case = {"kind": "azure", "requests": requests}
    trace_only = run_in_process({**case, "mode": "trace"})
    fast = run_in_process({**case, "mode": "skip"})
    print(_line("skip-ahead", fast, trace_only), flush=True)
    slow = run_in_process({**case, "mode": "noskip"})
    print(_line("step by step (baseline)", slow, trace_only), flush=True)
    same = fast["summary"] == slow["summary"]
    print(f"  skip-ahead speed-up {slow['wall_s'] / fast['wall_s']:.2f}x; summaries identical: {same}", flush=True)
    report["azure"] = {"skip": fast, "noskip": slow, "trace_only": trace_only, "summaries_identical": same}


def bench_scaling(sizes: list[int], baseline_requests: int, report: dict) -> None:
    largest = max(sizes)
    print(f"kwon2023-sharegpt at {SHAREGPT_RATE:g} requests/s, one replica: scaling", flush=True)
    rows = []
    for n in sizes:
        case = {"kind": "synthetic", "rate": SHAREGPT_RATE, "requests": n, "generate": n}
        trace_only = run_in_process({**case, "mode": "trace"})
        r = run_in_process({**case, "mode": "skip"})
        rows.append((n, r, trace_only))
        print(_line(f"{n:>9,}", r, trace_only), flush=True)
    n0, r0, t0 = rows[0]
    print("  requests   wall s   us/request (x smallest)   peak MiB (x smallest)   peak - trace only MiB", flush=True)
    for n, r, t in rows:
        per = r["wall_s"] / n
        print(f"  {n:>9,} {r['wall_s']:>8.1f} {per * 1e6:>10.1f} ({per / (r0['wall_s'] / n0):.2f}x)"
              f"{r['peak_rss_bytes'] / 2**20:>14,.0f} ({r['peak_rss_bytes'] / r0['peak_rss_bytes']:.2f}x)"
              f"{(r['peak_rss_bytes'] - t['peak_rss_bytes']) / 2**20:>18,.0f}", flush=True)
    base_case = {"kind": "synthetic", "rate": SHAREGPT_RATE, "requests": min(baseline_requests, largest),
                 "generate": largest}
    fast = run_in_process({**base_case, "mode": "skip"})
    slow = run_in_process({**base_case, "mode": "noskip"})
    same = fast["summary"] == slow["summary"]
    print(f"  first {base_case['requests']:,} requests: skip-ahead {fast['wall_s']:.2f} s, step by step "
          f"{slow['wall_s']:.2f} s: {slow['wall_s'] / fast['wall_s']:.2f}x; summaries identical: {same}", flush=True)
    report["scaling"] = {"rows": [{"requests": n, **r, "trace_only_peak_rss_bytes": t["peak_rss_bytes"]}
                                  for n, r, t in rows],
                         "baseline": {"skip": fast, "noskip": slow, "summaries_identical": same}}


def bench_cluster(requests: int, replicas: int, report: dict) -> None:
    rate = SHAREGPT_RATE * replicas
    print(f"kwon2023-sharegpt at {rate:g} requests/s on {replicas} replicas (round-robin)", flush=True)
    case = {"kind": "synthetic", "rate": rate, "requests": requests, "generate": requests, "replicas": replicas}
    trace_only = run_in_process({**case, "mode": "trace"})
    r = run_in_process({**case, "mode": "skip"})
    print(_line(f"{replicas} replicas", r, trace_only), flush=True)
    report["cluster"] = {**r, "replicas": replicas, "trace_only": trace_only}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="azure,scaling,cluster", help="comma-separated: azure, scaling, cluster")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 2,000 Azure requests, sizes 2k and 5k, a 5k-request cluster of 4")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="scaling sizes (default 10k,100k,1M)")
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = set(args.cases.split(","))
    unknown = cases - {"azure", "scaling", "cluster"}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    sizes = [2_000, 5_000] if args.quick else sorted(int(s) for s in args.sizes.split(","))
    report: dict = {}
    if "azure" in cases:
        bench_azure(2_000 if args.quick else 19_366, report)
    if "scaling" in cases:
        bench_scaling(sizes, 2_000 if args.quick else 20_000, report)
    if "cluster" in cases:
        bench_cluster(5_000 if args.quick else max(sizes), 4 if args.quick else args.replicas, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
