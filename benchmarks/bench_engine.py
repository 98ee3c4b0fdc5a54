"""Speed of the real engine on this machine's CPU, beside a no-paging baseline timed in the same run.

What is measured
----------------
The same requests (``kwon2023-alpaca`` lengths, all at t=0) are generated twice with the same model
and weights, greedy:

- **engine**: ``Engine.run_lockstep`` with continuous batching over the paged KV cache (torch
  kernels, validation mode off, a pool large enough that nothing is preempted, and a second run
  with a tight pool so that it is), reporting output tokens per second, mean step time and the
  share of each step spent in ``schedule()``, the forward pass (with swaps and copies), sampling
  and ``update()``;
- **baseline**: each request alone, one after the other, with one contiguous cache per sequence
  and plain attention (``pagesim.engine.model.dense``: no blocks, no batching).

The ratio engine / baseline tokens per second is what batching over paged memory buys on this
machine at this model size (on a tiny model it mostly amortises per-token Python and kernel launch
overhead). Nothing here asserts a time: shared machines are noisy; each figure is the best of
``--repeats`` runs.

Usage: ``python benchmarks/bench_engine.py [--model tiny|small|...] [--requests K] [--dtype float32]
[--repeats R] [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace

import numpy as np
import torch

from pagesim.engine.model import LlamaConfig, random_model
from pagesim.engine.model.dense import DenseSequence
from pagesim.engine.policy import make_config
from pagesim.engine.policy.scheduling.admission import peak_blocks
from pagesim.engine.runtime import Engine
from pagesim.traces.generate import generate, workload_spec


def engine_run(model, requests, **settings) -> dict:
    engine = Engine(model, make_config("pagesim", max_model_len=model.config.max_position_embeddings, **settings))
    started = time.perf_counter()
    engine.run_lockstep([copy.deepcopy(r) for r in requests])
    wall = time.perf_counter() - started
    phases = np.array([s.phases for s in engine.steps]).sum(axis=0)
    return {
        "wall_s": wall, "tokens": engine.stats.tokens_generated, "steps": len(engine.steps),
        "tokens_per_s": engine.stats.tokens_generated / wall, "mean_step_ms": 1e3 * wall / len(engine.steps),
        "phase_share": dict(zip(("schedule", "execute", "sample", "update"), (phases / phases.sum()).round(3).tolist())),
        "preemptions": dict(engine.stats.preemptions),
    }


@torch.inference_mode()
def baseline_run(model, requests) -> dict:
    started = time.perf_counter()
    tokens = 0
    for r in requests:
        seq = DenseSequence(model)
        logits = seq.extend(list(r.prompt_token_ids))[-1]
        for i in range(r.max_tokens):
            token = int(torch.argmax(logits))
            tokens += 1
            if i + 1 < r.max_tokens:
                logits = seq.extend([token])[-1]
    wall = time.perf_counter() - started
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall}


def best(runs: list[dict], key: str = "wall_s") -> dict:
    return min(runs, key=lambda r: r[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 requests, one repeat (CI)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.repeats = 16, 1
    config = LlamaConfig.named(args.model)
    model = random_model(config, seed=0, dtype=getattr(torch, args.dtype))
    trace = generate(workload_spec("kwon2023-alpaca", rate_rps=1.0, num_requests=args.requests, seed=0))
    limit = config.max_position_embeddings
    requests = [replace(trace.request(i, vocab_size=config.vocab_size), arrival_time_s=0.0) for i in range(len(trace))
                if trace.prompt_len[i] + trace.output_len[i] <= limit]
    bs = args.block_size
    roomy = sum(peak_blocks(r, bs, limit) for r in requests) + 1
    tight = max(max(peak_blocks(r, bs, limit) for r in requests), roomy // 4)
    results = {
        "engine": best([engine_run(model, requests, block_size=bs, num_gpu_blocks=roomy) for _ in range(args.repeats)]),
        "engine_tight_swap": best([engine_run(model, requests, block_size=bs, num_gpu_blocks=tight, num_cpu_blocks=roomy,
                                              preemption_mode="swap") for _ in range(args.repeats)]),
        "baseline_dense_one_at_a_time": best([baseline_run(model, requests) for _ in range(args.repeats)]),
    }
    results["speedup_engine_over_baseline"] = round(
        results["engine"]["tokens_per_s"] / results["baseline_dense_one_at_a_time"]["tokens_per_s"], 2)
    results["setup"] = {"model": args.model, "dtype": args.dtype, "requests": len(requests), "block_size": bs,
                        "roomy_blocks": roomy, "tight_blocks": tight, "torch_threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(results))
        return
    e, t, b = results["engine"], results["engine_tight_swap"], results["baseline_dense_one_at_a_time"]
    print(f"{len(requests)} kwon2023-alpaca requests, {args.model} ({args.dtype}), block size {bs}, "
          f"{torch.get_num_threads()} torch threads")
    print(f"engine (roomy pool)      {e['tokens_per_s']:9.0f} tokens/s  {e['steps']} steps, {e['mean_step_ms']:.2f} ms/step, "
          f"step time: {e['phase_share']}")
    print(f"engine (tight, swapping) {t['tokens_per_s']:9.0f} tokens/s  {t['steps']} steps, preemptions {t['preemptions']}")
    print(f"baseline (no paging, one request at a time) {b['tokens_per_s']:9.0f} tokens/s")
    print(f"engine / baseline: {results['speedup_engine_over_baseline']}x")


if __name__ == "__main__":
    main()
