"""pagesim compare A.json B.json: two vLLM bench result files side by side.

Either file may come from ``vllm bench serve --save-result`` on a real server or from
``pagesim simulate`` / ``pagesim run --save-result``. For every figure both files hold (counts,
throughputs, and each ``mean_/median_/std_/p<q>_<metric>_ms``) it prints both values and the
relative difference (B - A) / A; where both files carry per-request lists it adds the two-sample
Kolmogorov-Smirnov statistic (the largest gap between the two empirical CDFs, 0 = the same
distribution, 1 = disjoint) of TTFT and end-to-end latency (``latencies``, or TTFT plus the
request's ``itls`` for files that lack them), and of every inter-token gap. ``--json`` prints
the same as one object.

Both files are checked before anything is compared (``result_problem``), and the first problem is
refused in one line naming the file and the key, quoting none of the file: every figure compared
is null or a finite number >= 0 (counts whole), every per-request list is a list with an entry per
request (all of them of one length), its entries finite numbers >= 0 (``itls``: a list of them per
request; ``errors`` and ``generated_texts``: text). So no row reads ``+nan%``, and no distribution
is drawn from lists that describe different requests.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from pagesim.sim.bench_check import LATENCY_KEY as _LATENCY_KEY, SCALARS, result_problem
from pagesim.reports.validation.compare import ks_statistic


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("compare", help="two vLLM bench result files side by side (real or simulated)",
                              description=__doc__.splitlines()[0])
    p.add_argument("a", metavar="A.json", help="a result file (vllm bench serve --save-result, or pagesim's)")
    p.add_argument("b", metavar="B.json", help="another")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def _successful(result: dict, key: str) -> list | None:
    values = result.get(key)
    if not isinstance(values, list):
        return None
    errors = result.get("errors")
    if isinstance(errors, list) and len(errors) == len(values):
        return [v for v, e in zip(values, errors) if not e]
    return values


def distributions(result: dict) -> dict[str, list[float]]:
    """Per-request TTFT and E2EL (s) of the successful requests, and every ITL, where the file has them."""
    out: dict[str, list[float]] = {}
    ttfts = _successful(result, "ttfts")
    if ttfts is not None:
        out["ttft"] = [float(v) for v in ttfts]
    latencies = _successful(result, "latencies")
    itls = _successful(result, "itls")
    if latencies is not None:
        out["e2el"] = [float(v) for v in latencies]
    elif ttfts is not None and itls is not None and len(itls) == len(ttfts):
        out["e2el"] = [float(t) + float(sum(g)) for t, g in zip(ttfts, itls)]  # vLLM: latency = ttft + sum(itl)
    if itls is not None:
        out["itl"] = [float(v) for gaps in itls for v in gaps]
    return out


def _latency_order(key: str) -> tuple:
    """ttft, tpot, itl, e2el (then others), each as mean, median, std, then percentiles ascending."""
    stat, metric = _LATENCY_KEY.match(key).groups()
    metrics = ("ttft", "tpot", "itl", "e2el")
    rank = metrics.index(metric) if metric in metrics else len(metrics)
    stats = ("mean", "median", "std")
    return (rank, metric, stats.index(stat) if stat in stats else 3, float(stat[1:]) if stat not in stats else 0.0)


def compare(a: dict, b: dict) -> dict:
    rows = []
    keys = [k for k in SCALARS if k in a and k in b]
    keys += sorted((k for k in a if _LATENCY_KEY.match(k) and k in b), key=_latency_order)
    for key in keys:
        va, vb = a[key], b[key]
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)) or isinstance(va, bool):
            if va is None and vb is None:
                continue
            rows.append({"metric": key, "a": va, "b": vb, "relative_difference": None})
            continue
        rel = (vb - va) / va if va != 0 else (0.0 if vb == 0 else None)
        rows.append({"metric": key, "a": va, "b": vb, "relative_difference": rel})
    da, db = distributions(a), distributions(b)
    ks = {name: ks_statistic(np.asarray(da[name], float), np.asarray(db[name], float)) for name in ("ttft", "e2el", "itl") if name in da and name in db}
    only = {"a": sorted(k for k in a if _LATENCY_KEY.match(k) and k not in b),
            "b": sorted(k for k in b if _LATENCY_KEY.match(k) and k not in a)}
    return {"metrics": rows, "ks_statistic": ks, "only_in": only,
            "sources": {side: {k: r.get(k) for k in ("backend", "model_id", "num_prompts", "request_rate",
                                                      "max_concurrency", "date")} for side, r in (("a", a), ("b", b))}}


def format_table(result: dict, name_a: str, name_b: str) -> str:
    def fmt(x) -> str:
        if x is None:
            return "-"
        if isinstance(x, float):
            return f"{x:.4g}"
        return str(x)

    width = max([len(r["metric"]) for r in result["metrics"]] + [24])
    lines = [f"A: {name_a} ({_describe(result['sources']['a'])})", f"B: {name_b} ({_describe(result['sources']['b'])})",
             "", f"{'metric':<{width}}{'A':>14}{'B':>14}{'(B-A)/A':>10}"]
    for r in result["metrics"]:
        rel = r["relative_difference"]
        lines.append(f"{r['metric']:<{width}}{fmt(r['a']):>14}{fmt(r['b']):>14}"
                     f"{'-' if rel is None else f'{100 * rel:+.1f}%':>10}")
    if result["ks_statistic"]:
        lines += ["", "Kolmogorov-Smirnov statistic of the per-request distributions (0 = same, 1 = disjoint):"]
        lines += [f"  {name:<6}{'-' if v is None else f'{v:.3f}'}" for name, v in result["ks_statistic"].items()]
    else:
        lines += ["", "no per-request lists in both files: no distribution comparison (vLLM writes them with "
                      "--save-detailed)"]
    for side in ("a", "b"):
        if result["only_in"][side]:
            lines.append(f"only in {side.upper()}: {', '.join(result['only_in'][side])}")
    return "\n".join(lines)


def _describe(source: dict) -> str:
    parts = [f"{k} {v}" for k, v in source.items() if v is not None]
    return ", ".join(parts) or "no setup keys"


def run(args: argparse.Namespace) -> int:
    from pagesim.sim.bench_result import load_result

    a, b = load_result(args.a), load_result(args.b)
    for name, side in ((args.a, a), (args.b, b)):
        problem = result_problem(side)
        if problem is not None:
            raise ValueError(f"{name}: {problem}; nothing compared")
    result = compare(a, b)
    if not result["metrics"]:
        raise ValueError(f"{args.a} and {args.b} share no vLLM bench metric (is each a --save-result file?)")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table(result, args.a, args.b))
    return 0
