"""What a run measured: per request, per step, and the run's summary.

Per request (numpy columns indexed by trace row): arrival, first scheduled (end of queueing),
first token (end of the step whose sampling produced it), finish, output tokens (every returned
sample's or beam's tokens), generation length (the longest sequence's outputs), preemptions, and
status (pending, completed, rejected, timed out). A request its client gave up on
(``SimOptions.request_timeout_s``: still unfinished that many seconds after it was sent) has timed
out: the server aborts it at the first step boundary at or after that instant (``pagesim.sim.replica``; no
finish time then), unless the step running at that instant finished it (a finish time after the
deadline: the client had left). Either way its status is timed out, its reason is in
``timeout_reasons`` ("timeout after S s"), and its output tokens are those it had generated (GPU
work done, not output throughput).

Per step (``pagesim.sim.step_metrics``, rows appended as the run goes, spilled to disk past one chunk):
start and duration, scheduled requests, sequences and tokens (prefill / decode), KV slots
allocated / used / cached / total and what the allocated blocks would take unshared, swapped and
copied blocks, preemptions, and each cost term.

Summary definitions (all times in seconds):
- ``duration_s``: first arrival to last completion; throughput = completed requests (or generated
  tokens, ``throughput_tokens_s``; prompt tokens, ``throughput_input_tokens_s``; both,
  ``throughput_total_tokens_s``) / duration; goodput = completed requests meeting every SLO /
  duration; ``slo.attained`` = those requests / all requests submitted (a rejected or timed-out
  request never meets an SLO);
- ``requests_timed_out``: requests whose client's timeout (``request_timeout_s``, ``None``: none)
  passed before they finished (aborted, or finished too late); like rejected ones they are failed
  requests (``requests_failed`` counts both, vLLM bench's ``failed``), left out of every latency
  statistic and of throughput, as clients leave failures out; ``timed_out_output_tokens``: the
  tokens they had generated (computed on the GPU, so in the step figures, but delivered to no
  one: not in ``generated_tokens``);
- TTFT = first token - arrival; TPOT = (finish - first token) / (generation length - 1), over
  requests generating at least two tokens; e2e = finish - arrival; ITL = every gap between two
  consecutive tokens of a request (``pagesim.sim.token_runs``); normalized latency = mean over requests of
  e2e / generation length (the PagedAttention paper's metric); each latency with mean, median,
  std and percentiles as vLLM bench computes them (``pagesim.sim.bench_metrics``); with a closed-loop
  client the arrival is when the client sent the request;
- ``max_concurrent_requests``: the peak of requests in flight; ``max_output_tokens_per_s``: vLLM
  bench's per-second peak of token events (``pagesim.sim.bench_metrics``);
- ``memory_utilization`` = used / allocated slots, time-averaged over steps holding any (the
  share of reserved KV memory that holds a token); ``memory_used_fraction`` = used / all slots
  of the cache, time-averaged (the paper's Fig. 2 splits the whole cache this way, so external
  fragmentation and free memory count against it), ``memory_allocated_fraction`` likewise;
- ``avg_batched_requests``: requests computing tokens in a step, time-averaged over busy time;
  ``avg_running_requests``: requests admitted and holding KV memory (the running set a step
  draws its batch from; under vLLM v0 a prompt-only step pauses the others without evicting
  them), likewise (the paper's Fig. 13 "batched requests");
- ``sharing_saved`` = 1 - allocated / unshared slots, time-averaged (Fig. 15);
- ``prefix_evictions``: cached blocks taken for a new owner (a free block that still held a
  cached block's content). What they cost: ``prefix_hit_blocks_missed``, the prefix-hit blocks a
  later request asked for that had been cached and were gone (``pagesim.sim.cluster_metrics.
  missed_hit_blocks``: on first admissions, the hits a cache that never evicts would have served
  beyond the run's own, which also counts a block asked for while the request computing it was
  still being prefilled; on returns after a recompute preemption, the blocks the request had
  cached and did not find); each such miss traces back to an eviction (its own block's, or one
  that cut the chain before it), so ``prefix_evictions_costing_hits`` = min(evictions, missed)
  bounds the evictions that cost a hit from above and ``prefix_evictions_recycled`` = evictions
  - missed (at least 0) the plain recycling (a free block whose content nobody asked for again)
  from below; all three ``None`` where the ideal cache's figures are (below);
- with prefix caching on, what the trace allows (``pagesim.sim.ideal_cache``, over the admitted requests
  in arrival order): ``ideal_hit_rate``, the prefix hit rate of an ideal cache of
  ``ideal_cache_blocks`` blocks (the replica's GPU blocks, plus its offload store's; Belady's MIN,
  knowing the future: the best any eviction policy could do at this cache size);
  ``infinite_cache_hit_rate``, a cache that never evicts; ``prefix_reusable_blocks``, the distinct
  blocks a later request could hit (the working set to compare with the cache); all ``None`` with
  prefix caching off or a hybrid (sliding-window) cache.

With KV offloading on (``pagesim.engine.policy.offload``; ``OffloadTotals``), also:
- ``offload_hit_tokens``: first admissions' prefix-hit tokens loaded from the offload store;
  ``hbm_hit_tokens`` the rest of their hits (the GPU prefix cache's); ``hbm_hit_rate`` and
  ``offload_hit_rate`` each over the admitted prompt tokens (``prefix_hit_rate`` is their sum);
- ``offload_loaded_blocks`` / ``offload_stored_blocks``: copies into and out of the GPU cache
  (loads include resumed requests'), and the same in bytes over the replica's GPUs
  (``offload_loaded_bytes`` / ``offload_stored_bytes``; ``None`` when the block's bytes are not
  known); ``offload_evictions``, ``offload_refused_blocks`` (offered blocks the store had no room
  for) and ``offload_blocks`` (the store's size);
- ``host_link_busy_fraction``: the host link's transfer time (swaps and offload copies) over
  the run's duration, or over the time to its last transfer when that ends later (a store after
  the last completion); per link, averaged over replicas;
- ``offload_load_wait_s``: the seconds steps spent queueing for the link and copying their
  synchronous loads;
- ``offload_parked_requests``: requests parked at least once while an asynchronous load ran
  (vLLM's ``WAITING_FOR_REMOTE_KVS``); ``offload_parked_mean_s`` / ``offload_parked_p99_s``: over
  those, the seconds each spent parked, in all (from the start of the step that parked it to the
  step boundary its load was reported done; ``None`` when none was parked).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pagesim.sim import bench_metrics
from pagesim.sim.bench_metrics import DEFAULT_PERCENTILES, Slo, _r, latency_stats
from pagesim.sim.ideal_cache import IdealCache
from pagesim.sim.step_metrics import STEP_COLUMNS, StepMetrics
from pagesim.sim.step_sums import total_sums
from pagesim.sim.token_runs import ItlSample

__all__ = ["COMPLETED", "PENDING", "REJECTED", "REQUEST_COLUMNS", "STEP_COLUMNS", "TIMED_OUT", "OffloadTotals",
           "RequestMetrics", "StepMetrics", "admitted_rows", "summarize", "timeout_reason"]

PENDING, COMPLETED, REJECTED, TIMED_OUT = 0, 1, 2, 3

REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "generation_len", "n",
                   "beam_width", "status", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s",
                   "tpot_s", "e2e_s", "preemptions")


class RequestMetrics:
    def __init__(self, num_requests: int):
        nan = np.full(num_requests, np.nan)
        self.arrival_s = nan.copy()
        self.first_scheduled_s = nan.copy()
        self.first_token_s = nan.copy()
        self.finish_s = nan.copy()
        self.prompt_tokens = np.zeros(num_requests, np.int64)
        self.output_tokens = np.zeros(num_requests, np.int64)
        self.generation_len = np.zeros(num_requests, np.int64)
        self.n = np.ones(num_requests, np.int64)
        self.beam_width = np.ones(num_requests, np.int64)
        self.preemptions = np.zeros(num_requests, np.int64)
        # KV offloading: times parked while an asynchronous load ran, and the seconds, in all
        self.offload_parks = np.zeros(num_requests, np.int64)
        self.offload_parked_s = np.zeros(num_requests)
        self.release_step = np.zeros(num_requests, np.int64)  # the first schedule() that could see it
        self.status = np.zeros(num_requests, np.int8)
        self.reject_reasons: dict[int, str] = {}
        self.timeout_reasons: dict[int, str] = {}  # row -> why its client gave up ("timeout after S s")

    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    def tpot_s(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.finish_s - self.first_token_s) / (self.generation_len - 1)
        tpot[self.generation_len < 2] = np.nan
        return tpot


def timeout_reason(timeout_s: float) -> str:
    """Why a request was aborted when its client's timeout passed."""
    return f"timeout after {timeout_s:g} s"


