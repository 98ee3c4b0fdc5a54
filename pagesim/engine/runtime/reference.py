"""The no-paging reference run, and the check that the engine produced exactly its tokens.

Each request is generated again alone, by the same model and weights, through
``pagesim.engine.model.dense`` (one contiguous cache per sequence, plain attention: no blocks, no
kernels, no sharing, no preemption, no batching) with the same sampling rule (``sampler``):
greedy, seeded temperature / top-p, each of ``n`` samples on its own, or beam search with the
policy's beam numbering. The engine's outputs must equal it token for token, per sequence index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from pagesim.engine.model.dense import DenseSequence
from pagesim.engine.model.llama import LlamaForCausalLM
from pagesim.engine.policy import Request
from pagesim.engine.runtime.sampler import SamplingParams, assign_beam_indices, beam_candidates, sample_token


@dataclass(frozen=True, slots=True)
class Mismatch:
    request_id: str
    seq_index: int
    position: int  # output position of the first differing token
    engine: int | None  # None: the engine's output ended (or the sequence is missing)
    reference: int | None

    def describe(self) -> str:
        return (f"{self.request_id}#{self.seq_index} output token {self.position}: engine {self.engine}, "
                f"reference {self.reference}")


@dataclass(slots=True)
class ReferenceReport:
    checked_requests: int = 0
    checked_tokens: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.checked_requests > 0 and not self.mismatches

    def to_dict(self, limit: int = 10) -> dict:
        return {"outputs_match_reference": self.match, "reference_checked_requests": self.checked_requests,
                "reference_checked_tokens": self.checked_tokens,
                "reference_mismatches": [m.describe() for m in self.mismatches[:limit]]}


@torch.inference_mode()
def reference_outputs(model: LlamaForCausalLM, request: Request, params: SamplingParams) -> dict[int, list[int]]:
    """``{sequence index: output tokens}`` of ``request`` generated alone with no paging."""
    prompt = [int(t) for t in request.prompt_token_ids]
    root = DenseSequence(model)
    last = root.extend(prompt)[-1]
    if request.beam_width > 1:
        return _beam_search(request, root, last)
    out = {}
    for k in range(request.n):
        seq = root.fork() if k < request.n - 1 else root
        row, tokens = last, []
        length = request.max_tokens if request.sample_max_tokens is None else request.sample_max_tokens[k]
        while True:
            tokens.append(sample_token(row, params, request.request_id, k, len(prompt) + len(tokens)))
            if len(tokens) >= length:
                break
            row = seq.extend([tokens[-1]])[-1]
        out[k] = tokens
    return out


def _beam_search(request: Request, root: DenseSequence, last: torch.Tensor) -> dict[int, list[int]]:
    # index -> (dense sequence, tokens, cumulative log-prob, next-token logits)
    beams = {0: (root, [], 0.0, last)}
    next_index = 1
    for step in range(request.max_tokens):
        indices = sorted(beams)
        logprobs = torch.log_softmax(torch.stack([beams[i][3] for i in indices]).double(), dim=-1)
        picks = beam_candidates(logprobs, [beams[i][2] for i in indices], request.beam_width)
        parents = [indices[row] for row, _, _ in picks]
        new_index = assign_beam_indices(parents, next_index)
        next_index += sum(1 for p, i in zip(parents, new_index) if p != i)
        chosen = {}
        for (_, token, score), parent, index in zip(picks, parents, new_index):  # forks before anyone appends
            seq, tokens, _, _ = beams[parent]
            chosen[index] = (seq if index == parent else seq.fork(), [*tokens, token], score)
        final = step == request.max_tokens - 1
        beams = {i: (seq, tokens, score, None if final else seq.extend([tokens[-1]])[-1])
                 for i, (seq, tokens, score) in chosen.items()}
    return {i: tokens for i, (_, tokens, _, _) in sorted(beams.items())}


def check_outputs(model: LlamaForCausalLM, requests: Iterable[Request], outputs: Mapping[str, Mapping[int, list[int]]],
                  params_of, *, progress=None) -> ReferenceReport:
    """Compare each request's engine ``outputs`` with its reference; ``params_of(request)`` gives its
    sampling parameters."""
    report = ReferenceReport()
    for request in requests:
        engine_out = outputs.get(request.request_id)
        if engine_out is None:
            continue  # rejected: nothing to compare
        expected = reference_outputs(model, request, params_of(request))
        report.checked_requests += 1
        for index in sorted(set(expected) | set(engine_out)):
            got, want = engine_out.get(index, []), expected.get(index, [])
            report.checked_tokens += len(want)
            for pos in range(max(len(got), len(want))):
                a = got[pos] if pos < len(got) else None
                b = want[pos] if pos < len(want) else None
                if a != b:
                    report.mismatches.append(Mismatch(request.request_id, index, pos, a, b))
                    break
        if progress is not None:
            progress(1)
    return report
