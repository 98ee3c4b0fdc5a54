"""A measured run, replayed: the same request stream through the simulator, and what the run measured
beside what the simulator predicts, stage by stage.

The measurements are an inference-perf run (``pagesim.traces.inference_perf``): its load stages and
workload become a ``Trace`` (redrawn from a seed: inference-perf's own draws are not recorded),
the simulator serves it, and each stage's requests are compared with that stage's lifecycle
metrics file (the whole run's with the summary file):

- **E2E** (request latency) and **TTFT**: mean, p90 and p99 over the requests that succeeded
  (measured: inference-perf's successes; predicted: the requests the simulator completed, a
  request past the client's timeout being a failure in both);
- **per token**: ``(mean E2E - mean TTFT) / (output tokens - 1)``, the mean time between a
  request's first and last token spread over its tokens, with the output length the workload
  configured (inference-perf's own ``time_per_output_token`` is per streamed event, which often
  carries several tokens, so it is not read). Measured per-request figures are not published,
  so per token has a mean only;
- **successes** and **failures** (timeouts), as counts.

Errors are ``predicted / measured - 1``; ``median_abs_errors`` takes, per figure, the median of
their absolute values over every row (stages and the whole run) and statistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.sim.metrics import COMPLETED, RequestMetrics

#: The statistics compared, in display order, for E2E and TTFT; per token has its mean only.
STATS = ("mean", "p90", "p99")
FIGURES = ("e2e", "ttft", "per_token")
_LABELS = {"e2e": "E2E", "ttft": "TTFT", "per_token": "per token"}


@dataclass(frozen=True)
class Comparison:
    """One row of the replay: a stage, or the whole run (``stage`` None)."""

    stage: int | None
    rate_per_s: float | None  # the stage's configured rate (None: the whole run)
    num_requests: int  # sent
    measured: dict[str, dict[str, float | None]]  # figure -> statistic -> seconds (None: not measured)
    predicted: dict[str, dict[str, float | None]]
    measured_counts: tuple[int, int] | None  # (successes, failures); None without a metrics file
    predicted_counts: tuple[int, int]

    @property
    def name(self) -> str:
        return "whole run" if self.stage is None else f"stage {self.stage}"

    def error(self, figure: str, stat: str) -> float | None:
        """``predicted / measured - 1``; None where either is missing or the measured one is 0."""
        m, p = self.measured[figure].get(stat), self.predicted[figure].get(stat)
        if m is None or p is None or m <= 0 or not math.isfinite(p):
            return None
        return p / m - 1.0

    def to_json(self) -> dict:
        figures = {}
        for figure in FIGURES:
            figures[figure] = {stat: {"measured_s": self.measured[figure].get(stat),
                                      "predicted_s": self.predicted[figure].get(stat),
                                      "error": self.error(figure, stat)}
                               for stat in (STATS if figure != "per_token" else ("mean",))}
        counts = {"predicted": {"successes": self.predicted_counts[0], "failures": self.predicted_counts[1]}}
        if self.measured_counts is not None:
            counts["measured"] = {"successes": self.measured_counts[0], "failures": self.measured_counts[1]}
        return {"stage": self.stage, "rate_per_s": self.rate_per_s, "num_requests": self.num_requests,
                **figures, "counts": counts}


def predicted_figures(requests: RequestMetrics, rows: np.ndarray, output_len: np.ndarray) -> dict:
    """E2E, TTFT (mean, p90, p99) and per token of the completed requests among ``rows``."""
    done = rows[requests.status[rows] == COMPLETED]
    if len(done) == 0:
        return {figure: {} for figure in FIGURES}
    e2e = requests.finish_s[done] - requests.arrival_s[done]
    ttft = requests.first_token_s[done] - requests.arrival_s[done]
    return latency_figures(e2e, ttft, float(output_len[done].mean()))


def latency_figures(e2e_s: np.ndarray, ttft_s: np.ndarray, output_tokens: float) -> dict:
    """E2E and TTFT (mean, p90, p99) of requests' latencies, and per token at ``output_tokens``
    (their mean output length); a vLLM bench file's measured ones too (``pagesim.sim.fit``)."""
    figures = {"e2e": _stats(e2e_s), "ttft": _stats(ttft_s)}
    figures["per_token"] = {"mean": per_token(figures["e2e"]["mean"], figures["ttft"]["mean"], output_tokens)}
    return figures


def per_token(e2e_mean_s: float | None, ttft_mean_s: float | None, output_tokens: float) -> float | None:
    if e2e_mean_s is None or ttft_mean_s is None or output_tokens <= 1:
        return None
    return (e2e_mean_s - ttft_mean_s) / (output_tokens - 1)


