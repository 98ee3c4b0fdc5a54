"""What a cluster run measured: the cluster-wide summary and one summary per replica.

The per-request table (``RequestMetrics``) is shared by all replicas (its rows are the trace's
rows); a ``replica_of`` array says which replica served each row. Each replica keeps its own
step table. Definitions, beyond ``pagesim.sim.metrics``:

- cluster-wide request figures (throughput, goodput, latency percentiles, ``duration_s``) are
  over all requests, as for one replica;
- step-based figures read all replicas' steps as one table (``ClusterSteps``): ``steps``,
  ``busy_s``, ``time_by_term_s``, swapped blocks and copies are sums over replicas (busy time in
  replica-seconds); the time averages (``avg_batched_requests``, ``avg_running_requests``, the
  memory fractions, ``sharing_saved``) weight every replica's steps by their duration, so they
  are the average *per replica* while it computes (4 replicas each batching 10 requests
  average 10, not 40);
- preemptions, prefix hits and evictions are summed over replicas; the prefix hit rate is all
  replicas' hit tokens over all their admitted prompt tokens; the ideal cache's figures
  (``pagesim.sim.ideal_cache``) and the hit blocks missed (``missed_hit_blocks``) are each replica's over
  the requests routed to it, at its own cache's size, summed likewise (``None`` if any replica
  has none); so are the offload tier's counts
  and rates (``OffloadTotals``), each replica having its own store and host link
  (``host_link_busy_fraction`` is the links' mean);
- each replica's entry in ``replicas`` is ``pagesim.sim.metrics.summarize`` over the requests routed to
  it and its own steps (its duration, and so its throughput, spans its own first arrival to
  its last completion), plus ``replica``, ``tp``, ``requests_routed``, ``num_gpu_blocks`` and
  ``kv_cache_slots``.

A one-replica cluster's summary is the single-replica summary, key for key; ``router`` and
``replicas`` are added only for two or more. One replica's figures beyond its tables (its
scheduler's prefix hits and evictions, ``scheduler_figures``; the ideal cache's, ``ideal_figures``;
its inter-token gaps, ``replica_itl``) are defined here once, for both: a single-replica
``pagesim.sim.simulator.Simulation`` summarizes its run with them too.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from functools import reduce
from typing import TYPE_CHECKING

import numpy as np

from pagesim.sim.bench_metrics import DEFAULT_PERCENTILES, Slo
from pagesim.sim.ideal_cache import IdealCache, ideal_cache
from pagesim.sim.metrics import COMPLETED, OffloadTotals, RequestMetrics, StepMetrics, admitted_rows, summarize
from pagesim.sim.step_metrics import STEP_COLUMNS
from pagesim.sim.token_runs import ItlSample, itl_sample

if TYPE_CHECKING:
    from pagesim.sim.replica import Replica


class ClusterSteps:
    """Several replicas' step tables read as one, replica by replica (``array``, ``len``,
    ``term_totals_s``, ``iter_chunks`` and ``chunk_sums``: what ``summarize`` and the ``--out`` writers read).
    Made once the run has ended: the term totals are taken then."""

    def __init__(self, parts: Sequence[StepMetrics]):
        if not parts:
            raise ValueError("a cluster has at least one replica")
        self.parts = list(parts)
        totals = [p.term_totals_s for p in self.parts]
        self.term_totals_s = {t: sum(part[t] for part in totals) for t in totals[0]}

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def array(self, name: str) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0].array(name)
        return np.concatenate([p.array(name) for p in self.parts])

    def iter_chunks(self, columns: Sequence[str] = STEP_COLUMNS) -> Iterator[dict[str, np.ndarray]]:
        """Every row in order, replica by replica, a chunk at a time (``StepMetrics.iter_chunks``)."""
        for part in self.parts:
            yield from part.iter_chunks(columns)

    def chunk_sums(self) -> Iterator[tuple[float, ...]]:
        """Each chunk's ``pagesim.sim.step_sums``, replica by replica (``StepMetrics.chunk_sums``)."""
        for part in self.parts:
            yield from part.chunk_sums()

    def replica_index(self) -> np.ndarray:
        """For each row of ``array``: the replica whose step it is."""
        return np.repeat(np.arange(len(self.parts)), [len(p) for p in self.parts])


