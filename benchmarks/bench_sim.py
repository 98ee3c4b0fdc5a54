"""Speed and memory of the simulator at scale, each figure beside a baseline measured in the same run.

Issue 23 asks for, in one run: simulated requests per wall second and peak memory on each case
below, each beside the same run with the fast path (skip-ahead) off, and the ratio. Every run
is a spawned process of its own, pinned to one core (the last CPU this process may use; OMP, MKL
and OpenBLAS limited to one thread), so one case's garbage does not count against the next and
peak resident memory is that run's own. Llama 3 8B on H200 and the ``pagesim`` policy unless a
case says otherwise.

1. ``azure``: the shared Azure conversation trace (``../shared/traces/azure_llm_2023/``, 19,366
   requests over an hour; a synthetic stand-in of the same size and mean lengths when the folder
   is absent), one replica.
2. ``scaling``: a ShareGPT-like trace (``kwon2023-sharegpt``: the PagedAttention paper's lengths,
   161 in / 338 out on average) at 20 requests/s on one replica, at 10k, 100k and 1M requests
   (``--sizes``): wall time per request and peak memory, each as a ratio to the smallest size
   (time per request should stay flat, i.e. wall time linear; memory should stay flat apart
   from the trace itself and the per-request results, printed beside it). The 1M point is the
   issue's "1M-request ShareGPT-like trace on one replica".
3. ``mooncake``: the shared Mooncake conversation trace (``../shared/traces/mooncake_fast25/``,
   12,031 requests whose prompts share 512-token blocks), prefix caching on, one replica; the
   prefix hit rate is printed beside the speed. Skipped (and said so) when the file is absent.
4. ``cluster``: the same 1M-request ShareGPT-like trace at 16x the rate (320 requests/s) on 16
   replicas behind the round-robin router (each replica sees the single-replica load).
5. ``azure-v0``: case 1 under the ``vllm-v0`` policy (vLLM 0.6.3's decisions), whose pure decode
   steps are skipped too (a step that admits runs its prefills alone there, so it is never a
   skip).
6. ``azure-oss``: case 1 on gpt-oss-120b (half its layers attend through a 128-token sliding
   window: vLLM v1's hybrid KV cache, whose decodes drop the blocks that leave the window).
7. ``pressure``: memory pressure, what a swap-or-recompute study runs: 20,000 ShareGPT-like
   requests at 20 requests/s on one replica whose KV cache is held to ``PRESSURE_KV_GB`` (2 GB,
   about 16,000 token slots: the batch keeps outgrowing it), once with ``--preemption recompute``
   and once with ``--preemption swap``, then with swap under the ``vllm-v0`` policy (vLLM 0.6.3,
   where swapping is the default for a group of several sequences); the preemptions are printed
   beside the speed.
8. ``parallel``: parallel sampling, PagedAttention's ``n = 4`` workload (``kwon2023-alpaca-parallel``,
   20,000 requests at 20 requests/s, one replica): every request forks after its prompt, and its
   first decode copies the prompt's shared last block on write; under the ``pagesim`` policy and
   under ``vllm-v0`` (vLLM 0.6.3, whose parallel sampling this is).
9. ``offload``: case 3 with a 256 GiB offload store (``--kv-offloading-size 256``), its loads
   asynchronous (vLLM 0.33's default: the request parked until the host link has copied them)
   beside the same run with every load synchronous (``--offload-sync-load-budget-bytes`` 1 TiB);
   prints the speed ratio (issue 58: at least 0.8x) and each run's parked requests.
10. ``priority``: case 1 under the ``vllm-v1`` policy with ``--scheduling-policy priority`` beside
   ``fcfs`` (every request of priority 0: what the priority queue itself costs); prints the speed
   ratio (issue 58: at least 0.8x).

Cases 9 and 10 compare two settings, each with skip-ahead on, rather than skip-ahead on and off:
they are printed in a table of their own ("variants").

Baseline: skip-ahead off (``--no-skip-ahead``) on the whole trace where it has at most
``NOSKIP_SAMPLE`` (20,000) requests (azure, mooncake), else on its first 20,000 requests, where
skip-ahead is run again so that the ratio compares the same requests. The two must give the
identical summary (checked and printed). For every run: simulated requests per wall second,
steps per wall second, the share of steps skipped, and peak resident memory, beside a process
that only builds the trace ("trace only"). A table at the end gathers the figures and says
whether the issue's targets were met on this machine: at least 10,000 simulated requests per
wall second on (1) and (2); 1M requests on one replica in under 120 s and under 1 GB (10^9
bytes). The targets are reported, never asserted. For scale: Vidur runs at about 1,000
simulated requests per wall second on this machine type with 4.5 GB of memory (the issue's
figures, not measured here).
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
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
SHAREGPT_RATE = 20.0
NOSKIP_SAMPLE = 20_000  # skip-ahead off on at most this many requests (quick: 2,000)
TARGET_RPS = 10_000  # issue 23: simulated requests per wall second on azure and ShareGPT-like
TARGET_1M_S = 120.0  # issue 23: 1M requests on one replica in under 2 minutes ...
TARGET_1M_BYTES = 10**9  # ... and under 1 GB
TARGET_VARIANT_RATIO = 0.8  # issue 58: priority scheduling and asynchronous offloading at least 0.8x their baselines
PRESSURE_KV_GB = 2.0  # the pressure case's KV cache (Llama 3 8B: 128 KiB a token, about 16,000 slots)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def _core() -> int | None:
    """The CPU each case runs on: the last one this process may use (None where unsupported)."""
    if hasattr(os, "sched_getaffinity"):
        return max(os.sched_getaffinity(0))
    return None


def _trace(case: dict):
    from pagesim.traces.generate import generate, workload_spec
    from pagesim.traces.generate.lengths import LogNormal
    from pagesim.traces.loaders import load_trace

    if case["kind"] == "mooncake":
        trace = load_trace(str(MOONCAKE), "mooncake")  # hash_ids stand for 512-token blocks (the format's)
        return trace.head(case["requests"]) if case["requests"] < len(trace) else trace
    if case["kind"] == "azure":
        if AZURE.exists():
            return load_trace(str(AZURE)).head(case["requests"])
        from dataclasses import replace

        spec = workload_spec("kwon2023-sharegpt", rate_rps=5.53, num_requests=case["requests"], seed=0)
        spec = replace(spec, prompt=LogNormal(1155.0, 1.0, high=8000), output=LogNormal(211.0, 0.9, high=1000))
        return generate(spec)
    trace = generate(workload_spec(case.get("workload", "kwon2023-sharegpt"), rate_rps=case["rate"],
                                   num_requests=case["generate"], seed=0))
    return trace.head(case["requests"]) if case["requests"] < case["generate"] else trace


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _pin(core: int | None) -> list[int] | None:
    """Run this process on ``core`` with one thread per numeric library; returns the CPUs it may use."""
    for var in THREAD_VARS:  # the parent set them for the spawn already; numpy is not imported yet
        os.environ[var] = "1"
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _run_case(case: dict, queue) -> None:
    cpus = _pin(case.get("core"))
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.router import make_router
    from pagesim.sim.setup import RunSpec
    from pagesim.sim.simulator import SimOptions

    trace = _trace(case)
    if case["mode"] == "trace":
        queue.put({"peak_rss_bytes": _peak_rss_bytes(), "requests": len(trace), "cpus": cpus})
        return
    replicas = case.get("replicas", 1)
    overrides = {"enable_prefix_caching": True} if case.get("prefix_caching") else {}
    if case.get("preemption"):
        overrides["preemption_mode"] = case["preemption"]
    overrides.update(case.get("overrides", {}))
    builts = build_replicas(RunSpec(model=case.get("model", "llama3-8b"), gpu="h200", policy=case.get("policy", "pagesim"),
                                    kv_cache_gb=case.get("kv_cache_gb"), kv_offloading_gb=case.get("kv_offloading_gb"),
                                    overrides=overrides), replicas)
    cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], make_router("round-robin"),
                      SimOptions(skip_ahead=case["mode"] != "noskip", step_rows=False))  # (as simulate without --out)
    t0 = time.perf_counter()
    result = cluster.run()
    wall_s = time.perf_counter() - t0
    summary = dict(result.summary)
    summary.pop("replicas", None)
    queue.put({"wall_s": wall_s, "requests": len(trace), "steps": result.summary["steps"],
               "parked": result.summary.get("offload_parked_requests"),
               "ttft_mean_s": result.summary["ttft_s"]["mean"],
               "skipped": sum(r.steps_skipped for r in result.replicas), "peak_rss_bytes": _peak_rss_bytes(),
               "completed": result.summary["requests_completed"],
               "prefix_hit_rate": result.summary.get("prefix_hit_rate"), "cpus": cpus,
               "preemptions": sum(result.summary["preemptions"].values()),
               "summary": json.dumps(summary, sort_keys=True)})


def run_in_process(case: dict, target=None) -> dict:
    """``target(case, queue)`` (default: this file's ``_run_case``) in a spawned process pinned to
    one core with one thread per numeric library; returns what it put on the queue."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target or _run_case, args=({**case, "core": _core()}, queue))
    saved = {var: os.environ.get(var) for var in THREAD_VARS}
    os.environ.update(dict.fromkeys(THREAD_VARS, "1"))  # the child's environment, from its first import
    try:
        proc.start()
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
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


def _rps(r: dict) -> float:
    return r["requests"] / r["wall_s"]


def _line(label: str, r: dict, trace_only: dict | None) -> str:
    hit = "" if r.get("prefix_hit_rate") is None or not r.get("show_hit") else \
        f"; prefix hit rate {r['prefix_hit_rate']:.1%}"
    if r.get("show_preemptions"):
        hit += f"; {r['preemptions']:,} preemptions"
    only = f" (trace only {_mib(trace_only['peak_rss_bytes'])})" if trace_only else ""
    return (f"  {label}: {r['requests']:,} requests in {r['wall_s']:.2f} s wall: {_rps(r):,.0f} "
            f"requests/s, {r['steps'] / r['wall_s']:,.0f} steps/s ({r['steps']:,} steps, {r['skipped'] / r['steps']:.0%} "
            f"skipped){hit}; peak {_mib(r['peak_rss_bytes'])}{only}")


def _baseline(case: dict, full: dict, sample: int, trace_only: dict | None) -> dict:
    """Skip-ahead off on the first ``sample`` requests of ``case`` (all of them where there are no
    more), beside skip-ahead on the same requests; prints both and the ratio."""
    n = full["requests"]
    if sample >= n:
        fast, sample = full, n
    else:
        fast = run_in_process({**case, "requests": sample, "mode": "skip"})
        fast["show_hit"] = full.get("show_hit")
        print(_line(f"skip-ahead, first {sample:,}", fast, None), flush=True)
    slow = run_in_process({**case, "requests": sample, "mode": "noskip"})
    slow["show_hit"] = full.get("show_hit")
    where = "" if sample == n else f", first {sample:,}"
    print(_line(f"step by step (baseline{where})", slow, trace_only if sample == n else None), flush=True)
    same = fast["summary"] == slow["summary"]
    ratio = slow["wall_s"] / fast["wall_s"]
    print(f"  skip-ahead speed-up on the same {'' if sample == n else 'first '}{sample:,} requests: "
          f"{ratio:.2f}x; summaries identical: {same}", flush=True)
    return {"sample": sample, "skip_sample": fast, "noskip": slow, "ratio": ratio, "summaries_identical": same}


def _row(case: str, full: dict, base: dict, target: str) -> dict:
    return {"case": case, "requests": full["requests"], "wall_s": full["wall_s"], "skip_rps": _rps(full),
            "noskip_rps": _rps(base["noskip"]), "noskip_sample": base["sample"], "ratio": base["ratio"],
            "peak_rss_skip_bytes": full["peak_rss_bytes"], "peak_rss_noskip_bytes": base["noskip"]["peak_rss_bytes"],
            "summaries_identical": base["summaries_identical"], "target": target}


def _rps_target(r: dict) -> str:
    return f">= {TARGET_RPS:,} req/s: {'met' if _rps(r) >= TARGET_RPS else 'not met'}"


def _1m_target(r: dict) -> str:
    met = r["wall_s"] < TARGET_1M_S and r["peak_rss_bytes"] < TARGET_1M_BYTES
    return f"1M in < {TARGET_1M_S:.0f} s and < 1 GB: {'met' if met else 'not met'}"


def bench_azure(requests: int, sample: int, report: dict, table: list, policy: str = "pagesim",
                model: str = "llama3-8b") -> None:
    default = policy == "pagesim" and model == "llama3-8b"  # (the case (a); others beside it)
    name = ("azure" if default else f"azure-{policy.removeprefix('vllm-')}" if policy != "pagesim"
            else "azure-oss" if model == "gpt-oss-120b" else f"azure-{model}")
    which = "" if policy == "pagesim" else f", {policy} policy"
    which += "" if model == "llama3-8b" else f", {model}"
    label = "Azure conversation trace" + ("" if AZURE.exists() else " (absent: synthetic stand-in)")
    print(f"{label}, one replica{which}", flush=True)
    case = {"kind": "azure", "requests": requests, "policy": policy, "model": model}
    trace_only = run_in_process({**case, "mode": "trace"})
    fast = run_in_process({**case, "mode": "skip"})
    print(_line("skip-ahead", fast, trace_only), flush=True)
    base = _baseline(case, fast, sample, trace_only)
    report[name] = {"skip": fast, "trace_only": trace_only, **base, "synthetic": not AZURE.exists()}
    row = name + ("" if AZURE.exists() else " (synthetic)") + ("" if default else f" ({which.lstrip(', ')})")
    table.append(_row(row, fast, base, _rps_target(fast) if default else "-"))


def bench_scaling(sizes: list[int], sample: int, report: dict, table: list) -> None:
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
    # The baseline: the first `sample` requests of the largest trace (the same rows as the smaller ones).
    base = _baseline({"kind": "synthetic", "rate": SHAREGPT_RATE, "generate": largest}, rows[-1][1], sample, None)
    for n, r, _ in rows:
        target = _rps_target(r)
        if n == 1_000_000:
            target += "; " + _1m_target(r)
        table.append(_row(f"sharegpt {n:,}", r, base, target))
    report["scaling"] = {"rows": [{"requests": n, **r, "trace_only_peak_rss_bytes": t["peak_rss_bytes"]}
                                  for n, r, t in rows],
                         "baseline": {"skip": base["skip_sample"], **base}}


def bench_mooncake(requests: int, sample: int, report: dict, table: list) -> None:
    if not MOONCAKE.exists():
        print(f"Mooncake conversation trace: skipped ({MOONCAKE} is absent)", flush=True)
        report["mooncake"] = {"skipped": f"{MOONCAKE} is absent"}
        table.append({"case": "mooncake", "skipped": "trace absent"})
        return
    print("Mooncake conversation trace, prefix caching on, one replica", flush=True)
    case = {"kind": "mooncake", "requests": requests, "prefix_caching": True}
    trace_only = run_in_process({**case, "mode": "trace"})
    fast = run_in_process({**case, "mode": "skip"})
    fast["show_hit"] = True
    print(_line("skip-ahead", fast, trace_only), flush=True)
    base = _baseline(case, fast, sample, trace_only)
    report["mooncake"] = {"skip": fast, "trace_only": trace_only, **base}
    table.append(_row("mooncake (prefix caching)", fast, base, f"- (prefix hit {fast['prefix_hit_rate']:.1%})"))


def bench_cluster(requests: int, replicas: int, sample: int, report: dict, table: list) -> None:
    rate = SHAREGPT_RATE * replicas
    print(f"kwon2023-sharegpt at {rate:g} requests/s on {replicas} replicas (round-robin)", flush=True)
    case = {"kind": "synthetic", "rate": rate, "requests": requests, "generate": requests, "replicas": replicas}
    trace_only = run_in_process({**case, "mode": "trace"})
    r = run_in_process({**case, "mode": "skip"})
    print(_line(f"{replicas} replicas", r, trace_only), flush=True)
    base = _baseline(case, r, sample, trace_only)
    report["cluster"] = {**r, "replicas": replicas, "trace_only": trace_only, "baseline": base}
    table.append(_row(f"cluster {replicas} replicas", r, base, "-"))


def bench_pressure(requests: int, sample: int, report: dict, table: list) -> None:
    print(f"kwon2023-sharegpt at {SHAREGPT_RATE:g} requests/s, one replica, {PRESSURE_KV_GB:g} GB of KV cache "
          "(memory pressure)", flush=True)
    report["pressure"] = {}
    for policy, mode in (("pagesim", "recompute"), ("pagesim", "swap"), ("vllm-v0", "swap")):
        case = {"kind": "synthetic", "rate": SHAREGPT_RATE, "requests": requests, "generate": requests,
                "kv_cache_gb": PRESSURE_KV_GB, "preemption": mode, "policy": policy}
        r = run_in_process({**case, "mode": "skip"})
        r["show_preemptions"] = True
        name = mode if policy == "pagesim" else f"{policy} {mode}"
        print(_line(f"--preemption {mode}" + ("" if policy == "pagesim" else f" --policy {policy}"), r, None),
              flush=True)
        base = _baseline(case, r, sample, None)
        report["pressure"][name] = {"skip": r, **base}
        table.append(_row(f"pressure, {name}", r, base, f"- ({r['preemptions']:,} preemptions)"))


def bench_parallel(requests: int, sample: int, report: dict, table: list) -> None:
    print(f"kwon2023-alpaca-parallel (n = 4) at {SHAREGPT_RATE:g} requests/s, one replica: parallel sampling",
          flush=True)
    report["parallel"] = {}
    for policy in ("pagesim", "vllm-v0"):
        case = {"kind": "synthetic", "workload": "kwon2023-alpaca-parallel", "rate": SHAREGPT_RATE,
                "requests": requests, "generate": requests, "policy": policy}
        r = run_in_process({**case, "mode": "skip"})
        print(_line(f"--policy {policy}", r, None), flush=True)
        base = _baseline(case, r, sample, None)
        report["parallel"][policy] = {"skip": r, **base}
        table.append(_row(f"parallel n=4, {policy}", r, base, "-"))


def bench_variant(name: str, title: str, case: dict, baseline: tuple[str, dict], variant: tuple[str, dict],
                  report: dict, variants: list) -> None:
    """``case`` with the baseline's settings and with the variant's (each a label and the case's
    keys it changes), skip-ahead on; prints both and the variant's speed as a ratio to the baseline's."""
    print(title, flush=True)
    runs = {}
    for label, keys in (baseline, variant):
        r = run_in_process({**case, **keys, "mode": "skip"})
        runs[label] = r
        parked = "" if r.get("parked") is None else f"; {r['parked']:,} requests parked for loads"
        print(_line(label, r, None) + parked, flush=True)
    (base_label, _), (var_label, _) = baseline, variant
    ratio = _rps(runs[var_label]) / _rps(runs[base_label])
    target = f">= {TARGET_VARIANT_RATIO:g}x: {'met' if ratio >= TARGET_VARIANT_RATIO else 'not met'}"
    print(f"  {var_label} at {ratio:.2f}x the speed of {base_label} ({target})", flush=True)
    report[name] = {**runs, "ratio": ratio}
    variants.append({"case": name, "requests": runs[base_label]["requests"], "baseline": base_label,
                     "variant": var_label, "baseline_rps": _rps(runs[base_label]),
                     "variant_rps": _rps(runs[var_label]), "ratio": ratio, "target": target})


def print_variants(variants: list) -> None:
    if not variants:
        return
    head = ("case", "requests", "baseline", "req/s", "variant", "req/s", "ratio", "target")
    lines = [(v["case"], f"{v['requests']:,}", v["baseline"], f"{v['baseline_rps']:,.0f}", v["variant"],
              f"{v['variant_rps']:,.0f}", f"{v['ratio']:.2f}x", v["target"]) for v in variants]
    widths = [max(len(str(x[i])) for x in (head, *lines)) for i in range(len(head))]
    print("\nVariants (skip-ahead on in both; ratio = the variant's requests per wall second over the baseline's)")
    for x in (head, *lines):
        print(" | ".join(str(v).ljust(w) for v, w in zip(x, widths)).rstrip())
    sys.stdout.flush()


def print_table(table: list) -> None:
    head = ("case", "requests", "skip req/s", "noskip req/s (sample)", "ratio", "peak RSS skip",
            "peak RSS noskip", "identical", "target")
    lines = []
    for t in table:
        if "skipped" in t:
            lines.append((t["case"], "-", f"skipped: {t['skipped']}", "", "", "", "", "", ""))
            continue
        lines.append((t["case"], f"{t['requests']:,}", f"{t['skip_rps']:,.0f}",
                      f"{t['noskip_rps']:,.0f} (first {t['noskip_sample']:,})", f"{t['ratio']:.2f}x",
                      _mib(t["peak_rss_skip_bytes"]), _mib(t["peak_rss_noskip_bytes"]),
                      str(t["summaries_identical"]), t["target"]))
    widths = [max(len(str(x[i])) for x in (head, *lines)) for i in range(len(head))]
    print("\nSummary (skip = skip-ahead on, the whole trace; noskip = skip-ahead off on the sample named; "
          "ratio = speed-up of skip-ahead on the sample's requests; targets are reported, not asserted)")
    for x in (head, *lines):
        print(" | ".join(str(v).ljust(w) for v, w in zip(x, widths)).rstrip())
    if not any(t.get("requests") == 1_000_000 and t["case"].startswith("sharegpt") for t in table):
        print(f"1M requests on one replica in < {TARGET_1M_S:.0f} s and < 1 GB: not measured in this run "
              "(no 1,000,000-request scaling size)")
    sys.stdout.flush()


def _sizes(text: str) -> list[int]:
    """``--sizes``: request counts, each an integer with an optional k or M (10k, 1M)."""
    sizes = []
    for item in text.split(","):
        item = item.strip()
        scale = {"k": 1_000, "m": 1_000_000}.get(item[-1:].lower(), 1)
        digits = item[:-1] if scale > 1 else item
        if not digits.isdigit() or int(digits) * scale < 1:
            raise argparse.ArgumentTypeError(f"expected sizes like 10000,100k,1M, got {item!r}")
        sizes.append(int(digits) * scale)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases",
                        default="azure,scaling,mooncake,cluster,azure-v0,azure-oss,pressure,parallel,offload,priority",
                        help="comma-separated: azure, scaling, mooncake, cluster, azure-v0, azure-oss, pressure, "
                             "parallel, offload, priority")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 2,000 Azure (both policies, and gpt-oss-120b), Mooncake, memory-pressure and "
                             "parallel-sampling requests, "
                             "sizes 2k and 5k, a 5k-request cluster of 4, baselines on 2,000 requests")
    parser.add_argument("--sizes", type=_sizes, default="10000,100000,1000000",
                        help="comma-separated scaling sizes, e.g. 10000,100k,1M (default 10k,100k,1M)")
    parser.add_argument("--replicas", type=int, help="cluster replicas (default 16; quick: 4)")
    parser.add_argument("--max-requests", type=int, metavar="N",
                        help="cap every case's requests (and baseline sample) at N: a smoke test")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    known = {"azure", "scaling", "mooncake", "cluster", "azure-v0", "azure-oss", "pressure", "parallel", "offload",
             "priority"}
    unknown = cases - known
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")

    def cap(n: int) -> int:
        return n if args.max_requests is None else max(1, min(n, args.max_requests))

    sizes = sorted({cap(s) for s in ([2_000, 5_000] if args.quick else args.sizes)})
    sample = cap(2_000 if args.quick else NOSKIP_SAMPLE)
    replicas = args.replicas or (4 if args.quick else 16)
    core = _core()
    print(f"each case in its own process on CPU {core} (one thread per numeric library)"
          if core is not None else "each case in its own process (CPU affinity unsupported here)", flush=True)
    from pagesim.engine import COMPILED
    from pagesim.engine.compiled import describe

    print(f"build: {describe(COMPILED)} (pagesim/engine/compiled.py)", flush=True)
    report: dict = {"core": core, "noskip_sample": sample, "quick": args.quick, "compiled_modules": COMPILED}
    table: list = []
    variants: list = []
    for name in ("azure", "scaling", "mooncake", "cluster", "azure-v0", "azure-oss", "pressure",
                 "parallel"):  # the (a) to (d), then more
        if name not in cases:
            continue
        if name == "azure":
            bench_azure(cap(2_000 if args.quick else 19_366), sample, report, table)
        elif name == "azure-v0":
            bench_azure(cap(2_000 if args.quick else 19_366), sample, report, table, policy="vllm-v0")
        elif name == "azure-oss":
            bench_azure(cap(2_000 if args.quick else 19_366), sample, report, table, model="gpt-oss-120b")
        elif name == "scaling":
            bench_scaling(sizes, sample, report, table)
        elif name == "mooncake":
            bench_mooncake(cap(2_000 if args.quick else 12_031), sample, report, table)
        elif name == "pressure":
            bench_pressure(cap(2_000 if args.quick else 20_000), sample, report, table)
        elif name == "parallel":
            bench_parallel(cap(2_000 if args.quick else 20_000), sample, report, table)
        else:
            bench_cluster(cap(5_000 if args.quick else max(sizes)), replicas, sample, report, table)
    if "offload" in cases:
        if MOONCAKE.exists():
            bench_variant("offload", "Mooncake conversation trace, prefix caching on, 256 GiB offload store: "
                          "asynchronous loads vs synchronous",
                          {"kind": "mooncake", "requests": cap(2_000 if args.quick else 12_031), "prefix_caching": True,
                           "kv_offloading_gb": 256.0},
                          ("sync loads", {"overrides": {"offload_sync_load_budget_bytes": 2**40}}),
                          ("async loads", {}), report, variants)
        else:
            print(f"offload: skipped ({MOONCAKE} is absent)", flush=True)
            report["offload"] = {"skipped": f"{MOONCAKE} is absent"}
    if "priority" in cases:
        bench_variant("priority", "Azure conversation trace, vllm-v1 policy: --scheduling-policy priority vs fcfs",
                      {"kind": "azure", "requests": cap(2_000 if args.quick else 19_366), "policy": "vllm-v1"},
                      ("fcfs", {}), ("priority", {"overrides": {"scheduling_policy": "priority"}}), report, variants)
    print_table(table)
    print_variants(variants)
    report["table"] = table
    report["variants"] = variants
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
