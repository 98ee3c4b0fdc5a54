"""Pages over request rate: the throughput-latency curve and goodput against offered load.

A *curve* is one setting (config without its rate and seed) run at two or more request rates.
Each point is the setting's mean over seeds at one rate; its marker says the regime
(``pagesim.reports.load``): circle below saturation, square near, cross past. The throughput-latency
panels mark the Pareto front over all points (no other point has both more throughput and less
latency). Settings run at a single rate are named in the caption as elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pagesim.reports.load import run_load
from pagesim.reports.noise import estimate
from pagesim.reports.results import RATE_AXES, Study, metric
from pagesim.reports.run_config import SEED, value_label
from pagesim.reports.style import Page, from_zero, legend_rows, new_page, page_legend, plain_ticks

MARKERS = {"below": "o", "near": "s", "past": "X", "unknown": "d"}


def _curve_key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if k not in (*RATE_AXES, SEED)}, sort_keys=True)


def curves(study: Study) -> tuple[list[dict[str, Any]], int]:
    """The settings run at 2+ rates, each {label, points: [{rate, runs}]}; and the runs left out."""
    groups: dict[str, dict[float, list]] = {}
    for r in study.ok:
        offered = run_load(r).offered_rps
        if offered is None:
            continue
        by_rate = groups.setdefault(_curve_key(r["config"]), {})
        rate_key = (r["config"].get("rate"), r["config"].get("rate_scale"))
        by_rate.setdefault(rate_key, []).append(r)
    kept = {k: v for k, v in groups.items() if len(v) >= 2}
    configs = [json.loads(k) for k in kept]
    differ = [k for k in (configs[0] if configs else {}) if k != "source"
              and len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]
    out = []
    for key, config in zip(kept, configs):
        label = ", ".join(f"{k}={value_label(config.get(k))}" for k in differ)
        points = []
        for runs in kept[key].values():
            loads = [run_load(r) for r in runs]
            regimes = {ld.regime for ld in loads}
            points.append({"rate": float(np.mean([ld.offered_rps for ld in loads])), "runs": runs,
                           "regime": max(regimes, key=["unknown", "below", "near", "past"].index)})
        points.sort(key=lambda p: p["rate"])
        out.append({"label": label or "base settings", "points": points})
    left_out = len(study.ok) - sum(len(p["runs"]) for c in out for p in c["points"])
    return out, left_out


def _mean(runs: list, key: str) -> float | None:
    est = estimate([metric(r, key) for r in runs])
    return None if est is None else est.mean


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both: more throughput (x) and less latency (y)."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return sorted(front)


def _left_out_words(left_out: int) -> str:
    return (f" The other {left_out} completed run(s) were run at one rate only; they are in the all-runs table and "
            "the grid pages." if left_out else " Every completed run is on this page.")


def throughput_latency_page(study: Study) -> Page | None:
    series, left_out = curves(study)
    if not series:
        return None
    title = "Throughput vs tail latency as the request rate grows"
    caption = ("Each line is one setting at increasing request rates: p99 time to first token and p99 end-to-end "
               "latency against the throughput achieved. Up and to the right is saturation: throughput stops "
               "growing while latency climbs. Marker: circle below saturation, square near, cross past; the dashed "
               "line is the Pareto front over all points." + _left_out_words(left_out))
    fig, panels = new_page(title, caption, legend_rows=legend_rows(len(series) + 4))
    for ax, key, label in zip(panels, ("ttft_s.p99", "e2e_s.p99"), ("TTFT p99 (s)", "E2E p99 (s)")):
        everything = []
        for k, curve in enumerate(series):
            xy = [(_mean(p["runs"], "throughput_tokens_s"), _mean(p["runs"], key), p["regime"]) for p in curve["points"]]
            xy = [p for p in xy if p[0] is not None and p[1] is not None]
            color = f"C{k % 10}"
            ax.plot([p[0] for p in xy], [p[1] for p in xy], color=color, label=curve["label"])
            for x, y, regime in xy:
                ax.scatter([x], [y], marker=MARKERS[regime], color=color, s=36, zorder=3)
            everything += [(x, y) for x, y, _ in xy]
        front = pareto(everything)
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1.2, label="Pareto front", zorder=4)
        ax.set(xlabel="throughput (output tokens/s)", ylabel=label, title=label.split(" (")[0])
        ax.grid(alpha=0.3)
        from_zero(ax, x=True)
        plain_ticks(ax)
        plain_ticks(ax, "x")
    _regime_handles(panels[0])
    page_legend(fig, panels)
    return Page(title, caption, fig)


def _regime_handles(ax) -> None:
    for regime in ("below", "near", "past"):
        ax.scatter([], [], marker=MARKERS[regime], color="#495057", label=f"{regime} saturation")


def _slo_words(study: Study) -> str:
    for r in study.ok:
        slo = (r.get("summary") or {}).get("slo") or {}
        parts = []
        if slo.get("ttft_s") is not None:
            parts.append(f"TTFT ≤ {slo['ttft_s']:g} s")
        if slo.get("tpot_s") is not None:
            parts.append(f"TPOT ≤ {slo['tpot_s'] * 1e3:g} ms")
        if slo.get("e2e_s") is not None:
            parts.append(f"E2E ≤ {slo['e2e_s']:g} s")
        if parts:
            return " and ".join(parts)
    return "no SLO recorded"


def goodput_page(study: Study) -> Page | None:
    series, left_out = curves(study)
    if not series:
        return None
    slo = _slo_words(study)
    title = "Goodput vs request rate"
    caption = (f"Requests per second that met the SLO ({slo}) against the rate offered, and the share of requests "
               "that met it. Below saturation goodput follows the offered rate (dotted line); past it, goodput "
               "flattens or falls." + _left_out_words(left_out))
    fig, panels = new_page(title, caption, legend_rows=legend_rows(len(series) + 4))
    a, b = panels
    top = 0.0
    for k, curve in enumerate(series):
        color = f"C{k % 10}"
        pts = [(p["rate"], _mean(p["runs"], "goodput_rps"), _mean(p["runs"], "slo.attained"), p["regime"])
               for p in curve["points"]]
        good = [(x, g, reg) for x, g, _, reg in pts if g is not None]
        share = [(x, s * 100, reg) for x, _, s, reg in pts if s is not None]
        for ax, xy in ((a, good), (b, share)):
            ax.plot([p[0] for p in xy], [p[1] for p in xy], color=color, label=curve["label"])
            for x, y, regime in xy:
                ax.scatter([x], [y], marker=MARKERS[regime], color=color, s=36, zorder=3)
        top = max([top] + [p["rate"] for p in curve["points"]])
    a.plot([0, top], [0, top], ":", color="#868e96", label="goodput = offered rate")
    a.text(0.02, 0.97, f"SLO: {slo}", transform=a.transAxes, va="top", fontsize=8.5,
           bbox={"facecolor": "white", "edgecolor": "#ced4da"})
    a.set(xlabel="offered request rate (requests/s)", ylabel="goodput (requests/s meeting the SLO)", title="Goodput")
    b.set(xlabel="offered request rate (requests/s)", ylabel="requests meeting the SLO (%)", title="SLO attainment")
    b.set_ylim(0, 105)
    for ax in panels:
        ax.grid(alpha=0.3)
        from_zero(ax, x=True, y=ax is a)
        plain_ticks(ax, "x")
    _regime_handles(a)
    page_legend(fig, panels)
    return Page(title, caption, fig)
