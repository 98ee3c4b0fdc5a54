"""``TokenRuns`` keeps, per request, the runs of consecutive step rows in which it got tokens:
checked against a plain model (every row each request got a token in) on generated call
sequences: ``tokens`` with arrays (the same one again, too) and lists, mixed with ``token``
calls; and a followed batch (``follow``, ``go_on``, ``leave``) mixed with both, which must
notice a gap or a member's own token in between."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.sim.token_runs import TokenRuns
from tests.conftest import scaled_examples

NUM_REQUESTS = 6


def runs_of(rows_got: dict[int, list[int]]) -> list[tuple[int, int, int]]:
    """(request, first, last) of each maximal run of consecutive rows, sorted."""
    out = []
    for request, got in rows_got.items():
        got = sorted(set(got))
        start = prev = got[0]
        for row in got[1:]:
            if row != prev + 1:
                out.append((request, start, prev))
                start = row
            prev = row
        out.append((request, start, prev))
    return sorted(out)


calls = st.lists(st.tuples(st.sampled_from(["batch", "same", "one", "list"]),
                           st.lists(st.integers(0, NUM_REQUESTS - 1), min_size=1, max_size=NUM_REQUESTS, unique=True),
                           st.integers(0, 2), st.integers(1, 3)), max_size=25)


@settings(max_examples=scaled_examples(200), deadline=None)
@given(calls=calls)
def test_runs_match_every_row_each_request_got(calls):
    runs = TokenRuns(NUM_REQUESTS)
    got: dict[int, list[int]] = {}
    row = 0
    latest = None
    for kind, members, gap, length in calls:
        row += gap  # steps in which nobody here got a token
        if kind == "one":
            request = members[0]
            runs.token(0, request, row)
            got.setdefault(request, []).append(row)
            row += 1
            continue
        if kind == "list":  # a few rows, done in Python
            rows = list(members)
        elif kind == "same" and latest is not None:
            rows = latest  # the very same array object again
        else:
            rows = latest = np.array(members, dtype=np.int64)
        runs.tokens(0, rows, row, row + length - 1)
        for request in list(rows):
            got.setdefault(request, []).extend(range(row, row + length))
        row += length
    if not got:
        return
    held = runs.runs(0, np.arange(NUM_REQUESTS))
    assert sorted(map(tuple, held.tolist())) == runs_of(got)


def test_the_same_rows_after_a_gap_start_new_runs():
    runs = TokenRuns(3)
    rows = np.array([0, 2], dtype=np.int64)
    runs.tokens(0, rows, 0, 3)
    runs.tokens(0, rows, 4, 5)  # goes on
    runs.tokens(0, rows, 8, 9)  # after a gap: new runs
    assert runs.runs(0, np.arange(3)).tolist() == [[0, 0, 5], [0, 8, 9], [2, 0, 5], [2, 8, 9]]


def test_a_copy_keeps_its_views_of_its_own_arrays():
    """``first``/``last`` are numpy views of the arrays the Python path writes: a copy must keep
    them so (a plain copy would leave the views on the original's values)."""
    import copy
    import pickle

    runs = TokenRuns(3)
    runs.tokens(0, [0, 1], 0, 2)
    for clone in (copy.deepcopy(runs), pickle.loads(pickle.dumps(runs))):
        clone.tokens(0, [0, 1], 3, 4)  # the Python path: goes on
        clone.tokens(0, [1, 2], 7, 7)  # after a gap for 1, new for 2
        assert clone.runs(0, np.arange(3)).tolist() == [[0, 0, 4], [1, 0, 4], [1, 7, 7], [2, 7, 7]]
    assert runs.runs(0, np.arange(3)).tolist() == [[0, 0, 2], [1, 0, 2]]  # the original is untouched


follow_calls = st.lists(st.tuples(st.sampled_from(["follow", "go_on", "go_on", "late", "leave", "leave", "one", "list"]),
                                  st.lists(st.integers(0, NUM_REQUESTS - 1), max_size=NUM_REQUESTS, unique=True),
                                  st.integers(0, 2), st.integers(1, 3)), max_size=30)


@settings(max_examples=scaled_examples(200), deadline=None)
@given(calls=follow_calls, replicas=st.integers(1, 2))
def test_a_followed_batch_has_the_runs_of_every_row_it_got(calls, replicas):
    """A followed batch (``follow``, then ``go_on`` with requests joining and ``leave`` as they
    complete), mixed with ``token`` calls (which may touch a member) and ``tokens`` calls, gives
    the runs of a model that writes every row each request got. ``go_on`` refuses (and changes
    nothing) exactly when no batch is followed or its rows do not come right after the batch's."""
    runs = TokenRuns(NUM_REQUESTS, replicas)
    replica = replicas - 1
    got: dict[int, list[int]] = {}
    members: set[int] | None = None  # the model's followed batch (None: none)
    through = None
    row = 0
    for kind, chosen, gap, length in calls:
        if kind == "go_on":  # right after the latest rows ("late": perhaps after a gap)
            gap = 0
        row += gap
        last_row = row + length - 1
        if kind == "one" and chosen:
            runs.token(replica, chosen[0], row)
            got.setdefault(chosen[0], []).append(row)
            if members is not None and chosen[0] in members:
                members = None  # (a member's own token releases the batch)
            row += 1
            continue
        if kind == "leave":
            if members is not None:  # (at least one member, when there is one)
                leaving = [r for r in chosen if r in members] or sorted(members)[:1]
                runs.leave(replica, leaving)
                members -= set(leaving)
            else:
                runs.leave(replica, chosen)  # (nothing followed: nothing to do)
            continue
        if kind in ("go_on", "late"):
            accepted = runs.go_on(replica, object(), row, last_row, chosen)
            assert accepted == (members is not None and row == through + 1)
            if not accepted:
                continue  # (nothing happened: rows are not taken)
            members |= set(chosen)
            batch = members
        elif kind == "follow":
            runs.follow(replica, object(), list(chosen), row, last_row)
            members = batch = set(chosen)
        else:  # "list": rows of their own (releases the followed batch)
            runs.tokens(replica, list(chosen), row, last_row)
            members, batch = None, set(chosen)
        through = last_row
        for request in batch:
            got.setdefault(request, []).extend(range(row, last_row + 1))
        row = last_row + 1
    assert runs.followed(replica) is None or members is not None
    held = runs.runs(replica, np.arange(NUM_REQUESTS))
    assert runs.followed(replica) is None  # (reading the runs released it)
    assert sorted(map(tuple, held.tolist())) == (runs_of(got) if got else [])


def test_a_copy_of_a_followed_batch_has_its_runs_written():
    """Copying writes the followed batch's last rows first (the copy follows nothing; its key was
    the caller's object) and the original goes on from there as from any released batch."""
    import copy

    runs = TokenRuns(3)
    key = object()
    runs.follow(0, key, [0, 1], 0, 0)
    assert runs.go_on(0, key, 1, 4)
    clone = copy.deepcopy(runs)
    assert clone.followed(0) is None and runs.followed(0) is None
    assert not runs.go_on(0, key, 5, 5)  # released: the caller follows it afresh
    runs.follow(0, key, [0, 1], 5, 5)
    for r in (clone, runs):
        assert r.runs(0, np.arange(3)).tolist()[:1] == [[0, 0, 4 if r is clone else 5]]


def test_a_request_that_joins_a_followed_batch_goes_on_with_it():
    """A request joins the batch right after its own first token (an admission step), goes on with
    the batch's later stretches, and leaves when it completes; one that joins after a gap starts
    a new run."""
    runs = TokenRuns(4)
    key = object()
    runs.follow(0, key, [0], 0, 2)
    runs.token(0, 1, 2)  # request 1's first token, in the batch's step 2
    runs.token(0, 2, 0)  # request 2 got one token long before
    assert runs.go_on(0, key, 3, 5, [1, 2])
    assert runs.go_on(0, key, 6, 9)
    runs.leave(0, [1])  # completed at row 9
    assert runs.go_on(0, key, 10, 10)
    assert runs.runs(0, np.arange(4)).tolist() == [[0, 0, 10], [1, 2, 9], [2, 0, 0], [2, 3, 10]]
