"""What a swap costs on the engine: one step's swaps, copies and (validation mode) poisoning are a
fixed number of tensor operations per cache tensor, whatever the number of blocks (no loop over
blocks), so swapping costs what copying the blocks costs (issue 23, item 5). Counted operations,
not timings: the count does not depend on what else the machine runs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagesim.engine.runtime.kv_cache import PagedKVCache
from tests.engine_support import TINY

BLOCK_OPS = ("index_select", "index_copy", "index_fill", "index_put", "copy_", "fill_")


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _block_ops(fn) -> Counter[str]:
    with _CountOps() as counter:
        fn()
    return Counter({op: n for op, n in counter.ops.items() if op.startswith(BLOCK_OPS)})


def _cache() -> PagedKVCache:
    cache = PagedKVCache(TINY, num_gpu_blocks=48, num_cpu_blocks=48, block_size=8, dtype=torch.float64,
                         device="cpu", poison=True)
    for t in cache.slot_key_caches + cache.slot_value_caches:
        t.copy_(torch.randn(t.shape, dtype=t.dtype, generator=torch.Generator().manual_seed(t.numel())))
    return cache


@pytest.mark.parametrize("move", ["swap_out", "swap_in", "copy", "poison_gpu", "poison_cpu"])
def test_a_steps_block_moves_are_one_op_per_cache_tensor(move):
    cache = _cache()
    tensors = len(cache.slot_key_caches) + len(cache.slot_value_caches)

    def run(k: int) -> Counter[str]:
        pairs = [(i, 47 - i) for i in range(k)]  # disjoint sources and destinations
        arg = [b for b, _ in pairs] if move.startswith("poison") else pairs
        return _block_ops(lambda: getattr(cache, move)(arg))

    one, many = run(1), run(16)
    assert one == many, f"{move}: tensor ops grow with the block count: {dict(one)} for 1 block, {dict(many)} for 16"
    assert 0 < sum(many.values()) <= 3 * tensors, dict(many)


def test_swapped_blocks_survive_the_round_trip_and_released_ones_read_nan():
    cache = _cache()
    blocks = [3, 17, 40]
    want = [t[blocks].clone() for t in cache.slot_key_caches + cache.slot_value_caches]
    cache.swap_out([(b, c) for b, c in zip(blocks, [0, 5, 47])])
    cache.poison_gpu(blocks)  # the policy released them on swap-out
    assert all(torch.isnan(t[blocks]).all() for t in cache.slot_key_caches + cache.slot_value_caches)
    cache.swap_in([(c, b) for c, b in zip([0, 5, 47], [9, 1, 30])])
    cache.poison_cpu([0, 5, 47])
    for got, exp in zip(cache.slot_key_caches + cache.slot_value_caches, want):
        assert torch.equal(got[[9, 1, 30]], exp)
    assert all(torch.isnan(t[[0, 5, 47]]).all() for t in cache.cpu_key_caches + cache.cpu_value_caches)
