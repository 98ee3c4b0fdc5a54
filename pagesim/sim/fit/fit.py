"""Fit the cost model's free parameters to measurements, with the simulator in the loop.

The optimizer is SciPy's bounded trust-region least squares (``scipy.optimize.least_squares``,
method ``trf``, robust ``soft_l1`` loss) over ``x = log(value / start)`` (``pagesim.sim.fit.params``),
minimizing the residuals of ``pagesim.sim.fit.objective`` summed over every training measurement. Every residual
it asks for is a simulation of every training measurement at that point; no gradient comes from
the simulator, so the Jacobian is built as follows:

1. **Forward differences** at the start of each round: one run per free parameter, each ``STEP``
   (10%) away in that parameter, all measurements at once in the worker pool; the frontend term,
   which every request's E2E and TTFT carry whole, has its column analytically
   (``objective.shift_derivative``).
2. **Broyden's rank-one update** at every point the optimizer accepts after that: the Jacobian is
   corrected by what the last step actually changed, with no further runs.

**Two fidelities** when the runs offload KV blocks (``pagesim.sim.fit.evaluate``): the optimizer
then works on the fast runs (no offloading tier, which the simulator can skip ahead through)
shifted to agree with the full runs at the round's start point (``corr``), and the point it ends
at is simulated in full; it is kept only if the full runs' residuals fell, and a new round starts
from it unless the optimizer converged and the fast runs predicted the full runs' fall in cost to
within ``AGREEMENT`` (then the new round would find the same point). With one fidelity the same holds with ``corr = 0``: each round restarts from fresh
forward differences, which Broyden's updates only approximate.

**Uncertainty**: each value's standard deviation (``value * std(x)``) is the larger of the
residuals' (``cov = s^2 (J^T W J)^-1`` at the fitted point, ``s^2`` their mean square over their
degrees of freedom) and a bootstrap's: the linearized model refitted on the rows (stages) drawn
with replacement, whose spread carries what the measurements disagree on. A parameter the
measurements do not move has an infinite one. Pairs whose estimates correlate by ``TRADED`` or
more are listed: the measurements fix a combination of the two (say, the decode step's bandwidth
share and its fixed overhead) much better than the split, which each one's deviation understates.

**Generalization**: held-out measurements are simulated at the start and at the fitted point;
leave-one-out refits without each training measurement on the linearized model about the fitted
point (within the bounds and within ``X_SCALE`` of that point, where a linear model can be
trusted) and simulates the one left out there.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pagesim.sim.fit.evaluate import FAST, FULL, Evaluator
from pagesim.sim.fit.objective import layout, residuals, shift_derivative
from pagesim.sim.fit.params import FreeParam, bounds, values

STEP = 0.1  # forward-difference step in log(value): 10%, beyond the simulator's step-level noise
X_SCALE = 0.5  # the optimizer's first trust region: about a factor e^0.5 in each parameter
SHIFT_PARAM = "frontend_in_s"
BOOTSTRAP = 200  # resamples of the rows for the uncertainty
TRADED = 0.9  # |correlation| from which two parameters are said to trade against each other
AGREEMENT = 0.1  # the fast runs' predicted fall in cost within 10% of the full runs': no further round
# A robust loss: residuals within F_SCALE (10%) count squared, larger ones about linearly, so a tail
# the model cannot produce (a measured TTFT p99 eight times the mean's share) does not pull every
# other figure after it
LOSS, F_SCALE = "soft_l1", 0.1


@dataclass
class Fold:
    """One leave-one-out fold: the measurement left out and the parameters fitted without it."""

    left_out: int  # measurement index
    values: dict[str, float]
    rows: list  # the left-out measurement simulated at ``values``


@dataclass
class FitResult:
    free: tuple[FreeParam, ...]
    train: list[int]
    holdout: list[int]
    start: dict[str, float]
    values: dict[str, float]
    std: dict[str, float]
    traded: list  # (a, b, correlation) of parameter pairs the measurements fix together better than apart
    cost_before: float
    cost_after: float
    rows_before: dict[int, list]  # measurement index -> rows at the start (training and held out)
    rows_after: dict[int, list]  # and at the fitted point
    folds: list[Fold] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    wall_s: float = 0.0  # the whole command's fit, held-out runs and folds included
    fit_s: float = 0.0  # to the fitted values and their uncertainty
    simulations: dict[str, int] = field(default_factory=dict)
    num_residuals: int = 0


def fit(ev: Evaluator, train: list[int], holdout: list[int], free: tuple[FreeParam, ...], *, rounds: int = 2,
        max_nfev: int = 12, leave_one_out: bool = True, log=lambda line: None) -> FitResult:
    """Fit ``free`` to the measurements ``train`` (indices into ``ev``); see the module docstring."""
    from scipy.optimize import least_squares

    started = time.perf_counter()
    lb, ub = bounds(free)
    names = [p.name for p in free]
    shift = names.index(SHIFT_PARAM) if SHIFT_PARAM in names else None

    def rows_at(x, fidelity, indices):
        return ev.rows([(i, fidelity, values(free, x)) for i in indices])

    x = np.zeros(len(free))
    start_rows = rows_at(x, FULL, train + holdout)  # (one batch: the held-out "before" runs in parallel too)
    rows_full = start_rows[:len(train)]
    terms = [layout(rows) for rows in rows_full]

    def vec(rows_list) -> np.ndarray:
        return np.concatenate([residuals(rows, t) for rows, t in zip(rows_list, terms)])

    r_full = vec(rows_full)
    cost_before = _cost(r_full)
    log(f"start: cost {cost_before:.4g} over {len(r_full)} residuals of {len(train)} measurement(s)")
    fit_rounds = []
    for round_no in range(rounds):
        fast_rows = rows_at(x, FAST, train)
        r_fast = vec(fast_rows)
        corr = r_full - r_fast
        state = {"x": x.copy(), "f": r_full.copy(),
                 "J": _forward_differences(ev, free, x, lb, ub, train, vec, r_fast, fast_rows, terms, shift)}

        def fun(y):
            return vec(rows_at(y, FAST, train)) + corr

        def jac(y):
            f = fun(y)  # (the optimizer evaluated it already: a kept run)
            s = y - state["x"]
            if float(s @ s) > 0:
                state["J"] = state["J"] + np.outer(f - state["f"] - state["J"] @ s, s) / float(s @ s)
                state["x"], state["f"] = y.copy(), f
            return state["J"].copy()

        res = least_squares(fun, x, jac=jac, bounds=(lb, ub), x_scale=X_SCALE, method="trf", max_nfev=max_nfev,
                            ftol=1e-6, xtol=1e-4, gtol=1e-10, loss=LOSS, f_scale=F_SCALE)
        x_new = np.clip(res.x, lb, ub)
        if ev.two_fidelities:
            new_rows = rows_at(x_new, FULL, train)
            r_new = vec(new_rows)
        else:
            new_rows, r_new = rows_at(x_new, FULL, train), res.fun
        kept = _cost(r_new) < _cost(r_full)
        # how well the fast runs predicted the full ones' fall in cost: near 1, another round from
        # the new point would walk the same path again
        predicted = _cost(r_full) - _cost(res.fun)
        agreement = (_cost(r_full) - _cost(r_new)) / predicted if predicted > 0 else 1.0
        fit_rounds.append({"round": round_no, "evaluations": int(res.nfev), "cost": _cost(r_new), "kept": kept,
                           "agreement": agreement, "values": values(free, x_new)})
        log(f"round {round_no + 1}: {res.nfev} evaluation(s), cost {_cost(r_new):.4g} "
            f"({'kept' if kept else 'not lower: the previous point stays'}): "
            + ", ".join(f"{k} {v:.4g}" for k, v in values(free, x_new).items()))
        if not kept:
            break
        moved = float(np.max(np.abs(x_new - x)))
        x, r_full, rows_full = x_new, r_new, new_rows
        converged = res.status != 0  # (0: the evaluations ran out first)
        if moved < 0.02 or (converged and ev.two_fidelities and abs(agreement - 1) < AGREEMENT):
            break

    # a fresh Jacobian at the fitted point for the uncertainty and the folds: Broyden's updates
    # serve the optimizer's path, but drift from the slopes the simulator has there
    rows_fast = rows_at(x, FAST, train)
    J = _forward_differences(ev, free, x, lb, ub, train, vec, vec(rows_fast), rows_fast, terms, shift)
    fitted = values(free, x)
    std, traded = _std(free, fitted, J, r_full, _groups(rows_full, terms), lb - x, ub - x)
    rows_before = dict(zip(train + holdout, start_rows))
    fit_s = time.perf_counter() - started
    log(f"fitted in {fit_s:.0f} s" + ("; now the held-out measurements and the folds" if holdout or leave_one_out
                                      and len(train) > 1 else ""))
    rows_after = dict(zip(train, rows_full))
    if holdout:
        rows_after.update(zip(holdout, rows_at(x, FULL, holdout)))
    folds = _leave_one_out(ev, free, x, lb, ub, train, terms, r_full, J) if leave_one_out and len(train) > 1 else []
    return FitResult(free=free, train=train, holdout=holdout, start=values(free, np.zeros(len(free))),
                     values=fitted, std=std, traded=traded, cost_before=cost_before, cost_after=_cost(r_full),
                     rows_before=rows_before, rows_after=rows_after, folds=folds, rounds=fit_rounds,
                     wall_s=time.perf_counter() - started, fit_s=fit_s, simulations=dict(ev.simulations),
                     num_residuals=len(r_full))


def _forward_differences(ev, free, x, lb, ub, train, vec, f0, rows0, terms, shift) -> np.ndarray:
    """The Jacobian at ``x`` (fast runs): a column per parameter, all runs in one batch."""
    columns = [j for j in range(len(free)) if j != shift]
    points, steps = [], []
    for j in columns:
        xj = x.copy()
        xj[j] += STEP if x[j] + STEP <= ub[j] else -STEP  # (backwards at the upper bound)
        steps.append(xj[j] - x[j])
        points += [(i, FAST, values(free, xj)) for i in train]
    rows = ev.rows(points)
    J = np.zeros((len(f0), len(free)))
    for k, j in enumerate(columns):
        J[:, j] = (vec(rows[k * len(train):(k + 1) * len(train)]) - f0) / steps[k]
    if shift is not None:
        shift_s = values(free, x)[free[shift].name]
        J[:, shift] = np.concatenate([shift_derivative(r, t, shift_s) for r, t in zip(rows0, terms)])
    return J


def _groups(rows_list, terms) -> np.ndarray:
    """Each residual's row (a stage of a measurement), numbered over all measurements."""
    out, base = [], 0
    for t in terms:
        rows = [i for i, _, _ in t]
        out += [base + i for i in rows]
        base += max(rows, default=-1) + 1
    return np.array(out, dtype=np.int64)


