"""Paged decode and prefill attention, both backends, against a float64 reference (kernels_support).

Hypothesis draws the shapes a user may simulate: grouped-query ratios 1/4/8, block sizes 8..256,
head dims 64/80/96/128/256, float32/float16/bfloat16, lengths of 1 and lengths on either side of
block and split boundaries, forced flash-decoding split counts, caches of 32,768 blocks where they
fit, junk past each block table and NaN in every slot nothing wrote. The Triton path runs in
Triton's interpreter on CPU (conftest sets ``TRITON_INTERPRET=1``), so its shapes stay small.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.kernels import paged_decode_attention, paged_prefill_attention
from tests.conftest import scaled_examples
from tests.kernels_support import assert_matches, build_paged, reference_attention, reference_decode

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 80, 96, 128, 256]
BLOCK_SIZES = [8, 16, 32, 64, 128, 256]
TILE = 64  # the Triton kernels' token tile for head_dim <= 128: split starts are multiples of it


@st.composite
def lengths(draw, *, block_size: int, max_len: int, min_len: int = 1):
    """A length anywhere, or on a block or tile boundary, or exactly ``min_len``."""
    boundary = st.builds(
        lambda unit, k, e: k * unit + e,
        st.sampled_from([block_size, TILE]),
        st.integers(1, 3),
        st.sampled_from([-1, 0, 1]),
    )
    n = draw(st.one_of(st.integers(min_len, max_len), boundary, st.just(min_len)))
    return min(max(n, min_len), max_len)


@st.composite
def attention_shapes(draw, *, max_seqs: int, max_len: int, max_kv_heads: int):
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        head_dim=draw(st.sampled_from(HEAD_DIMS)),
        block_size=(bs := draw(st.sampled_from(BLOCK_SIZES))),
        num_kv_heads=draw(st.integers(1, max_kv_heads)),
        group=draw(st.sampled_from([1, 4, 8])),
        lengths=draw(st.lists(lengths(block_size=bs, max_len=max_len), min_size=1, max_size=max_seqs)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _decode_check(shape: dict, backend: str, num_splits: int | None) -> None:
    gen = torch.Generator().manual_seed(shape["seed"])
    paged = build_paged(
        shape["lengths"], block_size=shape["block_size"], num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], dtype=shape["dtype"], gen=gen,
    )
    num_heads = shape["num_kv_heads"] * shape["group"]
    query = torch.randn(len(shape["lengths"]), num_heads, shape["head_dim"], generator=gen).to(shape["dtype"])
    scale = 1 / math.sqrt(shape["head_dim"])
    out = paged_decode_attention(
        query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, scale,
        backend=backend, num_splits=num_splits,
    )
    assert_matches(out, reference_decode(query, paged, scale), shape["dtype"])


@settings(max_examples=scaled_examples(40))
@given(shape=attention_shapes(max_seqs=6, max_len=600, max_kv_heads=4))
def test_decode_torch_matches_reference(shape):
    _decode_check(shape, "torch", None)


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(20))
@given(shape=attention_shapes(max_seqs=3, max_len=200, max_kv_heads=2), num_splits=st.sampled_from([None, 1, 2, 3, 5]))
def test_decode_triton_matches_reference(shape, num_splits):
    _decode_check(shape, "triton", num_splits)


def _prefill_check(shape: dict, q_lens: list[int], backend: str) -> None:
    gen = torch.Generator().manual_seed(shape["seed"])
    paged = build_paged(
        shape["lengths"], block_size=shape["block_size"], num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], dtype=shape["dtype"], gen=gen,
    )
    q_lens = [min(q, n) for q, n in zip(q_lens, shape["lengths"])]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    num_heads = shape["num_kv_heads"] * shape["group"]
    query = torch.randn(starts[-1], num_heads, shape["head_dim"], generator=gen).to(shape["dtype"])
    scale = 1 / math.sqrt(shape["head_dim"])
    out = paged_prefill_attention(
        query, paged.key_cache, paged.value_cache, paged.block_tables,
        torch.tensor(starts, dtype=torch.int32), paged.lengths, scale, backend=backend,
    )
    assert_matches(out, reference_attention(query, paged, starts, scale), shape["dtype"])


def _q_lens(max_q: int):
    """Query tokens per sequence: 0 (nothing new), 1, a whole prompt (capped later) or in between."""
    return st.lists(st.one_of(st.integers(0, max_q), st.just(1), st.just(10**6)), min_size=6, max_size=6)


@settings(max_examples=scaled_examples(30))
@given(shape=attention_shapes(max_seqs=4, max_len=400, max_kv_heads=4), q_lens=_q_lens(200))
def test_prefill_torch_matches_reference(shape, q_lens):
    _prefill_check(shape, q_lens, "torch")


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
@settings(max_examples=scaled_examples(12))
@given(shape=attention_shapes(max_seqs=2, max_len=150, max_kv_heads=2), q_lens=_q_lens(80))
def test_prefill_triton_matches_reference(shape, q_lens):
    _prefill_check(shape, q_lens, "triton")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_decode_is_prefill_of_one_token(backend):
    """A decode step equals a prefill chunk of one token at the same position."""
    gen = torch.Generator().manual_seed(7)
    paged = build_paged([1, 17, 64, 130], block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32, gen=gen)
    query = torch.randn(4, 8, 64, generator=gen)
    args = (query, paged.key_cache, paged.value_cache, paged.block_tables)
    decode = paged_decode_attention(*args, paged.lengths, 0.125, backend=backend)
    prefill = paged_prefill_attention(
        *args, torch.arange(5, dtype=torch.int32), paged.lengths, 0.125, backend=backend
    )
    torch.testing.assert_close(decode, prefill, atol=1e-6, rtol=1e-6)


def test_split_counts_agree_with_each_other():
    """Flash-decoding's combine step: every split count gives the unsplit answer (float32)."""
    gen = torch.Generator().manual_seed(3)
    paged = build_paged([1, 63, 64, 65, 200], block_size=8, num_kv_heads=1, head_dim=64, dtype=torch.float32, gen=gen)
    query = torch.randn(5, 4, 64, generator=gen)
    args = (query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, 0.125)
    unsplit = paged_decode_attention(*args, backend="triton", num_splits=1)
    for splits in (2, 4, 7):
        torch.testing.assert_close(paged_decode_attention(*args, backend="triton", num_splits=splits), unsplit, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_highest_blocks_of_a_large_cache(backend):
    """Sequences living in the last blocks of a 40,000-block cache read exactly those blocks."""
    gen = torch.Generator().manual_seed(11)
    num_blocks = 40_000
    paged = build_paged([48, 33], block_size=16, num_kv_heads=1, head_dim=64, dtype=torch.float16, gen=gen, num_blocks=num_blocks)
    top = torch.arange(num_blocks - 1, num_blocks - 7, -1, dtype=torch.int32)
    moved = paged.key_cache.clone(), paged.value_cache.clone()
    for cache, src in zip(moved, (paged.key_cache, paged.value_cache)):
        cache.fill_(float("nan"))
        for seq, n in enumerate((3, 3)):
            cache[top[3 * seq : 3 * seq + n].long()] = src[paged.block_tables[seq, :n].long()]
    paged.key_cache, paged.value_cache = moved
    paged.block_tables[0, :3], paged.block_tables[1, :3] = top[:3], top[3:6]
    query = torch.randn(2, 4, 64, generator=gen).to(torch.float16)
    out = paged_decode_attention(query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, 0.125, backend=backend)
    assert_matches(out, reference_decode(query, paged, 0.125), torch.float16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_kernels_match_reference(dtype):
    """Compiled kernels on the GPU (native fp16/bf16 matrix units), decode with and without splits."""
    gen = torch.Generator().manual_seed(5)
    paged = build_paged([1, 15, 16, 17, 1000, 4097], block_size=16, num_kv_heads=8, head_dim=128, dtype=dtype, gen=gen)
    query = torch.randn(6, 32, 128, generator=gen).to(dtype)
    ref = reference_decode(query, paged, 128**-0.5)
    cuda = [t.cuda() for t in (query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths)]
    for splits in (None, 1, 8):
        out = paged_decode_attention(*cuda, 128**-0.5, num_splits=splits).cpu()
        assert_matches(out, ref, dtype, gpu=True)
    q_lens = [1, 7, 8, 1, 483, 1]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    pre_q = torch.randn(starts[-1], 32, 128, generator=gen).to(dtype)
    out = paged_prefill_attention(
        pre_q.cuda(), *cuda[1:4], torch.tensor(starts, dtype=torch.int32).cuda(), cuda[4], 128**-0.5
    ).cpu()
    assert_matches(out, reference_attention(pre_q, paged, starts, 128**-0.5), dtype, gpu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_cache_beyond_int32_elements():
    """A bf16 cache of more than 2**31 elements: blocks past the int32 range are addressed right."""
    block_size, kv_heads, head_dim = 16, 8, 128
    num_blocks = 2**31 // (block_size * kv_heads * head_dim) + 64
    key_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    value_cache = torch.full_like(key_cache, float("nan"))
    gen = torch.Generator().manual_seed(9)
    small = build_paged([40], block_size=block_size, num_kv_heads=kv_heads, head_dim=head_dim, dtype=torch.bfloat16, gen=gen, num_blocks=8)
    top = torch.tensor([[num_blocks - 1, num_blocks - 2, num_blocks - 3]], dtype=torch.int32)
    for big, src in ((key_cache, small.key_cache), (value_cache, small.value_cache)):
        big[top[0].long().cuda()] = src[small.block_tables[0, :3].long()].cuda()
    query = torch.randn(1, 32, head_dim, generator=gen).to(torch.bfloat16)
    ref = reference_decode(query, small, 0.1)
    for splits in (1, 2):
        out = paged_decode_attention(query.cuda(), key_cache, value_cache, top.cuda(), small.lengths.cuda(), 0.1,
                                     num_splits=splits).cpu()
        assert_matches(out, ref, torch.bfloat16, gpu=True)


def test_torch_prefill_in_query_chunks(monkeypatch):
    """The torch backend bounds its score matrix by splitting long chunks of queries: same answer."""
    from pagesim.kernels import reference

    gen = torch.Generator().manual_seed(13)
    paged = build_paged([90, 40], block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32, gen=gen)
    starts = [0, 70, 110]
    query = torch.randn(110, 8, 64, generator=gen)
    args = (query, paged.key_cache, paged.value_cache, paged.block_tables, torch.tensor(starts, dtype=torch.int32),
            paged.lengths, 0.125)
    whole = paged_prefill_attention(*args, backend="torch")
    monkeypatch.setattr(reference, "SCORE_BYTES", 4 * 8 * 90 * 7)  # 7 query rows at a time
    chunked = paged_prefill_attention(*args, backend="torch")
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
    assert_matches(chunked, reference_attention(query, paged, starts, 0.125), torch.float32)


LARGE_CACHE_SCRIPT = r"""
import torch
from pagesim.kernels import copy_blocks, paged_decode_attention, paged_prefill_attention, write_kv_cache
from tests.kernels_support import assert_matches, build_paged, reference_attention, reference_decode

# A float16 cache past 2**31 elements, allocated lazily (torch.empty touches no page): only the blocks
# written below take memory. Sequences live in the highest blocks, so a 32-bit offset would wrap.
bs, kvh, d = 16, 8, 128
num_blocks = 2**31 // (bs * kvh * d) + 1024
gen = torch.Generator().manual_seed(21)
small = build_paged([40, 17], block_size=bs, num_kv_heads=kvh, head_dim=d, dtype=torch.float16, gen=gen, num_blocks=8)
kc = torch.empty(num_blocks, bs, kvh, d, dtype=torch.float16)
vc = torch.empty(num_blocks, bs, kvh, d, dtype=torch.float16)
top = torch.tensor([[num_blocks - 1, num_blocks - 2, num_blocks - 3], [num_blocks - 4, num_blocks - 5, 0]],
                   dtype=torch.int32)
for big, src in ((kc, small.key_cache), (vc, small.value_cache)):
    for seq, n in ((0, 3), (1, 2)):
        big[top[seq, :n].long()] = src[small.block_tables[seq, :n].long()]
query = torch.randn(2, 32, d, generator=gen).half()
ref = reference_decode(query, small, 0.1)
for backend in ("triton", "torch"):
    for splits in (None, 2):
        out = paged_decode_attention(query, kc, vc, top, small.lengths, 0.1, backend=backend, num_splits=splits)
        assert_matches(out, ref, torch.float16)
    starts = [0, 5, 22]
    pq = torch.randn(22, 32, d, generator=gen).half()
    out = paged_prefill_attention(pq, kc, vc, top, torch.tensor(starts, dtype=torch.int32), small.lengths, 0.1,
                                  backend=backend)
    assert_matches(out, reference_attention(pq, small, starts, 0.1), torch.float16)
    k = torch.randn(2, kvh, d, generator=gen).half()
    slots = torch.tensor([(num_blocks - 6) * bs + 3, (num_blocks - 8) * bs + 15])  # blocks no sequence uses
    write_kv_cache(k, k, kc, vc, slots, backend=backend)
    assert torch.equal(kc[num_blocks - 6, 3], k[0]) and torch.equal(vc[num_blocks - 8, 15], k[1])
    copy_blocks([kc], [vc], torch.tensor([[num_blocks - 1, num_blocks - 7]]), backend=backend)
    assert torch.equal(kc[num_blocks - 7], kc[num_blocks - 1]) and torch.equal(vc[num_blocks - 7], vc[num_blocks - 1])
print("ok")
"""


def test_caches_past_int32_elements_on_cpu():
    """Every kernel, both backends, on a cache of more than 2**31 elements (in a subprocess: a wrong
    offset there is a crash, not a failed assertion)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", LARGE_CACHE_SCRIPT], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.returncode, out.stderr[-3000:])
