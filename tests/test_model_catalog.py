"""The model catalog against the public configs: KV bytes per token, KV-cache layer groups,
parameter counts, weight bytes, finding a model by name and reading its ``config.json``.

Every expected number is worked out here from the public ``config.json`` values (text model),
written out as literals, never taken from the code under test. The values are those collected in
the research notes for this catalog: Hugging Face configs of meta-llama/Llama-3.1-*, Qwen/Qwen2.5-*,
Qwen/Qwen3-*, mistralai/Mistral-7B-*, mistralai/Mixtral-*, deepseek-ai/DeepSeek-V3 / R1,
openai/gpt-oss-* and google/gemma-3-27b-it, and vLLM 0.33's KV-cache grouping
(``vllm/v1/core/kv_cache_planning.py``, ``_get_kv_cache_groups_uniform_page_size``).

KV bytes per token (bf16, all layers, no window applied):
- GQA: ``2 (K and V) x layers x kv_heads x head_dim x 2 bytes``;
- MLA (DeepSeek V3 / R1): ``layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes``: vLLM caches the
  512-element latent plus the 64-element shared rotary key, nothing per head.
"""

from __future__ import annotations

import json
import math

import pytest

import pagesim.engine.cli as cli
from pagesim.engine.catalog.kv_layout import kv_layout
from pagesim.engine.catalog.lookup import normalise
from pagesim.engine.catalog.params import weight_bytes
from pagesim.engine.model_presets import MODEL_PRESETS, ModelPreset, get_model_preset, preset_from_hf_config

# ------------------------------------------------------------------------------------------------
# 1. KV bytes per token, for every catalog entry
# ------------------------------------------------------------------------------------------------

KV_BYTES_PER_TOKEN = {
    # GQA / MHA: 2 x layers x kv_heads x head_dim x 2 bytes
    "llama3-8b": 2 * 32 * 8 * 128 * 2,
    "llama3-70b": 2 * 80 * 8 * 128 * 2,
    "llama3.1-8b": 2 * 32 * 8 * 128 * 2,
    "llama3.1-70b": 2 * 80 * 8 * 128 * 2,
    "llama3.1-405b": 2 * 126 * 8 * 128 * 2,
    "llama3.3-70b": 2 * 80 * 8 * 128 * 2,
    "llama2-7b": 2 * 32 * 32 * 128 * 2,
    "llama2-13b": 2 * 40 * 40 * 128 * 2,
    "mistral-7b": 2 * 32 * 8 * 128 * 2,
    "mistral-7b-v0.3": 2 * 32 * 8 * 128 * 2,
    "mixtral-8x7b": 2 * 32 * 8 * 128 * 2,
    "mixtral-8x22b": 2 * 56 * 8 * 128 * 2,
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,
    "qwen2.5-72b": 2 * 80 * 8 * 128 * 2,
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,
    "qwen3-32b": 2 * 64 * 8 * 128 * 2,
    "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2,
    "qwen3-235b-a22b": 2 * 94 * 4 * 128 * 2,
    # MLA: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
    "deepseek-v3": 61 * (512 + 64) * 2,
    "deepseek-r1": 61 * (512 + 64) * 2,
    "gpt-oss-20b": 2 * 24 * 8 * 64 * 2,
    "gpt-oss-120b": 2 * 36 * 8 * 64 * 2,
    "gemma-3-27b": 2 * 62 * 16 * 128 * 2,
    "opt-13b": 2 * 40 * 40 * 128 * 2,
    "opt-66b": 2 * 64 * 72 * 128 * 2,
    "opt-175b": 2 * 96 * 96 * 128 * 2,
    # pagesim's own random-weight models (shapes in pagesim/engine/catalog/models.py)
    "tiny": 2 * 2 * 2 * 16 * 2,
    "tiny-swa": 2 * 2 * 2 * 16 * 2,
    "small": 2 * 4 * 4 * 32 * 2,
    "llama-125m": 2 * 12 * 4 * 64 * 2,
    "llama-350m": 2 * 24 * 8 * 64 * 2,
}


def test_every_catalog_entry_has_a_hand_computed_kv_size():
    assert set(MODEL_PRESETS) == set(KV_BYTES_PER_TOKEN)


def test_the_issues_worked_examples():
    assert KV_BYTES_PER_TOKEN["llama3.1-8b"] == 131_072
    assert KV_BYTES_PER_TOKEN["qwen3-32b"] == 262_144
    assert KV_BYTES_PER_TOKEN["deepseek-v3"] == 70_272
    assert MODEL_PRESETS["llama3.1-8b"].kv_bytes_per_token == 131_072
    assert MODEL_PRESETS["qwen3-32b"].kv_bytes_per_token == 262_144
    assert MODEL_PRESETS["deepseek-v3"].kv_bytes_per_token == 70_272


@pytest.mark.parametrize("name", sorted(KV_BYTES_PER_TOKEN))
def test_kv_bytes_per_token(name):
    model = MODEL_PRESETS[name]
    assert model.kv_bytes_per_token == KV_BYTES_PER_TOKEN[name]
    assert kv_layout(model).bytes_per_token == KV_BYTES_PER_TOKEN[name]


