"""pagesim reproduce kwon2023: the PagedAttention paper's memory figures, ours beside the paper's.

Runs the setup of ``pagesim.sim.paper`` (OPT-13B, A100 40 GB, 12 GiB of KV cache) for Fig. 2, 13, 15 and
18b and prints a table per figure; ``--json`` prints the numbers instead. ``--quick`` runs 300
requests per run and skips Fig. 18b (what CI runs).
"""

from __future__ import annotations

import json
import sys

FIGURES = ("2", "13", "15", "18b")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("reproduce", help="reproduce a paper's results with the simulator (kwon2023)",
                              description=__doc__.splitlines()[0])
    p.add_argument("paper", choices=["kwon2023"], help="kwon2023: PagedAttention (Kwon et al., SOSP 2023)")
    p.add_argument("--figures", help="comma-separated: 2,13,15,18b (default all; with --quick 2,13,15)")
    p.add_argument("--num-requests", type=int, default=1000, metavar="K", help="requests per run (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-overhead-ms", type=float, metavar="MS",
                   help="extra engine time per step in ms (default: derived from the paper's vLLM at ShareGPT "
                        "2 req/s; 0 = the roofline alone)")
    p.add_argument("--quick", action="store_true", help="300 requests per run, Fig. 2/13/15 only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from pagesim.sim.paper import PaperSetup, format_results, reproduce

    # NOTE: `is None`, not falsiness: `--figures ''` names no figure and is refused, not read as "all"
    chosen = args.figures if args.figures is not None else ",".join(f for f in FIGURES
                                                                   if not (args.quick and f == "18b"))
    figures = tuple(f.strip() for f in chosen.split(",") if f.strip())
    unknown = sorted(set(figures) - set(FIGURES))
    if unknown or not figures:
        raise ValueError(f"--figures takes some of {','.join(FIGURES)}, got {chosen!r}")
    num_requests = args.num_requests
    if args.quick:
        num_requests = min(num_requests, 300)
        if "18b" in figures:
            raise ValueError("--quick leaves out Fig. 18b (nine block sizes); drop --quick or 18b")
    if num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    overhead = None
    if args.engine_overhead_ms is not None:
        if not 0 <= args.engine_overhead_ms < 1e3:
            raise ValueError(f"--engine-overhead-ms must be in [0, 1000), got {args.engine_overhead_ms}")
        overhead = args.engine_overhead_ms / 1e3
    setup = PaperSetup(num_requests=num_requests, seed=args.seed,
                       engine_overhead_s=overhead)
    log = (lambda *a: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = reproduce(setup, figures, log=log)
    if args.json:
        print(json.dumps(results, sort_keys=True))
    else:
        print(format_results(results))
    return 0
