"""Triton PagedAttention: decode (with split-KV, flash-decoding style) and prefill over block tables.

Idea. K/V live in ``[num_blocks, block_size, num_kv_heads, head_dim]`` caches; a sequence's token
``t`` is at block ``block_table[t // block_size]``, offset ``t % block_size``. The kernels walk a
sequence's tokens in tiles of ``BLOCK_N`` and look up each token's block through the table, so the
tile size is independent of the block size (any block size works; small blocks cost more table
lookups and shorter contiguous runs, which the GPU benchmark measures). Softmax is the online
(streaming) form: a running max ``m``, running sum ``l`` and unnormalised accumulator, in base 2.

Invariants.
- Only tokens ``< context length`` are loaded (masked loads), so unused and freed blocks are never
  read: NaN there cannot reach the output. Block ids are widened to int64 before they multiply a
  block stride, so caches of more than 2**31 elements address correctly.
- Decode: one program per (sequence, KV head, split); it serves all ``group`` query heads of that
  KV head at once (grouped-query attention, rows padded to 16 for ``tl.dot``). With more than one
  split, each program writes a normalised partial output and its log-sum-exp, and a second kernel
  combines them weighted by ``exp2(lse - max lse)``; an empty split has ``lse = -inf`` and weight 0.
- Prefill: one program per (sequence, tile of ``BLOCK_M`` query tokens, query head). The query
  tokens are the last ``q_len`` of the sequence's ``seq_len`` tokens, already written to the cache;
  query token ``i`` sees tokens ``0 .. seq_len - q_len + i`` (cached prefix + causal within the
  chunk), which covers prefix-cache hits, chunked prefill and recompute.
- Sliding window (``window`` > 0; 0: none): query position ``p`` sees ``p - window + 1 .. p``. A
  decode program's tiles start at its window (its splits divide the window, not the context); a
  prefill tile's at the first position its first query sees, with the rest masked per row, so
  blocks a window dropped (vLLM's null block) are never loaded. A row may then meet a whole tile it
  cannot see: the running max stays ``-inf`` and the tile adds nothing (``m_safe``).
- ``DOT_F32``: operands are upcast to float32 and multiplied exactly (``ieee``). Used for float32
  inputs, and for bfloat16 under the interpreter, whose ``tl.dot`` on bfloat16 operands is wrong
  (Triton 3.9, seen here); on a GPU, fp16/bf16 operands go to the matrix units as they are.

Uses only Triton features present in both Triton 3.6 and the PyPI release (``tl.dot`` with
``input_precision``, masked loads, ``tl.exp2``).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
PROGRAMS_PER_SM = 4


@triton.jit
def _attend_tile(
    q,  # [ROWS, HEAD_DIM_PAD] query rows (float32 when DOT_F32)
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]; v_cache has the same strides
    v_cache_ptr,
    table_row,  # this sequence's block-table row
    tokens,  # [BLOCK_N] token positions of the tile
    token_mask,  # [BLOCK_N] positions that exist: only these are loaded
    visible,  # [ROWS, BLOCK_N] (row, token) pairs whose scores count
    kv_head, d, d_mask, stride_b, stride_t, stride_h, scale_log2,
    m_i,  # [ROWS] running max (base 2)
    l_i,  # [ROWS] running sum
    acc,  # [ROWS, HEAD_DIM_PAD] unnormalised output
    BLOCK_SIZE: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """One tile of online softmax: load K/V through the block table, fold the tile into (m, l, acc)."""
    block_ids = tl.load(table_row + tokens // BLOCK_SIZE, mask=token_mask, other=0).to(tl.int64)
    offsets = block_ids[:, None] * stride_b + (tokens % BLOCK_SIZE)[:, None] * stride_t + kv_head * stride_h + d[None, :]
    kv_mask = token_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen nothing yet keeps m = -inf; exp2 against 0 then gives 0, never NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # same as k_cache
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    context_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_seqs, num_heads, head_dim]            (not SPLIT)
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM_PAD] fp32 (SPLIT)
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, base-2 log-sum-exp
    scale_log2,  # softmax scale * log2(e)
    tokens_per_split,  # multiple of BLOCK_N
    num_splits,  # a run-time value, so a new split count compiles nothing
    window,  # sliding window in tokens; 0: the whole context
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,  # value_cache has the same strides (same shape, contiguous)
    stride_bs,
    stride_os, stride_oh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1: write partials for the combine kernel
    DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    context_len = tl.load(context_lens_ptr + seq)
    first = tl.where(window > 0, tl.maximum(context_len - window, 0), 0)  # the first position it sees
    start = first + split * tokens_per_split
    # The last split runs to the sequence's end, whatever the caller said the longest context was.
    end = tl.where(split == num_splits - 1, context_len, tl.minimum(context_len, start + tokens_per_split))

    g = tl.arange(0, GROUP_PAD)
    head_mask = g < GROUP
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = d < HEAD_DIM

    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + d[None, :],
        mask=head_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bs

    for tile in range(start, end, BLOCK_N):
        tokens = tile + tl.arange(0, BLOCK_N)
        token_mask = tokens < end
        m_i, l_i, acc = _attend_tile(
            q, k_cache_ptr, v_cache_ptr, table_row, tokens, token_mask, token_mask[None, :],
            kv_head, d, d_mask, stride_kb, stride_kt, stride_kh, scale_log2, m_i, l_i, acc,
            BLOCK_SIZE, DOT_F32,
        )

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if not SPLIT:
        tl.store(
            out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=head_mask[:, None] & d_mask[None, :],
        )
    else:
        row = (seq * (GROUP * tl.num_programs(1)) + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM_PAD + d[None, :], out, mask=head_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=head_mask)


@triton.jit
def _combine_splits_kernel(
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM_PAD] fp32
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32
    out_ptr,  # [num_seqs, num_heads, head_dim]
    stride_os, stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # next power of two >= num_splits
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row0 = (seq * tl.num_programs(1) + head) * num_splits
    s = tl.arange(0, SPLITS_PAD)
    s_mask = s < num_splits
    d = tl.arange(0, HEAD_DIM_PAD)
    lse = tl.load(part_lse_ptr + row0 + s, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, 0)  # finite unless the sequence is empty (context 0, a padded batch slot)
    weights = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))
    total = tl.sum(weights, 0)
    weights = weights / tl.where(total > 0, total, 1.0)  # an empty sequence gets zeros, as unsplit
    parts = tl.load(part_out_ptr + (row0 + s)[:, None] * HEAD_DIM_PAD + d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


@triton.jit
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim], sequences packed by query_start_loc
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32: tokens in the cache including this chunk
    out_ptr,  # [num_tokens, num_heads, head_dim]
    scale_log2,
    window,  # sliding window in tokens; 0: the whole context
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,  # value_cache has the same strides (same shape, contiguous)
    stride_bs,
    stride_ot, stride_oh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // GROUP

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len

    rows = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    positions = prefix + rows  # absolute position of each query token
    d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = d < HEAD_DIM
    tokens_q = (q_start + rows).to(tl.int64)

    q = tl.load(
        q_ptr + tokens_q[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bs
    # Keys this tile needs: up to its last query token's position; none for a tile past q_len.
    kv_end = tl.where(q_tile * BLOCK_M < q_len, tl.minimum(seq_len, prefix + (q_tile + 1) * BLOCK_M), 0)
    # ... and from the first position its first query's window reaches (0 without a window).
    kv_start = tl.where(window > 0, tl.maximum(prefix + q_tile * BLOCK_M - window + 1, 0), 0)

    for tile in range(kv_start, kv_end, BLOCK_N):
        tokens = tile + tl.arange(0, BLOCK_N)
        token_mask = tokens < kv_end
        visible = token_mask[None, :] & (tokens[None, :] <= positions[:, None])
        visible = visible & ((tokens[None, :] > positions[:, None] - window) | (window == 0))
        # Without a window every row sees token 0 in the first tile; with one, a row may see
        # nothing in a tile, which _attend_tile leaves out.
        m_i, l_i, acc = _attend_tile(
            q, k_cache_ptr, v_cache_ptr, table_row, tokens, token_mask, visible,
            kv_head, d, d_mask, stride_kb, stride_kt, stride_kh, scale_log2, m_i, l_i, acc,
            BLOCK_SIZE, DOT_F32,
        )

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + tokens_q[:, None] * stride_ot + head * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def _pad(n: int) -> int:
    """Tile extent for a dimension of ``n``: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, triton.next_power_of_2(n))


