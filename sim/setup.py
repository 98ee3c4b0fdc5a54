"""From a run's settings to the objects a simulation needs: deployment, scheduler, cost model.

``RunSpec`` is everything ``pagesim simulate`` lets a user turn, validated in one place and
usable from Python (studies build many). ``build`` turns it into a ``Deployment``, a scheduler
(the policy's ``Scheduler`` for ``allocator="paged"``, the contiguous baseline otherwise) and a
roofline cost model, and says how the KV cache was sized.

KV-cache size, in order of precedence: ``num_gpu_blocks``; ``kv_cache_gb`` (GiB per GPU);
otherwise memory x ``gpu_memory_utilization`` - weights - activation reserve (``Deployment``).
Swap space is ``swap_space_gb`` GiB per GPU (vLLM's default: 4), in blocks of the same size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.model_presets import ModelPreset, get_model_preset
from engine.policy import Scheduler, make_config
from engine.policy.contiguous import RESERVATION_MODES
from engine.policy.contiguous_scheduler import ContiguousScheduler
from sim.cost.roofline import RooflineCostModel, RooflineParams
from sim.deployment import GiB, Deployment
from sim.hardware import get_gpu_preset

ALLOCATORS = ("paged", *RESERVATION_MODES)


@dataclass(frozen=True)
class RunSpec:
    model: str = "llama3-8b"
    gpu: str = "a100-80gb"
    tp: int = 1
    policy: str = "pagesim"
    allocator: str = "paged"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    swap_space_gb: float = 4.0
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    # Scheduler settings beyond the preset (eviction_policy, preemption_mode, victim_policy,
    # max_num_seqs, max_num_batched_tokens, enable_prefix_caching, enable_chunked_prefill, ...).
    overrides: dict[str, Any] = field(default_factory=dict)
    cost_params: dict[str, float] = field(default_factory=dict)
    record_decisions: bool = False

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        if self.num_gpu_blocks is not None and self.kv_cache_gb is not None:
            raise ValueError("give --num-gpu-blocks or --kv-cache-gb, not both")
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ValueError(f"--kv-cache-gb must be positive, got {self.kv_cache_gb}")
        if not self.swap_space_gb >= 0:
            raise ValueError(f"--swap-space must be >= 0 GiB, got {self.swap_space_gb}")


@dataclass
class Built:
    spec: RunSpec
    model: ModelPreset
    deployment: Deployment
    scheduler: Any
    cost_model: RooflineCostModel
    kv_cache_source: str  # how the cache was sized, in words

    def describe(self) -> dict:
        cfg = self.scheduler.config
        return {
            "model": self.model.name, "gpu": self.deployment.gpu.name, "tp": self.deployment.tp,
            "policy": self.spec.policy, "allocator": self.spec.allocator,
            "block_size": cfg.block_size, "num_gpu_blocks": cfg.num_gpu_blocks, "num_cpu_blocks": cfg.num_cpu_blocks,
            "kv_cache_slots": self.scheduler.kv_usage().total_slots, "kv_cache_source": self.kv_cache_source,
            "scheduler": {k: v for k, v in asdict(cfg).items() if k != "extra"},
            "cost_model": self.cost_model.describe(),
        }


def build(spec: RunSpec) -> Built:
    model = get_model_preset(spec.model)
    deployment = Deployment(model, get_gpu_preset(spec.gpu), spec.tp)
    max_model_len = spec.max_model_len or model.max_position_embeddings
    # A first config only to learn the batch limits the activation reserve depends on.
    probe = make_config(spec.policy, block_size=spec.block_size, max_model_len=max_model_len,
                        **_fit_budget(spec, max_model_len))
    if spec.num_gpu_blocks is not None:
        num_blocks = spec.num_gpu_blocks
        source = f"{num_blocks} blocks (given)"
    else:
        if spec.kv_cache_gb is not None:
            kv_bytes = int(spec.kv_cache_gb * GiB)
            source = f"{spec.kv_cache_gb:g} GiB per GPU (given)"
        else:
            kv_bytes = deployment.kv_cache_bytes(spec.gpu_memory_utilization, probe.max_num_batched_tokens,
                                                 probe.max_num_seqs)
            source = (f"{spec.gpu_memory_utilization:.0%} of {deployment.gpu.name} memory - weights - "
                      f"activations = {kv_bytes / GiB:.2f} GiB per GPU")
        num_blocks = deployment.num_blocks(kv_bytes, spec.block_size) + probe.reserve_null_block
    num_cpu_blocks = int(spec.swap_space_gb * GiB) // deployment.block_bytes_per_gpu(spec.block_size)
    settings = dict(block_size=spec.block_size, num_gpu_blocks=num_blocks, max_model_len=max_model_len,
                    record_decisions=spec.record_decisions, **_fit_budget(spec, max_model_len))
    if "num_cpu_blocks" not in spec.overrides:
        settings["num_cpu_blocks"] = num_cpu_blocks
    config = make_config(spec.policy, **{**settings, **spec.overrides})
    if spec.allocator == "paged":
        scheduler = Scheduler(config)
    else:
        scheduler = ContiguousScheduler(config, reservation=spec.allocator)
    params = RooflineParams().with_overrides(spec.cost_params)
    return Built(spec, model, deployment, scheduler, RooflineCostModel(deployment, params), source)


def _fit_budget(spec: RunSpec, max_model_len: int) -> dict[str, Any]:
    """Without chunked prefill a step must hold a whole prompt, so the token budget defaults to at
    least ``max_model_len`` then (vLLM: ``max(max_model_len, 2048)``)."""
    overrides = spec.overrides
    if "max_num_batched_tokens" in overrides:
        return {}
    chunked = overrides.get("enable_chunked_prefill", make_config(spec.policy).enable_chunked_prefill)
    if not chunked:
        return {"max_num_batched_tokens": max(max_model_len, 2048)}
    return {}
