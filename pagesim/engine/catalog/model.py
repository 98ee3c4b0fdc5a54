"""Model shapes that decide how much KV cache a token costs, how big the weights are and how much
work a token is: the handful of numbers from a Hugging Face ``config.json`` that the policy, the
cost model and the capacity calculator need. A ``ModelPreset`` holds no weights.

Families (``mlp``):

- ``"swiglu"`` — a gated MLP of three matrices (gate, up, down): Llama 2/3, Mistral, Mixtral, Qwen
  2.5/3, DeepSeek, gpt-oss and Gemma 3 (whose GeGLU has the same three matrices); RMSNorm, rotary
  positions (no position table), an lm head that is untied unless ``tie_word_embeddings``.
- ``"gelu"`` — OPT-style: LayerNorm with bias, a learned position table of
  ``max_position_embeddings + 2`` rows (OPT offsets positions by 2), biases on every linear layer,
  a two-matrix MLP (fc1, fc2) and the lm head tied to the token embedding. NOTE: OPT's activation
  is actually ReLU; the name only says "two-matrix, ungated MLP", which is what counts depend on.

Attention (``attention``):

- ``"gqa"`` — grouped-query attention (multi-head when ``num_kv_heads == num_attention_heads``):
  each token caches a key and a value vector per KV head per layer.
- ``"mla"`` — DeepSeek's multi-head latent attention (``mla``): each token caches one compressed
  latent of ``kv_lora_rank`` elements plus a shared rotary key of ``qk_rope_head_dim``, as vLLM
  caches it (``MLAAttentionSpec``: one "head" of ``kv_lora_rank + qk_rope_head_dim``).

Layers may attend through a sliding window (``sliding_window`` tokens): every layer (Mistral 7B
v0.1), or those ``layer_types`` marks ``"sliding"`` (gpt-oss alternates, Gemma 3 has five sliding
layers per full one). How the KV cache is laid out for such models is ``pagesim.engine.catalog.kv_layout``.

Mixture of experts (``moe``): a layer's MLP is ``num_experts`` routed experts of which each token
uses ``experts_per_token``, plus ``shared_experts`` every token uses; the first
``first_dense_layers`` layers keep a dense MLP of ``intermediate_size`` (DeepSeek's
``first_k_dense_replace``).

Invariants (checked in ``__post_init__``): every size is a positive int;
``num_attention_heads % num_kv_heads == 0``; ``layer_types`` is empty or names every layer;
``sliding_window`` is set exactly when some layer slides; MLA and MoE shapes are consistent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagesim.engine.catalog.params import WEIGHT_FORMATS, param_breakdown

MLP_KINDS = ("swiglu", "gelu")
ATTENTION_KINDS = ("gqa", "mla")
LAYER_KINDS = ("full", "sliding")


def _positive(owner: str, name: str, value: object) -> None:
    # bool is an int subclass; True layers is a bug, not a size.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model preset {owner!r}: {name} must be a positive int, got {value!r}")


@dataclass(slots=True, frozen=True)
class MlaShape:
    """DeepSeek V2/V3 multi-head latent attention (config keys of the same names)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: queries projected directly from the hidden state


@dataclass(slots=True, frozen=True)
class MoeShape:
    """A mixture-of-experts MLP (Mixtral ``num_local_experts``, DeepSeek ``n_routed_experts``, ...)."""

    num_experts: int
    experts_per_token: int
    intermediate_size: int  # one expert's MLP width (``moe_intermediate_size``; Mixtral's own)
    shared_experts: int = 0  # experts every token passes (DeepSeek ``n_shared_experts``)
    first_dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek ``first_k_dense_replace``)
    router_bias: bool = False  # a bias per expert on the router (gpt-oss; DeepSeek's score correction)
    expert_bias: bool = False  # biases inside each expert (gpt-oss)


