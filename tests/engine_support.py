"""Helpers for engine tests: a tiny model, an engine over it, requests, and the reference check."""

from __future__ import annotations

import copy
from functools import cache

import torch

from pagesim.engine.model import LlamaConfig, random_model
from pagesim.engine.policy import Request, make_config
from pagesim.engine.runtime import Engine, SamplingParams
from pagesim.engine.runtime.reference import ReferenceReport, check_outputs

TINY = LlamaConfig.named("tiny")


@cache
def tiny_model(dtype: torch.dtype = torch.float64, seed: int = 0, device: str = "cpu"):
    return random_model(TINY, seed=seed, dtype=dtype, device=device)


def make_engine(*, dtype=torch.float64, backend="torch", validate=True, sampling=None, policy="pagesim",
                device="cpu", **settings) -> Engine:
    settings.setdefault("max_model_len", TINY.max_position_embeddings)
    config = make_config(policy, **settings)
    return Engine(tiny_model(dtype, device=device), config, backend=backend, validate=validate,
                  sampling=sampling or SamplingParams())


def request(rid: str, prompt: list[int], max_tokens: int, **kw) -> Request:
    return Request(rid, prompt_len=len(prompt), max_tokens=max_tokens, prompt_token_ids=list(prompt), **kw)


def serve(engine: Engine, requests: list[Request], release_steps=None) -> ReferenceReport:
    """Serve copies of ``requests`` in lockstep; then check every completed one against the reference."""
    engine.run_lockstep([copy.deepcopy(r) for r in requests], release_steps)
    outputs = {rid: r.outputs for rid, r in engine.records.items() if r.status == "completed"}
    return check_outputs(engine.model, requests, outputs, lambda r: engine.sampling)


def prompt_of(seed: int, length: int, vocab: int = TINY.vocab_size) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist()
