"""pagesim run: serve a trace or workload on the real engine (a Llama model on paged KV tensors).

The scheduler and block manager are the simulator's; here their decisions are carried out on
tensors. A named workload without ``--rate`` is served offline (every request at t=0, as
``vllm bench throughput`` does); a trace keeps its arrival times, on the wall clock.
``--check-reference`` turns on validation mode (freed blocks filled with NaN) and then generates
every request again alone with no paging, reporting whether all tokens match. ``--json`` prints
one JSON object; ``--out DIR`` writes the summary, per-request and per-step tables, the outputs
and the decision log (the simulator's format). ``--prefill-replicas 1 --decode-replicas 1`` serves
on a prefill engine and a decode engine, the KV copied between their caches (``disagg_run``).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

DTYPES = ("auto", "float64", "float32", "float16", "bfloat16")
CPU_KV_CACHE_GB = 1.0  # default KV cache on CPU, where no memory-utilization rule applies
SWAP_SPACE_GB = 4.0  # vLLM's default swap space
MAX_GIB = 2.0**32  # larger sizes are typos, and overflow a byte count
LONG_WAIT_S = 600.0  # a trace whose last arrival is later than this is worth a word before waiting


def add_parser(subparsers) -> None:
    from pagesim.engine.commands.policy_args import add_policy_args
    from pagesim.engine.threads import add_threads_arg
    from pagesim.sim.bench_args import add_bench_args
    from pagesim.traces.source import add_source_args

    p = subparsers.add_parser("run", help="serve a trace or workload on the real engine (paged KV tensors)",
                              description=__doc__.splitlines()[0])
    add_source_args(p)
    g = p.add_argument_group("model and device")
    g.add_argument("--model", default="tiny", help="preset (tiny, small, llama-125m, llama-350m, ...; random weights "
                   "from --model-seed) or a Hugging Face Llama folder (default tiny)")
    g.add_argument("--model-seed", type=int, default=0, metavar="S", help="seed of random weights (default 0)")
    g.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="auto: float64 on CPU with the torch backend (exact reference checks), float32 with Triton "
                        "on CPU, bfloat16 on CUDA (float32 with --check-reference)")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="(default: cuda if available)")
    from pagesim.sim.bench_args import VLLM_GENERATE_BACKENDS, VLLM_POOLING_BACKENDS

    # (vllm bench serve's --backend names are accepted too, with a note: sim.bench_args)
    g.add_argument("--backend", choices=["auto", "torch", "triton", *VLLM_GENERATE_BACKENDS, *VLLM_POOLING_BACKENDS],
                   default="auto", metavar="{auto,torch,triton}",
                   help="attention kernels: triton on CUDA and torch on CPU by default; triton on CPU needs "
                        "TRITON_INTERPRET=1 (slow)")
    add_threads_arg(g, "default: the usable CPUs less the load average, at least 1; OMP_NUM_THREADS if set")
    k = p.add_argument_group("KV cache")
    k.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks", type=int, metavar="N",
                   help="KV-cache blocks (overrides the memory budget; vLLM's --num-gpu-blocks-override)")
    k.add_argument("--kv-cache-gb", type=float, metavar="GIB",
                   help=f"KV-cache GiB (default on CPU: {CPU_KV_CACHE_GB:g})")
    k.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help="CUDA: size the cache as vLLM does, memory x F - weights - activations (default 0.9)")
    k.add_argument("--swap-space", type=float, metavar="GIB",
                   help=f"CPU swap GiB (default {SWAP_SPACE_GB:g}, as vLLM, but no more blocks than the GPU cache)")
    k.add_argument("--num-cpu-blocks", type=int, metavar="N", help="CPU swap blocks (overrides --swap-space)")
    add_policy_args(p)
    s = p.add_argument_group("sampling")
    s.add_argument("--n", type=int, metavar="K", help="parallel samples per request (overrides the trace)")
    s.add_argument("--beam-width", type=int, metavar="W", help="beam search width (overrides the trace)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1)")
    s.add_argument("--sampling-seed", type=int, default=0, metavar="S", help="seed of the sampling noise (default 0)")
    o = p.add_argument_group("run")
    o.add_argument("--offline", action="store_true", help="release every request at t=0 (whatever the trace says)")
    o.add_argument("--check-reference", action="store_true",
                   help="validation mode, then rerun every request alone with no paging and compare all tokens")
    o.add_argument("--validate", action="store_true", help="validation mode only: freed blocks are filled with NaN")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    o.add_argument("--out", metavar="DIR", help="write summary, tables, outputs and the decision log here")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar (on a terminal), nor a progress line a minute (otherwise)")
    add_bench_args(p)
    from pagesim.engine.runtime.disagg_run import add_pd_args

    add_pd_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagesim.engine.atomic import OutputFolder
    from pagesim.engine.runtime.disagg_run import PD_OUT_FILES, check_requests, pd_configs, pd_requested
    from pagesim.engine.runtime.run_output import OUT_FILES
    from pagesim.engine.threads import checked_threads, default_threads, set_threads
    from pagesim.sim.bench_result import reserve_result_file
    from pagesim.sim.bench_args import bench_settings
    from pagesim.traces.source import reported_warnings, trace_from_args

    threads = checked_threads(args.threads)
    args.bench = bench_settings(args)
    disagg = pd_requested(args)  # --prefill-replicas / --decode-replicas (refused before any work if unrunnable)
    offline = args.offline
    if args.workload is not None and args.rate is None and args.arrival is None:
        args.rate, offline = 1.0, True  # offline: the arrival times are replaced by 0 below
    if offline and args.bench.max_concurrency is not None:  # a closed loop runs on the wall clock
        args.rate, offline = float("inf"), False
    with reported_warnings("run", strict=args.strict):
        trace = trace_from_args(args)
    import torch

    args.threads = set_threads(threads or default_threads())  # before torch does any work (engine.threads)
    from pagesim.engine.model import load_model
    from pagesim.engine.model.weights import DTYPES as TORCH_DTYPES, model_config
    from pagesim.engine.runtime.memory_check import check_memory

    owned = OUT_FILES + PD_OUT_FILES if disagg else OUT_FILES
    folder = OutputFolder(args.out, owned) if args.out else None  # before any work: results need a place
    reserve_result_file(args.bench)  # and --save-result's file
    device = device_for(args.device, torch)
    config = model_config(args.model)
    dtype = dtype_for(args.dtype, device, args.backend, TORCH_DTYPES, args.check_reference)
    sched_config = _scheduler_config(args, config, dtype, device)
    fit_on_device = args.num_gpu_blocks is None and args.kv_cache_gb is None and device.type == "cuda"
    if disagg:
        fit_on_device = fit_on_device and None in (args.prefill_num_gpu_blocks, args.decode_num_gpu_blocks)
        pd = pd_configs(args, sched_config)  # (the connector's own checks: policy, model, offloading)
    # the model's weights and the KV cache against the memory there is, before either is allocated
    check_memory(config, dtype, device, _together(pd) if disagg else sched_config, model=args.model,
                 kv_known=not fit_on_device)
    requests = _requests(trace, args, config, sched_config, offline)
    if disagg:
        check_requests(requests)
    params = _sampling(args)
    if not fit_on_device:  # the cache size is known now: refuse a hopeless run before loading the model
        for c in pd if disagg else (sched_config,):
            _check_servable(requests, c)
    try:
        model = load_model(args.model, seed=args.model_seed, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as exc:  # an allocation the check above could not foresee (another
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # process took the memory meanwhile)
        if isinstance(exc, RuntimeError) and "alloc" not in said and "out of memory" not in said:
            raise
        raise ValueError(f"cannot allocate the model's weights (--model {args.model}): {said}") from None
    if fit_on_device:
        sched_config = _fit_cuda_cache(model, sched_config, args)
        if disagg:  # (the two caches share the budget one engine would get)
            pd = pd_configs(args, sched_config, fitted=True)
        check_memory(config, dtype, device, _together(pd) if disagg else sched_config)  # (the caches alone now)
        for c in pd if disagg else (sched_config,):
            _check_servable(requests, c)
    if disagg:
        from pagesim.engine.runtime.disagg_run import serve_pd

        return serve_pd(args, model, pd, requests, params, offline, folder, progress_bar=_progress)
    return _serve(args, model, sched_config, requests, params, offline, folder)


def _together(configs):
    """One config holding the caches of several engines (for the memory check)."""
    first = configs[0]
    return first.with_overrides(num_gpu_blocks=sum(c.num_gpu_blocks for c in configs),
                                num_cpu_blocks=sum(c.num_cpu_blocks for c in configs))


def _serve(args, model, sched_config, requests, params, offline: bool, folder) -> int:
    """Serve ``requests``, report, and write ``--out`` into ``folder`` (an ``OutputFolder``, or None)."""
    import copy

    from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS, abort_words
    from pagesim.engine.policy.plugins.user import scheduler_class
    from pagesim.engine.runtime import Engine
    from pagesim.engine.runtime.engine import EngineStalled
    from pagesim.engine.runtime.run_output import check_served, publish, summarize, write_out

    validate = args.check_reference or args.validate
    scheduler_cls = scheduler_class(args.scheduler)  # the default, or a --plugin's (policy_overrides loaded it)
    if args.bench.num_warmups and requests:  # on an engine of their own: the measured one starts empty
        from pagesim.engine.runtime.warmup import serve_warmups

        serve_warmups(lambda: Engine(model, sched_config, backend=args.backend, sampling=params,
                                     scheduler_cls=scheduler_cls), requests[0], args.bench.num_warmups,
                      max_concurrency=args.bench.max_concurrency)
    try:
        engine = Engine(model, sched_config, backend=args.backend, validate=validate, sampling=params,
                        scheduler_cls=scheduler_cls)
    except (RuntimeError, MemoryError) as exc:  # an allocation the check above could not foresee
        raise ValueError(f"cannot allocate the KV cache: {str(exc).splitlines()[0]}") from None
    served = [copy.deepcopy(r) for r in requests]  # the originals stay unscheduled for the reference
    progress = _progress(len(served), "serving", args.no_progress,
                         detail=lambda: f"{engine.stats.tokens_generated} tokens")
    started = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    try:
        timeout_s = args.bench.request_timeout_s
        if offline:
            engine.run_lockstep(served, on_finish=progress.update if progress else None, request_timeout_s=timeout_s)
        else:
            engine.run(served, on_finish=progress.update if progress else None,
                       max_concurrency=args.bench.max_concurrency, request_timeout_s=timeout_s)
    except EngineStalled as exc:
        raise ValueError(f"the scheduler stopped making progress: {exc}") from None
    except VLLM_V0_ABORTS as exc:  # the vllm-v0 preset stops where vLLM 0.6.3 aborts (as simulate does)
        raise ValueError(abort_words(exc)) from None
    except KeyboardInterrupt as exc:  # (SIGTERM too) keep what finished: summary and --out so far
        from pagesim.engine.cli import interruption

        interrupted = exc
        print(f"pagesim run: {interruption(exc)}; reporting the requests completed so far", file=sys.stderr)
    finally:
        if progress:
            progress.close()
    wall_s = time.perf_counter() - started
    report, reference_wall_s = check_served(args, model, requests, params, engine.records, interrupted, _progress)
    from pagesim.sim.bench_args import summary_slo

    summary = summarize(engine, wall_s, report, reference_wall_s, args, offline,
                        slo=summary_slo(args.bench, None, None), percentiles=args.bench.summary_percentiles,
                        max_concurrency=args.bench.max_concurrency)
    return publish(args, summary, interrupted=interrupted, report=report, folder=folder,
                   write=lambda staging, s: write_out(staging, engine, s), bench_source=engine, num_served=len(served))


# ------------------------------------------------------------------ setup
def device_for(choice: str, torch):
    """``--device``: auto = CUDA when available; a clear error when CUDA is asked for and absent."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(choice)