@pytest.mark.parametrize("name", sorted(KV_BYTES_PER_TOKEN))
def test_fp8_kv_cache_halves_the_bytes(name):
    # Every catalog model is 16-bit; fp8 stores one byte per element.
    assert kv_layout(MODEL_PRESETS[name], kv_cache_dtype="fp8").bytes_per_token == KV_BYTES_PER_TOKEN[name] // 2


# ------------------------------------------------------------------------------------------------
# 2. pagesim memory --json
# ------------------------------------------------------------------------------------------------


def _memory_json(capsys, *argv: str) -> dict:
    assert cli.main(["memory", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("model", "bytes_per_token", "context_length"),
    [
        ("llama3.1-8b", 2 * 32 * 8 * 128 * 2, 131_072),
        ("qwen3-32b", 2 * 64 * 8 * 128 * 2, 40_960),
        ("deepseek-v3", 61 * (512 + 64) * 2, 163_840),
    ],
)
def test_memory_cli_bytes_per_token_and_context(capsys, model, bytes_per_token, context_length):
    result = _memory_json(capsys, "--model", model)
    assert result["model_name"] == model
    assert result["bytes_per_token"] == bytes_per_token
    assert result["context_length"] == context_length
    assert result["max_model_len"] == context_length  # defaults to max_position_embeddings


def test_memory_cli_llama31_8b_is_the_issues_example(capsys):
    result = _memory_json(capsys, "--model", "llama3.1-8b")
    assert (result["bytes_per_token"], result["context_length"], result["max_model_len"]) == (131_072, 131_072, 131_072)


def test_memory_cli_fp8_kv_cache(capsys):
    result = _memory_json(capsys, "--model", "deepseek-v3", "--kv-cache-dtype", "fp8")
    assert result["bytes_per_token"] == 61 * (512 + 64) * 1


def _blocks(length: int, block_size: int, window: int | None) -> int:
    """Blocks a request of ``length`` tokens holds in one group: ceil(L/bs), less (sliding) the
    blocks wholly behind the window, floor(max(0, L - W) / bs)."""
    full = math.ceil(length / block_size)
    return full if window is None else full - max(0, length - window) // block_size


def test_blocks_helper_by_hand():
    # The hand arithmetic below, written out once so the helper itself is checked.
    assert _blocks(1000, 16, 128) == 63 - 54  # ceil(1000/16) = 63, floor(872/16) = 54
    assert _blocks(3000, 16, 1024) == 188 - 123  # ceil(3000/16) = 188, floor(1976/16) = 123
    assert _blocks(1040, 16, 1024) == 65 - 1
    assert _blocks(129, 16, 128) == 9
    assert _blocks(129, 16, None) == 9


def test_memory_cli_gpt_oss_120b_groups(capsys):
    # 36 layers, layer_types alternating sliding (128) / full, layer 0 sliding: two types of 18
    # layers, so group_size 18 and two groups, ordered by their first layer.
    lengths = [100, 128, 129, 300, 1000]
    result = _memory_json(capsys, "--model", "gpt-oss-120b", "--lengths", ",".join(map(str, lengths)),
                          "--block-size", "16")
    groups = result["groups"]
    assert [(g["kind"], g["window"], g["layers"]) for g in groups] == [
        ("sliding", 128, list(range(0, 36, 2))),
        ("full", None, list(range(1, 36, 2))),
    ]
    assert result["group_size"] == 18
    # sliding: 7, 8, 9, ceil(300/16)=19 - floor(172/16)=10 -> 9, 63 - 54 -> 9
    assert groups[0]["blocks"] == 7 + 8 + 9 + 9 + 9
    assert groups[0]["blocks"] == sum(_blocks(n, 16, 128) for n in lengths)
    assert groups[0]["tokens"] == 100 + 128 + 128 + 128 + 128
    # full: ceil(L/16)
    assert groups[1]["blocks"] == 7 + 8 + 9 + 19 + 63
    assert groups[1]["tokens"] == sum(lengths)
    assert result["paged_blocks"] == 42 + 106
    assert [r["blocks"] for r in result["requests"]] == [7 + 7, 8 + 8, 9 + 9, 9 + 19, 9 + 63]
    # one block of one group: 16 tokens x 18 layers x (2 x 8 KV heads x 64 x 2 bytes)
    assert result["block_bytes"] == 16 * 18 * 2 * 8 * 64 * 2
    assert result["bytes_per_token"] == 2 * 36 * 8 * 64 * 2


def test_memory_cli_gemma3_27b_groups(capsys):
    # 62 layers, every 6th full ((i + 1) % 6 == 0: 5, 11, ..., 59): 52 sliding (1024) and 10 full.
    # vLLM: group_size = 10 (the smaller type; 52 >= 1.5 x 10), the sliding type split into
    # ceil(52 / 10) = 6 groups as layers[i::6] (9, 9, 9, 9, 8, 8 layers, padded to 10), then the
    # full type as one group of 10.
    sliding = [i for i in range(62) if (i + 1) % 6 != 0]
    full = [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert len(sliding) == 52
    lengths = [500, 1024, 1025, 1040, 3000]
    result = _memory_json(capsys, "--model", "gemma-3-27b", "--lengths", ",".join(map(str, lengths)),
                          "--block-size", "16")
    groups = result["groups"]
    assert len(groups) == 7
    assert result["group_size"] == 10
    assert [(g["kind"], g["window"], g["layers"]) for g in groups] == [
        *(("sliding", 1024, sliding[i::6]) for i in range(6)),
        ("full", None, full),
    ]
    assert [len(g["layers"]) for g in groups] == [9, 9, 9, 9, 8, 8, 10]
    # sliding: ceil(500/16)=32; 64; 65 - floor(1/16)=0 -> 65; 65 - floor(16/16)=1 -> 64; 188 - 123 -> 65
    for group in groups[:6]:
        assert group["blocks"] == 32 + 64 + 65 + 64 + 65
        assert group["blocks"] == sum(_blocks(n, 16, 1024) for n in lengths)
        assert group["tokens"] == 500 + 1024 + 1024 + 1024 + 1024
    assert groups[6]["blocks"] == 32 + 64 + 65 + 65 + 188
    assert groups[6]["tokens"] == sum(lengths)
    assert result["paged_blocks"] == 6 * 290 + 414
    # 16 tokens x 10 layers (padding included) x (2 x 16 KV heads x 128 x 2 bytes)
    assert result["block_bytes"] == 16 * 10 * 2 * 16 * 128 * 2
    assert result["bytes_per_token"] == 2 * 62 * 16 * 128 * 2  # no padding, no window


def test_models_whose_layers_are_alike_are_one_group(capsys):
    # Mistral 7B v0.1: every layer slides (4096); DeepSeek: MLA everywhere; Llama: full everywhere.
    assert [(g["window"], len(g["layers"])) for g in _memory_json(capsys, "--model", "mistral-7b")["groups"]] \
        == [(4096, 32)]
    assert [(g["window"], len(g["layers"])) for g in _memory_json(capsys, "--model", "deepseek-v3")["groups"]] \
        == [(None, 61)]
    assert [(g["window"], len(g["layers"])) for g in _memory_json(capsys, "--model", "llama3.1-405b")["groups"]] \
        == [(None, 126)]


# ------------------------------------------------------------------------------------------------
# 3. Parameter counts
# ------------------------------------------------------------------------------------------------

# Llama 3.1 405B: hidden 16384, 126 layers, 128 heads / 8 KV heads of 128, intermediate 53248,
# vocab 128256, untied lm head. Per layer: q and o 16384 x 16384, k and v 16384 x 1024, gate/up/down
# 3 x 16384 x 53248, two RMSNorms of 16384.
LLAMA31_405B = (
    2 * 128256 * 16384
    + 126 * (2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384)
    + 16384
)

# Mixtral 8x7B: hidden 4096, 32 layers, 32 heads / 8 KV heads of 128, 8 experts of 14336 (2 per
# token), router 4096 x 8, vocab 32000, untied.
MIXTRAL_8X7B_EXPERT = 3 * 4096 * 14336
MIXTRAL_8X7B = (
    2 * 32000 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * MIXTRAL_8X7B_EXPERT + 4096 * 8 + 2 * 4096)
    + 4096
)
MIXTRAL_8X7B_ACTIVE = MIXTRAL_8X7B - 32 * (8 - 2) * MIXTRAL_8X7B_EXPERT

# DeepSeek V3 / R1 (61 layers, hidden 7168, 128 heads, vocab 129280, untied; the MTP layer 61 not
# counted). MLA per layer:
DEEPSEEK_V3_MLA = (
    7168 * 1536  # q_a_proj (q_lora_rank 1536)
    + 1536  # q_a_layernorm
    + 1536 * 128 * (128 + 64)  # q_b_proj: 128 heads x (qk_nope 128 + qk_rope 64)
    + 7168 * (512 + 64)  # kv_a_proj_with_mqa: kv_lora_rank 512 + qk_rope 64
    + 512  # kv_a_layernorm
    + 512 * 128 * (128 + 128)  # kv_b_proj: 128 heads x (qk_nope 128 + v_head 128)
    + 128 * 128 * 7168  # o_proj: 128 heads x v_head 128
)
DEEPSEEK_V3_EXPERT = 3 * 7168 * 2048  # moe_intermediate_size 2048
DEEPSEEK_V3 = (
    2 * 129280 * 7168  # embed_tokens + lm_head (926,679,040 each)
    + 61 * (DEEPSEEK_V3_MLA + 2 * 7168)  # attention + two RMSNorms per layer
    + 3 * (3 * 7168 * 18432)  # first_k_dense_replace 3 dense MLPs of 18432
    + 58 * (
        (256 + 1) * DEEPSEEK_V3_EXPERT  # n_routed_experts 256 + n_shared_experts 1
        + 256 * 7168  # gate
        + 256  # e_score_correction_bias (topk_method noaux_tc)
    )
    + 7168  # final norm
)
DEEPSEEK_V3_ACTIVE = DEEPSEEK_V3 - 58 * (256 - 8) * DEEPSEEK_V3_EXPERT  # 8 routed experts per token

# gpt-oss (hidden 2880, 64 heads / 8 KV heads of 64, vocab 201088, untied). Per layer: q/k/v/o with
# biases, one sink per head, two norms, a router with bias, and experts of 2880 whose gate_up
# (2880 x 5760) and down (2880 x 2880) projections carry biases.
GPT_OSS_EXPERT = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
GPT_OSS_LAYER_BUT_EXPERTS = (
    2 * 2880 * 4096 + 2 * 2880 * 512  # q, o (64 x 64 = 4096) and k, v (8 x 64 = 512)
    + 4096 + 512 + 512 + 2880  # q/k/v/o biases
    + 64  # sinks
    + 2 * 2880  # norms
)
GPT_OSS_120B = 2 * 201088 * 2880 + 36 * (GPT_OSS_LAYER_BUT_EXPERTS + 2880 * 128 + 128 + 128 * GPT_OSS_EXPERT) + 2880
GPT_OSS_120B_ACTIVE = GPT_OSS_120B - 36 * (128 - 4) * GPT_OSS_EXPERT
GPT_OSS_20B = 2 * 201088 * 2880 + 24 * (GPT_OSS_LAYER_BUT_EXPERTS + 2880 * 32 + 32 + 32 * GPT_OSS_EXPERT) + 2880
GPT_OSS_20B_ACTIVE = GPT_OSS_20B - 24 * (32 - 4) * GPT_OSS_EXPERT

# Qwen3 32B: hidden 5120, 64 layers, 64 heads / 8 KV heads of 128, intermediate 25600, vocab
# 151936, untied, q/k RMSNorms of head_dim 128 per layer.
QWEN3_32B = (
    2 * 151936 * 5120
    + 64 * (2 * 5120 * 8192 + 2 * 5120 * 1024 + 2 * 128 + 3 * 5120 * 25600 + 2 * 5120)
    + 5120
)
QWEN3_8B = 2 * 151936 * 4096 + 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096) + 4096

