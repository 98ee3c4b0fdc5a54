"""Exact eviction orders, per policy, on hand-built cache states.

Each test builds the cache through the pool's own API (allocate, cache_block, touch, free_table),
then asserts the order in which allocations take blocks: first the plain free blocks (most
recently freed first), then the cached ones in the policy's order.
"""

from __future__ import annotations

import pytest

from pagesim.engine.policy.memory.block_key import BlockKey, chain_keys
from pagesim.engine.policy.memory.block_pool import BlockPool, NoFreeBlocksError


def cached_table(pool: BlockPool, keys: list[BlockKey]) -> list[int]:
    """Allocate one block per key and register it, like a request whose prompt filled them."""
    table = [pool.allocate() for _ in keys]
    for block_id, key in zip(table, keys):
        pool.cache_block(block_id, key)
    return table


def take_all(pool: BlockPool) -> list[int]:
    order = [pool.allocate() for _ in range(pool.num_free_blocks)]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate()
    return order


def test_unkeyed_blocks_are_a_lifo_stack_released_tail_first():
    pool = BlockPool(6)
    a = [pool.allocate() for _ in range(3)]  # 0, 1, 2
    b = [pool.allocate() for _ in range(2)]  # 3, 4
    assert (a, b) == ([0, 1, 2], [3, 4])
    pool.free_table(a)  # walk 2, 1, 0 -> front of the list as a group: 2, 1, 0
    pool.free(b[0])  # single free goes to the very front
    assert pool.free_block_order() == [3, 2, 1, 0, 5]
    assert take_all(pool) == [3, 2, 1, 0, 5]


def test_null_block_is_never_handed_out():
    pool = BlockPool(4, reserve_null_block=True)
    assert pool.num_free_blocks == 3
    assert take_all(pool) == [1, 2, 3]


def two_chains(policy: str) -> tuple[BlockPool, list[int], list[int]]:
    """Chain A (3 blocks) released first, then chain B (2 blocks); 3 plain blocks stay free."""
    pool = BlockPool(8, eviction_policy=policy)
    a = cached_table(pool, chain_keys([(1,), (2,), (3,)]))  # blocks 0, 1, 2
    b = cached_table(pool, chain_keys([(7,), (8,)]))  # blocks 3, 4
    pool.free_table(a)
    pool.free_table(b)
    return pool, a, b


def test_lru_is_vllm_v1_order_tail_before_prefix_least_recently_released_first():
    pool, a, b = two_chains("lru")
    # plain free blocks first (5, 6, 7 in id order), then A's tail..head, then B's tail..head
    assert pool.free_block_order() == [5, 6, 7, 2, 1, 0, 4, 3]
    assert take_all(pool) == [5, 6, 7, 2, 1, 0, 4, 3]
    assert len(pool.cache) == 0 and pool.num_evictions == 5


def test_a_hit_moves_a_block_out_of_the_queue_and_back_at_the_end():
    pool, a, b = two_chains("lru")
    key_a0 = chain_keys([(1,)])[0]
    assert pool.lookup(key_a0) == 0
    pool.touch(0)  # out of the middle of the eviction order, O(1)
    assert pool.free_block_order() == [5, 6, 7, 2, 1, 4, 3]
    pool.free(0)
    assert pool.free_block_order() == [5, 6, 7, 2, 1, 4, 3, 0]


def test_fifo_evicts_in_caching_order_whatever_the_release_order():
    pool = BlockPool(8, eviction_policy="fifo")
    a = cached_table(pool, chain_keys([(1,), (2,), (3,)]))
    b = cached_table(pool, chain_keys([(7,), (8,)]))
    pool.free_table(b)  # released first, but cached after A
    pool.free_table(a)
    assert take_all(pool) == [5, 6, 7, 0, 1, 2, 3, 4]


def test_lfu_evicts_fewest_hits_first_ties_by_release_order():
    pool, a, b = two_chains("lfu")  # release ticks: 2, 1, 0, 4, 3
    pool.touch(0)
    pool.free(0)  # block 0: 1 hit, released again (latest)
    for _ in range(2):
        pool.touch(3)
        pool.free(3)  # block 3: 2 hits
    assert take_all(pool) == [5, 6, 7, 2, 1, 4, 0, 3]


def test_radix_leaf_keeps_a_prefix_while_an_extension_is_cached():
    """Key A0 is carried by two blocks (0 and 5: two requests computed it before either
    registered it). A0 has two cached extensions: A1 (block 1) and Q1 (block 6)."""
    for policy, expected in (("lru", [7, 1, 0, 6, 5]), ("radix-leaf", [7, 1, 6, 0, 5])):
        pool = BlockPool(8, eviction_policy=policy)
        [p0, p1] = cached_table(pool, chain_keys([(1,), (2,)]))  # 0, 1
        [_, _, _] = [pool.allocate() for _ in range(3)]  # 2, 3, 4 stay in use
        q = chain_keys([(1,), (9,)])  # q[0] == A0, a different object
        [q0, q1] = cached_table(pool, q)  # 5, 6
        pool.free_table([p0, p1])  # releases 1, then 0
        pool.free_table([q0, q1])  # releases 6, then 5
        # LRU: 1, 0, 6, 5. radix-leaf: 0 still has the cached child Q1, so Q1 (6) goes first.
        assert take_all(pool) == expected, policy


def test_radix_leaf_falls_back_to_oldest_inner_block_rather_than_failing():
    pool = BlockPool(4, eviction_policy="radix-leaf")
    [p0] = cached_table(pool, chain_keys([(1,)]))  # block 0 carries A0
    q = chain_keys([(1,), (2,)])
    [q0, q1] = cached_table(pool, q)  # blocks 1 (A0 again), 2 (A1, child of A0), held
    pool.free(p0)  # block 0 is evictable but an inner node (A0 has the child A1, in use)
    assert pool.allocate() == 3
    assert pool.allocate() == 0  # the only free block: taken although it is not a leaf
    assert pool.lookup(q[0]) == q0 and pool.lookup(q[1]) == q1


def test_eviction_drops_the_key_so_the_block_is_no_longer_a_hit():
    pool = BlockPool(2)
    keys = chain_keys([(1,), (2,)])
    table = cached_table(pool, keys)
    pool.free_table(table)
    assert pool.lookup(keys[0]) == 0
    assert pool.allocate() == 1  # tail evicted first
    assert pool.lookup(keys[1]) is None and pool.lookup(keys[0]) == 0
    pool.check()


@pytest.mark.parametrize("policy", ["fifo", "lfu", "radix-leaf"])
def test_heap_policies_stay_correct_through_many_hits(policy):
    """Hits leave stale heap entries behind; past a bound the heap is compacted. Many hit cycles
    on one cached block must not change which blocks are evicted, or in what order."""
    pool = BlockPool(4, eviction_policy=policy)
    keys = chain_keys([(1,), (2,)])
    table = cached_table(pool, keys)
    [other] = cached_table(pool, chain_keys([(9,)]))
    pool.free_table(table)  # releases 1, then 0
    pool.free(other)  # 2
    for _ in range(500):  # hit block 2 again and again
        pool.touch(other)
        pool.free(other)
    assert len(pool.eviction._heap) < 200  # compacted, not 500 stale entries
    expected = {"fifo": [3, 0, 1, 2], "lfu": [3, 1, 0, 2], "radix-leaf": [3, 1, 0, 2]}[policy]
    assert pool.free_block_order() == expected
    assert take_all(pool) == expected
