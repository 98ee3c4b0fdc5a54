"""Where a command's requests come from: ``--trace PATH`` or ``--workload NAME``.

Every command that replays traffic (``trace stats``, ``trace gen``, and later ``simulate``,
``run``, ``validate``) takes the same flags, added by ``add_source_args``, and turns them into a
``Trace`` with ``trace_from_args``:

- ``--trace PATH [--format F] [--columns MAP] [--time-unit U] [--burstgpt-model M] ...``,
  with ``--rate R`` rescaling the trace's arrivals to R requests/s (or, for a length-only file,
  drawing ``--arrival`` arrivals at R) and ``--num-requests K`` keeping the first K;
- ``--workload NAME --rate R --num-requests K [--seed S]`` for a named synthetic workload.

Warnings about repaired input go to stderr as ``pagesim CMD: warning: ...`` (``--strict`` makes
them errors).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from contextlib import contextmanager

from traces.errors import TraceWarning


def add_source_args(parser: argparse.ArgumentParser, *, trace_positional: bool = False) -> None:
    from traces.generate.presets import WORKLOADS
    from traces.loaders import FORMATS

    group = parser.add_argument_group("requests")
    if trace_positional:
        group.add_argument("trace", metavar="PATH", help="trace file (.gz allowed)")
    else:
        group.add_argument("--trace", metavar="PATH", help="trace file (.gz allowed)")
        group.add_argument("--workload", metavar="NAME", choices=list(WORKLOADS),
                           help=f"synthetic workload: {', '.join(WORKLOADS)}")
    group.add_argument("--format", choices=list(FORMATS), help="trace format (default: detected)")
    group.add_argument("--columns", metavar="MAP",
                       help="for csv/jsonl/lengths files: arrival=COL,prompt=COL,output=COL[,...]")
    group.add_argument("--time-unit", choices=["s", "ms", "us"], default="s",
                       help="unit of a mapped arrival column (default s)")
    group.add_argument("--burstgpt-model", metavar="NAME", help="BurstGPT: keep rows of this Model (e.g. ChatGPT)")
    group.add_argument("--burstgpt-log-type", metavar="TYPE",
                       help="BurstGPT: keep rows of this Log Type (e.g. 'Conversation log')")
    group.add_argument("--prefix-block-tokens", type=int, default=0, metavar="B",
                       help="generic JSONL: tokens each prefix_ids identity stands for")
    group.add_argument("--rate", type=float, metavar="R",
                       help="requests/s: a workload's rate, a trace rescaled to it, or a length file's arrivals")
    group.add_argument("--arrival", default="poisson", metavar="PROC",
                       help="arrival process for workloads and length-only files: poisson, gamma:cv=C, "
                            "constant, piecewise:DUR@RATE,... (default poisson)")
    group.add_argument("--num-requests", type=int, metavar="K", help="requests to generate, or to keep from a trace")
    group.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    group.add_argument("--strict", action="store_true", help="treat repaired input (warnings) as errors")


@contextmanager
def reported_warnings(command: str, *, strict: bool):
    """Show ``TraceWarning``s as one stderr line each, or raise them with ``strict``."""
    with warnings.catch_warnings():
        if strict:
            warnings.simplefilter("error", TraceWarning)
        else:
            warnings.simplefilter("always", TraceWarning)

        def show(message, category, filename, lineno, file=None, line=None):
            print(f"pagesim {command}: warning: {message}", file=sys.stderr)

        warnings.showwarning = show
        try:
            yield
        except TraceWarning as exc:
            raise ValueError(f"{exc} (--strict)") from None


def trace_from_args(args: argparse.Namespace):
    """The ``Trace`` the flags describe (loaded or generated), cut and rescaled as asked."""
    from traces.generate.arrivals import parse_arrivals
    from traces.generate.presets import workload_spec
    from traces.generate.workload import generate
    from traces.loaders import ColumnMap, load_trace

    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    path = getattr(args, "trace", None)
    workload = getattr(args, "workload", None)
    if (path is None) == (workload is None):
        raise ValueError("give --trace PATH or --workload NAME (one of them)")
    if workload is not None:
        if args.rate is None or args.num_requests is None:
            raise ValueError(f"--workload {workload} needs --rate R and --num-requests K")
        spec = workload_spec(workload, rate_rps=args.rate, num_requests=args.num_requests, seed=args.seed)
        if args.arrival != "poisson":
            from dataclasses import replace

            spec = replace(spec, arrivals=parse_arrivals(args.arrival, rate_rps=args.rate))
        return generate(spec)

    columns = ColumnMap.parse(args.columns, time_unit=args.time_unit) if args.columns else None
    fmt = args.format
    if fmt is None:
        from traces.loaders import detect_format

        fmt = detect_format(path)
    takes_arrivals = fmt == "lengths" or (columns is not None and columns.arrival is None)
    arrivals = None
    if takes_arrivals and args.rate is not None:
        arrivals = parse_arrivals(args.arrival, rate_rps=args.rate)
    trace = load_trace(path, fmt, columns=columns, model=args.burstgpt_model, log_type=args.burstgpt_log_type,
                       arrivals=arrivals, seed=args.seed, prefix_block_tokens=args.prefix_block_tokens)
    if args.num_requests is not None:
        trace = trace.head(args.num_requests)
    if args.rate is not None and arrivals is None:
        trace = trace.at_rate(args.rate)
    return trace
