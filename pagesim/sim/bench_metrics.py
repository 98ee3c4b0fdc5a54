"""Latency and throughput figures as vLLM bench defines them (vLLM 0.33 ``benchmarks/serve.py``,
``calculate_metrics``), computed from per-request arrays so the simulator, the engine and
``pagesim compare`` share one definition.

- TTFT: first token - send time; E2EL: last token - send time; TPOT: (E2EL - TTFT) / (output
  tokens - 1) over requests with at least two tokens; ITL: every gap between two consecutive
  tokens of a request (weighted values here: ``pagesim.sim.token_runs``).
- Each is reported with mean, median, std (population, NumPy's default) and the asked
  percentiles (NumPy's linear interpolation, on the weighted values exactly as on the expanded
  list: ``weighted_percentile``).
- Goodput (``--goodput ttft:MS tpot:MS e2el:MS``): completed requests meeting every SLO given, per
  second; a request with one output token has TPOT 0 for this test, as vLLM counts it. A rejected
  request never meets an SLO, and every share of requests is over all requests submitted.
- ``max_concurrent_requests`` has two meanings, kept apart. vLLM 0.33's (``calculate_metrics``,
  serve.py:701-753), under that key in the result file: over successful requests, seconds are
  counted from the first send, a request counts in every whole second from the one it was sent in
  to the one it finished in, and the figure is the most requests counted in one second
  (``concurrent_per_second_bucket``). It exceeds the number in flight at once whenever requests
  come and go within a second: a closed loop of 8 whose requests take 0.5 s counts about 16 per
  second. pagesim's, in its summaries (``--json``) and as ``pagesim.max_concurrent_requests_exact``
  in the result file: the exact peak of requests in flight (sent, not yet finished), a sweep over
  send and finish times (a finish and a send at one instant: the finish first;
  ``peak_in_flight``).
- ``max_output_tokens_per_s``: vLLM's: token events bucketed by whole seconds since the first send.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def percentile_key(p: float) -> str:
    """vLLM's name for a percentile: ``p99``, ``p99.9``."""
    return f"p{int(p)}" if float(p) == int(p) else f"p{p:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``--metric-percentiles 50,90,99``: numbers in (0, 100]."""
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--metric-percentiles takes numbers such as 50,90,99, got {part!r}") from None
        if not 0 < value <= 100:
            raise ValueError(f"--metric-percentiles: {part} is not in (0, 100]")
        values.append(value)
    return tuple(dict.fromkeys(values))


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """``--percentile-metrics ttft,tpot,itl,e2el``."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [n for n in names if n not in PERCENTILE_METRICS]
    if unknown or not names:
        raise ValueError(f"--percentile-metrics takes some of {','.join(PERCENTILE_METRICS)}, got {text!r}")
    return names


@dataclass(frozen=True)
class Slo:
    """Goodput SLOs in seconds (``None``: not asked)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2el_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ValueError(f"an SLO must be a positive, finite time (got {name.removesuffix('_s')} {value})")

    @classmethod
    def parse(cls, items: list[str]) -> Slo:
        """vLLM's ``--goodput ttft:MS tpot:MS e2el:MS`` (milliseconds)."""
        given = {}
        for item in items:
            name, sep, value = item.partition(":")
            name = name.strip().lower()
            if not sep or name not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"--goodput takes KEY:MILLISECONDS with KEY one of ttft, tpot, e2el; got {item!r}")
            try:
                ms = float(value)
            except ValueError:
                raise ValueError(f"--goodput {name}: {value!r} is not a number of milliseconds") from None
            if not 0 < ms < float("inf"):
                raise ValueError(f"--goodput {name}: an SLO must be a positive number of milliseconds, got {value}")
            given[f"{name}_s"] = ms / 1000.0
        return cls(**given)

    def describe(self) -> str:
        parts = [f"{label} <= {value:g} s" for label, value in
                 (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2EL", self.e2el_s)) if value is not None]
        return " and ".join(parts) if parts else "no SLO"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("ttft_s", "tpot_s", "e2el_s") if getattr(self, k) is not None}

    def meets(self, ttft_s: np.ndarray, tpot_s: np.ndarray, e2el_s: np.ndarray) -> np.ndarray:
        """Which completed requests meet every SLO (``tpot_s`` NaN for one-token requests: 0)."""
        ok = np.ones(len(ttft_s), bool)
        if self.ttft_s is not None:
            ok &= ttft_s <= self.ttft_s
        if self.tpot_s is not None:
            ok &= np.nan_to_num(tpot_s, nan=0.0) <= self.tpot_s
        if self.e2el_s is not None:
            ok &= e2el_s <= self.e2el_s
        return ok


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """``np.percentile(np.repeat(values, weights), q)`` (linear interpolation) without repeating."""
    return weighted_percentiles(values, weights, [q])[0]


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """``weighted_percentile`` at each of ``qs``, sorting once (the values can be a long run's
    millions of inter-token gaps). NOTE: the sort need not be stable: values that tie are equal,
    so every position among them reads the same value (and the weights before them sum the same)."""
    order = np.argsort(values)
    w = weights[order]
    keep = w > 0
    if keep.all():
        v = values[order]
    else:
        v, w = values[order][keep], w[keep]
    del order, keep
    total = int(w.sum())
    if total == 0:
        raise ValueError("no values")
    ends = np.cumsum(w)  # element k of the expanded list is v[searchsorted(ends, k, 'right')]
    del w
    out = []
    for q in qs:
        position = (total - 1) * q / 100.0
        lo = int(np.floor(position))
        hi = min(lo + 1, total - 1)
        v_lo = v[int(np.searchsorted(ends, lo, side="right"))]
        v_hi = v[int(np.searchsorted(ends, hi, side="right"))]
        out.append(float(v_lo + (v_hi - v_lo) * (position - lo)))
    return out


def latency_stats(values, percentiles=DEFAULT_PERCENTILES, weights=None) -> dict[str, float | None]:
    """Mean, median, std and ``p<q>`` of the finite ``values`` (seconds), optionally weighted by
    integer counts; ``None`` for each when there are none."""
    values = np.asarray(values, dtype=float)
    weights = np.ones(len(values), np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    finite = np.isfinite(values) & (weights > 0)
    if not finite.all():
        values, weights = values[finite], weights[finite]
    del finite
    keys = ["mean", "median", "std", *(percentile_key(p) for p in percentiles)]
    if values.size == 0:
        return dict.fromkeys(keys)
    mean = float(np.average(values, weights=weights))
    std = float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))
    median, *rest = weighted_percentiles(values, weights, [50.0, *percentiles])
    out = {"mean": _r(mean), "median": _r(median), "std": _r(std)}
    for p, value in zip(percentiles, rest):
        out[percentile_key(p)] = _r(value)
    return out


