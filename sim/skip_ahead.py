"""Skip-ahead in the simulator: time, cost and metrics of k pure decode steps at once.

The policy side (``engine.policy.fast_forward``) says when a replica's scheduler is decoding
steadily and how many steps it can stay so, and applies them. This module does what the
replica's step loop would have done for each of those steps: ask the cost model for their
durations, advance simulated time, and record their step metrics. Everything is bit for bit
what the step-by-step loop produces:

- step costs come from the cost model's own ``step_cost`` for the first step, and the only term
  that changes from step to step, decode attention (its context grows by one token per sequence),
  from ``CostModel.decode_attention_s`` (vectorized) or, if the model has none, ``step_cost`` per
  step; totals are summed term by term in the order ``StepCost.total_s`` sums them;
- step end times are the running sum ``now + d1 + d2 + ...`` taken left to right, as SimPy's
  clock adds each timeout (``np.add.accumulate`` is sequential, unlike ``np.sum``);
- a skipped step must *start* before the next arrival (``next_arrival_s``), as it would have
  started without seeing it; an arrival during a skipped step only joins the waiting queue and
  reads the step counter, which is already past that step either way. When something reads the
  replica's state at arrivals (a load-aware router), a skipped step must also *end* before it, so
  the reader finds the replica in the same state, mid-step, as without skipping;
- KV usage per step is counted from the allocations and evictions ``advance`` reports, in the
  definitions of ``Scheduler.kv_usage``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import fields

import numpy as np
import simpy

from engine.policy.decode_step import DecodeStep
from engine.policy.fast_forward import DecodeRun, advance
from sim.cost.base import TERMS, CostModel, StepWork

#: At most this many steps are costed at once (bounds the arrays; a longer run continues next time).
MAX_CHUNK = 1 << 15


def decode_work(run: DecodeRun, block_size: int | None) -> StepWork:
    """The ``StepWork`` of the run's first step (``StepWork.from_output`` of a pure decode)."""
    num_seqs = len(run.seqs)
    return StepWork(num_seqs=num_seqs, num_tokens=num_seqs, num_decode_seqs=num_seqs,
                    decode_context_tokens=sum(run.computed) + num_seqs, num_sampled=num_seqs,
                    block_size=block_size)


def decode_step_work(step: DecodeStep, block_size: int | None) -> StepWork:
    """The ``StepWork`` of a ``DecodeStep``: the batch's decodes plus what the waiting pass added
    (every field is a sum over sequences, so the two parts add up to ``StepWork.from_output`` of
    the whole step)."""
    decodes = decode_work(step.run, block_size)
    added = StepWork.from_output(step.output, block_size)
    return StepWork(**{f: getattr(decodes, f) + getattr(added, f) for f in SUMMED}, block_size=block_size)


#: The StepWork fields that are sums over a step's sequences (all but the block size).
SUMMED = tuple(f.name for f in fields(StepWork) if f.name != "block_size")


def step_terms(cost_model: CostModel, work: StepWork, k: int) -> tuple[dict[str, np.ndarray | float], np.ndarray]:
    """Per-term costs and totals of ``k`` decode steps from ``work`` (step j's decode context is
    ``work.decode_context_tokens + j * work.num_decode_seqs``)."""
    contexts = work.decode_context_tokens + work.num_decode_seqs * np.arange(k, dtype=np.int64)
    first = cost_model.step_cost(work).terms
    decode = cost_model.decode_attention_s(work, contexts)
    if decode is not None:
        terms: dict[str, np.ndarray | float] = dict(first)
        terms["decode_attention"] = decode
    else:
        rows = [first] + [cost_model.step_cost(_with_context(work, int(c))).terms for c in contexts[1:]]
        terms = {t: np.array([r[t] for r in rows]) for t in first}
    total: np.ndarray | float = 0
    for value in terms.values():  # StepCost.total_s: sum(terms.values()), left to right
        total = total + value
    return terms, np.broadcast_to(np.asarray(total, dtype=np.float64), (k,))


