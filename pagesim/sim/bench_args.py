"""vLLM bench's benchmark flags, shared by ``simulate`` and ``run`` (one definition, one meaning).

- ``--max-concurrency N``: a closed-loop client (``pagesim.sim.client``; the engine's wall-clock loop);
- ``--request-timeout S``: the client gives up on a request unfinished S seconds after sending it,
  and the server aborts it between steps (``pagesim.sim.replica``; the engine's ``Engine.run``), as
  inference-perf's ``request_timeout`` (300 s in the shared ground-truth runs); vLLM bench's own
  client timeout (aiohttp's, ``AIOHTTP_TIMEOUT``: 6 hours) is not modelled. Default: none;
- ``--percentile-metrics ttft,tpot,itl,e2el`` and ``--metric-percentiles 50,90,99``: what the
  result file reports (vLLM's defaults: ttft,tpot,itl at 99); the summary always has p50, p90
  and p99 besides;
- ``--goodput ttft:MS tpot:MS e2el:MS``: goodput SLOs in milliseconds, only those named (vLLM's
  meaning); without it the summary keeps pagesim's default SLOs (``--slo-ttft``, ``--slo-tpot``);
- ``--save-result [--result-dir DIR] [--result-filename NAME] [--save-detailed]``: vLLM bench's
  result JSON (``pagesim.sim.bench_result``); ``--append-result`` adds it as one more line to the file
  (vLLM's: a newline, then the JSON), and writes it like ``--save-result`` when the file is new;
- ``--label NAME``: the result file's ``label`` (``null`` without it, as vLLM 0.33 writes) and the
  default file name's first word (else the backend, ``pagesim``); ``--metadata KEY=VALUE ...``:
  more keys of the result file, as vLLM adds them (after ``num_prompts``, the value a string);
- ``--ramp-up-strategy linear|exponential --ramp-up-start-rps A --ramp-up-end-rps B``: a
  dataset's requests sent at a rate rising from A to B over the run (``pagesim.traces.bench.ramp_up``);
- ``--num-warmups N``: ``run`` serves N copies of the first request on an engine of their own
  before the measured run, which then starts warm but with an empty cache
  (``pagesim.engine.runtime.warmup``); ``simulate`` has no cold start, so they change nothing there;
- ``--backend`` and (simulate) ``--temperature``: accepted and said to be irrelevant (a note on
  stderr). ``run`` has a ``--backend`` of its own (attention kernels): vLLM's backend names are
  accepted there too, with the note, and mean ``auto``; ``run`` samples with ``--temperature``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from pagesim.sim.bench_metrics import DEFAULT_PERCENTILES, Slo, parse_percentile_metrics, parse_percentiles
from pagesim.traces.bench.ramp_up import STRATEGIES, RampUp, ramp_up_from_args

#: vLLM 0.33's ``--backend`` choices (benchmarks/lib/endpoint_request_func.py ``ASYNC_REQUEST_FUNCS``):
#: which HTTP API vllm bench serve calls; those that generate text, and those of pooling models
#: (embeddings, scores), which pagesim does not serve
VLLM_GENERATE_BACKENDS = ("vllm", "openai", "openai-chat", "openai-responses", "openai-audio")
VLLM_POOLING_BACKENDS = ("openai-embeddings", "openai-embeddings-chat", "openai-embeddings-clip",
                         "openai-embeddings-vlm2vec", "infinity-embeddings", "infinity-embeddings-clip",
                         "vllm-pooling", "vllm-rerank")


@dataclass(frozen=True)
class BenchSettings:
    max_concurrency: int | None
    percentile_metrics: tuple[str, ...]
    result_percentiles: tuple[float, ...]  # the file's
    summary_percentiles: tuple[float, ...]  # the summary's: p50, p90, p99 and the asked ones
    goodput: Slo | None  # from --goodput (None: not given)
    save_result: bool  # --save-result or --append-result: a result file is written
    result_dir: str | None
    result_filename: str | None
    save_detailed: bool
    append_result: bool = False
    label: str | None = None  # --label (vLLM writes null without it)
    metadata: tuple[tuple[str, str], ...] = ()  # --metadata KEY=VALUE, in order
    num_warmups: int = 0
    ramp_up: RampUp | None = None
    request_timeout_s: float | None = None  # --request-timeout (None: the client never gives up)


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("benchmark client and results (vLLM bench's flags)")
    g.add_argument("--max-concurrency", type=int, metavar="N",
                   help="closed loop: at most N requests in flight, the next sent when one finishes (with "
                        "--request-rate, as vllm bench serve combines them)")
    g.add_argument("--request-timeout", metavar="S",  # (read by bench_settings: a bad value is one line)
                   help="the client gives up on a request still unfinished S seconds after sending it; the server "
                        "aborts it between steps, frees its KV blocks, and it counts as failed (inference-perf's "
                        "request_timeout; default: none)")
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
    g.add_argument("--append-result", action="store_true",
                   help="add the result to the file as one more JSON line (vLLM's; a new file is written whole)")
    g.add_argument("--label", metavar="NAME",
                   help="the result file's label, and the first word of its default name (default: pagesim)")
    g.add_argument("--metadata", nargs="*", metavar="KEY=VALUE",
                   help="keys to add to the result file, e.g. --metadata version=0.3.3 tp=1 (values are strings)")
    g.add_argument("--num-warmups", type=int, default=0, metavar="N",
                   help="run: serve N copies of the first request before the measured run, as vllm bench serve "
                        "does (they count in no figure); simulate: no effect, a simulation has no cold start")
    g.add_argument("--ramp-up-strategy", choices=STRATEGIES,
                   help="send a dataset's requests at a rate rising from --ramp-up-start-rps to --ramp-up-end-rps "
                        "over the run (instead of --request-rate)")
    g.add_argument("--ramp-up-start-rps", type=int, metavar="A", help="the ramp's first rate, requests/s")
    g.add_argument("--ramp-up-end-rps", type=int, metavar="B", help="the ramp's last rate, requests/s")
    known = {opt for action in parser._actions for opt in action.option_strings}
    if "--backend" not in known:  # (run has its own: the attention kernels)
        g.add_argument("--backend", metavar="NAME",
                       help="vllm bench serve's API to call: accepted and irrelevant (pagesim serves the requests)")
    if "--temperature" not in known:  # (run samples with its own)
        g.add_argument("--temperature", type=float, metavar="T",
                       help="accepted and irrelevant: the simulator generates no tokens, only their count")


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """The flags checked and parsed (bad values are one-line errors)."""
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    timeout_s = seconds_of(args.request_timeout, "--request-timeout")
    check_request_timeout(timeout_s)
    asked = parse_percentiles(args.metric_percentiles)
    goodput = Slo.parse(args.goodput) if args.goodput else None
    if goodput is not None and (getattr(args, "slo_ttft", None) is not None or getattr(args, "slo_tpot", None) is not None):
        raise ValueError("--goodput (vLLM's, in ms) and --slo-ttft / --slo-tpot (pagesim's, in s) both set the SLOs: "
                         "give one kind")
    saves = args.save_result or args.append_result
    if (args.result_dir or args.result_filename) and not saves:
        raise ValueError("--result-dir and --result-filename name the file --save-result writes: add --save-result")
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if (args.label is not None or args.metadata) and not saves:
        raise ValueError("--label and --metadata go into the result file: add --save-result (or --append-result)")
    settings = BenchSettings(
        max_concurrency=args.max_concurrency, percentile_metrics=parse_percentile_metrics(args.percentile_metrics),
        result_percentiles=asked, summary_percentiles=tuple(sorted(set(DEFAULT_PERCENTILES) | set(asked))),
        goodput=goodput, save_result=saves, result_dir=args.result_dir,
        result_filename=args.result_filename, save_detailed=args.save_detailed, append_result=args.append_result,
        label=args.label, metadata=parse_metadata(args.metadata or []), num_warmups=args.num_warmups,
        ramp_up=ramp_up_from_args(args), request_timeout_s=timeout_s,
    )
    _irrelevant_flags(args)
    return settings


def seconds_of(text: str | float | None, flag: str) -> float | None:
    """A flag's value as a number of seconds (``None`` stays ``None``)."""
    if text is None or isinstance(text, (int, float)):
        return text
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{flag} takes a number of seconds, got {text!r}") from None


