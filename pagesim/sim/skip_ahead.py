"""Skip-ahead in the simulator: time, cost and metrics of k pure decode steps at once.

The policy side (``pagesim.engine.policy.fast_path.fast_forward``) says when a replica's scheduler is decoding
steadily and how many steps it can stay so, and applies them. This module does what the
replica's step loop would have done for each of those steps: ask the cost model for their
durations (``plan_skip``), apply them and record their step metrics (``skip``). Its one caller
is ``Replica._skip``, which also goes on past a finish when nothing could take the finished
request's place. Everything is bit for bit what the step-by-step loop produces:

- step costs come from the cost model's own ``step_cost`` for the first step, and the only term
  that changes from step to step, decode attention (its context grows by one token per sequence),
  from ``CostModel.decode_attention_s`` (vectorized) or, if the model has none, ``step_cost`` per
  step; totals are summed term by term in the order ``StepCost.total_s`` sums them. For a model
  with ``decode_attention_fn``, the first step's other terms are those ``step_cost`` gave the
  replica's last skip of as many sequences (``plan_skip``'s ``decode_terms``). A skip of
  a few steps (``SHORT_SKIP``) is costed in Python floats instead, with the model's
  ``decode_attention_fn`` and the same operations in the same order (``_plan_short``): there
  numpy's cost per call is more than the arithmetic;
- step end times are the running sum ``now + d1 + d2 + ...`` taken left to right, as SimPy's
  clock adds each timeout (``np.add.accumulate`` is sequential, unlike ``np.sum``);
- a skipped step must *start* before the next arrival (``next_arrival_s``), as it would have
  started without seeing it; an arrival during a skipped step only joins the waiting queue and
  reads the step counter, which is already past that step either way. When something reads the
  replica's state at arrivals (a load-aware router), a skipped step must also *end* before it, so
  the reader finds the replica in the same state, mid-step, as without skipping;
- a model with sliding-window layers (``CostModel.attention_window``) also counts each step's
  windowed decode context, ``sum(min(c + j, window))``, which stops growing at the window
  (``window_contexts``), for its decode attention;
- KV usage per step is counted from the allocations and evictions ``advance`` reports (and, for
  a hybrid cache, the entries and blocks its windows dropped, every group's table counted), in
  the definitions of ``Scheduler.kv_usage``;
- a skipped stretch is recorded as one span of the replica's ``pagesim.sim.decode_spans.DecodeSpanLog``
  (its first step, its end times and cost terms, how many sequences have each residue of their
  computed tokens modulo the block size, the blocks allocated and evicted per step), whose rows
  ``StepMetrics`` writes later, many spans at once (``DecodeSpan.fill``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace
from typing import Any

import numpy as np
import simpy

from pagesim.engine.policy.fast_path.bulk_decode import bucket_sizes
from pagesim.engine.policy.fast_path.fast_forward import DecodeRun, DecodeStep, advance
from pagesim.sim.cost.base import CostModel, StepWork

#: At most this many steps are costed at once (bounds the arrays; a longer run continues next time).
MAX_CHUNK = 1 << 15


def decode_work(run: DecodeRun, block_size: int | None, window: int | None = None) -> StepWork:
    """The ``StepWork`` of the run's first step (``StepWork.from_output`` of a pure decode, with
    the model's sliding ``window``, if any)."""
    num_seqs = len(run.seqs)
    work = StepWork(num_seqs=num_seqs, num_tokens=num_seqs, num_decode_seqs=num_seqs,
                    decode_context_tokens=run.context_tokens + num_seqs, num_sampled=num_seqs,
                    block_size=block_size)
    if window is not None:
        work.decode_window_context_tokens = window_contexts(run.computed, window, 1)[0]
    return work


