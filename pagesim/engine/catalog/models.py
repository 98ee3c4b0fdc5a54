"""The model catalog: one entry per public configuration, each citing the ``config.json`` it follows.

Values are the text model's, from the Hugging Face repository named in ``source`` (shape order
of the helpers: layers, hidden, heads, KV heads, head dim, intermediate, vocab, context). The
context is ``max_position_embeddings``, which is vLLM's default ``--max-model-len``.

``ALIASES`` maps what people type (Hugging Face repository ids with or without the organisation,
``-Instruct`` / ``-it`` / ``-chat`` suffixes, dashes and dots as written) onto catalog names; the
normalisation itself is ``pagesim.engine.catalog.lookup``. A released *version* resolves only when it is
listed: ``Mistral-7B-Instruct-v0.2`` has no sliding window and another RoPE base than v0.1, so it
is not quietly taken for ``mistral-7b``.
"""

from __future__ import annotations

from pagesim.engine.catalog.model import MlaShape, ModelPreset, MoeShape


def _llama(name: str, *shape: int, source: str, **extra) -> ModelPreset:
    return ModelPreset(name, *shape, dtype_bytes=2, mlp="swiglu", source=source, **extra)


def _opt(name: str, *shape: int, source: str) -> ModelPreset:
    return ModelPreset(name, *shape, dtype_bytes=2, mlp="gelu", tie_word_embeddings=True, source=source)


def _every_nth_full(num_layers: int, n: int) -> tuple[str, ...]:
    """Sliding layers with every ``n``-th one full: Gemma 3's ``sliding_window_pattern`` (6) and
    gpt-oss's alternation (2), whose layer 0 slides."""
    return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(num_layers))


def _gpt_oss(name: str, num_layers: int, num_experts: int, source: str) -> ModelPreset:
    # openai/gpt-oss-*: 64 query heads of 64, 8 KV heads, alternating 128-token sliding-window and
    # full layers (layer_types), biases on q/k/v/o, a learned sink per head, experts in MXFP4.
    return ModelPreset(
        name, num_layers, 2880, 64, 8, 64, 2880, 201088, 131072, qkv_bias=True, o_bias=True,
        attention_sinks=True, sliding_window=128, layer_types=_every_nth_full(num_layers, 2),
        moe=MoeShape(num_experts, 4, 2880, router_bias=True, expert_bias=True), weight_format="mxfp4",
        source=source,
    )


def _deepseek_v3(name: str, source: str) -> ModelPreset:
    # deepseek-ai/DeepSeek-V3 (R1 has the same shapes): MLA with a 512-element latent and 64 rotary
    # dims, 256 routed experts (8 per token) + 1 shared, the first 3 layers dense, FP8 weights. The
    # multi-token-prediction layer (num_nextn_predict_layers) is not served without speculative
    # decoding and is left out.
    return ModelPreset(
        name, 61, 7168, 128, 128, 128, 18432, 129280, 163840, attention="mla",
        mla=MlaShape(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536),
        moe=MoeShape(256, 8, 2048, shared_experts=1, first_dense_layers=3, router_bias=True),
        weight_format="fp8", source=source,
    )


