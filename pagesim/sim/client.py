"""The benchmark client in front of the replicas: open loop, or closed loop with ``max_concurrency``.

Open loop (the default): every request is sent at its arrival time, whatever is in flight.

Closed loop (vLLM bench's ``--max-concurrency N``, with ``--request-rate`` as it combines them):
requests are still *due* at their arrival times (all at once for ``--request-rate inf``), but at
most N are in flight; a request due while N are outstanding waits, in arrival order, and is sent
the instant one finishes (completes or is rejected: vLLM bench releases its semaphore on either).
A request's arrival is when it is *sent* (a request that waited has ``Request.arrival_time_s`` set
to that instant; one sent at once keeps its trace time, which the SimPy clock may read an ulp
short of, so closed and open loops agree exactly when nothing waits): vLLM bench
starts its TTFT clock at the send, so the queueing inside the engine still counts in TTFT, the
client's own wait does not.

Invariant: never more than N requests are in flight (sent and not finished). Sends happen inside
the SimPy process that observed the finish, at that instant, so the replica's next ``schedule()``
sees the request just as it sees one arriving when a step ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from pagesim.engine.policy import Request


class ClosedLoopClient:
    def __init__(self, env: simpy.Environment, max_concurrency: int, submit: Callable[[int, Request], None]):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be a whole number >= 1, got {max_concurrency!r}")
        self.env = env
        self.max_concurrency = max_concurrency
        self._submit = submit
        self.in_flight = 0
        self._due: deque[tuple[int, Request]] = deque()

    def send(self, row: int, request: Request) -> None:
        """Request ``row`` is due now: sent at once if a slot is free, else when one frees."""
        if self.in_flight < self.max_concurrency:
            self._send(row, request)  # (its arrival stays the trace's: the clock may read an ulp short of it)
        else:
            self._due.append((row, request))

    def finished(self, row: int) -> None:
        """Request ``row`` completed or was rejected: its slot goes to the longest-due request."""
        self.in_flight -= 1
        if self.in_flight < 0:
            raise RuntimeError(f"request row {row} finished twice")
        if self._due:
            row, request = self._due.popleft()
            request.arrival_time_s = max(self.env.now, request.arrival_time_s)  # sent now, not when due
            self._send(row, request)

    def _send(self, row: int, request: Request) -> None:
        self.in_flight += 1
        self._submit(row, request)  # (a rejection there calls finished() before this returns)
