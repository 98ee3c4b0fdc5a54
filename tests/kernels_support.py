"""Test support for the kernels: paged caches with NaN everywhere unwritten, float64 references.

``build_paged`` lays sequences out in a cache the way the engine does: each sequence's blocks are
distinct random blocks (the highest block id always among them), only its first ``length`` token
slots hold data, and every other slot of the cache - unused blocks, the tail of a sequence's last
block, blocks a policy has freed - is NaN. Block-table entries past a sequence's blocks hold junk
ids (negative or past the cache), which a kernel must never follow. So a kernel that reads one slot
it should not returns NaN and fails the comparison.

The references gather K/V through the block table per sequence and compute attention in float64
with einsum: the definition the kernels are checked against, not another kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Elementwise |out - ref| <= ATOL + RTOL * |ref|, per dtype. float32 is exact arithmetic up to
# summation order. float16 / bfloat16 round the output to 11 / 8 significant bits: a unit in the
# last place is up to 2**-10 / 2**-7 relative, and the interpreter's conversion can be off by a
# whole unit (seen: 0.0153 at 2.03 in bfloat16, one unit); float16 probabilities are also rounded
# before the second matrix product. So about two units of the output's precision.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
# On a GPU the matrix units also take bfloat16 probabilities (8 bits): a few units more.
GPU_TOLERANCES = {**TOLERANCES, torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
# Largest cache the tests allocate per tensor; caches of 32,768+ blocks when blocks are this small.
BIG_CACHE_BYTES = 128 * 2**20
BIG_NUM_BLOCKS = 32_768


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_blocks_for(block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, needed: int) -> int:
    """32,768 blocks (index-overflow territory) when that fits ``BIG_CACHE_BYTES``, else fewer."""
    block_bytes = block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    if BIG_NUM_BLOCKS * block_bytes <= BIG_CACHE_BYTES:
        return BIG_NUM_BLOCKS
    return max(needed + 1, BIG_CACHE_BYTES // block_bytes)


@dataclass
class Paged:
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, width] int32
    lengths: torch.Tensor  # [num_seqs] int32

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]

    def slots(self, seq: int, start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        return self.block_tables[seq, pos // self.block_size].long() * self.block_size + pos % self.block_size


def build_paged(
    lengths: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    num_blocks: int | None = None,
    extra_width: int = 2,
) -> Paged:
    needed = [cdiv(n, block_size) for n in lengths]
    if num_blocks is None:
        num_blocks = num_blocks_for(block_size, num_kv_heads, head_dim, dtype, sum(needed))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    ids = torch.randperm(num_blocks, generator=gen)[: sum(needed)]  # distinct
    if len(ids) and not bool((ids == num_blocks - 1).any()):
        ids[torch.randint(len(ids), (1,), generator=gen)] = num_blocks - 1  # the highest id, still distinct
    width = max(needed, default=0) + extra_width
    junk = torch.randint(-4, 2 * num_blocks, (len(lengths), width), generator=gen)
    tables = torch.where((junk >= 0) & (junk < num_blocks), junk + 3 * num_blocks, junk).to(torch.int32)
    paged = Paged(key_cache, value_cache, tables, torch.tensor(lengths, dtype=torch.int32))
    offset = 0
    for seq, (length, n) in enumerate(zip(lengths, needed)):
        tables[seq, :n] = ids[offset : offset + n].to(torch.int32)
        offset += n
        slots = paged.slots(seq, 0, length)
        flat_shape = (-1, num_kv_heads, head_dim)
        key_cache.view(flat_shape)[slots] = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
        value_cache.view(flat_shape)[slots] = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
    return paged


def _gathered(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    block_size, num_kv_heads, head_dim = cache.shape[1:]
    ids = table_row[: cdiv(length, block_size)].long()
    return cache[ids].reshape(-1, num_kv_heads, head_dim)[:length].double()


def reference_attention(
    query: torch.Tensor, paged: Paged, query_start_loc: list[int], scale: float
) -> torch.Tensor:
    """float64 attention: sequence i's queries are its last q_len tokens, causal over all its tokens."""
    num_heads = query.shape[1]
    group = num_heads // paged.key_cache.shape[2]
    out = torch.empty(query.shape, dtype=torch.float64)
    for seq, length in enumerate(paged.lengths.tolist()):
        start, end = query_start_loc[seq], query_start_loc[seq + 1]
        if start == end:
            continue
        keys = _gathered(paged.key_cache, paged.block_tables[seq], length).repeat_interleave(group, dim=1)
        values = _gathered(paged.value_cache, paged.block_tables[seq], length).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,thd->hqt", query[start:end].double(), keys) * scale
        positions = torch.arange(length - (end - start), length)
        scores = scores.masked_fill(torch.arange(length)[None, :] > positions[:, None], float("-inf"))
        out[start:end] = torch.einsum("hqt,thd->qhd", torch.softmax(scores, dim=-1), values)
    return out


def reference_decode(query: torch.Tensor, paged: Paged, scale: float) -> torch.Tensor:
    return reference_attention(query, paged, list(range(query.shape[0] + 1)), scale)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, *, gpu: bool = False) -> None:
    """Within the dtype's tolerance everywhere, and no NaN (a read of an unwritten slot)."""
    assert out.dtype == dtype and out.shape == ref.shape
    if out.numel() == 0:
        return
    got = out.double()
    assert torch.isfinite(got).all(), "output holds NaN/inf: a kernel read a slot nothing wrote"
    atol, rtol = (GPU_TOLERANCES if gpu else TOLERANCES)[dtype]
    err = (got - ref).abs()
    bound = atol + rtol * ref.abs()
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"{dtype}: |out - ref| = {err.flatten()[worst]:.3g} at flat index {worst} "
        f"exceeds {atol} + {rtol} * |ref| (ref {ref.flatten()[worst]:.4g}); max error {err.max():.3g}"
    )