def decode_step_work(step: DecodeStep, block_size: int | None, window: int | None = None) -> StepWork:
    """The ``StepWork`` of a ``DecodeStep``: the batch's decodes plus what the waiting pass added
    (every field is a sum over sequences, so the two parts add up to ``StepWork.from_output`` of
    the whole step)."""
    added = StepWork.from_output(step.output, block_size, window)
    if not (added.num_seqs or added.num_swap_out_blocks or added.num_cow_blocks):  # (the decodes alone)
        return decode_work(step.run, block_size, window)
    n = len(step.run.seqs)  # the fields decode_work sets (its others are 0)
    # (``added`` is this call's own, not yet seen by anyone: completed in place, cheaper than replace())
    added.num_seqs += n
    added.num_tokens += n
    added.num_decode_seqs += n
    added.decode_context_tokens += step.run.context_tokens + n
    added.num_sampled += n
    if window is not None:
        added.decode_window_context_tokens += window_contexts(step.run.computed, window, 1)[0]
    return added


def window_contexts(computed: list[int], window: int, k: int) -> list[int]:
    """The windowed decode context (``StepWork.decode_window_context_tokens``) of each of ``k``
    decode steps of sequences at ``computed``: step ``j``'s is ``sum(min(c + j, window))``."""
    return list(itertools.islice(iter_window_contexts(computed, window), k))


def _first_window_context(computed: list[int], window: int):
    """(``iter_window_contexts`` past its first value, that value)."""
    windowed = iter_window_contexts(computed, window)
    return windowed, next(windowed)


def iter_window_contexts(computed: list[int], window: int):
    """``window_contexts`` of steps 1, 2, ... without end. Each sequence's term grows by one a
    step until it reaches the window, so each sum is the last plus the sequences still growing:
    running counts, exact in integers."""
    total = 0
    grows: list[int] = []  # per sequence below the window after step 1: how many more steps it grows
    for c in computed:
        if c + 1 < window:
            total += c + 1
            grows.append(window - c - 1)
        else:
            total += window
    yield total
    grows.sort()
    growing, g, j = len(grows), 0, 1
    while growing:
        while growing and grows[g] < j:  # (from step j to j + 1 grow those with at least j more steps)
            g += 1
            growing -= 1
        total += growing
        yield total
        j += 1
    while True:
        yield total


def step_terms(cost_model: CostModel, work: StepWork, k: int, first: dict[str, float] | None = None,
               windowed: list[int] | None = None) -> tuple[dict[str, np.ndarray | float], np.ndarray]:
    """Per-term costs and totals of ``k`` decode steps from ``work`` (step j's decode context is
    ``work.decode_context_tokens + j * work.num_decode_seqs``; ``windowed``, for a model with a
    sliding window, is each step's windowed decode context, at least ``k`` of them); ``first``
    is the first step's terms when the caller has them."""
    n = work.num_decode_seqs
    start = work.decode_context_tokens
    contexts = (np.arange(start, start + n * k, n, dtype=np.int64) if n
                else np.full(k, start, dtype=np.int64))  # start + n * j for j < k
    if first is None:
        first = cost_model.step_cost(work).terms
    if windowed is None:
        decode = cost_model.decode_attention_s(work, contexts)
    else:
        windowed = windowed[:k]
        decode = cost_model.decode_attention_s(work, contexts, np.array(windowed, dtype=np.int64))
    if decode is not None:
        terms: dict[str, np.ndarray | float] = dict(first)
        terms["decode_attention"] = decode
    else:
        later_windows = itertools.repeat(None) if windowed is None else windowed[1:]
        rows = [first] + [cost_model.step_cost(_with_context(work, int(c), w)).terms
                          for c, w in zip(contexts[1:], later_windows)]
        terms = {t: np.array([r[t] for r in rows]) for t in first}
    total: np.ndarray | float = 0
    for value in terms.values():  # StepCost.total_s: sum(terms.values()), left to right
        if not (value.__class__ is float and value == 0.0):  # (x + 0.0 is x: the sum never is -0.0)
            total = total + value
    if isinstance(total, np.ndarray):
        return terms, total
    return terms, np.full(k, total, dtype=np.float64)


