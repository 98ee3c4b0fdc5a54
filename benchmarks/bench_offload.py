"""Speed of the simulator with KV offloading on, beside the same run with it off, measured in one run.

Issue 25 asks for a benchmark of the simulator with offloading on against off, in simulated
requests per wall second. The workload is the shared Mooncake conversation trace
(``../shared/traces/mooncake_fast25/conversation_trace.jsonl``, 12,031 requests whose prompts
share 512-token blocks; its first ``--num-requests``, default 3,000), Llama 3.1 8B on one H100,
prefix caching on, one replica. Cases, each in a spawned process of its own pinned to one core
(the last CPU this process may use; OMP, MKL and OpenBLAS limited to one thread):

- ``off``: no offloading (skip-ahead on, as a user runs it);
- ``off, step by step``: no offloading, skip-ahead off: what skip-ahead buys on this trace (it
  stays on with offloading, since decodes store nothing; a step that admits or stores goes
  through the scheduler either way), so the offload tier's own cost is ``on`` against ``off``;
- ``on``: a ``--size`` GiB offload store (default 256, vLLM's ``--kv-offloading-size``) with each
  ``--policies`` eviction policy (default lru).

For each: simulated requests per wall second, the prefix hit rate split by tier (HBM, CPU), mean
and p99 TTFT, and the speed ratio to ``off`` and to ``off, step by step``. Skipped, and said so,
when the trace is absent. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_sim import _core, _pin, run_in_process  # noqa: E402  (one core, one thread per library)

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
TIER_KEYS = ("prefix_hit_rate", "hbm_hit_rate", "offload_hit_rate", "offload_loaded_blocks",
             "offload_stored_blocks", "offload_evictions", "host_link_busy_fraction", "offload_load_wait_s")


def _run_case(case: dict, queue) -> None:
    _pin(case.get("core"))
    from pagesim.sim.cli import replica_block_bytes
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.router import make_router
    from pagesim.sim.setup import RunSpec
    from pagesim.sim.simulator import SimOptions
    from pagesim.traces.loaders import load_trace

    trace = load_trace(str(MOONCAKE), "mooncake")
    if case["requests"] < len(trace):
        trace = trace.head(case["requests"])
    overrides = {"enable_prefix_caching": True}
    if case["policy"] is not None:
        overrides["offload_eviction_policy"] = case["policy"]
    spec = RunSpec(model="llama3.1-8b", gpu="h100", overrides=overrides, kv_offloading_gb=case["size_gib"])
    builts = build_replicas(spec, 1)
    cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router("round-robin"),
                      SimOptions(skip_ahead=case["skip_ahead"]), block_bytes=replica_block_bytes(builts[0]))
    t0 = time.perf_counter()
    result = cluster.run()
    wall_s = time.perf_counter() - t0
    s = result.summary
    queue.put({"wall_s": wall_s, "requests": len(trace), "steps": s["steps"], "completed": s["requests_completed"],
               "ttft_mean_s": s["ttft_s"]["mean"], "ttft_p99_s": s["ttft_s"]["p99"],
               "offload_blocks": builts[0].scheduler.config.num_offload_blocks,
               **{k: s.get(k) for k in TIER_KEYS}})


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_table(rows: list[tuple[str, dict]]) -> None:
    off, step_by_step = rows[0][1], rows[1][1]

    def rps(r: dict) -> float:
        return r["requests"] / r["wall_s"]

    head = ("case", "req/s", "x off", "x off step by step", "steps", "prefix hit", "HBM", "CPU", "TTFT mean s",
            "TTFT p99 s", "link busy")
    lines = [(label, f"{rps(r):,.0f}", f"{rps(r) / rps(off):.2f}", f"{rps(r) / rps(step_by_step):.2f}",
              f"{r['steps']:,}", _pct(r["prefix_hit_rate"]), _pct(r["hbm_hit_rate"]), _pct(r["offload_hit_rate"]),
              f"{r['ttft_mean_s']:.4g}", f"{r['ttft_p99_s']:.4g}", _pct(r["host_link_busy_fraction"]))
             for label, r in rows]
    widths = [max(len(x[i]) for x in (head, *lines)) for i in range(len(head))]
    print("\nrequests simulated per wall second, and the ratio to the runs without offloading (HBM / CPU: "
          "prefix hits by tier, of admitted prompt tokens)")
    for x in (head, *lines):
        print(" | ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip())
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=3000, metavar="N",
                        help="the trace's first N requests (default 3000; the whole trace is 12,031)")
    parser.add_argument("--size", type=float, default=256.0, metavar="GIB", help="offload store GiB (default 256)")
    parser.add_argument("--policies", default="lru", help="comma-separated offload policies: lru, arc, lfu "
                        "(default lru)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = parser.parse_args()
    if args.num_requests < 1:
        parser.error(f"--num-requests must be >= 1, got {args.num_requests}")
    from pagesim.engine.policy.offload import OFFLOAD_POLICIES

    unknown = sorted(set(args.policies.split(",")) - set(OFFLOAD_POLICIES))
    if unknown:
        parser.error(f"unknown offload policy {', '.join(unknown)}; choose from {', '.join(OFFLOAD_POLICIES)}")
    if not MOONCAKE.exists():
        print(f"Mooncake conversation trace: skipped ({MOONCAKE} is absent)")
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": f"{MOONCAKE} is absent"}))
        return
    core = _core()
    print(f"Mooncake conversation trace, first {args.num_requests:,} requests; llama3.1-8b on one h100, prefix "
          f"caching on; each case in its own process" + (f" on CPU {core}" if core is not None else ""), flush=True)
    cases = [("off", {"size_gib": None, "policy": None, "skip_ahead": True}),
             ("off, step by step", {"size_gib": None, "policy": None, "skip_ahead": False})]
    cases += [(f"on {args.size:g} GiB {policy}", {"size_gib": args.size, "policy": policy, "skip_ahead": True})
              for policy in args.policies.split(",")]
    rows = []
    for label, case in cases:
        r = run_in_process({**case, "requests": args.num_requests}, _run_case)
        print(f"  {label}: {r['requests']:,} requests in {r['wall_s']:.2f} s wall, prefix hit "
              f"{_pct(r['prefix_hit_rate'])}", flush=True)
        rows.append((label, r))
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"core": core, "cases": dict(rows)}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