def decode_tile(head_dim_pad: int, dtype: torch.dtype) -> int:
    """Tokens per decode tile: 64, halved for wide heads and again for float32 (registers; see below)."""
    tile = 64 if head_dim_pad <= 128 else 32
    return tile // 2 if dtype == torch.float32 and head_dim_pad > 128 else tile


def prefill_tile(head_dim_pad: int, dtype: torch.dtype) -> int:
    """Query and key tile of prefill: 64 x 64 for 16-bit operands up to head dim 128, halved for
    wider heads, halved again for float32.

    Chosen from ``python -m pagesim.kernels.offline_compile`` on sm_90: float32 operands at 64 x 64 (and
    at 32 x 32 for head dim 256, or float32 decode of head dim 256 at 32 tokens) spill registers;
    these sizes do not.
    """
    if dtype == torch.float32:
        return 32 if head_dim_pad <= 128 else 16
    return 64 if head_dim_pad <= 128 else 32


def interpreting() -> bool:
    """Whether these kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return type(_decode_kernel).__name__ == "InterpretedFunction"


def _dot_f32(dtype: torch.dtype) -> bool:
    return dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting())


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Flash-decoding split count: split a sequence's context only when the grid is too small.

    A decode program streams one KV head of one sequence; a memory-bound kernel needs several
    resident per multiprocessor to hide latency. With ``num_seqs * num_kv_heads`` programs below
    ``PROGRAMS_PER_SM`` per multiprocessor, each sequence's context is cut into enough splits of at
    least ``MIN_TOKENS_PER_SPLIT`` tokens to reach that, so long contexts at small batch still fill
    the chip. On CPU (the interpreter) 1.
    """
    if device.type != "cuda":
        return 1
    programs = num_seqs * num_kv_heads
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    target = PROGRAMS_PER_SM * sms
    useful = math.ceil(max_context_len / MIN_TOKENS_PER_SPLIT)
    if programs >= target or useful <= 1:
        return 1
    return max(1, min(useful, math.ceil(target / programs), MAX_SPLITS))