def _std(free, fitted, J, r, groups, lo, hi, *, resamples: int = BOOTSTRAP) -> tuple[dict[str, float], list]:
    """Each value's standard deviation: the larger of the residuals' (``s^2 (J^T W J)^-1``, ``W`` the
    robust loss's weights) and the
    spread of refits of the linearized model over rows (stages) drawn with replacement, which also
    carries what the rows disagree on (a parameter that trades against another)."""
    dof = max(len(r) - len(free), 1)
    w = _weights(r)
    s2 = float(w @ (r * r)) / dof
    JTJ = J.T @ (J * w[:, None])
    try:
        cov = s2 * np.linalg.inv(JTJ) if np.linalg.cond(JTJ) < 1e12 else None
    except np.linalg.LinAlgError:
        cov = None
    linear = np.full(len(free), math.inf) if cov is None else np.sqrt(np.maximum(np.diag(cov), 0.0))
    rng = np.random.default_rng(0)
    names = np.unique(groups)
    lo, hi = np.maximum(lo, -X_SCALE) - 1e-12, np.minimum(hi, X_SCALE) + 1e-12
    steps = []
    for _ in range(resamples if len(names) > 1 else 0):
        picked = np.concatenate([np.flatnonzero(groups == g) for g in rng.choice(names, len(names))])
        steps.append(_linear_fit(J[picked], r[picked], lo, hi))
    spread = np.std(steps, axis=0) if steps else np.zeros(len(free))
    out = {}
    for j, p in enumerate(free):
        sd = max(float(linear[j]), float(spread[j]))
        out[p.name] = fitted[p.name] * sd if math.isfinite(sd) else math.inf
    traded = []
    if cov is not None:
        corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
        traded = [(free[i].name, free[j].name, float(corr[i, j])) for i in range(len(free))
                  for j in range(i + 1, len(free)) if abs(corr[i, j]) >= TRADED]
    return out, traded


