"""What an inference-perf run measured: its ``*_lifecycle_metrics.json`` files, in part.

Each file (``reportgen/base.py`` ``summarize_requests``) holds ``load_summary`` (requests sent,
``requested_rate`` and ``achieved_rate``; the summary's has no rates), ``successes`` (``count``;
under ``latency`` one statistics object per figure, seconds; ``prompt_len`` and ``output_len``,
tokens) and ``failures`` (``count``, and their latencies). Read here, per success:

- ``request_latency`` (end to end) and ``time_to_first_token`` (streaming runs only): mean,
  median, p90, p99;
- the mean ``prompt_len`` and ``output_len``, which inference-perf counts by re-tokenizing the
  prompt and the streamed text, so they can differ from the tokens the server processed
  (inference-perf 0.7 writes ``prompt_tokens`` instead of ``prompt_len``, the server's usage count
  where the server sent one: read the same way).

NOTE: ``time_per_output_token`` is not read: inference-perf computes it per streamed event, and
an event often carries several tokens, so it is not a per-token time (the shared README's per
token figure is ``(E2E - TTFT) / (output_len - 1)`` with the configured ``output_len``).

The two counts are required; any other figure that is absent or null is None, and one that is
there must be a finite number >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.traces.inference_perf.keys import Node


@dataclass(frozen=True)
class LatencyStats:
    """One measured latency over a stage's successes, seconds."""

    mean: float
    median: float
    p90: float
    p99: float


@dataclass(frozen=True)
class MeasuredStage:
    """One ``*_lifecycle_metrics.json``: a stage's (or the whole run's) figures."""

    successes: int
    failures: int
    e2e: LatencyStats | None
    ttft: LatencyStats | None
    mean_output_len: float | None  # tokens, re-tokenized from the streamed text
    mean_prompt_len: float | None  # tokens, re-tokenized from the prompt
    requested_rate: float | None  # requests/s (None in the summary)
    achieved_rate: float | None


def _latency(node: Node) -> LatencyStats | None:
    if not node.present:
        return None
    figures = [node[name].number(minimum=0) for name in ("mean", "median", "p90", "p99")]
    return LatencyStats(*figures)


def parse_metrics(top: Node) -> MeasuredStage:
    """The figures of one lifecycle metrics file (its top node)."""
    successes, failures, load = top["successes"].required(), top["failures"].required(), top["load_summary"]
    latency = successes["latency"]

    def figure(node: Node) -> float | None:
        return node.optional_number(minimum=0)

    return MeasuredStage(
        successes=successes["count"].count(minimum=0),
        failures=failures["count"].count(minimum=0),
        e2e=_latency(latency["request_latency"]),
        ttft=_latency(latency["time_to_first_token"]),
        mean_output_len=figure(successes["output_len"]["mean"]),
        # (inference-perf 0.7 renamed it prompt_tokens: the server's usage count where it sent one)
        mean_prompt_len=figure(successes.either("prompt_len", "prompt_tokens")["mean"]),
        requested_rate=figure(load["requested_rate"]),
        achieved_rate=figure(load["achieved_rate"]),
    )