def decode_attention(
    query, key_cache, value_cache, block_tables, context_lens, scale, *, max_context_len=None, num_splits=None,
    window=None,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if max_context_len is None:
        max_context_len = int(context_lens.max())
    if window is not None:  # the splits divide what a query sees
        max_context_len = min(max_context_len, window)
    head_dim_pad = _pad(head_dim)
    block_n = decode_tile(head_dim_pad, query.dtype)
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, query.device)
    num_splits = max(1, min(num_splits, MAX_SPLITS, triton.cdiv(max_context_len, block_n)))
    tokens_per_split = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    group = num_heads // num_kv_heads
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim_pad, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        part_out = part_lse = out  # unused by the kernel
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, context_lens, out, part_out, part_lse,
        scale * LOG2E, tokens_per_split, num_splits, window or 0,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, GROUP_PAD=_pad(group), BLOCK_N=block_n, SPLIT=num_splits > 1,
        DOT_F32=_dot_f32(query.dtype),
        num_warps=4,
    )
    if num_splits > 1:
        _combine_splits_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1), num_splits,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out


def prefill_attention(
    query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, *, max_query_len=None, window=None
) -> torch.Tensor:
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    out = torch.empty_like(query)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    head_dim_pad = _pad(head_dim)
    block_m = block_n = prefill_tile(head_dim_pad, query.dtype)
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out,
        scale * LOG2E, window or 0,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=num_heads // num_kv_heads, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_F32=_dot_f32(query.dtype),
        num_warps=4,
    )
    return out