_ENTRIES = (
    _llama("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, source="meta-llama/Meta-Llama-3-8B"),
    _llama("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192, source="meta-llama/Meta-Llama-3-70B"),
    _llama("llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, source="meta-llama/Llama-3.1-8B-Instruct"),
    _llama("llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072, source="meta-llama/Llama-3.1-70B-Instruct"),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 131072,
           source="meta-llama/Llama-3.1-405B-Instruct"),
    _llama("llama3.3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072, source="meta-llama/Llama-3.3-70B-Instruct"),
    _llama("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, source="meta-llama/Llama-2-7b-hf"),
    _llama("llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, source="meta-llama/Llama-2-13b-hf"),
    # v0.1: every layer attends through a 4,096-token window (v0.2 and v0.3 dropped it).
    _llama("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, sliding_window=4096,
           source="mistralai/Mistral-7B-v0.1"),
    _llama("mistral-7b-v0.3", 32, 4096, 32, 8, 128, 14336, 32768, 32768, source="mistralai/Mistral-7B-Instruct-v0.3"),
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, moe=MoeShape(8, 2, 14336),
           source="mistralai/Mixtral-8x7B-Instruct-v0.1"),
    _llama("mixtral-8x22b", 56, 6144, 48, 8, 128, 16384, 32768, 65536, moe=MoeShape(8, 2, 16384),
           source="mistralai/Mixtral-8x22B-Instruct-v0.1"),
    # max positions as in Qwen2.5-*-Instruct (32,768; YaRN extends it, which vLLM needs asked for).
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, qkv_bias=True, source="Qwen/Qwen2.5-7B-Instruct"),
    _llama("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 32768, qkv_bias=True,
           source="Qwen/Qwen2.5-72B-Instruct"),
    _llama("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, qk_norm=True, source="Qwen/Qwen3-8B"),
    _llama("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, 40960, qk_norm=True, source="Qwen/Qwen3-32B"),
    _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960, qk_norm=True, moe=MoeShape(128, 8, 768),
           source="Qwen/Qwen3-30B-A3B"),
    _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936, 40960, qk_norm=True, moe=MoeShape(128, 8, 1536),
           source="Qwen/Qwen3-235B-A22B"),
    _deepseek_v3("deepseek-v3", "deepseek-ai/DeepSeek-V3"),
    _deepseek_v3("deepseek-r1", "deepseek-ai/DeepSeek-R1"),
    _gpt_oss("gpt-oss-20b", 24, 32, "openai/gpt-oss-20b"),
    _gpt_oss("gpt-oss-120b", 36, 128, "openai/gpt-oss-120b"),
    # google/gemma-3-27b-it's text_config: 5 sliding (1,024) layers per full one, 16 KV heads of 128,
    # q/k norms, four norms per layer, tied embeddings (the vision tower is not counted).
    ModelPreset("gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 262208, 131072, tie_word_embeddings=True,
                qk_norm=True, norms_per_layer=4, sliding_window=1024, layer_types=_every_nth_full(62, 6),
                source="google/gemma-3-27b-it"),
    _opt("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 2048, source="facebook/opt-13b"),
    _opt("opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 2048, source="facebook/opt-66b"),
    _opt("opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 2048, source="facebook/opt-175b (the OPT paper, Table 1)"),
    # Llama-shaped models for the real engine (random weights from a seed): ``tiny`` for tests
    # and the CPU engine (its 512-token vocabulary is the smallest that trace pseudo-tokens
    # allow), ``tiny-swa`` the same with its first layer attending through a 16-token window
    # (a hybrid KV cache of two layer groups), ``small`` for quick CPU timing, and two of a few
    # hundred million parameters.
    _llama("tiny", 2, 64, 4, 2, 16, 128, 512, 512, source="pagesim (random weights)"),
    _llama("tiny-swa", 2, 64, 4, 2, 16, 128, 512, 512, sliding_window=16, layer_types=("sliding", "full"),
           source="pagesim (random weights)"),
    _llama("small", 4, 256, 8, 4, 32, 704, 4096, 2048, source="pagesim (random weights)"),
    _llama("llama-125m", 12, 768, 12, 4, 64, 2048, 32000, 2048, source="pagesim (random weights)"),
    _llama("llama-350m", 24, 1024, 16, 8, 64, 2816, 32000, 2048, source="pagesim (random weights)"),
)

MODEL_PRESETS: dict[str, ModelPreset] = {preset.name: preset for preset in _ENTRIES}

#: Normalised names (``pagesim.engine.catalog.lookup.normalise``) that are not catalog names themselves.
ALIASES: dict[str, str] = {
    "mistral-7b-v0.1": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x22b-v0.1": "mixtral-8x22b",
    "deepseek-v3-0324": "deepseek-v3",
    "deepseek-v3-base": "deepseek-v3",
    "deepseek-r1-0528": "deepseek-r1",
    "gemma3-27b": "gemma-3-27b",
    "gpt-oss120b": "gpt-oss-120b",
    "gpt-oss20b": "gpt-oss-20b",
    "opt-175b": "opt-175b",
}
