"""Is a difference real? Runs judged against what changing only the seed changes.

A study that lists seeds (``seed = [0, 1, 2]`` in ``[base]`` or a grid) repeats every setting once
per seed; each metric of a setting is then the mean of its runs with a 95% confidence interval
(Student's t, ``n - 1`` degrees of freedom), and two settings differ only where their intervals
separate. A setting run once has no interval: two such settings differ only where the relative
difference exceeds a stated threshold (``DEFAULT_THRESHOLD``, 2%; for fractions such as a hit
rate, the threshold is in percentage points, since 0.1% vs 0.2% is a doubling of nothing).

Invariants: an ``Estimate`` of n values has ``half_width is None`` iff n == 1; ``compare`` is
antisymmetric (``compare(a, b) == -compare(b, a)``) and never calls identical values different;
seeds that give identical values (zero spread) are judged by the threshold, never by a zero-width
interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_THRESHOLD = 0.02

# Student's t, two-sided 95%, by degrees of freedom (1-30); beyond 30 the normal's 1.96 is within 4%.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(dof: int) -> float:
    if dof < 1:
        raise ValueError(f"a confidence interval needs at least 2 values (dof >= 1), got dof={dof}")
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


@dataclass(frozen=True, slots=True)
class Estimate:
    """A metric of one setting: the mean over its seeds and, with 2 or more, the 95% half-width."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float:
        return self.mean - (self.half_width or 0.0)

    @property
    def high(self) -> float:
        return self.mean + (self.half_width or 0.0)


def estimate(values: list[float]) -> Estimate | None:
    """Mean and 95% interval of ``values`` (None when there are none)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, None, 1)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Estimate(mean, t95(n - 1) * math.sqrt(var / n), n)


def relative_difference(a: float, b: float, *, fraction: bool = False) -> float:
    """|a - b| relative to the larger magnitude; for fractions (0..1), in absolute points."""
    if fraction:
        return abs(a - b)
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def compare(a: Estimate, b: Estimate, *, threshold: float = DEFAULT_THRESHOLD, fraction: bool = False) -> int:
    """+1 if ``a`` is measurably above ``b``, -1 if below, 0 for "no measurable difference".

    With intervals on both sides (seeds), the intervals must separate; with one, the other side's
    single value must lie outside it (and beyond the threshold); with none, or seeds whose runs
    came out identical (a trace replayed at its own timestamps ignores the seed), the difference
    must exceed ``threshold`` (relative, or points for a fraction)."""
    spread = [e for e in (a, b) if e.half_width is not None and e.half_width > 1e-9 * max(abs(e.mean), 1e-12)]
    if len(spread) == 2:  # both seeded: the intervals must separate
        if a.low > b.high:
            return 1
        if b.low > a.high:
            return -1
        return 0
    if len(spread) == 1:  # one seeded, one single run: the single value must lie outside the interval
        seeded, single = spread[0], (b if spread[0] is a else a)
        if seeded.low <= single.mean <= seeded.high:
            return 0
    # no spread on either side (one run each, or seeds that changed nothing): the threshold decides
    if relative_difference(a.mean, b.mean, fraction=fraction) <= threshold:
        return 0
    return 1 if a.mean > b.mean else -1


def rule_words(seeded: bool, threshold: float) -> str:
    """The rule a comparison rests on, in words, for captions and findings."""
    if seeded:
        return "means over seeds; a difference counts only where the 95% intervals separate"
    return (f"one run per setting (no seeds); differences up to {threshold:.0%} (relative; percentage points for "
            "rates) count as no measurable difference, and larger ones are not tested against what changing the seed "
            "changes (list seed = [0, 1, 2] in [base] for that)")