# Qwen3 MoE: every layer MoE, no shared experts, router hidden x 128.
QWEN3_30B_A3B_EXPERT = 3 * 2048 * 768
QWEN3_30B_A3B = (
    2 * 151936 * 2048
    + 48 * (2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 128 * QWEN3_30B_A3B_EXPERT + 2048 * 128 + 2 * 2048)
    + 2048
)
QWEN3_30B_A3B_ACTIVE = QWEN3_30B_A3B - 48 * (128 - 8) * QWEN3_30B_A3B_EXPERT
QWEN3_235B_EXPERT = 3 * 4096 * 1536
QWEN3_235B = (
    2 * 151936 * 4096
    + 94 * (2 * 4096 * 8192 + 2 * 4096 * 512 + 2 * 128 + 128 * QWEN3_235B_EXPERT + 4096 * 128 + 2 * 4096)
    + 4096
)
QWEN3_235B_ACTIVE = QWEN3_235B - 94 * (128 - 8) * QWEN3_235B_EXPERT

# Llama 3.1 8B / 70B and 3.3 70B (same shapes as Llama 3 8B / 70B).
LLAMA31_8B = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
LLAMA31_70B = 2 * 128256 * 8192 + 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 8192

# Mixtral 8x22B: hidden 6144, 56 layers, 48 heads / 8 KV heads of 128, 8 experts of 16384, vocab 32768.
MIXTRAL_8X22B_EXPERT = 3 * 6144 * 16384
MIXTRAL_8X22B = (
    2 * 32768 * 6144
    + 56 * (2 * 6144 * 6144 + 2 * 6144 * 1024 + 8 * MIXTRAL_8X22B_EXPERT + 6144 * 8 + 2 * 6144)
    + 6144
)
MIXTRAL_8X22B_ACTIVE = MIXTRAL_8X22B - 56 * 6 * MIXTRAL_8X22B_EXPERT

