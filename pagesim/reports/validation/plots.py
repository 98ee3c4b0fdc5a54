"""The validation's figures, as pages of ``validation.pdf`` (and for the study report):

1. predicted vs measured time of every step the engine ran (log-log, with the y = x line), and
   the distribution of the per-step relative error;
2. the CDFs of TTFT, TPOT and end-to-end latency, engine against simulator (KS statistic in the
   legend);
3. why the latency errors are what they are: each mean error split into the step-time,
   decisions, queue-wait and between-steps parts (``pagesim.reports.validation.decompose``), and the
   step-time error over the engine's steps beside the simulator's own;
4. calibration curves: what the profile measured (dense layer vs tokens, decode attention vs
   context at a few batch sizes, the policy's time vs batch), with each point's interquartile range.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

from pagesim.reports.style import new_page  # noqa: E402
from pagesim.sim.cost.profile import Profile  # noqa: E402
from pagesim.sim.metrics import COMPLETED, RequestMetrics  # noqa: E402


def step_page(measured: np.ndarray, predicted: np.ndarray, mape: float | None):
    fig, (a, b) = new_page("Simulated vs measured step time",
                           f"Each point is one step the engine ran on the wall clock; y is the calibrated cost model's "
                           f"time for that same step. Per-step MAPE {mape:.1%}." if mape is not None else "")
    ok = (measured > 0) & (predicted > 0)
    a.loglog(measured[ok] * 1e3, predicted[ok] * 1e3, ".", ms=3, alpha=0.5)
    if ok.any():
        lo, hi = min(measured[ok].min(), predicted[ok].min()) * 1e3, max(measured[ok].max(), predicted[ok].max()) * 1e3
        a.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        a.legend()
    a.set(xlabel="measured step time (ms)", ylabel="predicted step time (ms)", title="per step")
    err = (predicted[ok] - measured[ok]) / measured[ok]
    b.hist(err * 100, bins=40)
    b.set(xlabel="(predicted - measured) / measured (%)", ylabel="steps", title="relative error")
    return fig


def latency_page(sim: RequestMetrics, engine: RequestMetrics, errors: dict):
    fig, axes = new_page("Latency distributions: engine vs simulator",
                         "Empirical CDFs over the completed requests; the simulator replays the same arrivals with "
                         "the calibrated cost model.", ncols=3)
    for ax, (name, fn, label) in zip(axes, (("ttft", "ttft_s", "TTFT"), ("tpot", "tpot_s", "TPOT"),
                                            ("e2e", "e2e_s", "end-to-end latency"))):
        for m, who in ((engine, "engine"), (sim, "simulator")):
            v = getattr(m, fn)()[m.status == COMPLETED]
            v = np.sort(v[np.isfinite(v)])
            if len(v):
                ax.step(v * 1e3, np.arange(1, len(v) + 1) / len(v), where="post", label=who)
        ks = errors.get(name, {}).get("ks")
        ax.set(xlabel=f"{label} (ms)", ylabel="share of requests", title=f"{label} (KS {ks})")
        ax.legend()
    return fig


PART_LABELS = (("step_time", "step time"), ("decisions", "decisions"), ("queue_wait", "queue wait"),
               ("between_steps", "between steps"))


def error_parts_page(report: dict):
    parts = report.get("error_parts") or {}
    same = report.get("wall_clock_decisions_identical")
    fig, (a, b) = new_page(
        "Why the latency errors are what they are",
        "Each mean latency error is the sum of four parts: the step-time error over the steps each request lived "
        "through; decisions (scheduling differences: the simulator's own batches and step counts; zero when it made the engine's decisions, "
        f"which here it {'did' if same else 'did not'} on the wall clock); where in a step requests arrived; and "
        "the engine's time between steps, which the simulator does not model. Right: the step-time error on the "
        "engine's steps and on the simulator's own (timed by the engine in lockstep).")
    names = [n for n in ("ttft", "tpot", "e2e") if parts.get(n)]
    x = np.arange(len(names))
    width = 0.8 / (len(PART_LABELS) + 1)
    for i, (key, label) in enumerate(PART_LABELS):
        a.bar(x + i * width, [parts[n][key] * 100 for n in names], width, label=label)
    a.bar(x + len(PART_LABELS) * width, [parts[n]["mean_error"] * 100 for n in names], width, color="black",
          label="total (mean error)")
    a.axhline(0, color="k", lw=0.8)
    a.set_xticks(x + width * len(PART_LABELS) / 2, [{"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end"}[n]
                                                    for n in names])
    a.set(ylabel="% of the engine's mean", title="mean latency error, part by part")
    a.legend(fontsize=8)
    rows = [("engine's steps", report.get("step_time") or {}), ("simulator's steps", report.get("simulator_step_time") or {})]
    labels = [r[0] for r in rows]
    for j, (key, label) in enumerate((("mape", "MAPE"), ("total_error", "error of the total"))):
        values = [(r[1].get(key) or 0) * 100 for r in rows]
        b.bar(np.arange(len(rows)) + j * 0.4, values, 0.4, label=label)
    b.axhline(0, color="k", lw=0.8)
    b.set_xticks(np.arange(len(rows)) + 0.2, labels)
    b.set(ylabel="%", title="step-time error: which steps")
    b.legend(fontsize=8)
    return fig


def calibration_page(profile: Profile):
    fig, axes = new_page("Calibration curves", f"What pagesim calibrate measured: {profile.describe()}; median of "
                         f"each grid point with its interquartile range.", ncols=3)
    t = profile.tables["dense_layer"]
    x = np.array(t.grid[0])
    axes[0].errorbar(x, np.array(t.median_s) * 1e3, yerr=np.array(t.spread_s) * 1e3 / 2, marker="o", ms=3)
    axes[0].set(xscale="log", yscale="log", xlabel="tokens in the step", ylabel="ms per layer",
                title="dense layer (no attention)")
    t = profile.tables["decode_attention"]
    bs_values, seq_values, ctx_values = t.grid
    med = np.array(t.median_s).reshape(t.shape)
    bs_i = bs_values.index(16.0) if 16.0 in bs_values else 0
    for j in range(0, len(seq_values), max(1, len(seq_values) // 4)):
        axes[1].plot(ctx_values, med[bs_i, j] * 1e3, marker="o", ms=3, label=f"{int(seq_values[j])} seqs")
    axes[1].set(xscale="log", yscale="log", xlabel="context tokens per sequence", ylabel="ms per layer",
                title=f"paged decode attention, block {int(bs_values[bs_i])}")
    axes[1].legend(fontsize=8)
    for name, label in (("policy", "policy (schedule + update)"), ("batch_prep", "input preparation"),
                        ("sampling", "sampling")):
        t = profile.tables[name]
        axes[2].plot(t.grid[0], np.array(t.median_s) * 1e3, marker="o", ms=3, label=label)
    axes[2].set(xscale="log", yscale="log", xlabel="sequences in the step", ylabel="ms per step",
                title="CPU-side costs per step")
    axes[2].legend(fontsize=8)
    return fig


def write_pdf(path: Path, figures) -> None:
    """The figures as one PDF at ``path``, a new file (``validate --out``'s partial folder, which
    ``pagesim.engine.atomic.OutputFolder`` renames into place once whole)."""
    from pagesim.engine.outputs import create_file

    with open(create_file(path), "wb") as fh, PdfPages(fh) as pdf:
        for fig in figures:
            pdf.savefig(fig)
            plt.close(fig)
