"""pagesim replay DIR: an inference-perf run's workload and load stages through the simulator, and
what the run measured beside what the simulator predicts (``pagesim.sim.replay``).

DIR is an inference-perf results folder (``config.yaml`` and its ``*_lifecycle_metrics.json``)
or the experiment folder above it, whose ``exp-config.yaml`` gives the model, the tensor
parallelism and vLLM's limits; flags given here win. The GPU is not recorded in either file, so
``--gpu`` is required. The server is taken to be vLLM V1 (``--policy vllm-v1``, serving path
``vllm``) unless told otherwise, and each request runs under the client's timeout (inference-perf's
``request_timeout``, else aiohttp's 300 s). Without measurements it simulates the run and prints
the predicted figures alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path


def add_parser(subparsers) -> None:
    from pagesim.sim.cli import add_cost_args, add_deployment_args
    from pagesim.sim.serving_path import add_serving_path_args

    p = subparsers.add_parser(
        "replay", help="replay an inference-perf run through the simulator: measured vs predicted latency",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    p.add_argument("run_dir", metavar="DIR", help="an inference-perf results folder, or the experiment folder above it")
    add_deployment_args(p)
    # (filled from the run's files when not given: nothing is simulated on a guess)
    p.set_defaults(model=None, gpu=None, tp=None, policy="vllm-v1")
    o = p.add_argument_group("simulation")
    o.add_argument("--seed", type=int, default=0,
                   help="redraws the run's send times and prompt order (inference-perf's are not recorded; default 0)")
    add_cost_args(o)
    o.add_argument("--profile", metavar="FILE",
                   help="a fitted profile (pagesim calibrate --from-measurements): its parameters instead of the "
                        "roofline's defaults")
    o.add_argument("--request-timeout", type=float, metavar="S",
                   help="the client's timeout in seconds (default: the run's: inference-perf's request_timeout, "
                        "else aiohttp's 300 s)")
    o.add_argument("--no-skip-ahead", dest="skip_ahead", action="store_false",
                   help="run every step one by one (same results, slower)")
    o.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    o.add_argument("--save-result", action="store_true",
                   help="also write the comparison as JSON to --result-dir/--result-filename")
    o.add_argument("--result-dir", metavar="DIR", default=".", help="where --save-result writes (default .)")
    o.add_argument("--result-filename", metavar="NAME",
                   help="the file --save-result writes (default replay-<the run's folder name>.json)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    add_serving_path_args(p)
    p.set_defaults(func=run)


def fill_from_run(args: argparse.Namespace, run) -> None:
    """The model, tensor parallelism and vLLM limits the run's files state, where the command line
    did not give them; the GPU must be given."""
    server = run.server
    if args.gpu is None:
        raise ValueError("give --gpu: an inference-perf run does not record the GPU it ran on "
                         "(the shared H100 runs: --gpu h100-sxm)")
    if args.model is None:
        args.model = server.model or run.model_name
        if args.model is None:
            raise ValueError(f"{run.config_file}: neither server.model_name nor exp-config.yaml's model names "
                             "the model: give --model")
    if args.tp is None:
        args.tp = server.tensor_parallelism or 1
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(args, name) is None and getattr(server, name) is not None:
            setattr(args, name, getattr(server, name))


@dataclass
class ReplayRun:
    """One measured run simulated: its comparison rows and what produced them."""

    rows: list  # pagesim.sim.replay.Comparison, per stage then the whole run
    settings: dict  # the deployment and options simulated, as the JSON report states them
    built: object  # the replica (pagesim.sim.cluster.build_replicas)
    path: object  # the serving path (None: the plain one)
    wall_s: float


def simulate_trace(args: argparse.Namespace, trace, *, timeout_s: float | None, max_concurrency: int | None = None,
                   progress=None):
    """``trace`` through one replica as ``args`` (replay's flags) set it up: ``(built, path,
    result)``, the replica, its serving path and the run's ``SimResult``. A measured run's trace
    here (``simulate_run``) or a vLLM bench file's (``pagesim.sim.fit.evaluate``)."""
    from pagesim.sim.cli import run_spec_from_args
    from pagesim.sim.cluster import Cluster, build_replicas
    from pagesim.sim.serving_path import serving_path_from_args
    from pagesim.sim.simulator import SimOptions

    args.out = None  # (run_spec_from_args: no decision log)
    built = build_replicas(run_spec_from_args(args), 1)[0]
    path = serving_path_from_args(args, args.policy)
    options = SimOptions(seed=args.seed, skip_ahead=args.skip_ahead, step_rows=False, serving_path=path,
                         max_concurrency=max_concurrency, request_timeout_s=timeout_s)
    result = Cluster(trace, [(built.scheduler, built.cost_model)], None, options, tp=args.tp,
                     progress=progress).run()
    return built, path, result


