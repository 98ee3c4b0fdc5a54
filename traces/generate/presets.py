"""Named workloads, usable wherever a command takes ``--workload NAME --rate R --num-requests K``.

The ``kwon2023-*`` presets follow the PagedAttention paper's evaluation (Kwon et al., SOSP 2023,
§6.1): Poisson arrivals and the ShareGPT and Alpaca datasets' mean lengths (ShareGPT: 161.31
prompt and 337.99 output tokens; Alpaca: 19.31 and 58.45). The datasets themselves are not shipped,
so lengths are lognormal with those means; the coefficients of variation (1.0 for ShareGPT's long
tail, 0.5 and 0.8 for Alpaca's short instructions and answers) are our assumption, not the paper's.
The paper's parallel-sampling and beam-search runs used Alpaca with n or beam width 2 to 6: the
``-parallel`` and ``-beam`` presets take 4. The others exercise prefix sharing.
"""

from __future__ import annotations

from collections.abc import Callable

from traces.generate.arrivals import Poisson
from traces.generate.lengths import LogNormal
from traces.generate.workload import Conversations, Sampling, SystemPrompts, WorkloadSpec

SHAREGPT = dict(prompt=LogNormal(161.31, 1.0), output=LogNormal(337.99, 1.0))
ALPACA = dict(prompt=LogNormal(19.31, 0.5), output=LogNormal(58.45, 0.8))


def _spec(name: str, rate_rps: float, num_requests: int, seed: int, **fields) -> WorkloadSpec:
    fields.setdefault("arrivals", Poisson(rate_rps))
    return WorkloadSpec(num_requests=num_requests, seed=seed, name=name, **fields)


WORKLOADS: dict[str, tuple[str, Callable[..., WorkloadSpec]]] = {
    "kwon2023-sharegpt": (
        "PagedAttention paper, ShareGPT lengths (mean 161.31 in / 337.99 out), Poisson",
        lambda r, k, s: _spec("kwon2023-sharegpt", r, k, s, **SHAREGPT)),
    "kwon2023-alpaca": (
        "PagedAttention paper, Alpaca lengths (mean 19.31 in / 58.45 out), Poisson",
        lambda r, k, s: _spec("kwon2023-alpaca", r, k, s, **ALPACA)),
    "kwon2023-alpaca-parallel": (
        "kwon2023-alpaca with parallel sampling n=4 on every request",
        lambda r, k, s: _spec("kwon2023-alpaca-parallel", r, k, s, sampling=Sampling(n=4), **ALPACA)),
    "kwon2023-alpaca-beam": (
        "kwon2023-alpaca with beam search, width 4, on every request",
        lambda r, k, s: _spec("kwon2023-alpaca-beam", r, k, s, sampling=Sampling(beam_width=4), **ALPACA)),
    "shared-system-prompt": (
        "ShareGPT lengths after one of 4 system prompts of 1,024 tokens (80% of requests)",
        lambda r, k, s: _spec("shared-system-prompt", r, k, s,
                              system_prompts=SystemPrompts(count=4, tokens=1024, fraction=0.8), **SHAREGPT)),
    "multi-turn-chat": (
        "ShareGPT-length turns in conversations of 4 turns on average, 30 s think time; "
        "--rate is requests/s (conversations start at rate/4)",
        lambda r, k, s: _spec("multi-turn-chat", r, k, s, arrivals=Poisson(r / 4.0),
                              conversations=Conversations(mean_turns=4.0, think_time_s=30.0), **SHAREGPT)),
}


def workload_spec(name: str, *, rate_rps: float, num_requests: int, seed: int = 0) -> WorkloadSpec:
    """The named workload at ``rate_rps`` requests/s with ``num_requests`` requests."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (workloads: {', '.join(WORKLOADS)})")
    return WORKLOADS[name][1](rate_rps, num_requests, seed)