def _r(x: float) -> float:
    """Round for reports: 6 significant digits keep summaries stable and readable."""
    return float(f"{float(x):.6g}")


def peak_in_flight(start_s: np.ndarray, finish_s: np.ndarray) -> int:
    """The most requests in flight at once (``[start, finish)`` intervals; finishes first at ties)."""
    if len(start_s) == 0:
        return 0
    times = np.concatenate((finish_s, start_s))
    deltas = np.concatenate((np.full(len(finish_s), -1), np.full(len(start_s), 1)))
    order = np.lexsort((deltas, times))  # by time, then -1 before +1
    return int(np.max(np.cumsum(deltas[order])))


def per_second_buckets(origin_s: float, end_s: float) -> int:
    """vLLM's number of one-second buckets from the first send to the last finish."""
    return int(np.ceil(end_s - origin_s)) + 1


def max_tokens_per_second(token_times_s: np.ndarray, token_counts: np.ndarray, origin_s: float, end_s: float) -> float:
    """vLLM's ``max_output_tokens_per_s``: token events in whole seconds since ``origin_s``."""
    if len(token_times_s) == 0:
        return 0.0
    buckets = per_second_buckets(origin_s, end_s)
    index = (token_times_s - origin_s).astype(np.int64)
    ok = (index >= 0) & (index < buckets)
    return float(np.bincount(index[ok], weights=token_counts[ok], minlength=buckets).max())


def concurrent_per_second_bucket(start_s: np.ndarray, finish_s: np.ndarray) -> int:
    """vLLM 0.33's ``max_concurrent_requests``: requests active in each whole second since the first
    send (sent in it, finished in it, or running through it), the most of any second."""
    if len(start_s) == 0:
        return 0
    origin = float(start_s.min())
    buckets = per_second_buckets(origin, float(finish_s.max()))
    first = (start_s - origin).astype(np.int64)
    last = (finish_s - origin).astype(np.int64)
    counts = np.zeros(buckets + 1, np.int64)
    np.add.at(counts, first, 1)
    np.add.at(counts, last + 1, -1)
    return int(np.cumsum(counts[:-1]).max())
