"""From a run's settings to a disaggregated deployment's two pools, checked before anything runs.

Both pools start from the run's ``RunSpec``; ``--prefill KEY=VALUE`` / ``--decode KEY=VALUE``
change one pool's settings: a ``RunSpec`` field (``tp``, ``gpu``, ``block_size``,
``num_gpu_blocks``, ``kv_cache_gb``, ``gpu_memory_utilization``, ``max_model_len``, ...) or a
scheduler setting (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_prefix_caching``,
``preemption_mode``, ...). Every replica gets vLLM's NixlConnector (``kv_connector="nixl"``).

Refused before the run, with the numbers:
- pools whose KV caches differ in layout (another model, or another KV dtype): a decode
  instance cannot read blocks laid out differently (vLLM's NIXL handshake checks the same);
- a decode pool whose KV cache cannot hold the longest prompt the prefill pool accepts (each
  such request would be prefilled for nothing);
- a network that moves nothing (``pagesim.sim.disagg.network.NetworkSpec``).
"""

from __future__ import annotations

import dataclasses
import json

from pagesim.sim.disagg.cluster import Pool

#: RunSpec fields a pool may set; anything else is a scheduler setting (RunSpec.overrides).
POOL_FIELDS = ("gpu", "tp", "ep", "block_size", "num_gpu_blocks", "kv_cache_gb", "gpu_memory_utilization",
               "swap_space_gb", "max_model_len", "policy", "profile")
FIXED_FIELDS = ("model", "weight_dtype", "kv_cache_dtype")  # the same model and KV layout on both sides


def parse_settings(items: list[str], flag: str) -> dict:
    """``KEY=VALUE`` strings as a dict (values read as JSON when they parse, else as text)."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE (a RunSpec field such as tp=2, or a scheduler setting such "
                             f"as max_num_seqs=64), got {item!r}")
        if key in FIXED_FIELDS:
            raise ValueError(f"{flag} {key}=...: both pools serve the same model with the same KV layout (a decode "
                             f"instance reads the prefill instance's blocks as they are); set --{key.replace('_', '-')} "
                             f"for both")
        try:
            settings[key] = json.loads(value)
        except ValueError:
            settings[key] = value
    return settings


def pool_spec(spec, settings: dict):
    """``spec`` with one pool's settings and the P/D connector."""
    fields = {k: v for k, v in settings.items() if k in POOL_FIELDS}
    overrides = {**spec.overrides, **{k: v for k, v in settings.items() if k not in POOL_FIELDS},
                 "kv_connector": "nixl"}
    if "num_gpu_blocks" in fields and "kv_cache_gb" not in fields:
        fields["kv_cache_gb"] = None
    if "kv_cache_gb" in fields and "num_gpu_blocks" not in fields:
        fields["num_gpu_blocks"] = None
    try:
        return dataclasses.replace(spec, **fields, overrides=overrides)
    except TypeError as exc:
        raise ValueError(f"a pool setting is not valid: {exc}") from None


def build_pool(spec, replicas: int, name: str) -> tuple[Pool, list]:
    from pagesim.sim.cluster import build_replicas

    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"--{name}-replicas must be an integer >= 1, got {replicas!r}")
    builts = build_replicas(spec, replicas)
    first = builts[0]
    deployment = first.deployment  # (a block over the replica's GPUs: what a read moves)
    pool = Pool([(b.scheduler, b.cost_model) for b in builts], deployment.gpu, deployment.tp,
                deployment.block_bytes_per_gpu(first.scheduler.config.block_size) * deployment.tp)
    return pool, builts


def check_pools(prefill_built, decode_built, trace) -> None:
    """The refusals of the module docstring (the two pools' first replicas stand for each)."""
    p_dep, d_dep = prefill_built.deployment, decode_built.deployment
    p_total, d_total = p_dep.layout.bytes_per_token * p_dep.tp, d_dep.layout.bytes_per_token * d_dep.tp
    if (prefill_built.model.name != decode_built.model.name or p_dep.kv_cache_dtype != d_dep.kv_cache_dtype
            or (p_dep.tp == d_dep.tp and p_total != d_total)):
        raise ValueError(f"the prefill pool's KV layout ({prefill_built.model.name}, KV dtype {p_dep.kv_cache_dtype}, "
                         f"{p_total:,} bytes/token over TP{p_dep.tp}) differs from the decode pool's "
                         f"({decode_built.model.name}, KV dtype {d_dep.kv_cache_dtype}, {d_total:,} bytes/token over "
                         f"TP{d_dep.tp}): a decode instance reads the prefill instance's blocks as they are")
    p_cfg, d_cfg = prefill_built.scheduler.config, decode_built.scheduler.config
    prompts = trace.prompt_len
    accepted = prompts[prompts + 1 <= p_cfg.max_model_len]
    if not len(accepted):
        return
    longest = int(accepted.max())
    usable = decode_built.scheduler.pool.num_usable_blocks
    need = -(-(longest + 1) // d_cfg.block_size)
    if need > usable:
        raise ValueError(f"the decode pool's KV cache holds {usable:,} blocks of {d_cfg.block_size} tokens "
                         f"({usable * d_cfg.block_size:,} tokens) per replica, but the trace's longest prompt the "
                         f"prefill pool accepts ({longest:,} tokens) needs {need:,} with its first output token: give "
                         f"the decode pool more KV memory (--decode kv_cache_gb=..., num_gpu_blocks=..., tp=...)")
