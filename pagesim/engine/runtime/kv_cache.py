"""The paged KV cache on a device, the CPU swap space and the CPU offload store, as tensors the
kernels read.

Per layer one key and one value tensor of shape ``[num_blocks, block_size, num_kv_heads,
head_dim]`` (the kernels' layout); the swap space and the offload store (KV offloading's second
tier, ``pagesim/engine/policy/offload``) have the same layout with their own block counts, in pinned host
memory when the cache is on CUDA. They are separate pools, as in vLLM. Block ids are the policy's:
GPU block ``b`` of every layer is ``key_caches[layer][b]``, CPU block ``c`` is
``cpu_key_caches[layer][c]``, offload slot ``o`` is ``offload_key_caches[layer][o]``.

A model with sliding-window layers has its layers in vLLM v1's KV-cache groups
(``pagesim.engine.catalog.kv_layout``): a block id then belongs to one group at a time, and the ``group_size``
layer slots of a group share tensors with the same slots of every other group, as vLLM lays them
out, so ``key_caches[layer]`` is the tensor of the layer's slot (``layer_slot``) and a block holds
one group's layers. One group (every other model) is the plain layout: a tensor per layer.

Sizing (``blocks_for_budget``): a byte budget divided by one block's bytes across a group's layers
(all layers for one group), keys and values. On CUDA the budget is vLLM's ``gpu_memory_utilization`` rule (``total memory x
utilization`` less what the model and a profiling forward pass took, ``profile_kv_budget``); on
either device it can be given in GiB, or the block count directly.

Validation mode (``poison=True``): the caches start as NaN and every block the policy releases is
refilled with NaN (``poison_gpu`` / ``poison_cpu`` / ``poison_offload``), so a kernel that reads
memory the policy no longer owns turns the output into NaN instead of plausible tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pagesim.engine.catalog.kv_layout import KvLayout, kv_layout
from pagesim.engine.model.config import LlamaConfig
from pagesim.kernels import copy_blocks, swap_blocks

GiB = 1 << 30


def layout_of(config: LlamaConfig) -> KvLayout:
    """The model's KV-cache layer groups (one group of every layer unless some layers slide)."""
    return kv_layout(config.preset)


def scheduler_kv_settings(config: LlamaConfig) -> dict:
    """The scheduler settings the model's KV layout needs (``KvLayout.scheduler_settings``)."""
    return layout_of(config).scheduler_settings()


