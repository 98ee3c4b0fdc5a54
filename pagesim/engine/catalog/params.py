"""Where a model's parameters are, counted from its shapes: what weights cost in memory and what a
token multiplies.

``param_breakdown`` splits the parameters into the parts that behave differently:

- ``embedding``: the token table (and OPT's position table): looked up, never multiplied;
- ``lm_head``: the output projection (0 when tied to the embedding);
- ``attention``: the attention projections (GQA: q, k, v, o; MLA: q_a/q_b or q, kv_a, kv_b, o);
- ``dense_mlp``: the MLPs of dense layers (all layers of a dense model; DeepSeek's first three);
- ``shared_experts``: experts every token passes (DeepSeek);
- ``routed_experts``: all routed experts of all MoE layers; a token passes ``experts_per_token``;
- ``router``: the routers' weights;
- ``small``: norms, biases, attention sinks: negligible work, stored in the model's dtype.

Bytes per weight follow the checkpoint's ``weight_format``, one of ``WEIGHT_FORMATS``
(``weight_bytes``): ``fp8`` stores every linear layer's weights in one byte (attention, MLPs,
experts: DeepSeek V3's release and the FP8 checkpoints vLLM serves; embeddings, lm head, router,
norms and biases stay 16-bit, and the block scales, 4 bytes per 128 x 128 block, are left out),
``mxfp4`` stores the routed experts in 4.25 bits (4-bit values, one 8-bit scale per 32: gpt-oss's
release; everything else 16-bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NOTE: for annotations only: model.py imports this module (num_params counts here)
    from pagesim.engine.catalog.model import ModelPreset

#: Checkpoint weight formats: bytes per weight of the weights each format covers (which weights:
#: the module docstring).
WEIGHT_FORMATS = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp4": 17 / 32}
_SIXTEEN_BIT = 2.0


@dataclass(frozen=True, slots=True)
class ParamBreakdown:
    embedding: int
    lm_head: int
    attention: int
    dense_mlp: int
    shared_experts: int
    routed_experts: int
    router: int
    small: int
    expert_size: int  # parameters of one routed expert (its biases included)
    inactive_experts: int  # routed-expert parameters one token does not use

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.attention + self.dense_mlp + self.shared_experts
                + self.routed_experts + self.router + self.small)

    @property
    def active(self) -> int:
        return self.total - self.inactive_experts

    @property
    def linear(self) -> int:
        """Weights every token multiplies on its way through the layers, lm head apart."""
        return self.attention + self.dense_mlp + self.shared_experts + self.router


def _attention_params(m: ModelPreset) -> tuple[int, int]:
    """(projection weights, small params) of one layer's attention."""
    h = m.hidden_size
    heads = m.num_attention_heads
    small = 2 * m.head_dim if m.qk_norm else 0
    if m.attention_sinks:
        small += heads
    mla = m.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            weights = h * heads * qk
        else:
            weights = h * mla.q_lora_rank + mla.q_lora_rank * heads * qk
            small += mla.q_lora_rank  # q_a_layernorm
        weights += h * (mla.kv_lora_rank + mla.qk_rope_head_dim)  # kv_a_proj_with_mqa
        weights += mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)  # kv_b_proj
        weights += heads * mla.v_head_dim * h  # o_proj
        return weights, small + mla.kv_lora_rank  # kv_a_layernorm
    q, kv = heads * m.head_dim, m.kv_size
    weights = 2 * h * q + 2 * h * kv
    if m.mlp == "gelu":  # OPT: every projection has a bias
        small += q + 2 * kv + h
    else:
        if m.qkv_bias:
            small += q + 2 * kv
        if m.o_bias:
            small += h
    return weights, small


