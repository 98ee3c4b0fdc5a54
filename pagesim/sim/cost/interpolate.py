"""Predicting one profile table at any point: multilinear interpolation inside the measured grid,
a fitted roofline form outside it.

**Inside** (every coordinate within its axis's measured range): multilinear interpolation of the
grid's medians (linear along each axis between the two neighbouring grid values, combined over
the 2^d corners of the enclosing cell). An axis measured at a single value is inside only at
that value. Costs are close to affine in the work between neighbouring grid points, so linear
interpolation in the raw axis values (not their logs) is what keeps the error small.

**Outside**: the roofline form of the table, a sum of work features with fitted non-negative
seconds per unit (``FEATURES``: a fixed cost, a cost per token, per sequence, per K/V token read,
per block ...), fitted by least squares on the *relative* error of every raw sample. Within one
regime (compute-bound or memory-bound) a roofline's time is affine in the work, which is what
these features state; extrapolating far beyond the grid may cross a regime the grid never saw,
which is why the cost model counts and reports each use of the fit.

Evaluation is pure Python over precomputed lists (a few microseconds), as the simulator asks for
several tables every step.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np

from pagesim.sim.cost.profile import Table

Feature = Callable[[tuple[float, ...]], float]


def _per_block(x):  # decode: (block_size, seqs, context)
    bs, seqs, ctx = x
    return seqs * math.ceil(ctx / bs) if bs > 0 else 0.0


#: Roofline-form features per table (each a function of the grid point); a constant is always added.
FEATURES: dict[str, tuple[Feature, ...]] = {
    "dense_layer": (lambda x: x[0],),
    "model_outer": (lambda x: x[0],),
    "lm_head": (lambda x: x[0],),
    "cache_write": (lambda x: x[0],),
    "decode_attention": (lambda x: x[1], lambda x: x[1] * x[2], _per_block),
    "prefill_attention": (lambda x: x[0], lambda x: x[0] * (x[1] + (x[0] + 1) / 2), lambda x: x[0] + x[1]),
    "cow_copy": (lambda x: x[1], lambda x: x[1] * x[0]),
    "swap_out": (lambda x: x[1], lambda x: x[1] * x[0]),
    "swap_in": (lambda x: x[1], lambda x: x[1] * x[0]),
    "sampling": (lambda x: x[0],),
    "batch_prep": (lambda x: x[0],),
    "policy": (lambda x: x[0],),
}


def fit_roofline(table: Table) -> tuple[float, ...]:
    """Non-negative coefficients ``(constant, *per feature)`` minimising the relative squared error
    over every raw sample (``_nnls``)."""
    features = FEATURES[table.name]
    rows, targets = [], []
    for point, samples in zip(table.points(), table.samples_s):
        f = [1.0, *(feat(point) for feat in features)]
        for y in samples:
            if y > 0:
                rows.append([v / y for v in f])  # divide by y: the residual is relative
                targets.append(1.0)
    if not rows:
        return (0.0,) * (len(features) + 1)
    a = np.asarray(rows)
    b = np.asarray(targets)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)  # columns of very different sizes
    coef = _nnls(a / scale, b) / scale
    return tuple(float(c) for c in coef)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with the coefficients kept >= 0: solve, drop the features that came out
    negative, solve again (each pass drops at least one, so it ends; small systems)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[active] = sol
            break
        active = [i for i, v in zip(active, sol) if v > 0]
    return x


class TableModel:
    """One table's predictor: ``predict(point) -> (seconds, inside_grid)``."""

    def __init__(self, table: Table):
        self.table = table
        self.grid = [list(g) for g in table.grid]
        self.values = list(table.median_s)
        self.strides = [math.prod(len(g) for g in self.grid[i + 1:]) for i in range(len(self.grid))]
        self.coef = fit_roofline(table)
        self._features = FEATURES[table.name]

    def roofline(self, point: tuple[float, ...]) -> float:
        c = self.coef
        return max(0.0, c[0] + sum(ci * f(point) for ci, f in zip(c[1:], self._features)))

    def predict(self, point: tuple[float, ...]) -> tuple[float, bool]:
        corners: list[tuple[int, float]] = [(0, 1.0)]  # (flat index, weight)
        for axis, x in enumerate(point):
            g = self.grid[axis]
            if x < g[0] or x > g[-1]:
                return self.roofline(point), False
            stride = self.strides[axis]
            if len(g) == 1 or x == g[-1]:
                i, w = len(g) - 1, 0.0
            else:
                i = bisect.bisect_right(g, x) - 1
                w = (x - g[i]) / (g[i + 1] - g[i])
            new = []
            for flat, weight in corners:
                if w < 1.0:
                    new.append((flat + i * stride, weight * (1.0 - w)))
                if w > 0.0:
                    new.append((flat + (i + 1) * stride, weight * w))
            corners = new
        values = self.values
        return sum(values[flat] * weight for flat, weight in corners), True