def simulate_run(args: argparse.Namespace, measured_run, progress=None) -> ReplayRun:
    """``measured_run`` (an ``InferencePerfRun``, with ``fill_from_run(args, ...)`` done) through the
    simulator as ``args`` set it up, compared stage by stage (``pagesim.sim.replay.compare``);
    ``progress``: called with the number of requests finished. ``pagesim calibrate
    --from-measurements`` calls it at every parameter point it tries."""
    from pagesim.sim.cli import _plain
    from pagesim.sim.replay import compare

    trace = measured_run.trace(seed=args.seed)
    timeout_s = measured_run.client_timeout_s if args.request_timeout is None else args.request_timeout
    built, path, result = simulate_trace(args, trace, timeout_s=timeout_s, progress=progress)
    settings = {"model": built.deployment.model.name, "gpu": built.deployment.gpu.name, "tp": args.tp,
                "policy": args.policy, "max_num_seqs": built.scheduler.config.max_num_seqs,
                "max_num_batched_tokens": built.scheduler.config.max_num_batched_tokens,
                "max_model_len": built.scheduler.config.max_model_len,
                "attention_kernel": args.attention_kernel, "serving_path": _plain(path) if path else "none",
                "client_timeout_s": timeout_s, "seed": args.seed,
                "num_offload_blocks": built.scheduler.config.num_offload_blocks,
                "offload_connector": built.scheduler.config.offload_connector if built.scheduler.config.num_offload_blocks
                else None}
    return ReplayRun(compare(measured_run, trace, result.requests), settings, built, path, result.wall_s)


def run(args: argparse.Namespace) -> int:
    from pagesim.sim.fit.profile_file import apply_profile
    from pagesim.sim.replay import format_table, median_abs_errors
    from pagesim.sim.serving_path import path_words
    from pagesim.traces.inference_perf import read_inference_perf

    measured_run = read_inference_perf(args.run_dir)
    fill_from_run(args, measured_run)
    profile_words = apply_profile(args, "replay")  # a fitted profile's parameters; a kernel-timed one is refused
    progress = None
    if not args.no_progress:
        from pagesim.engine.progress import progress as make_progress

        progress = make_progress("replay", "simulating", measured_run.num_requests, "requests", disable=False)
    try:
        done = simulate_run(args, measured_run, progress.update if progress else None)
    finally:
        if progress:
            progress.close()
    rows, settings, built, path = done.rows, done.settings, done.built, done.path
    if profile_words:
        settings["profile"] = profile_words
    report = {"run": str(measured_run.results_dir), "workload": measured_run.workload, "settings": settings,
              "rows": [row.to_json() for row in rows], "median_abs_errors": median_abs_errors(rows),
              "sim_wall_s": done.wall_s}
    if args.save_result:
        from pagesim.sim.output import write_json

        name = args.result_filename or f"replay-{_run_name(measured_run.results_dir)}.json"
        write_json(Path(args.result_dir) / name, report)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(measured_run.describe())
    print(f"simulated: {settings['model']} on {settings['gpu']} x{args.tp}, policy {args.policy}, "
          f"{built.batch_limits_words()}, attention kernel {args.attention_kernel}, {_offload_words(built)}"
          f"{path_words(path)}; "
          f"{'cost model: ' + profile_words + '; ' if profile_words else ''}"
          f"seed {args.seed}; "
          f"{done.wall_s:.1f} s wall\n")
    print(format_table(rows))
    sys.stdout.flush()
    return 0


def _offload_words(built) -> str:
    """The offload store, as the summary line says it ("" without one)."""
    config = built.scheduler.config
    if not config.num_offload_blocks:
        return ""
    return f"KV offloading {config.num_offload_blocks:,} blocks (vLLM {config.offload_connector}'s connector), "


def _run_name(results_dir: Path) -> str:
    """The experiment's folder name (the results folder's parent when it is called ``results``)."""
    return results_dir.parent.name if results_dir.name == "results" and results_dir.parent.name else results_dir.name