# Mistral 7B v0.3: the v0.1 shapes with a 32768-token vocabulary.
MISTRAL_7B_V03 = 2 * 32768 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096

# Qwen2.5 72B: hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, intermediate 29568, vocab
# 152064, untied, q/k/v biases (8192 + 1024 + 1024).
QWEN25_72B = (
    2 * 152064 * 8192
    + 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + (8192 + 2 * 1024) + 3 * 8192 * 29568 + 2 * 8192)
    + 8192
)

# Gemma 3 27B text model: hidden 5376, 62 layers, 32 heads / 16 KV heads of 128, intermediate
# 21504, vocab 262208 tied to the embedding, q/k norms, four norms per layer.
GEMMA3_27B = (
    262208 * 5376
    + 62 * (2 * 5376 * 4096 + 2 * 5376 * 2048 + 2 * 128 + 3 * 5376 * 21504 + 4 * 5376)
    + 5376
)


@pytest.mark.parametrize(
    ("name", "num_params", "num_active_params"),
    [
        ("llama3.1-8b", LLAMA31_8B, LLAMA31_8B),
        ("llama3.1-70b", LLAMA31_70B, LLAMA31_70B),
        ("llama3.1-405b", LLAMA31_405B, LLAMA31_405B),
        ("llama3.3-70b", LLAMA31_70B, LLAMA31_70B),
        ("mistral-7b-v0.3", MISTRAL_7B_V03, MISTRAL_7B_V03),
        ("mixtral-8x7b", MIXTRAL_8X7B, MIXTRAL_8X7B_ACTIVE),
        ("mixtral-8x22b", MIXTRAL_8X22B, MIXTRAL_8X22B_ACTIVE),
        ("qwen2.5-72b", QWEN25_72B, QWEN25_72B),
        ("qwen3-8b", QWEN3_8B, QWEN3_8B),
        ("qwen3-32b", QWEN3_32B, QWEN3_32B),
        ("qwen3-30b-a3b", QWEN3_30B_A3B, QWEN3_30B_A3B_ACTIVE),
        ("qwen3-235b-a22b", QWEN3_235B, QWEN3_235B_ACTIVE),
        ("deepseek-v3", DEEPSEEK_V3, DEEPSEEK_V3_ACTIVE),
        ("deepseek-r1", DEEPSEEK_V3, DEEPSEEK_V3_ACTIVE),
        ("gpt-oss-20b", GPT_OSS_20B, GPT_OSS_20B_ACTIVE),
        ("gpt-oss-120b", GPT_OSS_120B, GPT_OSS_120B_ACTIVE),
        ("gemma-3-27b", GEMMA3_27B, GEMMA3_27B),
    ],
)
def test_num_params_by_hand(name, num_params, num_active_params):
    model = MODEL_PRESETS[name]
    assert model.num_params == num_params
    assert model.num_active_params == num_active_params