def admitted_rows(requests: RequestMetrics) -> np.ndarray:
    """The rows the scheduler admitted at least once: neither rejected nor aborted while waiting
    for their first admission (a mask)."""
    status = requests.status
    return (status != REJECTED) & ~((status == TIMED_OUT) & np.isnan(requests.first_scheduled_s))


@dataclass(frozen=True, slots=True)
class OffloadTotals:
    """What the offload tier did over a run, as counts (``Replica.offload_totals``); ``+`` sums
    replicas'. ``summarize`` turns them into the offload keys."""

    num_blocks: int  # the store's size
    admitted_tokens: int  # first admissions' prompt tokens
    hit_tokens: int  # of those, prefix hits from either tier
    offload_hit_tokens: int  # of those, loaded from the offload store
    loaded_blocks: int
    stored_blocks: int
    evictions: int
    refused_blocks: int
    link_busy_s: float  # the host link's transfer time, swaps included
    link_idle_s: float | None  # when the last transfer ended (None: none)
    num_links: int
    load_wait_s: float

    def __add__(self, other: OffloadTotals) -> OffloadTotals:
        idle = [t for t in (self.link_idle_s, other.link_idle_s) if t is not None]
        return OffloadTotals(**{name: getattr(self, name) + getattr(other, name) for name in self.__slots__
                                if name != "link_idle_s"}, link_idle_s=max(idle) if idle else None)

    def summary(self, start_s: float, duration_s: float, block_bytes: int | None) -> dict:
        """The summary's offload keys, for a run from ``start_s`` lasting ``duration_s``;
        ``block_bytes``: one block over the replica's GPUs (``None``: unknown)."""
        def rate(tokens: int) -> float | None:
            return _ratio(tokens, self.admitted_tokens)

        def nbytes(blocks: int) -> int | None:
            return None if block_bytes is None else blocks * block_bytes

        span = duration_s if self.link_idle_s is None else max(duration_s, self.link_idle_s - start_s)
        hbm = self.hit_tokens - self.offload_hit_tokens
        return {
            "offload_blocks": self.num_blocks, "offload_hit_tokens": self.offload_hit_tokens, "hbm_hit_tokens": hbm,
            "hbm_hit_rate": rate(hbm), "offload_hit_rate": rate(self.offload_hit_tokens),
            "offload_loaded_blocks": self.loaded_blocks, "offload_stored_blocks": self.stored_blocks,
            "offload_loaded_bytes": nbytes(self.loaded_blocks), "offload_stored_bytes": nbytes(self.stored_blocks),
            "offload_evictions": self.evictions, "offload_refused_blocks": self.refused_blocks,
            "host_link_busy_fraction": _ratio(self.link_busy_s, self.num_links * span),
            "offload_load_wait_s": _r(self.load_wait_s),
        }


