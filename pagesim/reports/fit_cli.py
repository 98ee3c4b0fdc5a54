"""pagesim calibrate --from-measurements: fit the cost model to the measurements a user already has.

Each PATH is a vLLM bench result file (``vllm bench serve --save-result --save-detailed``) or an
inference-perf results folder (or the experiment folder above it, as ``pagesim replay`` reads it);
one fit may span models and tensor-parallel degrees on one GPU (``--gpu``, which neither format
records). Every measurement is simulated as ``pagesim replay`` would simulate it, plus
``--server-flags`` (flags every measured server had, e.g. ``--kv-offloading-size 8``), and the
free parameters (``pagesim.sim.fit.params``) are fitted to them (``pagesim.sim.fit.fit``). The
profile written to ``--out`` records what it was fitted on, the values with their uncertainty and
the error per measurement before and after; ``--holdout`` measurements and leave-one-out over the
fitted ones (with several; ``--no-leave-one-out`` skips it) tell how far it generalizes; ``--report DIR``
writes the measured-vs-predicted page as PDF and HTML. Torch is not needed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

#: calibrate's kernel-timing flags, refused beside --from-measurements (name -> its default)
KERNEL_FLAGS = {"device": "auto", "dtype": "auto", "backend": "auto", "threads": None, "warmup": 3, "repeats": 15,
                "quick": False}


def add_fit_args(p) -> None:
    g = p.add_argument_group("fit to measurements (instead of timing kernels)")
    g.add_argument("--from-measurements", nargs="+", metavar="PATH",
                   help="vLLM bench result files (--save-result --save-detailed) or inference-perf folders to fit to")
    g.add_argument("--holdout", nargs="+", metavar="PATH", default=[],
                   help="measurements the fit does not see, simulated before and after it (beside the leave-one-out "
                        "folds over the fitted ones, which run when there are several)")
    g.add_argument("--gpu", metavar="GPU", help="the GPU the measurements ran on (required: neither format records it)")
    g.add_argument("--tp", type=int, metavar="N",
                   help="tensor-parallel GPUs per replica (default: the experiment's exp-config.yaml, else 1)")
    g.add_argument("--server-flags", default="", metavar="FLAGS",
                   help="flags every measured server had, as pagesim replay takes them, in one quoted string "
                        "(e.g. '--kv-offloading-size 8 --offload-connector 0.15')")
    g.add_argument("--seed", type=int, default=0, help="redraws what the measurements do not record (default 0)")
    g.add_argument("--rounds", type=int, default=2, metavar="K",
                   help="fit rounds, each ending in full runs (default 2; one when nothing offloads)")
    g.add_argument("--max-evaluations", type=int, default=12, metavar="K",
                   help="points the optimizer tries per round, each a run of every measurement (default 12)")
    g.add_argument("--jobs", type=int, metavar="N", help="simulations at once (default: this machine's cores)")
    g.add_argument("--no-leave-one-out", dest="leave_one_out", action="store_false",
                   help="skip the leave-one-out folds")
    g.add_argument("--report", metavar="DIR", help="write the measured-vs-predicted page here (fit.pdf, fit.html)")
    g.add_argument("--json", action="store_true", help="print the profile as JSON instead of the tables")


def run_fit(args: argparse.Namespace) -> int:
    from pagesim.sim.fit.evaluate import Evaluator, default_jobs
    from pagesim.sim.fit.fit import fit
    from pagesim.sim.fit.params import free_params
    from pagesim.sim.fit.profile_file import write_fitted
    from pagesim.sim.fit.summary import format_fit, profile_document

    for name, default in KERNEL_FLAGS.items():
        if getattr(args, name) != default:
            raise ValueError(f"--{name} is for timing kernels; --from-measurements fits to measurements instead")
    if args.gpu is None:
        raise ValueError("--from-measurements needs --gpu: neither vLLM bench files nor inference-perf folders record "
                         "the GPU (the shared H100 runs: --gpu h100-sxm)")
    from pagesim.sim.hardware import resolve_gpu_name

    args.gpu = resolve_gpu_name(args.gpu)  # (the profile names the GPU by its canonical name)
    for flag in ("rounds", "max_evaluations", "jobs", "tp"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out}: is a folder; give a file name such as {out / 'profile.json'}")
    if not out.parent.exists():
        raise ValueError(f"--out {out}: folder {out.parent} does not exist")
    if out.exists() and not args.force:
        raise ValueError(f"--out {out} exists; give --force to replace it")
    report = Path(args.report) if args.report else None
    if report is not None and not report.is_dir():
        if report.exists() or not report.parent.is_dir():
            raise ValueError(f"--report {report}: not a folder, nor one that can be made here")
    paths = list(dict.fromkeys(args.from_measurements))
    held = [p for p in dict.fromkeys(args.holdout) if p not in paths]
    try:
        server_flags = shlex.split(args.server_flags)
    except ValueError as exc:
        raise ValueError(f"--server-flags: {exc}") from None
    settings = {"gpu": args.gpu, "model": args.model, "tp": args.tp, "server_flags": server_flags, "seed": args.seed}
    log = (lambda line: None) if args.json else (lambda line: print(f"pagesim calibrate: {line}", file=sys.stderr,
                                                                    flush=True))
    log(f"reading {len(paths) + len(held)} measurement(s)")
    ev = Evaluator([(p, settings) for p in paths + held], jobs=args.jobs or default_jobs())
    try:
        from pagesim.sim.serving_path import serving_path_from_args

        trained = [a for _, a in ev.loaded[:len(paths)]]
        overlapped = all((path := serving_path_from_args(a, a.policy)) is not None and path.async_scheduling
                         for a in trained)
        free = free_params(max(a.tp for a in trained), overlapped)
        log(f"fitting {', '.join(p.name for p in free)} to {len(paths)} measurement(s) with {ev.jobs} worker(s)"
            + ("; sensitivities from runs without the offloading tier" if ev.two_fidelities else ""))
        result = fit(ev, list(range(len(paths))), list(range(len(paths), len(paths) + len(held))), free,
                     rounds=args.rounds, max_nfev=args.max_evaluations, leave_one_out=args.leave_one_out, log=log)
    except KeyboardInterrupt:
        ev.close()
        print("pagesim calibrate: interrupted; no profile written", file=sys.stderr)
        return 130
    finally:
        ev.close()
    document = profile_document(result, ev, settings)
    write_fitted(out, document, force=args.force)
    if report is not None:
        from pagesim.reports.fit_pages import write_fit_report

        report.mkdir(exist_ok=True)
        written = write_fit_report(report, document)
        log(f"wrote {', '.join(str(p) for p in written)}")
    if args.json:
        import json

        print(json.dumps(document, indent=1, sort_keys=True))
    else:
        print(format_fit(document))
        print(f"\nwrote {out}")
    return 0
