"""``pagesim trace``: look at a trace file, or write a synthetic one.

- ``pagesim trace stats PATH [--format F] [--json] [--block-size B]``: requests, span, rate,
  prompt and output lengths (mean, p50, p99) and, where the trace has prefix identities,
  ``prefix_reuse`` (the ideal hit ratio of an infinite cache at the identities' granularity;
  ``--block-size`` adds it at a prefix cache's block size).
- ``pagesim trace gen (--workload NAME | --prompt-len D --output-len D | --lengths PATH) --rate R
  --num-requests K [--seed S] -o PATH``: a generated trace as pagesim JSONL.
- ``pagesim trace list``: the formats and the named workloads.

A file that cannot be read is one error line naming file, line and problem (exit 2).
"""

from __future__ import annotations

import argparse
import json

from pagesim.traces.source import add_source_args, max_decompressed_bytes, reported_warnings, trace_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("trace", help="trace statistics and synthetic trace generation",
                                   description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    commands.required = True

    stats = commands.add_parser("stats", help="statistics of a trace file")
    add_source_args(stats, trace_positional=True)
    stats.add_argument("--block-size", type=int, metavar="B",
                       help="also report prefix reuse over full blocks of B tokens")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=run_stats)

    gen = commands.add_parser("gen", help="write a synthetic trace as JSONL")
    add_source_args(gen)
    custom = gen.add_argument_group("a custom workload (instead of --workload)")
    custom.add_argument("--prompt-len", metavar="DIST", help="N | uniform:LO:HI | lognormal:mean=M,cv=C[,high=H]")
    custom.add_argument("--output-len", metavar="DIST", help="as --prompt-len")
    custom.add_argument("--lengths", metavar="PATH", help="resample (prompt, output) pairs from this trace file")
    custom.add_argument("--system-prompts", metavar="K:TOKENS:FRACTION",
                        help="K shared system prompts of TOKENS tokens before FRACTION of the requests")
    custom.add_argument("--turns", type=float, metavar="MEAN",
                        help="multi-turn conversations, MEAN turns each (--rate stays requests/s)")
    custom.add_argument("--think-time", type=float, metavar="S",
                        help="mean seconds between turns (default 30)")
    custom.add_argument("--max-context", type=int, metavar="T",
                        help="a conversation ends before prompt + output exceed T tokens (default 32768)")
    custom.add_argument("--warmup", type=float, metavar="S",
                        help="conversations start S seconds before the trace (default 5 x turns x think time)")
    custom.add_argument("--n", type=int, help="parallel samples per request")
    custom.add_argument("--beam-width", type=int, help="beam width per request")
    custom.add_argument("--sampling-fraction", type=float,
                        help="fraction of requests with --n / --beam-width (default 1)")
    custom.add_argument("--priority-levels", type=int, help="priorities drawn from 0..L-1")
    custom.add_argument("--identity-block-tokens", type=int,
                        help="tokens per prefix identity for shared content (default 64; with system prompts "
                             "its gcd with their length, so identities tile them exactly)")
    gen.add_argument("-o", "--output", required=True, metavar="PATH", help="JSONL file to write (.gz allowed)")
    gen.add_argument("--json", action="store_true", help="print the written trace's statistics as JSON")
    gen.set_defaults(func=run_gen)

    listing = commands.add_parser("list", help="trace formats and named workloads")
    listing.set_defaults(func=run_list)


def run_stats(args: argparse.Namespace) -> int:
    from pagesim.traces.stats import trace_stats

    if args.block_size is not None and args.block_size < 1:
        raise ValueError("--block-size must be >= 1")
    with reported_warnings("trace", strict=args.strict):
        trace = trace_from_args(args)
    stats = trace_stats(trace, block_size=args.block_size)
    print(json.dumps(stats) if args.json else format_stats(stats))
    return 0


CUSTOM_FLAGS = ("prompt_len", "output_len", "lengths", "system_prompts", "turns", "think_time", "max_context",
                "warmup", "n", "beam_width", "sampling_fraction", "priority_levels", "identity_block_tokens")


def _given(args: argparse.Namespace, name: str, default):
    value = getattr(args, name)
    return default if value is None else value


