"""Model shapes that decide how much KV cache a token costs and how big the weights are.

A ``ModelPreset`` is the handful of numbers from a Hugging Face ``config.json`` that the policy,
the cost model and the capacity calculator need; it holds no weights. Two families are described:

- ``mlp="swiglu"`` — Llama-style (Llama 2/3, Mistral, Qwen2.5): RMSNorm, rotary positions (no
  position table), a gated MLP of three matrices (gate, up, down), no biases except the optional
  q/k/v bias (Qwen2), and an lm head that is untied unless ``tie_word_embeddings``.
- ``mlp="gelu"`` — OPT-style: LayerNorm with bias, a learned position table of
  ``max_position_embeddings + 2`` rows (OPT offsets positions by 2), biases on every linear layer,
  a two-matrix MLP (fc1, fc2) and the lm head tied to the token embedding. NOTE: OPT's activation
  is actually ReLU; the name only says "two-matrix, ungated MLP", which is what counts depend on.

Invariants (checked in ``__post_init__``): every size is a positive int and
``num_attention_heads % num_kv_heads == 0`` (grouped-query attention shares each KV head among a
whole number of query heads).

The KV cache holds a key and a value vector per layer, per KV head, per token, hence
``kv_bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * dtype_bytes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MLP_KINDS = ("swiglu", "gelu")

# Hugging Face dtype names -> bytes per element.
_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(slots=True, frozen=True)
class ModelPreset:
    """Shapes of one decoder-only transformer (no weights)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2
    mlp: str = "swiglu"
    # Llama-family lm heads are separate matrices; OPT presets set this to True.
    tie_word_embeddings: bool = False
    # Qwen2 has biases on q/k/v only; OPT's biases are implied by mlp="gelu".
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model preset name must be a non-empty string, got {self.name!r}")
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
            "dtype_bytes",
        ):
            value = getattr(self, field_name)
            # bool is an int subclass; True layers is a bug, not a size.
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"model preset {self.name!r}: {field_name} must be a positive int, "
                    f"got {value!r}"
                )
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"model preset {self.name!r}: num_attention_heads ({self.num_attention_heads}) "
                f"must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.mlp not in _MLP_KINDS:
            raise ValueError(
                f"model preset {self.name!r}: mlp must be one of {', '.join(_MLP_KINDS)}, "
                f"got {self.mlp!r}"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies across all layers (key + value)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def q_size(self) -> int:
        """Width of the query projection output (num_attention_heads * head_dim)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count computed from the shapes (see the module docstring for each family).

        Matches the published totals: llama3-8b 8,030,261,248; opt-13b 12,853,473,280.
        """
        hidden = self.hidden_size
        has_biases = self.mlp == "gelu"  # OPT: every linear and norm has a bias
        # q and o are hidden x q_size; k and v are hidden x kv_size.
        attention = 2 * hidden * self.q_size + 2 * hidden * self.kv_size
        if has_biases:
            attention += self.q_size + 2 * self.kv_size + hidden
        elif self.qkv_bias:
            attention += self.q_size + 2 * self.kv_size
        if self.mlp == "swiglu":
            mlp = 3 * hidden * self.intermediate_size
        else:
            mlp = 2 * hidden * self.intermediate_size
            mlp += self.intermediate_size + hidden  # fc1 and fc2 biases
        norm = 2 * hidden if has_biases else hidden  # LayerNorm has weight + bias; RMSNorm weight
        per_layer = attention + mlp + 2 * norm  # pre-attention and pre-MLP norms
        embeddings = self.vocab_size * hidden
        if has_biases:
            embeddings += (self.max_position_embeddings + 2) * hidden  # OPT's offset of 2
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * hidden
        return embeddings + self.num_layers * per_layer + norm + lm_head


def _llama(name: str, *shape: int, qkv_bias: bool = False) -> ModelPreset:
    return ModelPreset(name, *shape, dtype_bytes=2, mlp="swiglu", qkv_bias=qkv_bias)


def _opt(name: str, *shape: int) -> ModelPreset:
    return ModelPreset(name, *shape, dtype_bytes=2, mlp="gelu", tie_word_embeddings=True)


# Values from each model's public Hugging Face config.json. Order of the shape arguments:
# layers, hidden, heads, kv heads, head dim, intermediate, vocab, max positions.
MODEL_PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        _llama("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192),
        _llama("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
        _llama("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
        # max positions as in Qwen2.5-7B-Instruct (the base model's config says 131072).
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, qkv_bias=True),
        _opt("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 2048),
        _opt("opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 2048),
        _opt("opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 2048),
        # Llama-shaped models for the real engine (random weights from a seed): ``tiny`` for tests
        # and the CPU engine (its 512-token vocabulary is the smallest that trace pseudo-tokens
        # allow), ``small`` for quick CPU timing, and two of a few hundred million parameters.
        _llama("tiny", 2, 64, 4, 2, 16, 128, 512, 512),
        _llama("small", 4, 256, 8, 4, 32, 704, 4096, 2048),
        _llama("llama-125m", 12, 768, 12, 4, 64, 2048, 32000, 2048),
        _llama("llama-350m", 24, 1024, 16, 8, 64, 2816, 32000, 2048),
    )
}


def get_model_preset(name_or_path: str | Path) -> ModelPreset:
    """Return a preset by name (case-insensitive) or read one from a Hugging Face config.json.

    ``name_or_path`` may be a preset name, a path to a ``config.json``, or a folder holding one.
    Raises ValueError for an unknown name or an unreadable/incomplete config file.
    """
    key = str(name_or_path).strip().lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return preset_from_hf_config(path)
    raise ValueError(
        f"unknown model {str(name_or_path)!r}: not a preset and not a config.json path; "
        f"available presets: {', '.join(MODEL_PRESETS)}"
    )


def preset_from_hf_config(path: str | Path) -> ModelPreset:
    """Build a preset from a Hugging Face ``config.json`` (Llama-style or OPT)."""
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read model config {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model config {path}: expected a JSON object at the top level")

    def required(*keys: str) -> Any:
        for config_key in keys:
            if config_key in config:
                return config[config_key]
        raise ValueError(f"model config {path}: missing key {' or '.join(map(repr, keys))}")

    model_type = str(config.get("model_type", "")).lower()
    is_opt = model_type == "opt" or ("ffn_dim" in config and "intermediate_size" not in config)
    num_attention_heads = required("num_attention_heads")
    hidden_size = required("hidden_size")
    if not isinstance(num_attention_heads, int) or num_attention_heads <= 0:
        raise ValueError(
            f"model config {path}: num_attention_heads must be a positive int, "
            f"got {num_attention_heads!r}"
        )
    # Configs written by transformers >= 4.56 say "dtype"; older ones "torch_dtype".
    dtype_name = config.get("torch_dtype", config.get("dtype")) or "float16"
    if dtype_name not in _DTYPE_BYTES:
        raise ValueError(
            f"model config {path}: unsupported torch_dtype {dtype_name!r} "
            f"(expected one of {', '.join(_DTYPE_BYTES)})"
        )
    head_dim = config.get("head_dim")
    if head_dim is None and isinstance(hidden_size, int):
        head_dim = hidden_size // num_attention_heads
    name = str(config.get("_name_or_path") or path.resolve().parent.name or path.stem)
    return ModelPreset(
        name=name,
        num_layers=required("num_hidden_layers"),
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        # absent (or null): multi-head attention, as transformers reads it; 0 stays 0 and is refused
        num_kv_heads=num_attention_heads if config.get("num_key_value_heads") is None else config["num_key_value_heads"],
        head_dim=head_dim,
        intermediate_size=required("ffn_dim") if is_opt else required("intermediate_size"),
        vocab_size=required("vocab_size"),
        max_position_embeddings=required("max_position_embeddings"),
        dtype_bytes=_DTYPE_BYTES[dtype_name],
        mlp="gelu" if is_opt else "swiglu",
        # transformers' own defaults: OPTConfig ties the head, Llama/Mistral/Qwen2 configs don't.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", is_opt)),
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")) and not is_opt,
    )


def format_params(num_params: int) -> str:
    """Human-readable parameter count: 8.03B, 125.2M."""
    if num_params >= 10**9:
        return f"{num_params / 1e9:.2f}B"
    if num_params >= 10**6:
        return f"{num_params / 1e6:.1f}M"
    return f"{num_params:,}"

