"""``simulate --save-result``: a simulated run as vLLM bench's result file (``reports.bench_result``).

Each request's send time, TTFT, end-to-end latency and inter-token gaps come from the run's
per-request table and token runs (``sim.token_runs``: a gap is a step time the request lived
through); a rejected request is a failed one (output 0, its reason in ``errors``). The summary
pagesim printed goes under the file's ``pagesim`` key, with the run's settings.
"""

from __future__ import annotations

import math

import numpy as np

from sim.metrics import COMPLETED
from sim.token_runs import request_itls


def per_request(result, replicas, *, with_itls: bool):
    from reports.bench_result import PerRequest

    m = result.requests
    n = len(m.status)
    ok = m.status == COMPLETED
    gaps: dict[int, list[float]] = {}
    if with_itls:
        replica_of = _replica_of(result, n)
        for replica in replicas:
            rows = np.flatnonzero(ok & (replica_of == replica.index))
            runs = replica.token_runs.runs(replica.index, rows)
            gaps.update(request_itls(runs, replica.steps.array("start_s"), replica.steps.array("duration_s")))
    zero = np.zeros(n)
    return PerRequest(
        input_lens=m.prompt_tokens.tolist(),
        output_lens=np.where(ok, m.output_tokens, 0).tolist(),
        success=ok.tolist(),
        start_times=np.nan_to_num(m.arrival_s).tolist(),
        ttfts=np.where(ok, m.ttft_s(), zero).tolist(),
        latencies=np.where(ok, m.e2e_s(), zero).tolist(),
        itls=[gaps.get(i, []) for i in range(n)] if with_itls else None,
        errors=[("" if ok[i] else f"rejected: {m.reject_reasons.get(i, 'not served')}") for i in range(n)],
    )


def _replica_of(result, n: int) -> np.ndarray:
    replica_of = getattr(result, "replica_of", None)
    return np.zeros(n, np.int64) if replica_of is None else replica_of


def save_bench_result(args, bench, trace, result, replicas, summary: dict, info: dict):
    """Write the result file ``--save-result`` asks for; returns its path."""
    from reports.bench_result import (MAX_DETAILED_TOKENS, bench_result, result_path, setup_keys,
                                      write_result)

    m = result.requests
    with_itls = bench.save_detailed or int(m.output_tokens.sum()) <= MAX_DETAILED_TOKENS
    if not with_itls:
        print(f"pagesim simulate: note: itls left out of the result file (more than {MAX_DETAILED_TOKENS:,} output "
              "tokens; --save-detailed keeps them)")
    rate = args.rate if args.rate is not None else (math.inf if getattr(args, "dataset_name", None) else None)
    setup = setup_keys(model_id=args.model, tokenizer_id=getattr(args, "tokenizer", None) or args.model,
                       num_prompts=len(trace), request_rate=rate if rate is not None else float("nan"),
                       burstiness=args.burstiness if args.burstiness is not None else 1.0,
                       max_concurrency=bench.max_concurrency)
    if rate is None:  # a trace replayed at its own times: no single configured rate
        setup["request_rate"] = trace.rate_rps
    pagesim = {"summary": summary, "run": info, "tokenizer": trace.metadata.get("tokenizer"),
               "trace": trace.source, "rejected": {
                   "count": int(summary["requests_rejected"]), "reasons": summary["rejection_reasons"]}}
    start = float(np.nanmin(m.arrival_s)) if len(m.arrival_s) else 0.0
    done = m.status == COMPLETED
    end = float(np.nanmax(m.finish_s[done])) if done.any() else start
    document = bench_result(per_request(result, replicas, with_itls=with_itls), duration_s=end - start,
                            percentile_metrics=bench.percentile_metrics, percentiles=bench.result_percentiles,
                            goodput=bench.goodput, setup=setup, pagesim=pagesim)
    path = result_path(result_dir=bench.result_dir, result_filename=bench.result_filename, date=setup["date"],
                       request_rate=rate if rate is not None else float("nan"), max_concurrency=bench.max_concurrency,
                       model_id=args.model)
    write_result(path, document)
    return path
