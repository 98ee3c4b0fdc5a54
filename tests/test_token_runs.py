"""``TokenRuns`` keeps, per request, the runs of consecutive step rows in which it got tokens:
checked against a plain model (every row each request got a token in) on generated call
sequences, including calls that pass the same rows array again (the fast path for a batch that
goes on, which must still notice a gap or a ``token`` call in between) and calls with a list of
rows (a small batch, done in Python), mixed with the others."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.token_runs import TokenRuns
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
