"""vLLM bench's benchmark flags, shared by ``simulate`` and ``run`` (one definition, one meaning).

- ``--max-concurrency N``: a closed-loop client (``sim.client``; the engine's wall-clock loop);
- ``--percentile-metrics ttft,tpot,itl,e2el`` and ``--metric-percentiles 50,90,99``: what the
  result file reports (vLLM's defaults: ttft,tpot,itl at 99); the summary always has p50, p90
  and p99 besides;
- ``--goodput ttft:MS tpot:MS e2el:MS``: goodput SLOs in milliseconds, only those named (vLLM's
  meaning); without it the summary keeps pagesim's default SLOs (``--slo-ttft``, ``--slo-tpot``);
- ``--save-result [--result-dir DIR] [--result-filename NAME] [--save-detailed]``: vLLM bench's
  result JSON (``reports.bench_result``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sim.bench_metrics import DEFAULT_PERCENTILES, Slo, parse_percentile_metrics, parse_percentiles


@dataclass(frozen=True)
class BenchSettings:
    max_concurrency: int | None
    percentile_metrics: tuple[str, ...]
    result_percentiles: tuple[float, ...]  # the file's
    summary_percentiles: tuple[float, ...]  # the summary's: p50, p90, p99 and the asked ones
    goodput: Slo | None  # from --goodput (None: not given)
    save_result: bool
    result_dir: str | None
    result_filename: str | None
    save_detailed: bool


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("benchmark client and results (vLLM bench's flags)")
    g.add_argument("--max-concurrency", type=int, metavar="N",
                   help="closed loop: at most N requests in flight, the next sent when one finishes (with "
                        "--request-rate, as vllm bench serve combines them)")
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl", metavar="LIST",
                   help="metrics the result file gives percentiles of: ttft,tpot,itl,e2el (default ttft,tpot,itl)")
    g.add_argument("--metric-percentiles", default="99", metavar="LIST",
                   help="percentiles for them, e.g. 50,90,99 (default 99; the summary always has 50, 90, 99)")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="goodput SLOs in milliseconds, e.g. ttft:500 tpot:50 e2el:10000 (only those named count)")
    g.add_argument("--save-result", action="store_true", help="write vllm bench serve's result JSON")
    g.add_argument("--result-dir", metavar="DIR", help="folder for the result file (default: the current one)")
    g.add_argument("--result-filename", metavar="NAME",
                   help="result file name (default vLLM's: pagesim-RATEqps[-concurrencyN]-MODEL-DATE.json)")
    g.add_argument("--save-detailed", action="store_true",
                   help="per-request lists are always written; this keeps itls even past 5M output tokens")


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """The flags checked and parsed (bad values are one-line errors)."""
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    asked = parse_percentiles(args.metric_percentiles)
    goodput = Slo.parse(args.goodput) if args.goodput else None
    if goodput is not None and (getattr(args, "slo_ttft", None) is not None or getattr(args, "slo_tpot", None) is not None):
        raise ValueError("--goodput (vLLM's, in ms) and --slo-ttft / --slo-tpot (pagesim's, in s) both set the SLOs: "
                         "give one kind")
    if (args.result_dir or args.result_filename) and not args.save_result:
        raise ValueError("--result-dir and --result-filename name the file --save-result writes: add --save-result")
    return BenchSettings(
        max_concurrency=args.max_concurrency, percentile_metrics=parse_percentile_metrics(args.percentile_metrics),
        result_percentiles=asked, summary_percentiles=tuple(sorted(set(DEFAULT_PERCENTILES) | set(asked))),
        goodput=goodput, save_result=args.save_result, result_dir=args.result_dir,
        result_filename=args.result_filename, save_detailed=args.save_detailed,
    )


def summary_slo(settings: BenchSettings, slo_ttft_s: float | None, slo_tpot_s: float | None) -> Slo:
    """--goodput's SLOs, else pagesim's (``--slo-ttft`` / ``--slo-tpot``, default 2 s and 0.1 s)."""
    if settings.goodput is not None:
        return settings.goodput
    return Slo(2.0 if slo_ttft_s is None else slo_ttft_s, 0.1 if slo_tpot_s is None else slo_tpot_s)
