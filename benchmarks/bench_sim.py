"""Speed and memory of the simulator, each figure beside a baseline measured in the same run.

What is measured
----------------
1. The shared Azure conversation trace (``../shared/traces/azure_llm_2023/``, 19,366 requests over
   an hour; when the folder is absent, a synthetic trace of the same size and mean lengths) on
   Llama 3 8B / one H200 with the ``pagesim`` preset;
2. a synthetic ``kwon2023-alpaca`` trace (the paper's Alpaca-like lengths: 19 prompt and 58
   output tokens on average) of ``--requests`` requests (default 1M; ``--quick`` 5,000) at 40
   requests/s on the same deployment (``--workload`` picks another named workload).

For each: wall seconds, simulated requests per wall second, steps per wall second and the peak
resident memory of the process that ran it (each case runs in its own process, so one case's
garbage does not count against the next).

Baselines, in the same run:

- *policy only*: the same scheduler driven through the very same steps with no SimPy, no cost
  model and no metrics (arrivals are added before the step whose start they precede, so the
  decisions are the ones the simulation made). ``sim / policy`` is what the simulator adds over
  the policy it drives; the rest of the time is the policy's own (the ``Scale`` issue's skip-ahead
  attacks that);
- *trace only*: a process that loads or generates the trace and nothing else; ``peak / trace``
  says how much memory the run adds over holding its input.

For scale: Vidur runs at about 900-1,000 simulated requests per wall second on this machine type
with 4.5 GB of memory (the issue's figure, not measured here). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AZURE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def _trace(case: dict):
    from traces.generate import generate, workload_spec
    from traces.generate.lengths import LogNormal
    from traces.loaders import load_trace

    if case["kind"] == "azure":
        if AZURE.exists():
            return load_trace(str(AZURE)).head(case["requests"])
        from dataclasses import replace

        spec = workload_spec("kwon2023-sharegpt", rate_rps=5.53, num_requests=min(case["requests"], 19_366), seed=0)
        spec = replace(spec, prompt=LogNormal(1155.0, 1.0, high=8000), output=LogNormal(211.0, 0.9, high=1000))
        return generate(spec)
    return generate(workload_spec(case["workload"], rate_rps=case["rate"], num_requests=case["requests"], seed=0))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _run_case(case: dict, queue) -> None:
    from sim.setup import RunSpec, build
    from sim.simulator import Simulation

    trace = _trace(case)
    built = build(RunSpec(model="llama3-8b", gpu="h200"))
    if case["mode"] == "trace":
        queue.put({"peak_rss_bytes": _peak_rss_bytes(), "requests": len(trace)})
        return
    result = Simulation(trace, built.scheduler, built.cost_model).run()
    out = {"wall_s": result.wall_s, "requests": len(trace), "steps": result.summary["steps"],
           "peak_rss_bytes": _peak_rss_bytes(), "completed": result.summary["requests_completed"]}
    if case["mode"] == "both":  # replay the same steps through a fresh scheduler, policy only
        starts = result.steps.array("start_s")
        arrivals = trace.arrival_s
        scheduler = build(RunSpec(model="llama3-8b", gpu="h200")).scheduler
        t0 = time.perf_counter()
        i = 0
        n = len(trace)
        for start in starts.tolist():
            while i < n and arrivals[i] <= start:
                scheduler.add_request(trace.request(i))
                i += 1
            scheduler.update(scheduler.schedule())
        out["policy_wall_s"] = time.perf_counter() - t0
        out["policy_completed"] = scheduler.num_finished_requests
    queue.put(out)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 Azure requests and a 5,000-request synthetic trace (CI)")
    parser.add_argument("--workload", default="kwon2023-alpaca", help="synthetic workload (default kwon2023-alpaca)")
    parser.add_argument("--requests", type=int, default=1_000_000, help="synthetic trace size (default 1M)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [("Azure conversation trace" + ("" if AZURE.exists() else " (absent: synthetic stand-in)"),
              {"kind": "azure", "requests": 1_000 if args.quick else 19_366})]
    if not args.skip_synthetic:
        cases.append((f"{args.workload} synthetic, 40 req/s",
                       {"kind": "synthetic", "workload": args.workload, "rate": 40.0,
                        "requests": 5_000 if args.quick else args.requests}))
    report = {}
    for label, case in cases:
        trace_only = run_in_process({**case, "mode": "trace"})
        # the policy-only replay doubles the work: done on the smaller runs only
        sim = run_in_process({**case, "mode": "both" if case["requests"] <= 20_000 else "sim"})
        entry = {**sim, "trace_only_peak_rss_bytes": trace_only["peak_rss_bytes"],
                 "requests_per_wall_s": sim["requests"] / sim["wall_s"], "steps_per_wall_s": sim["steps"] / sim["wall_s"]}
        report[label] = entry
        print(f"{label}: {sim['requests']:,} requests, {sim['steps']:,} steps")
        print(f"  simulated in {sim['wall_s']:.2f} s wall: {entry['requests_per_wall_s']:,.0f} requests/s, "
              f"{entry['steps_per_wall_s']:,.0f} steps/s")
        if "policy_wall_s" in sim:
            print(f"  policy only, same steps: {sim['policy_wall_s']:.2f} s; sim / policy = "
                  f"{sim['wall_s'] / sim['policy_wall_s']:.2f}x (decisions replayed: {sim['policy_completed']:,} "
                  f"completed vs {sim['completed']:,})")
        print(f"  peak memory {sim['peak_rss_bytes'] / 2**20:,.0f} MiB; trace only "
              f"{trace_only['peak_rss_bytes'] / 2**20:,.0f} MiB; peak / trace = "
              f"{sim['peak_rss_bytes'] / trace_only['peak_rss_bytes']:.2f}x", flush=True)
    if args.json:
        print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
