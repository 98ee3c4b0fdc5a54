"""Skip-ahead in the simulator: time, cost and metrics of k pure decode steps at once.

The policy side (``engine.policy.fast_forward``) says when a replica's scheduler is decoding
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
- a skipped stretch is recorded as one ``DecodeSpan`` (its first step, its end times and cost
  terms, how many sequences have each residue of their computed tokens modulo the block size,
  the blocks allocated and evicted per step), whose rows ``StepMetrics`` writes later, many spans
  at once (``DecodeSpan.fill``).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from dataclasses import dataclass, replace

import numpy as np
import simpy

from engine.policy.bulk_decode import bucket_sizes
from engine.policy.fast_forward import DecodeRun, DecodeStep, advance
from sim.cost.base import TERMS, CostModel, StepWork
from sim.step_metrics import COLUMN_INDEX, NUM_COLUMNS

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
    if not added.num_seqs:  # (the waiting pass added nothing: the decodes alone)
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
              next_arrival_s: float, *, end_before_arrival: bool,
              decode_terms: dict | None = None) -> tuple[int, dict, np.ndarray]:
    """How many of the run's steps start (or end, with ``end_before_arrival``) strictly before
    ``next_arrival_s`` (the caller's ``now`` is before it), with their terms (a value for all,
    or an array of exactly those ``k`` steps') and end times (at least ``k``).
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
        first_terms = cost_model.step_cost(work).terms
        decode = cost_model.decode_attention_fn(work) if usage is None else None
        if decode is not None and decode_terms is not None:
            decode_terms[n] = (first_terms, decode)
    else:
        first_terms, decode = known
        first_terms = dict(first_terms)
        first_terms["decode_attention"] = decode(context, window_context)
    first = sum(first_terms.values())  # StepCost.total_s
    limit = min(run.max_steps, MAX_CHUNK)
    if math.isfinite(next_arrival_s) and first > 0:
        guess = min(limit, int((next_arrival_s - now) / first) + 2)
    else:
        guess = limit
    if guess <= SHORT_SKIP and decode is not None:
        return _plan_short(n, context, first_terms, decode, now, next_arrival_s, limit, end_before_arrival, windowed,
                           window_context)
    if work is None:
        work = decode_work(run, block_size, window)
    contexts = None if windowed is None else [window_context]  # each step's windowed context, as needed
    while True:
        if contexts is not None:
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
#: below it, numpy's cost per call is more than the arithmetic.
SHORT_SKIP = 48


def _plan_short(n: int, context: int, first: dict[str, float], decode, now: float, next_arrival_s: float,
                limit: int, end_before_arrival: bool, windowed=None,
                window_context: int = 0) -> tuple[int, dict, np.ndarray]:
    """``plan_skip`` step by step in Python floats, for a model with ``decode_attention_fn``:
    the same operations in the same order as ``step_terms`` and ``np.add.accumulate``, one step
    at a time, stopping at the first step that does not qualify (at most ``limit``).
    ``window_context`` is the first step's windowed decode context, ``windowed`` (an iterator)
    gives the next steps' (``iter_window_contexts``; ``None``: the model has no window)."""
    before = 0  # the terms before decode_attention, summed as StepCost.total_s sums them
    after = []  # the nonzero terms after it, in order
    seen = False
    for name, value in first.items():
        if name == "decode_attention":
            seen = True
        elif not (value.__class__ is float and value == 0.0):
            if seen:
                after.append(value)
            else:
                before = before + value
    attention: list[float] = []  # (n sequences; the first step's decode context is ``context``)
    ends: list[float] = []
    end = now
    if windowed is None and len(after) <= len(_NO_TERMS) and not end_before_arrival:
        # (the common case, unrolled: a term padded with +0.0 adds nothing, as x + 0.0 is x for
        # the nonnegative totals here)
        a1, a2, a3, a4 = (*after, *_NO_TERMS[len(after):])
        keep, reach = attention.append, ends.append
        for _ in range(limit):
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
    terms: dict[str, np.ndarray | float] = dict(first)
    terms["decode_attention"] = np.array(attention, dtype=np.float64)
    return len(ends), terms, np.array(ends, dtype=np.float64)


def skip(replica, run: DecodeRun, k: int, terms: dict, ends: np.ndarray, start_s: float) -> tuple[float, list]:
    """Apply ``k`` steps of ``run``, the first starting at ``start_s``, to the scheduler and
    record their metrics (one ``DecodeSpan``); returns the end time and the requests the last
    step finished."""
    sched = replica.scheduler
    pool = sched.pool
    bs = sched.block_size
    sizes = bucket_sizes(run, bs)  # (before advance: the run's buckets change as it is carried)
    done = advance(run, k)
    num_requests = len(run.requests)
    replica.steps.record_deferred(DecodeSpan(
        k, done.first_step, start_s, ends[:k], tuple(map(terms.get, TERMS, _ZEROS)),
        (num_requests, num_requests, len(sched.waiting), len(run.seqs), pool.num_usable_blocks * bs),
        run.used_blocks, run.cached_blocks, run.table_blocks, done.allocations, done.evictions, bs, sizes,
        done.hybrid))
    return float(ends[k - 1]), done.finished


_ZEROS = (0.0,) * len(TERMS)  # (a term the step has not: 0.0)
_HYBRID = operator.attrgetter("hybrid")


@dataclass(slots=True)
class DecodeSpan:
    """The step rows of ``rows`` skipped decode steps, from what ``skip`` knew (``StepMetrics``
    writes them with ``fill``, many spans at once). Each row is what the step-by-step loop
    records for that step: cost terms (an array of ``rows`` values, or one value for all), start
    and duration from the running end times, and KV usage in ``Scheduler.kv_usage``'s terms from
    the blocks allocated and evicted in each step."""

    rows: int
    first_step: int
    start_s: float
    ends: np.ndarray  # [rows] end times
    terms: tuple  # per TERMS: float, or [rows] array
    counts: tuple  # num_requests, num_running, num_waiting, num_seqs (= tokens = decodes), total_slots
    used_blocks: int  # before the first step
    cached_blocks: int
    table_blocks: int
    allocations: list[int]  # per step
    evictions: list[int]
    block_size: int
    # [r]: the sequences whose computed tokens before scheduler step t are (t - r) % block_size
    # modulo block_size (bulk_decode.bucket_sizes)
    sizes: list[int]
    # A hybrid cache's window_decode.HybridCounts: every group's table counts (``groups``), and
    # the windows' drops take entries from the tables and blocks out of use (None: one group)
    hybrid: object = None

    @staticmethod
    def fill(spans: list[DecodeSpan], offsets: list[int], block: np.ndarray) -> None:
        """Write every span's rows into ``block`` (``[NUM_COLUMNS, rows]``, column-major: the
        protocol of ``StepMetrics.record_deferred``) at its row offset, vectorized over the spans."""
        # every span's integers in one pass: rows, first step, the five counts, the block counts, block size
        ints = np.array([(span.rows, span.first_step, *span.counts, span.used_blocks, span.cached_blocks,
                          span.table_blocks, span.block_size) for span in spans], dtype=np.int64).T
        ks = ints[0]
        total = int(ks.sum())
        first = np.cumsum(ks) - ks  # each span's first row among the spans' rows
        sid = np.repeat(np.arange(len(spans)), ks)
        j = np.arange(total) - first[sid]  # step within its span, from 0
        out = np.zeros((NUM_COLUMNS, total))  # (column-major: each column written contiguously)
        out[_STEP] = ints[1][sid] + j
        ends = np.concatenate([span.ends for span in spans])
        starts = out[_START]
        starts[1:] = ends[:-1]
        starts[first] = [span.start_s for span in spans]
        np.subtract(ends, starts, out=out[_DURATION])
        counts = ints[2:7][:, sid]
        out[_NUM_REQUESTS] = counts[0]
        out[_NUM_RUNNING] = counts[1]
        out[_NUM_WAITING] = counts[2]
        out[_NUM_SEQS] = out[_NUM_TOKENS] = out[_DECODE_SEQS] = counts[3]
        out[_TOTAL_SLOTS] = counts[4]
        by_term = zip(*[span.terms for span in spans])  # per term: its value in each span
        for values, (_, column) in zip(by_term, _TERM_COLUMNS):
            kinds = set(map(type, values))
            if np.ndarray not in kinds:
                out[column] = np.array(values, dtype=np.float64)[sid]
            elif len(kinds) == 1:
                out[column] = np.concatenate(values)
            else:
                out[column] = np.concatenate([v if isinstance(v, np.ndarray) else np.full(k, v)
                                                 for v, k in zip(values, ks.tolist())])
        # Blocks allocated and evicted through each step: cumulative sums within each span.
        allocs = np.fromiter(itertools.chain.from_iterable([span.allocations for span in spans]), np.int64, total)
        evicts = np.fromiter(itertools.chain.from_iterable([span.evictions for span in spans]), np.int64, total)
        allocs = _segment_cumsum(allocs, first, sid)
        evicts = _segment_cumsum(evicts, first, sid)
        per_span = ints[7:][:, sid]
        bs = per_span[3]
        used_blocks = per_span[0] + allocs
        cached_blocks = per_span[1] - evicts
        table_blocks = per_span[2] + allocs
        groups = None
        if any(map(_HYBRID, spans)):  # drops: entries out of tables, blocks out of use
            dropped, freed, cached = (_segment_cumsum(np.fromiter(itertools.chain.from_iterable(
                [span.rows * (0,) if span.hybrid is None else getattr(span.hybrid, name) for span in spans]),
                np.int64, total), first, sid) for name in ("dropped", "freed", "cached"))
            used_blocks -= freed
            cached_blocks += cached
            table_blocks -= dropped
            groups = np.array([1 if span.hybrid is None else span.hybrid.groups for span in spans], dtype=np.int64)[sid]
        allocated = used_blocks * bs
        out[_ALLOCATED] = allocated
        # Idle slots of step j (1-based): the unfilled tail of each sequence's last block after
        # its step-j write, (-(c + j)) mod bs, summed over sequences; periodic in j with period
        # bs, so one period per span from its count of sequences per residue of c.
        idle = np.empty(total, dtype=np.int64)
        for size in set(span.block_size for span in spans):
            members = [i for i, span in enumerate(spans) if span.block_size == size]
            sizes = np.array([spans[i].sizes for i in members], dtype=np.int64)  # [spans, size]
            # sequences per residue c % size at each span's first step: [m] = sizes[(first - m) % size]
            firsts = np.array([spans[i].first_step for i in members], dtype=np.int64)
            by_residue = (firsts[:, None] - np.arange(size)[None, :]) % size
            residues = np.take_along_axis(sizes, by_residue, axis=1)
            periods = residues @ _idle_pattern(size)  # [spans, size]
            if len(members) == len(spans):  # (one block size, as in every run: span i is row i)
                idle = periods.ravel()[sid * size + j % size]
            else:
                mine = np.flatnonzero(bs == size)
                idle[mine] = periods[np.searchsorted(members, sid[mine]), j[mine] % size]
        if groups is not None:  # (each group's table has the same length and the same last-block tail)
            idle = idle * groups
        out[_USED] = allocated - idle
        out[_CACHED] = cached_blocks * bs
        out[_UNSHARED] = table_blocks * bs
        block[:, np.repeat(np.asarray(offsets, dtype=np.int64) - first, ks) + np.arange(total)] = out


@functools.lru_cache(maxsize=64)
def _idle_pattern(bs: int) -> np.ndarray:
    """``[r, j] = (-(r + j + 1)) mod bs`` for residues ``r`` and steps ``j + 1 = 1..bs``."""
    r = np.arange(bs, dtype=np.int64)[:, None]
    j = np.arange(1, bs + 1, dtype=np.int64)[None, :]
    return (-(r + j)) % bs


# The row layout of a span (sim.step_metrics.STEP_COLUMNS); zero where a pure decode step has none.
(_STEP, _START, _DURATION, _NUM_REQUESTS, _NUM_RUNNING, _NUM_WAITING, _NUM_SEQS, _NUM_TOKENS, _DECODE_SEQS,
 _ALLOCATED, _USED, _CACHED, _TOTAL_SLOTS, _UNSHARED) = (COLUMN_INDEX[c] for c in (
    "step", "start_s", "duration_s", "num_requests", "num_running", "num_waiting", "num_seqs", "num_tokens",
    "decode_seqs", "allocated_slots", "used_slots", "cached_slots", "total_slots", "unshared_slots"))
_TERM_COLUMNS = tuple((t, COLUMN_INDEX[f"{t}_s"]) for t in TERMS)


def _segment_cumsum(values: np.ndarray, first: np.ndarray, sid: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``values`` restarting at each segment's first index (integers: exact)."""
    cum = np.cumsum(values)
    return cum - (cum[first] - values[first])[sid]


def timeout_until(env, when: float):
    """An event that fires at exactly ``when``, as the step-by-step clock would reach it.

    ``env.timeout(when - env.now)`` lands on ``env.now + (when - env.now)``, which is ``when``
    whenever the two are within a factor of two (Sterbenz), i.e. almost always; otherwise the
    event is queued at ``when`` itself, as ``Environment.schedule`` queues events (SimPy 4's
    ``(time, priority, id, event)`` heap entries)."""
    delay = when - env.now
    if env.now + delay == when:
        return env.timeout(delay)
    if not when >= env.now:
        raise ValueError(f"cannot go back in time from t={env.now!r} to t={when!r}")
    event = simpy.Event(env)
    event._ok = True
    event._value = None
    heapq.heappush(env._queue, (when, simpy.core.NORMAL, next(env._eid), event))
    return event
