"""A fit's outcome as the profile document records it, and as tables for a person.

Errors are ``pagesim.sim.replay``'s: per figure (E2E, TTFT, per token), the median absolute
``predicted / measured - 1`` over a measurement's rows (each stage and the whole run) and
statistics (mean, p90, p99; per token: mean), before the fit (the start values) and after.
Failures are counts, measured and predicted.
"""

from __future__ import annotations

import math

from pagesim.sim.replay import FIGURES, median_abs_errors

_LABELS = {"e2e": "E2E", "ttft": "TTFT", "per_token": "per token"}


def profile_document(result, ev, settings: dict) -> dict:
    from pagesim.sim.fit.params import FREE_PARAMS
    from pagesim.sim.fit.profile_file import SCHEMA, SCHEMA_VERSION
    from pagesim.sim.serving_path import VLLM_FRONTEND_IN_S, VLLM_FRONTEND_OUT_S

    measurements = ev.measurements
    params = {}
    for p in result.free:
        std = result.std[p.name]
        params[p.name] = {"value": result.values[p.name], "std": std if math.isfinite(std) else None,
                          "start": result.start[p.name], "lower": p.lower, "upper": p.upper, "what": p.what}
    roofline = {k: v for k, v in result.values.items() if not FREE_PARAMS[k].serving_path}
    path_terms = {"frontend_in_s": result.values.get("frontend_in_s", VLLM_FRONTEND_IN_S),
                  "frontend_out_s": VLLM_FRONTEND_OUT_S}

    def entry(index: int, after_rows: list, **extra) -> dict:
        m = measurements[index]
        before_rows = result.rows_before[index]
        return {"measurement": m.name, "path": str(m.path), "model": m.model, **extra,
                "before": median_abs_errors(before_rows), "after": median_abs_errors(after_rows),
                "failures": {"measured": _failures(before_rows, "measured"), "before": _failures(before_rows),
                             "after": _failures(after_rows)},
                "rows_before": [r.to_json() for r in before_rows], "rows_after": [r.to_json() for r in after_rows]}

    fitted = [entry(i, result.rows_after[i]) for i in result.train]
    held = [entry(i, result.rows_after[i]) for i in result.holdout]
    folds = [entry(f.left_out, f.rows, values=f.values) for f in result.folds]
    groups = {"fitted": (result.train, [result.rows_after[i] for i in result.train]),
              "held_out": (result.holdout, [result.rows_after[i] for i in result.holdout]),
              "leave_one_out": ([f.left_out for f in result.folds], [f.rows for f in result.folds])}
    overall = {}
    for name, (indices, after) in groups.items():
        if indices:
            overall[name] = {"before": median_abs_errors([r for i in indices for r in result.rows_before[i]]),
                             "after": median_abs_errors([r for rows in after for r in rows])}
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "fitted", "gpu": settings["gpu"],
        "server_flags": settings["server_flags"], "seed": settings["seed"],
        "fitted_on": [measurements[i].describe() for i in result.train],
        "held_out": [measurements[i].describe() for i in result.holdout],
        "params": params, "roofline": roofline, "serving_path": path_terms,
        "traded": [{"params": [a, b], "correlation": c} for a, b, c in result.traded],
        "errors": {"fitted": fitted, "held_out": held, "leave_one_out": folds, "overall": overall},
        "fit": {"rounds": result.rounds, "simulations": result.simulations, "wall_s": round(result.wall_s, 1),
                "fit_s": round(result.fit_s, 1),
                "cost_before": result.cost_before, "cost_after": result.cost_after,
                "residuals": result.num_residuals, "optimizer": "scipy.optimize.least_squares (trf)"},
    }


def _failures(rows: list, side: str = "predicted") -> int | None:
    whole = [r for r in rows if r.stage is None] or rows
    counts = [r.measured_counts if side == "measured" else r.predicted_counts for r in whole]
    if any(c is None for c in counts):
        return None
    return int(sum(c[1] for c in counts))


def format_fit(doc: dict) -> str:
    lines = [f"fitted on {len(doc['fitted_on'])} measurement(s) on {doc['gpu']}"
             + (f" with server flags {' '.join(doc['server_flags'])}" if doc["server_flags"] else "") + ":",
             f"  {'parameter':<26}{'start':>11}{'fitted':>11}{'+- std':>11}  bounds"]
    for name, p in doc["params"].items():
        std = "inf" if p["std"] is None else f"{p['std']:.3g}"
        lines.append(f"  {name:<26}{p['start']:>11.4g}{p['value']:>11.4g}{std:>11}  [{p['lower']:g}, {p['upper']:g}]")
    for pair in doc.get("traded", []):
        a, b = pair["params"]
        lines.append(f"  {a} and {b} trade against each other (correlation {pair['correlation']:+.2f}): the "
                     f"measurements fix a combination of the two better than either alone")
    fit = doc["fit"]
    sims = ", ".join(f"{v} {k}" for k, v in fit["simulations"].items() if v)
    lines.append(f"  cost {fit['cost_before']:.4g} -> {fit['cost_after']:.4g} over {fit['residuals']} residuals; "
                 f"{sims} simulation(s) in {fit['wall_s']:.0f} s ({fit.get('fit_s', fit['wall_s']):.0f} s to the "
                 f"fitted values, the rest for held-out measurements and folds)")
    for group, title in (("fitted", "fitted (training error)"), ("held_out", "held out"),
                         ("leave_one_out", "leave-one-out (each left out, the rest refitted)")):
        entries = doc["errors"][group]
        if not entries:
            continue
        lines += ["", f"{title}: median absolute error, before -> after; failures measured / before / after"]
        for e in entries:
            cells = "  ".join(f"{_LABELS[f]} {_pct(e['before'][f])} -> {_pct(e['after'][f])}" for f in FIGURES)
            failures = e["failures"]
            lines.append(f"  {e['measurement'][:44]:<44} {cells}  failed {failures['measured']} / {failures['before']}"
                         f" / {failures['after']}")
        overall = doc["errors"]["overall"].get(group)
        if overall:
            lines.append(f"  {'all rows':<44} " + "  ".join(
                f"{_LABELS[f]} {_pct(overall['before'][f])} -> {_pct(overall['after'][f])}" for f in FIGURES))
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value:6.1%}"
