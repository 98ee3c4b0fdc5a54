"""pagesim validate: run the real engine and the calibrated simulator on one workload and compare them.

Reports whether their decision logs are identical (engine in step-lockstep with the simulator),
whether the engine's outputs equal the no-paging reference, and how far the simulator's step
times, TTFT, TPOT, end-to-end latency and throughput are from the engine's on the wall clock,
next to how far two runs of the same engine are apart (``noise``). With no request source it
validates the default: 64 ``kwon2023-alpaca`` requests at 16 requests/s. The engine runs with the
profile's model shapes, dtype, attention backend and CPU thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_SOURCE = {"workload": "kwon2023-alpaca", "rate": 16.0, "num_requests": 64}
OUT_FILES = ("validation.json", "steps.csv", "validation.pdf")  # what --out DIR holds
DEFAULT_GPU_BLOCKS = 128
DEFAULT_CPU_BLOCKS = 64


def add_parser(subparsers) -> None:
    from pagesim.engine.commands.policy_args import add_policy_args
    from pagesim.engine.threads import add_threads_arg
    from pagesim.traces.source import add_source_args

    p = subparsers.add_parser("validate", help="compare the calibrated simulator with the real engine on a workload",
                              description=__doc__.splitlines()[0])
    add_source_args(p)
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="tiny", help="preset or Hugging Face Llama folder, of the profile's shapes "
                   "(default tiny)")
    g.add_argument("--model-seed", type=int, default=0, metavar="S", help="seed of random weights (default 0)")
    g.add_argument("--profile", required=True, metavar="FILE", help="calibration profile (pagesim calibrate)")
    g.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks", type=int,
                   default=DEFAULT_GPU_BLOCKS, metavar="N",
                   help=f"KV-cache blocks (default {DEFAULT_GPU_BLOCKS})")
    g.add_argument("--num-cpu-blocks", type=int, default=DEFAULT_CPU_BLOCKS, metavar="N",
                   help=f"CPU swap blocks (default {DEFAULT_CPU_BLOCKS})")
    add_threads_arg(g, "default: the profile's, as it was measured; on a CUDA profile pagesim run's default")
    add_policy_args(p)
    g.add_argument("--profile-tolerance", type=float, default=None, metavar="F",
                   help="how far the profile's probe, re-timed here, may be from its time at calibration either way "
                        "(geometric mean of its points) before validate warns (default 0.2: 0.83x to 1.2x); --strict "
                        "makes it an error")
    o = p.add_argument_group("output")
    o.add_argument("--noise-runs", type=int, default=1, metavar="K",
                   help="replay the engine's run step for step, and run it K more times, to measure how far the "
                        "engine is from itself (default 1; 0 skips both)")
    o.add_argument("--no-reference", action="store_true", help="skip checking outputs against the no-paging reference")
    o.add_argument("--json", action="store_true", help="print the report as one JSON object")
    o.add_argument("--out", metavar="DIR", help="write validation.json, steps.csv and validation.pdf (figures) here")
    o.add_argument("--no-progress", action="store_true",
                   help="no line per phase, nor a line a minute when stderr is not a terminal (warnings stay)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagesim.engine.commands.policy_args import policy_overrides
    from pagesim.engine.runtime.cli import refuse_priority_on_the_engine
    from pagesim.sim.cost.profile import load_profile
    from pagesim.traces.source import reported_warnings, trace_from_args

    from pagesim.traces.source import has_source

    if not has_source(args):
        for key, value in DEFAULT_SOURCE.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    if args.workload is not None and args.rate is None and args.arrival is None:
        raise ValueError("validate compares timing under arrivals: give --rate R (or --arrival) with --workload")
    for flag, low in (("num_gpu_blocks", 1), ("num_cpu_blocks", 0), ("noise_runs", 0)):
        if getattr(args, flag) < low:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= {low}, got {getattr(args, flag)}")
    from pagesim.engine.threads import checked_threads

    checked_threads(args.threads)
    from pagesim.engine.calibrate.probe import tolerance_from

    tolerance = tolerance_from(args.profile_tolerance)
    from pagesim.engine.atomic import OutputFolder

    # --out is built beside DIR and renamed into place once whole; a DIR holding other files (or
    # an unsafe one: engine.outputs) is refused now, before the runs
    folder = OutputFolder(args.out, OUT_FILES) if args.out else None
    out = folder.target if folder is not None else None
    profile = load_profile(args.profile)
    overrides = policy_overrides(args)  # loads --plugin files
    refuse_priority_on_the_engine(overrides, "validate")
    with reported_warnings("validate", strict=args.strict):
        trace = trace_from_args(args)

    import torch

    from pagesim.engine.calibrate.calibrate import model_shapes
    from pagesim.engine.model import load_model
    from pagesim.engine.model.weights import DTYPES as TORCH_DTYPES, model_config
    from pagesim.engine.policy import make_config
    from pagesim.engine.policy.plugins.user import scheduler_class
    from pagesim.reports.validation.validate import validate
    from pagesim.engine.runtime.kv_cache import scheduler_kv_settings
    from pagesim.sim.cost.calibrated import CalibratedCostModel

    device = torch.device(profile.device["type"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"the profile was measured on CUDA ({profile.device.get('name')}); CUDA is not available here")
    config = model_config(args.model)
    dtype = TORCH_DTYPES[profile.model["dtype"]]
    differ = profile.shape_differences(model_shapes(config, dtype))
    if differ:
        raise ValueError(f"--model {args.model} differs from the profile's {profile.model['name']}: {', '.join(differ)}")
    max_model_len = args.max_model_len or config.max_position_embeddings
    too_long = [i for i in range(len(trace)) if trace.prompt_len[i] + trace.output_len[i] > max_model_len]
    if too_long:
        i = too_long[0]
        raise ValueError(f"{len(too_long)} of {len(trace)} requests are longer than the context of {max_model_len} "
                         f"tokens (e.g. r{i}: {int(trace.prompt_len[i])} + {int(trace.output_len[i])})")
    sched_config = make_config(args.policy, block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks,
                               num_cpu_blocks=args.num_cpu_blocks, max_model_len=max_model_len, record_decisions=True,
                               **scheduler_kv_settings(config), **overrides)
    _set_threads(args, profile, device)
    check = _check_profile(profile, args, tolerance)
    model = load_model(args.model, seed=args.model_seed, dtype=dtype, device=device)
    cost_model = CalibratedCostModel(profile)
    cost_model.check_model(config.preset)

    from pagesim.engine.progress import ProgressLines

    ticker = None if args.no_progress or sys.stderr.isatty() else ProgressLines("validate", "starting", None, "")

    def log(msg: str) -> None:  # a phase (a line a minute within it, off a terminal), or a warning
        if ticker is not None and not msg.startswith("warning"):
            ticker.set_description(msg)
        if not args.no_progress or msg.startswith("warning"):
            print(f"pagesim validate: {msg}", file=sys.stderr, flush=True)

    try:
        result = validate(trace, sched_config, scheduler_class(args.scheduler), model, cost_model,
                          backend=str(profile.settings.get("backend", "auto")), seed=args.seed,
                          noise_runs=args.noise_runs, check_reference=not args.no_reference, log=log)
    finally:
        if ticker is not None:
            ticker.close()
    report = {"workload": trace.source, "model": config.name, "profile": str(args.profile),
              "profile_measured": profile.describe(), "profile_check": check.to_dict(),
              "block_size": sched_config.block_size,
              "num_gpu_blocks": sched_config.num_gpu_blocks, **result.report}
    if folder is not None:
        with folder as staging:
            _write_out(staging, report, result, profile)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(text_summary(report))
        if out is not None:
            print(f"wrote {out}/: validation.json steps.csv validation.pdf")
    ok = report["decision_logs_identical"] and report["outputs_match_reference"] is not False
    return 0 if ok else 1


def _set_threads(args: argparse.Namespace, profile, device) -> None:
    """torch's CPU threads (``pagesim.engine.threads``): the profile's count unless ``--threads`` says
    otherwise, which is a warning (an error with ``--strict``): the engine is then not timed as the
    profile was."""
    from pagesim.engine.threads import default_threads, set_threads

    measured = int(profile.settings.get("threads") or 0) if device.type == "cpu" else 0  # (0: not recorded)
    if args.threads is not None and measured and args.threads != measured:
        said = (f"--threads {args.threads}: the profile was measured with {measured} CPU thread(s), so the engine's "
                f"step times are not measured as the profile's were")
        if args.strict:
            raise ValueError(f"{said} (--strict)")
        print(f"pagesim validate: warning: {said}", file=sys.stderr)
    set_threads(args.threads or measured or (1 if device.type == "cpu" else default_threads()))


def _check_profile(profile, args: argparse.Namespace, tolerance: float):
    """Re-time the profile's probe and compare its fingerprint and load (``pagesim.engine.calibrate.probe``):
    each finding is a warning, or with ``--strict`` an error before the runs."""
    from pagesim.engine.calibrate.probe import check_profile, show_warnings

    if not args.no_progress:
        print("pagesim validate: re-timing the profile's probe", file=sys.stderr, flush=True)
    check = check_profile(profile, tolerance=tolerance)
    show_warnings("validate", args.profile, check.warnings, strict=args.strict)
    return check


def _write_out(out: Path, report: dict, result, profile) -> None:
    """``OUT_FILES`` into ``out``, a new (partial) folder: each a new file, never through a link."""
    import csv

    from pagesim.engine.output_folders import create_text
    from pagesim.reports.validation import plots

    with create_text(out / "validation.json") as f:
        f.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    with create_text(out / "steps.csv", encoding="ascii", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "measured_s", "predicted_s"])
        for i, (m, p) in enumerate(zip(result.measured_steps, result.predicted_steps)):
            w.writerow([i, f"{m:.9f}", f"{p:.9f}"])
    plots.write_pdf(out / "validation.pdf", [
        plots.step_page(result.measured_steps, result.predicted_steps, report["step_time_mape"]),
        plots.latency_page(result.sim.result.requests, result.engine_metrics, report),
        plots.error_parts_page(report),
        plots.calibration_page(profile),
    ])


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def text_summary(r: dict) -> str:
    lines = [
        f"validation of {r['workload']} ({r['requests']} requests) on {r['model']} ({r.get('threads')} CPU "
        f"thread{'' if r.get('threads') == 1 else 's'}), profile {r['profile_measured']}",
        f"  decision logs identical   {r['decision_logs_identical']} ({r['decision_log_steps']['engine']} engine steps)",
        f"  outputs match reference   {r['outputs_match_reference']}",
        f"  step time MAPE            {r['step_time_mape']:.2%}" if r["step_time_mape"] is not None else
        "  step time MAPE            n/a",
    ]
    noise = r.get("noise")
    if noise and noise.get("step_time_mape") is not None:
        lines[-1] += (f"   (engine vs its own replay of the same steps: {noise['step_time_mape']:.2%}; mean step "
                      f"{_pct(r['step_time']['total_error'])} vs {_pct(noise['step_time_total_error'])})")
    sim_steps = r.get("simulator_step_time") or {}
    if sim_steps.get("mape") is not None:
        lines.append(f"    on the simulator's steps  {sim_steps['mape']:.2%}   (mean step {_pct(sim_steps['total_error'])}; "
                     f"its {sim_steps['steps']} steps as the engine in lockstep timed them)")
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end")):
        m = r[name]
        line = (f"  {label:<11} mean {_pct(m['mean_error'])}  p50 {_pct(m['p50_error'])}  p99 {_pct(m['p99_error'])}  "
                f"MAPE {m['mape']}  KS {m['ks']}")
        if noise:
            n = noise[name]
            line += f"   (engine vs engine: mean {_pct(n['mean_error'])}, p50 {_pct(n['p50_error'])}, KS {n['ks']})"
        lines.append(line)
        parts = (r.get("error_parts") or {}).get(name)
        if parts:
            lines.append(f"  {'':<11} mean {_pct(parts['mean_error'])} = step time {_pct(parts['step_time'])} + "
                         f"decisions {_pct(parts['decisions'])} + queue wait {_pct(parts['queue_wait'])} + "
                         f"between steps {_pct(parts['between_steps'])}")
    t = r["throughput"]
    lines.append(f"  throughput  requests/s {_pct(t['throughput_rps_error'])}  tokens/s {_pct(t['throughput_tokens_s_error'])}")
    if r.get("first_difference"):
        d = r["first_difference"]
        lines.append(f"  first difference at step {d['step']}: keys {', '.join(d['differing_keys'])}")
    if r.get("wall_clock_decisions_identical") is not None:
        lines.append(f"  the engine's wall-clock run made the simulator's decisions: {r['wall_clock_decisions_identical']} "
                     f"(step-time error over the steps requests lived through: "
                     f"{_pct(r.get('step_time_error_over_lifetimes'))})")
    check = r.get("profile_check")
    if check:
        if check.get("probe_ratio") is not None:
            lines.append(f"  profile probe  {check['probe_then_s'] * 1e3:.3g} ms at calibration, "
                         f"{check['probe_now_s'] * 1e3:.3g} ms now (per point {check['probe_ratio']:.2f}x, geometric mean: "
                         f"{'within' if check['probe_ok'] else 'NOT within'} {check['tolerance']:.0%}); the profile's "
                         f"tables at those points {check['probe_profile_s'] * 1e3:.3g} ms")
        for warning in check.get("warnings", []):
            lines.append(f"  warning: {warning}")
    lines.append("  targets: " + ", ".join(f"{k} {'met' if v['met'] else 'NOT met'}" for k, v in r["targets"].items()))
    return "\n".join(lines)