def test_hand_sums_are_the_published_exact_totals():
    # Sanity of the hand sums themselves against the figures quoted in the issue.
    assert LLAMA31_405B == 405_853_388_800
    assert MIXTRAL_8X7B == 46_702_792_704
    assert GPT_OSS_120B == 116_829_156_672
    assert DEEPSEEK_V3 == 671_026_419_200  # 926,679,040 embedding and as much lm head included


@pytest.mark.parametrize(
    ("name", "card_total", "card_active"),
    [
        ("llama3.1-405b", 405e9, None),  # Llama 3.1 card: "405B"
        ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mistral: "46.7B total, 12.9B active"
        ("mixtral-8x22b", 141e9, 39e9),  # Mistral: "141B total, 39B active" (140.63B: 0.26% under)
        ("deepseek-v3", 671e9, 37.5e9),  # DeepSeek README: "671B total"; 37.55B active by hand (card: "37B")
        ("gpt-oss-120b", 116.83e9, None),  # card: "117B"; 116.83B by hand
        ("qwen3-32b", 32.8e9, None),  # Qwen3-32B card: "32.8B"
        ("qwen3-30b-a3b", 30.5e9, None),  # card: "30.5B in total"
        ("qwen3-8b", 8.2e9, None),  # card: "8.2B"
        ("qwen2.5-72b", 72.7e9, None),  # card: "72.7B"
        ("gemma-3-27b", 27.0e9, None),  # tech report: 25.6B language + 1.4B embedding
    ],
)
def test_num_params_within_half_a_percent_of_the_card(name, card_total, card_active):
    model = MODEL_PRESETS[name]
    assert model.num_params == pytest.approx(card_total, rel=0.005)
    if card_active is not None:
        assert model.num_active_params == pytest.approx(card_active, rel=0.005)


# ------------------------------------------------------------------------------------------------
# 4. Names
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b"),
        ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "llama3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama3.1-8b"),  # the repository's first name
        ("Llama3.1-8B", "llama3.1-8b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama3.1-70b"),
        ("meta-llama/Llama-3.1-405B-Instruct", "llama3.1-405b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3.3-70b"),
        ("Meta-Llama-3-8B-Instruct", "llama3-8b"),
        ("meta-llama/Meta-Llama-3-70B", "llama3-70b"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
    ],
)
def test_hugging_face_ids_resolve(typed, name):
    assert get_model_preset(typed) is MODEL_PRESETS[name]


def test_every_preset_name_resolves_to_itself():
    from pagesim.engine.catalog.lookup import resolve_model_name
    from pagesim.engine.model_presets import MODEL_PRESETS

    assert [n for n in MODEL_PRESETS if resolve_model_name(n) != n] == []  # llama-350m was read as llama350m
    assert normalise("llama-2-7b") == "llama2-7b" and normalise("Llama-3.1-70B-Instruct") == "llama3.1-70b"


def test_normalise_drops_organisation_case_and_chat_suffixes():
    assert normalise("meta-llama/Llama-3.1-8B-Instruct") == "llama3.1-8b"
    assert normalise("google/gemma-3-27b-it") == "gemma-3-27b"
    assert normalise("Meta-Llama-3-8B-Instruct") == "llama3-8b"


