"""``pagesim.engine.policy.fast_path.bulk_decode``'s bookkeeping: the buckets hold exactly the sequences that allocate
(and fill) a block in each step, in scheduling order, through joins and leaves; the bucket sizes
a span's idle slots follow from are the same read from the buckets as counted from the offsets,
and give each residue's count the way ``DecodeSpan.fill`` reads them.

The decisions themselves (pool calls, counters after settling) are checked against the
step-by-step path by ``tests/test_fast_path_state.py`` and ``tests/test_skip_ahead.py``."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.policy import Request
from pagesim.engine.policy.fast_path.bulk_decode import bucket_sizes, join, leave, make_buckets
from pagesim.engine.policy.scheduling.request import Sequence
from tests.conftest import pure_python_only, scaled_examples


def _seqs(n: int) -> list[Sequence]:
    return [Sequence(Request(f"r{i}", prompt_len=1, max_tokens=1), 0) for i in range(n)]


@pure_python_only("pagesim.engine.policy.fast_path.bulk_decode", "the test hands bucket_sizes a stand-in for a DecodeRun")
@settings(max_examples=scaled_examples(100), deadline=None)
@given(data=st.data())
def test_buckets_are_the_sequences_reaching_a_boundary(data):
    bs = data.draw(st.sampled_from([1, 2, 4, 16]))
    step = data.draw(st.integers(0, 5_000))
    n = data.draw(st.integers(0, 12))
    computed = data.draw(st.lists(st.integers(1, 2_000), min_size=n, max_size=n))
    seqs = _seqs(n + 3)
    offsets = [c - step for c in computed]
    buckets = make_buckets(seqs[:n], offsets, bs)
    members, member_offsets = list(seqs[:n]), list(offsets)
    # some leave, some join at the back (their computed tokens at the same step)
    for i in sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else [], reverse=True):
        leave(buckets, members[i], member_offsets[i], bs)
        del members[i], member_offsets[i]
    joined = [data.draw(st.integers(1, 2_000)) - step for _ in range(3)]
    join(buckets, seqs[n:], joined, bs)
    members += seqs[n:]
    member_offsets += joined
    for t in range(step, step + 2 * bs):  # every step allocates from its bucket, in scheduling order
        allocating = [seq for seq, o in zip(members, member_offsets) if (o + t) % bs == 0]
        assert [seq for seq, _ in buckets[t % bs]] == allocating
        filling = [seq for seq, o in zip(members, member_offsets) if (o + t + 1) % bs == 0]
        assert [seq for seq, _ in buckets[(t + 1) % bs]] == filling
    lazy = SimpleNamespace(step=step, buckets=buckets, offsets=member_offsets)
    eager = SimpleNamespace(step=step, buckets=None, offsets=member_offsets)
    sizes = bucket_sizes(lazy, bs)
    assert sizes == bucket_sizes(eager, bs) == [sum(1 for o in member_offsets if -o % bs == r) for r in range(bs)]
    for t in (step, step + 1, step + bs - 1):  # the residues of computed tokens at step t, as fill reads them
        assert [sizes[(t - m) % bs] for m in range(bs)] == [sum(1 for o in member_offsets if (o + t) % bs == m)
                                                            for m in range(bs)]


def _steps_within_blocks_by_brute_force(offsets: list[int], step: int, bs: int, free: int, horizon: int) -> int:
    """Step by step: the steps whose allocations, counted sequence by sequence, stay within ``free``."""
    taken = 0
    for j in range(1, horizon + 1):
        taken += sum(1 for o in offsets if (o + step + j - 1) % bs == 0)
        if taken > free:
            return j - 1
    return horizon


@settings(max_examples=scaled_examples(200), deadline=None)
@given(data=st.data())
def test_steps_within_blocks_counts_each_steps_allocations(data):
    """``fast_forward._steps_within_blocks`` (whole periods at once, then a bucket per step) is
    the most steps, up to the horizon, whose new blocks fit in the free ones: as counting every
    sequence in every step finds, read from the buckets or from the offsets."""
    from pagesim.engine.policy.fast_path.fast_forward import _steps_within_blocks

    bs = data.draw(st.sampled_from([1, 2, 3, 4, 16]))
    step = data.draw(st.integers(0, 5_000))
    n = data.draw(st.integers(1, 12))
    offsets = [c - step for c in data.draw(st.lists(st.integers(1, 2_000), min_size=n, max_size=n))]
    free = data.draw(st.integers(0, 4 * n * 5))
    horizon = data.draw(st.integers(1, 5 * bs + 3))
    expected = _steps_within_blocks_by_brute_force(offsets, step, bs, free, horizon)
    buckets = make_buckets(_seqs(n), offsets, bs)
    assert _steps_within_blocks(offsets, step, bs, free, horizon, buckets) == expected
    assert _steps_within_blocks(offsets, step, bs, free, horizon) == expected
