"""What a ``pagesim run`` reports: the summary (JSON keys), its text form, and the files ``--out``
writes (``decisions.jsonl`` in the simulator's format, ``requests.csv``, ``steps.csv`` with each
step's phases, ``outputs.jsonl``, ``summary.json``).

Latency definitions follow the simulator's: TTFT = first token - arrival, end-to-end = finish -
arrival, TPOT = (finish - first token) / (longest sample's tokens - 1), all on the engine's clock.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path


def summarize(engine, wall_s, report, reference_wall_s, args, offline) -> dict:
    import numpy as np

    records = list(engine.records.values())
    done = [r for r in records if r.status == "completed"]
    stats = engine.stats
    sched = engine.scheduler

    def stats_of(values) -> dict:
        v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
        if not len(v):
            return {"mean": None, "p50": None, "p99": None}
        return {"mean": round(float(v.mean()), 6), "p50": round(float(np.percentile(v, 50)), 6),
                "p99": round(float(np.percentile(v, 99)), 6)}

    ttft = [r.first_token_s - r.arrival_s for r in done]
    e2e = [r.finish_s - r.arrival_s for r in done]
    tpot = []
    for r in done:
        longest = max((len(t) for t in r.outputs.values()), default=0)
        if longest > 1:
            tpot.append((r.finish_s - r.first_token_s) / (longest - 1))
    admitted = sched.num_prompt_tokens_admitted
    summary = {
        "requests": len(records), "requests_completed": len(done),
        "requests_rejected": sum(r.status == "rejected" for r in records),
        "tokens_generated": stats.tokens_generated, "prompt_tokens": sum(r.prompt_tokens for r in done),
        "steps": len(engine.steps),
        "preemptions": dict(stats.preemptions), "cow_copies": stats.cow_copies,
        "swapped_blocks": stats.swap_out_blocks + stats.swap_in_blocks,
        "swap_out_blocks": stats.swap_out_blocks, "swap_in_blocks": stats.swap_in_blocks,
        "prefix_hit_tokens": sched.num_prefix_hit_tokens,
        "prefix_hit_rate": round(sched.num_prefix_hit_tokens / admitted, 6) if admitted else None,
        "outputs_match_reference": None if report is None else report.match,
        "wall_s": round(wall_s, 4),
        "throughput_tokens_per_s": round(stats.tokens_generated / wall_s, 3) if wall_s > 0 else None,
        "requests_per_s": round(len(done) / wall_s, 4) if wall_s > 0 else None,
        "mean_step_s": round(float(np.mean([s.duration_s for s in engine.steps])), 6) if engine.steps else None,
        "ttft_s": stats_of(ttft), "tpot_s": stats_of(tpot), "e2e_s": stats_of(e2e),
        "arrivals": "offline (all at t=0)" if offline else "trace times on the wall clock",
        "validation_mode": engine.validate,
        "model": engine.model.config.name, "dtype": str(engine.model.dtype).removeprefix("torch."),
        "device": str(engine.model.device), "backend": engine.backend,
        "block_size": engine.config.block_size, "num_gpu_blocks": engine.config.num_gpu_blocks,
        "num_cpu_blocks": engine.config.num_cpu_blocks, "policy": args.policy,
        "preemption_mode": engine.config.preemption_mode if isinstance(engine.config.preemption_mode, str) else "custom",
    }
    if report is not None:
        summary.update(report.to_dict())
        summary["reference_wall_s"] = round(reference_wall_s, 4)
    return summary


def print_summary(summary: dict) -> None:
    match = summary["outputs_match_reference"]
    lines = [
        f"model {summary['model']} ({summary['dtype']}, {summary['device']}, {summary['backend']} kernels), "
        f"{summary['num_gpu_blocks']} GPU + {summary['num_cpu_blocks']} CPU blocks of {summary['block_size']} tokens",
        f"requests     {summary['requests_completed']} completed, {summary['requests_rejected']} rejected "
        f"({summary['arrivals']})",
        f"tokens       {summary['tokens_generated']} generated in {summary['steps']} steps, {summary['wall_s']:.3f} s "
        f"({summary['throughput_tokens_per_s']} tokens/s)",
        f"preemptions  {summary['preemptions']['swap']} swap, {summary['preemptions']['recompute']} recompute; "
        f"{summary['swapped_blocks']} blocks swapped, {summary['cow_copies']} copy-on-write copies, "
        f"{summary['prefix_hit_tokens']} prefix-hit tokens",
        f"latency      TTFT p50 {summary['ttft_s']['p50']} s, TPOT p50 {summary['tpot_s']['p50']} s, "
        f"end-to-end p50 {summary['e2e_s']['p50']} s",
    ]
    if match is not None:
        verdict = "all tokens match" if match else "MISMATCH"
        lines.append(f"reference    {verdict} ({summary['reference_checked_requests']} requests, "
                     f"{summary['reference_checked_tokens']} tokens, validation mode on)")
        lines += [f"  {m}" for m in summary["reference_mismatches"]]
    print("\n".join(lines))


def write_out(out: Path, engine, summary: dict) -> None:
    from engine.policy.output import dump_record

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "decisions.jsonl.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        for record in engine.scheduler.decision_log:
            f.write(dump_record(record) + "\n")
    tmp.replace(out / "decisions.jsonl")
    with open(out / "requests.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width", "status",
                "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "reject_reason"]
        w.writerow(cols)
        for r in engine.records.values():
            w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in cols])
    with open(out / "steps.csv", "w", newline="", encoding="utf-8") as f:
        rows = []
        for s in engine.steps:
            row = asdict(s)
            row.update(zip(("schedule_s", "execute_s", "sample_s", "update_s"), row.pop("phases")))
            rows.append(row)
        w = csv.writer(f)
        w.writerow(list(rows[0]) if rows else [])
        for row in rows:
            w.writerow(list(row.values()))
    with open(out / "outputs.jsonl", "w", encoding="utf-8") as f:
        for r in engine.records.values():
            f.write(json.dumps({"request_id": r.request_id, "status": r.status,
                                "outputs": {str(k): v for k, v in r.outputs.items()}}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
