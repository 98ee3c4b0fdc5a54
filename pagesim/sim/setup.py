"""From a run's settings to the objects a simulation needs: deployment, scheduler, cost model.

``RunSpec`` is everything ``pagesim simulate`` lets a user turn, validated in one place and
usable from Python (studies build many). ``build`` turns it into a ``Deployment``, a scheduler
(the policy's ``Scheduler`` for ``allocator="paged"``, the contiguous baseline otherwise) and a
cost model (roofline, or calibrated when ``profile`` names a ``pagesim calibrate`` profile of
the same model's shapes), and says how the KV cache was sized. ``plan`` is all of that but the
scheduler: every check, nothing allocated (a study plans each run before the first one runs).

KV-cache size, in order of precedence: ``num_gpu_blocks``; ``kv_cache_gb`` (GiB per GPU);
otherwise memory x ``gpu_memory_utilization`` - weights - activation reserve (``Deployment``).
Swap space is ``swap_space_gb`` GiB per GPU (vLLM's default: 4), in blocks of the same size.
Whatever sizes the cache, weights that do not fit the GPUs are refused first, with the numbers,
and so is a cache of more than ``MAX_KV_BLOCKS`` blocks (GPU plus CPU, over all replicas), before
anything is allocated: the policy's bookkeeping is Python lists, one entry per block.

A model with sliding-window layers gets vLLM v1's hybrid KV cache (a block table per layer group,
``pagesim.engine.policy.memory.hybrid_kv``; ``hybrid_kv=False`` is vLLM's ``--disable-hybrid-kv-cache-manager``):
its blocks hold one group's layers, and the policy reserves vLLM's null block for the entries a
window drops. ``max_model_len`` defaults to the model's context, as vLLM's does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pagesim.engine.model_presets import ModelPreset, get_model_preset
from pagesim.engine.policy import make_config
from pagesim.engine.policy.baselines.contiguous import PLACEMENTS, RESERVATION_MODES
from pagesim.engine.policy.baselines.contiguous_scheduler import ContiguousScheduler
from pagesim.engine.policy.plugins.user import load_plugins, scheduler_class
from pagesim.sim.cost.base import CostModel
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.profile import load_profile
from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams
from pagesim.sim.vllm_defaults import vllm_serve_batch_limits
from pagesim.sim.deployment import GiB, Deployment
from pagesim.sim.hardware import get_gpu_preset

ALLOCATORS = ("paged", *RESERVATION_MODES)
#: Settings that mean nothing to a contiguous baseline (no blocks to cache, evict or preempt).
PAGED_ONLY = {"eviction_policy": "--eviction", "preemption_mode": "--preemption", "victim_policy": "--victim",
              "enable_prefix_caching": "--prefix-caching", "offload_eviction_policy": "--kv-offloading-policy",
              "scheduling_policy": "--scheduling-policy"}
#: The most KV blocks, GPU plus CPU swap over all replicas, a run builds. The policy keeps about
#: 80 bytes of bookkeeping per block (reference count, key, three ticks, free-list entry), so
#: this caps it near 4 GiB; a real GPU's cache is at most a few million blocks.
MAX_KV_BLOCKS = 50_000_000
BOOKKEEPING_BYTES_PER_BLOCK = 80
#: The largest KV block a run takes, in tokens. vLLM's are 16 to a few hundred; the skip-ahead
#: (``pagesim.sim.decode_spans``) keeps a block_size x block_size table, 128 MiB at 4,096 (at 100,000 it
#: asked numpy for 74.5 GiB, a message that named no flag).
MAX_BLOCK_SIZE = 4096


@dataclass(frozen=True)
class RunSpec:
    model: str = "llama3-8b"
    gpu: str = "a100-80gb"
    tp: int = 1
    ep: int = 1  # expert-parallel GPUs (1, or tp: vLLM's --enable-expert-parallel)
    weight_dtype: str = "auto"  # --dtype: the checkpoint's (auto), bf16, fp16, fp8, mxfp4
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: auto, bf16, fp16, fp8
    hybrid_kv: bool = True  # False: vLLM's --disable-hybrid-kv-cache-manager
    policy: str = "pagesim"
    allocator: str = "paged"
    placement: str = "buddy"  # contiguous baselines: "buddy" (the paper's assumption) or "first-fit"
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    swap_space_gb: float = 4.0
    # KV offloading (pagesim/engine/policy/offload/): GiB of CPU memory for the offload store, over all the
    # replica's GPUs (vLLM's --kv-offloading-size; None: off); num_offload_blocks overrides it.
    kv_offloading_gb: float | None = None
    num_offload_blocks: int | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    # Scheduler settings beyond the preset (eviction_policy, preemption_mode, victim_policy,
    # max_num_seqs, max_num_batched_tokens, enable_prefix_caching, enable_chunked_prefill, ...).
    overrides: dict[str, Any] = field(default_factory=dict)
    cost_params: dict[str, float] = field(default_factory=dict)
    profile: str | None = None  # a calibration profile (pagesim calibrate): the calibrated cost model
    record_decisions: bool = False
    # User plug-ins, "FILE.py:CLASS" (engine.policy.user_plugins), loaded by build(); the
    # overrides select them by name, and ``scheduler`` names the Scheduler class ("default" or one).
    plugins: tuple[str, ...] = ()
    scheduler: str = "default"

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) \
                or not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"--block-size must be in [1, {MAX_BLOCK_SIZE:,}] tokens, got {self.block_size!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}")
        if self.num_gpu_blocks is not None and self.kv_cache_gb is not None:
            raise ValueError("give --num-gpu-blocks or --kv-cache-gb, not both")
        if self.kv_cache_gb is not None and not 0 < self.kv_cache_gb < math.inf:
            raise ValueError(f"--kv-cache-gb must be a positive number of GiB, got {self.kv_cache_gb}")
        if not 0 <= self.swap_space_gb < math.inf:
            raise ValueError(f"--swap-space must be a finite number of GiB >= 0, got {self.swap_space_gb}")
        if self.kv_offloading_gb is not None and not 0 <= self.kv_offloading_gb < math.inf:
            raise ValueError(f"--kv-offloading-size must be a finite number of GiB >= 0, got {self.kv_offloading_gb}")
        if self.num_offload_blocks is not None and (isinstance(self.num_offload_blocks, bool)
                                                    or not isinstance(self.num_offload_blocks, int)
                                                    or self.num_offload_blocks < 0):
            raise ValueError(f"--num-offload-blocks must be an integer >= 0, got {self.num_offload_blocks!r}")
        object.__setattr__(self, "plugins", tuple(self.plugins))
        if self.allocator != "paged" and self.scheduler != "default":
            raise ValueError(f"--scheduler applies to the paged allocator only, not to the contiguous "
                             f"{self.allocator!r} baseline")
        if self.allocator != "paged" and (self.kv_offloading_gb or self.num_offload_blocks):
            raise ValueError(f"--kv-offloading-size applies to the paged allocator only, not to the contiguous "
                             f"{self.allocator!r} baseline (its slabs have no blocks to store)")
        if self.allocator != "paged":
            paged_only = sorted(set(self.overrides) & set(PAGED_ONLY))
            if paged_only:
                raise ValueError(f"{', '.join(PAGED_ONLY[k] for k in paged_only)} applies to the paged allocator only, not to the "
                                 f"contiguous {self.allocator!r} baseline")


@dataclass
class Built:
    spec: RunSpec
    model: ModelPreset
    deployment: Deployment
    scheduler: Any
    cost_model: CostModel
    kv_cache_source: str  # how the cache was sized, in words

    def describe(self) -> dict:
        cfg = self.scheduler.config
        return {
            "model": self.model.name, "gpu": self.deployment.gpu.name, "tp": self.deployment.tp,
            "policy": self.spec.policy, "allocator": self.spec.allocator,
            **({"placement": self.spec.placement} if self.spec.allocator != "paged" else {}),
            "block_size": cfg.block_size, "num_gpu_blocks": cfg.num_gpu_blocks, "num_cpu_blocks": cfg.num_cpu_blocks,
            "kv_cache_slots": self.scheduler.kv_usage().total_slots, "kv_cache_source": self.kv_cache_source,
            "kv_cache": self.kv_cache_description(),
            "weights": {"format": self.deployment.weights.format,
                        "gib_per_gpu": round(self.deployment.weight_bytes_per_gpu / GiB, 3)},
            **({"ep": self.deployment.ep} if self.deployment.ep > 1 else {}),
            "scheduler": {k: v for k, v in asdict(cfg).items() if k != "extra"},
            "batch_limits": self.batch_limits_words(),
            **({"plugins": list(self.spec.plugins), "scheduler_class": self.spec.scheduler} if self.spec.plugins else {}),
            "cost_model": self.cost_model.describe(),
        }


    def batch_limits_words(self) -> str:
        """``max_num_seqs`` and ``max_num_batched_tokens``, and where they came from."""
        cfg, given = self.scheduler.config, self.spec.overrides
        limits = f"max_num_seqs {cfg.max_num_seqs:,}, max_num_batched_tokens {cfg.max_num_batched_tokens:,}"
        if "max_num_seqs" in given and "max_num_batched_tokens" in given:
            return f"{limits} (given)"
        if self.spec.policy == "vllm-v1":
            return f"{limits} (vllm serve's defaults on {self.deployment.gpu.name}, vLLM 0.33, where not given)"
        return f"{limits} (the {self.spec.policy} preset's, where not given)"

    def kv_cache_description(self) -> dict:
        """Bytes per token and per block on one GPU, and the layer groups (vLLM v1's layout)."""
        d = self.deployment
        layout = d.layout
        cfg = self.scheduler.config
        return {
            "dtype": d.kv_cache_dtype, "bytes_per_token": layout.bytes_per_token,
            "block_bytes": layout.block_bytes(cfg.block_size), "group_size": layout.group_size,
            "groups": [{"window": g.window, "layers": len(g.layers)} for g in layout.groups],
        }


@dataclass(frozen=True)
class Plan:
    """What ``build`` decides before it allocates anything: every refusal of a run's settings
    happens while planning, so a study can plan each run before the first one runs."""

    model: ModelPreset
    deployment: Deployment
    config: Any  # the scheduler's SchedulerConfig
    cost_model: CostModel
    kv_cache_source: str  # how the cache was sized, in words


def build(spec: RunSpec) -> Built:
    p = plan(spec)
    config = p.config
    try:
        if spec.allocator == "paged":
            scheduler = scheduler_class(spec.scheduler)(config)
        else:
            scheduler = ContiguousScheduler(config, reservation=spec.allocator, placement=spec.placement)
    except MemoryError:
        raise MemoryError(f"out of memory building a KV cache of {config.num_gpu_blocks:,} GPU and "
                          f"{config.num_cpu_blocks:,} CPU blocks") from None
    return Built(spec, p.model, p.deployment, scheduler, p.cost_model, p.kv_cache_source)


def plan(spec: RunSpec) -> Plan:
    """The deployment, the scheduler's config and the cost model of ``spec``, each checked."""
    load_plugins(spec.plugins)  # before any config: their names must be registered
    model = get_model_preset(spec.model)
    deployment = Deployment(model, get_gpu_preset(spec.gpu), spec.tp, spec.ep, spec.weight_dtype,
                            spec.kv_cache_dtype, spec.hybrid_kv)
    max_model_len = spec.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise ValueError(f"--max-model-len {max_model_len} exceeds {model.name}'s context length "
                         f"({model.max_position_embeddings} tokens)")
    deployment.check_weights_fit(spec.gpu_memory_utilization)
    base = dict(block_size=spec.block_size, max_model_len=max_model_len, **_fit_budget(spec, max_model_len))
    base.update(_vllm_serve_limits(spec, deployment, max_model_len))
    if deployment.layout.is_hybrid and spec.allocator != "paged":
        raise ValueError(f"the contiguous {spec.allocator!r} baseline reserves full-attention slabs; "
                         f"{model.name}'s sliding-window layers need the paged allocator")
    base.update(deployment.layout.scheduler_settings())
    # A first config only to learn the batch limits the activation reserve depends on (before the
    # offload store is sized: without its settings).
    probe = make_config(spec.policy, **{**base, **{k: v for k, v in spec.overrides.items()
                                                   if k not in ("num_cpu_blocks", "offload_sync_load_budget_bytes")}})
    if spec.num_gpu_blocks is not None:
        num_blocks = spec.num_gpu_blocks
        source = f"{num_blocks} blocks (given)"
    else:
        if spec.kv_cache_gb is not None:
            kv_bytes = int(spec.kv_cache_gb * GiB)
            source = f"{spec.kv_cache_gb:g} GiB per GPU (given)"
            if deployment.weight_bytes_per_gpu + kv_bytes > deployment.gpu.memory_bytes:
                raise ValueError(
                    f"--kv-cache-gb {spec.kv_cache_gb:g} beside {deployment.weight_bytes_per_gpu / GiB:.1f} GiB of "
                    f"{model.name}'s weights per GPU exceeds {deployment.gpu.name}'s "
                    f"{deployment.gpu.memory_bytes / GiB:.1f} GiB")
        else:
            kv_bytes = deployment.kv_cache_bytes(spec.gpu_memory_utilization, probe.max_num_batched_tokens,
                                                 probe.max_num_seqs)
            source = (f"{spec.gpu_memory_utilization:.0%} of {deployment.gpu.name} memory - weights - "
                      f"activations = {kv_bytes / GiB:.2f} GiB per GPU")
        num_blocks = deployment.num_blocks(kv_bytes, spec.block_size) + probe.reserve_null_block
    num_cpu_blocks = int(spec.swap_space_gb * GiB) // deployment.block_bytes_per_gpu(spec.block_size)
    settings = dict(base, num_gpu_blocks=num_blocks, record_decisions=spec.record_decisions)
    if "num_cpu_blocks" not in spec.overrides:
        settings["num_cpu_blocks"] = num_cpu_blocks
    num_offload_blocks = offload_blocks(spec, deployment)
    if num_offload_blocks is not None:
        settings["num_offload_blocks"] = num_offload_blocks
        # (the synchronous-load budget's bytes of a block: one GPU's share, as vLLM's scheduler-side
        # connector counts a worker's page size; offloading/scheduler.py)
        settings["offload_block_bytes"] = deployment.block_bytes_per_gpu(spec.block_size)
    config = make_config(spec.policy, **{**settings, **spec.overrides})
    check_kv_blocks(config.num_gpu_blocks, config.num_cpu_blocks + config.num_offload_blocks, source=source)
    cost_model = _cost_model(spec, model, deployment)  # (a bad profile is refused before the cache is built)
    return Plan(model, deployment, config, cost_model, source)


def offload_blocks(spec: RunSpec, deployment: Deployment) -> int | None:
    """The offload store's blocks (``None``: not asked for): ``num_offload_blocks``, else
    ``kv_offloading_gb`` over one block of every layer on every GPU of the replica, as vLLM sizes
    its CPU store (``--kv-offloading-size`` is the total over the tensor-parallel workers)."""
    if spec.num_offload_blocks is not None:
        return spec.num_offload_blocks
    if spec.kv_offloading_gb is None:
        return None
    per_block = deployment.block_bytes_per_gpu(spec.block_size) * deployment.tp
    blocks = int(spec.kv_offloading_gb * GiB) // per_block
    if spec.kv_offloading_gb > 0 and blocks < 1:
        raise ValueError(f"--kv-offloading-size {spec.kv_offloading_gb:g} GiB holds no block of {per_block:,} bytes")
    return blocks


def check_kv_blocks(num_gpu_blocks: int, num_cpu_blocks: int, num_replicas: int = 1, *, source: str) -> None:
    """Refuse, before anything is built, a cache of more than ``MAX_KV_BLOCKS`` blocks in all
    (``source``: how the GPU blocks were sized, in words)."""
    total = num_replicas * (num_gpu_blocks + num_cpu_blocks)
    if total <= MAX_KV_BLOCKS:
        return
    sized = "" if source.endswith("blocks (given)") else f" ({source})"
    each = f"{num_gpu_blocks:,} GPU blocks{sized} + {num_cpu_blocks:,} CPU (swap and offload) blocks"
    what = f"{num_replicas} replicas x ({each})" if num_replicas > 1 else each
    fewer = ", or fewer --replicas" if num_replicas > 1 else ""
    raise ValueError(f"the KV cache would be {what} = {total:,} blocks, more than the {MAX_KV_BLOCKS:,} this "
                     f"simulator builds (about {BOOKKEEPING_BYTES_PER_BLOCK} bytes of bookkeeping each); lower "
                     f"--num-gpu-blocks, --kv-cache-gb, --swap-space or --kv-offloading-size, raise --block-size{fewer}")


def _cost_model(spec: RunSpec, model: ModelPreset, deployment: Deployment) -> CostModel:
    """The roofline model, or the calibrated one when a profile is given (measured at tp = 1)."""
    if spec.profile is None:
        return RooflineCostModel(deployment, RooflineParams().with_overrides(spec.cost_params))
    if spec.cost_params:
        raise ValueError("--cost-param sets roofline parameters; with --profile the costs are measured")
    if spec.tp != 1:
        raise ValueError(f"a calibration profile times one device; --tp {spec.tp} needs the roofline model "
                         f"(leave out --profile)")
    cost_model = CalibratedCostModel(load_profile(spec.profile))
    cost_model.check_model(model)
    return cost_model


def _vllm_serve_limits(spec: RunSpec, deployment: Deployment, max_model_len: int) -> dict[str, Any]:
    """Under ``--policy vllm-v1``, the batch limits ``vllm serve`` picks on this GPU where none was
    given (``pagesim.sim.vllm_defaults``); nothing for the other presets."""
    if spec.policy != "vllm-v1":
        return {}
    limits = {k: v for k, v in vllm_serve_batch_limits(deployment.gpu).items() if k not in spec.overrides}
    chunked = spec.overrides.get("enable_chunked_prefill", make_config(spec.policy).enable_chunked_prefill)
    if "max_num_batched_tokens" in limits and not chunked:
        limits["max_num_batched_tokens"] = max(limits["max_num_batched_tokens"], max_model_len)
    return limits


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
