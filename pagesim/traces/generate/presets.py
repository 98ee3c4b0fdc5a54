"""Named workloads, usable wherever a command takes ``--workload NAME --rate R --num-requests K``
(and optionally ``--arrival``: ``--rate`` is always requests/s, conversations included).

The ``kwon2023-*`` presets follow the PagedAttention paper's evaluation (Kwon et al., SOSP 2023,
§6.1): Poisson arrivals and the ShareGPT and Alpaca datasets' mean lengths (ShareGPT: 161.31
prompt and 337.99 output tokens; Alpaca: 19.31 and 58.45). The datasets themselves are not shipped,
so lengths are lognormal with those means, truncated as vLLM's serving benchmark filters ShareGPT
(prompts of at most 1,024 tokens and at most 2,048 in all, the context of the paper's OPT models;
here each of prompt and output at most 1,024, and the location solved so the truncated means are
exactly the paper's). The coefficients of variation (1.0 for ShareGPT's long tail, 0.5 and 0.8
for Alpaca's short instructions and answers) are our assumption, not the paper's.
The paper's parallel-sampling and beam-search runs used Alpaca with n or beam width 2 to 6: the
``-parallel`` and ``-beam`` presets take 4. The others exercise prefix sharing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from pagesim.traces.generate.arrivals import parse_arrivals
from pagesim.traces.generate.lengths import TruncatedLogNormal
from pagesim.traces.generate.workload import Conversations, Sampling, SystemPrompts, WorkloadSpec

MAX_TOKENS = 1024  # each of prompt and output (vLLM's benchmark: prompt <= 1024, total <= 2048)


@cache
def _sharegpt_lengths() -> tuple[TruncatedLogNormal, TruncatedLogNormal]:
    return TruncatedLogNormal(161.31, 1.0, MAX_TOKENS), TruncatedLogNormal(337.99, 1.0, MAX_TOKENS)


@cache
def _alpaca_lengths() -> tuple[TruncatedLogNormal, TruncatedLogNormal]:
    return TruncatedLogNormal(19.31, 0.5, MAX_TOKENS), TruncatedLogNormal(58.45, 0.8, MAX_TOKENS)


def _lengths(which) -> dict:
    prompt, output = which()
    return {"prompt": prompt, "output": output}


def _spec(name: str, arrivals, num_requests: int, seed: int, **fields) -> WorkloadSpec:
    return WorkloadSpec(num_requests=num_requests, arrivals=arrivals, seed=seed, name=name, **fields)


WORKLOADS: dict[str, tuple[str, Callable[..., WorkloadSpec]]] = {
    "kwon2023-sharegpt": (
        "PagedAttention paper, ShareGPT lengths: lognormal, cv 1, mean 161.31 in / 337.99 out, each <= 1024",
        lambda r, k, s: _spec("kwon2023-sharegpt", r, k, s, **_lengths(_sharegpt_lengths))),
    "kwon2023-alpaca": (
        "PagedAttention paper, Alpaca lengths: lognormal, cv 0.5 / 0.8, mean 19.31 in / 58.45 out",
        lambda r, k, s: _spec("kwon2023-alpaca", r, k, s, **_lengths(_alpaca_lengths))),
    "kwon2023-alpaca-parallel": (
        "kwon2023-alpaca with parallel sampling n=4 on every request",
        lambda r, k, s: _spec("kwon2023-alpaca-parallel", r, k, s, sampling=Sampling(n=4), **_lengths(_alpaca_lengths))),
    "kwon2023-alpaca-beam": (
        "kwon2023-alpaca with beam search, width 4, on every request",
        lambda r, k, s: _spec("kwon2023-alpaca-beam", r, k, s, sampling=Sampling(beam_width=4), **_lengths(_alpaca_lengths))),
    "shared-system-prompt": (
        "ShareGPT lengths after one of 4 system prompts of 1,024 tokens (80% of requests)",
        lambda r, k, s: _spec("shared-system-prompt", r, k, s,
                              system_prompts=SystemPrompts(count=4, tokens=1024, fraction=0.8), **_lengths(_sharegpt_lengths))),
    "multi-turn-chat": (
        "ShareGPT-length turns in conversations of 4 turns on average, 30 s think time "
        "(--rate counts requests; conversations start about a quarter as often)",
        lambda r, k, s: _spec("multi-turn-chat", r, k, s,
                              conversations=Conversations(mean_turns=4.0, think_time_s=30.0), **_lengths(_sharegpt_lengths))),
}


def workload_spec(name: str, *, rate_rps: float | None, num_requests: int, seed: int = 0,
                  arrival: str | None = None) -> WorkloadSpec:
    """The named workload with ``num_requests`` requests arriving at ``rate_rps`` requests/s by
    the ``arrival`` process (``parse_arrivals``; Poisson by default, as in the paper)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (workloads: {', '.join(WORKLOADS)})")
    return WORKLOADS[name][1](parse_arrivals(arrival, rate_rps=rate_rps), num_requests, seed)
