"""Cache write, copy-on-write block copies and swaps, both backends, against plain indexing.

The expected cache is computed slot by slot with Python indexing on a clone; the kernel must
change exactly the named slots / blocks and nothing else (compared bitwise, NaN included).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.kernels import copy_blocks, swap_blocks, write_kv_cache
from tests.conftest import scaled_examples
from tests.kernels_support import num_blocks_for

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, NaN equal to NaN (compared as raw bits)."""
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


def _cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen):
    return torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(25))
@given(
    dtype=st.sampled_from(DTYPES),
    block_size=st.sampled_from([8, 16, 32, 256]),
    kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([64, 80, 128]),
    num_tokens=st.integers(0, 40),
    skip=st.floats(0, 0.5),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    backend=st.sampled_from(["torch", "triton"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_write_kv_cache(dtype, block_size, kv_heads, head_dim, num_tokens, skip, index_dtype, backend, seed):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = num_blocks_for(block_size, kv_heads, head_dim, dtype, needed=num_tokens)
    key_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    num_slots = num_blocks * block_size
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    if num_tokens:
        slots[0] = num_slots - 1  # the very last slot of the cache
    slots = torch.where(torch.rand(num_tokens, generator=gen) < skip, -1, slots).to(index_dtype)
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    want_k, want_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want_k[slot // block_size, slot % block_size] = key[t]
            want_v[slot // block_size, slot % block_size] = value[t]
    write_kv_cache(key, value, key_cache, value_cache, slots, backend=backend)
    assert _same(key_cache, want_k) and _same(value_cache, want_v)


def test_write_kv_cache_takes_strided_tokens():
    """K and V sliced out of one fused QKV projection (a row stride wider than the row) are fine."""
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 3, 2, 64, generator=gen)
    key, value = qkv[:, 1], qkv[:, 2]
    for backend in ("torch", "triton"):
        key_cache = torch.zeros(4, 8, 2, 64)
        value_cache = torch.zeros(4, 8, 2, 64)
        slots = torch.tensor([0, 9, 31, 17, 3])
        write_kv_cache(key, value, key_cache, value_cache, slots, backend=backend)
        assert torch.equal(key_cache.view(-1, 2, 64)[slots], key)
        assert torch.equal(value_cache.view(-1, 2, 64)[slots], value)


@settings(max_examples=scaled_examples(25))
@given(
    dtype=st.sampled_from(DTYPES),
    block_size=st.sampled_from([8, 16, 64]),
    kv_heads=st.integers(1, 2),
    head_dim=st.sampled_from([64, 96, 17]),  # 17: blocks not a multiple of 16 elements (unaligned copy)
    num_layers=st.integers(1, 3),
    num_pairs=st.integers(0, 12),
    backend=st.sampled_from(["torch", "triton"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_copy_blocks(dtype, block_size, kv_heads, head_dim, num_layers, num_pairs, backend, seed):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    keys = [_cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen) for _ in range(num_layers)]
    values = [_cache(num_blocks, block_size, kv_heads, head_dim, dtype, gen) for _ in range(num_layers)]
    ids = torch.randperm(num_blocks, generator=gen)[: 2 * num_pairs]
    dst = ids[num_pairs:]
    # Copy-on-write can copy one shared source into several fresh blocks in one step.
    src = ids[:num_pairs][torch.randint(max(num_pairs, 1), (num_pairs,), generator=gen)] if num_pairs else ids[:0]
    mapping = torch.stack([src, dst], dim=1)
    want = [c.clone() for c in keys + values]
    for cache in want:
        for s, d in mapping.tolist():
            cache[d] = cache[s]
    copy_blocks(keys, values, mapping, backend=backend)
    assert all(_same(got, exp) for got, exp in zip(keys + values, want))


def test_swap_blocks_round_trip():
    """Out to a smaller CPU space and back into other GPU blocks (here CPU to CPU), every layer."""
    gen = torch.Generator().manual_seed(2)
    gpu = [_cache(32, 16, 2, 64, torch.bfloat16, gen) for _ in range(4)]
    cpu = [torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16) for _ in range(4)]
    out_map = torch.tensor([[5, 0], [31, 7], [12, 3]])
    swap_blocks(gpu, cpu, out_map)
    for g, c in zip(gpu, cpu):
        for src, dst in out_map.tolist():
            assert _same(c[dst], g[src])
    in_map = torch.tensor([[0, 1], [7, 2], [3, 30]])
    before = [g.clone() for g in gpu]
    swap_blocks(cpu, gpu, in_map)
    for g, b in zip(gpu, before):
        for (cpu_block, gpu_block), (orig, _) in zip(in_map.tolist(), out_map.tolist()):
            assert _same(g[gpu_block], b[orig])
        untouched = [i for i in range(32) if i not in (1, 2, 30)]
        assert _same(g[untouched], b[untouched])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_swap_and_copy():
    gen = torch.Generator().manual_seed(4)
    host = [_cache(16, 16, 8, 128, torch.bfloat16, gen).pin_memory() for _ in range(2)]
    dev = [torch.zeros(64, 16, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    swap_blocks(host, dev, torch.tensor([[0, 63], [15, 1]]))
    back = [torch.zeros(16, 16, 8, 128, dtype=torch.bfloat16).pin_memory() for _ in range(2)]
    swap_blocks(dev, back, torch.tensor([[63, 2], [1, 3]]))
    torch.cuda.synchronize()
    for h, b in zip(host, back):
        assert _same(b[2], h[0]) and _same(b[3], h[15])
    copy_blocks([dev[0]], [dev[1]], torch.tensor([[63, 5]], device="cuda"))
    assert _same(dev[0][5].cpu(), host[0][0]) and _same(dev[1][5].cpu(), host[1][0])