@pytest.mark.parametrize("typed", ["mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B-v0.2"])
def test_mistral_v02_does_not_pass_for_v01(typed):
    # v0.2 has no sliding window (v0.1's 4096) and another RoPE base: not the same model.
    with pytest.raises(ValueError) as error:
        get_model_preset(typed)
    message = str(error.value)
    assert f"unknown model {typed!r}" in message
    assert "did you mean" in message
    near = message.split("did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert "mistral-7b-v0.3" in near and "mistral-7b" in near
    assert "\n" not in message


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b-v0.3"), ("Qwen/Qwen3-33B", "qwen3-32b"), ("gpt-5", None)],
)
def test_unknown_names_through_the_cli_exit_2_with_one_line(capsys, typed, suggested):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["memory", "--json", "--model", typed])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"pagesim memory: error: unknown model {typed!r}")
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n")
    assert "Traceback" not in captured.err
    if suggested is not None:
        assert suggested in captured.err.split("did you mean ", 1)[1].split("?", 1)[0]


# ------------------------------------------------------------------------------------------------
# 5. Reading config.json
# ------------------------------------------------------------------------------------------------


def _shapes(m: ModelPreset) -> dict:
    """The fields that decide KV bytes, parameters and weight bytes, and what follows from them."""
    return {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "intermediate_size": m.intermediate_size,
        "vocab_size": m.vocab_size, "max_position_embeddings": m.max_position_embeddings,
        "dtype_bytes": m.dtype_bytes, "tie_word_embeddings": m.tie_word_embeddings, "qkv_bias": m.qkv_bias,
        "o_bias": m.o_bias, "qk_norm": m.qk_norm, "norms_per_layer": m.norms_per_layer,
        "attention": m.attention, "mla": m.mla, "moe": m.moe, "sliding_window": m.sliding_window,
        "layer_types": m.resolved_layer_types, "attention_sinks": m.attention_sinks,
        "weight_format": m.weight_format, "kv_bytes_per_token": m.kv_bytes_per_token,
        "num_params": m.num_params, "num_active_params": m.num_active_params,
    }


def _read(tmp_path, config: dict) -> ModelPreset:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return preset_from_hf_config(path)


LLAMA31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B-Instruct (the first upload: no head_dim key)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
    "eos_token_id": [128001, 128008, 128009],
}

MIXTRAL_8X7B_CONFIG = {  # mistralai/Mixtral-8x7B-Instruct-v0.1
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}

QWEN3_32B_CONFIG = {  # Qwen/Qwen3-32B
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 25600, "max_position_embeddings": 40960,
    "max_window_layers": 64, "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}

QWEN3_30B_A3B_CONFIG = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}

QWEN3_235B_A22B_CONFIG = dict(  # Qwen/Qwen3-235B-A22B
    QWEN3_30B_A3B_CONFIG, hidden_size=4096, intermediate_size=12288, max_window_layers=94, moe_intermediate_size=1536,
    num_attention_heads=64, num_hidden_layers=94, num_key_value_heads=4,
)

DEEPSEEK_V3_CONFIG = {  # deepseek-ai/DeepSeek-V3 (R1: the same shapes)
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 4,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280,
}


def _gpt_oss_config(num_layers: int, num_experts: int) -> dict:
    # openai/gpt-oss-*: the official file has no torch_dtype; its unquantized tensors are bf16.
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2),
        "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": num_layers, "num_key_value_heads": 8, "num_local_experts": num_experts,
        "output_router_logits": False, "pad_token_id": 199999,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
        "vocab_size": 201088,
    }


# google/gemma-3-27b-it: the official text_config holds exactly these keys; vocab_size (262208),
# max_position_embeddings (131072), sliding_window_pattern (6) and tie_word_embeddings (True) are
# Gemma3TextConfig's defaults.
GEMMA3_27B_TEXT_CONFIG_OFFICIAL = {
    "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
}


def _gemma3_config(text_config: dict) -> dict:
    return {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "text_config": text_config,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16,
                          "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
    }


MISTRAL_7B_V01_CONFIG = {  # mistralai/Mistral-7B-v0.1
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}

QWEN25_7B_CONFIG = {  # Qwen/Qwen2.5-7B-Instruct (transformers 4.43.1: the window is written, and off)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 152064,
}


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (LLAMA31_8B_CONFIG, "llama3.1-8b"),
        (MIXTRAL_8X7B_CONFIG, "mixtral-8x7b"),
        (QWEN3_32B_CONFIG, "qwen3-32b"),
        (QWEN3_30B_A3B_CONFIG, "qwen3-30b-a3b"),
        (QWEN3_235B_A22B_CONFIG, "qwen3-235b-a22b"),
        (DEEPSEEK_V3_CONFIG, "deepseek-v3"),
        (_gpt_oss_config(36, 128), "gpt-oss-120b"),
        (_gpt_oss_config(24, 32), "gpt-oss-20b"),
        (MISTRAL_7B_V01_CONFIG, "mistral-7b"),
        (QWEN25_7B_CONFIG, "qwen2.5-7b"),
        (dict(QWEN25_7B_CONFIG, sliding_window=None), "qwen2.5-7b"),  # re-saved by newer transformers
        (_gemma3_config(dict(GEMMA3_27B_TEXT_CONFIG_OFFICIAL, vocab_size=262208, max_position_embeddings=131072,
                             sliding_window_pattern=6)), "gemma-3-27b"),
    ],
    ids=["llama3.1-8b", "mixtral-8x7b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
         "gpt-oss-120b", "gpt-oss-20b", "mistral-7b-v0.1", "qwen2.5-7b", "qwen2.5-7b-resaved", "gemma-3-27b"],
)
def test_hf_config_reads_as_the_catalog_entry(tmp_path, config, name):
    assert _shapes(_read(tmp_path, config)) == _shapes(MODEL_PRESETS[name])