def _with_context(work: StepWork, context: int, window_context: int | None) -> StepWork:
    if window_context is None:
        return replace(work, decode_context_tokens=context)
    return replace(work, decode_context_tokens=context, decode_window_context_tokens=window_context)


def plan_skip(run: DecodeRun, cost_model: CostModel, block_size: int | None, now: float,
              next_arrival_s: float, *, end_before_arrival: bool, decode_terms: dict | None = None,
              lagged_s: float = math.inf, prev_start_s: float = -math.inf) -> tuple[int, dict, np.ndarray | list[float]]:
    """``_plan_skip``, with a second bound one step later: ``lagged_s`` (asynchronous scheduling,
    ``pagesim.sim.serving_path``: a request reaching the engine then first runs in the step after the next
    one), which a step respects when the step before it started strictly before ``lagged_s``
    (``prev_start_s``: the start of the step before the first). Not with ``end_before_arrival``."""
    if lagged_s == math.inf:
        return _plan_skip(run, cost_model, block_size, now, next_arrival_s, end_before_arrival=end_before_arrival,
                          decode_terms=decode_terms)
    assert not end_before_arrival  # (a replica others read at arrivals gives no lagged bound)
    if not prev_start_s < lagged_s:
        return 0, {}, []
    if not now < lagged_s:  # only the first step: the one before it started in time
        bound = min(next_arrival_s, math.nextafter(now, math.inf))
        return _plan_skip(run, cost_model, block_size, now, bound, end_before_arrival=False, decode_terms=decode_terms)
    k, terms, ends = _plan_skip(run, cost_model, block_size, now, min(next_arrival_s, lagged_s),
                                end_before_arrival=False, decode_terms=decode_terms)
    if not lagged_s < next_arrival_s or k >= min(run.max_steps, MAX_CHUNK):
        return k, terms, ends
    start = ends[k - 1]  # (the next step's: the k-th started before lagged_s, so it qualifies if in time)
    if not start < next_arrival_s:
        return k, terms, ends
    return _plan_skip(run, cost_model, block_size, now, math.nextafter(start, math.inf), end_before_arrival=False,
                      decode_terms=decode_terms)


