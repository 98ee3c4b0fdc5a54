"""When each request received its tokens, kept as runs of consecutive steps: inter-token latency.

vLLM bench's ITL is every gap between two consecutive tokens of a request. In the simulator a
token arrives at the end of a step, so a request that received tokens in steps ``t-1`` and ``t``
of its replica waited exactly step ``t``'s duration for the second (steps run back to back while
it is unfinished: step ``t`` starts when ``t-1`` ends). The gaps are therefore the step times a
request lived through, and a request's whole token history is a few **runs** of consecutive
step-table rows: one run from its first token to its last, plus one more after each time it
stopped receiving tokens (a preemption, a vLLM v0 prompt-only step, a step the token budget left
it out of). Between two runs the gap is the end of the later run's first step minus the end of
the earlier run's last step.

So per request two integers (the open run's first and latest row, shared by all replicas: a row
is served by one replica) and per interruption one closed run ``(request row, first, last)``
kept by its replica.

**A followed batch.** A replica's decode batch gets a token in every step while it runs, and
changes only when a request completes or joins. So the replica *follows* it (``follow``): its
members' runs go on implicitly through the batch's latest row, and a later stretch of ``k`` steps
(``go_on``) costs O(1) plus O(requests that joined), never O(steps x running) nor O(running); a
request that completes ``leave``s with its last row written. A member's own ``token``, any
``tokens`` call, ``runs`` and a copy first write every member's last row and stop following
(``release``).

From the runs and the step table, after the run (``itl_sample``):
- the ITL distribution as weighted values: step ``t``'s duration weighted by how many requests'
  runs cover ``t`` past their first row, plus each between-run gap once (exactly the multiset of
  every request's gaps; vLLM's percentiles over it are ``weighted_percentile``);
- token events per step (how many requests received a token at each step's end), for vLLM's
  ``max_output_tokens_per_s``;
- a request's own gaps, in order (``request_itls``), for the result file's ``itls``.

Invariants:
- every completed request with ``g`` tokens-receiving steps has ``g - 1`` gaps, and their sum is
  its last token time minus its first (so its mean ITL is its TPOT when one token arrives per
  step, as for ``n = 1``);
- a member of a replica's followed batch has its ``first`` written and received a token in every
  row from the start of its open run through the batch's latest row; its ``last`` may lag
  behind that until it leaves or the batch is released.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from mypy_extensions import mypyc_attr

NO_ROW = -1


# (``pagesim serve`` streams each token instead: its sink subclasses this one, pagesim/sim/serve/clock.py)
@mypyc_attr(allow_interpreted_subclasses=True)
class TokenRuns:
    """Runs of step-table rows in which each request received tokens (see the module docstring).

    ``first`` and ``last`` are per request row (shared by the replicas of a cluster);
    ``closed(replica)`` holds the runs that ended before the request's latest one, per replica.
    """

    def __init__(self, num_requests: int, num_replicas: int = 1):
        # int64 arrays that numpy reads as views (``first``/``last``, for ``runs``) and Python
        # indexes without numpy's per-scalar cost (``_first``/``_last``); never resized, so the
        # views stay valid.
        self._first = array("q", [NO_ROW]) * num_requests
        self._last = array("q", [NO_ROW]) * num_requests
        self.first = np.frombuffer(self._first, np.int64) if num_requests else np.empty(0, np.int64)
        self.last = np.frombuffer(self._last, np.int64) if num_requests else np.empty(0, np.int64)
        self._closed = [array("q") for _ in range(num_replicas)]  # flat (row, first, last) triples
        # Per replica, its followed batch (module docstring): the caller's key for it (None: none
        # followed), its members' rows and the latest row in which they all got a token.
        self._keys: list[object] = [None] * num_replicas
        self._members: list[set[int]] = [set() for _ in range(num_replicas)]
        self._through: list[int] = [NO_ROW] * num_replicas

    def __reduce__(self) -> tuple:
        # A copy holds no followed batch (its key is the caller's object, not ours to copy): every
        # member's last row is written first, which changes no run. (Explicit, not __getstate__:
        # compiled, the class is made only through __init__; pagesim/engine/compiled.py.)
        for replica in range(len(self._keys)):
            self.release(replica)
        return _restored, (self._first, self._last, self._closed, self._keys, self._members, self._through)

    def token(self, replica: int, row: int, step_row: int) -> None:
        """Request ``row`` received a token at the end of ``step_row`` (repeats in one step count once)."""
        if row in self._members[replica]:
            self.release(replica)
        last = self._last[row]
        if last == step_row:
            return
        if last == step_row - 1 and last != NO_ROW:
            self._last[row] = step_row
            return
        if last != NO_ROW:
            self._closed[replica].extend((row, self._first[row], last))
        self._first[row] = step_row
        self._last[row] = step_row

    def tokens(self, replica: int, rows: Iterable[int], first_row: int, last_row: int) -> None:
        """Each request in ``rows`` (distinct) received a token at the end of every step
        ``first_row..last_row``."""
        self.release(replica)
        self._extend(replica, rows.tolist() if isinstance(rows, np.ndarray) else rows, first_row, last_row)

    def _extend(self, replica: int, rows: Iterable[int], first_row: int, last_row: int) -> None:
        """``tokens`` for rows none of which is in a followed batch."""
        first, last, closed = self._first, self._last, self._closed[replica]
        before = first_row - 1
        for row in rows:
            latest = last[row]
            if latest < before or latest == NO_ROW:  # no token in the step before, or none yet: a new run
                if latest != NO_ROW:
                    closed.extend((row, first[row], latest))
                first[row] = first_row
            last[row] = last_row

    # ---------------------------------------------------------- a followed batch
    def followed(self, replica: int) -> object:
        """The key of the replica's followed batch (``follow``), or ``None``."""
        return self._keys[replica]

    def follow(self, replica: int, key: object, rows: list[int], first_row: int, last_row: int) -> None:
        """``tokens(replica, rows, first_row, last_row)``, then follow ``rows`` as the replica's
        batch, known by ``key`` (the caller's object, compared by identity)."""
        self.release(replica)
        self._extend(replica, rows, first_row, last_row)
        self._members[replica].update(rows)
        self._keys[replica] = key
        self._through[replica] = last_row

    def go_on(self, replica: int, key: object, first_row: int, last_row: int, joined: Iterable[int] = ()) -> bool:
        """The followed batch, with ``joined`` rows added to it, received a token in every step
        ``first_row..last_row`` (O(1) plus O(joined)); it is known by ``key`` from now on.
        Returns ``False``, having done nothing, when no batch is followed or ``first_row`` does
        not come right after its latest row (its runs would break: ``follow`` it afresh)."""
        if self._keys[replica] is None or first_row != self._through[replica] + 1:
            return False
        if joined:
            members = self._members[replica]
            fresh = [row for row in joined if row not in members]
            self._extend(replica, fresh, first_row, last_row)
            members.update(fresh)
        self._keys[replica] = key
        self._through[replica] = last_row
        return True

    def leave(self, replica: int, rows: Iterable[int]) -> None:
        """These rows' requests completed: those in the followed batch leave it, their last row
        the batch's latest (rows not in it are left as they are)."""
        members = self._members[replica]
        if members:
            last, through = self._last, self._through[replica]
            for row in rows:
                if row in members:
                    members.remove(row)
                    last[row] = through

    def release(self, replica: int) -> None:
        """Stop following the replica's batch, its members' last rows written."""
        members = self._members[replica]
        if members:
            last, through = self._last, self._through[replica]
            for row in members:
                last[row] = through
            members.clear()
        self._keys[replica] = None
        self._through[replica] = NO_ROW

    def runs(self, replica: int, request_rows: np.ndarray) -> np.ndarray:
        """All runs of the requests in ``request_rows`` served by ``replica``, as an ``[R, 3]`` array of
        ``(request row, first step row, last step row)`` sorted by request and time (the
        replica's followed batch is released first)."""
        self.release(replica)
        closed = np.frombuffer(self._closed[replica], dtype=np.int64).reshape(-1, 3) if self._closed[replica] \
            else np.empty((0, 3), np.int64)
        keep = np.zeros(len(self.first), bool)
        keep[request_rows] = True
        closed = closed[keep[closed[:, 0]]]
        open_rows = request_rows[self.last[request_rows] != NO_ROW]
        latest = np.column_stack((open_rows, self.first[open_rows], self.last[open_rows]))
        runs = np.concatenate((closed, latest))
        return runs[np.lexsort((runs[:, 1], runs[:, 0]))]


