"""When an inference-perf run sends its requests: its load timers, redrawn from a seed.

inference-perf's timers (``loadgen/load_timer.py``, unchanged from 2025 to 2026) are not what
their names suggest:

- ``ConstantLoadTimer(rate, duration)`` draws ``int(rate * duration)`` exponential gaps and scales
  them to sum to ``duration`` (load_timer.py:46-65 at 3b6f82a). So a "constant" stage sends
  exactly its count, its last request at the stage's end, but the gaps are exponential (a
  Poisson process conditioned on its count), not ``1 / rate`` apart. The first send comes one
  gap after the stage's origin.
- ``PoissonLoadTimer(rate)`` draws, for each second, a Poisson count of requests (mean ``rate``)
  and spreads them over that second by a ``ConstantLoadTimer(count, 1.0)``; a second that draws
  none passes empty (load_timer.py:72-91). A stage takes the first ``int(rate * duration)`` sends,
  so it ends near, not at, its nominal end.

inference-perf's generators are unseeded (``np.random.default_rng()``), so no run can be redrawn
exactly: ``stage_sends`` draws the same processes from the caller's generator. Stages follow each
other as ``pagesim.traces.inference_perf.config`` describes: the next origin is the last send plus
``load.interval`` plus inference-perf's 1 s queue lead, the wait for the stage's last requests to
finish taken as 0.
"""

from __future__ import annotations

import numpy as np

from pagesim.traces.inference_perf.config import QUEUE_LEAD_S, LoadStage


def constant_sends(count: int, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """``ConstantLoadTimer``: ``count`` send times after the origin, the last at ``duration_s``."""
    gaps = rng.exponential(1.0, count)
    times = np.minimum(np.cumsum(gaps) * (duration_s / gaps.sum()), duration_s)
    times[-1] = duration_s  # (the scaled sum, exactly)
    return times


def poisson_sends(count: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``PoissonLoadTimer``: the first ``count`` send times after the origin."""
    # Draw whole seconds in batches until they hold `count` sends; each second's sends are its
    # Poisson count of exponential gaps scaled to fill that second.
    per_second: list[np.ndarray] = []
    drawn = 0
    while drawn < count:
        batch = max(16, int(1.2 * (count - drawn) / rate_per_s) + 16)
        seconds = rng.poisson(rate_per_s, batch)
        per_second.append(seconds)
        drawn += int(seconds.sum())
    counts = np.concatenate(per_second)
    counts = counts[: int(np.searchsorted(np.cumsum(counts), count)) + 1]  # the seconds needed
    gaps = rng.exponential(1.0, int(counts.sum()))
    busy = np.flatnonzero(counts)
    first = np.r_[0, np.cumsum(counts[busy])[:-1]]  # each busy second's first send
    sums = np.add.reduceat(gaps, first)
    within = np.cumsum(gaps) - np.repeat(np.r_[0.0, np.cumsum(sums)[:-1]], counts[busy])
    fraction = np.minimum(within / np.repeat(sums, counts[busy]), 1.0)  # (rounding kept in its second)
    fraction[np.cumsum(counts[busy]) - 1] = 1.0  # a second's last send ends it (the scaled sum, exactly)
    return (np.repeat(busy.astype(np.float64), counts[busy]) + fraction)[:count]


def stage_sends(stages: tuple[LoadStage, ...], load_type: str, interval_s: float,
                rng: np.random.Generator) -> tuple[np.ndarray, list[float]]:
    """Every stage's send times, in order, seconds from the first stage's origin, and the origin
    of each stage as drawn."""
    parts, origins, origin_s = [], [], 0.0
    for stage in stages:
        count = stage.num_requests
        if load_type == "constant":
            sends = constant_sends(count, stage.duration_s, rng)
        elif load_type == "poisson":
            sends = poisson_sends(count, stage.rate_per_s, rng)
        else:
            raise ValueError(f"load type {load_type!r} has no timer here")
        parts.append(origin_s + sends)
        origins.append(origin_s)
        origin_s = float(parts[-1][-1]) + interval_s + QUEUE_LEAD_S
    return np.concatenate(parts), origins
