"""The engine's Llama model: logits against an independent from-scratch forward pass and against
transformers' LlamaForCausalLM; paged attention against the dense reference; Hugging Face folders
written and read back; bad folders refused by name."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F

from pagesim.engine.model import LlamaConfig, ModelConfigError, load_pretrained, logits_of, random_model, save_pretrained
from pagesim.engine.policy import ScheduledSequence
from pagesim.engine.runtime.attention import PagedAttention
from pagesim.engine.runtime.batch import build_batch
from pagesim.engine.runtime.kv_cache import PagedKVCache

TINY = LlamaConfig.named("tiny")
PROMPT = [7, 100, 3, 250, 42, 42, 9, 311, 18, 5, 77, 480, 1, 64, 200, 33, 90]


def plain_llama_logits(state: dict, config: LlamaConfig, tokens: list[int]) -> torch.Tensor:
    """Llama written out from its definition, in float64, from the weights alone (no engine code)."""
    w = {k: v.double() for k, v in state.items()}
    n, d, h, kvh = len(tokens), config.head_dim, config.num_heads, config.num_kv_heads

    def rms(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)

    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2).double() / d))
    ang = torch.arange(n).double()[:, None] * inv[None]
    cos, sin = ang.cos(), ang.sin()

    def rope(x):  # x [n, heads, d]; pairs (i, i + d/2) rotate together
        a, b = x[..., : d // 2], x[..., d // 2 :]
        c, s = cos[:, None], sin[:, None]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).view(n, h, d))
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).view(n, kvh, d))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, kvh, d)
        out = torch.empty(n, h, d, dtype=torch.float64)
        for head in range(h):
            kv = head // (h // kvh)
            scores = q[:, head] @ k[:, kv].T / d**0.5
            scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
            out[:, head] = torch.softmax(scores, -1) @ v[:, kv]
        x = x + out.reshape(n, h * d) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_logits_equal_a_plain_implementation(dtype, tol):
    model = random_model(TINY, seed=3, dtype=dtype)
    expected = plain_llama_logits(model.state_dict(), TINY, PROMPT)
    torch.testing.assert_close(logits_of(model, PROMPT).double(), expected, rtol=tol, atol=tol)


def test_tied_embeddings_use_the_embedding_as_head():
    config = replace(TINY, tie_word_embeddings=True)
    model = random_model(config, seed=1, dtype=torch.float64)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.testing.assert_close(logits_of(model, PROMPT), plain_llama_logits(state, config, PROMPT))


def _paged_logits(model, cache, seqs, tokens):
    batch = build_batch(SimpleNamespace(step=0, scheduled=seqs), lambda rid, i: tokens[rid], cache.device)
    attention = PagedAttention(cache, batch, backend="torch")
    return batch, model.logits(model.hidden_states(batch.input_ids, batch.positions, attention))


def test_paged_attention_equals_the_dense_reference_across_chunks_and_decodes():
    """Two sequences in scattered blocks: a prompt in two chunks, then decodes, batched together."""
    model = random_model(TINY, seed=0, dtype=torch.float64)
    cache = PagedKVCache(TINY, num_gpu_blocks=16, num_cpu_blocks=0, block_size=4, dtype=torch.float64,
                         device="cpu", poison=True)
    a, b = PROMPT, [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11]
    tokens = {"a": a, "b": b}
    tables = {"a": (11, 2, 7, 0, 14), "b": (5, 9, 1)}

    def seq(rid, start, n):
        return ScheduledSequence(rid, 0, start, n, tables[rid], 4, samples=start + n >= len(tokens[rid]))

    steps = [[seq("a", 0, 6), seq("b", 0, 11)], [seq("a", 6, 10)], [seq("a", 16, 1)]]
    dense = {rid: logits_of(model, t) for rid, t in tokens.items()}
    for scheduled in steps:
        batch, logits = _paged_logits(model, cache, scheduled, tokens)
        for row, s in enumerate(batch.seqs):  # rows are in kernel order: chunks first, then decodes
            start = sum(x.num_new_tokens for x in batch.seqs[:row])
            got = logits[start : start + s.num_new_tokens]
            want = dense[s.request_id][s.num_computed_tokens : s.num_computed_tokens + s.num_new_tokens]
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_transformers_llama_gives_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = random_model(TINY, seed=5, dtype=torch.float32)
    save_pretrained(model, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(logits_of(model, PROMPT), expected, rtol=1e-4, atol=1e-5)
    ours = load_pretrained(tmp_path)  # and transformers' own weights load back into ours
    torch.testing.assert_close(logits_of(ours, PROMPT), expected, rtol=1e-4, atol=1e-5)


def test_a_saved_folder_loads_back_identically(tmp_path):
    model = random_model(TINY, seed=2, dtype=torch.float32)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    loaded = load_pretrained(tmp_path)
    assert loaded.dtype == torch.float32
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q)
    assert load_pretrained(tmp_path, dtype=torch.float64).dtype == torch.float64


def test_random_weights_depend_only_on_the_seed():
    a = random_model(TINY, seed=4, dtype=torch.float64)
    b = random_model(TINY, seed=4, dtype=torch.float32)
    c = random_model(TINY, seed=5, dtype=torch.float32)
    wa, wb, wc = (m.model.layers[1].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa.float(), wb) and not torch.equal(wb, wc)


def _write_folder(tmp_path, mutate_config=None, drop=None):
    from safetensors.torch import load_file, save_file

    save_pretrained(random_model(TINY, seed=0), tmp_path)
    if mutate_config:
        config = json.loads((tmp_path / "config.json").read_text())
        mutate_config(config)
        (tmp_path / "config.json").write_text(json.dumps(config))
    if drop:
        state = load_file(str(tmp_path / "model.safetensors"))
        del state[drop]
        save_file(state, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("mutate,drop,message", [
    (None, "model.layers.1.mlp.down_proj.weight", r"missing tensor\(s\) model.layers.1.mlp.down_proj.weight"),
    (lambda c: c.update(intermediate_size=256), None, r"tensor model.layers.0.mlp.gate_proj.weight has shape \(128, 64\) "
                                                      r"but config.json implies \(256, 64\)"),
    (lambda c: c.update(num_hidden_layers=1), None, r"not in a Llama model of this config: model.layers.1"),
    (lambda c: c.update(model_type="opt"), None, "model_type is 'opt'; the engine runs Llama models"),
    (lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), None, "RoPE scaling is not supported"),
    (lambda c: c.pop("hidden_size"), None, "missing key 'hidden_size'"),
    (lambda c: c.update(num_key_value_heads=3), None, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    (lambda c: c.update(num_key_value_heads=0), None, "config.json: num_key_value_heads must be a positive int, got 0"),
])
def test_bad_model_folders_are_refused_by_name(tmp_path, mutate, drop, message):
    folder = _write_folder(tmp_path, mutate, drop)
    with pytest.raises(ModelConfigError, match=message):
        load_pretrained(folder)


def test_folder_without_weights_or_config(tmp_path):
    with pytest.raises(ModelConfigError, match="no config.json"):
        load_pretrained(tmp_path)
    save_pretrained(random_model(TINY), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelConfigError, match=r"no \*.safetensors files"):
        load_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelConfigError, match="not a readable safetensors file"):
        load_pretrained(tmp_path)


def test_a_folder_saved_by_transformers_loads_with_its_rope_base(tmp_path):
    """transformers >= 5 writes rope_parameters instead of rope_theta; a non-default base must be read."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, dtype=torch.float32)
    assert ours.config.rope_theta == 500000.0 and ours.config.tie_word_embeddings
    tokens = list(range(3, 300))
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits_of(ours, tokens), expected, rtol=1e-4, atol=1e-5)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    raw.pop("rope_scaling", None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError, match="RoPE scaling is not supported"):
        load_pretrained(tmp_path)