def _stats(values: np.ndarray) -> dict[str, float]:
    # numpy's linear percentiles, as inference-perf's summaries take them
    p90, p99 = np.percentile(values, [90, 99])
    return {"mean": float(values.mean()), "p90": float(p90), "p99": float(p99)}


def measured_figures(measured, output_tokens: float) -> dict:
    """A ``MeasuredStage``'s E2E, TTFT and per token (see the module docstring)."""
    figures = {}
    for figure, stats in (("e2e", measured.e2e), ("ttft", measured.ttft)):
        figures[figure] = {} if stats is None else {stat: getattr(stats, stat) for stat in STATS}
    figures["per_token"] = {"mean": per_token(figures["e2e"].get("mean"), figures["ttft"].get("mean"),
                                              output_tokens)}
    return figures


def compare(run, trace, requests: RequestMetrics) -> list[Comparison]:
    """One ``Comparison`` per load stage of ``run`` (an ``InferencePerfRun``), then the whole
    run's, from the simulated ``requests`` of ``trace`` (``run.trace(...)``)."""
    stage_of = run.stage_of_rows(trace)
    output_len = trace.output_len.astype(np.float64)
    rows_out = []
    scopes = [(k, np.flatnonzero(stage_of == k), run.measured_stages.get(k), stage.rate_per_s)
              for k, stage in enumerate(run.stages)]
    scopes.append((None, np.arange(len(trace)), run.measured_summary, None))
    for k, rows, measured, rate in scopes:
        completed = int((requests.status[rows] == COMPLETED).sum())
        out_tokens = float(output_len[rows].mean()) if len(rows) else 0.0
        rows_out.append(Comparison(
            stage=k, rate_per_s=rate, num_requests=len(rows),
            measured=measured_figures(measured, out_tokens) if measured is not None else {f: {} for f in FIGURES},
            predicted=predicted_figures(requests, rows, output_len),
            measured_counts=None if measured is None else (measured.successes, measured.failures),
            predicted_counts=(completed, len(rows) - completed),
        ))
    return rows_out


def median_abs_errors(rows: list[Comparison]) -> dict[str, float | None]:
    """Per figure, the median absolute error over every row and statistic (None: nothing to compare)."""
    medians = {}
    for figure in FIGURES:
        errors = [abs(e) for row in rows for stat in (STATS if figure != "per_token" else ("mean",))
                  if (e := row.error(figure, stat)) is not None]
        medians[figure] = float(np.median(errors)) if errors else None
    return medians


def format_table(rows: list[Comparison]) -> str:
    """The measured-vs-predicted table, one block per row."""
    lines = []
    for row in rows:
        rate = f": {row.rate_per_s:g} requests/s" if row.rate_per_s is not None else ""
        head = f"{row.name}{rate}, {row.num_requests:,} requests sent"
        if row.measured_counts is not None:
            head += (f"; succeeded {row.measured_counts[0]:,} measured, {row.predicted_counts[0]:,} predicted"
                     f"; failed {row.measured_counts[1]:,} measured, {row.predicted_counts[1]:,} predicted")
        else:
            head += f"; {row.predicted_counts[0]:,} succeeded, {row.predicted_counts[1]:,} failed (predicted)"
        lines.append(head)
        measured = any(row.measured[figure] and any(v is not None for v in row.measured[figure].values())
                       for figure in FIGURES)
        lines.append(f"  {'':<16}{'measured':>12}{'predicted':>12}{'error':>9}" if measured
                     else f"  {'':<16}{'predicted':>12}")
        for figure in FIGURES:
            for stat in (STATS if figure != "per_token" else ("mean",)):
                m, p = row.measured[figure].get(stat), row.predicted[figure].get(stat)
                if m is None and p is None:
                    continue
                label = f"{_LABELS[figure]} {stat}"
                if not measured:
                    lines.append(f"  {label:<16}{_seconds(p):>12}")
                    continue
                error = row.error(figure, stat)
                lines.append(f"  {label:<16}{_seconds(m):>12}{_seconds(p):>12}"
                             f"{'' if error is None else f'{error:+.1%}':>9}")
        lines.append("")
    medians = median_abs_errors(rows)
    if any(v is not None for v in medians.values()):
        lines.append("median absolute error over the rows above: " + ", ".join(
            f"{_LABELS[f]} {v:.1%}" for f, v in medians.items() if v is not None))
    return "\n".join(lines).rstrip()


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.3f} s"
