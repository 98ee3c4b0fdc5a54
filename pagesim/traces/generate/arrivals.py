"""Arrival processes: when synthetic requests arrive.

Each process turns a request count and a seeded ``numpy.random.Generator`` into sorted arrival
times in seconds (the first at the first gap after 0, not at 0):

- ``Poisson(rate_rps)``: exponential gaps, the usual open-loop load (vLLM's benchmarks, the
  PagedAttention paper).
- ``Gamma(rate_rps, cv)``: gamma gaps with mean ``1 / rate`` and coefficient of variation ``cv``;
  ``cv > 1`` is bursty, ``cv = 1`` is Poisson, ``cv < 1`` is smoother.
- ``Constant(rate_rps)``: one request every ``1 / rate`` seconds.
- ``Piecewise(segments)``: a Poisson process whose rate changes over time, ``[(duration_s,
  rate_rps), ...]``; the last rate continues after the last segment. Drawn by mapping a unit-rate
  process through the inverse of the cumulative rate (exact, no thinning); a zero-rate
  segment gets no arrivals.

Every process has ``scaled(factor)``, the same process at ``factor`` times the rate (how
conversation starts are derived from a request rate), and ``with_lead_in(seconds)``, the process
begun earlier so a warm-up does not shift a time-varying schedule. ``parse_arrivals("gamma:cv=4",
rate_rps=2.0)`` builds one from the CLI's ``--arrival`` and ``--rate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


def _positive(name: str, value: float) -> None:
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True)
class _Stationary:
    """What the processes with one constant rate share."""

    rate_rps: float

    def __post_init__(self) -> None:
        _positive("arrival rate (requests/s)", self.rate_rps)

    @property
    def mean_rate_rps(self) -> float:
        return self.rate_rps

    def with_lead_in(self, duration_s: float):
        """The process for a start ``duration_s`` earlier (a stationary process is unchanged)."""
        return self

    def scaled(self, factor: float):
        return replace(self, rate_rps=self.rate_rps * factor)


@dataclass(frozen=True)
class Poisson(_Stationary):
    def times(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate_rps, count))

    def describe(self) -> str:
        return f"Poisson {self.rate_rps:g}/s"


@dataclass(frozen=True)
class Gamma(_Stationary):
    cv: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("coefficient of variation cv", self.cv)

    def times(self, count: int, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return np.cumsum(rng.gamma(shape, 1.0 / (self.rate_rps * shape), count))

    def describe(self) -> str:
        return f"gamma {self.rate_rps:g}/s cv={self.cv:g}"


@dataclass(frozen=True)
class Constant(_Stationary):
    def times(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.arange(1, count + 1) / self.rate_rps

    def describe(self) -> str:
        return f"constant {self.rate_rps:g}/s"


@dataclass(frozen=True)
class Piecewise:
    segments: tuple[tuple[float, float], ...]  # (duration_s, rate_rps), in order

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a piecewise rate needs at least one (duration_s, rate_rps) segment")
        for duration, rate in self.segments:
            _positive("segment duration (s)", duration)
            if not np.isfinite(rate) or rate < 0:
                raise ValueError(f"segment rate must be >= 0 requests/s, got {rate}")
        _positive("the last segment's rate (it continues after the last segment)", self.segments[-1][1])

    def times(self, count: int, rng: np.random.Generator) -> np.ndarray:
        durations = np.array([d for d, _ in self.segments], dtype=np.float64)
        rates = np.array([r for _, r in self.segments], dtype=np.float64)
        edges_s = np.r_[0.0, np.cumsum(durations)]
        cumulative = np.r_[0.0, np.cumsum(durations * rates)]  # expected arrivals by each edge
        unit = np.cumsum(rng.exponential(1.0, count))  # a unit-rate Poisson process
        # unit value u falls in segment i when cumulative[i] < u <= cumulative[i + 1]; a
        # zero-rate segment has an empty such interval, so it never receives an arrival. Past
        # the last edge the last segment's rate continues (the same formula, i = last).
        segment = np.minimum(np.searchsorted(cumulative, unit, side="left") - 1, len(rates) - 1)
        return edges_s[segment] + (unit - cumulative[segment]) / rates[segment]

    def describe(self) -> str:
        return "piecewise " + ", ".join(f"{d:g}s@{r:g}/s" for d, r in self.segments)

    def with_lead_in(self, duration_s: float) -> Piecewise:
        """The process started ``duration_s`` earlier at its first segment's rate, so that after
        the lead-in its segments fall where they were (a warm-up before a trace's 0)."""
        if duration_s <= 0:
            return self
        return Piecewise(((duration_s, self.segments[0][1]), *self.segments))

    def scaled(self, factor: float) -> Piecewise:
        return Piecewise(tuple((duration, rate * factor) for duration, rate in self.segments))

    @property
    def mean_rate_rps(self) -> float:
        return sum(d * r for d, r in self.segments) / sum(d for d, _ in self.segments)


ARRIVALS = ("poisson", "gamma", "constant", "piecewise")


def parse_arrivals(text: str | None, *, rate_rps: float | None):
    """``poisson`` (also for None) | ``gamma:cv=C`` | ``constant``, each at ``rate_rps``; or
    ``piecewise:DUR@RATE,DUR@RATE,...``, whose segments give the rates (no ``rate_rps``)."""
    kind, _, args = (text or "poisson").strip().partition(":")
    if kind == "piecewise":
        if rate_rps is not None:
            raise ValueError("piecewise arrivals set their own rates (DURATION_S@RATE); leave out --rate")
        segments = []
        for part in filter(None, (p.strip() for p in args.split(","))):
            duration, at, rate = part.partition("@")
            try:
                segments.append((float(duration), float(rate)))
            except ValueError:
                raise ValueError(f"--arrival piecewise: expected DURATION_S@RATE, got {part!r}") from None
        return Piecewise(tuple(segments))
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival process {kind!r} (choose from {', '.join(ARRIVALS)})")
    if rate_rps is None:
        raise ValueError(f"{kind} arrivals need --rate (requests/s)")
    if kind == "gamma":
        options = dict(p.split("=", 1) for p in args.split(",") if "=" in p)
        if set(options) != {"cv"}:
            raise ValueError(f"--arrival gamma: expected gamma:cv=C, got {text!r}")
        try:
            cv = float(options["cv"])
        except ValueError:
            raise ValueError(f"--arrival gamma: cv must be a number, got {options['cv']!r}") from None
        return Gamma(rate_rps, cv)
    if args:
        raise ValueError(f"--arrival {kind} takes no options, got {text!r}")
    return Poisson(rate_rps) if kind == "poisson" else Constant(rate_rps)


def bench_arrivals(count: int, rate_rps: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times as vLLM bench's ``get_request`` (vLLM 0.33, no ramp-up) makes them for
    ``--request-rate R --burstiness B --seed S``: every request's delay drawn from a gamma
    distribution of shape B and scale 1 / (R B) (exponential for B = 1, constant 1/R for B = inf)
    with NumPy's legacy generator seeded by S, as ``np.random.seed(S)`` seeds it; cumulated from
    the first request's own delay; then rescaled so the last is sent at exactly ``count / R``.
    ``R = inf`` sends all at t=0. (The draws equal vLLM's when nothing else drew from NumPy's
    global generator after its seeding, as with the ShareGPT, random and custom datasets.)"""
    if count < 1:
        raise ValueError("bench arrivals need at least one request")
    if not rate_rps > 0:
        raise ValueError(f"--request-rate must be > 0 (or inf), got {rate_rps}")
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if math.isinf(rate_rps):
        return np.zeros(count)
    if math.isinf(burstiness):
        delays = np.full(count, 1.0 / rate_rps)
    else:
        delays = np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / (rate_rps * burstiness), size=count)
    times = np.cumsum(delays)
    if times[-1] != 0:
        times = times * ((count / rate_rps) / times[-1])
    return times
