"""pagesim simulate: replay a trace or a named workload through the serving policy on a modelled GPU.

With no request source it runs the embedded default: 1,000 ``shared-system-prompt`` requests at
6 requests/s on Llama 3 8B and one A100 40 GB. ``--json`` prints the summary as one JSON object
(plus ``sim_wall_s``); ``--out DIR`` writes the summary, the run's settings, per-request and
per-step CSV tables, the decision log (JSONL) and a Perfetto timeline (``pagesim.sim.output``).
``--replicas N`` runs N replicas of the deployment behind ``--router`` (``pagesim.sim.cluster``); the
summary then adds ``router`` and one entry per replica under ``replicas``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

DEFAULT_SOURCE = {"workload": "shared-system-prompt", "rate": 6.0, "num_requests": 1000}
DEFAULT_GPU = "a100-40gb"


def add_parser(subparsers) -> None:
    from pagesim.sim.bench_args import add_bench_args
    from pagesim.sim.router import ROUTERS
    from pagesim.sim.serving_path import add_serving_path_args
    from pagesim.traces.source import add_source_args

    p = subparsers.add_parser(
        "simulate", help="simulate serving a trace or workload: throughput, latency, memory",
        description=__doc__.splitlines()[0],
    )
    add_source_args(p)
    add_deployment_args(p)
    o = p.add_argument_group("simulation")
    o.add_argument("--sample-lengths", choices=["drawn", "same"], default="drawn",
                   help="parallel samples end at lengths drawn from the workload (default) or all at the trace's")
    o.add_argument("--overlap-swaps", action="store_true", help="run swaps beside the step's compute")
    o.add_argument("--no-skip-ahead", dest="skip_ahead", action="store_false",
                   help="run every step one by one (same results, slower: skip-ahead only passes over pure decode "
                   "steps, exactly)")
    o.add_argument("--slo-ttft", type=float, metavar="S", help="goodput SLO on TTFT (default 2 s; or vLLM's --goodput)")
    o.add_argument("--slo-tpot", type=float, metavar="S", help="goodput SLO on TPOT (default 0.1 s)")
    add_cost_args(o)
    o.add_argument("--profile", metavar="FILE", help="calibration profile: kernel-timed (pagesim calibrate: step times "
                   "measured on the real kernels instead of the roofline model) or fitted (pagesim calibrate "
                   "--from-measurements: the roofline with parameters fitted to a server's measurements)")
    o.add_argument("--check-profile", action="store_true",
                   help="re-time the profile's probe on this machine first and warn (--strict: stop) when the "
                        "profile no longer describes it (needs the profile's device here); --strict alone compares "
                        "the profile's device and versions with this machine's")
    o.add_argument("--profile-tolerance", type=float, metavar="F",
                   help="with --check-profile: how far the probe, re-timed, may be from its time at calibration "
                        "either way (geometric mean of its points; default 0.2)")
    from pagesim.sim.disagg.cli import add_disagg_args

    add_disagg_args(p)
    c = p.add_argument_group("cluster")
    c.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="replicas behind a router, each with --tp GPUs and its own KV cache (default 1)")
    c.add_argument("--router", default="round-robin", choices=list(ROUTERS),
                   help="which replica serves each request (default round-robin; pagesim/sim/router.py states each rule)")
    c.add_argument("--affinity-slack", type=float, metavar="F",
                   help="prefix-affinity: leave the replica holding the prefix when its outstanding tokens exceed "
                        "the least-loaded replica's by this factor (default 1.5) ...")
    c.add_argument("--affinity-slack-tokens", type=int, metavar="N",
                   help="... and by this many tokens (default 4096)")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    o.add_argument("--out", metavar="DIR", help="write summary, tables, decision log and timeline here")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar (on a terminal), nor a progress line a minute (otherwise)")
    add_serving_path_args(p)
    add_bench_args(p)
    p.set_defaults(func=run)


def add_deployment_args(p) -> None:
    """The deployment (model, GPU, parallelism, memory) and policy flags ``simulate`` and
    ``replay`` share."""
    from pagesim.engine.catalog.kv_layout import KV_CACHE_DTYPES
    from pagesim.engine.catalog.params import WEIGHT_FORMATS
    from pagesim.engine.commands.policy_args import add_policy_args
    from pagesim.sim.hardware import GPU_PRESETS
    from pagesim.sim.setup import ALLOCATORS

    g = p.add_argument_group("deployment")
    g.add_argument("--model", default="llama3-8b", help="catalog name (pagesim presets lists them; Hugging Face ids "
                   "such as meta-llama/Llama-3.1-8B-Instruct resolve) or a config.json / folder (default llama3-8b)")
    g.add_argument("--gpu", default=DEFAULT_GPU, metavar="GPU",
                   help=f"{', '.join(GPU_PRESETS)}, or an alias such as h100 or a100 (default {DEFAULT_GPU})")
    g.add_argument("--tp", "-tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                   help="tensor-parallel GPUs per replica (default 1; vLLM's --tensor-parallel-size)")
    g.add_argument("--ep", type=int, default=1, metavar="N",
                   help="expert parallelism: spread an MoE model's experts over the replica's N = --tp GPUs "
                        "(vLLM's --enable-expert-parallel; default 1: each expert sliced over the GPUs)")
    g.add_argument("--dtype", default="auto", choices=["auto", *WEIGHT_FORMATS],
                   help="weight format (default auto: as the checkpoint ships, e.g. DeepSeek V3 fp8, gpt-oss "
                        "mxfp4 experts); fp8 stores linear-layer weights in one byte")
    g.add_argument("--kv-cache-dtype", default="auto", choices=[k for k in KV_CACHE_DTYPES if "32" not in k],
                   help="KV-cache element type (default auto: the model's; fp8 halves it, as vLLM's)")
    g.add_argument("--disable-hybrid-kv-cache-manager", dest="hybrid_kv", action="store_false",
                   help="keep sliding-window layers' whole context in full-attention groups (vLLM's flag)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="F",
                   help="share of GPU memory for weights, activations and KV cache (default 0.9)")
    g.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks", type=int, metavar="N",
                   help="KV-cache blocks (overrides the memory budget; vLLM's --num-gpu-blocks-override)")
    g.add_argument("--kv-cache-gb", type=float, metavar="GIB", help="KV-cache GiB per GPU (overrides the budget)")
    g.add_argument("--swap-space", type=float, default=4.0, metavar="GIB", help="CPU swap GiB per GPU (default 4)")
    s = add_policy_args(p)
    s.add_argument("--allocator", default="paged", choices=list(ALLOCATORS),
                   help="paged blocks, or a contiguous baseline reserving max / pow2 / oracle lengths")
    s.add_argument("--placement", choices=["buddy", "first-fit"], default="buddy",
                   help="contiguous baselines: where slabs go (default buddy, as the PagedAttention paper assumed)")


def run_spec_from_args(args):
    from pagesim.engine.commands.policy_args import policy_overrides
    from pagesim.sim.setup import RunSpec

    overrides = policy_overrides(args)
    return RunSpec(
        model=args.model, gpu=args.gpu, tp=args.tp, ep=args.ep, weight_dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype, hybrid_kv=args.hybrid_kv, policy=args.policy, allocator=args.allocator,
        placement=args.placement,
        block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks, kv_cache_gb=args.kv_cache_gb,
        gpu_memory_utilization=args.gpu_memory_utilization, swap_space_gb=args.swap_space,
        kv_offloading_gb=args.kv_offloading_size, num_offload_blocks=args.num_offload_blocks,
        max_model_len=args.max_model_len, overrides=overrides, cost_params=cost_params_from_args(args),
        record_decisions=args.out is not None, profile=args.profile, plugins=tuple(args.plugin), scheduler=args.scheduler or "default",
    )


def add_cost_args(group) -> None:
    """``--attention-kernel`` and ``--cost-param``: the roofline's settings."""
    from pagesim.sim.cost.roofline import ATTENTION_KERNELS

    group.add_argument("--attention-kernel", choices=list(ATTENTION_KERNELS), default="flash",
                       help="paged decode kernel the roofline times: flash (default: FlashAttention / FlashInfer "
                            "paged KV, as vLLM runs today, no per-block cost) or paged-2023 (the PagedAttention "
                            "paper's kernel, 1.25x at 16-token blocks)")
    group.add_argument("--cost-param", action="append", default=[], metavar="NAME=VALUE",
                       help="roofline parameter override, e.g. cpu_step_s=0.004 (repeatable; wins over "
                            "--attention-kernel)")