def _r_or_none(x: float | None) -> float | None:
    return None if x is None else _r(x)


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else _r(numerator / denominator)


def step_sums(steps) -> dict[str, float]:
    """The sums over steps that the summary's step figures are ratios of (``pagesim.sim.step_sums``),
    from the store's sums of each chunk of rows (``chunk_sums``, taken as each chunk left
    memory), so a run of millions of steps never holds or reads back a column. Exact sums: the result does not depend on the order of the steps, and within one
    chunk on nothing at all."""
    return total_sums(steps.chunk_sums())


def summarize(requests: RequestMetrics, steps: StepMetrics, *, slo: Slo, preemptions: dict[str, int],
              prefix_hit_rate: float | None, num_evictions: int, hit_blocks_missed: int | None = None,
              ideal: IdealCache | None = None, itl: ItlSample | None = None,
              percentiles=DEFAULT_PERCENTILES, offload: OffloadTotals | None = None,
              block_bytes: int | None = None, request_timeout_s: float | None = None) -> dict:
    """The run's summary (module docstring); the offload keys only with ``offload`` (offloading
    on), its bytes from ``block_bytes``, one KV block over a replica's GPUs; the ideal cache's
    from ``ideal`` (``None``: not computed); ``request_timeout_s``: the clients' timeout (``None``:
    none)."""
    done = requests.status == COMPLETED
    completed = int(done.sum())
    timed_out = requests.status == TIMED_OUT
    rejected = int((requests.status == REJECTED).sum())
    submitted = len(requests.status)
    ttft, tpot, e2e = requests.ttft_s()[done], requests.tpot_s()[done], requests.e2e_s()[done]
    start = float(np.nanmin(requests.arrival_s)) if len(requests.arrival_s) else 0.0
    end = float(np.nanmax(requests.finish_s[done])) if completed else start
    duration = end - start
    tokens = int(requests.output_tokens[done].sum())
    input_tokens = int(requests.prompt_tokens[done].sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        normalized = e2e / requests.generation_len[done]
    meets = slo.meets(ttft, tpot, e2e)
    sums = step_sums(steps)
    busy = sums["busy_s"]

    def per_s(x: float) -> float | None:
        return _r(x / duration) if duration > 0 else None

    def stats(values, weights=None) -> dict:
        return latency_stats(values, percentiles, weights)

    sent, finished = requests.arrival_s[done], requests.finish_s[done]
    summary = {
        "requests_total": submitted,
        "requests_completed": completed,
        "requests_rejected": rejected,
        "rejection_reasons": dict(Counter(requests.reject_reasons.values()).most_common(3)),
        "requests_timed_out": int(timed_out.sum()),
        "requests_failed": rejected + int(timed_out.sum()),
        "request_timeout_s": request_timeout_s,
        "duration_s": _r(duration),
        "throughput_rps": per_s(completed),
        "throughput_tokens_s": per_s(tokens),
        "throughput_input_tokens_s": per_s(input_tokens),
        "throughput_total_tokens_s": per_s(input_tokens + tokens),
        "goodput_rps": per_s(int(meets.sum())),
        "slo": {**slo.to_dict(), "met": int(meets.sum()), "attained": _r(meets.sum() / submitted) if submitted else None},
        "ttft_s": stats(ttft),
        "tpot_s": stats(tpot),
        "itl_s": stats(itl.values, itl.weights) if itl is not None else stats([]),
        "e2e_s": stats(e2e),
        "queueing_s": stats((requests.first_scheduled_s - requests.arrival_s)[done]),
        "normalized_latency_s_per_token": _r(normalized.mean()) if completed else None,
        "input_tokens": input_tokens,
        "generated_tokens": tokens,
        "timed_out_output_tokens": int(requests.output_tokens[timed_out].sum()),
        "max_concurrent_requests": bench_metrics.peak_in_flight(sent, finished),
        "max_output_tokens_per_s": (bench_metrics.max_tokens_per_second(itl.token_times, itl.token_counts, float(sent.min()), end)
                                    if itl is not None and completed else None),
        "memory_utilization": _ratio(sums["utilization_x_s"], sums["held_s"]),
        "memory_allocated_fraction": _ratio(sums["allocated_fraction_x_s"], busy),
        "memory_used_fraction": _ratio(sums["used_fraction_x_s"], busy),
        "sharing_saved": _ratio(sums["sharing_saved_x_s"], sums["held_s"]),
        "avg_batched_requests": _ratio(sums["batched_x_s"], busy),
        "avg_running_requests": _ratio(sums["running_x_s"], busy),
        "preemptions": dict(preemptions),
        "swapped_blocks": {"out": int(sums["swap_out_blocks"]), "in": int(sums["swap_in_blocks"])},
        "cow_copies": int(sums["cow_blocks"]),
        "prefix_hit_rate": None if prefix_hit_rate is None else _r(prefix_hit_rate),
        "prefix_evictions": num_evictions,
        "prefix_hit_blocks_missed": hit_blocks_missed,
        "prefix_evictions_costing_hits": None if hit_blocks_missed is None else min(num_evictions, hit_blocks_missed),
        "prefix_evictions_recycled": None if hit_blocks_missed is None else max(0, num_evictions - hit_blocks_missed),
        "ideal_hit_rate": None if ideal is None else _r_or_none(ideal.ideal_hit_rate),
        "infinite_cache_hit_rate": None if ideal is None else _r_or_none(ideal.infinite_hit_rate),
        "prefix_reusable_blocks": None if ideal is None else ideal.reusable_blocks,
        "ideal_cache_blocks": None if ideal is None else ideal.capacity_blocks,
        "steps": len(steps),
        "busy_s": _r(busy),
        "time_by_term_s": {t: _r(v) for t, v in steps.term_totals_s.items()},
    }
    if offload is not None:
        summary.update(offload.summary(start, duration, block_bytes))
        summary.update(parked_summary(requests))
    return summary


def parked_summary(requests: RequestMetrics) -> dict:
    """The offload keys of parked requests (module docstring), over the rows parked at least once."""
    parked = requests.offload_parks > 0
    waited = requests.offload_parked_s[parked]
    return {
        "offload_parked_requests": int(parked.sum()),
        "offload_parked_mean_s": _r(float(waited.mean())) if len(waited) else None,
        "offload_parked_p99_s": _r(float(np.percentile(waited, 99))) if len(waited) else None,
    }