def _restored(first: array, last: array, closed: list[array], keys: list[object], members: list[set[int]],
              through: list[int]) -> TokenRuns:
    """A copy's or a pickle's ``TokenRuns``: its numpy views are views of its own arrays, not
    separate copies of the values."""
    runs = TokenRuns(0, 0)
    runs._first, runs._last, runs._closed = first, last, closed
    runs._keys, runs._members, runs._through = keys, members, through
    runs.first = np.frombuffer(first, np.int64) if len(first) else np.empty(0, np.int64)
    runs.last = np.frombuffer(last, np.int64) if len(last) else np.empty(0, np.int64)
    return runs


@dataclass(frozen=True)
class ItlSample:
    """Every inter-token gap of some requests, as distinct-ish values with weights (counts), and
    the number of token events at each step end (for the per-second token peak)."""

    values: np.ndarray  # float64 seconds
    weights: np.ndarray  # int64 counts, same length
    token_times: np.ndarray  # float64: step end times
    token_counts: np.ndarray  # int64: requests receiving a token at that time

    @staticmethod
    def merge(parts: list[ItlSample]) -> ItlSample:
        return ItlSample(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.empty(0)
                           for f in ("values", "weights", "token_times", "token_counts")))

    @property
    def count(self) -> int:
        return int(self.weights.sum())