def check_request_timeout(timeout_s: float | None) -> None:
    """A client timeout is a positive, finite number of seconds (or ``None``: none)."""
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"--request-timeout must be a positive, finite number of seconds, got {timeout_s!r}")


def parse_metadata(items: list[str]) -> tuple[tuple[str, str], ...]:
    """vLLM's ``--metadata KEY=VALUE ...`` (serve.py:2315-2324): split at the first ``=``, both
    sides stripped; an item without ``=`` is an error. A key also set by the file's own keys is
    overwritten by them, as in vLLM (its metadata goes in before them)."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--metadata takes KEY=VALUE items, got {item!r}")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _irrelevant_flags(args: argparse.Namespace) -> None:
    """One stderr note for vLLM flags that change nothing here (``--backend``; ``--temperature``
    in simulate); a pooling backend, which benchmarks no text generation, is refused."""
    command = getattr(args, "command", None) or "simulate"
    backend = getattr(args, "backend", None)
    ignored = []
    if backend in VLLM_POOLING_BACKENDS:
        raise ValueError(f"--backend {backend} benchmarks a pooling model (embeddings, scores); pagesim serves "
                         "text generation")
    api = "the API vllm bench serve calls; pagesim serves the requests itself"
    if command == "run":
        if backend in VLLM_GENERATE_BACKENDS:  # vLLM's meaning, not run's attention kernels
            ignored.append(f"--backend {backend} ({api}; run's --backend picks the attention kernels: auto is used)")
            args.backend = "auto"
    else:
        if backend is not None:
            if backend not in VLLM_GENERATE_BACKENDS:
                raise ValueError(f"--backend {backend!r} is not one of vllm bench serve's "
                                 f"({', '.join(VLLM_GENERATE_BACKENDS + VLLM_POOLING_BACKENDS)})")
            ignored.append(f"--backend {backend} ({api})")
        if getattr(args, "temperature", None) is not None:
            ignored.append(f"--temperature {args.temperature:g} (the simulator counts the tokens it generates; "
                           "it does not sample them)")
        if getattr(args, "num_warmups", 0):
            ignored.append(f"--num-warmups {args.num_warmups} (a simulated server has no cold start to warm; the run "
                           "is measured from an empty cache, as pagesim run's is after its warm-ups)")
    if ignored:
        print(f"pagesim {command}: note: ignored, irrelevant here: {'; '.join(ignored)}", file=sys.stderr)


def summary_slo(settings: BenchSettings, slo_ttft_s: float | None, slo_tpot_s: float | None) -> Slo:
    """--goodput's SLOs, else pagesim's (``--slo-ttft`` / ``--slo-tpot``, default 2 s and 0.1 s)."""
    if settings.goodput is not None:
        return settings.goodput
    return Slo(2.0 if slo_ttft_s is None else slo_ttft_s, 0.1 if slo_tpot_s is None else slo_tpot_s)
