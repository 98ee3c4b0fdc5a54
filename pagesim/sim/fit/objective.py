"""What a fit minimizes: simulated vs measured, per stage, as one vector of residuals.

Per measurement the rows fitted are its load stages (inference-perf), or its whole run (a vLLM
bench file, which has one). A row's residuals depend on what was measured there, never on what
was predicted, so the vector keeps its layout at every parameter point:

- a row that ran clean (measured failures under ``SATURATED`` of the requests sent) contributes
  ``log(predicted / measured)`` of E2E and TTFT (mean and p99) and of per-token latency (mean),
  each clipped to ``+-CLIP``, plus the failure fraction predicted (a prediction of timeouts where
  there were none is an error too);
- a row that timed out or saturated counts by its failures alone: predicted minus measured
  failure fraction (its throughput is the requests that succeeded, so this is the same as its
  throughput's error); latencies of the requests that got through are not fitted.

A latency the simulator did not produce (every request of the row failed) counts as ``CLIP``.
"""

from __future__ import annotations

import math

import numpy as np

LATENCY_TERMS = (("e2e", "mean"), ("e2e", "p99"), ("ttft", "mean"), ("ttft", "p99"), ("per_token", "mean"))
SATURATED = 0.005
CLIP = 2.0


def fitted_rows(rows: list) -> list:
    """The rows a fit compares: the stages, or the whole run where there are none."""
    stages = [row for row in rows if row.stage is not None]
    return stages or rows


def saturated(row) -> bool:
    return row.measured_counts is not None and row.measured_counts[1] > SATURATED * max(row.num_requests, 1)


def layout(rows: list) -> list[tuple[int, str, str]]:
    """``(row index, figure, statistic)`` per residual (figure ``failures`` for the failure term)."""
    terms = []
    for i, row in enumerate(fitted_rows(rows)):
        if not saturated(row):
            terms += [(i, f, s) for f, s in LATENCY_TERMS if row.measured[f].get(s)]
        terms.append((i, "failures", "fraction"))
    return terms


def residuals(rows: list, terms: list[tuple[int, str, str]]) -> np.ndarray:
    """The residuals of ``rows`` (one measurement's, at one parameter point) laid out as ``terms``."""
    fitted = fitted_rows(rows)
    out = np.empty(len(terms))
    for k, (i, figure, stat) in enumerate(terms):
        row = fitted[i]
        if figure == "failures":
            measured = row.measured_counts[1] if row.measured_counts is not None else 0
            out[k] = (row.predicted_counts[1] - measured) / max(row.num_requests, 1)
            continue
        m, p = row.measured[figure][stat], row.predicted[figure].get(stat)
        out[k] = CLIP if p is None or not p > 0 or not math.isfinite(p) else float(np.clip(math.log(p / m), -CLIP, CLIP))
    return out


def shift_derivative(rows: list, terms: list[tuple[int, str, str]], shift_s: float) -> np.ndarray:
    """d(residual)/d(log shift) for a time ``shift_s`` every request's E2E and TTFT carry whole
    (the serving path's frontend term): ``shift_s / predicted`` for those, 0 for per token and
    failures."""
    fitted = fitted_rows(rows)
    out = np.zeros(len(terms))
    for k, (i, figure, stat) in enumerate(terms):
        if figure in ("e2e", "ttft"):
            p = fitted[i].predicted[figure].get(stat)
            if p is not None and p > 0:
                out[k] = shift_s / p
    return out
