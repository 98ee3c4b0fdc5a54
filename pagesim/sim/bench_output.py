"""``simulate --save-result``: a simulated run as vLLM bench's result file (``pagesim.sim.bench_result``).

Each request's send time, TTFT, end-to-end latency and inter-token gaps come from the run's
per-request table and token runs (``pagesim.sim.token_runs``: a gap is a step time the request lived
through); a rejected request is a failed one (output 0, its reason in ``errors``), and so is
one aborted when its client's timeout passed (``timeout after S s``: vLLM bench's ``failed``
counts both). The summary pagesim printed goes under the file's ``pagesim`` key, with the run's
settings.

``write_vllm_result`` is what ``simulate`` and ``run`` share: the file's keys in vLLM 0.33's
order (benchmarks/serve.py:2300-2339: ``date`` ... ``num_prompts``, the ``--metadata`` keys,
``request_rate``, ``burstiness``, ``max_concurrency``, the ramp-up's three keys, then the
figures, each later key overwriting an earlier one of the same name), its default name (the
label, or the backend ``pagesim``, first; a ramp-up's rates instead of the rate), and
``--append-result``: the JSON added to the file after a newline when the file is not empty, as
vLLM opens it with mode ``a+`` (serve.py:2447-2457). The append is one ``write`` under an
exclusive lock, so runs appending to one file at once each add a whole line; a failed write
(a full disk) is cut back off, leaving the file as it was.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path

import numpy as np

from pagesim.sim.metrics import COMPLETED, TIMED_OUT
from pagesim.sim.token_runs import request_itls


def per_request(result, replicas, *, with_itls: bool):
    from pagesim.sim.bench_result import PerRequest

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
        errors=[_error(m, i, ok[i]) for i in range(n)],
    )


def _error(m, row: int, ok: bool) -> str:
    """A request's ``errors`` entry: empty when it completed, else why it failed."""
    if ok:
        return ""
    if m.status[row] == TIMED_OUT:
        return f"timed out: {m.timeout_reasons.get(row, 'the client gave up')}"
    return f"rejected: {m.reject_reasons.get(row, 'not served')}"


def _replica_of(result, n: int) -> np.ndarray:
    replica_of = getattr(result, "replica_of", None)
    return np.zeros(n, np.int64) if replica_of is None else replica_of


def save_bench_result(args, bench, trace, result, replicas, summary: dict, info: dict):
    """Write the result file ``--save-result`` asks for; returns its path."""
    from pagesim.sim.bench_result import MAX_DETAILED_TOKENS

    m = result.requests
    with_itls = bench.save_detailed or int(m.output_tokens.sum()) <= MAX_DETAILED_TOKENS
    if not with_itls:
        print(f"pagesim simulate: note: itls left out of the result file (more than {MAX_DETAILED_TOKENS:,} output "
              "tokens; --save-detailed keeps them)")
    rate = args.rate if args.rate is not None else (math.inf if getattr(args, "dataset_name", None) else None)
    pagesim = {"summary": summary, "run": info, "tokenizer": trace.metadata.get("tokenizer"),
               "trace": trace.source, "rejected": {
                   "count": int(summary["requests_rejected"]), "reasons": summary["rejection_reasons"]}}
    if summary.get("requests_timed_out"):
        pagesim["timed_out"] = {"count": int(summary["requests_timed_out"]), "timeout_s": summary["request_timeout_s"]}
    start = float(np.nanmin(m.arrival_s)) if len(m.arrival_s) else 0.0
    done = m.status == COMPLETED
    end = float(np.nanmax(m.finish_s[done])) if done.any() else start
    return write_vllm_result(
        bench, per_request(result, replicas, with_itls=with_itls), duration_s=end - start, model_id=args.model,
        tokenizer_id=getattr(args, "tokenizer", None) or args.model, num_prompts=len(trace),
        # a trace replayed at its own times has no configured rate: its own mean rate is written
        request_rate=rate if rate is not None else trace.rate_rps, file_rate=rate if rate is not None else float("nan"),
        burstiness=args.burstiness if args.burstiness is not None else 1.0, pagesim=pagesim)


def write_vllm_result(bench, per, *, duration_s: float, model_id: str, tokenizer_id: str, num_prompts: int,
                      request_rate: float, burstiness: float, pagesim: dict, file_rate: float | None = None) -> Path:
    """The result file of a run (``per``: a ``pagesim.sim.bench_result.PerRequest``), written or appended
    as ``bench`` (``pagesim.sim.bench_args.BenchSettings``) asks; returns its path. ``file_rate``: the rate
    the default file name states, when it is not ``request_rate``."""
    from pagesim.sim.bench_result import bench_result, result_path, setup_keys, write_result

    keys = setup_keys(model_id=model_id, tokenizer_id=tokenizer_id, num_prompts=num_prompts,
                      request_rate=request_rate, burstiness=burstiness, max_concurrency=bench.max_concurrency,
                      label=bench.label)
    setup = {}
    for key, value in keys.items():  # vLLM's order: --metadata after num_prompts, the ramp-up after max_concurrency
        if key == "request_rate":
            setup.update(bench.metadata)
        setup[key] = value
    ramp = bench.ramp_up
    if ramp is not None:
        setup.update(ramp_up_strategy=ramp.strategy, ramp_up_start_rps=ramp.start_rps, ramp_up_end_rps=ramp.end_rps)
        pagesim = {**pagesim, "rps_change_events": ramp.change_events(np.asarray(per.start_times, dtype=float))}
    document = bench_result(per, duration_s=duration_s, percentile_metrics=bench.percentile_metrics,
                            percentiles=bench.result_percentiles, goodput=bench.goodput, setup=setup,
                            pagesim={**pagesim, "num_warmups": bench.num_warmups})
    label = bench.label or keys["backend"]  # vLLM's: the label, else the backend
    name = bench.result_filename
    if name is None and ramp is not None:
        concurrency = f"-concurrency{bench.max_concurrency}" if bench.max_concurrency is not None else ""
        name = f"{label}-{ramp.file_name_part()}{concurrency}-{model_id.split('/')[-1]}-{keys['date']}.json"
    path = result_path(result_dir=bench.result_dir, result_filename=name, date=keys["date"],
                       request_rate=request_rate if file_rate is None else file_rate,
                       max_concurrency=bench.max_concurrency, model_id=model_id, label=label)
    if bench.append_result:
        append_result(path, document)
    else:
        write_result(path, document)
    return path


def append_result(path: Path, document: dict) -> None:
    """``--append-result``: add ``document`` to ``path`` as vLLM does, a newline first unless the
    file is empty (a new file is made). Where it may write is ``pagesim.engine.outputs``' rule, checked
    before the run (``reserve_result_file``): a regular file (a link's file) is appended to, a
    device or a FIFO with a reader is written as a stream, nothing else is touched."""
    from pagesim.engine.outputs import reserved

    output = reserved(path, "--result-filename")
    text = json.dumps(document)
    with output.append() as fh:
        fh.flush()
        fd = fh.fileno()
        if output.stream:
            fh.write(text)
            return
        fcntl.flock(fd, fcntl.LOCK_EX)  # (released when the file is closed)
        size = os.fstat(fd).st_size
        data = (("\n" if size else "") + text).encode("utf-8")
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, "the result was written in part (disk full?)", str(path))
        except BaseException:
            os.ftruncate(fd, size)  # no half line left behind
            raise
