"""Where a command's requests come from: ``--trace PATH`` or ``--workload NAME``.

Every command that replays traffic (``trace stats``, ``trace gen``, and later ``simulate``,
``run``, ``validate``) takes the same flags, added by ``add_source_args``, and turns them into a
``Trace`` with ``trace_from_args``:

- ``--trace PATH [--format F] [--columns MAP] [--time-unit U] [--burstgpt-model M] ...``,
  with ``--rate R`` rescaling the trace's arrivals to R requests/s (or, for a length-only file,
  drawing ``--arrival`` arrivals at R) and ``--num-requests K`` keeping the first K;
- ``--workload NAME --rate R --num-requests K [--seed S]`` for a named synthetic workload;
- ``--dataset-name NAME [--dataset-path PATH] [--tokenizer TOK] --num-prompts K`` for a dataset
  as ``vllm bench serve`` loads it (``pagesim.traces.bench``), sent as vLLM bench sends it:
  ``--request-rate R`` (default inf: all at t=0) and ``--burstiness B``
  (``pagesim.traces.generate.arrivals.bench_arrivals``), or at a rising rate with ``--ramp-up-strategy``
  (``pagesim.traces.bench.ramp_up``).

vLLM bench's names are aliases of pagesim's: ``--num-prompts`` is ``--num-requests``,
``--request-rate`` is ``--rate`` (``inf``: every request at t=0, for any source), and
``--burstiness B`` is gamma arrivals of shape B (coefficient of variation 1/sqrt(B); a workload's
``--arrival gamma:cv=C``).

Warnings about repaired input go to stderr as ``pagesim CMD: warning: ...`` (``--strict`` makes
them errors). A gzip file may decompress to 100 times its size (at least 1 GiB) unless
``--max-decompressed-gb`` sets another cap (``pagesim.traces.loaders.stream``).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from contextlib import contextmanager

from pagesim.traces.errors import TraceWarning


def add_source_args(parser: argparse.ArgumentParser, *, trace_positional: bool = False) -> None:
    from pagesim.traces.generate.presets import WORKLOADS
    from pagesim.traces.loaders import FORMATS

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
    group.add_argument("--time-unit", choices=["s", "ms", "us"],
                       help="csv/jsonl: unit of the arrival column (default s)")
    group.add_argument("--burstgpt-model", metavar="NAME", help="BurstGPT: keep rows of this Model (e.g. ChatGPT)")
    group.add_argument("--burstgpt-log-type", metavar="TYPE",
                       help="BurstGPT: keep rows of this Log Type (e.g. 'Conversation log')")
    group.add_argument("--prefix-block-tokens", type=int, default=0, metavar="B",
                       help="generic JSONL: tokens each prefix_ids identity stands for")
    group.add_argument("--rate", "--request-rate", dest="rate", type=float, metavar="R",
                       help="requests/s: a workload's rate, a trace rescaled to it, or a length file's arrivals; "
                            "inf sends every request at t=0 (vLLM bench's --request-rate)")
    group.add_argument("--burstiness", type=float, metavar="B",
                       help="gamma-distributed gaps of shape B at --rate (vLLM bench's: 1 = Poisson, < 1 burstier, "
                            "> 1 more regular)")
    group.add_argument("--arrival", metavar="PROC",
                       help="arrival process for workloads and length-only files: poisson (default), "
                            "gamma:cv=C, constant (each at --rate), or piecewise:DUR@RATE,... (its own rates)")
    group.add_argument("--num-requests", "--num-prompts", dest="num_requests", type=int, metavar="K",
                       help="requests to generate, or to keep from a trace (vLLM bench's --num-prompts)")
    group.add_argument("--spread-ties", action="store_true",
                       help="spread requests logged with one timestamp over the gap to the next "
                            "(Mooncake logs batches about 3 s apart)")
    group.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    group.add_argument("--strict", action="store_true",
                       help="treat warnings as errors: repaired input, and a calibration profile that does not hold "
                            "here (validate; simulate --profile)")
    group.add_argument("--max-decompressed-gb", type=float, metavar="GIB",
                       help="stop reading a gzip file once it has decompressed to GIB GiB (default: 100 x the "
                            "file's size, at least 1 GiB; a guard against gzip bombs)")
    if not trace_positional:
        from pagesim.traces.bench.cli import add_dataset_args

        add_dataset_args(parser)
    else:  # (a ShareGPT file read as a trace counts its tokens with it)
        group.add_argument("--tokenizer", metavar="PATH",
                           help="a Hugging Face tokenizer folder or tokenizer.json: exact token counts of a ShareGPT "
                                "file (default: an estimate, 1 token per 4 characters)")


@contextmanager
def reported_warnings(command: str, *, strict: bool = False, category: type[Warning] = TraceWarning):
    """Show warnings of ``category`` (a trace's repairs by default; a study's set-aside results
    with ``pagesim.reports.store.ResultsWarning``) as one stderr line each, or raise them with ``strict``."""
    with warnings.catch_warnings():  # (which puts the previous hook back on leaving)
        warnings.simplefilter("error" if strict else "always", category)
        show_as_lines(command, category)
        try:
            yield
        except category as exc:
            raise ValueError(f"{exc} (--strict)") from None


def show_as_lines(command: str, category: type[Warning] = TraceWarning) -> None:
    """From now on, show warnings of ``category`` as one stderr line each, ``pagesim CMD:
    warning: ...``; others keep the usual format, with their origin."""
    shown_before = warnings.showwarning

    def show(message, shown, filename, lineno, file=None, line=None):
        if issubclass(shown, category):
            print(f"pagesim {command}: warning: {message}", file=sys.stderr)
        else:
            shown_before(message, shown, filename, lineno, file, line)

    warnings.showwarning = show


def has_source(args: argparse.Namespace) -> bool:
    """Whether the flags name a request source (else a command may fill in its default)."""
    return any(getattr(args, name, None) is not None for name in ("trace", "workload", "dataset_name"))


def max_decompressed_bytes(args: argparse.Namespace) -> int | None:
    """``--max-decompressed-gb`` in bytes (None: the loaders' default cap), or a ``ValueError``."""
    gib = getattr(args, "max_decompressed_gb", None)
    if gib is None:
        return None
    if not (gib > 0 and math.isfinite(gib)):
        raise ValueError(f"--max-decompressed-gb must be a number of GiB > 0, got {gib}")
    return max(1, int(gib * 2**30))


def trace_from_args(args: argparse.Namespace):
    """The ``Trace`` the flags describe (loaded or generated), cut and rescaled as asked."""
    from pagesim.traces.loaders.stream import decompression_cap

    with decompression_cap(max_decompressed_bytes(args)):
        return _trace_from_args(args)


def _trace_from_args(args: argparse.Namespace):
    from pagesim.traces.generate.arrivals import parse_arrivals
    from pagesim.traces.generate.presets import workload_spec
    from pagesim.traces.generate.workload import generate
    from pagesim.traces.loaders import FIXED_FORMATS, ColumnMap, detect_format, load_trace

    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    rate, burstiness = args.rate, getattr(args, "burstiness", None)
    if rate is not None and not rate > 0:
        raise ValueError(f"--rate / --request-rate must be > 0 requests/s (or inf), got {rate}")
    if burstiness is not None and not burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    path = getattr(args, "trace", None)
    workload = getattr(args, "workload", None)
    dataset = getattr(args, "dataset_name", None)
    given = [flag for flag, value in (("--trace", path), ("--workload", workload), ("--dataset-name", dataset))
             if value is not None]
    if len(given) != 1:
        raise ValueError("give one request source: --trace PATH, --workload NAME or --dataset-name NAME"
                         + (f" (got {' and '.join(given)})" if given else ""))
    all_at_once = rate is not None and math.isinf(rate)
    if dataset is not None:
        return _dataset_trace(args, rate, burstiness)
    if burstiness is not None:
        if args.arrival is not None:
            raise ValueError("--burstiness and --arrival both describe the arrival process: give one")
        if all_at_once or rate is None:
            raise ValueError("--burstiness shapes the gaps between arrivals at a finite --rate / --request-rate")
        args.arrival = f"gamma:cv={1.0 / math.sqrt(burstiness)!r}"
    if all_at_once and args.arrival is not None:
        raise ValueError("--rate inf sends every request at t=0; --arrival does not apply")
    if workload is not None:
        if args.num_requests is None:
            raise ValueError(f"--workload {workload} needs --num-requests K")
        trace = generate(workload_spec(workload, rate_rps=1.0 if all_at_once else rate,
                                       num_requests=args.num_requests, seed=args.seed, arrival=args.arrival))
        return _all_at_once(trace) if all_at_once else trace
    if all_at_once:
        rate = None  # (the file is read as it is; its times are replaced below)

    fmt = args.format or detect_format(path)
    if fmt in FIXED_FORMATS:
        for flag, value in (("--columns", args.columns), ("--time-unit", args.time_unit),
                            ("--burstiness" if burstiness is not None else "--arrival", args.arrival)):
            if value is not None:
                raise ValueError(f"{flag} does not apply to the {fmt} format (its columns and arrival times are fixed)")
    if fmt == "lengths" and args.time_unit is not None:
        raise ValueError("--time-unit is for an arrival column; a length-only file has none")
    time_unit = args.time_unit or "s"
    columns = ColumnMap.parse(args.columns, time_unit=time_unit) if args.columns else None
    # a process for files without arrival times (used only if the file has none)
    arrivals = None
    if fmt not in FIXED_FORMATS and (args.arrival is not None or rate is not None):
        arrivals = parse_arrivals(args.arrival, rate_rps=rate)
    trace = load_trace(path, fmt, columns=columns, model=args.burstgpt_model, log_type=args.burstgpt_log_type,
                       arrivals=arrivals, seed=args.seed, prefix_block_tokens=args.prefix_block_tokens,
                       time_unit=time_unit, tokenizer=getattr(args, "tokenizer", None))
    drawn = "arrival_process" in trace.metadata
    if arrivals is not None and not drawn and args.arrival is not None:
        raise ValueError(f"{path} has its own arrival times; --arrival is for length-only files "
                         "(use --rate to rescale a trace)")
    if args.spread_ties:
        trace = trace.spread_ties(args.seed)
    if args.num_requests is not None:
        trace = trace.head(args.num_requests)
    if all_at_once:
        return _all_at_once(trace)
    if rate is not None and not drawn:
        trace = trace.at_rate(rate)
    return trace


def _all_at_once(trace):
    """``--rate inf``: every request at t=0 (vLLM bench's ``--request-rate inf``)."""
    from dataclasses import replace

    import numpy as np

    return replace(trace, arrival_s=np.zeros(len(trace)), has_arrivals=True,
                   metadata={**trace.metadata, "arrivals": "all at t=0 (--request-rate inf)"})


DEFAULT_NUM_PROMPTS = 1000  # vLLM bench's --num-prompts default


def _dataset_trace(args, rate, burstiness):
    """A vLLM bench dataset (``pagesim.traces.bench``) with vLLM bench's send times."""
    from dataclasses import replace

    from pagesim.traces.bench.cli import dataset_trace
    from pagesim.traces.bench.ramp_up import ramp_up_from_args
    from pagesim.traces.generate.arrivals import bench_arrivals

    if args.arrival is not None:
        raise ValueError("--arrival is for --workload and length-only traces; a dataset is sent at "
                         "--request-rate R with --burstiness B, as vLLM bench sends it")
    if args.num_requests is None:
        args.num_requests = DEFAULT_NUM_PROMPTS
    ramp = ramp_up_from_args(args)
    trace = dataset_trace(args)
    rate = math.inf if rate is None else rate
    burstiness = 1.0 if burstiness is None else burstiness
    if ramp is not None:  # (vLLM: a ramp-up replaces --request-rate)
        times = ramp.send_times_s(len(trace), burstiness, args.seed)
        how = f"vLLM bench's {ramp.describe()}, burstiness {burstiness:g}, seed {args.seed}"
    else:
        times = bench_arrivals(len(trace), rate, burstiness, args.seed)
        how = ("all at t=0 (--request-rate inf)" if math.isinf(rate) else
               f"vLLM bench's at {rate:g} requests/s, burstiness {burstiness:g}, seed {args.seed}")
    return replace(trace, arrival_s=times, has_arrivals=True, metadata={**trace.metadata, "arrivals": how})