def _leave_one_out(ev, free, x, lb, ub, train, terms, r, J) -> list[Fold]:
    sizes = [len(t) for t in terms]
    owner = np.repeat(np.arange(len(train)), sizes)
    fold_values = []
    for k in range(len(train)):
        keep = owner != k
        d = _linear_fit(J[keep], r[keep], np.maximum(lb - x, -X_SCALE) - 1e-12, np.minimum(ub - x, X_SCALE) + 1e-12)
        fold_values.append(values(free, np.clip(x + d, lb, ub)))
    rows = ev.rows([(i, FULL, v) for i, v in zip(train, fold_values)])
    return [Fold(i, v, rw) for i, v, rw in zip(train, fold_values, rows)]


def _cost(r: np.ndarray) -> float:
    """The robust cost ``least_squares`` minimizes (``soft_l1``: ``rho(z) = 2 (sqrt(1 + z) - 1)``,
    ``z = (r / F_SCALE)^2``, cost ``0.5 F_SCALE^2 sum rho``)."""
    z = (r / F_SCALE) ** 2
    return 0.5 * F_SCALE**2 * float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _weights(r: np.ndarray) -> np.ndarray:
    """Each residual's weight under the robust loss (``rho'(z)``): 1 for small ones, less for outliers."""
    return 1.0 / np.sqrt(1.0 + (r / F_SCALE) ** 2)


def _linear_fit(J: np.ndarray, r: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The step ``d`` within ``[lo, hi]`` minimizing the robust cost of ``r + J d``."""
    from scipy.optimize import least_squares

    if not np.any(J):
        return np.zeros(J.shape[1])
    start = np.clip(np.zeros(J.shape[1]), lo + 1e-9, hi - 1e-9)
    return least_squares(lambda d: r + J @ d, start, jac=lambda d: J, bounds=(lo, hi), loss=LOSS,
                         f_scale=F_SCALE, method="trf").x
