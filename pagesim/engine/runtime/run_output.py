"""What a ``pagesim run`` reports: the summary (JSON keys), its text form, and the files ``--out``
writes (``decisions.jsonl`` in the simulator's format, ``requests.csv``, ``steps.csv`` with each
step's phases, ``outputs.jsonl``, ``summary.json``), into a folder built beside DIR and renamed
into place once whole (``pagesim.engine.atomic.OutputFolder``).

Latency definitions follow the simulator's: TTFT = first token - arrival, end-to-end = finish -
arrival, TPOT = (finish - first token) / (longest sample's tokens - 1), all on the engine's clock.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

# what --out DIR holds: a DIR holding only these may be replaced by a new run's
OUT_FILES = ("decisions.jsonl", "requests.csv", "steps.csv", "outputs.jsonl", "summary.json")


def summarize(engine, wall_s, report, reference_wall_s, args, offline, *, slo, percentiles,
              max_concurrency=None, records=None) -> dict:
    """The run's summary; request figures under the simulator's names and definitions
    (``pagesim.sim.metrics``, ``pagesim.sim.bench_metrics``), on the engine's wall clock.
    ``records``: the requests' records, if not ``engine``'s (a P/D run's span two engines)."""
    import numpy as np

    from pagesim.sim.bench_metrics import latency_stats, max_tokens_per_second, peak_in_flight

    records = list(engine.records.values() if records is None else records)
    done = [r for r in records if r.status == "completed"]
    stats = engine.stats
    sched = engine.scheduler
    per = per_request_times(done)

    def stats_of(values, weights=None) -> dict:
        return latency_stats(values, percentiles, weights)

    meets = slo.meets(per["ttft"], per["tpot"], per["e2e"])
    start = min((r.arrival_s for r in done), default=0.0)
    end = max((r.finish_s for r in done), default=start)
    duration = end - start
    prompt_tokens = sum(r.prompt_tokens for r in done)
    tokens = sum(r.output_tokens for r in done)
    token_times = np.asarray([t for r in done for t in r.token_times_s], dtype=float)

    def per_s(x: float) -> float | None:
        return round(x / duration, 6) if duration > 0 else None

    admitted = sched.num_prompt_tokens_admitted
    rejected = sum(r.status == "rejected" for r in records)
    timed_out = [r for r in records if r.status == "timed_out"]
    summary = {
        "requests": len(records), "requests_total": len(records), "requests_completed": len(done),
        "requests_rejected": rejected,
        "rejection_reasons": dict(Counter(r.reject_reason for r in records if r.status == "rejected").most_common(3)),
        # (the simulator's keys: requests aborted when the client's --request-timeout passed, failed as
        # rejected ones are; the tokens they had generated, not counted in tokens_generated)
        "requests_timed_out": len(timed_out), "requests_failed": rejected + len(timed_out),
        "request_timeout_s": args.bench.request_timeout_s,
        "timed_out_output_tokens": sum(r.output_tokens for r in timed_out),
        "tokens_generated": stats.tokens_generated, "prompt_tokens": prompt_tokens,
        "steps": len(engine.steps),
        "preemptions": dict(stats.preemptions), "cow_copies": stats.cow_copies,
        "swapped_blocks": stats.swap_out_blocks + stats.swap_in_blocks,
        "swap_out_blocks": stats.swap_out_blocks, "swap_in_blocks": stats.swap_in_blocks,
        "prefix_hit_tokens": sched.num_prefix_hit_tokens,
        "prefix_hit_rate": round(sched.num_prefix_hit_tokens / admitted, 6) if admitted else None,
        "outputs_match_reference": None if report is None else report.match,
        "wall_s": round(wall_s, 4),
        "duration_s": round(duration, 6),
        "throughput_rps": per_s(len(done)),
        "throughput_tokens_s": per_s(tokens),
        "throughput_input_tokens_s": per_s(prompt_tokens),
        "throughput_total_tokens_s": per_s(prompt_tokens + tokens),
        "goodput_rps": per_s(int(meets.sum())),
        "slo": {**slo.to_dict(), "met": int(meets.sum()),
                "attained": round(int(meets.sum()) / len(records), 6) if records else None},
        "max_concurrent_requests": peak_in_flight(per["start"], per["finish"]),
        "max_output_tokens_per_s": (max_tokens_per_second(token_times, np.ones(len(token_times), np.int64), start, end)
                                    if done else None),
        "mean_step_s": round(float(np.mean([s.duration_s for s in engine.steps])), 6) if engine.steps else None,
        "ttft_s": stats_of(per["ttft"]), "tpot_s": stats_of(per["tpot"]),
        "itl_s": stats_of(np.concatenate(per["itls"]) if per["itls"] else []),
        "e2e_s": stats_of(per["e2e"]),
        "arrivals": ("offline (all at t=0)" if offline else
                     "all due at t=0 on the wall clock" if _all_due_at_once(args) else
                     "trace times on the wall clock")
                    + (f", closed loop of at most {max_concurrency} in flight" if max_concurrency else ""),
        "validation_mode": engine.validate,
        "model": engine.model.config.name, "dtype": str(engine.model.dtype).removeprefix("torch."),
        "device": str(engine.model.device), "backend": engine.backend,
        "block_size": engine.config.block_size, "num_gpu_blocks": engine.config.num_gpu_blocks,
        "num_cpu_blocks": engine.config.num_cpu_blocks, "policy": args.policy,
        "preemption_mode": engine.config.preemption_mode if isinstance(engine.config.preemption_mode, str) else "custom",
    }
    if sched.offload is not None:  # the second KV tier (pagesim/engine/policy/offload); prefix_hit_tokens counts both
        summary.update({
            "num_offload_blocks": engine.config.num_offload_blocks,
            "offload_eviction_policy": engine.config.offload_eviction_policy,
            "offload_hit_tokens": sched.num_offload_hit_tokens,
            "offload_loaded_blocks": stats.offload_loaded_blocks, "offload_stored_blocks": stats.offload_stored_blocks,
            "offload_evictions": sched.offload.store.num_evictions,
        })
    if report is not None:
        summary.update(report.to_dict())
        summary["reference_wall_s"] = round(reference_wall_s, 4)
    return summary


def _all_due_at_once(args) -> bool:
    """``--request-rate inf``, or a dataset sent without a rate (vLLM bench's default: inf)."""
    rate = getattr(args, "rate", None)
    return rate == float("inf") or (rate is None and getattr(args, "dataset_name", None) is not None)


def per_request_times(done) -> dict:
    """Send, finish, TTFT, TPOT (NaN under two tokens: the longest sample's), E2E and ITL gaps of
    completed request records."""
    import numpy as np

    start = np.asarray([r.arrival_s for r in done], dtype=float)
    finish = np.asarray([r.finish_s for r in done], dtype=float)
    first = np.asarray([r.first_token_s for r in done], dtype=float)
    longest = np.asarray([max((len(t) for t in r.outputs.values()), default=0) for r in done], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(longest > 1, (finish - first) / (longest - 1), np.nan)
    return {"start": start, "finish": finish, "ttft": first - start, "tpot": tpot, "e2e": finish - start,
            "itls": [np.diff(r.token_times_s) for r in done]}


def check_served(args, model, requests, params, records, interrupted, progress_bar) -> tuple:
    """After serving: warn of rejected requests, and with ``--check-reference`` (not after an
    interruption) compare the completed outputs with the no-paging reference; returns
    (report or None, the reference's wall seconds or None)."""
    import sys
    import time

    from pagesim.engine.runtime.reference import check_outputs

    rejected = [r for r in records.values() if r.status == "rejected"]
    if rejected:
        print(f"pagesim run: warning: {len(rejected)} request(s) rejected, e.g. {rejected[0].request_id}: "
              f"{rejected[0].reject_reason}", file=sys.stderr)
    if not args.check_reference or interrupted is not None:
        return None, None
    outputs = {rid: r.outputs for rid, r in records.items() if r.status == "completed"}
    progress = progress_bar(len(outputs), "reference", args.no_progress)
    t0 = time.perf_counter()
    report = check_outputs(model, requests, outputs, lambda r: params, progress=progress.update if progress else None)
    reference_wall_s = time.perf_counter() - t0
    if progress:
        progress.close()
    return report, reference_wall_s


def publish(args, summary: dict, *, interrupted, report, folder, write, bench_source, num_served: int) -> int:
    """The run's ends: its bench result file (``--save-result``; ``bench_source``: what holds its
    records), ``--out`` (``write(staging, summary)``), the summary printed; the exit status."""
    import sys

    summary["interrupted"] = interrupted is not None
    summary["threads"] = args.threads
    if args.bench.save_result:
        path = save_bench_result(args, bench_source, summary, num_served)
        print(f"pagesim run: wrote {path}", file=sys.stderr)
    if folder is not None:
        with folder as staging:  # written beside --out, renamed into place once whole
            write(staging, summary)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print_summary(summary)
    if interrupted is not None:
        from pagesim.engine.cli import interrupted_status

        return interrupted_status(interrupted)
    return 0 if report is None or report.match else 1


def print_summary(summary: dict) -> None:
    from pagesim.sim.output import timed_out_words

    match = summary["outputs_match_reference"]
    timed_out = timed_out_words(summary)  # "N timed out after S s", or None
    lines = [
        f"model {summary['model']} ({summary['dtype']}, {summary['device']}, {summary['backend']} kernels, "
        f"{summary.get('threads')} CPU thread{'' if summary.get('threads') == 1 else 's'}), "
        f"{summary['num_gpu_blocks']} GPU + {summary['num_cpu_blocks']} CPU blocks of {summary['block_size']} tokens",
        f"requests     {summary['requests_completed']} completed, {summary['requests_rejected']} rejected"
        f"{', ' + timed_out if timed_out else ''} ({summary['arrivals']})",
        f"tokens       {summary['tokens_generated']} generated in {summary['steps']} steps, {summary['wall_s']:.3f} s "
        f"({summary['throughput_tokens_s']} tokens/s; peak {summary['max_concurrent_requests']} requests in flight)",
        f"preemptions  {summary['preemptions']['swap']} swap, {summary['preemptions']['recompute']} recompute; "
        f"{summary['swapped_blocks']} blocks swapped, {summary['cow_copies']} copy-on-write copies, "
        f"{summary['prefix_hit_tokens']} prefix-hit tokens",
        f"latency      TTFT p50 {summary['ttft_s']['p50']} s, TPOT p50 {summary['tpot_s']['p50']} s, "
        f"ITL p50 {summary['itl_s']['p50']} s, end-to-end p50 {summary['e2e_s']['p50']} s",
    ]
    if "disaggregated" in summary:  # (per instance, after the totals)
        lines[4:4] = _disagg_lines(summary["disaggregated"])
    if "offload_hit_tokens" in summary:
        lines.insert(4, f"offloading   {summary['num_offload_blocks']} CPU blocks "
                        f"({summary['offload_eviction_policy']}): {summary['offload_hit_tokens']} of the prefix-hit "
                        f"tokens loaded from it; "
                        f"{summary['offload_loaded_blocks']} blocks loaded, {summary['offload_stored_blocks']} stored, "
                        f"{summary['offload_evictions']} evicted")
    if summary["requests_rejected"]:
        lines.insert(0, f"NOTE: {summary['requests_rejected']} of {summary['requests_total']} requests were rejected "
                        f"by the policy and never served; they count as failed and as missing every SLO")
    if match is not None:
        verdict = "all tokens match" if match else "MISMATCH"
        lines.append(f"reference    {verdict} ({summary['reference_checked_requests']} requests, "
                     f"{summary['reference_checked_tokens']} tokens, validation mode on)")
        lines += [f"  {m}" for m in summary["reference_mismatches"]]
    print("\n".join(lines))


def _disagg_lines(pd: dict) -> list[str]:
    lines = []
    for role in ("prefill", "decode"):
        side = pd[role]
        pre = side["preemptions"]
        lines.append(f"  {role:<10} {side['num_gpu_blocks']} GPU blocks of {side['block_size']} tokens: "
                     f"{side['steps']} steps, {pre['recompute']} recompute + {pre['swap']} swap preemptions, "
                     f"{side['prefix_hit_tokens']} prefix-hit tokens, {side['requests_rejected']} rejected")
    t = pd["transfers"]
    lines.append(f"transfers    {t['count']} reads prefill -> decode: {t['blocks']} blocks, {t['tokens']} tokens, "
                 f"{t['bytes']} bytes")
    return lines


def write_out(out: Path, engine, summary: dict) -> None:
    """``OUT_FILES`` into ``out``, an existing (partial) folder, each a new file (``create_text``:
    never through a link, never over a file already there)."""
    write_decisions(out / "decisions.jsonl", engine.scheduler)
    write_requests(out / "requests.csv", engine.records.values())
    write_steps(out / "steps.csv", engine.steps)
    write_outputs(out / "outputs.jsonl", engine.records.values())
    write_summary(out / "summary.json", summary)


def write_decisions(path: Path, scheduler) -> None:
    """``scheduler``'s decision log, one record a line (the simulator's format)."""
    from pagesim.engine.output_folders import create_text
    from pagesim.engine.policy.scheduling.output import dump_record

    with create_text(path, encoding="ascii") as f:
        for record in scheduler.decision_log:
            f.write(dump_record(record) + "\n")


def write_requests(path: Path, records) -> None:
    from pagesim.engine.output_folders import create_text

    with create_text(path, newline="") as f:
        w = csv.writer(f)
        cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width", "status",
                "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "reject_reason"]
        w.writerow(cols)
        for r in records:  # (reject_reason: why it failed, rejected or aborted)
            w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in cols[:-1]]
                       + [r.reject_reason or r.timeout_reason])


