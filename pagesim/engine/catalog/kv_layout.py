"""How a model's KV cache is laid out in blocks: layer groups, as vLLM v1's hybrid KV-cache manager
groups them (vLLM 0.33, ``vllm/v1/core/kv_cache_planning.py``,
``_get_kv_cache_groups_uniform_page_size``).

Layers of one kind (full attention, or one sliding window) form a *type*; each type's layers are
split into groups of ``group_size`` layers (the smallest type's layer count, or the largest's when
it is under 1.5 times the smallest; a type that does not divide is padded, and the padding costs
memory as vLLM's does), layer ``i`` of a type going to group ``i % num_groups`` of that type.
Groups are ordered by the type's first layer. Every group's block holds ``block_size`` tokens of
``group_size`` layers, so all blocks have one size and share one pool; a request holds one block
table per group. A model whose layers are all alike is one group of all its layers: for full
attention (every dense model, MLA included) the plain paged cache; for Mistral 7B v0.1, whose
layers all slide, one sliding group (vLLM's single-group coordinator with its sliding-window
manager), which still drops the blocks that leave the window.

In a sliding-window group, a token's K/V is needed only while it is within the window of the
tokens still to be computed; the policy frees (or leaves to the prefix cache) the blocks that
fall wholly outside (``pagesim.engine.policy.memory.hybrid_kv``). vLLM's ``--disable-hybrid-kv-cache-manager``
(``hybrid=False`` here) keeps every layer in full-attention groups instead.

Bytes: a token takes ``kv_elements_per_token_layer x kv dtype bytes`` per layer (GQA: K and V of
its KV heads, split over tensor-parallel ranks, or replicated when there are fewer heads than
ranks, as vLLM does; MLA: the latent, which every rank holds whole). ``--kv-cache-dtype fp8``
stores one byte per element, as vLLM's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.engine.catalog.model import ModelPreset

#: ``--kv-cache-dtype`` values -> bytes per element (``auto``: the model's dtype).
KV_CACHE_DTYPES = {"auto": None, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1,
                   "fp8_e5m2": 1, "fp32": 4, "float32": 4}


def kv_dtype_bytes(model: ModelPreset, kv_cache_dtype: str = "auto") -> int:
    key = str(kv_cache_dtype).strip().lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype must be one of auto, bf16, fp16, fp8, got {kv_cache_dtype!r}")
    size = KV_CACHE_DTYPES[key]
    return model.dtype_bytes if size is None else size


@dataclass(frozen=True, slots=True)
class KvCacheGroup:
    """One KV-cache group: layers of one kind sharing one block table per request."""

    window: int | None  # sliding window in tokens; None: full attention
    layers: tuple[int, ...]  # the model's layer indices (fewer than group_size: padded)

    @property
    def kind(self) -> str:
        return "full" if self.window is None else "sliding"


@dataclass(frozen=True, slots=True)
class KvLayout:
    groups: tuple[KvCacheGroup, ...]
    group_size: int  # layers per group, padding included: what one block holds
    layer_bytes_per_token: int  # one token in one layer, on one GPU
    num_layers: int

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each group's window (None: full attention), in group order: what the policy needs."""
        return tuple(g.window for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        """Whether any group slides (then the policy keeps a table per group and frees old blocks)."""
        return any(g.window is not None for g in self.groups)

    def scheduler_settings(self) -> dict:
        """The scheduler settings this layout needs: for sliding-window groups their windows and
        vLLM's null block (``pagesim.engine.policy.memory.hybrid_kv``); nothing for one full group."""
        if not self.is_hybrid:
            return {}
        return {"kv_group_windows": self.windows, "reserve_null_block": True}

    @property
    def page_bytes_per_token(self) -> int:
        """Bytes one token slot of one block takes: ``group_size`` layers."""
        return self.group_size * self.layer_bytes_per_token

    def block_bytes(self, block_size: int) -> int:
        return block_size * self.page_bytes_per_token

    @property
    def bytes_per_token(self) -> int:
        """One token in every layer, no window applied and no padding: the model's KV footprint."""
        return self.num_layers * self.layer_bytes_per_token

    @property
    def num_padding_layers(self) -> int:
        return len(self.groups) * self.group_size - self.num_layers

    def tokens_held(self, window: int | None, num_tokens: int) -> int:
        return num_tokens if window is None else min(num_tokens, window)

    def bytes_for(self, num_tokens: int) -> int:
        """Bytes a sequence of ``num_tokens`` needs at least, windows applied (no block rounding)."""
        return sum(self.tokens_held(g.window, num_tokens) for g in self.groups) * self.page_bytes_per_token


def layer_bytes_per_token(model: ModelPreset, *, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
    """KV bytes one token takes in one layer on one GPU of a ``tp``-way replica."""
    elements = model.kv_elements_per_token_layer()
    if model.mla is None and tp > 1:
        kv_heads_per_gpu = max(1, model.num_kv_heads // tp)  # replicated when fewer heads than GPUs
        elements = 2 * kv_heads_per_gpu * model.head_dim
    return elements * kv_dtype_bytes(model, kv_cache_dtype)


def kv_layout(model: ModelPreset, *, tp: int = 1, kv_cache_dtype: str = "auto", hybrid: bool = True) -> KvLayout:
    """The model's KV-cache groups (see the module docstring for vLLM's rule)."""
    types = model.resolved_layer_types if hybrid else ("full",) * model.num_layers
    buckets: dict[int | None, list[int]] = {}
    for layer, kind in enumerate(types):
        buckets.setdefault(model.sliding_window if kind == "sliding" else None, []).append(layer)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < 1.5 * min(sizes):
        group_size = max(sizes)  # e.g. gpt-oss-20b + a drafter: pad the smaller type instead
    groups = []
    for window, layers in buckets.items():
        num_groups = math.ceil(len(layers) / group_size)
        groups.extend(KvCacheGroup(window, tuple(layers[i::num_groups])) for i in range(num_groups))
    return KvLayout(tuple(groups), group_size, layer_bytes_per_token(model, tp=tp, kv_cache_dtype=kv_cache_dtype),
                    model.num_layers)
