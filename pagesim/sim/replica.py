"""One serving replica as a SimPy process: the step loop around the shared scheduler.

Each iteration: ``schedule()``; condense the output into ``StepWork`` and ask the cost model how
long it takes; hold the step for that long (swaps over the replica's host link, a SimPy resource:
added to the step, as vLLM v0 did, or, with ``overlap_swaps``, run beside the compute so the
step takes the longer of the two); then ``update()`` the scheduler with the step's completions
(the simulator names no token ids; beam survivors come from the seeded ``BeamModel``). Requests
arriving during a step are seen by the next ``schedule()``. With nothing unfinished the replica
sleeps until ``submit`` wakes it.

With KV offloading (``pagesim.engine.policy.offload``) the same link carries the offload store's copies,
as vLLM 0.33's OffloadingConnector runs them. A step's **synchronous** loads are read by its
forward pass, so the step queues for the link and holds it for them before it computes (after
its swaps, when they are not overlapped); its **asynchronous** loads (vLLM's default: their
requests parked, ``SchedulerOutput.parked``) queue for the link when the step starts, behind the
step's own copies, and move while the replica goes on; its stores (``blocks_to_store``) are
written by the forward pass, so they queue for the link when the compute ends and hold it while
the replica goes on. Neither delays a step, except through the link a later copy waits for. The
link moves one copy at a time, whichever direction. The replica tells the scheduler a step's
loads or stores are done (``OffloadManager.complete``; the scheduler's
``complete_offload_in_update`` is off) at the first step boundary, before ``schedule()``, at or
after the link finished them; a step's synchronous loads, and the stores flushed by a preemption,
at the next boundary. A request's parked time runs from the start of the step that parked it to
the boundary its load is reported done (``RequestMetrics.offload_parked_s``). A step that
schedules nothing while copies are in flight (every unfinished request parked, or waiting for a
block being stored) is a wait, not a stall: after it the replica sleeps until the next copy ends,
an arrival or a client's deadline, rather than spin through empty steps as vLLM's busy loop does.

**Disaggregated prefill/decode** (``pagesim.sim.disagg``): a request may come with KV transfer
parameters (``submit``'s ``kv_transfer``). A decode replica hands each step's reads
(``SchedulerOutput.kv_receives``) to its ``kv_reader`` when the step starts (vLLM's worker starts
them then) and hears of each read's end (``kv_wait_ended``); the scheduler is told at the first
step boundary at or after it (``PdConnector.complete``). A prefill replica counts the sends it
holds blocks for likewise. Waiting for either is a wait, not a stall, and no step is skipped
ahead while a read of its own is in flight. A replica whose requests are handed over by another
(a decode replica) bounds its skips by ``arrival_bound()`` too: the earliest instant a handover
could come.

The scheduler is any object with the policy's interface (``Scheduler`` or the contiguous
baseline); it is never told it is simulated.

With a serving path (``pagesim.sim.serving_path``), the time outside the forward pass: its frontend
terms are added to each request's recorded times (first scheduling, first token, finish), the
engine's own clock (the step table, the timeline) staying as it was; with asynchronous scheduling a
request that reaches the engine while a step runs is held back and handed to the scheduler one step
later than it would be otherwise (``_release``), as vLLM V1's two-batch queue does.

**Client timeouts** (``request_timeout_s``; ``None``, the default: none). A client gives up on a
request still unfinished that many seconds after it sent it (inference-perf's
``request_timeout``; vLLM bench's aiohttp timeout, ``AIOHTTP_TIMEOUT``, six hours in
``vllm/benchmarks/lib/endpoint_request_func.py``, is not modelled). vLLM V1 (0.15 and 0.33 alike)
then aborts it: the API server's generator is cancelled and sends an abort to the engine core,
which applies it from its input queue before its next ``schedule()``
(``Scheduler.finish_requests(..., FINISHED_ABORTED)`` frees its blocks); nothing else is
disturbed. So at each step boundary, before ``schedule()``, the replica aborts every request
whose deadline (its arrival, or when a closed-loop client sent it, plus the timeout) is at or
before now (``_abort_due``); that step's decision record lists them. A request the step that was
running at its deadline finished is not aborted (there is nothing left to abort), but its client
had left: it has timed out all the same (``_completed``). A deadline is an event like an arrival:
a skip of pure decode steps ends before the earliest pending one (``_next_event_s``).

Invariant: a step that schedules, moves, rejects and preempts nothing while requests are unfinished is
a policy bug, not a wait: the replica raises rather than spin (``pagesim.engine.policy.scheduling.progress`` says
when). A step that only preempts (vLLM v0 does this when the last running request cannot grow)
costs the engine's per-step overhead and lets the next step admit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop, heappush

import numpy as np
import simpy

from pagesim.engine.policy import Request
from pagesim.engine.policy.fast_path.fast_forward import (DecodeRun, decode_batch, decode_step_usage, preempting_batch,
                                        queues_stay_refused, runs_prefills_alone, schedule_decode_step,
                                        takes_decode_steps, update_decode_step)
from pagesim.engine.policy.scheduling.scheduler import Scheduler
from pagesim.engine.policy.scheduling.output import dump_record
from pagesim.engine.policy.memory.usage import KvUsage
from pagesim.engine.policy.scheduling.progress import ProgressWatch
from pagesim.sim.cost.base import CostModel, StepWork
from pagesim.sim.decode_spans import DecodeSpanLog
from pagesim.sim.errors import SimulationStalled
from pagesim.sim.metrics import (COMPLETED, REJECTED, TIMED_OUT, OffloadTotals, RequestMetrics, StepMetrics,
                         timeout_reason)
from pagesim.sim.serving_path import ServingPath
from pagesim.sim.skip_ahead import decode_step_work, plan_skip, skip, timeout_until
from pagesim.sim.token_runs import TokenRuns
from pagesim.sim.workload import BeamModel


class Replica:
    def __init__(self, env: simpy.Environment, scheduler, cost_model: CostModel, *,
                 requests: RequestMetrics, steps: StepMetrics, beam_model: BeamModel,
                 overlap_swaps: bool = False, decision_sink: Callable[[str], object] | None = None,
                 on_done: Callable[[int], object] | None = None, skip_ahead: bool = True,
                 replica_index: int = 0, token_runs: TokenRuns | None = None,
                 on_request_done: Callable[[int], object] | None = None, request_timeout_s: float | None = None,
                 serving_path: ServingPath | None = None,
                 step_observer: Callable[[object, KvUsage], object] | None = None):
        self.env = env
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.link = simpy.Resource(env, capacity=1)  # the host (PCIe) link
        self.requests = requests
        self.steps = steps
        self.beam_model = beam_model
        self.overlap_swaps = overlap_swaps
        # NOTE: skip-ahead and the fast decode path (skip_ahead.py, fast_forward.py) carry the
        # offload store's state when it stores prompt blocks only (vLLM's default), since decodes
        # then store nothing; storing generated blocks too, every step goes through schedule().
        offload = getattr(scheduler, "offload", None)
        self.skip_ahead = (skip_ahead and isinstance(scheduler, Scheduler)
                           and (offload is None or offload.prompt_only))
        # a decode batch's step that cannot be skipped is a DecodeStep when it runs the batch's
        # decodes (vllm-v1: always; vllm-v0: unless it admits, when it runs the prefills alone), else
        # a schedule(); pure decode steps are skipped either way
        self._decode_steps = self.skip_ahead and takes_decode_steps(scheduler)
        if not skip_ahead and getattr(getattr(scheduler, "kv", None), "lazy_keys", False):
            scheduler.kv.lazy_keys = False  # the reference path: every block key made when due
        self.steps_skipped = 0
        self.skips_past_finish = 0  # skips that went on past a finish (_skip)
        # Whether anything reads this replica's state between its steps (a load-aware router): then
        # a skipped step must end before the next arrival, not merely start before it.
        self.observed = False
        self.decision_sink = decision_sink
        self.on_done = on_done or (lambda count: None)
        # a closed-loop client sends its next request when one completes or is rejected (pagesim/sim/client.py)
        self.on_request_done = on_request_done
        self.index = replica_index
        self.token_runs = token_runs or TokenRuns(len(requests.status))  # when each request got tokens (ITL)
        self.preemptions = {"swap": 0, "recompute": 0}
        self.link_busy_s = 0.0  # the host link's transfer time (swaps and offload copies)
        self.link_idle_s: float | None = None  # when its last transfer ended (None: none yet)
        self.offload_load_wait_s = 0.0  # steps' time queueing for and copying their synchronous loads
        # Offload copies on the link (module docstring): transfers not finished, and those finished
        # and not yet reported to the scheduler, each (step, kind): LOADS, STORES or, for a
        # step's synchronous loads and flushed stores, DONE_IN_STEP.
        self._offload = offload
        if offload is not None:
            scheduler.complete_offload_in_update = False  # (this replica times the copies)
        self._copies_in_flight = 0
        self._copies_done: list[tuple[int, int]] = []
        self._num_added = 0  # requests handed to the scheduler so far (a wait ends at an arrival)
        # Parked requests (KV loading): the ids parked after the latest schedule(), and per step
        # that parked some, (its start, the ids it parked), until its loads are reported done.
        self._parked: set[str] = set()
        self._parked_in: dict[int, tuple[float, list[str]]] = {}
        # Tokens computed again after recompute preemptions: at each resumption, the longest live
        # sequence's tokens (prompt + output so far) minus the prefix-cache hit. Exact for n = 1
        # without chunked prefill; a request preempted mid-prefill counts its whole prompt, an upper
        # bound (+0.4% on one chunked-prefill workload).
        self.recomputed_tokens = 0
        self._rows: dict[str, int] = {}  # unfinished request id -> trace row
        self._awaiting_first_token: set[str] = set()
        self._has_beams = False
        self._beam_choices = getattr(scheduler, "supports_beam_choices", True)
        self._wake: simpy.Event | None = None
        # Client timeouts (module docstring; None: none): the (deadline, row, request id) of every
        # request submitted here, a heap; an entry whose request has finished since is dropped
        # when it comes up.
        self.request_timeout_s = request_timeout_s
        self._deadlines: list[tuple[float, int, str]] | None = None if request_timeout_s is None else []
        # When the arrival process next submits (inf: never): a request arriving at the very
        # instant a step ends is seen by the next schedule(), whatever order SimPy queued them in.
        self.next_arrival_s = math.inf
        # Contiguous baselines have no block tables: their attention pays no per-block overhead.
        self._work_block_size = block_size_of(scheduler)
        # sliding-window layers see at most this many keys (StepWork's windowed counts), whether the
        # cache drops the blocks behind the window or not
        self._work_window = cost_model.attention_window
        self._decode_terms: dict = {}  # plan_skip's, for this replica's cost model
        # the skipped steps' rows, until self.steps writes them (pagesim/sim/decode_spans.py)
        self.span_log = DecodeSpanLog(scheduler.block_size) if self.skip_ahead else None
        # The serving path (pagesim/sim/serving_path.py): seconds the frontend adds to a request's clock
        # on its way in (``_in_offset_s``) and in and out (``_client_offset_s``), and, with
        # asynchronous scheduling, the requests held back: those that reached the engine while a
        # step ran, each (when, row, request) in arrival order, until a step boundary whose
        # previous step started at or after ``when`` (``_release``; ``_prev_start_s``).
        self.serving_path = serving_path
        self._async = serving_path is not None and serving_path.async_scheduling
        self._in_offset_s = serving_path.frontend_in_s if serving_path is not None else 0.0
        self._client_offset_s = serving_path.client_offset_s if serving_path is not None else 0.0
        self._held: deque[tuple[float, int, Request]] = deque()
        self._prev_start_s = -math.inf  # when the latest step started (a skipped stretch's last step)
        self._in_flight = False  # a step (or a skipped stretch) is running, or has just ended at this instant
        # Aborts asked from outside (``abort``: a client that went away), applied at the next boundary.
        self._aborts: list[tuple[int, str, str]] = []
        # Told each step's scheduler output and KV usage as it is scheduled (``pagesim.sim.serve``'s metrics).
        self.step_observer = step_observer
        # Disaggregated prefill/decode (module docstring): the reads' mover, the transfers this
        # replica waits on (reads in flight here, or sends it holds blocks for), the reads ended
        # since the last boundary, the parameters of requests submitted and not yet added, and the
        # earliest instant another replica could hand this one a request (None: arrivals only).
        self.kv_reader: Callable[[Replica, tuple], object] | None = None
        self._kv_waits = 0
        self._kv_read_done: list[str] = []
        self._kv_transfers: dict[str, object] = {}
        self.arrival_bound: Callable[[], float] | None = None
        self.tracks_step_end = False
        self.step_end_bound_s = -math.inf  # (tracks_step_end) the running step ends no earlier (its compute)
        self.process = env.process(self._run())

    # ------------------------------------------------------------- arrivals
    def submit(self, row: int, request: Request, kv_transfer: object = None) -> None:
        """Hand ``request`` (row ``row`` of the request table) to the scheduler. The replica
        owns it from here: once completed, its figures are in the table and its sequences are
        released (``request.seqs`` is emptied, see ``_completed``). ``kv_transfer``: its P/D
        role (``pagesim.engine.policy.disagg``), given to the scheduler with it."""
        if kv_transfer is not None:
            self._kv_transfers[request.request_id] = kv_transfer
        m = self.requests
        m.arrival_s[row] = request.arrival_time_s
        m.prompt_tokens[row] = request.prompt_len
        m.n[row] = request.n
        m.beam_width[row] = request.beam_width
        if self._in_flight and self._async:  # the batch that runs next was scheduled already (vLLM V1's queue)
            self._held.append((self.env.now, row, request))
            return
        self._add(row, request)

    def _add(self, row: int, request: Request) -> None:
        """Hand ``request`` to the scheduler now (its next ``schedule()`` sees it)."""
        m = self.requests
        m.release_step[row] = self.scheduler.next_step  # what an engine in lockstep needs to replay this run
        kv_transfer = self._kv_transfers.pop(request.request_id, None) if self._kv_transfers else None
        if not (self.scheduler.add_request(request) if kv_transfer is None
                else self.scheduler.add_request(request, kv_transfer)):
            m.status[row] = REJECTED
            m.reject_reasons[row] = request.reject_reason or ""
            self.on_done(1)
            if self.on_request_done is not None:
                self._client_done(row)
            return
        rid = request.request_id
        self._rows[rid] = row
        self._num_added += 1
        self._awaiting_first_token.add(rid)
        if self._deadlines is not None:
            assert self.request_timeout_s is not None  # (set together)
            heappush(self._deadlines, (request.arrival_time_s + self.request_timeout_s, row, rid))
        self._has_beams |= request.beam_width > 1 and self._beam_choices
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ------------------------------------------------------------ step loop
    def _run(self):
        env = self.env
        sched = self.scheduler
        block_size = self._work_block_size
        cost_model = self.cost_model
        m = self.requests
        rows = self._rows
        awaiting = self._awaiting_first_token
        log = sched.decision_log.records
        deadlines = self._deadlines  # (None without client timeouts: nothing more per step)
        progress = ProgressWatch()
        while True:
            if not sched.has_unfinished_requests and not self._held:
                self._in_flight = False
                self._wake = env.event()
                yield self._wake
                continue
            while self.next_arrival_s <= env.now:  # same-instant arrivals first
                yield env.timeout(0)
            self._in_flight = False
            if self._copies_done:  # (the link finished them since the last boundary)
                self._report_copies()
            if self._kv_read_done:  # (P/D reads ended since the last boundary: their requests may go)
                pd = sched.pd
                for rid in self._kv_read_done:
                    pd.complete(rid)
                self._kv_read_done = []
            if deadlines is not None and deadlines and deadlines[0][0] <= env.now:
                self._abort_due()  # (aborts and arrivals alike come from the engine core's input queue)
            if self._aborts:
                self._abort_asked()
            if self._held:
                self._release()
            if not sched.has_unfinished_requests:  # (the next schedule() lists the aborts, if one comes)
                    continue
            batch = None
            if self.skip_ahead:
                refused = queues_stay_refused(sched)
                # (without DecodeSteps, only a batch that could skip; none for a vllm-v0 step that admits)
                if refused or self._decode_steps and not runs_prefills_alone(sched):
                    batch = decode_batch(sched)
                    if batch is None and self._decode_steps and not self._has_beams:
                        batch = preempting_batch(sched)  # (a batch whose next step must preempt, if any)
                # (not while requests are held back from a replica others read at arrivals)
                # (nor while offload copies move: a skip would pass the boundary that reports them)
                if (batch is not None and refused and batch.max_steps and not (self._held and self.observed)
                        and not self._copies_in_flight and not self._kv_waits
                        and (yield from self._skip(batch))):
                    continue
            decode_step = None
            if batch is not None and self._decode_steps and not self._has_beams:  # decodes at once, the rest as usual
                decode_step = schedule_decode_step(batch)  # (None: a vllm-v0 step that admits)
            if decode_step is not None:
                out = decode_step.output
                work = decode_step_work(decode_step, block_size, self._work_window)
            else:
                out = sched.schedule()
                work = StepWork.from_output(out, block_size, self._work_window)
            rejected_rows = []
            for rid, reason in out.rejected.items():  # found unservable at the head of a queue, mid-run
                row = rows.pop(rid, None)
                if row is not None:
                    m.status[row] = REJECTED
                    m.reject_reasons[row] = reason
                    awaiting.discard(rid)
                    self.on_done(1)
                    rejected_rows.append(row)
            # (a step that schedules nothing while offload copies move waits for them: no stall)
            copying = bool(self._copies_in_flight or out.blocks_to_load or out.blocks_to_store or self._kv_waits
                           or out.kv_receives)
            if progress.stalled(out, decoded=decode_step is not None and bool(decode_step.run.seqs) or copying) \
                    and sched.has_unfinished_requests:
                raise SimulationStalled(  # (rejecting the last one is no stall)
                    f"step {out.step} at t={env.now:.6f}s scheduled nothing with {len(sched.waiting)} waiting, "
                    f"{len(sched.running)} running and {len(sched.swapped)} swapped requests"
                )
            # (the parked requests' blocks are in kv_usage(); a decode step is never taken beside them)
            usage = sched.kv_usage() if decode_step is None else decode_step_usage(decode_step)
            num_running, num_waiting = len(sched.running), len(sched.waiting)
            if self.step_observer is not None:
                self.step_observer(out, usage)
            cost = cost_model.step_cost(work)
            start = self._prev_start_s = env.now
            self._in_flight = True
            if self.tracks_step_end:  # (a prefill replica: its step's end bounds the next handover)
                self.step_end_bound_s = start + cost.compute_s
            if out.kv_receives:  # (P/D reads start with the step)
                assert self.kv_reader is not None, "a replica with a P/D connector needs a kv_reader"
                self.kv_reader(self, out.kv_receives)
            for rid in out.new:
                m.first_scheduled_s[rows[rid]] = start + self._in_offset_s
            for rid, mode in out.preempted:
                m.preemptions[rows[rid]] += 1
                self.preemptions[mode] += 1
            for rid, hit_tokens in out.resumed.items():
                live = sched.requests[rid].live_seqs
                self.recomputed_tokens += max(seq.num_tokens for seq in live) - hit_tokens
            if (out.parked or self._parked) and self._offload is not None:  # (offload loads; P/D reads: the cluster's)
                self._note_parked(out, start)
            num_added = self._num_added
            if out.blocks_to_load:
                num_sync, num_async = self._offload.step_loads(out.step)
                yield from self._execute(cost, num_sync, num_async, out.step)
                if num_sync:  # (done before the forward pass: reported at the next boundary)
                    self._copies_done.append((out.step, DONE_IN_STEP))
            elif not cost.swap_s <= 0:
                yield from self._execute(cost)
            else:  # (_execute's commonest case, without its generator)
                yield env.timeout(cost.total_s)
            end = env.now
            if out.blocks_to_store:  # written by the compute that just ended
                self._copy(out.step, STORES, len(out.blocks_to_store))
            if out.preempted and self._offload is not None:  # (their stores in flight are flushed)
                self._copies_done.append((out.step, DONE_IN_STEP))
            if not math.isfinite(end):
                raise ValueError(f"simulated time overflowed at step {out.step} (step cost {cost.terms})")
            step_row = len(self.steps)  # this step's row in the step table (recorded below)
            runs = self.token_runs
            for s in out.scheduled:
                if s.samples:
                    runs.token(self.index, rows[s.request_id], step_row)
                    if s.request_id in awaiting:
                        awaiting.discard(s.request_id)
                        m.first_token_s[rows[s.request_id]] = end + self._client_offset_s
            if decode_step is not None:  # the batch's decodes are not listed in out.scheduled
                if decode_step.preempted:  # (its victims got no token: they leave the followed batch first)
                    self._leave_batch(decode_step.preempted)
                self._decoded(decode_step.run, step_row, step_row)
                finished = update_decode_step(decode_step)
                if finished:  # (a full step's finishers got their tokens one by one: no batch is followed)
                    self._leave_batch(finished)
            else:
                choices = self.beam_model.choices(out, sched.requests) if self._has_beams else None
                finished = sched.update(out, None, choices)
            if finished:
                self._completed(finished, end)
            self.steps.record(out.step, start, end - start, len(out.num_scheduled_tokens), num_running, num_waiting,
                              work, usage, len(out.preempted), cost)
            if log:
                self._flush_decisions()
            if rejected_rows and self.on_request_done is not None:  # their client slots free now
                for row in rejected_rows:
                    self._client_done(row)
            if ((self._copies_in_flight or self._kv_waits) and not self._copies_done and not self._kv_read_done
                    and self._num_added == num_added
                    and not self._held and decode_step is None and not out.scheduled
                    and sched.has_unfinished_requests and not (out.preempted or out.rejected
                                                               or out.blocks_to_swap_in or out.blocks_to_swap_out)):
                yield from self._wait_for_copies()

    def _completed(self, finished: list[Request], end: float) -> None:
        m = self.requests
        done_rows = []
        timeout_s = self.request_timeout_s
        for request in finished:
            row = self._rows.pop(request.request_id)
            done_rows.append(row)
            m.finish_s[row] = finish_s = end + self._client_offset_s
            if timeout_s is not None and finish_s > request.arrival_time_s + timeout_s:  # (its client had left)
                m.status[row] = TIMED_OUT
                m.timeout_reasons[row] = timeout_reason(timeout_s)
            else:
                m.status[row] = COMPLETED
            lengths = [s.num_output_tokens for s in request.seqs if s.finish_reason != "pruned"]
            m.output_tokens[row] = sum(lengths)
            m.generation_len[row] = max(lengths)
            # Read for the last time: a request and its sequences point at each other
            # (``Sequence.request``), a cycle that only the cyclic collector would free, walking
            # every finished request's output and block lists to find it (about 3% of a long
            # run). Emptied, they are freed by reference counting as the caller lets go.
            request.seqs.clear()
        self.on_done(len(finished))
        if self.on_request_done is not None:
            for row in done_rows:
                self._client_done(row)

    def _skip(self, run: DecodeRun | None):
        """Run, at once, the pure decode steps of ``run`` before the next arrival (skip_ahead.py);
        returns whether it ran any (the loop then looks again, as after any step).

        A run lasts until its first finish. When that leaves the waiting and swapped queues empty
        (so nothing could be admitted or swapped in in its place), nobody waits for completions (a
        closed-loop client sends its next request then) and time is still before the next arrival,
        the next step would be another pure decode of the rest: the skip goes on with the new batch,
        and the replica yields to SimPy once, at the end of the last step."""
        sched = self.scheduler
        now = self.env.now
        ran = False
        completions = []  # (requests, end): reported once the clock is there (a client sends then)
        # (a client's deadline is an event like an arrival: no skipped step starts at or after it;
        # under asynchronous scheduling an arrival, or a request held back, bounds the steps one
        # step later: it joins the step after the one that starts next, plan_skip's lagged bound)
        deadline = math.inf if self._deadlines is None else self._next_event_s(arrivals=False)
        next_arrival = self.next_arrival_s if self.arrival_bound is None else min(self.next_arrival_s,
                                                                                   self.arrival_bound())
        if self._async and not self.observed:
            bound = deadline
            lagged = min(next_arrival, self._held[0][0]) if self._held else next_arrival
        else:
            bound, lagged = min(deadline, next_arrival), math.inf
        while run is not None:
            k, terms, ends = plan_skip(run, self.cost_model, self._work_block_size, now, bound,
                                       end_before_arrival=self.observed, decode_terms=self._decode_terms,
                                       lagged_s=lagged, prev_start_s=self._prev_start_s)
            if k == 0:
                break
            self._prev_start_s = ends[k - 2] if k >= 2 else now  # (the last skipped step's start)
            first_row = len(self.steps)
            self._decoded(run, first_row, first_row + k - 1)  # (before skip(): its finishes retire the requests)
            end, finished = skip(self, run, k, terms, ends, now)
            if not math.isfinite(end):
                raise ValueError(f"simulated time overflowed skipping {k} steps from t={now}")
            if finished:  # (now, before a later span goes on with the batch: _completed comes at the end)
                self._leave_batch(finished)
            self.steps_skipped += k
            ran = True
            now = end
            if finished:
                completions.append((finished, end))
            if (not finished or sched.waiting or sched.swapped or self.on_request_done is not None
                    or not now < bound or not self._prev_start_s < lagged
                    or (self._offload is not None and self._offload.has_work)):  # (the next step tells its policy)
                break
            run = decode_batch(sched)  # (None when nothing runs any more)
            self.skips_past_finish += run is not None
        if ran:
            self._in_flight = True
            if self.tracks_step_end:
                self.step_end_bound_s = now
            yield timeout_until(self.env, now)
            for finished, end in completions:
                self._completed(finished, end)
            self._flush_decisions()
        return ran

    def kv_wait_started(self) -> None:
        """A P/D transfer this replica waits on has begun (a read into it, or a send it holds)."""
        self._kv_waits += 1

    def kv_wait_ended(self, read_request_id: str | None = None) -> None:
        """One has ended (``read_request_id``: the request whose read into this replica ended; the
        scheduler hears at the next boundary); a replica waiting for it looks again."""
        self._kv_waits -= 1
        if read_request_id is not None:
            self._kv_read_done.append(read_request_id)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _client_done(self, row: int) -> None:
        """Tell the closed-loop client that request ``row`` is done, when its response reaches it:
        the frontend's in and out terms after the step's end (``pagesim.sim.serving_path``; at once
        without them), so that its next request is sent then."""
        done = self.on_request_done
        assert done is not None  # (asked only with a closed-loop client)
        if self._client_offset_s > 0:
            self.env.process(self._client_done_later(done, row))
        else:
            done(row)

    def _client_done_later(self, done: Callable[[int], object], row: int):
        yield self.env.timeout(self._client_offset_s)
        done(row)

    def _release(self) -> None:
        """At a step boundary, under asynchronous scheduling: hand the scheduler the held requests
        that reached the engine by the time the step that just ended started (vLLM scheduled the
        step starting now there, so they are the ones it saw); the rest wait for a later boundary,
        unless that leaves the scheduler nothing to do: the engine was idle, and schedules them
        at once."""
        held = self._held
        while held and held[0][0] <= self._prev_start_s:
            _, row, request = held.popleft()
            self._add(row, request)
        if not self.scheduler.has_unfinished_requests:
            while held:
                _, row, request = held.popleft()
                self._add(row, request)

    def _next_event_s(self, arrivals: bool = True) -> float:
        """When the step loop must next look (with client timeouts): the next arrival, or the
        earliest deadline of a request still unfinished here, whichever comes first (without
        ``arrivals``: the deadline alone, ``inf`` for none)."""
        deadlines = self._deadlines
        assert deadlines is not None  # (asked only with timeouts)
        rows = self._rows
        while deadlines and deadlines[0][2] not in rows:  # (finished since: nothing to abort)
            heappop(deadlines)
        nxt = self.next_arrival_s if arrivals else math.inf
        return min(nxt, deadlines[0][0]) if deadlines else nxt

    def abort(self, row: int, request_id: str, reason: str) -> None:
        """Abort request ``request_id`` (row ``row``) at the next step boundary, before
        ``schedule()``, as vLLM V1 applies an abort from the engine core's input queue (a client
        that disconnected: the API server cancels its generator and sends the abort). Its row then
        reads ``TIMED_OUT`` with ``reason``; a request finished by then is left as it ended. With
        the replica asleep (nothing unfinished) there is nothing to abort but a request held back
        under asynchronous scheduling, which is dropped at once."""
        for k, (_, held_row, request) in enumerate(self._held):
            if held_row == row and request.request_id == request_id:
                del self._held[k]
                self._abort_rows([(row, request, reason)], in_scheduler=False)
                return
        self._aborts.append((row, request_id, reason))
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _abort_asked(self) -> None:
        """Apply the aborts ``abort`` asked for (of requests still unfinished here)."""
        asked, self._aborts = self._aborts, []
        rows = self._rows
        due = [(row, self.scheduler.requests[rid], reason) for row, rid, reason in asked if rows.get(rid) == row]
        self._abort_rows(due)

    def _abort_due(self) -> None:
        """Abort every request here whose client has given up by now (its deadline at or before
        now), before the next ``schedule()`` (module docstring): its blocks are freed at once, the
        next decision record lists it, and its row says why, with the tokens it had generated.
        Requests that finished since are passed over (``_completed`` judged them)."""
        deadlines = self._deadlines
        timeout_s = self.request_timeout_s
        assert deadlines is not None and timeout_s is not None  # (asked only with timeouts)
        now = self.env.now
        rows = self._rows
        reason = timeout_reason(timeout_s)
        due = []
        while deadlines and deadlines[0][0] <= now:
            _, row, rid = heappop(deadlines)
            if rows.get(rid) != row:  # completed or rejected since (_completed judged it)
                continue
            due.append((row, self.scheduler.requests[rid], reason))
        self._abort_rows(due)

    def _abort_rows(self, due: list[tuple[int, Request, str]], in_scheduler: bool = True) -> None:
        """Abort each ``(row, request, reason)`` of ``due``: out of the scheduler (``in_scheduler``;
        else it never reached it), its row ``TIMED_OUT`` with the tokens it had generated."""
        if not due:
            return
        m = self.requests
        aborted: list[int] = []
        for row, request, reason in due:
            rid = request.request_id
            if in_scheduler:
                self.scheduler.abort_request(rid)  # (settles the fast path's lagging counters first)
                del self._rows[rid]
                self._awaiting_first_token.discard(rid)
            lengths = [s.num_output_tokens for s in request.seqs if s.finish_reason != "pruned"]
            m.status[row] = TIMED_OUT
            m.timeout_reasons[row] = reason
            m.output_tokens[row] = sum(lengths)
            m.generation_len[row] = max(lengths, default=0)
            request.seqs.clear()  # (as _completed: no cycle left for the cyclic collector)
            aborted.append(row)
        runs = self.token_runs
        if runs.followed(self.index) is not None:  # (they got their tokens through the batch's latest row)
            runs.leave(self.index, aborted)
        self.on_done(len(aborted))
        if self.on_request_done is not None:  # their client slots free now (a closed loop sends the next)
            for row in aborted:
                self._client_done(row)

    def _decoded(self, run: DecodeRun, first_row: int, last_row: int) -> None:
        """Every request of a decode batch received a token in each of steps ``first_row..last_row``.
        The token runs follow the batch (``TokenRuns.follow``): when it is the batch they follow,
        or the one carried from it (its completed requests have left, ``_leave_batch``), this is
        O(requests that joined); otherwise O(running), once."""
        runs = self.token_runs
        followed = runs.followed(self.index)
        if followed is not None:
            if run.requests is followed:
                if runs.go_on(self.index, followed, first_row, last_row):
                    return
            elif run.carried_from is followed:
                joined = self._rows_of(run.joined) if run.joined else ()
                if runs.go_on(self.index, run.requests, first_row, last_row, joined):
                    return
        runs.follow(self.index, run.requests, self._rows_of(run.requests), first_row, last_row)

    def _leave_batch(self, completed: list[Request]) -> None:
        """Requests the followed batch's last step completed leave it (before its next ``_decoded``)."""
        runs = self.token_runs
        if runs.followed(self.index) is not None:
            runs.leave(self.index, self._rows_of(completed))

    def _rows_of(self, requests: list[Request] | tuple) -> list[int]:
        """The request-table rows of these (unfinished) requests, in order."""
        rows = self._rows
        return [rows[r.request_id] for r in requests]

    def _flush_decisions(self) -> None:
        log = self.scheduler.decision_log.records
        if log:
            if self.decision_sink is not None:
                for record in log:
                    self.decision_sink(dump_record(record) + "\n")
            log.clear()

    def _execute(self, cost, num_sync_loads: int = 0, num_async_loads: int = 0, step: int = 0):
        """Hold the step: its swaps (unless overlapped) and synchronous loads, then its compute;
        its asynchronous loads queue for the link behind the step's own copies and move on
        their own (module docstring)."""
        env = self.env
        swap_s = cost.swap_s
        swap_first = swap_s > 0 and not self.overlap_swaps  # vLLM v0: the step waits for its swaps
        swap_request = self.link.request() if swap_first else None
        load_request = self.link.request() if num_sync_loads else None
        if num_async_loads:
            self._copy(step, LOADS, num_async_loads)
        if swap_request is not None:
            with swap_request:
                yield swap_request
                yield from self._hold_link(swap_s)
        if load_request is not None:  # the forward pass reads the loaded blocks
            waited_from = env.now
            seconds = self.cost_model.offload_seconds(num_sync_loads, self._work_block_size, to_gpu=True)
            with load_request:
                yield load_request
                yield from self._hold_link(seconds)
            self.offload_load_wait_s += env.now - waited_from
        if swap_s <= 0:
            yield env.timeout(cost.total_s)
        elif not self.overlap_swaps:
            yield env.timeout(cost.compute_s)
        else:  # swaps beside the compute: the step ends when both have
            transfer = env.process(self._transfer(swap_s))
            yield env.timeout(cost.compute_s) & transfer

    def _transfer(self, seconds: float):
        with self.link.request() as req:
            yield req
            yield from self._hold_link(seconds)

    def _copy(self, step: int, kind: int, num_blocks: int) -> None:
        """Queue for the link now, and copy ``num_blocks`` blocks of ``step``'s asynchronous loads
        (``kind`` LOADS) or stores (STORES) once it is free, while the replica goes on."""
        seconds = self.cost_model.offload_seconds(num_blocks, self._work_block_size, to_gpu=kind == LOADS)
        request = self.link.request()  # (now: ahead of any later step's copies)
        self._copies_in_flight += 1
        self.env.process(self._copied(request, seconds, step, kind))

    def _copied(self, request, seconds: float, step: int, kind: int):
        with request:
            yield request
            yield from self._hold_link(seconds)
        self._copies_in_flight -= 1
        self._copies_done.append((step, kind))
        if self._wake is not None and not self._wake.triggered:  # (a replica waiting for its copies)
            self._wake.succeed()

    def _report_copies(self) -> None:
        """At a step boundary: tell the scheduler the copies the link finished since the last one
        are done (in the order they finished); the requests their loads parked stop waiting."""
        offload = self._offload
        assert offload is not None  # (copies are an offload store's)
        now = self.env.now
        done, self._copies_done = self._copies_done, []
        for step, kind in done:
            offload.complete(step, loads=kind == LOADS, stores=kind == STORES)
            if kind == LOADS:
                parked = self._parked_in.pop(step, None)
                if parked is not None:
                    start, ids = parked
                    rows, waited = self._rows, self.requests.offload_parked_s
                    for rid in ids:
                        row = rows.get(rid)
                        if row is not None:  # (not aborted while parked)
                            waited[row] += now - start

    def _note_parked(self, out, start: float) -> None:
        """Note the requests ``out`` (a step starting at ``start``) parked (``_report_copies``
        ends their wait)."""
        parked = out.parked
        new = [rid for rid in parked if rid not in self._parked]
        if new:
            self._parked_in[out.step] = (start, new)
            rows, parks = self._rows, self.requests.offload_parks
            for rid in new:
                parks[rows[rid]] += 1
        self._parked = set(parked)

    def _wait_for_copies(self):
        """After a step that scheduled nothing while copies move: sleep until the next copy ends,
        a request arrives or a client's deadline comes (whichever first), not through empty steps."""
        env = self.env
        self._in_flight = False  # (idle: an arrival reaches the scheduler at once)
        self._wake = wake = env.event()
        until = self._next_event_s(arrivals=False) if self._deadlines is not None else math.inf
        if until <= env.now:
            return
        yield wake if math.isinf(until) else wake | env.timeout(until - env.now)

    def _hold_link(self, seconds: float):
        self.link_busy_s += seconds
        yield self.env.timeout(seconds)
        self.link_idle_s = self.env.now

    def offload_totals(self) -> OffloadTotals | None:
        """What this replica's offload tier did (``None``: offloading is off)."""
        sched = self.scheduler
        offload = getattr(sched, "offload", None)
        if offload is None:
            return None
        store = offload.store
        return OffloadTotals(
            num_blocks=store.num_blocks, admitted_tokens=sched.num_prompt_tokens_admitted,
            hit_tokens=sched.num_prefix_hit_tokens, offload_hit_tokens=sched.num_offload_hit_tokens,
            loaded_blocks=offload.num_loaded_blocks, stored_blocks=offload.num_stored_blocks,
            evictions=store.num_evictions, refused_blocks=store.num_refused_blocks, link_busy_s=self.link_busy_s,
            link_idle_s=self.link_idle_s, num_links=1, load_wait_s=self.offload_load_wait_s)