def param_breakdown(m: ModelPreset) -> ParamBreakdown:
    h = m.hidden_size
    opt = m.mlp == "gelu"
    attention, attention_small = _attention_params(m)
    if opt:
        dense_layer_mlp, dense_layer_small = 2 * h * m.intermediate_size, m.intermediate_size + h
    else:
        dense_layer_mlp, dense_layer_small = 3 * h * m.intermediate_size, 0
    norm = 2 * h if opt else h  # LayerNorm has weight + bias; RMSNorm a weight
    small = m.num_layers * (attention_small + m.norms_per_layer * norm) + norm  # the final norm too
    moe = m.moe
    expert_size = shared = routed = router = inactive = 0
    num_dense_layers = m.num_layers
    if moe is not None:
        num_moe = m.num_moe_layers
        num_dense_layers = moe.first_dense_layers
        expert_weights = 3 * h * moe.intermediate_size
        expert_bias = (2 * moe.intermediate_size + h) if moe.expert_bias else 0
        expert_size = expert_weights + expert_bias
        routed = num_moe * moe.num_experts * expert_weights
        shared = num_moe * moe.shared_experts * expert_weights
        router = num_moe * h * moe.num_experts
        small += num_moe * (moe.num_experts * expert_bias + (moe.num_experts if moe.router_bias else 0))
        inactive = num_moe * (moe.num_experts - moe.experts_per_token) * expert_size
    small += num_dense_layers * dense_layer_small
    embedding = m.vocab_size * h
    if opt:
        embedding += (m.max_position_embeddings + 2) * h  # OPT's offset of 2
    return ParamBreakdown(
        embedding=embedding, lm_head=0 if m.tie_word_embeddings else m.vocab_size * h,
        attention=m.num_layers * attention, dense_mlp=num_dense_layers * dense_layer_mlp,
        shared_experts=shared, routed_experts=routed, router=router, small=small,
        expert_size=expert_size, inactive_experts=inactive,
    )


def weight_format_of(m: ModelPreset, override: str | None = None) -> str:
    """The format weights are stored in: ``override`` (``--dtype``), else the checkpoint's, else
    the model's dtype."""
    if override not in (None, "auto"):
        if override not in WEIGHT_FORMATS:
            raise ValueError(f"--dtype must be auto or one of {', '.join(WEIGHT_FORMATS)}, got {override!r}")
        if override == "mxfp4" and m.moe is None:
            raise ValueError(f"--dtype mxfp4 quantizes MoE experts (as gpt-oss ships); {m.name} has none")
        return override
    if m.weight_format is not None:
        return m.weight_format
    return {4: "fp32", 2: "bf16"}.get(m.dtype_bytes, "bf16")


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of each part of the weights in one format (totals for the whole model, no parallelism)."""

    format: str
    embedding: float
    lm_head: float
    linear: float  # attention, dense MLPs, shared experts, routers
    routed_experts: float
    expert: float  # one routed expert
    small: float

    @property
    def total(self) -> float:
        return self.embedding + self.lm_head + self.linear + self.routed_experts + self.small


def weight_bytes(m: ModelPreset, override: str | None = None) -> WeightBytes:
    """Bytes of the weights in the checkpoint's format (or ``override``; see the module docstring)."""
    fmt = weight_format_of(m, override)
    p = param_breakdown(m)
    native = WEIGHT_FORMATS[fmt] if fmt in ("fp32", "bf16", "fp16") else _SIXTEEN_BIT
    linear_bytes = WEIGHT_FORMATS[fmt] if fmt in ("fp8", "fp32", "bf16", "fp16") else native
    expert_bytes = WEIGHT_FORMATS[fmt]
    moe = m.moe
    one_expert = 0.0
    if moe is not None:
        weights = 3 * m.hidden_size * moe.intermediate_size
        one_expert = weights * expert_bytes + (p.expert_size - weights) * native  # its biases 16-bit
    return WeightBytes(
        format=fmt, embedding=p.embedding * native, lm_head=p.lm_head * native,
        linear=(p.attention + p.dense_mlp + p.shared_experts) * linear_bytes + p.router * native,
        routed_experts=p.routed_experts * expert_bytes, expert=one_expert, small=p.small * native,
    )
