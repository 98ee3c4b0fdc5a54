"""A deployment: one model on one replica of ``tp`` GPUs, and the KV-cache blocks it leaves.

vLLM sizes its KV cache as ``memory x gpu_memory_utilization - weights - peak activations``,
measured by a profiling forward pass. Without a GPU, pagesim estimates the last term
(``activation_reserve_bytes``): the widest hidden activations of one step of
``max_num_batched_tokens`` tokens (residual, q/k/v, the MLP's up and gate outputs, in the model's
dtype), fp32 logits for ``max_num_seqs`` sampled sequences, and a fixed 0.5 GiB for what
PyTorch's allocator does not see (CUDA context, NCCL buffers, CUDA graphs). It is an estimate;
``--num-gpu-blocks`` or ``--kv-cache-gb`` set the cache exactly.

Under tensor parallelism each GPU holds ``1/tp`` of the weights and of the KV heads (a KV head is
replicated when there are fewer KV heads than GPUs, as vLLM does), so a block's bytes *per GPU*
decide how many blocks fit; every GPU holds the same block ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.model_presets import ModelPreset
from sim.hardware import GpuPreset

GiB = 1 << 30
UNSEEN_OVERHEAD_BYTES = GiB // 2


@dataclass(frozen=True, slots=True)
class Deployment:
    model: ModelPreset
    gpu: GpuPreset
    tp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tensor-parallel degree must be a positive integer, got {self.tp!r}")
        if self.model.num_attention_heads % self.tp:
            raise ValueError(
                f"{self.model.name} has {self.model.num_attention_heads} attention heads, "
                f"not divisible by tensor-parallel degree {self.tp}"
            )
        kv = self.model.num_kv_heads
        if (kv >= self.tp and kv % self.tp) or (kv < self.tp and self.tp % kv):
            # vLLM splits KV heads evenly, or replicates them when there are fewer than GPUs
            raise ValueError(f"{self.model.name} has {kv} KV heads, which tensor-parallel degree {self.tp} "
                             f"can neither split evenly nor replicate evenly")

    @property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.model.num_kv_heads // self.tp)

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        m = self.model
        return 2 * m.num_layers * self.kv_heads_per_gpu * m.head_dim * m.dtype_bytes

    def block_bytes_per_gpu(self, block_size: int) -> int:
        return block_size * self.kv_bytes_per_token_per_gpu

    @property
    def weight_bytes_per_gpu(self) -> int:
        return math.ceil(self.model.num_params * self.model.dtype_bytes / self.tp)

    def activation_reserve_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        m = self.model
        widest = 2 * m.hidden_size + (m.q_size + 2 * m.kv_size + 2 * m.intermediate_size) // self.tp
        return (max_num_batched_tokens * widest * m.dtype_bytes
                + max_num_seqs * m.vocab_size * 4 + UNSEEN_OVERHEAD_BYTES)

    def kv_cache_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """KV-cache bytes per GPU: memory x utilization - weights - activation reserve."""
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu memory utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        budget = math.floor(self.gpu.memory_bytes * gpu_memory_utilization)
        weights = self.weight_bytes_per_gpu
        reserve = self.activation_reserve_bytes(max_num_batched_tokens, max_num_seqs)
        free = budget - weights - reserve
        if free <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.gpu.name} x{self.tp}: "
                f"{gpu_memory_utilization:.0%} of {self.gpu.memory_bytes / GiB:.1f} GiB = {budget / GiB:.1f} GiB, "
                f"weights {weights / GiB:.1f} GiB, activations ~{reserve / GiB:.1f} GiB per GPU "
                f"(raise --tp, or give --num-gpu-blocks)"
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