def test_hf_config_gemma3_official_text_config(tmp_path):
    # The file as google/gemma-3-27b-it ships it: transformers fills in vocab_size,
    # max_position_embeddings and sliding_window_pattern from Gemma3TextConfig's defaults.
    read = _read(tmp_path, _gemma3_config(GEMMA3_27B_TEXT_CONFIG_OFFICIAL))
    assert _shapes(read) == _shapes(MODEL_PRESETS["gemma-3-27b"])


def test_hf_config_gemma3_default_sliding_window_pattern(tmp_path):
    # Without sliding_window_pattern (absent from the official file) transformers uses 6: layers
    # 5, 11, ..., 59 are full attention. A window on all 62 layers would undercount their KV.
    read = _read(tmp_path, _gemma3_config(dict(GEMMA3_27B_TEXT_CONFIG_OFFICIAL, vocab_size=262208,
                                                max_position_embeddings=131072)))
    types = read.resolved_layer_types
    assert [i for i, kind in enumerate(types) if kind == "full"] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert types.count("sliding") == 52


def test_hf_config_deepseek_v3_by_hand(tmp_path):
    read = _read(tmp_path, DEEPSEEK_V3_CONFIG)
    assert read.attention == "mla"
    assert (read.mla.kv_lora_rank, read.mla.qk_rope_head_dim, read.mla.q_lora_rank) == (512, 64, 1536)
    assert (read.moe.num_experts, read.moe.experts_per_token, read.moe.intermediate_size) == (256, 8, 2048)
    assert (read.moe.shared_experts, read.moe.first_dense_layers) == (1, 3)
    assert read.weight_format == "fp8"  # quantization_config fmt e4m3
    assert read.sliding_window is None
    assert read.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert read.num_params == DEEPSEEK_V3
    assert read.num_active_params == DEEPSEEK_V3_ACTIVE


def test_hf_config_gpt_oss_by_hand(tmp_path):
    read = _read(tmp_path, _gpt_oss_config(36, 128))
    assert read.weight_format == "mxfp4"
    assert read.sliding_window == 128
    assert read.resolved_layer_types == ("sliding", "full") * 18  # layer 0 slides
    assert (read.moe.num_experts, read.moe.experts_per_token, read.moe.intermediate_size) == (128, 4, 2880)
    assert read.kv_bytes_per_token == 2 * 36 * 8 * 64 * 2
    assert read.num_params == GPT_OSS_120B
    assert read.num_active_params == GPT_OSS_120B_ACTIVE


def test_hf_config_mistral_v01_slides_on_every_layer_and_v02_on_none(tmp_path):
    v01 = _read(tmp_path, MISTRAL_7B_V01_CONFIG)
    assert v01.sliding_window == 4096
    assert v01.resolved_layer_types == ("sliding",) * 32
    assert [(g.window, len(g.layers)) for g in kv_layout(v01).groups] == [(4096, 32)]
    # Mistral-7B-Instruct-v0.2: sliding_window null, rope_theta 1e6.
    v02 = _read(tmp_path, dict(MISTRAL_7B_V01_CONFIG, sliding_window=None, rope_theta=1000000.0))
    assert v02.sliding_window is None
    assert v02.resolved_layer_types == ("full",) * 32
    assert v02.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_hf_config_qwen25_window_is_off(tmp_path):
    read = _read(tmp_path, QWEN25_7B_CONFIG)
    assert read.sliding_window is None
    assert read.qkv_bias  # Qwen2 always has q/k/v biases
    assert read.num_params == 7_615_616_512  # the Hugging Face API figure for Qwen2.5-7B-Instruct


def test_hf_config_qwen3_moe_by_hand(tmp_path):
    read = _read(tmp_path, QWEN3_30B_A3B_CONFIG)
    assert (read.moe.num_experts, read.moe.experts_per_token, read.moe.intermediate_size) == (128, 8, 768)
    assert (read.moe.shared_experts, read.moe.first_dense_layers) == (0, 0)
    assert read.qk_norm
    assert read.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert read.num_params == QWEN3_30B_A3B


def test_hf_config_mixtral_by_hand(tmp_path):
    read = _read(tmp_path, MIXTRAL_8X7B_CONFIG)
    assert (read.moe.num_experts, read.moe.experts_per_token, read.moe.intermediate_size) == (8, 2, 14336)
    assert read.sliding_window is None
    assert read.num_params == MIXTRAL_8X7B
    assert read.num_active_params == MIXTRAL_8X7B_ACTIVE


