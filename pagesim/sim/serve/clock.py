"""The replica model run against the wall clock: HTTP arrivals in, each token out as its step ends.

``ServeEngine`` holds one SimPy environment with the same ``Replica`` processes ``simulate`` builds
(the same scheduler, cost model and serving path; the replica is never told time is real), and
runs it as a cooperative task on the server's asyncio loop: it sleeps until the wall-clock
instant of the next simulated event (``clock.wall_at``), processes every event due, and yields to
the loop so HTTP handlers run. One thread, so nothing is locked.

- **Arrivals.** ``submit`` stamps a request with the simulated now (the wall clock read through
  ``time_scale``) and puts a SimPy event at that instant whose callback routes the request and
  hands it to a replica (``Replica.submit``), so it enters the engine exactly as a trace row does.
- **Tokens.** The replica reports each sampled token as its step ends (its ``token_runs`` sink,
  ``_TokenSink`` here); they reach the request's stream at that instant plus the serving path's
  frontend terms (``ServingPath.client_offset_s``: the same offset ``simulate`` adds to its
  recorded first-token and finish times), one SimPy event per step. The finish reaches it through
  the replica's ``on_request_done``, which the replica delays by the same offset, after the
  step's tokens (SimPy keeps same-instant events in the order they were made).
- **Aborts.** ``abort`` asks the replica to abort at its next step boundary
  (``Replica.abort``), vLLM's path when a client disconnects: its blocks are freed and the
  decision log lists it.
- **Falling behind.** An event processed later than its wall-clock instant is late by the
  difference (``lag_s``, the ``pagesim:wall_clock_lag_seconds`` gauge); late by more than
  ``LATE_S`` (wall seconds, whatever the time scale) it is counted (``late_events``) and warned about, at most every ``WARN_EVERY_S``.
  Time is never re-based: a server that cannot keep up says so rather than drift.

Rows of the request table (``ServeTable``, a growable ``RequestMetrics``) are reused once a
request has finished and its figures are read, so memory follows the requests in flight, not
the requests served. Steps are counted, not kept (``_StepCount``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from pagesim.engine.policy import Request
from pagesim.sim.metrics import REJECTED, RequestMetrics
from pagesim.sim.replica import Replica
from pagesim.sim.step_metrics import StepMetrics
from pagesim.sim.token_runs import TokenRuns
from pagesim.sim.workload import BeamModel

log = logging.getLogger("uvicorn.error.pagesim")  # (uvicorn's handlers print it, as they print the server's)
DEAD = -1  # a request's status when the simulation died under it (``ServeEngine._died``)

LATE_S = 0.010  # an event processed this many wall seconds after its wall-clock instant is late
WARN_EVERY_S = 10.0  # the falling-behind warning at most this often
FIRST_ROWS = 1024  # the request table's first size (it doubles as needed)


class EngineDead(RuntimeError):
    """A request sent after the simulation stopped (``ServeEngine.dead`` says why)."""


class WallClock:
    """Simulated seconds against ``time.monotonic()``: ``time_scale`` wall seconds per simulated
    second (2: half speed; 0.5: twice as fast), counted from ``t0`` (``ServeEngine.run`` sets it)."""

    def __init__(self, time_scale: float = 1.0):
        if isinstance(time_scale, bool) or not 0 < time_scale < math.inf:
            raise ValueError(f"--time-scale must be a positive number of wall seconds per simulated second, "
                             f"got {time_scale!r}")
        self.time_scale = time_scale
        self.t0 = time.monotonic()

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) / self.time_scale

    def wall_at(self, sim_s: float) -> float:
        return self.t0 + sim_s * self.time_scale


class ServeTable(RequestMetrics):
    """The replica's request table with rows taken and given back: ``take`` a free row (the table
    doubles when none is), ``give_back`` it once its figures are read (its cells reset to a new
    ``RequestMetrics`` row's)."""

    def __init__(self, rows: int = FIRST_ROWS):
        super().__init__(rows)
        self._free = list(range(rows - 1, -1, -1))
        self._blank = RequestMetrics(1)  # (what a row holds before a request is written to it)

    def __len__(self) -> int:
        return len(self.status)

    def take(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def give_back(self, row: int) -> None:
        for name, value in vars(self._blank).items():
            if isinstance(value, np.ndarray):
                getattr(self, name)[row] = value[0]
        self.reject_reasons.pop(row, None)
        self.timeout_reasons.pop(row, None)
        self._free.append(row)

    def _grow(self) -> None:
        old = len(self)
        fresh = RequestMetrics(old)
        for name, value in vars(fresh).items():
            if isinstance(value, np.ndarray):
                setattr(self, name, np.concatenate([getattr(self, name), value]))
        self._free.extend(range(2 * old - 1, old - 1, -1))



class _StepCount(StepMetrics):
    """What a replica's step table is asked for while serving: a count of the steps (rows are not
    kept). A ``StepMetrics`` for the replica's declared types (checked as it runs when compiled)."""

    def __init__(self):  # (none of StepMetrics' stores: only record() and len() are asked for)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def record(self, *row) -> None:
        self.count += 1


@dataclass(eq=False)
class Served:
    """One request in the engine, as its HTTP handler follows it: each sample's target length
    and tokens so far; ``events`` receives ``(tag, "token", sample, count)`` per token (``count``:
    the sample's tokens with this one) and ``(tag, "done", status, reason)`` once (status:
    ``COMPLETED``, ``REJECTED``, ``TIMED_OUT`` or ``DEAD``)."""

    request_id: str
    row: int
    replica: int
    tag: int  # which of its HTTP request's prompts
    prompt_len: int
    max_tokens: int  # as asked (a sample shorter than this stopped at its EOS: finish reason "stop")
    lengths: tuple[int, ...]  # each sample's output length
    events: asyncio.Queue
    tokens: list[int] = field(default_factory=list)  # per sample, so far
    token_wall_s: float = math.nan  # when its latest token reached it (time.monotonic)
    finished: bool = False

    @property
    def stopped(self) -> bool:
        """Whether its first sample ended at an EOS rather than at ``max_tokens``."""
        return self.lengths[0] < self.max_tokens


class _TokenSink(TokenRuns):
    """The replica's ``token_runs``: every sampled token, batched per step and released to its
    stream ``offset_s`` later (module docstring). Skip-ahead is off while serving, so only
    ``token`` and the abort path's ``followed`` are asked for (a ``TokenRuns`` for the replica's
    declared types; none of its runs are kept)."""

    def __init__(self, engine: ServeEngine, offset_s: float):
        super().__init__(0)
        self.engine = engine
        self.offset_s = offset_s
        self._batch: list[int] = []

    def token(self, replica: int, row: int, step_row: int) -> None:
        batch = self._batch
        if not batch:  # (with no offset: at once, after the step's other callbacks of the same instant)
            self.engine.env.timeout(self.offset_s).callbacks.append(self._release)
        batch.append(row)

    def _release(self, event) -> None:
        batch, self._batch = self._batch, []
        self.engine.deliver_tokens(batch)

    def followed(self, replica: int) -> object:
        return None

    def leave(self, replica: int, rows) -> None:
        pass


class ServeEngine:
    """``builts`` (one per replica: ``pagesim.sim.cluster.build_replicas``) served against the
    wall clock (module docstring). ``router`` picks a replica per request when there are several and
    the request names none; ``observers`` (replica index -> a ``pagesim.sim.serve.metrics.ServeMetrics``)
    are told of their replicas' steps, tokens and finishes."""

    def __init__(self, builts: list, *, router=None, serving_path=None, seed: int = 0, time_scale: float = 1.0,
                 observers: dict | None = None, decision_sinks: list[Callable[[str], object]] | None = None):
        self.env = simpy.Environment()
        self.clock = WallClock(time_scale)
        self.table = ServeTable()
        self.router = router
        self.observers = observers or {}
        offset_s = serving_path.client_offset_s if serving_path is not None else 0.0
        sink = _TokenSink(self, offset_s)
        self.schedulers = [b.scheduler for b in builts]
        self.replicas = [
            Replica(self.env, b.scheduler, b.cost_model, requests=self.table, steps=_StepCount(),
                    beam_model=BeamModel(seed, replica=k), skip_ahead=False, replica_index=k, token_runs=sink,
                    on_request_done=self._done, serving_path=serving_path,
                    decision_sink=decision_sinks[k] if decision_sinks else None,
                    step_observer=(lambda out, usage, k=k: self._stepped(k, out, usage)) if k in self.observers else None)
            for k, b in enumerate(builts)
        ]
        self._served: dict[int, Served] = {}  # row -> request in the engine
        self._ids = itertools.count()
        self._wakeup = asyncio.Event()
        self.lag_s = 0.0  # how late the latest event was processed
        self.max_lag_s = 0.0
        self.late_events = 0
        self._warned_at = -math.inf
        self._stopping = False
        self.dead: str | None = None  # why the simulation stopped, once it has (``_died``)

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_ids: list[int], max_tokens: int, lengths: tuple[int, ...], events: asyncio.Queue, *,
               tag: int = 0, priority: int = 0, replica: int | None = None) -> Served:
        """Send a request of ``prompt_ids`` whose samples stop after ``lengths`` tokens each (at most
        ``max_tokens``) to ``replica`` (None: the router's choice); it enters the engine at the
        simulated now (module docstring)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        env = self.env
        row = self.table.take()
        rid = f"r{next(self._ids)}"  # (the policy's own id, unique whatever ids clients send)
        at_s = max(env.now, self.clock.sim_now())
        request = Request(request_id=rid, prompt_len=len(prompt_ids), max_tokens=max(lengths), arrival_time_s=at_s,
                          prompt_token_ids=prompt_ids, n=len(lengths),
                          sample_max_tokens=lengths if len(lengths) > 1 else None, priority=priority)
        k = replica if replica is not None else 0 if len(self.replicas) == 1 else self.router.route(request,
                                                                                                   self.schedulers)
        served = Served(rid, row, k, tag, len(prompt_ids), max_tokens, lengths, events, [0] * len(lengths))
        self._served[row] = served
        env.timeout(at_s - env.now).callbacks.append(lambda _: self.replicas[k].submit(row, request))
        self._wakeup.set()
        return served

    def abort(self, served: Served, reason: str = "aborted: the client disconnected") -> None:
        """Abort ``served`` (unfinished) at its replica's next step boundary."""
        if served.finished:
            return
        replica = self.replicas[served.replica]
        env = self.env
        # (an arrival not yet in the replica is dropped by its own callback's turn: abort after it)
        env.timeout(max(0.0, self.clock.sim_now() - env.now)).callbacks.append(
            lambda _: None if served.finished else replica.abort(served.row, served.request_id, reason))
        self._wakeup.set()

    def deliver_tokens(self, rows: list[int]) -> None:
        served_by_row = self._served
        now_wall = time.monotonic()
        for row in rows:
            served = served_by_row.get(row)
            if served is None or served.finished:
                continue
            counts, lengths = served.tokens, served.lengths
            observer = self.observers.get(served.replica)
            if observer is not None:
                observer.token(served, now_wall)
            served.token_wall_s = now_wall
            if not any(counts):  # the prefill's token: every sample's first (the samples fork after it)
                for sample in range(len(lengths)):
                    counts[sample] = 1
                    served.events.put_nowait((served.tag, "token", sample, 1))
                continue
            # the sample furthest behind that is still running (samples step together; a shorter one stops first)
            sample = min((i for i in range(len(lengths)) if counts[i] < lengths[i]), key=counts.__getitem__,
                         default=None)
            if sample is None:
                continue
            counts[sample] += 1
            served.events.put_nowait((served.tag, "token", sample, counts[sample]))

    def _done(self, row: int) -> None:
        served = self._served.pop(row, None)
        if served is None:
            return
        served.finished = True
        m = self.table
        status = int(m.status[row])
        reason = m.reject_reasons.get(row) if status == REJECTED else m.timeout_reasons.get(row)
        observer = self.observers.get(served.replica)
        if observer is not None:
            observer.finished(served, m, row, status, reason)
        self.table.give_back(row)
        served.events.put_nowait((served.tag, "done", status, reason))

    def _stepped(self, k: int, out, usage) -> None:
        self.observers[k].step(k, self.schedulers[k], out, usage)

    # ------------------------------------------------------------------ the clock
    async def run(self) -> None:
        """Process the simulation's events as the wall clock reaches them, until ``stop``."""
        env = self.env
        clock = self.clock
        clock.t0 = time.monotonic()  # (simulated time 0 is when the server starts serving)
        wakeup = self._wakeup
        while not self._stopping:
            t = env.peek()
            delay = math.inf if t == math.inf else clock.wall_at(t) - time.monotonic()
            if delay > 0:
                wakeup.clear()
                try:
                    await asyncio.wait_for(wakeup.wait(), None if delay == math.inf else delay)
                except TimeoutError:
                    pass
                continue
            self._note_lag(-delay)
            try:
                while env.peek() == t:  # every event of this instant, then the loop's turn
                    env.step()
            except Exception as exc:  # (a policy bug, a stalled scheduler: the engine is dead, as vLLM's can be)
                self._died(exc)
                return
            await asyncio.sleep(0)

    def _died(self, exc: Exception) -> None:
        """The simulation raised: say so once, fail every request in flight (``"error"``) and every
        later one (``dead``: the routes answer 500, ``/health`` 503, as vLLM's after ``EngineDeadError``)."""
        self.dead = f"{type(exc).__name__}: {exc}"
        log.error("pagesim serve: the simulated engine stopped (%s); every request now fails", self.dead,
                  exc_info=exc)
        for served in list(self._served.values()):
            served.finished = True
            served.events.put_nowait((served.tag, "done", DEAD, self.dead))
        self._served.clear()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()

    def _note_lag(self, lag_s: float) -> None:
        self.lag_s = lag_s
        if lag_s > self.max_lag_s:
            self.max_lag_s = lag_s
        if lag_s > LATE_S:
            self.late_events += 1
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning("pagesim serve is %.0f ms behind the wall clock (%d late events so far, the worst "
                            "%.0f ms): the simulation cannot keep up, so tokens reach clients later than the "
                            "simulated server sends them", lag_s * 1e3, self.late_events, self.max_lag_s * 1e3)

    # ------------------------------------------------------------------ state
    def in_flight(self, replica: int | None = None) -> int:
        """Requests sent and not finished (to ``replica``; None: to any)."""
        if replica is None:
            return len(self._served)
        return sum(1 for served in self._served.values() if served.replica == replica)

