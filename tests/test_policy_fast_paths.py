"""The policy's hot-path shortcuts give what the general rules give.

Each fast path (a ``NOTE`` in the code) restates a general rule for its common case; these tests
compare the two directly, so a later change to one side shows up here rather than as a drifted
decision log.
"""

from __future__ import annotations

import random

import pytest

from pagesim.engine.policy.memory.block_key import ROOT_HASH, BlockKey, default_hash
from pagesim.engine.policy.memory.block_pool import BlockPool
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.memory.prefix_cache import PrefixCacheIndex
from pagesim.engine.policy.scheduling.request import Request


def general_content(request: Request, seq, start: int, end: int) -> tuple:
    """``Request.block_content``'s general rule, written out without the fast paths (for tokens
    that are known: a run of unnamed outputs is one segment, named ones are themselves)."""
    parts: list = []
    prompt_end = min(end, request.prompt_len)
    if start < prompt_end:
        parts.extend(request._identity_segments(start, prompt_end))
    if end > request.prompt_len:
        lo = max(start, request.prompt_len)
        run_start = None
        for pos, token in enumerate(seq.output_token_ids[lo - request.prompt_len:end - request.prompt_len], lo):
            if token is None:
                run_start = pos if run_start is None else run_start
                continue
            if run_start is not None:
                parts.append(("out", request.request_id, seq.index, run_start, pos))
                run_start = None
            parts.append(token)
        if run_start is not None:
            parts.append(("out", request.request_id, seq.index, run_start, end))
    return tuple(parts)


@pytest.mark.parametrize("prefix_ids", [None, (7, 8)])
def test_block_content_fast_paths_match_the_general_rule(prefix_ids):
    request = Request("r", prompt_len=37, max_tokens=40, prefix_block_ids=prefix_ids,
                      prefix_block_tokens=16 if prefix_ids else 0)
    seq = request.seqs[0]
    seq.output_token_ids = [None] * 20 + [5, None, 6] + [None] * 10
    for bs in (1, 4, 16, 24):
        for i in range((request.prompt_len + len(seq.output_token_ids)) // bs):
            start, end = i * bs, (i + 1) * bs
            assert request.block_content(seq, start, end) == general_content(request, seq, start, end), (bs, i)


def test_block_content_of_an_id_less_prompt_is_one_segment_unique_to_the_request():
    request = Request("r", prompt_len=40, max_tokens=8)
    seq = request.seqs[0]
    assert request.block_content(seq, 16, 32) == tuple(request._identity_segments(16, 32)) == (("prompt", "r", 16, 32),)
    seq.output_token_ids = [None] * 8
    assert request.block_content(seq, 32, 48) == (("prompt", "r", 32, 40), ("out", "r", 0, 40, 48))


def test_block_key_hash_is_default_hash_of_the_parent_hash_and_content():
    a = BlockKey(None, (1, 2))
    b = BlockKey(a, (3,))
    assert hash(a) == default_hash(ROOT_HASH, (1, 2))
    assert hash(b) == default_hash(hash(a), (3,))
    assert hash(BlockKey(a, (3,), hash_fn=lambda parent, content: 42)) == 42


def test_index_without_children_tracking_looks_up_like_the_tracked_one():
    rng = random.Random(0)
    tracked, untracked = PrefixCacheIndex(), PrefixCacheIndex(track_children=False)
    keys = [BlockKey(None, (0,))]
    for i in range(1, 40):
        keys.append(BlockKey(rng.choice(keys), (i % 5,)))
    held: list[tuple[BlockKey, int]] = []
    for block_id in range(300):
        if held and rng.random() < 0.45:
            key, b = held.pop(rng.randrange(len(held)))
            tracked.remove(key, b)
            assert untracked.remove(key, b) is None
        else:
            key = rng.choice(keys)
            tracked.insert(key, block_id)
            untracked.insert(key, block_id)
            held.append((key, block_id))
        for key in keys:
            assert tracked.lookup(key) == untracked.lookup(key)
            assert tracked.blocks_with(key) == untracked.blocks_with(key)
        assert len(tracked) == len(untracked)
    with pytest.raises(AssertionError):
        untracked.has_children(keys[0])


def test_pools_track_the_key_tree_only_for_policies_that_read_it():
    for name, cls in EVICTION_POLICIES.items():
        assert BlockPool(8, eviction_policy=name).cache.track_children is cls.uses_key_tree
    assert EVICTION_POLICIES["radix-leaf"].uses_key_tree


def test_a_subclass_makes_the_pools_shortcut_promises_only_by_stating_them():
    """``lru`` promises it reads no block stats; a plug-in subclass that orders by hit counts
    does not inherit that promise, so the pool keeps its counts."""
    from pagesim.engine.policy.memory.block_key import BlockKey
    from pagesim.engine.policy.memory.eviction import LRUPolicy

    class HitsFirst(LRUPolicy):  # keeps lru's queue, reads hit counts (a plug-in author's variant)
        name = "hits-first-test"

    assert not LRUPolicy.reads_block_stats and HitsFirst.reads_block_stats
    EVICTION_POLICIES[HitsFirst.name] = HitsFirst
    try:
        pool = BlockPool(8, eviction_policy=HitsFirst.name)
        block = pool.allocate()
        pool.cache_block(block, BlockKey(None, ("c",)))
        pool.free(block)
        pool.touch(block)
        pool.touch(block)
        assert pool.hit_count[block] == 2 and pool.release_tick[block] > 0
    finally:
        del EVICTION_POLICIES[HitsFirst.name]
