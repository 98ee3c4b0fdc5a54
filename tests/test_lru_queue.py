"""The LRU policy's queue (a list read from a head index, with stale entries left by cache hits) gives exactly the order
of the obvious model, an ``OrderedDict`` of the blocks by release: any sequence of releases (one
or many at once), hits (removal from the middle), evictions (one or many), compactions and
cuts of the consumed front."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.policy.memory.eviction import LRUPolicy
from tests.conftest import scaled_examples

ops = st.lists(st.tuples(st.sampled_from(["add", "add_many", "remove", "pop", "pop_many"]),
                         st.lists(st.integers(0, 11), max_size=5), st.integers(0, 6)), max_size=80)


@settings(max_examples=scaled_examples(200), deadline=None)
@given(ops=ops, slack=st.sampled_from([0, 1, 3, 1024]), trim_at=st.sampled_from([0, 1, 5, 4096]))
def test_lru_queue_matches_an_ordered_dict(ops, slack, trim_at):
    lru = LRUPolicy(stats=None)
    lru.compact_slack = slack
    lru.trim_at = trim_at
    model: OrderedDict[int, None] = OrderedDict()
    for op, blocks, count in ops:
        if op in ("add", "add_many"):
            fresh = [b for b in dict.fromkeys(blocks) if b not in model]  # only blocks not queued join
            if op == "add":
                for b in fresh:
                    lru.add(b)
            else:
                lru.add_many(fresh)
            model.update(dict.fromkeys(fresh))
        elif op == "remove":
            for b in blocks:
                if b in model:
                    lru.remove(b)
                    del model[b]
        elif op == "pop":
            expected = model.popitem(last=False)[0] if model else None
            assert lru.pop() == expected
        else:
            expected = [model.popitem(last=False)[0] for _ in range(min(count, len(model)))]
            assert lru.pop_many(count) == expected
        assert len(lru) == len(model)
        assert all(b in lru for b in model) and not any(b in lru for b in range(12) if b not in model)
    assert lru.pop_many(len(model) + 1) == list(model)