def block_bytes(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across a group's layers (all layers for one group), keys and values."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layout_of(config).group_size * block_size * config.num_kv_heads * config.head_dim * element


def blocks_for_budget(budget_bytes: int, config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    return max(0, int(budget_bytes) // block_bytes(config, block_size, dtype))


class PagedKVCache:
    def __init__(self, config: LlamaConfig, *, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str, poison: bool = False, backend: str = "auto",
                 num_offload_blocks: int = 0):
        if num_gpu_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_gpu_blocks}")
        self.config = config
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.num_offload_blocks = num_offload_blocks
        self.dtype = dtype
        self.device = torch.device(device)
        self.poison = poison
        self.backend = backend
        shape = (block_size, config.num_kv_heads, config.head_dim)
        fill = float("nan") if poison else 0.0
        self.layout = layout = layout_of(config)
        # Each layer's group, its slot within the group (the tensor it shares) and its window.
        self.layer_group = [0] * config.num_layers
        self.layer_slot = [0] * config.num_layers
        for g, group in enumerate(layout.groups):
            for slot, layer in enumerate(group.layers):
                self.layer_group[layer], self.layer_slot[layer] = g, slot
        self.layer_window = [layout.groups[g].window for g in self.layer_group]

        def tensors(num_blocks: int, device: torch.device, pin: bool) -> list[torch.Tensor]:
            out = []
            for _ in range(layout.group_size):
                t = torch.full((num_blocks, *shape), fill, dtype=dtype, device=device)
                out.append(t.pin_memory() if pin else t)
            return out

        # One tensor per group slot (per layer for one group); key_caches[layer] is its slot's.
        self.slot_key_caches = tensors(num_gpu_blocks, self.device, False)
        self.slot_value_caches = tensors(num_gpu_blocks, self.device, False)
        self.key_caches = [self.slot_key_caches[s] for s in self.layer_slot]
        self.value_caches = [self.slot_value_caches[s] for s in self.layer_slot]
        pin = self.device.type == "cuda"
        cpu = torch.device("cpu")
        self.cpu_key_caches = tensors(num_cpu_blocks, cpu, pin) if num_cpu_blocks else []
        self.cpu_value_caches = tensors(num_cpu_blocks, cpu, pin) if num_cpu_blocks else []
        self.offload_key_caches = tensors(num_offload_blocks, cpu, pin) if num_offload_blocks else []
        self.offload_value_caches = tensors(num_offload_blocks, cpu, pin) if num_offload_blocks else []

    # ---------------------------------------------------------- block moves
    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """``(gpu, cpu)`` pairs: GPU blocks to the swap space."""
        if pairs:
            mapping = torch.tensor(pairs, dtype=torch.int64)
            swap_blocks(self._gpu_tensors(), self._cpu_tensors(), mapping)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """``(cpu, gpu)`` pairs: swapped blocks back into the GPU cache."""
        if pairs:
            mapping = torch.tensor(pairs, dtype=torch.int64)
            swap_blocks(self._cpu_tensors(), self._gpu_tensors(), mapping)

    def offload_load(self, pairs: list[tuple[int, int]]) -> None:
        """``(slot, gpu)`` pairs: offloaded blocks into the GPU cache (a CPU-tier prefix hit)."""
        if pairs:
            mapping = torch.tensor(pairs, dtype=torch.int64)
            swap_blocks(self._offload_tensors(), self._gpu_tensors(), mapping)

    def offload_store(self, pairs: list[tuple[int, int]]) -> None:
        """``(gpu, slot)`` pairs: GPU blocks copied into the offload store (the GPU keeps its block)."""
        if pairs:
            mapping = torch.tensor(pairs, dtype=torch.int64)
            swap_blocks(self._gpu_tensors(), self._offload_tensors(), mapping)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """``(src, dst)`` copy-on-write pairs, every layer in one call."""
        if pairs:
            mapping = torch.tensor(pairs, dtype=torch.int64, device=self.device)
            copy_blocks(self.slot_key_caches, self.slot_value_caches, mapping, backend=self.backend)

    def poison_gpu(self, block_ids: Iterable[int]) -> None:
        self._fill_nan(self._gpu_tensors(), block_ids)

    def poison_cpu(self, block_ids: Iterable[int]) -> None:
        self._fill_nan(self._cpu_tensors(), block_ids)

    def poison_offload(self, slots: Iterable[int]) -> None:
        self._fill_nan(self._offload_tensors(), slots)

    def _fill_nan(self, caches: list[torch.Tensor], block_ids: Iterable[int]) -> None:
        ids = sorted(set(block_ids))
        if not ids or not caches:
            return
        index = torch.tensor(ids, dtype=torch.int64, device=caches[0].device)
        for cache in caches:
            cache.index_fill_(0, index, float("nan"))

    def _gpu_tensors(self) -> list[torch.Tensor]:
        return self.slot_key_caches + self.slot_value_caches

    def _cpu_tensors(self) -> list[torch.Tensor]:
        return self.cpu_key_caches + self.cpu_value_caches

    def _offload_tensors(self) -> list[torch.Tensor]:
        return self.offload_key_caches + self.offload_value_caches


def profile_kv_budget(model, *, gpu_memory_utilization: float, max_num_batched_tokens: int) -> int:
    """vLLM's rule on CUDA: bytes for the KV cache = total memory x utilization - the peak that
    the weights and one forward pass of ``max_num_batched_tokens`` tokens took (measured)."""
    from pagesim.engine.model.dense import causal_attention

    device = model.device
    if device.type != "cuda":
        raise ValueError("--gpu-memory-utilization sizes a CUDA cache; on CPU give --kv-cache-gb or --num-gpu-blocks")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    tokens = min(max_num_batched_tokens, model.config.max_position_embeddings)
    ids = torch.zeros(tokens, dtype=torch.long, device=device)
    positions = torch.arange(tokens, device=device)

    def attend(layer, q, k, v):  # causal attention of one long prompt: what a prefill step allocates
        return causal_attention(q[-1:], k, v).expand_as(q)

    with torch.inference_mode():
        model.logits(model.hidden_states(ids, positions, attend))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(total * gpu_memory_utilization) - peak
    if budget <= 0:
        raise ValueError(f"the model and its activations take {peak / GiB:.2f} GiB, more than "
                         f"{gpu_memory_utilization:.0%} of the GPU's {total / GiB:.1f} GiB")
    return budget
