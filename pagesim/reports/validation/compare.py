"""How far apart two runs of the same workload are: decision logs, step times, latency distributions.

Definitions (``sim`` is the prediction, ``ref`` the engine's measurement; relative errors are
``(sim - ref) / ref``, reported signed, so +0.02 means the simulator says 2% more):

- **decision logs**: identical when every step's record is equal; otherwise the first step that
  differs, with both records;
- **step time**: ``step_time_mape`` = mean over the engine's steps of |predicted - measured| /
  measured, where predicted is the cost model's time for the step the engine actually ran (its
  own ``SchedulerOutput``), so batching differences cannot hide or add error;
- **latencies** (TTFT, TPOT, end-to-end; ``pagesim.sim.metrics`` definitions): ``mape`` pairs each
  request's two values; ``mean_error``, ``p50_error``, ``p99_error`` compare the distributions'
  statistics; ``ks`` is the two-sample Kolmogorov-Smirnov statistic (the largest gap between the
  two empirical CDFs: 0 = the same distribution, 1 = disjoint);
- **throughput**: completed requests (``throughput_rps``) and generated tokens (``throughput_tokens_s``)
  per second of the run's duration, the names ``simulate`` and ``run`` use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pagesim.sim.metrics import COMPLETED, RequestMetrics


def _r(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(f"{float(x):.4g}")


def relative_error(sim: float | None, ref: float | None) -> float | None:
    if sim is None or ref is None or not np.isfinite(sim) or not np.isfinite(ref) or ref == 0:
        return None
    return _r((sim - ref) / ref)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sample Kolmogorov-Smirnov statistic: sup over x of |F_a(x) - F_b(x)|."""
    a, b = np.sort(a[np.isfinite(a)]), np.sort(b[np.isfinite(b)])
    if not len(a) or not len(b):
        return None
    xs = np.concatenate([a, b])
    fa = np.searchsorted(a, xs, side="right") / len(a)
    fb = np.searchsorted(b, xs, side="right") / len(b)
    return _r(float(np.abs(fa - fb).max()))


def first_difference(sim_log: Sequence[dict], engine_log: Sequence[dict]) -> dict[str, Any] | None:
    """``None`` if the two logs are identical, else where and how they first differ."""
    for i, (s, e) in enumerate(zip(sim_log, engine_log)):
        if s != e:
            keys = sorted(k for k in set(s) | set(e) if s.get(k) != e.get(k))
            return {"index": i, "step": e.get("step", s.get("step")), "differing_keys": keys,
                    "simulator": s, "engine": e}
    if len(sim_log) != len(engine_log):
        i = min(len(sim_log), len(engine_log))
        return {"index": i, "step": None, "differing_keys": ["length"],
                "simulator": sim_log[i] if i < len(sim_log) else None,
                "engine": engine_log[i] if i < len(engine_log) else None,
                "lengths": {"simulator": len(sim_log), "engine": len(engine_log)}}
    return None


def step_time_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, Any]:
    ok = measured > 0
    p, m = predicted[ok], measured[ok]
    if not len(m):
        return {"steps": 0, "mape": None, "total_error": None, "median_ape": None, "p90_ape": None}
    ape = np.abs(p - m) / m
    return {"steps": int(len(m)), "mape": _r(ape.mean()), "median_ape": _r(np.median(ape)),
            "p90_ape": _r(np.percentile(ape, 90)), "total_error": relative_error(p.sum(), m.sum()),
            "measured_mean_s": _r(m.mean()), "predicted_mean_s": _r(p.mean())}


def latency_errors(sim: RequestMetrics, ref: RequestMetrics) -> dict[str, dict[str, Any]]:
    """Per latency metric: paired MAPE, errors of mean / p50 / p99, KS statistic, and both summaries."""
    both = (sim.status == COMPLETED) & (ref.status == COMPLETED)
    out = {}
    for name, fn in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s")):
        s_all, r_all = getattr(sim, fn)(), getattr(ref, fn)()
        s, r = s_all[both], r_all[both]
        paired = np.isfinite(s) & np.isfinite(r) & (r > 0)
        sf, rf = s[np.isfinite(s)], r[np.isfinite(r)]
        stats = {}
        for label, q in (("mean", None), ("p50", 50), ("p99", 99)):
            sv = (sf.mean() if q is None else np.percentile(sf, q)) if len(sf) else None
            rv = (rf.mean() if q is None else np.percentile(rf, q)) if len(rf) else None
            stats[f"{label}_error"] = relative_error(sv, rv)
            stats[f"simulator_{label}_s"] = _r(sv)
            stats[f"engine_{label}_s"] = _r(rv)
        out[name] = {
            "mape": _r((np.abs(s[paired] - r[paired]) / r[paired]).mean()) if paired.any() else None,
            **stats, "ks": ks_statistic(sf, rf), "requests": int(paired.sum()),
        }
    return out


def throughput(m: RequestMetrics) -> dict[str, float | None]:
    done = m.status == COMPLETED
    if not done.any():
        return {"throughput_rps": None, "throughput_tokens_s": None, "duration_s": None}
    duration = float(np.nanmax(m.finish_s[done]) - np.nanmin(m.arrival_s))
    if duration <= 0:
        return {"throughput_rps": None, "throughput_tokens_s": None, "duration_s": _r(duration)}
    return {"throughput_rps": _r(done.sum() / duration),
            "throughput_tokens_s": _r(m.output_tokens[done].sum() / duration),
            "duration_s": _r(duration)}


def throughput_errors(sim: RequestMetrics, ref: RequestMetrics) -> dict[str, Any]:
    s, r = throughput(sim), throughput(ref)
    return {"throughput_rps_error": relative_error(s["throughput_rps"], r["throughput_rps"]),
            "throughput_tokens_s_error": relative_error(s["throughput_tokens_s"], r["throughput_tokens_s"]),
            "simulator": s, "engine": r}
