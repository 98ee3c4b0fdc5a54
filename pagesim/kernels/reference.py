"""The torch backend: the same functions as the Triton kernels, written with gathers and einsums.

This is the fast path on CPU and the readable statement of what each kernel computes. Attention
gathers each sequence's K/V through its block table, computes in float32 and returns the query's
dtype (float64 inputs stay float64). Positions past a sequence's length are masked before the softmax and their values zeroed,
so whatever unused or freed blocks hold (NaN in the engine's validation mode) cannot reach the
output. With a sliding ``window`` a query at position ``p`` attends only positions
``p - window + 1 .. p``, and only those (and, in prefill, the positions the tile's other queries
see) are gathered: the blocks a window has dropped (vLLM's null block) are never read. Arguments
are checked by the public functions in ``pagesim.kernels.ops``, not here.
"""

from __future__ import annotations

import torch

SCORE_BYTES = 256 * 2**20  # prefill: float32 scores held at once, per sequence
GATHER_BYTES = 256 * 2**20  # decode: gathered tokens' widest intermediate held at once


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype attention is computed in: float32, or float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` block ids -> ``[..., n * block_size, num_kv_heads, head_dim]`` in ``_acc``."""
    blocks = cache[block_ids]  # [..., n, block_size, kv_heads, head_dim]
    return blocks.flatten(-4, -3).to(_acc(cache))


def decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale, window=None) -> torch.Tensor:
    """Variable length, unpadded: every sequence's K/V tokens gathered into one flat list, a score
    per token, and a softmax per sequence by segment (scatter max, index-add sums). Its cost
    follows the total context and the number of sequences, not the longest sequence, with a fixed
    number of operations (the simulator's calibrated cost model relies on that). Sequences go in
    groups whose gathered tokens stay near ``GATHER_BYTES``."""
    num_seqs, num_heads, head_dim = query.shape
    if num_seqs == 0:
        return torch.empty_like(query)
    lens = context_lens.long()
    # The first position each query attends (0 without a window).
    firsts = (lens - window).clamp(min=0) if window is not None else torch.zeros_like(lens)
    counts = lens - firsts
    per_token = 8 * num_heads * head_dim  # bytes of one token's widest intermediate
    if int(counts.sum()) * per_token <= GATHER_BYTES:
        return _decode_varlen(query, key_cache, value_cache, block_tables, firsts, counts, scale)
    out = torch.empty_like(query)
    counts_list = counts.tolist()
    start = 0
    while start < num_seqs:
        end, total = start + 1, counts_list[start]
        while end < num_seqs and (total + counts_list[end]) * per_token <= GATHER_BYTES:
            total += counts_list[end]
            end += 1
        out[start:end] = _decode_varlen(query[start:end], key_cache, value_cache, block_tables[start:end],
                                        firsts[start:end], counts[start:end], scale)
        start = end
    return out


def _decode_varlen(query, key_cache, value_cache, block_tables, firsts, counts, scale) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    acc = _acc(query)
    device = query.device
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), counts)  # [N]: each token's sequence
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(seq.shape[0], device=device) - starts[seq] + firsts[seq]
    blocks = block_tables.long()[seq, pos // block_size]
    offsets = pos % block_size
    keys = key_cache[blocks, offsets].to(acc)  # [N, kv_heads, head_dim]: only tokens that exist
    values = value_cache[blocks, offsets].to(acc)
    q = query.to(acc).view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("tkd,tkgd->tkg", keys, q[seq]) * scale  # [N, kv_heads, group]
    shape = (num_seqs, num_kv_heads, group)
    top = torch.full(shape, float("-inf"), dtype=acc, device=device).scatter_reduce_(
        0, seq[:, None, None].expand_as(scores), scores, "amax")
    weights = torch.exp(scores - top[seq])
    total = torch.zeros(shape, dtype=acc, device=device).index_add_(0, seq, weights)
    out = torch.zeros((*shape, head_dim), dtype=acc, device=device).index_add_(
        0, seq, weights[..., None] * values[:, :, None, :])
    return (out / total[..., None]).reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                      window=None) -> torch.Tensor:
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
        # The first position any query of the chunk attends (its first query's window).
        first = max(0, seq_len - q_len - window + 1) if window is not None else 0
        ids = block_tables[i, first // block_size : (seq_len + block_size - 1) // block_size].long()
        offset = first % block_size
        keys = _gather(key_cache, ids)[offset : offset + seq_len - first]  # [seq_len - first, kv_heads, head_dim]
        values = _gather(value_cache, ids)[offset : offset + seq_len - first]
        key_positions = torch.arange(first, seq_len, device=query.device)
        # Queries in chunks, so the float32 score matrix stays near SCORE_BYTES whatever the prompt.
        chunk = max(1, SCORE_BYTES // (4 * num_heads * (seq_len - first)))
        for c0 in range(0, q_len, chunk):
            c1 = min(q_len, c0 + chunk)
            q = query[q_start + c0 : q_start + c1].to(_acc(query)).view(c1 - c0, num_kv_heads, group, head_dim)
            scores = torch.einsum("qkgd,tkd->kgqt", q, keys) * scale
            positions = torch.arange(seq_len - q_len + c0, seq_len - q_len + c1, device=query.device)
            causal = key_positions[None, :] <= positions[:, None]  # [q, t]
            if window is not None:
                causal &= key_positions[None, :] > positions[:, None] - window
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