def requests_subset(requests: RequestMetrics, mask: np.ndarray) -> RequestMetrics:
    """A copy of ``requests`` holding only the rows ``mask`` selects (in order); rejection and abort
    reasons are renumbered to the new rows. Every per-row array column is subset, whatever its name."""
    num_rows = len(requests.status)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (num_rows,):
        raise ValueError(f"mask of shape {mask.shape} for {num_rows} request rows")
    subset = RequestMetrics(int(mask.sum()))
    for name, value in vars(requests).items():
        if isinstance(value, np.ndarray) and value.shape[:1] == (num_rows,):
            setattr(subset, name, value[mask])
    new_row = np.cumsum(mask) - 1
    subset.reject_reasons = {int(new_row[row]): reason for row, reason in requests.reject_reasons.items() if mask[row]}
    subset.timeout_reasons = {int(new_row[row]): reason for row, reason in requests.timeout_reasons.items() if mask[row]}
    return subset


def scheduler_figures(scheduler, ideal: IdealCache | None = None) -> dict:
    """``prefix_hit_rate``, ``num_evictions`` and ``hit_blocks_missed`` (``missed_hit_blocks``,
    given the scheduler's ``ideal_figures``) of one scheduler, as ``summarize`` takes them."""
    admitted = scheduler.num_prompt_tokens_admitted
    return {"prefix_hit_rate": (scheduler.num_prefix_hit_tokens / admitted) if admitted and _caches(scheduler) else None,
            "num_evictions": getattr(getattr(scheduler, "pool", None), "num_evictions", 0),
            "hit_blocks_missed": missed_hit_blocks(scheduler, ideal)}


def missed_hit_blocks(scheduler, ideal: IdealCache | None) -> int | None:
    """Prefix-hit blocks the scheduler's requests asked for, that had been cached, and missed:
    on first admissions, what a cache that never evicts would have hit beyond the run's own hits
    (``ideal.infinite_hit_tokens``: every re-reference of a block in the trace); on returns after
    a recompute preemption, the blocks the request had cached and did not find
    (``KVCacheManager.num_resume_blocks_lost``). ``None`` without ``ideal``."""
    if ideal is None:
        return None
    first = max(0, ideal.infinite_hit_tokens - scheduler.num_prefix_hit_tokens) // scheduler.config.block_size
    return first + getattr(scheduler.kv, "num_resume_blocks_lost", 0)


def _caches(scheduler) -> bool:
    return getattr(scheduler, "paged", True) and scheduler.config.enable_prefix_caching


def ideal_figures(trace, scheduler, rows: np.ndarray, requests: RequestMetrics | None = None) -> IdealCache | None:
    """The ideal and infinite caches on the trace's ``rows`` (a mask: the requests this scheduler
    was given and admitted), at the scheduler's block size and its cache's size (GPU blocks plus
    the offload store's); ``None`` without a trace, with prefix caching off, or for a hybrid
    cache (several layer groups share its blocks, so its size in one chain's blocks is not known).
    The requests reach the cache in arrival order, except under priority scheduling, where they
    reach it in the order they were first admitted (``requests``' first scheduling times, ties as
    vLLM's priority heap breaks them): the ideal cache sees the order the real one saw."""
    pool = getattr(scheduler, "pool", None)
    if trace is None or pool is None or not _caches(scheduler) or getattr(scheduler.kv, "num_groups", 1) > 1:
        return None
    config = scheduler.config
    capacity = pool.num_usable_blocks + config.num_offload_blocks
    last = bool(config.num_offload_blocks)  # (the offload store can serve a prompt's last block: a load, then its last token)
    if getattr(config, "scheduling_policy", "fcfs") == "priority" and requests is not None:
        index = np.flatnonzero(rows)
        order = np.lexsort((index, trace.arrival_s[index], trace.priority[index], requests.first_scheduled_s[index]))
        return ideal_cache(trace, config.block_size, capacity, index[order], hit_last_block=last)
    return ideal_cache(trace, config.block_size, capacity, rows, hit_last_block=last)


