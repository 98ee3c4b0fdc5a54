"""The torch backend: the same functions as the Triton kernels, written with gathers and einsums.

This is the fast path on CPU and the readable statement of what each kernel computes. Attention
gathers each sequence's K/V through its block table, computes in float32 and returns the query's
dtype (float64 inputs stay float64). Positions past a sequence's length are masked before the softmax and their values zeroed,
so whatever unused or freed blocks hold (NaN in the engine's validation mode) cannot reach the
output. Arguments are checked by the public functions in ``kernels.ops``, not here.
"""

from __future__ import annotations

import torch

SCORE_BYTES = 256 * 2**20  # prefill: float32 scores held at once, per sequence


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype attention is computed in: float32, or float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` block ids -> ``[..., n * block_size, num_kv_heads, head_dim]`` in ``_acc``."""
    blocks = cache[block_ids]  # [..., n, block_size, kv_heads, head_dim]
    return blocks.flatten(-4, -3).to(_acc(cache))


def decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale) -> torch.Tensor:
    """One batched gather padded to the longest context, or per sequence when padding would more than
    double the tokens gathered (one long context among short ones)."""
    num_seqs = query.shape[0]
    if num_seqs == 0:
        return torch.empty_like(query)
    lens = context_lens.long()
    if num_seqs > 1 and int(lens.max()) * num_seqs > 2 * int(lens.sum()):
        return torch.cat([
            _decode_batch(query[i : i + 1], key_cache, value_cache, block_tables[i : i + 1], lens[i : i + 1], scale)
            for i in range(num_seqs)
        ])
    return _decode_batch(query, key_cache, value_cache, block_tables, lens, scale)


def _decode_batch(query, key_cache, value_cache, block_tables, lens, scale) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    max_blocks = int((lens.max() + block_size - 1) // block_size)
    block_valid = torch.arange(max_blocks, device=lens.device) < ((lens + block_size - 1) // block_size)[:, None]
    ids = torch.where(block_valid, block_tables[:, :max_blocks].long(), 0)
    keys = _gather(key_cache, ids)  # [seqs, tokens, kv_heads, head_dim]
    token_valid = torch.arange(keys.shape[1], device=lens.device) < lens[:, None]  # [seqs, tokens]
    values = torch.where(token_valid[:, :, None, None], _gather(value_cache, ids), 0.0)
    q = query.to(_acc(query)).view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,stkd->skgt", q, keys) * scale
    scores = scores.masked_fill(~token_valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("skgt,stkd->skgd", probs, values)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale) -> torch.Tensor:
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        ids = block_tables[i, : (seq_len + block_size - 1) // block_size].long()
        keys = _gather(key_cache, ids)[:seq_len]  # [seq_len, kv_heads, head_dim]
        values = _gather(value_cache, ids)[:seq_len]
        # Queries in chunks, so the float32 score matrix stays near SCORE_BYTES whatever the prompt.
        chunk = max(1, SCORE_BYTES // (4 * num_heads * seq_len))
        for c0 in range(0, q_len, chunk):
            c1 = min(q_len, c0 + chunk)
            q = query[q_start + c0 : q_start + c1].to(_acc(query)).view(c1 - c0, num_kv_heads, group, head_dim)
            scores = torch.einsum("qkgd,tkd->kgqt", q, keys) * scale
            positions = torch.arange(seq_len - q_len + c0, seq_len - q_len + c1, device=query.device)
            causal = torch.arange(seq_len, device=query.device)[None, :] <= positions[:, None]  # [q, t]
            probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            o = torch.einsum("kgqt,tkd->qkgd", probs, values)
            out[q_start + c0 : q_start + c1] = o.reshape(c1 - c0, num_heads, head_dim).to(query.dtype)
    return out


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    live = slot_mapping >= 0
    slots = slot_mapping[live].long()
    _, _, num_kv_heads, head_dim = key_cache.shape
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key[live])
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value[live])


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    if block_mapping.shape[0] == 0:
        return
    src = block_mapping[:, 0].long()
    dst = block_mapping[:, 1].long()
    for cache in (*key_caches, *value_caches):
        cache.index_copy_(0, dst, cache.index_select(0, src))
