"""``BlockPool.free_table`` with a table's layout (``(unique_from, num_keyed)``, which
``KVCacheManager.free`` gives for a settled sequence) leaves the pool exactly as without it, and a
layout that is not the table's is refused."""

from __future__ import annotations

import copy

import pytest

from pagesim.engine.policy.memory.block_key import BlockKey
from pagesim.engine.policy.memory.block_pool import LAZY_KEY, BlockPool


def _pool_with_table(keyed: int, shared: tuple[int, ...] = ()) -> tuple[BlockPool, list[int]]:
    """An ``lru`` pool whose free list and eviction order are not trivial, and a table of six
    blocks whose first ``keyed`` carry keys (real ones first, then lazy) and whose blocks at
    ``shared`` are held by a second table too."""
    pool = BlockPool(16, eviction_policy="lru")
    old = pool.allocate_many(4)
    pool.cache_block(old[0], BlockKey(None, ("old", 0)))
    pool.free_table(old)  # one cached block, three free ones at the front
    table = pool.allocate_many(6)
    for index, block_id in enumerate(table[:keyed]):
        if index < 2:
            pool.cache_block(block_id, BlockKey(None, ("t", index)))
        else:
            pool.cache_lazy([block_id])
    for index in shared:
        pool.incref(table[index])
    return pool, table


def _state(pool: BlockPool) -> tuple:
    return (list(pool.ref_counts), list(pool.keys), list(pool._free), pool.free_block_order(),
            pool.num_evictions, dict(pool.cache._blocks))


@pytest.mark.parametrize("keyed", [0, 1, 3, 5, 6])
@pytest.mark.parametrize("shared", [(), (0,), (1, 2)])
def test_a_layout_frees_as_reading_every_block_does(keyed, shared):
    pool, table = _pool_with_table(keyed, shared)
    reference = copy.deepcopy(pool)
    reference.free_table(list(table))
    unique_from = max(shared, default=-1) + 1
    pool.free_table(list(table), (unique_from, keyed))
    pool.check()
    assert _state(pool) == _state(reference)
    assert pool.keys[table[-1]] is (LAZY_KEY if keyed == 6 else None)


def test_a_layout_that_is_not_the_tables_is_refused(monkeypatch):
    monkeypatch.setattr(BlockPool, "check_layouts", True)
    pool, table = _pool_with_table(3, shared=(1,))
    with pytest.raises(AssertionError, match="should carry keys"):
        copy.deepcopy(pool).free_table(list(table), (2, 2))
    with pytest.raises(AssertionError, match="should carry keys"):
        copy.deepcopy(pool).free_table(list(table), (2, 4))
    with pytest.raises(AssertionError, match="alone"):
        copy.deepcopy(pool).free_table(list(table), (1, 3))
    # Outside the test suite only the boundary between keyed and unkeyed blocks is checked (on
    # the bulk path, which a table none of whose blocks is shared takes).
    monkeypatch.setattr(BlockPool, "check_layouts", False)
    pool, table = _pool_with_table(3)
    for wrong in (2, 4):
        with pytest.raises(AssertionError, match="not as its layout says"):
            copy.deepcopy(pool).free_table(list(table), (2, wrong))