def dtype_for(choice: str, device, backend: str, TORCH_DTYPES, check_reference: bool = False):
    """``--dtype``: auto = bfloat16 on CUDA (float32 for a reference check), float64 on CPU with the
    torch kernels, float32 with Triton's interpreter."""
    if choice != "auto":
        return TORCH_DTYPES[choice]
    if device.type == "cuda":  # a token-exact reference check in bfloat16 would flip near-ties
        return TORCH_DTYPES["float32" if check_reference else "bfloat16"]
    return TORCH_DTYPES["float32" if backend == "triton" else "float64"]


def refuse_priority_on_the_engine(overrides: dict, command: str) -> None:
    """``--scheduling-policy priority`` is simulated, not yet run on the engine: a request
    un-scheduled mid-step (vLLM 0.33's priority victim) leaves blocks registered in the prefix cache
    that its step never wrote, which vLLM does too; until the engine is checked against that
    (``--check-reference``), it refuses the policy rather than risk serving unwritten KV."""
    if overrides.get("scheduling_policy") == "priority":
        raise ValueError(f"--scheduling-policy priority is simulated only for now; `pagesim {command}` runs "
                         "the engine, which does not take it yet (use pagesim simulate)")


def _scheduler_config(args, config, dtype, device):
    from pagesim.engine.policy import make_config
    from pagesim.engine.commands.policy_args import offload_blocks, policy_overrides
    from pagesim.engine.runtime.kv_cache import GiB, block_bytes, blocks_for_budget, scheduler_kv_settings

    overrides = policy_overrides(args)
    refuse_priority_on_the_engine(overrides, "run")
    max_model_len = args.max_model_len or config.max_position_embeddings
    if max_model_len > config.max_position_embeddings:
        raise ValueError(f"--max-model-len {max_model_len} exceeds {config.name}'s context "
                         f"({config.max_position_embeddings} tokens)")
    block_size = args.block_size
    given = [f for f, v in (("--num-gpu-blocks", args.num_gpu_blocks), ("--kv-cache-gb", args.kv_cache_gb),
                            ("--gpu-memory-utilization", args.gpu_memory_utilization)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one of {', '.join(given)}, not several: each sizes the KV cache")
    if args.num_gpu_blocks is not None:
        if args.num_gpu_blocks < 1:
            raise ValueError(f"--num-gpu-blocks must be >= 1, got {args.num_gpu_blocks}")
        num_gpu_blocks = args.num_gpu_blocks
    else:
        gib = args.kv_cache_gb if args.kv_cache_gb is not None else CPU_KV_CACHE_GB
        if not 0 < gib < MAX_GIB:
            raise ValueError(f"--kv-cache-gb must be a positive number of GiB below {MAX_GIB:g}, got {gib}")
        num_gpu_blocks = blocks_for_budget(int(gib * GiB), config, block_size, dtype)  # CUDA: refitted later
        if num_gpu_blocks < 1:
            raise ValueError(f"{gib:g} GiB holds no block of {block_size} tokens of {config.name}")
    if args.num_cpu_blocks is not None:
        if args.num_cpu_blocks < 0:
            raise ValueError(f"--num-cpu-blocks must be >= 0, got {args.num_cpu_blocks}")
        num_cpu_blocks = args.num_cpu_blocks
    else:
        gib = SWAP_SPACE_GB if args.swap_space is None else args.swap_space
        if not 0 <= gib < MAX_GIB:
            raise ValueError(f"--swap-space must be a number of GiB in [0, {MAX_GIB:g}), got {gib}")
        num_cpu_blocks = blocks_for_budget(int(gib * GiB), config, block_size, dtype)
        if args.swap_space is None:
            num_cpu_blocks = min(num_cpu_blocks, num_gpu_blocks)
    num_offload_blocks = offload_blocks(args, block_bytes(config, block_size, dtype))
    if num_offload_blocks is not None:  # (None: the preset's, none)
        overrides["num_offload_blocks"] = num_offload_blocks
        # (the synchronous-load budget's bytes of a block; the engine is one GPU)
        overrides["offload_block_bytes"] = block_bytes(config, block_size, dtype)
    if args.gpu_memory_utilization is not None and device.type != "cuda":
        raise ValueError("--gpu-memory-utilization sizes a CUDA cache; on CPU give --kv-cache-gb or --num-gpu-blocks")
    return make_config(args.policy, block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                       max_model_len=max_model_len, **scheduler_kv_settings(config), **overrides)


def _fit_cuda_cache(model, sched_config, args):
    from pagesim.engine.runtime.kv_cache import blocks_for_budget, profile_kv_budget

    budget = profile_kv_budget(model, gpu_memory_utilization=args.gpu_memory_utilization or 0.9,
                               max_num_batched_tokens=sched_config.max_num_batched_tokens)
    blocks = blocks_for_budget(budget, model.config, sched_config.block_size, model.dtype)
    overrides = {"num_gpu_blocks": blocks}
    if args.num_cpu_blocks is None and args.swap_space is None:
        overrides["num_cpu_blocks"] = min(sched_config.num_cpu_blocks, blocks)
    return sched_config.with_overrides(**overrides)


def _requests(trace, args, config, sched_config, offline: bool):
    import numpy as np

    for flag in ("n", "beam_width"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.n is not None and args.beam_width is not None and args.n > 1 and args.beam_width > 1:
        raise ValueError("give --n or --beam-width, not both")
    ones = np.ones(len(trace), dtype=np.int64)
    if args.n is not None:  # n > 1 replaces the trace's beams; n = 1 leaves them
        trace = replace(trace, n=np.full(len(trace), args.n), **({"beam_width": ones} if args.n > 1 else {}))
    if args.beam_width is not None:
        trace = replace(trace, beam_width=np.full(len(trace), args.beam_width),
                        **({"n": ones} if args.beam_width > 1 else {}))
    if offline:
        trace = replace(trace, arrival_s=np.zeros(len(trace)))
    limit = sched_config.max_model_len
    too_long = np.flatnonzero(trace.prompt_len + trace.output_len > limit)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(f"{len(too_long)} of {len(trace)} requests are longer than the context of {limit} tokens "
                         f"(e.g. r{i}: {int(trace.prompt_len[i])} prompt + {int(trace.output_len[i])} output tokens); "
                         f"a larger model context, or --num-requests / a trace without them")
    if args.temperature > 0 and bool((trace.beam_width > 1).any()):
        raise ValueError("the requests use beam search, which is deterministic: leave --temperature at 0")
    if not offline and len(trace) and float(trace.arrival_s.max()) > LONG_WAIT_S:
        print(f"pagesim run: warning: the last request arrives {float(trace.arrival_s.max()):.0f} s into the run, "
              f"on the wall clock (--offline, or --rate R, serves it sooner)", file=sys.stderr)
    return [trace.request(i, vocab_size=config.vocab_size) for i in range(len(trace))]


def _check_servable(requests, sched_config) -> None:
    """Refuse a run in which the policy would reject every request (its own reasons, up front)."""
    from pagesim.engine.policy import Scheduler
    from pagesim.engine.policy.scheduling.admission import rejection_reason

    probe = Scheduler(sched_config)  # what add_request would say, without a model
    first = None
    for r in requests:
        reason = (rejection_reason(r, sched_config, sched_config.num_usable_gpu_blocks)
                  or probe.step_order.rejection_reason(r))
        if reason is None:
            return
        first = first or (r.request_id, reason)
    raise ValueError(f"none of the {len(requests)} requests can be served with {sched_config.num_gpu_blocks} KV blocks "
                     f"of {sched_config.block_size} tokens and the {sched_config.step_order} step order; "
                     f"e.g. {first[0]}: {first[1]}")


def _sampling(args):
    from pagesim.engine.runtime import SamplingParams

    if args.sampling_seed < 0:
        raise ValueError(f"--sampling-seed must be >= 0, got {args.sampling_seed}")
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.sampling_seed)
    except ValueError as exc:
        raise ValueError(f"--temperature / --top-p: {exc}") from None
    return params


def _progress(total: int, desc: str, disable: bool, detail=None):
    """A bar on a terminal, a line a minute otherwise (``pagesim.engine.progress``); None with --no-progress."""
    from pagesim.engine.progress import progress

    return None if total == 0 else progress("run", desc, total, "requests", disable=disable, detail=detail)
