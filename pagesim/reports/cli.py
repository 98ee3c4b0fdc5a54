"""``pagesim study``, ``pagesim report`` and ``pagesim demo``.

- ``study SPEC -o DIR``: run a study (a TOML spec, or a preset name) into DIR; rerunning resumes;
  prints the findings when done.
- ``report DIR -o report.pdf [--html report.html]``: the PDF (and the HTML) report of a study folder.
- ``demo``: the ``demo`` preset into ``out/demo-study``, then ``out/report.pdf`` and
  ``out/report.html``; prints the paths and the findings.

Findings call a difference only where it exceeds noise: the 95% intervals over seeds when the study
lists seeds, otherwise ``--noise-threshold`` percent (default 2).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("study", help="run a what-if study (a grid of simulations); resumable",
                              description=__doc__.splitlines()[2].strip("- "))
    p.add_argument("spec", help="a study spec (TOML) or a preset: demo, kwon2023")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="study folder (results.jsonl, study.json)")
    _execution_args(p)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the spec, e.g. source.num_requests=200 or grid.0.block_size=[8,16] (repeatable)")
    p.add_argument("--allow-plugins", action="store_true",
                   help="run the plug-in files the spec lists (plugins = [...]); without it such a spec is refused")
    p.add_argument("--max-runs", type=int, metavar="N",
                   help="run a study whose grids make more than 10,000 runs (up to N)")
    p.add_argument("--report", metavar="PDF", help="also write the PDF report here when the study is done")
    p.add_argument("--html", metavar="HTML", help="also write the report as one self-contained HTML file")
    _threshold_arg(p)
    p.set_defaults(func=run_study_cmd)

    r = subparsers.add_parser("report", help="write a study's PDF (and HTML) report",
                              description="The PDF report of a study folder, and with --html the same pages as HTML.")
    r.add_argument("study_dir", metavar="DIR")
    r.add_argument("-o", "--out", metavar="PDF", help="the PDF to write")
    r.add_argument("--html", metavar="HTML", help="the HTML report to write (one self-contained file)")
    _threshold_arg(r)
    r.set_defaults(func=run_report_cmd)

    d = subparsers.add_parser("demo", help="a small study on an embedded workload, and its PDF report",
                              description="Run the demo study and write its report (out/report.pdf).")
    d.add_argument("-o", "--out", default="out", metavar="DIR", help="output folder (default out/)")
    _execution_args(d)
    _threshold_arg(d)
    d.set_defaults(func=run_demo_cmd, executor="local", address=None)


def _threshold_arg(p) -> None:
    p.add_argument("--noise-threshold", type=float, default=2.0, metavar="PCT",
                   help="without seeds, differences up to PCT%% (relative; points for rates) are reported as no "
                        "measurable difference (default 2)")


def _threshold(args) -> float:
    pct = args.noise_threshold
    if not 0 <= pct < 100:
        raise ValueError(f"--noise-threshold is a percentage in [0, 100), got {pct}")
    return pct / 100


def _execution_args(p) -> None:
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: a process pool (default); ray: one Ray task per run")
    p.add_argument("--address", help="Ray cluster address (ray executor; default: start a local Ray)")
    p.add_argument("--workers", type=int, metavar="N", help="parallel runs (default: the CPUs)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar on a terminal, else a line per finished run)")


def _load(args):
    from pagesim.reports.presets import PRESETS
    from pagesim.reports.spec import MAX_RUNS, load_spec, parse_spec

    spec_arg = args.spec
    max_runs = MAX_RUNS if args.max_runs is None else args.max_runs
    if max_runs < 1:
        raise ValueError(f"--max-runs must be >= 1, got {max_runs}")
    bounds = {"allow_plugins": args.allow_plugins, "max_runs": max_runs}
    if spec_arg in PRESETS and not Path(spec_arg).exists():
        return parse_spec(PRESETS[spec_arg], args.set, origin=f"preset {spec_arg}", **bounds)
    if not Path(spec_arg).exists():
        raise ValueError(f"{spec_arg}: no such spec file, and not a preset ({', '.join(PRESETS)})")
    return load_spec(spec_arg, args.set, **bounds)


def _run(spec, out: Path, args) -> object:
    from pagesim.reports.execute import run_study

    started = time.perf_counter()
    try:
        outcome = run_study(spec, out, executor=args.executor, workers=args.workers, address=args.address,
                            progress=not args.no_progress)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (engine.cli.Terminated): the same unwinding
        from pagesim.engine.cli import interrupted_status, interruption
        from pagesim.reports.store import ResultsStore

        kept = ResultsStore(out / "results.jsonl").load(repair=False)
        print(f"\n{interruption(exc)}: {len(kept)} run records kept in {out}/results.jsonl; the same command resumes",
              file=sys.stderr)
        raise SystemExit(interrupted_status(exc)) from None
    print(f"study {spec.name}: {outcome.total} runs ({outcome.reused} from before, {outcome.ran} now, "
          f"{outcome.failed} failed) in {time.perf_counter() - started:.0f} s -> {out}/results.jsonl")
    return outcome


def _print_findings(out: Path, threshold: float) -> None:
    from pagesim.reports.findings import outline_lines
    from pagesim.reports.results import load_study

    study = load_study(out, threshold=threshold)
    if study.ok:
        print("\nFindings:")
        print("\n".join(outline_lines(study)))


def _study_folder(path: Path, flag: str) -> Path:
    """``path`` as a study folder, checked before any work (``pagesim.reports.execute.check_study_folder``:
    new, empty or a study's own; never ``/``, the home folder or one holding the current folder)."""
    from pagesim.reports.execute import check_study_folder

    check_study_folder(path, flag)
    return path


#: What ``demo -o DIR`` writes in DIR besides ``demo-study/`` (older versions' staged copies too).
DEMO_FILES = ("report.pdf", "report.html", "report.pdf.*.tmp", "report.html.*.tmp")


def _demo_folder(path: Path) -> Path:
    """``demo -o DIR`` checked before any work: DIR new, or holding only what the demo writes
    (its report and ``demo-study/``, itself a study folder), and never an unsafe place."""
    from pagesim.engine.output_folders import check_fill_folder

    check_fill_folder(path, "-o", DEMO_FILES, {"demo-study": lambda p: _study_folder(p, "the demo's study folder")},
                      what="demo folder")
    return path


def run_study_cmd(args) -> int:
    from pagesim.reports.store import ResultsWarning
    from pagesim.traces.source import reported_warnings

    with reported_warnings("study", category=ResultsWarning):
        return _study(args)


def _study(args) -> int:
    threshold = _threshold(args)
    spec = _load(args)
    out = _study_folder(Path(args.out), "-o")
    if args.report or args.html:  # checked before the study runs, not after
        from pagesim.reports.pdf import report_outputs

        report_files = report_outputs(args.report, args.html, pdf_flag="--report")
    outcome = _run(spec, out, args)
    _print_findings(out, threshold)
    if args.report or args.html:
        from pagesim.reports.pdf import build_report

        pages = build_report(out, report_files[0], html=report_files[1], threshold=threshold)
        print("\nwrote " + " and ".join(p for p in (args.report, args.html) if p) + f" ({len(pages)} pages)")
    else:
        print(f"\nreport: pagesim report {out} -o {out}/report.pdf --html {out}/report.html")
    return 1 if outcome.failed else 0  # scripts can tell; the failures are in results.jsonl and the report


def run_report_cmd(args) -> int:
    from pagesim.reports.pdf import build_report
    from pagesim.reports.store import ResultsWarning
    from pagesim.traces.source import reported_warnings

    with reported_warnings("report", category=ResultsWarning):
        return _report(args, build_report)


def _report(args, build_report) -> int:
    if not args.out and not args.html:
        raise ValueError("pagesim report needs -o PDF, --html HTML, or both")
    pages = build_report(args.study_dir, args.out, html=args.html, threshold=_threshold(args))
    wrote = " and ".join(p for p in (args.out, args.html) if p)
    print(f"wrote {wrote} ({len(pages)} pages: {', '.join(pages)})")
    return 0


def run_demo_cmd(args) -> int:
    from pagesim.reports.store import ResultsWarning
    from pagesim.traces.source import reported_warnings

    with reported_warnings("demo", category=ResultsWarning):
        return _demo(args)


def _demo(args) -> int:
    from pagesim.reports.presets import DEMO
    from pagesim.reports.spec import parse_spec

    from pagesim.reports.execute import resolve_workers

    threshold = _threshold(args)
    resolve_workers(args.workers)  # (checked before the banner, so a refusal is the only line)
    out = _demo_folder(Path(args.out))  # (before matplotlib is imported: it writes a cache under $HOME)
    from pagesim.reports.pdf import build_report, report_outputs

    pdf, html = out / "report.pdf", out / "report.html"
    report_files = report_outputs(pdf, html)
    spec = parse_spec(DEMO, origin="preset demo")
    print(f"pagesim demo: {len(spec.runs())} simulations of {spec.source['num_requests']} requests "
          f"({spec.source['workload']} at {spec.source['rate']:g} requests/s, Llama 3 8B on A100 40 GB), block size "
          "x eviction x preemption, load, memory baselines, cache size", file=sys.stderr)
    outcome = _run(spec, out / "demo-study", args)
    pages = build_report(out / "demo-study", report_files[0], html=report_files[1], threshold=threshold)
    print(f"\nwrote {pdf} and {html} ({len(pages)} pages)")
    _print_findings(out / "demo-study", threshold)
    return 1 if outcome.failed else 0
