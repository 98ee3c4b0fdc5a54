"""pagesim calibrate: time the engine's kernels, layers, sampler and policy on this device into a profile.

At the shapes of ``--model`` (random weights; one layer timed, the cost model scales by the layer
count) and the dtype and attention backend the engine would use there. On CPU the run is pinned
to ``--threads`` intra-op threads (default 1: steadier on a shared machine), which is recorded in
the profile; ``pagesim validate`` runs the engine with the same count. Progress goes to stderr;
the profile is rewritten after every table, and running the same command again resumes it. The
profile records the machine's load while it was measured (with a warning when it was busy) and
ends with a probe, a few of its grid points re-timed, which ``pagesim validate`` and ``pagesim
simulate --check-profile`` re-time to tell whether it still describes the machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(subparsers) -> None:
    from pagesim.engine.runtime.cli import DTYPES
    from pagesim.engine.threads import add_threads_arg

    p = subparsers.add_parser("calibrate", help="time the real kernels and policy into a profile for the simulator",
                              description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="(default: cuda if available)")
    p.add_argument("--model", help="preset (tiny, small, llama-125m, llama3-8b, ...) or a Hugging Face Llama folder "
                   "(only its config is read) (default tiny; with --from-measurements: the measurements' own)")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="auto: what pagesim run uses there (float64 on CPU, bfloat16 on CUDA)")
    p.add_argument("--backend", choices=["auto", "torch", "triton"], default="auto",
                   help="attention kernels (auto: triton on CUDA, torch on CPU)")
    add_threads_arg(p, "CPU only; default 1: steady timings on a shared machine; recorded in the profile")
    p.add_argument("--warmup", type=int, default=3, metavar="K", help="untimed calls per grid point (default 3)")
    p.add_argument("--repeats", type=int, default=15, metavar="K", help="timed calls per grid point (default 15)")
    p.add_argument("--quick", action="store_true", help="a thinner grid (every other point) and fewer repeats")
    p.add_argument("--out", default="profile.json", metavar="FILE", help="profile to write (default profile.json)")
    p.add_argument("--force", action="store_true", help="overwrite --out even if it holds another run's profile")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (on a terminal), nor a line per table and a line a minute (otherwise)")
    from pagesim.reports.fit_cli import add_fit_args

    add_fit_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.from_measurements:
        from pagesim.reports.fit_cli import run_fit

        return run_fit(args)
    for flag in ("holdout", "gpu", "tp", "server_flags", "report", "json"):
        if getattr(args, flag):
            raise ValueError(f"--{flag.replace('_', '-')} applies with --from-measurements")
    args.model = args.model or "tiny"
    import torch

    from pagesim.engine.calibrate.calibrate import calibrate
    from pagesim.engine.calibrate.probe import busy_words
    from pagesim.engine.progress import ProgressLines, progress
    from pagesim.engine.model.weights import DTYPES as TORCH_DTYPES, model_config
    from pagesim.engine.runtime.cli import device_for, dtype_for
    from pagesim.engine.threads import checked_threads, set_threads
    from pagesim.kernels.ops import resolve_backend
    from pagesim.sim.cost.profile import profile_output

    for flag in ("warmup", "repeats"):
        if getattr(args, flag) < (0 if flag == "warmup" else 1):
            raise ValueError(f"--{flag} must be >= {0 if flag == 'warmup' else 1}, got {getattr(args, flag)}")
    checked_threads(args.threads)
    device = device_for(args.device, torch)
    if device.type == "cuda" and args.threads is not None:
        raise ValueError("--threads pins CPU intra-op threads; it does not apply to --device cuda")
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise ValueError(f"--out {out}: is a folder; give a file name such as {out / 'profile.json'}")
    if not out.parent.exists():
        raise ValueError(f"--out {out}: folder {out.parent} does not exist")
    profile_output(out)  # only a regular file or nothing is replaced, before any timing (engine.outputs)
    config = model_config(args.model)
    backend = resolve_backend("calibrate", args.backend, device)
    dtype = dtype_for(args.dtype, device, backend, TORCH_DTYPES)
    if backend == "triton" and dtype == torch.float64:
        raise ValueError("the triton backend takes float32, float16 or bfloat16, not float64")
    threads = 0
    if device.type == "cpu":
        threads = set_threads(args.threads or 1)  # (engine.threads: why 1, not run's default)
    repeats = min(args.repeats, 7) if args.quick and args.repeats == 15 else args.repeats
    warmup = min(args.warmup, 2) if args.quick and args.warmup == 3 else args.warmup
    bar = progress("calibrate", "starting", 0, "points", disable=args.no_progress)
    started = time.perf_counter()

    def on_table(name: str, points: int) -> None:
        if bar is None:
            return
        bar.reset(total=points)
        bar.set_description(name)
        if isinstance(bar, ProgressLines):  # not a terminal: a line per table, and a line a minute within
            print(f"pagesim calibrate: {name} ({points} points)", file=sys.stderr, flush=True)

    try:
        profile = calibrate(config, out=out, device=device, dtype=dtype, backend=backend, threads=threads,
                            warmup=warmup, repeats=repeats, quick=args.quick, force=args.force,
                            on_point=(lambda _: bar.update()) if bar is not None else None, on_table=on_table)
    except KeyboardInterrupt as exc:  # (SIGTERM too)
        from pagesim.engine.cli import interrupted_status, interruption

        if bar is not None:
            bar.close()
        print(f"pagesim calibrate: {interruption(exc)}; the tables finished so far are in {out}: run the same command "
              f"to resume", file=sys.stderr)
        return interrupted_status(exc)
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - started
    print(f"wrote {out}: {len(profile.tables)} tables for {profile.describe()}, "
          f"{sum(len(t.median_s) for t in profile.tables.values())} grid points, in {wall:.1f} s; probe "
          f"{len(profile.probe['points'])} points, {profile.probe['total_s'] * 1e3:.3g} ms")
    busy = busy_words(profile.conditions)
    if busy:
        print(f"pagesim calibrate: warning: the machine was busy while calibrating ({busy}): the timings may be "
              f"inflated; calibrate again on a quiet machine (pagesim validate and simulate --check-profile will "
              f"say so too)", file=sys.stderr)
    return 0