def test_hf_config_gemma3_layers(tmp_path):
    read = _read(tmp_path, _gemma3_config(dict(GEMMA3_27B_TEXT_CONFIG_OFFICIAL, vocab_size=262208,
                                                max_position_embeddings=131072, sliding_window_pattern=6)))
    types = read.resolved_layer_types
    assert [i for i, kind in enumerate(types) if kind == "full"] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert types.count("sliding") == 52 and types[0] == "sliding"
    assert read.sliding_window == 1024
    assert read.tie_word_embeddings
    assert read.num_params == GEMMA3_27B


# ------------------------------------------------------------------------------------------------
# 6. Weight bytes
# ------------------------------------------------------------------------------------------------


def test_deepseek_v3_fp8_weight_bytes():
    # FP8 checkpoint: every linear weight (attention, dense MLPs, shared and routed experts) one byte;
    # embedding, lm head, router and norms/biases two (the 128 x 128 block scales left out).
    sixteen_bit = 2 * 129280 * 7168 + 58 * 256 * 7168 + (61 * (1536 + 512 + 2 * 7168) + 58 * 256 + 7168)
    one_byte = DEEPSEEK_V3 - sixteen_bit
    assert one_byte == 61 * DEEPSEEK_V3_MLA - 61 * (1536 + 512) + 3 * 3 * 7168 * 18432 + 58 * 257 * DEEPSEEK_V3_EXPERT
    total = weight_bytes(MODEL_PRESETS["deepseek-v3"]).total
    assert total == one_byte * 1 + sixteen_bit * 2
    # The issue's rough figure: 671B params x 1 byte + embedding and lm head 2 x 926.7M x 2 bytes.
    assert total == pytest.approx(671e9 + 2 * 926.7e6 * 2, rel=0.02)


def test_gpt_oss_120b_mxfp4_weight_bytes():
    # Routed-expert weights (not their biases) in MXFP4: 4 bits + one 8-bit scale per 32 = 4.25 bits.
    expert_weights = 36 * 128 * 3 * 2880 * 2880
    total = weight_bytes(MODEL_PRESETS["gpt-oss-120b"]).total
    assert total == expert_weights * 4.25 / 8 + (GPT_OSS_120B - expert_weights) * 2
    assert total / 2**30 == pytest.approx(60.8, abs=0.05)
    assert total < 80e9  # OpenAI: fits a single 80 GB GPU


@pytest.mark.parametrize(
    ("name", "num_params"),
    [("llama3.1-8b", LLAMA31_8B), ("llama3.1-405b", LLAMA31_405B), ("qwen3-32b", QWEN3_32B),
     ("gemma-3-27b", GEMMA3_27B), ("mixtral-8x7b", MIXTRAL_8X7B)],
)
def test_bf16_weight_bytes_are_two_per_param(name, num_params):
    assert weight_bytes(MODEL_PRESETS[name], "bf16").total == 2 * num_params


def test_deepseek_v3_in_bf16_is_twice_its_fp8():
    # Every weight two bytes when asked for bf16, FP8 checkpoint or not.
    assert weight_bytes(MODEL_PRESETS["deepseek-v3"], "bf16").total == 2 * DEEPSEEK_V3


# ------------------------------------------------------------------------------------------------
# 7. pagesim presets --json
# ------------------------------------------------------------------------------------------------


def test_presets_cli_lists_every_model(capsys):
    assert cli.main(["presets", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)["model_presets"]
    assert set(listing) == set(KV_BYTES_PER_TOKEN)
    for name, entry in listing.items():
        for key in ("context_length", "num_params", "num_active_params", "attention_type", "kv_bytes_per_token"):
            assert key in entry, (name, key)
        assert entry["kv_bytes_per_token"] == KV_BYTES_PER_TOKEN[name], name
        assert entry["num_active_params"] <= entry["num_params"], name
    expected = {
        # name: (context_length, num_params, num_active_params, attention type)
        "llama3.1-8b": (131072, LLAMA31_8B, LLAMA31_8B, "GQA"),
        "llama3.1-405b": (131072, LLAMA31_405B, LLAMA31_405B, "GQA"),
        "qwen3-32b": (40960, QWEN3_32B, QWEN3_32B, "GQA"),
        "mixtral-8x7b": (32768, MIXTRAL_8X7B, MIXTRAL_8X7B_ACTIVE, "GQA"),
        "deepseek-v3": (163840, DEEPSEEK_V3, DEEPSEEK_V3_ACTIVE, "MLA"),
        "gpt-oss-120b": (131072, GPT_OSS_120B, GPT_OSS_120B_ACTIVE, "GQA, 18/36 layers sliding window 128"),
        "gemma-3-27b": (131072, GEMMA3_27B, GEMMA3_27B, "GQA, 52/62 layers sliding window 1024"),
        "mistral-7b": (32768, None, None, "GQA, sliding window 4096"),
        "llama2-7b": (4096, None, None, "MHA"),
    }
    for name, (context, total, active, attention) in expected.items():
        entry = listing[name]
        assert entry["context_length"] == context, name
        assert entry["attention_type"] == attention, name
        if total is not None:
            assert (entry["num_params"], entry["num_active_params"]) == (total, active), name
