"""The model's attention on the paged cache: write this step's K/V into their slots, then attend
through the block tables with the paged prefill and decode kernels (``pagesim.kernels.ops``).

Per layer, every token's K/V is written before any query attends, so a sequence that hits a
prefix block another sequence fills in this same step reads it complete (the policy registers a
block in the prefix cache when it is scheduled, as vLLM v1 does). A layer of a hybrid cache uses
its group's slots and block tables, and a sliding-window layer attends through its window.
"""

from __future__ import annotations

import torch

from pagesim.engine.runtime.batch import StepBatch
from pagesim.engine.runtime.kv_cache import PagedKVCache
from pagesim.kernels import paged_decode_attention, paged_prefill_attention, write_kv_cache


class PagedAttention:
    def __init__(self, cache: PagedKVCache, batch: StepBatch, *, backend: str):
        self.cache = cache
        self.batch = batch
        self.backend = backend
        self.scale = cache.config.head_dim ** -0.5

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, backend, cache = self.batch, self.backend, self.cache
        key_cache, value_cache = cache.key_caches[layer], cache.value_caches[layer]
        tables = batch.layers(cache.layer_group[layer])
        window = cache.layer_window[layer]
        write_kv_cache(k, v, key_cache, value_cache, tables.slot_mapping, backend=backend)
        split = batch.num_prefill_tokens
        parts = []
        if tables.prefill is not None:
            g = tables.prefill
            parts.append(paged_prefill_attention(
                q[:split], key_cache, value_cache, g.block_tables, g.query_start_loc, g.seq_lens, self.scale,
                backend=backend, max_query_len=g.max_query_len, window=window,
            ))
        if tables.decode is not None:
            g = tables.decode
            parts.append(paged_decode_attention(
                q[split:], key_cache, value_cache, g.block_tables, g.seq_lens, self.scale,
                backend=backend, max_context_len=g.max_seq_len, window=window,
            ))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