def _custom_spec(args: argparse.Namespace):
    from pagesim.traces.generate import (Conversations, LengthPairs, Sampling, SystemPrompts, WorkloadSpec,
                                 parse_arrivals, parse_lengths)

    if args.num_requests is None:
        raise ValueError("a generated trace needs --num-requests K")
    fields: dict = {"arrivals": parse_arrivals(args.arrival, rate_rps=args.rate)}
    if args.lengths:
        if args.prompt_len or args.output_len:
            raise ValueError("give --lengths or --prompt-len/--output-len, not both")
        from pagesim.traces.loaders import ColumnMap

        columns = ColumnMap.parse(args.columns) if args.columns else None
        fields["pairs"] = LengthPairs.from_file(args.lengths, format=args.format, columns=columns)
    elif args.prompt_len and args.output_len:
        fields["prompt"] = _flagged("--prompt-len", lambda: parse_lengths(args.prompt_len))
        fields["output"] = _flagged("--output-len", lambda: parse_lengths(args.output_len))
    else:
        raise ValueError("a custom workload needs --prompt-len and --output-len, or --lengths PATH")
    if args.system_prompts:
        try:
            k, tokens, fraction = args.system_prompts.split(":")
            k, tokens, fraction = int(k), int(tokens), float(fraction)
        except ValueError:
            raise ValueError(f"--system-prompts: expected K:TOKENS:FRACTION, got {args.system_prompts!r}") from None
        fields["system_prompts"] = _flagged("--system-prompts", lambda: SystemPrompts(k, tokens, fraction))
    if args.turns is not None:
        fields["conversations"] = _flagged("--turns / --think-time / --max-context / --warmup", lambda: Conversations(
            args.turns, _given(args, "think_time", 30.0), _given(args, "max_context", 32768), args.warmup))
    else:
        for flag in ("think_time", "max_context", "warmup"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies to conversations (--turns MEAN)")
    sampling = _flagged("--n / --beam-width / --sampling-fraction", lambda: Sampling(
        _given(args, "n", 1), _given(args, "beam_width", 1), _given(args, "sampling_fraction", 1.0)))
    return _flagged("--num-requests / --priority-levels / --identity-block-tokens", lambda: WorkloadSpec(
        num_requests=args.num_requests, sampling=sampling, priority_levels=_given(args, "priority_levels", 1),
        identity_block_tokens=_given(args, "identity_block_tokens", 64), seed=args.seed, name="custom", **fields))


def _flagged(flags: str, build):
    """``build()``, its ``ValueError`` (a bound it checks) restated as one naming the flags it came from."""
    try:
        return build()
    except ValueError as exc:
        raise ValueError(f"{flags}: {exc}") from None


def run_gen(args: argparse.Namespace) -> int:
    from pagesim.engine.outputs import OutputFile
    from pagesim.traces.generate import generate
    from pagesim.traces.loaders import write_jsonl
    from pagesim.traces.loaders.stream import decompression_cap
    from pagesim.traces.stats import trace_stats

    if args.trace is not None:
        raise ValueError("trace gen writes a synthetic trace; use --workload NAME or a custom workload")
    # flags about reading a trace file: only --format / --columns, and only for --lengths FILE
    for name in ("time_unit", "burstgpt_model", "burstgpt_log_type", "spread_ties"):
        if getattr(args, name):
            raise ValueError(f"--{name.replace('_', '-')} is for reading a trace, not for trace gen")
    if args.prefix_block_tokens:
        raise ValueError("--prefix-block-tokens is for reading a trace; trace gen takes --identity-block-tokens")
    if (args.format or args.columns) and not args.lengths:
        raise ValueError("--format and --columns describe a --lengths FILE")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    target = OutputFile(args.output, "-o")  # (engine.outputs) checked before the trace is made
    with reported_warnings("trace", strict=args.strict):
        if args.workload is not None:
            given = [f"--{name.replace('_', '-')}" for name in CUSTOM_FLAGS if getattr(args, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} {'describe' if len(given) > 1 else 'describes'} a custom "
                                 f"workload; the named workload {args.workload} fixes it (see `pagesim trace list`)")
            trace = trace_from_args(args)
        else:
            with decompression_cap(max_decompressed_bytes(args)):  # a --lengths FILE
                trace = generate(_custom_spec(args))
    path = write_jsonl(trace, target)
    stats = trace_stats(trace)
    if args.json:
        print(json.dumps({"path": str(path), **stats}))
    else:
        print(f"wrote {len(trace):,} requests to {path}")
        print(format_stats(stats))
    return 0


def run_list(args: argparse.Namespace) -> int:
    from pagesim.traces.generate.presets import WORKLOADS
    from pagesim.traces.loaders import FORMATS

    print("formats (--format):")
    for name, text in FORMATS.items():
        print(f"  {name:<10} {text}")
    print("workloads (--workload, with --rate R --num-requests K):")
    for name, (text, _) in WORKLOADS.items():
        print(f"  {name:<26} {text}")
    return 0


def format_stats(stats: dict) -> str:
    """The statistics as aligned ``name  value`` lines."""
    lines = []
    for key, value in stats.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:,.2f}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.2%}" if "reuse" in key else f"{value:,.6g}"
        elif isinstance(value, int):
            value = f"{value:,}"
        elif value is None:
            value = "n/a"
        lines.append(f"{key:<24} {value}")
    return "\n".join(lines)