def _with_context(work: StepWork, context: int) -> StepWork:
    from dataclasses import replace

    return replace(work, decode_context_tokens=context)


def plan_skip(run: DecodeRun, cost_model: CostModel, block_size: int | None, now: float,
              next_arrival_s: float, *, end_before_arrival: bool) -> tuple[int, dict, np.ndarray]:
    """How many of the run's steps start (or end, with ``end_before_arrival``) strictly before
    ``next_arrival_s`` (the caller's ``now`` is before it), with their terms and end times."""
    work = decode_work(run, block_size)
    usage = cost_model.usage_snapshot()  # costing steps not taken must not count as using them
    first = cost_model.step_cost(work).total_s
    limit = min(run.max_steps, MAX_CHUNK)
    if math.isfinite(next_arrival_s) and first > 0:
        guess = min(limit, int((next_arrival_s - now) / first) + 2)
    else:
        guess = limit
    while True:
        terms, durations = step_terms(cost_model, work, guess)
        ends = np.add.accumulate(np.concatenate(([now], durations)))[1:]
        if end_before_arrival:
            k = int(np.searchsorted(ends, next_arrival_s, side="left"))  # ends < next arrival
        else:  # starts < next arrival: the first step, and each after an end before it
            k = min(guess, 1 + int(np.searchsorted(ends, next_arrival_s, side="left")))
        if k < guess or guess == limit:
            break
        guess = min(limit, guess * 2)
    if usage is not None:  # count exactly the k steps taken, as step by step would
        cost_model.restore_usage(usage)
        if k:
            terms, _ = step_terms(cost_model, work, k)
    return k, terms, ends


def skip(replica, run: DecodeRun, k: int, terms: dict, ends: np.ndarray) -> tuple[float, list]:
    """Apply ``k`` steps of ``run`` to the scheduler and record their metrics; returns the end
    time and the requests the last step finished."""
    sched = replica.scheduler
    pool = sched.pool
    done = advance(run, k)
    bs = sched.block_size
    allocs = np.cumsum(np.asarray(done.allocations, dtype=np.int64))
    evicts = np.cumsum(np.asarray(done.evictions, dtype=np.int64))
    allocated = (run.used_blocks + allocs) * bs
    # Idle slots of step j (1-based): the unfilled tail of each sequence's last block after its
    # step-j write, (-(c + j)) mod bs, summed over sequences.
    computed = np.asarray(run.computed, dtype=np.int64)
    j = np.arange(1, k + 1, dtype=np.int64)
    if len(computed) * k <= 1 << 16:
        idle = ((-(computed[:, None] + j)) % bs).sum(axis=0)
    else:  # by residue of c, to bound the temporary
        residues = np.bincount(computed % bs, minlength=bs)
        idle = np.zeros(k, dtype=np.int64)
        for r in np.flatnonzero(residues):
            idle += residues[r] * ((-(r + j)) % bs)
    num_seqs = len(run.seqs)
    num_requests = len(run.requests)
    starts = np.concatenate(([replica.env.now], ends[: k - 1]))
    columns = {
        "step": np.arange(done.first_step, done.first_step + k, dtype=np.float64),
        "start_s": starts, "duration_s": ends[:k] - starts, "num_requests": num_requests,
        "num_running": num_requests,
        "num_waiting": len(sched.waiting), "num_seqs": num_seqs, "num_tokens": num_seqs, "prefill_tokens": 0,
        "decode_seqs": num_seqs, "allocated_slots": allocated, "used_slots": allocated - idle,
        "cached_slots": (run.cached_blocks - evicts) * bs, "total_slots": pool.num_usable_blocks * bs,
        "unshared_slots": (run.table_blocks + allocs) * bs, "swap_out_blocks": 0, "swap_in_blocks": 0,
        "cow_blocks": 0, "preempted": 0,
    }
    for t in TERMS:
        value = terms.get(t, 0.0)
        columns[f"{t}_s"] = value[:k] if isinstance(value, np.ndarray) else value
    replica.steps.record_many(columns, k)
    return float(ends[k - 1]), done.finished


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
