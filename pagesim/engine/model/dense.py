"""The no-paging reference: one sequence, one contiguous K/V cache per layer, plain torch attention.

``DenseSequence`` runs the same ``LlamaForCausalLM`` as the engine, but its attention keeps every
token's keys and values in an ordinary growing tensor and attends with a causal mask (and, in a
sliding-window layer, only the window's last keys: nothing is ever dropped here): no blocks,
no block tables, no kernels, no sharing, no preemption. ``fork()`` copies the caches (a new
sample or beam gets its own). It is what the engine's outputs are checked against and what the
model's logits are compared with (``logits_of``); it is meant for correctness, not speed.
"""

from __future__ import annotations

import torch

from pagesim.engine.model.llama import LlamaForCausalLM, compute_dtype


class DenseSequence:
    def __init__(self, model: LlamaForCausalLM):
        self.model = model
        self.keys: list[torch.Tensor | None] = [None] * model.config.num_layers
        self.values: list[torch.Tensor | None] = [None] * model.config.num_layers
        self.num_tokens = 0

    def fork(self) -> DenseSequence:
        child = DenseSequence(self.model)
        child.keys = [None if k is None else k.clone() for k in self.keys]
        child.values = [None if v is None else v.clone() for v in self.values]
        child.num_tokens = self.num_tokens
        return child

    @torch.inference_mode()
    def extend(self, token_ids: list[int]) -> torch.Tensor:
        """Append tokens; returns the logits after each of them (``[len(token_ids), vocab]``)."""
        model = self.model
        ids = torch.tensor(token_ids, dtype=torch.long, device=model.device)
        positions = torch.arange(self.num_tokens, self.num_tokens + len(token_ids), device=model.device)
        hidden = model.hidden_states(ids, positions, self._attend)
        self.num_tokens += len(token_ids)
        return model.logits(hidden)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k])
            self.values[layer] = torch.cat([self.values[layer], v])
        return causal_attention(q, self.keys[layer], self.values[layer], self.model.config.layer_window(layer))


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The last ``T`` of ``L`` tokens attend causally: ``q [T, H, D]``, ``keys``/``values [L, KV, D]``;
    with a ``window``, each query sees only its last ``window`` positions (itself included)."""
    t, num_heads, head_dim = q.shape
    length, num_kv_heads, _ = keys.shape
    acc = compute_dtype(q.dtype)
    group = num_heads // num_kv_heads
    k = keys.to(acc).repeat_interleave(group, dim=1)  # [L, H, D]
    v = values.to(acc).repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.to(acc), k) * head_dim**-0.5
    key_pos = torch.arange(length, device=q.device)[None, :]
    query_pos = torch.arange(length - t, length, device=q.device)[:, None]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("htl,lhd->thd", probs, v).to(q.dtype)


def logits_of(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """Logits after every token of one sequence, computed in one dense pass."""
    return DenseSequence(model).extend(token_ids)
