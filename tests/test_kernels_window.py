"""Sliding-window paged attention, both backends, against a float64 reference with the window mask.

The cache is laid out as a hybrid KV cache holds a sliding-window group: the blocks wholly before
the first query's window have been dropped, their table entries point at the null block (here a
block full of NaN), so a kernel that reads one turns the output into NaN. The reference gathers
the sequence's original blocks and masks keys outside ``p - window + 1 .. p`` for each query ``p``.
The Triton path runs in Triton's interpreter (conftest sets ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.kernels import paged_decode_attention, paged_prefill_attention
from pagesim.kernels.validate import KernelArgumentError
from tests.conftest import scaled_examples
from tests.kernels_support import assert_matches, build_paged, cdiv

NULL_BLOCK = 0  # build_paged's blocks are random; block 0 is made a NaN block below


def windowed_reference(query, key_cache, value_cache, tables, lengths, query_start_loc, scale, window):
    """float64: sequence i's queries are its last q_len tokens; query p sees p - window + 1 .. p."""
    num_heads = query.shape[1]
    bs, num_kv_heads, head_dim = key_cache.shape[1:]
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    for seq, length in enumerate(lengths):
        start, end = query_start_loc[seq], query_start_loc[seq + 1]
        ids = tables[seq, : cdiv(length, bs)].long()
        keys = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[:length].double().repeat_interleave(group, dim=1)
        values = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[:length].double().repeat_interleave(group, dim=1)
        positions = torch.arange(length - (end - start), length)[:, None]
        key_pos = torch.arange(length)[None, :]
        hidden = (key_pos > positions) | (key_pos <= positions - window)
        scores = torch.einsum("qhd,thd->hqt", query[start:end].double(), keys) * scale
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out[start:end] = torch.einsum("hqt,thd->qhd", probs, values)
    return out


def drop_outside_window(paged, q_lens: list[int], window: int) -> torch.Tensor:
    """The tables a hybrid cache hands the kernel: entries of blocks wholly before the first query's
    window point at the null block. Returns the original tables (what the reference reads)."""
    original = paged.block_tables.clone()
    bs = paged.block_size
    paged.key_cache[NULL_BLOCK] = float("nan")
    paged.value_cache[NULL_BLOCK] = float("nan")
    for seq, (length, q_len) in enumerate(zip(paged.lengths.tolist(), q_lens)):
        first = max(0, length - q_len - window + 1)  # the first position any query sees
        paged.block_tables[seq, : first // bs] = NULL_BLOCK
    return original


@st.composite
def cases(draw, *, max_len: int, max_seqs: int):
    bs = draw(st.sampled_from([1, 4, 8, 16, 32]))
    window = draw(st.one_of(st.integers(1, 40), st.sampled_from([bs, bs + 1, 2 * bs - 1, 64, 128])))
    lengths = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_seqs))
    return dict(block_size=bs, window=window, lengths=lengths, dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
                head_dim=draw(st.sampled_from([16, 64])), num_kv_heads=draw(st.integers(1, 2)),
                group=draw(st.sampled_from([1, 4])), seed=draw(st.integers(0, 2**31 - 1)))


def _paged(case, gen):
    # Block 0 is kept out of every table so it can stand for the null block.
    paged = build_paged(case["lengths"], block_size=case["block_size"], num_kv_heads=case["num_kv_heads"],
                        head_dim=case["head_dim"], dtype=case["dtype"], gen=gen, num_blocks=4096)
    bs = case["block_size"]
    for seq, n in enumerate(case["lengths"]):
        row = paged.block_tables[seq, : cdiv(n, bs)]
        if bool((row == NULL_BLOCK).any()):  # move its data to an unused block
            used = {int(b) for r in paged.block_tables for b in r if 0 <= int(b) < 4096}
            spare = next(b for b in range(1, 4096) if b not in used)
            paged.key_cache[spare] = paged.key_cache[NULL_BLOCK]
            paged.value_cache[spare] = paged.value_cache[NULL_BLOCK]
            row[row == NULL_BLOCK] = spare
    return paged


def _decode(case, backend):
    gen = torch.Generator().manual_seed(case["seed"])
    paged = _paged(case, gen)
    original = drop_outside_window(paged, [1] * len(case["lengths"]), case["window"])
    num_heads = case["num_kv_heads"] * case["group"]
    query = torch.randn(len(case["lengths"]), num_heads, case["head_dim"], generator=gen).to(case["dtype"])
    scale = 1 / math.sqrt(case["head_dim"])
    out = paged_decode_attention(query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, scale,
                                 backend=backend, window=case["window"])
    ref = windowed_reference(query, paged.key_cache, paged.value_cache, original, case["lengths"],
                             list(range(len(case["lengths"]) + 1)), scale, case["window"])
    assert_matches(out, ref, case["dtype"])


def _prefill(case, backend, q_fracs):
    gen = torch.Generator().manual_seed(case["seed"])
    paged = _paged(case, gen)
    q_lens = [max(1, int(n * f)) for n, f in zip(case["lengths"], q_fracs)]
    original = drop_outside_window(paged, q_lens, case["window"])
    num_heads = case["num_kv_heads"] * case["group"]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_heads, case["head_dim"], generator=gen).to(case["dtype"])
    scale = 1 / math.sqrt(case["head_dim"])
    out = paged_prefill_attention(query, paged.key_cache, paged.value_cache, paged.block_tables,
                                  torch.tensor(starts, dtype=torch.int32), paged.lengths, scale,
                                  backend=backend, window=case["window"])
    ref = windowed_reference(query, paged.key_cache, paged.value_cache, original, case["lengths"], starts, scale,
                             case["window"])
    assert_matches(out, ref, case["dtype"])


@settings(max_examples=scaled_examples(40), deadline=None)
@given(case=cases(max_len=300, max_seqs=5))
def test_windowed_decode_torch(case):
    _decode(case, "torch")


@settings(max_examples=scaled_examples(12), deadline=None)
@given(case=cases(max_len=150, max_seqs=3))
def test_windowed_decode_triton(case):
    _decode(case, "triton")


@settings(max_examples=scaled_examples(40), deadline=None)
@given(case=cases(max_len=300, max_seqs=4), q_fracs=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
def test_windowed_prefill_torch(case, q_fracs):
    _prefill(case, "torch", q_fracs)


@settings(max_examples=scaled_examples(10), deadline=None)
@given(case=cases(max_len=120, max_seqs=2), q_fracs=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2))
def test_windowed_prefill_triton(case, q_fracs):
    _prefill(case, "triton", q_fracs)


def test_a_window_longer_than_the_context_is_full_attention():
    gen = torch.Generator().manual_seed(3)
    paged = build_paged([37, 5], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, gen=gen)
    query = torch.randn(2, 2, 16, generator=gen)
    full = paged_decode_attention(query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, 0.25)
    wide = paged_decode_attention(query, paged.key_cache, paged.value_cache, paged.block_tables, paged.lengths, 0.25,
                                  window=1000)
    assert torch.equal(full, wide)


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_window_must_be_a_positive_int(window):
    gen = torch.Generator().manual_seed(0)
    paged = build_paged([5], block_size=4, num_kv_heads=1, head_dim=16, dtype=torch.float32, gen=gen)
    with pytest.raises(KernelArgumentError, match="window must be a positive int"):
        paged_decode_attention(torch.zeros(1, 1, 16), paged.key_cache, paged.value_cache, paged.block_tables,
                               paged.lengths, 0.25, window=window)
