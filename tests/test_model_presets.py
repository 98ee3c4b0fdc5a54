"""Model presets: public shapes, derived sizes, validation and loading Hugging Face configs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pagesim.engine.model_presets import MODEL_PRESETS, ModelPreset, get_model_preset

# (layers, hidden, heads, kv heads, head dim, intermediate, vocab, max positions, mlp)
PUBLIC_SHAPES = {
    "llama3-8b": (32, 4096, 32, 8, 128, 14336, 128256, 8192, "swiglu"),
    "llama3-70b": (80, 8192, 64, 8, 128, 28672, 128256, 8192, "swiglu"),
    "llama2-7b": (32, 4096, 32, 32, 128, 11008, 32000, 4096, "swiglu"),
    "llama2-13b": (40, 5120, 40, 40, 128, 13824, 32000, 4096, "swiglu"),
    "mistral-7b": (32, 4096, 32, 8, 128, 14336, 32000, 32768, "swiglu"),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064, 32768, "swiglu"),
    "opt-13b": (40, 5120, 40, 40, 128, 20480, 50272, 2048, "gelu"),
    "opt-66b": (64, 9216, 72, 72, 128, 36864, 50272, 2048, "gelu"),
    "opt-175b": (96, 12288, 96, 96, 128, 49152, 50272, 2048, "gelu"),
    "tiny": (2, 64, 4, 2, 16, 128, 512, 512, "swiglu"),
    "small": (4, 256, 8, 4, 32, 704, 4096, 2048, "swiglu"),
    "llama-125m": (12, 768, 12, 4, 64, 2048, 32000, 2048, "swiglu"),
    "llama-350m": (24, 1024, 16, 8, 64, 2816, 32000, 2048, "swiglu"),
    "tiny-swa": (2, 64, 4, 2, 16, 128, 512, 512, "swiglu"),
    # From the public config.json of each (text model); MoE entries give the dense intermediate_size
    # (DeepSeek: its first three layers; Mixtral and gpt-oss: the experts' own, as their configs do).
    "llama3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256, 131072, "swiglu"),
    "llama3.1-70b": (80, 8192, 64, 8, 128, 28672, 128256, 131072, "swiglu"),
    "llama3.1-405b": (126, 16384, 128, 8, 128, 53248, 128256, 131072, "swiglu"),
    "llama3.3-70b": (80, 8192, 64, 8, 128, 28672, 128256, 131072, "swiglu"),
    "mistral-7b-v0.3": (32, 4096, 32, 8, 128, 14336, 32768, 32768, "swiglu"),
    "mixtral-8x7b": (32, 4096, 32, 8, 128, 14336, 32000, 32768, "swiglu"),
    "mixtral-8x22b": (56, 6144, 48, 8, 128, 16384, 32768, 65536, "swiglu"),
    "qwen2.5-72b": (80, 8192, 64, 8, 128, 29568, 152064, 32768, "swiglu"),
    "qwen3-8b": (36, 4096, 32, 8, 128, 12288, 151936, 40960, "swiglu"),
    "qwen3-32b": (64, 5120, 64, 8, 128, 25600, 151936, 40960, "swiglu"),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 6144, 151936, 40960, "swiglu"),
    "qwen3-235b-a22b": (94, 4096, 64, 4, 128, 12288, 151936, 40960, "swiglu"),
    "deepseek-v3": (61, 7168, 128, 128, 128, 18432, 129280, 163840, "swiglu"),
    "deepseek-r1": (61, 7168, 128, 128, 128, 18432, 129280, 163840, "swiglu"),
    "gpt-oss-20b": (24, 2880, 64, 8, 64, 2880, 201088, 131072, "swiglu"),
    "gpt-oss-120b": (36, 2880, 64, 8, 64, 2880, 201088, 131072, "swiglu"),
    "gemma-3-27b": (62, 5376, 32, 16, 128, 21504, 262208, 131072, "swiglu"),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_SHAPES))
def test_preset_shapes(name):
    preset = MODEL_PRESETS[name]
    assert (
        preset.num_layers,
        preset.hidden_size,
        preset.num_attention_heads,
        preset.num_kv_heads,
        preset.head_dim,
        preset.intermediate_size,
        preset.vocab_size,
        preset.max_position_embeddings,
        preset.mlp,
    ) == PUBLIC_SHAPES[name]
    assert preset.dtype_bytes == 2
    assert preset.name == name


def test_presets_listed_are_exactly_the_public_ones():
    assert set(MODEL_PRESETS) == set(PUBLIC_SHAPES)


@pytest.mark.parametrize(
    ("name", "num_params"),
    [
        # Published totals (model cards / summing the safetensors shapes).
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("mistral-7b", 7_241_732_096),
        ("qwen2.5-7b", 7_615_616_512),
        ("opt-13b", 12_853_473_280),
    ],
)
def test_num_params_matches_published_counts(name, num_params):
    assert MODEL_PRESETS[name].num_params == num_params


def test_num_params_by_hand_for_tiny():
    # embed 512*64 + untied head 512*64; per layer q,o 64*64, k,v 64*32, mlp 3*64*128, 2 norms of 64
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert MODEL_PRESETS["tiny"].num_params == 2 * 512 * 64 + 2 * per_layer + 64


def test_tying_the_lm_head_removes_one_embedding_matrix():
    llama = MODEL_PRESETS["llama3-8b"]
    tied = dataclasses.replace(llama, tie_word_embeddings=True)
    assert llama.num_params - tied.num_params == llama.vocab_size * llama.hidden_size


def test_kv_bytes_per_token():
    assert MODEL_PRESETS["llama3-8b"].kv_bytes_per_token == 131_072
    assert MODEL_PRESETS["llama2-7b"].kv_bytes_per_token == 524_288  # 512 KiB: no GQA
    assert MODEL_PRESETS["opt-13b"].kv_bytes_per_token == 819_200  # paper: 800 KB
    assert MODEL_PRESETS["tiny"].kv_bytes_per_token == 2 * 2 * 2 * 16 * 2


def test_presets_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODEL_PRESETS["tiny"].num_layers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_layers": 0}, "num_layers must be a positive int"),
        ({"hidden_size": -1}, "hidden_size must be a positive int"),
        ({"head_dim": 16.0}, "head_dim must be a positive int"),
        ({"vocab_size": True}, "vocab_size must be a positive int"),
        ({"num_kv_heads": 3}, r"heads \(4\) must be a multiple of num_kv_heads \(3\)"),
        ({"mlp": "relu"}, "mlp must be one of swiglu, gelu"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_validation_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(MODEL_PRESETS["tiny"], **changes)


def test_every_preset_cites_its_config():
    for preset in MODEL_PRESETS.values():
        assert preset.source, preset.name


def test_get_by_name_is_case_insensitive():
    assert get_model_preset("Llama3-8B") is MODEL_PRESETS["llama3-8b"]
    assert get_model_preset(" tiny ") is MODEL_PRESETS["tiny"]


def test_unknown_name_lists_presets():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*llama3-8b.*tiny"):
        get_model_preset("gpt-5")
    with pytest.raises(ValueError, match="did you mean llama3.1-8b"):
        get_model_preset("llama3.1-8")


def test_a_folder_named_like_a_model_is_read_as_a_folder(tmp_path):
    folder = tmp_path / "Llama-3.1-8B-Instruct"  # normalises to llama3.1-8b, but holds its own config
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(LLAMA3_8B_CONFIG, num_hidden_layers=2)))
    assert get_model_preset(folder).num_layers == 2


LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def test_hf_config_file_and_folder_match_the_preset(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    from_file = get_model_preset(folder / "config.json")
    from_folder = get_model_preset(str(folder))
    assert from_file == from_folder
    assert from_file.name == "Meta-Llama-3-8B"
    assert dataclasses.replace(from_file, name="llama3-8b") == MODEL_PRESETS["llama3-8b"]


def test_hf_config_defaults_and_dtype(tmp_path):
    config = dict(LLAMA3_8B_CONFIG, torch_dtype="float32")
    del config["num_key_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    preset = get_model_preset(path)
    assert preset.num_kv_heads == 32  # defaults to num_attention_heads
    assert preset.head_dim == 128  # hidden / heads
    assert preset.dtype_bytes == 4


def test_hf_opt_config(tmp_path):
    # As in facebook/opt-13b's config.json: ffn_dim, no intermediate_size, no kv heads.
    config = {
        "model_type": "opt",
        "hidden_size": 5120,
        "ffn_dim": 20480,
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "max_position_embeddings": 2048,
        "vocab_size": 50272,
        "torch_dtype": "float16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    preset = get_model_preset(path)
    assert dataclasses.replace(preset, name="opt-13b") == MODEL_PRESETS["opt-13b"]


def test_hf_config_missing_key_names_file_and_key(tmp_path):
    config = dict(LLAMA3_8B_CONFIG)
    del config["vocab_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: missing key 'vocab_size'"):
        get_model_preset(path)


def test_hf_config_bad_json_and_bad_dtype(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read model config .*config.json"):
        get_model_preset(path)
    path.write_text(json.dumps(dict(LLAMA3_8B_CONFIG, torch_dtype="int8")))
    with pytest.raises(ValueError, match="unsupported torch_dtype 'int8'"):
        get_model_preset(path)


def test_folder_without_config_is_unknown(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        get_model_preset(tmp_path)


def test_constructing_by_keyword():
    preset = ModelPreset(
        name="x", num_layers=1, hidden_size=8, num_attention_heads=2, num_kv_heads=1, head_dim=4,
        intermediate_size=16, vocab_size=10, max_position_embeddings=32,
    )
    assert preset.kv_bytes_per_token == 2 * 1 * 1 * 4 * 2
