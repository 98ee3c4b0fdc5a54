"""``pagesim run --prefill-replicas 1 --decode-replicas 1``: the run on a prefill engine and a decode
engine (``disagg.DisaggEngine``), reported as one run plus each instance's figures.

Both engines serve one model object; each has its own KV cache (``--prefill-num-gpu-blocks`` /
``--decode-num-gpu-blocks``, else ``--num-gpu-blocks``; on CUDA with neither, half the budget
vLLM's rule gives one engine each) and its own scheduler with the P/D connector
(``kv_connector="nixl"``: the ``pagesim`` or ``vllm-v1`` policy, full-attention models, no KV
offloading; the policy says so otherwise). A request's figures are the decode engine's, from its
arrival at the prefill engine; ``--check-reference`` compares the decode engine's tokens with the
no-paging run. ``--out DIR`` writes each instance's decision log (``decisions-prefill-0.jsonl``,
``decisions-decode-0.jsonl``, the simulator's format) and steps, the transfers, and the
requests, outputs and summary as a colocated run does.

One instance of each is what the engine runs; what a P/D run cannot take (several samples or
beams per request, a closed loop, client timeouts, warm-ups) is refused in one line.
"""

from __future__ import annotations

import copy
import sys
import time
from types import SimpleNamespace

#: what a P/D run's ``--out DIR`` holds (a colocated run's files too: either may be replaced by the other)
PD_OUT_FILES = ("decisions-prefill-0.jsonl", "decisions-decode-0.jsonl", "steps-prefill-0.csv", "steps-decode-0.csv",
                "transfers.csv", "requests.csv", "outputs.jsonl", "summary.json")


def add_pd_args(parser) -> None:
    g = parser.add_argument_group("disaggregated prefill/decode (vLLM's NixlConnector, one process)")
    g.add_argument("--prefill-replicas", type=int, metavar="N",
                   help="prefill instances (the engine runs 1, with --decode-replicas 1)")
    g.add_argument("--decode-replicas", type=int, metavar="M", help="decode instances (the engine runs 1)")
    g.add_argument("--prefill-num-gpu-blocks", type=int, metavar="N", help="the prefill instance's KV blocks "
                   "(default --num-gpu-blocks)")
    g.add_argument("--decode-num-gpu-blocks", type=int, metavar="N", help="the decode instance's KV blocks "
                   "(default --num-gpu-blocks)")


