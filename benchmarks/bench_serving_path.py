"""What the serving path and client timeouts cost the simulator: the same trace under ``--policy
vllm-v1`` with the plain path (no frontend, synchronous scheduling), with the ``vllm`` serving path
(frontend terms and asynchronous scheduling's one-step lag, which holds skip-ahead back while a
request waits to join), and with the ``vllm`` path and a client timeout, timed in one run,
alternating, on one core.

    python benchmarks/bench_serving_path.py [--requests 20000] [--rate 20] [--repeats 3]

Prints the simulated requests per wall second of each, and each as a ratio to the plain path
(the issue's target: the new terms cost under 10%). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def simulate(trace, path_name: str | None, timeout_s: float | None) -> float:
    """Wall seconds of one simulation of ``trace`` (llama3-8b on one H200, vllm-v1)."""
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.serving_path import roofline_overrides, serving_path
    from pagesim.sim.setup import RunSpec
    from pagesim.sim.simulator import SimOptions

    path = serving_path(path_name) if path_name else None
    spec = RunSpec(model="llama3-8b", gpu="h200", policy="vllm-v1", cost_params=roofline_overrides(path))
    built = build_replicas(spec, 1)[0]
    options = SimOptions(step_rows=False, serving_path=path, request_timeout_s=timeout_s)
    started = time.perf_counter()
    Cluster(trace, [(built.scheduler, built.cost_model)], None, options).run()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})  # one core: the same for every variant
    from pagesim.traces.generate import generate, workload_spec

    trace = generate(workload_spec("kwon2023-sharegpt", rate_rps=args.rate, num_requests=args.requests, seed=1))
    variants = {"plain path (none)": (None, None), "vllm serving path": ("vllm", None),
                "vllm path + 60 s timeout": ("vllm", 60.0)}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (path, timeout_s) in variants.items():
            walls[name].append(simulate(trace, path, timeout_s))
    base = statistics.median(walls["plain path (none)"])
    print(f"{args.requests:,} kwon2023-sharegpt requests at {args.rate:g}/s, llama3-8b on h200, vllm-v1, "
          f"one core, median of {args.repeats}:")
    for name, values in walls.items():
        wall = statistics.median(values)
        print(f"  {name:<26} {wall:6.2f} s  {args.requests / wall:9,.0f} requests/s  {wall / base:5.2f}x the plain path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
