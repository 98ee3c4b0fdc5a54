"""A Llama decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU) whose attention is
a plug-in.

The network is written once. Where a layer attends, it calls an ``Attention`` backend with its
index and the step's rotated queries, keys and values (``[tokens, heads, head_dim]``); the backend
stores K/V wherever it keeps them and returns the attention output. The engine's backend
(``pagesim.engine.runtime.attention``) writes into paged KV blocks and calls the paged kernels; the
reference (``pagesim.engine.model.dense``) keeps one contiguous cache per sequence with no paging. Both
therefore run the same weights through the same arithmetic outside attention, which is what lets
"outputs equal the no-paging reference" be checked token for token.

Parameter names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``, ...), so a
``state_dict`` loads into ``transformers.LlamaForCausalLM`` and back. Norms, rotary angles and
attention are computed in float32 (float64 for a float64 model), as transformers does.
Every op but attention is per token, so a token's result depends on its batch-mates only through
rounding (matrix products of other shapes), never through what they hold.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from pagesim.engine.model.config import LlamaConfig


class Attention(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q [T, H, D]``, ``k``/``v [T, KV, D]`` of this step's tokens -> output ``[T, H, D]``."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(compute_dtype(dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Rotary:
    """RoPE in Llama's half-split layout (``rotate_half``). The angles are computed per step from
    the positions, as transformers does (float32 ``inv_freq`` times the position), and kept out of
    the module's buffers so that casting the model to bfloat16 cannot coarsen them."""

    def __init__(self, head_dim: int, theta: float):
        arange = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu")  # never on "meta"
        self.inv_freq = 1.0 / (theta ** (arange.float() / head_dim))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, 1, head_dim]`` cosines and sines for a model of ``dtype``."""
        acc = compute_dtype(dtype)
        inv_freq = self.inv_freq.to(device=positions.device, dtype=acc)
        angles = positions.to(acc)[:, None] * inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, D]`` rotated by its tokens' angles."""
    h = x.to(cos.dtype)
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos + rotated * sin).to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)

    def forward(self, layer: int, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                attention: Attention) -> torch.Tensor:
        t = x.shape[0]
        q = rotate(self.q_proj(x).view(t, self.num_heads, self.head_dim), *cos_sin)
        k = rotate(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), *cos_sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        out = attention(layer, q, k, v)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(config.head_dim, config.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """Final-norm hidden states ``[T, hidden]`` of a packed batch of ``T`` tokens."""
        x = self.model.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = x + layer.self_attn(i, layer.input_layernorm(x), cos_sin, attention)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits, in float32 (float64 for a float64 model)."""
        return self.lm_head(hidden).to(compute_dtype(hidden.dtype))