def itl_sample(runs: np.ndarray, start_s: np.ndarray, duration_s: np.ndarray) -> ItlSample:
    """The gaps of ``runs`` (``TokenRuns.runs``) over a step table's ``start_s`` / ``duration_s``."""
    num_steps = len(duration_s)
    end_s = start_s + duration_s
    if len(runs) == 0 or num_steps == 0:
        empty_f, empty_i = np.empty(0), np.empty(0, np.int64)
        return ItlSample(empty_f, empty_i, empty_f, empty_i)
    req, a, b = runs[:, 0], runs[:, 1], runs[:, 2]
    # NOTE: step-length arrays are the memory peak of a long run (8M steps for 1M requests):
    # counts are int32 (at most one per request in flight) and each is dropped once used.
    # rows a+1..b of each run: one gap of that step's duration per run covering it
    inner = np.zeros(num_steps + 1, np.int32)
    np.add.at(inner, a + 1, 1)
    np.add.at(inner, b + 1, -1)
    np.cumsum(inner, out=inner)
    inner = inner[:-1]
    # between two runs of one request: end of the later run's first row - end of the earlier's last
    same = req[1:] == req[:-1]
    between = end_s[a[1:][same]] - end_s[b[:-1][same]]
    covered = inner > 0
    num_covered = int(np.count_nonzero(covered))
    values = np.empty(num_covered + len(between))  # (filled in place: no concatenated copies)
    np.compress(covered, duration_s, out=values[:num_covered])
    values[num_covered:] = between
    weights = np.ones(len(values), np.int64)
    weights[:num_covered] = inner[covered]
    del covered, between
    # rows a..b: a token event each
    events = inner
    np.add.at(events, a, 1)
    has_events = events > 0
    return ItlSample(values, weights, end_s[has_events], events[has_events].astype(np.int64))


def request_itls(runs: np.ndarray, start_s: np.ndarray, duration_s: np.ndarray) -> dict[int, list[float]]:
    """Each request's own gaps, in order (``runs`` sorted as ``TokenRuns.runs`` sorts them)."""
    end_s = start_s + duration_s
    gaps: dict[int, list[float]] = {}
    previous_row, previous_last = None, None
    for row, first, last in runs.tolist():
        mine = gaps.setdefault(row, [])
        if row == previous_row:
            mine.append(float(end_s[first] - end_s[previous_last]))
        mine.extend(duration_s[first + 1:last + 1].tolist())
        previous_row, previous_last = row, last
    return gaps