def _plan_skip(run: DecodeRun, cost_model: CostModel, block_size: int | None, now: float,
               next_arrival_s: float, *, end_before_arrival: bool,
               decode_terms: dict | None = None) -> tuple[int, dict, np.ndarray | list[float]]:
    """How many of the run's steps start (or end, with ``end_before_arrival``) strictly before
    ``next_arrival_s`` (the caller's ``now`` is before it), with their terms (a value for all,
    or an array or list of exactly those ``k`` steps') and end times (at least ``k``).
    With a cost model that has an ``attention_window``, each step's windowed decode context
    (which stops growing at the window) is counted too (``window_contexts``).

    ``decode_terms`` (the caller's, kept for one cost model and one block size) remembers, per
    number of sequences, a pure decode step's terms and its ``decode_attention_fn``: the model
    promises that no other term depends on the decode context, so a later step of as many
    sequences has those terms with ``decode_attention`` at its own context, and costs no
    ``step_cost`` call (models that record their calls, ``usage_snapshot``, are always asked)."""
    n = len(run.seqs)
    context = run.context_tokens + n  # the first step's decode context (decode_work's)
    window = cost_model.attention_window
    windowed, window_context = (None, 0) if window is None else _first_window_context(run.computed, window)
    usage = cost_model.usage_snapshot()  # costing steps not taken must not count as using them
    known = decode_terms.get(n) if decode_terms is not None and usage is None else None
    work = None
    if known is None:
        work = decode_work(run, block_size, window)
        model_terms = cost_model.step_cost(work).terms
        first_terms = dict(model_terms)  # (ours: _plan_short hands it back as the span's terms)
        decode = cost_model.decode_attention_fn(work) if usage is None else None
        around = None if decode is None else _around_decode(first_terms)
        if decode is not None and decode_terms is not None:
            decode_terms[n] = (model_terms, decode, around)
    else:
        first_terms, decode, around = known
        first_terms = dict(first_terms)
        first_terms["decode_attention"] = decode(context, window_context)
    first: float = sum(first_terms.values())  # StepCost.total_s
    limit = min(run.max_steps, MAX_CHUNK)
    if math.isfinite(next_arrival_s) and first > 0:
        guess = min(limit, int((next_arrival_s - now) / first) + 2)
    else:
        guess = limit
    if guess <= SHORT_SKIP and decode is not None:
        assert around is not None  # (made with decode)
        return _plan_short(n, context, first_terms, decode, around, now, next_arrival_s, limit, end_before_arrival,
                           windowed, window_context)
    if work is None:
        work = decode_work(run, block_size, window)
    contexts = None if windowed is None else [window_context]  # each step's windowed context, as needed
    while True:
        if contexts is not None and windowed is not None:  # (both or neither)
            contexts.extend(itertools.islice(windowed, guess - len(contexts)))
        terms, durations = step_terms(cost_model, work, guess, first_terms, contexts)
        durations[0] += now  # (in place: the array is step_terms' own) the running sum from now
        ends = np.add.accumulate(durations)
        if end_before_arrival:
            k = int(ends.searchsorted(next_arrival_s))  # ends < next arrival
        else:  # starts < next arrival: the first step, and each after an end before it
            k = min(guess, 1 + int(ends.searchsorted(next_arrival_s)))
        if k < guess or guess == limit:
            break
        guess = min(limit, guess * 2)
    if usage is not None:  # count exactly the k steps taken, as step by step would
        cost_model.restore_usage(usage)
        if k:
            terms, _ = step_terms(cost_model, work, k, None, contexts)
    elif k < guess:  # (a term given per step has exactly the k steps': skip records them as they are)
        terms = {t: v[:k] if isinstance(v, np.ndarray) else v for t, v in terms.items()}
    return k, terms, ends


_NO_TERMS = (0.0, 0.0, 0.0, 0.0)  # (_plan_short's unrolled sum: at most four terms after decode attention)

#: A skip expected to be at most this many steps is costed in Python floats (``_plan_short``):
#: below it, numpy's cost per call is more than the arithmetic. (On the Azure conversation
#: trace, where 5% of skips are longer than 48 steps, 128 takes a tenth off planning's time;
#: 256 gains nothing more.)
SHORT_SKIP = 128
#: The types of ``linear_in_context``'s (per token, bandwidth, overhead) that ``_plan_short`` writes out.
_LINEAR_TYPES = (int, float, float)


def _around_decode(terms: dict[str, float]) -> tuple[float, list[float]]:
    """A decode step's terms other than ``decode_attention``, as ``StepCost.total_s`` adds them:
    the sum of those before it, and the nonzero ones after it, in order."""
    before = 0.0  # the terms before decode_attention, summed as StepCost.total_s sums them (0.0 + x is x)
    after = []  # the nonzero terms after it, in order
    seen = False
    for name, value in terms.items():
        if name == "decode_attention":
            seen = True
        elif not (value.__class__ is float and value == 0.0):
            if seen:
                after.append(value)
            else:
                before = before + value
    return before, after


