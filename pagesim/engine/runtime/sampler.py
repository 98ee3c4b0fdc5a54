"""Choosing tokens from logits: greedy, temperature / top-p with seeded noise, and beam search.

Sampling must give the same token for the same logits however the engine batched, chunked,
preempted or recomputed the sequence, or no run could be checked against the no-paging reference.
So randomness is not a stream consumed in step order: the noise for a token is drawn from a
generator seeded by ``(seed, request id, sample index, position)``, and the token is the
Gumbel-max choice ``argmax(logits / T + Gumbel noise)`` over the top-p set, an exact sample from
the renormalised top-p distribution. Sample ``k`` of a request with ``n`` samples is the
sequence with index ``k`` (the policy forks children in that order).

Beam search (deterministic, EOS ignored, so all beams have one length and no length penalty
applies): each step, every (live beam, token) candidate scores the beam's cumulative log-prob
plus the token's; the best ``beam_width`` survive, ties going to the lower beam index, then the
lower token id. ``assign_beam_indices`` states which sequence index each survivor gets, exactly
as the policy's output processor forks them (``pagesim.engine.policy.scheduling.sampling``): a parent's first
choice keeps the parent, later ones become new children in choice order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"sampling seed must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def noise_seed(seed: int, request_id: str, sample: int, position: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{request_id}\x00{sample}\x00{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are < 2**63


def sample_token(logits: torch.Tensor, params: SamplingParams, request_id: str, sample: int, position: int) -> int:
    """The token for sample ``sample`` of ``request_id`` at ``position``, from its ``[vocab]`` logits."""
    if params.greedy:
        return int(torch.argmax(logits))  # ties: the lowest id
    scaled = logits.double() / params.temperature
    if params.top_p < 1:
        probs = torch.softmax(scaled, dim=-1)
        order = torch.sort(probs, descending=True, stable=True).indices
        sorted_probs = probs[order]
        before = torch.cumsum(sorted_probs, 0) - sorted_probs  # mass of the tokens ranked above
        dropped = order[before >= params.top_p]  # the first token always stays
        scaled = scaled.clone()
        scaled[dropped] = -math.inf
    generator = torch.Generator().manual_seed(noise_seed(params.seed, request_id, sample, position))
    u = torch.rand(scaled.shape[0], generator=generator, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
    gumbel = -torch.log(-torch.log(u))
    return int(torch.argmax(scaled.cpu() + gumbel))


def beam_candidates(logprobs: torch.Tensor, scores: Sequence[float], width: int) -> list[tuple[int, int, float]]:
    """The best ``width`` of every (beam row, token): ``[(row, token, new score)]``, best first.

    ``logprobs [B, vocab]`` holds each live beam's next-token log-probs (rows in beam-index
    order), ``scores`` their cumulative log-probs."""
    vocab = logprobs.shape[1]
    total = (torch.tensor(scores, dtype=torch.float64)[:, None] + logprobs.double().cpu()).flatten()
    best = torch.sort(total, descending=True, stable=True)  # stable: ties keep (row, token) order
    picked = best.indices[:width].tolist()
    values = best.values[:width].tolist()
    return [(i // vocab, i % vocab, v) for i, v in zip(picked, values)]


def assign_beam_indices(parents: Sequence[int], next_index: int) -> list[int]:
    """The sequence index each choice's beam has after the policy applies the choices: a parent's
    first choice keeps the parent's index, each later one is a new child numbered from
    ``next_index`` in choice order."""
    seen: set[int] = set()
    out = []
    for parent in parents:
        if parent in seen:
            out.append(next_index)
            next_index += 1
        else:
            seen.add(parent)
            out.append(parent)
    return out
