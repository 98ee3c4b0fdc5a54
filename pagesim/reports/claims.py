"""The pieces a finding is made of, shared by every kind of finding (``pagesim.reports.findings``,
``pagesim.reports.offload``).

- ``rank``: settings ranked on one metric, best first, with those within noise of the best
  (``pagesim.reports.noise``) as ``Ranking.tied``;
- ``compared``: how one value compares with another, in words with plain numbers;
- ``Finding``: what one axis (or one offload sweep) changes: a head naming the axis, its values
  and the runs, and one claim per metric;
- the phrases a head is written with: ``runs_words`` ("3 runs"), ``regime_words`` (the runs' rates
  and load regimes, ``pagesim.reports.load``, each run keyed by its rate: ``rate_key``) and
  ``or_words`` ("a, b or c").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagesim.reports.load import REGIMES, nominal_rps, run_load
from pagesim.reports.noise import Estimate, compare
from pagesim.reports.results import Metric, Setting
from pagesim.sim.output import plain


@dataclass
class Ranking:
    """Settings ranked on one metric: ``best`` first; ``tied`` the others within noise of it."""

    metric: Metric
    scored: list[tuple[Setting, Estimate]]  # best first
    tied: list[tuple[Setting, Estimate]]  # within noise of the best (the best itself excluded)

    @property
    def all_tied(self) -> bool:
        return len(self.tied) == len(self.scored) - 1

    @property
    def unique(self) -> bool:
        return not self.tied


def rank(group: list[Setting], metric: Metric, threshold: float) -> Ranking | None:
    scored = [(s, e) for s in group if (e := s.estimate(metric.key)) is not None]
    if len(scored) < 2:
        return None
    scored.sort(key=lambda se: se[1].mean, reverse=metric.better == "max")
    best = scored[0][1]
    tied = [(s, e) for s, e in scored[1:] if compare(e, best, threshold=threshold, fraction=metric.fraction) == 0]
    return Ranking(metric, scored, tied)


def compared(metric: Metric, a: float, b: float, other: str | None = None) -> str:
    """How ``a`` compares with ``b``, in words with plain numbers, ``other`` naming what ``b`` is
    ("the next", "the best"; ``None``: left unsaid, as in "x -> y (60% higher)"). A rate's gap is
    in percentage points; otherwise "2.5x the next" from twice as high on, "60% higher than the
    next" below that, "60% lower than the next" for anything lower (never "0x": 0 against a
    positive ``b`` is 100% lower); and "12 against 0 for the next" when ``b`` is 0. Digits
    enough to compare with a 2% threshold."""
    than = f" than {other}" if other else ""
    if metric.fraction:
        return f"{plain(abs(a - b) * 100, 2)} points {'higher' if a > b else 'lower'}{than}"
    if a == b:
        return f"equal to {other}" if other else "no change"
    if b == 0:
        return f"{metric.with_unit(a)} against 0{f' for {other}' if other else ''}"
    if a > b and b > 0 and a >= 2 * b:
        return f"{plain(a / b, 3)}x {other}" if other else f"{plain(a / b, 3)}x"
    rel = abs(a - b) / abs(b)  # relative to the value compared with
    if rel > 1:  # (a sign change: a ratio or a percentage would mislead)
        return f"{metric.with_unit(a)} against {metric.with_unit(b)}{f' for {other}' if other else ''}"
    percent = f"{rel:.{2 if rel < 0.1 else 1}%}"
    return f"{percent} {'higher' if a > b else 'lower'}{than}"


@dataclass
class Finding:
    """What one axis changes: ``head`` names the axis, its values and the runs; ``claims`` one per metric."""

    head: str
    claims: list[str]

    @property
    def sentence(self) -> str:
        return f"{self.head}: {'; '.join(self.claims)}."


def regime_words(records: list[dict[str, Any]]) -> str:
    """E.g. "at 6.41 requests/s, all past saturation" for the runs a comparison rests on."""
    loads = [run_load(r) for r in records]
    rates = sorted({k for r in records if (k := rate_key(r)) is not None})
    counts = {k: sum(ld.regime == k for ld in loads) for k in REGIMES}
    counts = {k: v for k, v in counts.items() if v}
    words = {k: (f"{k} saturation" if k != "unknown" else "of unknown load") for k in counts}
    if len(counts) == 1:
        regime = f"all {words[next(iter(counts))]}"
    else:
        regime = ", ".join(f"{v} {words[k]}" for k, v in counts.items())
    at = f"at {', '.join(plain(r, 3) for r in rates)} requests/s, " if rates else ""
    return at + regime


def rate_key(record: dict[str, Any]) -> float | None:
    """The rate a run is grouped by: its nominal rate, else the rate it offered as drawn; ``None``
    where neither is known."""
    nominal = nominal_rps(record)
    if nominal is not None:
        return round(nominal, 6)
    offered = run_load(record).offered_rps
    return round(offered, 3) if offered else None


def runs_words(n: int) -> str:
    """E.g. "1 run", "3 runs"."""
    return f"{n} run" if n == 1 else f"{n} runs"


def or_words(words: list[str]) -> str:
    """E.g. "a, b or c"."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