def pd_requested(args) -> bool:
    """Whether the run is disaggregated; refuses replica counts the engine does not run."""
    p, d = args.prefill_replicas, args.decode_replicas
    per_side = [f for f, v in (("--prefill-num-gpu-blocks", args.prefill_num_gpu_blocks),
                               ("--decode-num-gpu-blocks", args.decode_num_gpu_blocks)) if v is not None]
    if p is None and d is None:
        if per_side:
            raise ValueError(f"{per_side[0]} sizes an instance of a disaggregated run: give --prefill-replicas 1 "
                             f"--decode-replicas 1")
        return False
    if p is None or d is None:
        raise ValueError("a disaggregated run needs both --prefill-replicas and --decode-replicas")
    if (p, d) != (1, 1):
        raise ValueError(f"--prefill-replicas {p} --decode-replicas {d}: the engine runs one prefill and one decode "
                         f"instance (1 and 1)")
    for flag, value in (("--prefill-num-gpu-blocks", args.prefill_num_gpu_blocks),
                        ("--decode-num-gpu-blocks", args.decode_num_gpu_blocks)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    for flag, given, why in (
        ("--max-concurrency", args.bench.max_concurrency is not None, "the engine pair serves open-loop"),
        ("--request-timeout", args.bench.request_timeout_s is not None, "the engine pair aborts no request"),
        ("--num-warmups", bool(args.bench.num_warmups), "the engine pair serves no warm-ups"),
    ):
        if given:
            raise ValueError(f"{flag} is not run with --prefill-replicas / --decode-replicas ({why})")
    if (args.n or 1) > 1 or (args.beam_width or 1) > 1:
        raise ValueError("a disaggregated run serves one sequence per request (vLLM's proxy sends each sample as "
                         "its own request): leave --n and --beam-width at 1")
    return True


def pd_configs(args, sched_config, *, fitted: bool = False):
    """The prefill and decode instances' scheduler configs: ``sched_config`` with the P/D
    connector and each side's block count (``fitted``: ``sched_config`` holds the block count
    vLLM's rule gives one engine on this GPU, shared between the two)."""
    base = sched_config.with_overrides(kv_connector="nixl")
    configs = []
    for given in (args.prefill_num_gpu_blocks, args.decode_num_gpu_blocks):
        blocks = given if given is not None else (max(1, base.num_gpu_blocks // 2) if fitted else None)
        configs.append(base if blocks is None else base.with_overrides(num_gpu_blocks=blocks))
    return tuple(configs)


def check_requests(requests) -> None:
    many = next((r for r in requests if r.n > 1 or r.beam_width > 1), None)
    if many is not None:
        raise ValueError(f"a disaggregated run serves one sequence per request (vLLM's proxy sends each sample as its "
                         f"own request); {many.request_id} has n={many.n}, beam width {many.beam_width} (--n 1)")


def serve_pd(args, model, configs, requests, params, offline: bool, folder, *, progress_bar) -> int:
    """Serve ``requests`` on a prefill and a decode engine, report, and write ``--out``."""
    from pagesim.engine.policy.plugins.user import scheduler_class
    from pagesim.engine.runtime.disagg import DisaggEngine
    from pagesim.engine.runtime.engine import Engine, EngineStalled
    from pagesim.engine.runtime.run_output import check_served, publish

    validate = args.check_reference or args.validate
    scheduler_cls = scheduler_class(args.scheduler)
    try:
        prefill, decode = (Engine(model, config, backend=args.backend, validate=validate, sampling=params,
                                  scheduler_cls=scheduler_cls) for config in configs)
    except (RuntimeError, MemoryError) as exc:  # an allocation the memory check could not foresee
        raise ValueError(f"cannot allocate the KV caches: {str(exc).splitlines()[0]}") from None
    pd = DisaggEngine(prefill, decode)
    served = [copy.deepcopy(r) for r in requests]  # the originals stay unscheduled for the reference
    progress = progress_bar(len(served), "serving", args.no_progress,
                         detail=lambda: f"{decode.stats.tokens_generated} tokens, {len(pd.transfers)} transfers")
    started = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    on_finish = progress.update if progress else None
    try:
        if offline:
            pd.run_lockstep(served, on_finish=on_finish)
        else:
            pd.run(served, on_finish=on_finish)
    except EngineStalled as exc:
        raise ValueError(f"the scheduler stopped making progress: {exc}") from None
    except KeyboardInterrupt as exc:  # (SIGTERM too) keep what finished: summary and --out so far
        from pagesim.engine.cli import interruption

        interrupted = exc
        print(f"pagesim run: {interruption(exc)}; reporting the requests completed so far", file=sys.stderr)
    finally:
        if progress:
            progress.close()
    wall_s = time.perf_counter() - started
    report, reference_wall_s = check_served(args, model, requests, params, pd.records, interrupted, progress_bar)
    summary = summarize_pd(pd, wall_s, report, reference_wall_s, args, offline)
    return publish(args, summary, interrupted=interrupted, report=report, folder=folder,
                   write=lambda staging, s: write_pd_out(staging, pd, s),
                   bench_source=SimpleNamespace(records=pd.records), num_served=len(served))


def summarize_pd(pd, wall_s, report, reference_wall_s, args, offline) -> dict:
    """A colocated run's summary of the requests (their records the decode engine's, from their
    arrival at the prefill engine), the counts totalled over both instances, and
    ``disaggregated``: each instance's figures and the transfers."""
    from pagesim.engine.runtime.run_output import summarize
    from pagesim.sim.bench_args import summary_slo

    prefill, decode = pd.prefill, pd.decode
    summary = summarize(decode, wall_s, report, reference_wall_s, args, offline,
                        slo=summary_slo(args.bench, None, None), percentiles=args.bench.summary_percentiles,
                        records=pd.records.values())
    sides = {"prefill": side_summary(prefill), "decode": side_summary(decode)}
    transfers = list(pd.transfers.values())
    read = [t for t in transfers if t.receive_step is not None]
    admitted = prefill.scheduler.num_prompt_tokens_admitted + decode.scheduler.num_prompt_tokens_admitted
    hits = sum(s["prefix_hit_tokens"] for s in sides.values())
    steps = prefill.steps + decode.steps
    summary.update({
        "steps": len(steps),
        "mean_step_s": round(sum(s.duration_s for s in steps) / len(steps), 6) if steps else None,
        "preemptions": {mode: sum(s["preemptions"][mode] for s in sides.values()) for mode in ("swap", "recompute")},
        "cow_copies": prefill.stats.cow_copies + decode.stats.cow_copies,
        "prefix_hit_tokens": hits, "prefix_hit_rate": round(hits / admitted, 6) if admitted else None,
        "num_gpu_blocks": prefill.config.num_gpu_blocks + decode.config.num_gpu_blocks,
        "num_cpu_blocks": prefill.config.num_cpu_blocks + decode.config.num_cpu_blocks,
        "disaggregated": {
            **sides,
            "transfers": {"count": len(read), "blocks": sum(t.read_blocks for t in read),
                          "prefill_blocks_held": sum(t.prefill_blocks for t in transfers),
                          "tokens": sum(t.read_tokens for t in read), "bytes": sum(t.read_bytes for t in read),
                          "freed_unread": sum(t.receive_step is None and t.freed_step is not None for t in transfers)},
        },
    })
    return summary


def side_summary(engine) -> dict:
    sched = engine.scheduler
    admitted = sched.num_prompt_tokens_admitted
    return {"replicas": 1, "num_gpu_blocks": engine.config.num_gpu_blocks, "block_size": engine.config.block_size,
            "steps": len(engine.steps), "preemptions": dict(engine.stats.preemptions),
            "prefix_hit_tokens": sched.num_prefix_hit_tokens,
            "prefix_hit_rate": round(sched.num_prefix_hit_tokens / admitted, 6) if admitted else None,
            "requests_rejected": sched.num_rejected_requests, "requests_finished": sched.num_finished_requests}


def write_pd_out(out, pd, summary: dict) -> None:
    """``PD_OUT_FILES`` into ``out``, an existing (partial) folder, each a new file."""
    import csv
    from dataclasses import astuple, fields

    from pagesim.engine.output_folders import create_text
    from pagesim.engine.runtime.disagg import Transfer
    from pagesim.engine.runtime.run_output import (write_decisions, write_outputs, write_requests, write_steps,
                                                   write_summary)

    for role, engine in (("prefill", pd.prefill), ("decode", pd.decode)):
        write_decisions(out / f"decisions-{role}-0.jsonl", engine.scheduler)
        write_steps(out / f"steps-{role}-0.csv", engine.steps)
    with create_text(out / "transfers.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow([x.name for x in fields(Transfer)])
        for t in pd.transfers.values():
            w.writerow(["" if v is None else v for v in astuple(t)])
    records = pd.records.values()
    write_requests(out / "requests.csv", records)
    write_outputs(out / "outputs.jsonl", records)
    write_summary(out / "summary.json", summary)