def write_steps(path: Path, steps) -> None:
    from pagesim.engine.output_folders import create_text

    with create_text(path, newline="") as f:
        rows = []
        for s in steps:
            row = asdict(s)
            row.update(zip(("schedule_s", "execute_s", "sample_s", "update_s"), row.pop("phases")))
            rows.append(row)
        w = csv.writer(f)
        w.writerow(list(rows[0]) if rows else [])
        for row in rows:
            w.writerow(list(row.values()))


def write_outputs(path: Path, records) -> None:
    from pagesim.engine.output_folders import create_text

    with create_text(path) as f:
        for r in records:
            f.write(json.dumps({"request_id": r.request_id, "status": r.status,
                                "outputs": {str(k): v for k, v in r.outputs.items()}}) + "\n")


def write_summary(path: Path, summary: dict) -> None:
    from pagesim.engine.output_folders import create_text

    with create_text(path) as f:
        f.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def save_bench_result(args, engine, summary: dict, num_prompts: int):
    """``pagesim run --save-result``: the run as vLLM bench's result file (``pagesim.sim.bench_result``);
    a rejected request is a failed one; the ITLs are the gaps between the steps that gave each
    request a token, on the wall clock."""
    import math

    import numpy as np

    from pagesim.sim.bench_result import PerRequest
    from pagesim.sim.bench_output import write_vllm_result

    bench = args.bench
    records = list(engine.records.values())
    ok = [r.status == "completed" for r in records]
    per = PerRequest(
        input_lens=[r.prompt_tokens for r in records],
        output_lens=[r.output_tokens if good else 0 for r, good in zip(records, ok)],
        success=ok,
        start_times=[r.arrival_s for r in records],
        ttfts=[r.first_token_s - r.arrival_s if good else 0.0 for r, good in zip(records, ok)],
        latencies=[r.finish_s - r.arrival_s if good else 0.0 for r, good in zip(records, ok)],
        itls=[np.diff(r.token_times_s).tolist() if good else [] for r, good in zip(records, ok)],
        errors=["" if good else f"{r.status}: {r.reject_reason or r.timeout_reason}" for r, good in zip(records, ok)],
    )
    rate = math.inf if args.rate is None or summary["arrivals"].startswith("offline") else args.rate
    return write_vllm_result(bench, per, duration_s=summary["duration_s"], model_id=str(args.model),
                             tokenizer_id=getattr(args, "tokenizer", None) or str(args.model), num_prompts=num_prompts,
                             request_rate=rate, burstiness=args.burstiness if args.burstiness is not None else 1.0,
                             pagesim={"summary": summary, "engine": True})
