"""Triton cache kernels: write new tokens' K/V into their slots, and one step's copy-on-write copies.

- ``write_kv_cache``: one program per token; slot ``s`` is block ``s // block_size``, offset
  ``s % block_size``; a slot of -1 skips the token (padding), as in vLLM's ``reshape_and_cache``.
- ``copy_blocks``: one launch for every layer's key and value cache. The caches are separate
  tensors, so the kernel receives a table of their addresses (int64) and casts each entry back to
  a typed pointer; program (pair, cache) copies one whole block in chunks. Sources and
  destinations must be disjoint (checked on CPU), so the copies are independent.

Offsets are computed in int64 so caches beyond 2**31 elements address correctly.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

COPY_CHUNK = 1024


@triton.jit
def _write_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    v_cache_ptr,  # same as k_cache
    slot_ptr,  # [num_tokens] int32 or int64, -1 = skip
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    live = tl.full([HEADS_PAD, HEAD_DIM_PAD], 0, tl.int64) + slot >= 0  # broadcast the scalar test
    mask = live & (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    cache_off = slot * (NUM_KV_HEADS * HEAD_DIM) + h[:, None] * HEAD_DIM + d[None, :]
    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    tl.store(k_cache_ptr + cache_off, k, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(v_cache_ptr + cache_off, v, mask=mask)


@triton.jit
def _copy_blocks_kernel(
    cache_addrs_ptr,  # [2 * num_layers] int64: data_ptr() of every key cache, then every value cache
    typed_ptr,  # any one of the caches: gives the element type for the casts
    mapping_ptr,  # [num_pairs, 2] (src, dst)
    stride_m0, stride_m1,
    BLOCK_NUMEL: tl.constexpr,  # block_size * num_kv_heads * head_dim
    CHUNK: tl.constexpr,
    ALIGNED: tl.constexpr,  # every cache 16-byte aligned and blocks a multiple of 16 elements
):
    pair = tl.program_id(0)
    cache = tl.program_id(1)
    base = tl.load(cache_addrs_ptr + cache).to(tl.pointer_type(typed_ptr.dtype.element_ty))
    src = tl.load(mapping_ptr + pair * stride_m0).to(tl.int64) * BLOCK_NUMEL
    dst = tl.load(mapping_ptr + pair * stride_m0 + stride_m1).to(tl.int64) * BLOCK_NUMEL
    if ALIGNED:
        # An address read from memory carries no alignment the compiler can see: say it, so the
        # copy uses 16-byte loads and stores instead of one element at a time.
        base = tl.multiple_of(base, 16)
        src = tl.multiple_of(src, 16)
        dst = tl.multiple_of(dst, 16)
    for start in range(0, BLOCK_NUMEL, CHUNK):
        idx = start + tl.arange(0, CHUNK)
        mask = idx < BLOCK_NUMEL
        tl.store(base + dst + idx, tl.load(base + src + idx, mask=mask), mask=mask)


@functools.lru_cache(maxsize=16)
def _address_table(addresses: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The caches' addresses on the device, built once per set of caches (an engine has one).

    Building it per call would copy from pageable host memory each step, which synchronises the
    host with the device and cannot be captured in a CUDA graph.
    """
    return torch.tensor(addresses, dtype=torch.int64, device=device)


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        num_warps=4,
    )


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    caches = [*key_caches, *value_caches]
    addrs = _address_table(tuple(c.data_ptr() for c in caches), caches[0].device)
    block_numel = caches[0][0].numel()
    aligned = block_numel % 16 == 0 and all(c.data_ptr() % 16 == 0 for c in caches)
    _copy_blocks_kernel[(num_pairs, len(caches))](
        addrs, caches[0], block_mapping, block_mapping.stride(0), block_mapping.stride(1),
        BLOCK_NUMEL=block_numel, CHUNK=min(COPY_CHUNK, triton.next_power_of_2(block_numel)), ALIGNED=aligned,
        num_warps=4,
    )