#: Kinds of offload copies a step issues (``Replica._copy``): asynchronous loads, stores, and
#: those done within the step (synchronous loads, stores flushed by a preemption).
LOADS, STORES, DONE_IN_STEP = 0, 1, 2


def block_size_of(scheduler) -> int | None:
    """The block size a step's work is costed at; ``None`` for a contiguous (block-less) cache."""
    return scheduler.block_size if getattr(scheduler, "paged", True) else None


def arrival_process(env: simpy.Environment, arrival_s: np.ndarray, make_request: Callable[[int], Request],
                    replicas: list[Replica], submit: Callable[[int, Request], None]):
    """Submit trace rows at their arrival times (``submit(row, request)``: to a replica, or through
    a router); rows sharing a time are submitted together, in row order. Before waiting for the
    next arrival it tells every replica when that is (``next_arrival_s``; ``inf`` after the last).
    The arrival column is read in chunks, never converted to one Python list."""
    times = iter_chunked(arrival_s)
    row = 0
    upcoming = next(times, None)
    while upcoming is not None:
        t = upcoming
        delay = t - env.now
        if delay > 0 and not math.isclose(t, env.now, rel_tol=0.0, abs_tol=1e-12):
            for replica in replicas:
                replica.next_arrival_s = t
            yield env.timeout(delay)
        submit(row, make_request(row))
        row += 1
        upcoming = next(times, None)
        while upcoming is not None and upcoming <= t:
            submit(row, make_request(row))
            row += 1
            upcoming = next(times, None)
    for replica in replicas:
        replica.next_arrival_s = math.inf


def iter_chunked(values: np.ndarray, chunk: int = 4096) -> Iterator[float]:
    """``values`` as Python floats, converted ``chunk`` at a time."""
    for start in range(0, len(values), chunk):
        yield from values[start:start + chunk].tolist()
