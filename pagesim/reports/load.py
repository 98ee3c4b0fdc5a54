"""Which regime a run is in: below, near or past saturation, from the run's own numbers.

Conclusions about a policy hold in the regime they were measured in: past saturation, TTFT is
mostly queueing and a better policy mostly shortens the queue. Under continuous batching a request
is admitted the moment the batch and the KV cache have room, so waiting in the queue is the sign:

- ``queue_share``: mean queueing time (arrival to first scheduled) over mean service time
  (end-to-end minus queueing): about 0 below saturation, growing without bound past it;
- ``preemptions_per_request``: the KV cache cannot hold the batch it admitted;
- achieved request throughput over the offered rate is kept (``achieved_rps``, ``offered_rps``)
  but not used to classify: a finite trace's last requests drain after the last arrival, so even
  an idle server reads below 1 (by about one latency over the arrival span).

Rule (``classify``): past if queue_share >= 0.5 or preemptions_per_request >= 0.5; near if
queue_share >= 0.1 or preemptions_per_request >= 0.05; below otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAST_QUEUE, NEAR_QUEUE = 0.5, 0.1
PAST_PREEMPT, NEAR_PREEMPT = 0.5, 0.05
RULE = (f"below saturation: requests wait in the queue under {NEAR_QUEUE:.0%} of their service time and under "
        f"{NEAR_PREEMPT:g} preemptions per request; past: waiting at least {PAST_QUEUE:.0%} of the service time or "
        f"{PAST_PREEMPT:g} preemptions per request; near: between")


@dataclass(frozen=True)
class Load:
    offered_rps: float | None  # the trace's arrivals per second (requests / arrival span)
    achieved_rps: float | None  # completed requests per second, first arrival to last finish
    queue_share: float | None
    preemptions_per_request: float | None
    regime: str  # "below" | "near" | "past" | "unknown"


def classify(queue_share: float | None, preemptions_per_request: float | None) -> str:
    if queue_share is None:
        return "unknown"
    pre = preemptions_per_request or 0.0
    if queue_share >= PAST_QUEUE or pre >= PAST_PREEMPT:
        return "past"
    if queue_share >= NEAR_QUEUE or pre >= NEAR_PREEMPT:
        return "near"
    return "below"


def run_load(record: dict[str, Any]) -> Load:
    summary = record.get("summary") or {}
    offered = (record.get("trace") or {}).get("rate_rps")
    achieved = summary.get("throughput_rps")
    queueing = (summary.get("queueing_s") or {}).get("mean")
    e2e = (summary.get("e2e_s") or {}).get("mean")
    share = None
    if queueing is not None and e2e is not None:
        service = e2e - queueing
        share = queueing / service if service > 0 else None
    total = summary.get("requests_total") or 0
    pre = summary.get("preemptions") or {}
    per_request = sum(pre.values()) / total if total else None
    return Load(offered, achieved, share, per_request, classify(share, per_request))


REGIMES = ("below", "near", "past", "unknown")


def nominal_rps(record: dict[str, Any]) -> float | None:
    """The rate the study asked for (the run's or the source's rate times its rate scale); None for a
    trace replayed at its own timestamps. Seeds draw different arrivals around it."""
    config = record.get("config") or {}
    rate = config.get("rate") if config.get("rate") is not None else (config.get("source") or {}).get("rate")
    return None if rate is None else rate * config.get("rate_scale", 1.0)
