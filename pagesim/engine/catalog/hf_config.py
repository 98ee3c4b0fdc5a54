"""A ``ModelPreset`` from a Hugging Face ``config.json``: the keys each architecture uses for the
shapes that matter here.

Read as transformers reads them: Llama, Mistral (``sliding_window``), Mixtral
(``num_local_experts``), Qwen2 / Qwen2.5 (q/k/v biases), Qwen3 (q/k norms) and Qwen3-MoE
(``num_experts``, ``moe_intermediate_size``), DeepSeek V2 / V3 (MLA: ``kv_lora_rank``,
``qk_rope_head_dim``, ...; ``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``),
gpt-oss (``layer_types``, sinks, MXFP4 experts), Gemma 3 (``text_config``,
``sliding_window_pattern`` or ``layer_types``) and OPT (``ffn_dim``). A ``quantization_config``
of FP8 or MXFP4 sets the checkpoint's weight format. Layouts that only some layers of a model use
beyond these (Qwen3-MoE ``mlp_only_layers``, ``decoder_sparse_step`` other than 1) are refused by
name rather than counted wrong.

Any other architecture (``architectures`` / ``model_type`` not among ``KNOWN_ARCHITECTURES`` /
``KNOWN_MODEL_TYPES``) is read with Llama's keys and noted (``ModelConfigWarning``: one
``warning:`` line), since its shapes may mean something else there; and refused where its config
has a key that changes the shapes in a way those keys do not say (``UNREAD_SHAPE_KEYS``: Falcon's
multi-query attention, Jamba's Mamba layers, ChatGLM's KV groups, ...), rather than simulated as
a Llama of the wrong size.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from pagesim.engine.catalog.model import MlaShape, ModelPreset, MoeShape
from pagesim.engine.files import InputFileError, read_json

# Hugging Face dtype names -> bytes per element.
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
# Keys a family's published config leaves to transformers' defaults (Gemma3TextConfig:
# google/gemma-3-27b-it's text_config omits all three).
FAMILY_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6},
}
FAMILY_DEFAULTS["gemma3"] = FAMILY_DEFAULTS["gemma3_text"]


MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is a few KiB
# ModelPreset's field -> the config.json key it is read from, where they differ (for messages)
CONFIG_KEYS = {"num_kv_heads": "num_key_value_heads", "num_layers": "num_hidden_layers"}

#: The ``model_type`` values and ``architectures`` whose keys this module reads (the families above).
KNOWN_MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                               "deepseek_v3", "gpt_oss", "gemma3", "gemma3_text", "opt"})
KNOWN_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
    "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "OPTForCausalLM"})
#: Keys of other families that change the KV cache or the weights in a way Llama's keys do not
#: say: a config of an unknown architecture that has one is refused (its shapes cannot be trusted).
UNREAD_SHAPE_KEYS = {
    "multi_query": "multi-query attention (Falcon): one KV head, whatever num_key_value_heads says",
    "n_head_kv": "the KV heads under another name (Falcon)",
    "num_kv_heads": "the KV heads under another name (Falcon)",
    "new_decoder_architecture": "Falcon's grouped KV heads",
    "multi_query_group_num": "the KV heads under another name (ChatGLM)",
    "kv_channels": "the head size under another name (ChatGLM)",
    "attn_layer_period": "attention in some layers only, Mamba in the rest (Jamba)",
    "layers_block_type": "layers of other kinds than attention (Mamba, linear attention)",
    "ssm_cfg": "state-space (Mamba) layers",
    "mamba_d_state": "state-space (Mamba) layers",
    "linear_attn_config": "linear-attention layers",
    "rwkv_version": "RWKV: no attention KV cache",
}


class ModelConfigWarning(UserWarning):
    """A ``config.json`` read on an assumption (an architecture this module does not know)."""


def read_config_json(path: Path) -> Any:
    """The JSON in a ``config.json`` (a regular file of at most ``MAX_CONFIG_BYTES``), or a
    ``ValueError``: ``cannot read model config FILE[:LINE]: problem``."""
    try:
        return read_json(path, limit_bytes=MAX_CONFIG_BYTES, what="model config")
    except InputFileError as exc:
        raise ValueError(f"cannot read model config {exc}") from None


def preset_from_hf_config(path: str | Path) -> ModelPreset:
    """Build a preset from a Hugging Face ``config.json`` (see the module docstring for families)."""
    path = Path(path)
    outer = read_config_json(path)
    if not isinstance(outer, dict):
        raise ValueError(f"model config {path}: expected a JSON object at the top level")
    # Multimodal configs (Gemma 3) nest the language model under text_config.
    config = outer["text_config"] if isinstance(outer.get("text_config"), dict) else outer
    _check_architecture(path, config, outer)
    try:
        return _Reader(path, config, outer).preset()
    except ValueError as exc:  # ModelPreset's own checks speak of a "model preset NAME": this is the file
        message = str(exc)
        if message.startswith("model preset "):
            problem = message.partition(": ")[2] or message
            for field, key in CONFIG_KEYS.items():  # the preset's names for what the file calls otherwise
                problem = re.sub(rf"\b{field}\b", key, problem)
            raise ValueError(f"model config {path}: {problem}") from None
        raise


def _check_architecture(path: Path, config: dict, outer: dict) -> None:
    """Note (``ModelConfigWarning``) an architecture this module does not know, read as a Llama;
    refuse one whose config has a key that would make that reading wrong (``UNREAD_SHAPE_KEYS``)."""
    model_type = config.get("model_type", outer.get("model_type"))
    architectures = outer.get("architectures", config.get("architectures")) or []
    if not isinstance(architectures, list):
        architectures = [architectures]
    unknown_archs = [a for a in architectures if a not in KNOWN_ARCHITECTURES]
    known_type = isinstance(model_type, str) and model_type.lower() in KNOWN_MODEL_TYPES
    if known_type and not unknown_archs:
        return
    what = (f"architectures {architectures}" if architectures else "") + \
        (f"{' and ' if architectures else ''}model_type {model_type!r}" if model_type is not None else "") or \
        "no architecture (neither architectures nor model_type)"
    unread = [key for key in UNREAD_SHAPE_KEYS if key in config and config[key] not in (None, False)]
    if unread:
        key = unread[0]
        raise ValueError(f"model config {path}: {what} is not an architecture pagesim reads, and its {key} means "
                         f"{UNREAD_SHAPE_KEYS[key]}: read as a Llama its shapes would be wrong (pagesim reads "
                         f"{', '.join(sorted(KNOWN_MODEL_TYPES))})")
    warnings.warn(f"model config {path}: {what} is not an architecture pagesim knows; its shapes are read with "
                  f"Llama's keys (hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, "
                  f"num_hidden_layers): check them (pagesim reads {', '.join(sorted(KNOWN_MODEL_TYPES))})",
                  ModelConfigWarning, stacklevel=3)


class _Reader:
    def __init__(self, path: Path, config: dict, outer: dict):
        self.path, self.outer = path, outer
        self.model_type = str(config.get("model_type", outer.get("model_type", ""))).lower()
        self.config = {**FAMILY_DEFAULTS.get(self.model_type, {}), **config}

    def required(self, *keys: str) -> Any:
        for key in keys:
            if key in self.config and self.config[key] is not None:
                return self.config[key]
        raise ValueError(f"model config {self.path}: missing key {' or '.join(map(repr, keys))}")

    def fail(self, message: str) -> ValueError:
        return ValueError(f"model config {self.path}: {message}")

    def preset(self) -> ModelPreset:
        c = self.config
        is_opt = self.model_type == "opt" or ("ffn_dim" in c and "intermediate_size" not in c)
        heads = self.required("num_attention_heads")
        hidden = self.required("hidden_size")
        if not isinstance(heads, int) or heads <= 0:
            raise self.fail(f"num_attention_heads must be a positive int, got {heads!r}")
        # Configs written by transformers >= 4.56 say "dtype"; older ones "torch_dtype".
        dtype_name = c.get("torch_dtype", c.get("dtype", self.outer.get("torch_dtype"))) or "float16"
        if dtype_name not in DTYPE_BYTES:
            raise self.fail(f"unsupported torch_dtype {dtype_name!r} (expected one of {', '.join(DTYPE_BYTES)})")
        head_dim = c.get("head_dim")
        if head_dim is None and isinstance(hidden, int):
            head_dim = hidden // heads
        mla = self.mla()
        if mla is not None:
            head_dim = mla.v_head_dim
        num_layers = self.required("num_hidden_layers")
        window, layer_types = self.windows(num_layers)
        name = str(self.outer.get("_name_or_path") or c.get("_name_or_path") or self.path.resolve().parent.name
                   or self.path.stem)
        qwen2 = self.model_type in ("qwen2", "qwen2_moe")
        return ModelPreset(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            # absent (or null): multi-head attention, as transformers reads it; 0 stays 0 and is refused
            num_kv_heads=heads if c.get("num_key_value_heads") is None else c["num_key_value_heads"],
            head_dim=head_dim,
            intermediate_size=self.required("ffn_dim") if is_opt else self.required("intermediate_size"),
            vocab_size=self.required("vocab_size"),
            max_position_embeddings=self.required("max_position_embeddings"),
            dtype_bytes=DTYPE_BYTES[dtype_name],
            mlp="gelu" if is_opt else "swiglu",
            # transformers' own defaults: OPTConfig and Gemma 3 tie the head, Llama/Mistral/Qwen2 don't.
            tie_word_embeddings=bool(self.outer.get("tie_word_embeddings", c.get(
                "tie_word_embeddings", is_opt or self.model_type.startswith("gemma")))),
            qkv_bias=(bool(c.get("attention_bias", qwen2)) or qwen2) and not is_opt and mla is None,
            o_bias=self.model_type == "gpt_oss" and bool(c.get("attention_bias", True)),
            attention="mla" if mla is not None else "gqa",
            mla=mla,
            sliding_window=window,
            layer_types=layer_types,
            attention_sinks=self.model_type == "gpt_oss",
            qk_norm=self.model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
            norms_per_layer=4 if self.model_type.startswith("gemma3") else 2,
            moe=self.moe(num_layers),
            weight_format=self.weight_format(),
            source=str(self.path),
        )

    def mla(self) -> MlaShape | None:
        c = self.config
        if c.get("kv_lora_rank") is None:
            return None
        return MlaShape(
            kv_lora_rank=self.required("kv_lora_rank"), qk_nope_head_dim=self.required("qk_nope_head_dim"),
            qk_rope_head_dim=self.required("qk_rope_head_dim"), v_head_dim=self.required("v_head_dim"),
            q_lora_rank=c.get("q_lora_rank"),
        )

    def windows(self, num_layers: int) -> tuple[int | None, tuple[str, ...]]:
        """(window, per-layer kinds): ``layer_types``, Gemma 3's ``sliding_window_pattern``, or a
        window on every layer (Mistral 7B v0.1; ``use_sliding_window: false`` turns it off, Qwen2)."""
        c = self.config
        window = c.get("sliding_window")
        types = c.get("layer_types")
        if types is not None:
            kinds = {"sliding_attention": "sliding", "full_attention": "full"}
            if not isinstance(types, list) or any(t not in kinds for t in types):
                raise self.fail(f"layer_types must list 'sliding_attention' / 'full_attention', got {types!r}")
            resolved = tuple(kinds[t] for t in types)
            if "sliding" not in resolved:
                return None, ()
            if window is None:
                raise self.fail("layer_types has sliding layers but sliding_window is not set")
            return window, resolved
        if window is None or c.get("use_sliding_window") is False:
            return None, ()
        pattern = c.get("sliding_window_pattern")
        if pattern is not None:
            if not isinstance(pattern, int) or pattern < 1:
                raise self.fail(f"sliding_window_pattern must be a positive int, got {pattern!r}")
            if not isinstance(num_layers, int) or num_layers < 1:
                raise self.fail(f"num_hidden_layers must be a positive int, got {num_layers!r}")
            return window, tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
        return window, ()

    def moe(self, num_layers: int) -> MoeShape | None:
        c = self.config
        experts = c.get("num_local_experts", c.get("n_routed_experts", c.get("num_experts")))
        if not experts:
            return None
        if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
            raise self.fail("MoE layers interleaved with dense ones (mlp_only_layers / decoder_sparse_step) "
                            "are not modelled")
        per_token = c.get("num_experts_per_tok", c.get("experts_per_token"))
        if per_token is None:
            raise self.fail("missing key 'num_experts_per_tok'")
        width = c.get("moe_intermediate_size") or self.required("intermediate_size")
        deepseek = self.model_type.startswith("deepseek")
        return MoeShape(
            num_experts=experts, experts_per_token=per_token, intermediate_size=width,
            shared_experts=c.get("n_shared_experts") or 0, first_dense_layers=c.get("first_k_dense_replace") or 0,
            router_bias=self.model_type == "gpt_oss" or (deepseek and c.get("topk_method") == "noaux_tc"),
            expert_bias=self.model_type == "gpt_oss",
        )

    def weight_format(self) -> str | None:
        q = self.outer.get("quantization_config") or self.config.get("quantization_config")
        if not isinstance(q, dict):
            return None
        method = str(q.get("quant_method", q.get("fmt", ""))).lower()
        if method == "mxfp4":
            return "mxfp4"
        if method == "fp8" or str(q.get("fmt", "")).lower().startswith("e4m3"):
            return "fp8"
        raise self.fail(f"quantization_config {method!r} is not modelled (fp8 and mxfp4 are)")
