"""The Llama model's configuration: shapes plus the few numbers the forward pass needs.

``LlamaConfig`` is what a Hugging Face Llama ``config.json`` says (RMSNorm epsilon, RoPE base,
tied head or not) on top of a ``ModelPreset``'s shapes, so the engine's model and the simulator's
cost model describe the same network. It comes from a preset name (random weights, any size from
``tiny`` to ``llama-350m``, or a real model's shapes) or from a ``config.json``, which must
describe a plain Llama: SiLU, no biases, no RoPE scaling; anything else is refused by name
rather than run wrongly. Layers may attend through a sliding window (``sliding_window`` on the
layers ``layer_types`` marks, or on all of them: Mistral 7B v0.1, whose ``model_type`` is
``mistral``; ``tiny-swa``); the engine's KV cache then has vLLM v1's layer groups.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pagesim.engine.catalog.hf_config import read_config_json
from pagesim.engine.model_presets import MODEL_PRESETS, ModelPreset, preset_from_hf_config, resolve_model_name


class ModelConfigError(ValueError):
    """A model folder or config that the engine cannot run as a Llama model."""


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # tokens a sliding layer attends (None: no such layer)
    layer_types: tuple[str, ...] = ()  # per layer "full" / "sliding"; (): all sliding if a window is set

    @classmethod
    def from_preset(cls, preset: ModelPreset, **extra: Any) -> LlamaConfig:
        extras = {"MoE experts": preset.moe is not None, "MLA": preset.mla is not None,
                  "attention biases": preset.qkv_bias or preset.o_bias, "attention sinks": preset.attention_sinks,
                  "q/k norms": preset.qk_norm, "extra norms": preset.norms_per_layer != 2,
                  "quantized weights": preset.weight_format not in (None, "bf16", "fp16", "fp32")}
        unsupported = [what for what, present in extras.items() if present]
        if preset.mlp != "swiglu" or unsupported:
            raise ModelConfigError(f"model {preset.name!r} is not a plain Llama (RMSNorm, SwiGLU, no biases)"
                                   + (f": it has {', '.join(unsupported)}" if unsupported else "")
                                   + "; the engine runs Llama-shaped models (simulate any catalog model)")
        return cls(
            name=preset.name, vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
            intermediate_size=preset.intermediate_size, num_layers=preset.num_layers,
            num_heads=preset.num_attention_heads, num_kv_heads=preset.num_kv_heads, head_dim=preset.head_dim,
            max_position_embeddings=preset.max_position_embeddings,
            tie_word_embeddings=preset.tie_word_embeddings, sliding_window=preset.sliding_window,
            layer_types=preset.layer_types, **extra,
        )

    def layer_window(self, layer: int) -> int | None:
        """The window layer ``layer`` attends through (None: full attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types and self.layer_types[layer] != "sliding":
            return None
        return self.sliding_window

    @classmethod
    def named(cls, name: str) -> LlamaConfig:
        """A preset by name (``tiny``, ``small``, ``llama-125m``, ``llama3-8b``, ...)."""
        key = resolve_model_name(name)
        if key is None:
            raise ModelConfigError(f"unknown model preset {name!r}; presets: {', '.join(MODEL_PRESETS)}")
        return cls.from_preset(MODEL_PRESETS[key])

    @classmethod
    def from_hf(cls, path: str | Path) -> LlamaConfig:
        """Read a Hugging Face ``config.json`` (or the folder holding one) of a Llama model."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not os.path.lexists(path):
            raise ModelConfigError(f"{path}: no config.json (a model folder holds config.json and *.safetensors)")
        try:
            raw = read_config_json(path)  # a FIFO, a device, a folder or a huge file: refused by name
        except ValueError as exc:
            raise ModelConfigError(str(exc)) from None
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type not in ("llama", "mistral"):
            raise ModelConfigError(f"{path}: model_type is {model_type!r}; the engine runs Llama models ('llama', "
                                   f"or 'mistral': Llama with a sliding window)")
        try:
            preset = preset_from_hf_config(path)
        except ValueError as exc:
            raise ModelConfigError(str(exc)) from None
        # transformers >= 5 writes RoPE settings as rope_parameters {rope_theta, rope_type, ...};
        # earlier versions as top-level rope_theta and rope_scaling.
        rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
        refused = {
            "hidden_act": (raw.get("hidden_act", "silu") != "silu", "only SiLU (SwiGLU) is supported"),
            "attention_bias": (bool(raw.get("attention_bias", False)), "attention biases are not supported"),
            "mlp_bias": (bool(raw.get("mlp_bias", False)), "MLP biases are not supported"),
            "rope_scaling": (_rope_scaled(raw.get("rope_scaling")), "RoPE scaling is not supported"),
            "rope_parameters": (_rope_scaled(rope or None), "RoPE scaling is not supported"),
        }
        for key, (bad, why) in refused.items():
            if bad:
                raise ModelConfigError(f"{path}: {key}={raw.get(key)!r}: {why}")
        try:
            eps = float(raw.get("rms_norm_eps", 1e-6))
            theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        except (TypeError, ValueError):
            raise ModelConfigError(f"{path}: rms_norm_eps and rope_theta must be numbers") from None
        if not (eps > 0 and theta > 0):
            raise ModelConfigError(f"{path}: rms_norm_eps and rope_theta must be positive")
        return cls.from_preset(preset, rms_norm_eps=eps, rope_theta=theta)

    # ------------------------------------------------------------- derived
    @property
    def preset(self) -> ModelPreset:
        """The shapes, as the simulator's cost model and the capacity calculator take them."""
        return ModelPreset(
            self.name, self.num_layers, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
            self.intermediate_size, self.vocab_size, self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, sliding_window=self.sliding_window,
            layer_types=self.layer_types,
        )

    def to_hf(self, torch_dtype: str) -> dict[str, Any]:
        """The ``config.json`` that ``transformers.LlamaForCausalLM`` reads back as this model (with a
        window on every layer, ``MistralForCausalLM``; a mix of sliding and full layers is written
        with ``layer_types``, which pagesim reads back and transformers' Llama does not)."""
        windows = {}
        model_type, architecture = "llama", "LlamaForCausalLM"
        if self.sliding_window is not None:
            windows["sliding_window"] = self.sliding_window
            if self.layer_types and "full" in self.layer_types:
                windows["layer_types"] = [f"{t}_attention" for t in self.layer_types]
            else:
                model_type, architecture = "mistral", "MistralForCausalLM"
        return {
            "architectures": [architecture], "model_type": model_type, "torch_dtype": torch_dtype, **windows,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "rope_scaling": None,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings, "_name_or_path": self.name,
        }

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "num_params": self.preset.num_params}


def _rope_scaled(value: Any) -> bool:
    if value is None:
        return False
    kind = value.get("rope_type", value.get("type", "default")) if isinstance(value, dict) else value
    return kind != "default"