def _plan_short(n: int, context: int, first: dict[str, Any], decode, around: tuple[float, list[float]], now: float,
                next_arrival_s: float, limit: int, end_before_arrival: bool, windowed=None,
                window_context: int = 0) -> tuple[int, dict, list[float]]:
    """``plan_skip`` step by step in Python floats, for a model with ``decode_attention_fn``:
    the same operations in the same order as ``step_terms`` and ``np.add.accumulate``, one step
    at a time, stopping at the first step that does not qualify (at most ``limit``).
    ``first`` (the caller's own: it becomes the result's terms) are the first step's terms and
    ``around`` their ``_around_decode``; ``window_context`` is the first step's windowed decode
    context, ``windowed`` (an iterator) gives the next steps' (``iter_window_contexts``;
    ``None``: the model has no window). The per-step values are lists (``DecodeSpanLog`` takes
    them as they are)."""
    before, after = around
    attention: list[float] = []  # (n sequences; the first step's decode context is ``context``)
    ends: list[float] = []
    end = now
    if windowed is None and len(after) <= len(_NO_TERMS) and not end_before_arrival:
        # (the common case, unrolled: a term padded with +0.0 adds nothing, as x + 0.0 is x for
        # the nonnegative totals here)
        a1, a2, a3, a4 = (*after, *_NO_TERMS[len(after):])
        keep, reach = attention.append, ends.append
        # (a decode linear in the context has its operations written out: a call fewer a step;
        # typed, so that a compiled build does them in C doubles, as Python does them: an int
        # product, converted once, then two float operations; other types take the call)
        linear = getattr(decode, "linear_in_context", None) if context > 0 else None
        per_token: int = 0
        bw: float = 1.0
        overhead: float = 1.0
        if linear is not None and (linear[0].__class__, linear[1].__class__, linear[2].__class__) == _LINEAR_TYPES:
            per_token, bw, overhead = linear
        else:
            linear = None
        seconds: float
        for _ in range(limit):
            if linear is not None:
                seconds = context * per_token / bw * overhead
            else:
                seconds = decode(context, window_context)
            end = end + ((((before + seconds) + a1) + a2) + a3 + a4)
            keep(seconds)
            reach(end)
            if not end < next_arrival_s:  # (the next step would start at or after the arrival)
                break
            context += n
    else:
        while len(ends) < limit:
            seconds = decode(context, window_context)
            total = before + seconds
            for value in after:
                total = total + value
            end = end + total
            if end_before_arrival and not end < next_arrival_s:
                break
            attention.append(seconds)
            ends.append(end)
            if not end < next_arrival_s:  # (the next step would start at or after the arrival)
                break
            context += n
            if windowed is not None:
                window_context = next(windowed)
    first["decode_attention"] = attention
    return len(ends), first, ends


def skip(replica, run: DecodeRun, k: int, terms: dict, ends, start_s: float) -> tuple[float, list]:
    """Apply ``k`` steps of ``run``, the first starting at ``start_s``, to the scheduler and
    record their metrics (one span of the replica's ``DecodeSpanLog``); returns the end time and
    the requests the last step finished."""
    sched = replica.scheduler
    pool = sched.pool
    bs = sched.block_size
    sizes = bucket_sizes(run, bs)  # (before advance: the run's buckets change as it is carried)
    done = advance(run, k)
    num_requests = len(run.requests)
    replica.span_log.record(
        replica.steps, k, done.first_step, start_s, ends, terms, num_requests, len(sched.waiting), len(run.seqs),
        pool.num_usable_blocks * bs, run.used_blocks, run.cached_blocks, run.table_blocks, done.allocations,
        done.evictions, sizes, done.hybrid)
    return float(ends[k - 1]), done.finished


def timeout_until(env, when: float):
    """An event that fires at exactly ``when``, as the step-by-step clock would reach it.

    ``env.timeout(when - env.now)`` lands on ``env.now + (when - env.now)``, which is ``when``
    whenever the two are within a factor of two (Sterbenz), i.e. almost always; otherwise the
    event is queued at ``when`` itself, as ``Environment.schedule`` queues events (SimPy 4's
    ``(time, priority, id, event)`` heap entries)."""
    now = env.now
    delay = when - now
    if now + delay == when:
        return env.timeout(delay)
    if not when >= now:
        raise ValueError(f"cannot go back in time from t={now!r} to t={when!r}")
    event = simpy.Event(env)
    event._ok = True
    event._value = None
    heapq.heappush(env._queue, (when, simpy.core.NORMAL, next(env._eid), event))
    return event
