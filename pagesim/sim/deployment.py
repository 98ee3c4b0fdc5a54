"""A deployment: one model on one replica of ``tp`` GPUs, and the KV-cache blocks it leaves.

vLLM sizes its KV cache as ``memory x gpu_memory_utilization - weights - peak activations``,
measured by a profiling forward pass. Without a GPU, pagesim estimates the last term
(``activation_reserve_bytes``): the widest hidden activations of one step of
``max_num_batched_tokens`` tokens (residual, q/k/v, the MLP's up and gate outputs, in the model's
dtype; an MoE layer's routed copies of each token), fp32 logits for ``max_num_seqs`` sampled
sequences, and a fixed 0.5 GiB for what PyTorch's allocator does not see (CUDA context, NCCL
buffers, CUDA graphs). It is an estimate; ``--num-gpu-blocks`` or ``--kv-cache-gb`` set the cache
exactly.

Under tensor parallelism each GPU holds ``1/tp`` of the weights and of the KV heads (a KV head is
replicated when there are fewer KV heads than GPUs, as vLLM does; an MLA latent is held whole by
every GPU), so a block's bytes *per GPU* decide how many blocks fit; every GPU holds the same block
ids. With expert parallelism (``ep = tp``, vLLM's ``--enable-expert-parallel`` without data
parallelism) each GPU holds ``num_experts / ep`` whole experts instead of a slice of each; the
weight bytes per GPU are the same.

Weights are stored as the checkpoint ships them (``weight_dtype="auto"``: DeepSeek V3 in FP8,
gpt-oss's experts in MXFP4, the rest in 16 bits) or as ``--dtype`` says (``pagesim.engine.catalog.params``).
A model whose weights do not fit its GPUs is refused with the numbers and the smallest ``--tp``
whose weights leave at least a fifth of the memory budget for activations and the KV cache
(``check_weights_fit``); nothing is simulated on memory that is not there.

The KV cache's layout (``layout``) is vLLM v1's: one group of all layers for most models, layer
groups with their own block tables for models with sliding-window layers
(``pagesim.engine.catalog.kv_layout``); a block holds ``block_size`` tokens of one group's layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from pagesim.engine.catalog.kv_layout import KvLayout, kv_layout
from pagesim.engine.catalog.params import WeightBytes, weight_bytes
from pagesim.engine.model_presets import ModelPreset
from pagesim.sim.hardware import GpuPreset

GiB = 1 << 30
UNSEEN_OVERHEAD_BYTES = GiB // 2


def parallel_problem(model: ModelPreset, tp: int) -> str | None:
    """Why ``model`` cannot be split over ``tp`` GPUs, or ``None``."""
    if model.num_attention_heads % tp:
        return f"{model.name} has {model.num_attention_heads} attention heads, not divisible by tensor-parallel degree {tp}"
    kv = model.num_kv_heads
    if model.mla is None and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        # vLLM splits KV heads evenly, or replicates them when there are fewer than GPUs
        return (f"{model.name} has {kv} KV heads, which tensor-parallel degree {tp} "
                f"can neither split evenly nor replicate evenly")
    return None


@dataclass(frozen=True)
class Deployment:
    model: ModelPreset
    gpu: GpuPreset
    tp: int = 1
    ep: int = 1  # GPUs the experts are spread over (1: each expert sliced over the tp GPUs)
    weight_dtype: str = "auto"  # --dtype: auto (the checkpoint's), bf16, fp16, fp8, mxfp4
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype
    hybrid_kv: bool = True  # False: vLLM's --disable-hybrid-kv-cache-manager (windows held in full)

    def __post_init__(self) -> None:
        for name in ("tp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                degree = "tensor-parallel" if name == "tp" else "expert-parallel"
                raise ValueError(f"{degree} degree must be a positive integer, got {value!r}")
        problem = parallel_problem(self.model, self.tp)
        if problem:
            raise ValueError(problem)
        if self.ep > 1:
            moe = self.model.moe
            if moe is None:
                raise ValueError(f"--ep {self.ep}: {self.model.name} has no experts to spread")
            if self.ep != self.tp:
                raise ValueError(f"--ep {self.ep}: expert parallelism spreads the experts over the replica's "
                                 f"tensor-parallel GPUs (vLLM's --enable-expert-parallel, EP = TP without data "
                                 f"parallelism); give --ep {self.tp} or leave it out")
            if moe.num_experts % self.ep:
                raise ValueError(f"--ep {self.ep}: {self.model.name}'s {moe.num_experts} experts do not split "
                                 f"evenly over {self.ep} GPUs")
        self.weights  # noqa: B018 - validates weight_dtype now, with the one-line message
        self.layout  # noqa: B018 - and kv_cache_dtype

    # ------------------------------------------------------------------ KV
    @cached_property
    def layout(self) -> KvLayout:
        """The KV cache's layer groups, with bytes per token on one GPU."""
        return kv_layout(self.model, tp=self.tp, kv_cache_dtype=self.kv_cache_dtype, hybrid=self.hybrid_kv)

    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.model.num_kv_heads // self.tp)

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """One token in every layer on one GPU (windows not applied)."""
        return self.layout.bytes_per_token

    def block_bytes_per_gpu(self, block_size: int) -> int:
        """One block of one layer group on one GPU (all layers for a model of one group)."""
        return self.layout.block_bytes(block_size)

    # ------------------------------------------------------------- weights
    @cached_property
    def weights(self) -> WeightBytes:
        return weight_bytes(self.model, self.weight_dtype)

    @property
    def weight_bytes_per_gpu(self) -> int:
        return math.ceil(self.weights.total / self.tp)

    def check_weights_fit(self, gpu_memory_utilization: float) -> None:
        """Refuse a model whose weights alone exceed its share of GPU memory, naming the numbers
        and the smallest tensor-parallel degree whose weights leave a fifth of it for the rest."""
        _check_utilization(gpu_memory_utilization)
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        if self.weight_bytes_per_gpu <= budget:
            return
        raise ValueError(
            f"{self.model.name} does not fit on {self.gpu.name} x{self.tp}: its weights "
            f"({self.weights.total / GiB:.1f} GiB in {self.weights.format}) need {self.weight_bytes_per_gpu / GiB:.1f} "
            f"GiB per GPU, which has {budget / GiB:.1f} GiB ({gpu_memory_utilization:.0%} of "
            f"{self.gpu.memory_bytes / GiB:.1f} GiB); {self._suggestion(gpu_memory_utilization)}"
        )

    def _suggestion(self, gpu_memory_utilization: float) -> str:
        budget = self.gpu.memory_bytes * gpu_memory_utilization
        for tp in (2, 4, 8, 16, 32, 64):
            if tp > self.tp and parallel_problem(self.model, tp) is None and self.weights.total / tp < 0.8 * budget:
                return f"try --tp {tp} ({self.weights.total / tp / GiB:.1f} GiB of weights per GPU)"
        return "it does not fit on up to 64 GPUs of this kind"

    # ---------------------------------------------------------- the budget
    def activation_reserve_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        m = self.model
        widest = 2 * m.hidden_size + (m.q_size + 2 * m.kv_size + 2 * m.intermediate_size) // self.tp
        if m.moe is not None:  # each token's copies routed to its experts (gate and up outputs)
            routed = m.moe.experts_per_token + m.moe.shared_experts
            widest = max(widest, 2 * m.hidden_size + routed * (m.hidden_size + 2 * m.moe.intermediate_size // self.tp))
        return (max_num_batched_tokens * widest * m.dtype_bytes
                + max_num_seqs * m.vocab_size * 4 + UNSEEN_OVERHEAD_BYTES)

    def kv_cache_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """KV-cache bytes per GPU: memory x utilization - weights - activation reserve."""
        _check_utilization(gpu_memory_utilization)
        self.check_weights_fit(gpu_memory_utilization)
        budget = math.floor(self.gpu.memory_bytes * gpu_memory_utilization)
        weights = self.weight_bytes_per_gpu
        reserve = self.activation_reserve_bytes(max_num_batched_tokens, max_num_seqs)
        free = budget - weights - reserve
        if free <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.gpu.name} x{self.tp}: "
                f"{gpu_memory_utilization:.0%} of {self.gpu.memory_bytes / GiB:.1f} GiB = {budget / GiB:.1f} GiB, "
                f"weights {weights / GiB:.1f} GiB, activations ~{reserve / GiB:.1f} GiB per GPU "
                f"(raise --tp, or give --num-gpu-blocks; {self._suggestion(gpu_memory_utilization)})"
            )
        return free

    def num_blocks(self, kv_bytes_per_gpu: int, block_size: int) -> int:
        blocks = kv_bytes_per_gpu // self.block_bytes_per_gpu(block_size)
        if blocks < 1:
            raise ValueError(
                f"a KV cache of {kv_bytes_per_gpu / GiB:.2f} GiB per GPU holds no block of {block_size} tokens "
                f"({self.block_bytes_per_gpu(block_size)} bytes each)"
            )
        return blocks


def _check_utilization(gpu_memory_utilization: float) -> None:
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu memory utilization must be in (0, 1], got {gpu_memory_utilization!r}")