def cost_params_from_args(args) -> dict[str, float]:
    """The roofline overrides of the serving path (``pagesim.sim.serving_path.roofline_overrides``),
    ``--attention-kernel`` and then ``--cost-param``; none with ``--profile`` (measured costs)."""
    from pagesim.sim.serving_path import roofline_overrides, serving_path_from_args

    kernel = getattr(args, "attention_kernel", "flash")
    if getattr(args, "profile", None) is not None:
        if kernel != "flash":
            raise ValueError("--attention-kernel chooses the roofline's kernel; with --profile the costs are measured")
        return _cost_params(args.cost_param)
    path = serving_path_from_args(args, args.policy) if hasattr(args, "serving_path") else None
    return {**roofline_overrides(path, kernel), **_cost_params(args.cost_param)}


def _cost_params(items: list[str]) -> dict[str, float]:
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            params[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--cost-param expects NAME=NUMBER, got {item!r}")
    return params


def run(args: argparse.Namespace) -> int:
    from pagesim.engine.atomic import OutputFolder
    from pagesim.sim.bench_result import reserve_result_file
    from pagesim.sim.bench_args import bench_settings
    from pagesim.sim.bench_output import save_bench_result
    from pagesim.sim.output import OUT_FILES, rejection_words, summary_table
    from pagesim.traces.source import has_source, reported_warnings, trace_from_args

    from pagesim.sim.fit.profile_file import apply_profile

    profile_words = apply_profile(args, "simulate")  # a fitted profile becomes roofline parameters here
    bench = bench_settings(args)
    if not has_source(args):
        for key, value in DEFAULT_SOURCE.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    for flag in ("tp", "ep", "num_gpu_blocks", "replicas"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    from pagesim.sim.disagg.cli import is_disaggregated

    disaggregated = is_disaggregated(args)
    router = _router(args)
    tolerance = _profile_tolerance(args)
    folder = OutputFolder(args.out, OUT_FILES) if args.out else None  # a bad --out is refused before any work
    reserve_result_file(bench)  # and a bad --result-filename
    with reported_warnings("simulate", strict=args.strict):
        trace = trace_from_args(args)
    _check_profile(args, tolerance)
    # the files are built in a partial folder beside --out and renamed into place once all are written
    if disaggregated:
        return _run_disaggregated(args, bench, trace, folder)
    with folder if folder is not None else contextlib.nullcontext() as staging:
        cluster, result, info, wall_s = _simulate(args, bench, trace, router, staging)
    if profile_words:  # (cost_model stays the model's name: roofline or calibrated)
        result.summary["profile"] = {"kind": "fitted", "path": args.fitted_profile, "words": profile_words}
    elif args.profile:
        result.summary["profile"] = {"kind": "kernel-timed", "path": str(args.profile)}
    summary = {**result.summary, "sim_wall_s": round(wall_s, 3)}
    if bench.save_result:
        path = save_bench_result(args, bench, trace, result, cluster.replicas, summary, info)
        print(f"pagesim simulate: wrote {path}", file=sys.stderr)
    if args.json:
        words = rejection_words(result.summary)
        if words:  # (the table says it on its first line)
            print(f"pagesim simulate: note: {words}", file=sys.stderr)
        print(json.dumps(summary, sort_keys=True))
    else:
        print(summary_table(result.summary, info, wall_s))
        if folder is not None:
            logs_written = "decisions-replica-K.jsonl" if args.replicas > 1 else "decisions.jsonl"
            print(f"wrote {folder.target}/: summary.json run_info.json requests.csv steps.csv {logs_written} "
                  "timeline.json")
    return 0


def _run_disaggregated(args: argparse.Namespace, bench, trace, folder) -> int:
    """``simulate`` with a prefill and a decode pool (``pagesim.sim.disagg.cli``)."""
    from pagesim.sim.disagg.cli import simulate_disagg, summary_lines

    with folder if folder is not None else contextlib.nullcontext() as staging:
        result, info, wall_s = simulate_disagg(args, bench, trace, staging, run_spec=run_spec_from_args(args),
                                               options=sim_options(args, bench, step_rows=staging is not None),
                                               progress=_progress(len(trace), disable=args.no_progress))
    summary = {**result.summary, "sim_wall_s": round(wall_s, 3)}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(summary_lines(result.summary, wall_s))
        if folder is not None:
            print(f"wrote {folder.target}/: summary.json run_info.json requests.csv decisions-prefill-K.jsonl "
                  "decisions-decode-K.jsonl")
    return 0


def _profile_tolerance(args: argparse.Namespace) -> float:
    """``--check-profile`` / ``--profile-tolerance`` checked against ``--profile``, before any work."""
    from pagesim.engine.calibrate.probe import tolerance_from

    if args.profile is None and (args.check_profile or args.profile_tolerance is not None):
        raise ValueError("--check-profile and --profile-tolerance check a calibration profile: give --profile FILE")
    if args.profile_tolerance is not None and not args.check_profile:
        raise ValueError("--profile-tolerance applies with --check-profile")
    return tolerance_from(args.profile_tolerance)


def _check_profile(args: argparse.Namespace, tolerance: float) -> None:
    """With ``--profile``: warn when it was measured on a busy machine; with ``--check-profile``
    also re-time its probe and compare its fingerprint (``pagesim.engine.calibrate.probe``); with
    ``--strict`` alone compare the fingerprint (device, threads, Python and torch versions) without
    re-timing, so a profile of another device stops the run there too."""
    if args.profile is None:
        return
    from pagesim.engine.calibrate.probe import busy_warning, show_warnings
    from pagesim.sim.cost.profile import load_profile

    profile = load_profile(args.profile)
    if args.check_profile:
        from pagesim.engine.calibrate.probe import check_profile

        print("pagesim simulate: re-timing the profile's probe", file=sys.stderr, flush=True)
        warnings = check_profile(profile, tolerance=tolerance).warnings
    elif args.strict:  # a profile of another device or setup is refused without re-timing its probe
        from pagesim.engine.calibrate.probe import check_profile

        warnings = check_profile(profile, tolerance=tolerance, retime=False).warnings
    else:
        warnings = [w for w in [busy_warning(profile)] if w]
    show_warnings("simulate", args.profile, warnings, strict=args.strict)


def _simulate(args: argparse.Namespace, bench, trace, router, out: Path | None):
    """Build and run the deployment, writing ``--out``'s files into ``out`` (the partial folder);
    returns the cluster, its result, the run's description and the wall seconds it took."""
    from pagesim.engine.output_folders import create_text
    from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS, abort_words
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.output import write_json, write_tables, write_timeline
    from pagesim.sim.errors import SimulationStalled

    builts = build_replicas(run_spec_from_args(args), args.replicas)
    built = builts[0]
    options = sim_options(args, bench, step_rows=out is not None)
    info = {"trace": f"{len(trace)} requests from {trace.source}" + _trace_words(trace), "deployment": built.describe(),
            "options": {k: _plain(getattr(options, k)) for k in options.__slots__}, "command": sys.argv[1:]}
    clustered = args.replicas > 1
    if clustered:
        info["cluster"] = {"replicas": args.replicas, "router": router.describe()}

    # one decision log per replica (each replica's scheduler numbers its own steps), streamed during the run
    log_names = [f"decisions-replica-{k}.jsonl" for k in range(args.replicas)] if clustered else ["decisions.jsonl"]
    logs = [create_text(out / name, encoding="ascii") for name in log_names] if out is not None else []
    progress = _progress(len(trace), disable=args.no_progress)
    try:
        cluster = Cluster(trace, [(b.scheduler, b.cost_model) for b in builts], router, options, tp=args.tp,
                          decision_sinks=[f.write for f in logs] if logs else None,
                          progress=progress.update if progress else None, block_bytes=replica_block_bytes(built))
        started = time.perf_counter()
        try:
            result = cluster.run()
        except VLLM_V0_ABORTS as exc:  # the vllm-v0 preset stops where vLLM 0.6.3 aborts
            raise ValueError(abort_words(exc)) from None
        except SimulationStalled as exc:
            raise ValueError(f"the scheduler stopped making progress: {exc}") from None
        wall_s = time.perf_counter() - started
    finally:
        if progress:
            progress.close()
        for f in logs:
            f.close()
    result.summary["cost_model"] = built.cost_model.name
    extrapolated = Counter()
    for b in builts:
        extrapolated.update(getattr(b.cost_model, "extrapolated", {}))
    if args.profile:
        result.summary["cost_model_extrapolated"] = dict(extrapolated)
        if extrapolated:
            print(f"pagesim simulate: note: some step costs lay outside the profile's measured grid and came from its "
                  f"fitted roofline form ({', '.join(f'{k}: {v} steps' for k, v in sorted(extrapolated.items()))})",
                  file=sys.stderr)
    if out is not None:
        ids = [f"r{i}" for i in range(len(trace))]
        write_json(out / "summary.json", result.summary)
        from pagesim.engine import COMPILED

        write_json(out / "run_info.json", {**info, "sim_wall_s": wall_s, "versions": _versions(),
                                           "compiled_modules": COMPILED})  # (pagesim/engine/compiled.py)
        write_tables(out, result, ids, block_bytes=built.deployment.block_bytes_per_gpu(args.block_size),
                     replica_of=result.replica_of if clustered else None)
        write_timeline(out / "timeline.json", result, ids,
                       step_replica=result.steps.replica_index() if clustered else None)
    return cluster, result, info, wall_s


def sim_options(args: argparse.Namespace, bench, *, step_rows: bool):
    """The run's ``SimOptions`` from simulate's flags and the bench settings (SLOs, percentiles, client)."""
    from pagesim.sim.bench_args import summary_slo
    from pagesim.sim.serving_path import serving_path_from_args
    from pagesim.sim.simulator import SimOptions

    slo = summary_slo(bench, args.slo_ttft, args.slo_tpot)
    return SimOptions(seed=args.seed, sample_lengths=args.sample_lengths, overlap_swaps=args.overlap_swaps,
                      slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s, slo_e2el_s=slo.e2el_s,
                      percentiles=bench.summary_percentiles, max_concurrency=bench.max_concurrency,
                      skip_ahead=args.skip_ahead, step_rows=step_rows,
                      serving_path=serving_path_from_args(args, args.policy),
                      request_timeout_s=bench.request_timeout_s)


def _plain(value):
    """An option as run_info.json holds it (a serving path as its settings)."""
    return value.describe() if hasattr(value, "describe") else value


def replica_block_bytes(built) -> int:
    """One KV block over all the replica's GPUs (what an offload copy moves; vLLM's sizing)."""
    return built.deployment.block_bytes_per_gpu(built.scheduler.config.block_size) * built.deployment.tp


def _trace_words(trace) -> str:
    """How the requests were sent and counted, when a front end says (datasets, --request-rate inf)."""
    words = []
    if trace.metadata.get("arrivals"):
        words.append(f"sent {trace.metadata['arrivals']}")
    if trace.metadata.get("tokenizer"):
        words.append(f"tokens counted by {trace.metadata['tokenizer']}")
    return f" ({'; '.join(words)})" if words else ""


def _router(args):
    """The run's router; its flags are checked before anything is built."""
    from pagesim.sim.router import make_router

    params = {}
    if args.affinity_slack is not None:
        params["affinity_slack"] = args.affinity_slack
    if args.affinity_slack_tokens is not None:
        params["affinity_slack_tokens"] = args.affinity_slack_tokens
    if params and args.router != "prefix-affinity":
        raise ValueError("--affinity-slack and --affinity-slack-tokens apply to --router prefix-affinity only")
    return make_router(args.router, **params)


def _progress(total: int, *, disable: bool):
    """A bar on a terminal, a line a minute otherwise (``pagesim.engine.progress``); None with --no-progress."""
    from pagesim.engine.progress import progress

    return progress("simulate", "simulating", total, "requests", disable=disable)


def _versions() -> dict:
    import importlib.metadata as md
    import platform

    versions = {"python": platform.python_version()}
    for name in ("pagesim", "simpy", "numpy"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return versions