def replica_itl(replica: Replica, rows=None) -> ItlSample:
    """The inter-token gaps of the completed requests ``replica`` served (``rows``: those it was
    routed; default all of the run's)."""
    m = replica.requests
    if rows is None:
        rows = np.arange(len(m.status))
    done = rows[m.status[rows] == COMPLETED]
    runs = replica.token_runs.runs(replica.index, done)
    return itl_sample(runs, replica.steps.array("start_s"), replica.steps.array("duration_s"))


def offload_totals(replicas: Sequence) -> OffloadTotals | None:
    """The replicas' offload tiers together (``None``: offloading is off)."""
    totals = [t for t in (r.offload_totals() for r in replicas) if t is not None]
    return reduce(operator.add, totals) if totals else None


def cluster_summary(requests: RequestMetrics, replicas: Sequence, replica_of: np.ndarray, *, slo: Slo,
                    percentiles=DEFAULT_PERCENTILES, router_name: str, tp: int = 1,
                    block_bytes: int | None = None, trace=None, request_timeout_s: float | None = None) -> dict:
    """The cluster-wide summary, with ``router`` and per-replica ``replicas`` for two or more
    replicas (``replicas``: ``pagesim.sim.replica.Replica`` objects); ``block_bytes``: one KV block over
    a replica's GPUs; ``trace``: the run's, for the ideal cache's figures (each replica's over the
    requests routed to it; the cluster's their sum)."""
    common = {"slo": slo, "percentiles": percentiles, "block_bytes": block_bytes, "request_timeout_s": request_timeout_s}
    admitted = admitted_rows(requests)
    ideals = [ideal_figures(trace, r.scheduler, admitted & (replica_of == k), requests) for k, r in enumerate(replicas)]
    if len(replicas) == 1:
        (only,) = replicas
        return summarize(requests, only.steps, **common, preemptions=only.preemptions, itl=replica_itl(only),
                         offload=only.offload_totals(), ideal=ideals[0], **scheduler_figures(only.scheduler, ideals[0]))
    schedulers = [r.scheduler for r in replicas]
    admitted_tokens = sum(s.num_prompt_tokens_admitted for s in schedulers)
    caches = any(_caches(s) for s in schedulers)
    preemptions = {mode: sum(r.preemptions[mode] for r in replicas) for mode in replicas[0].preemptions}
    itls = [replica_itl(r, np.flatnonzero(replica_of == k)) for k, r in enumerate(replicas)]
    figures = [scheduler_figures(s, ideal) for s, ideal in zip(schedulers, ideals)]
    missed = [f["hit_blocks_missed"] for f in figures]
    summary = summarize(
        requests, ClusterSteps([r.steps for r in replicas]), **common, preemptions=preemptions,
        prefix_hit_rate=((sum(s.num_prefix_hit_tokens for s in schedulers) / admitted_tokens)
                         if admitted_tokens and caches else None),
        num_evictions=sum(f["num_evictions"] for f in figures),
        hit_blocks_missed=None if None in missed else sum(missed),
        ideal=None if None in ideals else reduce(operator.add, ideals), itl=ItlSample.merge(itls),
        offload=offload_totals(replicas),
    )
    summary["router"] = router_name
    summary["replicas"] = [replica_summary(k, r, requests_subset(requests, replica_of == k), common, tp, itls[k],
                                           ideals[k])
                           for k, r in enumerate(replicas)]
    return summary


def replica_summary(index: int, replica, requests: RequestMetrics, common: dict, tp: int, itl: ItlSample,
                    ideal: IdealCache | None = None) -> dict:
    sched = replica.scheduler
    return {
        "replica": index, "tp": tp, "requests_routed": len(requests.status),
        "num_gpu_blocks": sched.config.num_gpu_blocks, "kv_cache_slots": sched.kv_usage().total_slots,
        **summarize(requests, replica.steps, **common, preemptions=replica.preemptions, itl=itl,
                    offload=replica.offload_totals(), ideal=ideal, **scheduler_figures(sched, ideal)),
    }