@dataclass(slots=True, frozen=True)
class ModelPreset:
    """Shapes of one decoder-only transformer (no weights)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's width (DeepSeek: of its first_dense_layers)
    vocab_size: int
    max_position_embeddings: int  # the context length: vLLM's default --max-model-len
    dtype_bytes: int = 2  # activations and the KV cache with --kv-cache-dtype auto
    mlp: str = "swiglu"
    # Llama-family lm heads are separate matrices; OPT and Gemma set this to True.
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # biases on q/k/v (Qwen2, gpt-oss); OPT's biases are implied by mlp="gelu"
    o_bias: bool = False  # a bias on the output projection (gpt-oss)
    attention: str = "gqa"
    mla: MlaShape | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # per layer "full" / "sliding"; () = all the same kind
    attention_sinks: bool = False  # one learned sink logit per head and layer (gpt-oss)
    qk_norm: bool = False  # RMSNorm of head_dim on queries and keys (Qwen3, Gemma 3)
    norms_per_layer: int = 2  # Gemma 3 has four (before and after attention and MLP)
    moe: MoeShape | None = None
    # Checkpoint format of the weights (params.WEIGHT_FORMATS); None: every weight in the model's dtype.
    weight_format: str | None = None
    source: str = field(default="", compare=False)  # the public config this preset follows

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model preset name must be a non-empty string, got {self.name!r}")
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "dtype_bytes",
                     "norms_per_layer"):
            _positive(self.name, name, getattr(self, name))
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"model preset {self.name!r}: num_attention_heads ({self.num_attention_heads}) "
                f"must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"model preset {self.name!r}: mlp must be one of {', '.join(MLP_KINDS)}, "
                             f"got {self.mlp!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"model preset {self.name!r}: attention must be one of "
                             f"{', '.join(ATTENTION_KINDS)}, got {self.attention!r}")
        if (self.attention == "mla") != (self.mla is not None):
            raise ValueError(f"model preset {self.name!r}: attention='mla' goes with an MlaShape, and only it")
        if self.mla is not None:
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                _positive(self.name, f"mla.{name}", getattr(self.mla, name))
            if self.mla.q_lora_rank is not None:
                _positive(self.name, "mla.q_lora_rank", self.mla.q_lora_rank)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_KINDS):
                raise ValueError(f"model preset {self.name!r}: layer_types must name each of the "
                                 f"{self.num_layers} layers 'full' or 'sliding'")
        sliding = self.sliding_window is not None
        if sliding:
            _positive(self.name, "sliding_window", self.sliding_window)
        if self.layer_types and ("sliding" in self.layer_types) != sliding:
            raise ValueError(f"model preset {self.name!r}: sliding layers need sliding_window, and "
                             f"sliding_window needs a sliding layer")
        if self.moe is not None:
            moe = self.moe
            for name in ("num_experts", "experts_per_token", "intermediate_size"):
                _positive(self.name, f"moe.{name}", getattr(moe, name))
            if moe.experts_per_token > moe.num_experts:
                raise ValueError(f"model preset {self.name!r}: a token cannot use {moe.experts_per_token} "
                                 f"of {moe.num_experts} experts")
            if not 0 <= moe.first_dense_layers < self.num_layers or moe.shared_experts < 0:
                raise ValueError(f"model preset {self.name!r}: moe.first_dense_layers must leave an MoE layer "
                                 f"and moe.shared_experts must be >= 0")
        if self.weight_format is not None and self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"model preset {self.name!r}: weight_format must be one of "
                             f"{', '.join(WEIGHT_FORMATS)}, got {self.weight_format!r}")

    # ----------------------------------------------------------- attention
    @property
    def q_size(self) -> int:
        """Width of the query projection output (num_attention_heads * head_dim; MLA: its q head)."""
        return self.num_attention_heads * self.qk_head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Elements of one query-key dot product (MLA: the no-RoPE and RoPE parts together)."""
        mla = self.mla
        return self.head_dim if mla is None else mla.qk_nope_head_dim + mla.qk_rope_head_dim

    @property
    def v_head_dim(self) -> int:
        return self.head_dim if self.mla is None else self.mla.v_head_dim

    @property
    def attention_label(self) -> str:
        """What serving engineers call it: MHA, GQA or MLA, with the window where there is one."""
        base = "MLA" if self.mla is not None else ("MHA" if self.num_kv_heads == self.num_attention_heads else "GQA")
        if self.sliding_window is None:
            return base
        types = self.resolved_layer_types
        if all(t == "sliding" for t in types):
            return f"{base}, sliding window {self.sliding_window}"
        return f"{base}, {types.count('sliding')}/{len(types)} layers sliding window {self.sliding_window}"

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        """Each layer's kind: ``layer_types``, or every layer sliding if a window is set, else full."""
        if self.layer_types:
            return self.layer_types
        return ("sliding" if self.sliding_window is not None else "full",) * self.num_layers

    def kv_elements_per_token_layer(self) -> int:
        """KV-cache elements one token stores in one layer: K and V per KV head (GQA), or the
        latent plus the rotary key (MLA, as vLLM caches it)."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies across all layers in the model's dtype (``--kv-cache-dtype
        auto``), windows not applied: GQA ``2 x layers x kv_heads x head_dim x dtype_bytes``; MLA
        ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes``."""
        return self.num_layers * self.kv_elements_per_token_layer() * self.dtype_bytes

    # -------------------------------------------------------------- params
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_params(self) -> int:
        """Parameter count computed from the shapes (``pagesim.engine.catalog.params`` says each part).

        Matches the published totals: llama3-8b 8,030,261,248; opt-13b 12,853,473,280; gpt-oss-120b
        116,829,156,672; deepseek-v3 671,026,419,200 (without its multi-token-prediction layer)."""
        return param_breakdown(self).total

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through: all but the routed experts it does not use
        (Mixtral's and DeepSeek's convention, embeddings included)."""
        return param_breakdown(self).active
