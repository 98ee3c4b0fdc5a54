"""vLLM 0.33 bench datasets as traces: each dataset's requests, in vLLM's order, with its counts.

Every expected value is computed here from vLLM's rules, reimplemented independently of
``pagesim.traces.bench`` (vLLM's global ``random.seed`` + ``random.shuffle``, its ``is_valid_sequence``,
its ``np.random.default_rng`` draw order), with a word-level tokenizer so every count is exact.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random

import numpy as np
import pytest

from pagesim.traces.bench import (PREFIX_CHUNK_TOKENS, add_dataset_args, custom_trace, dataset_name_given, dataset_trace,
                          hf_trace, load_tokenizer, prefix_repetition_trace, random_trace, sharegpt_trace)
from pagesim.traces.bench import reading
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders import detect_format, load_trace

SECRET = "SECRET-CONTENT"


# ---------------------------------------------------------------- helpers
@pytest.fixture
def word_tokenizer(tmp_path):
    """A WordLevel tokenizer (whitespace-split words, no special tokens): one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{k}": k + 1 for k in range(2000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tok"
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return load_tokenizer(str(path))


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{(start + k) % 2000}" for k in range(n))


def conversation(prompt_words: int, completion_words: int, start: int = 0, turns: int = 2) -> dict:
    conv = [{"from": "human", "value": words(prompt_words, start)},
            {"from": "gpt", "value": words(completion_words, start + 7)}]
    return {"id": f"c{start}", "conversations": (conv + conv)[:turns]}


def sharegpt_entries() -> list[dict]:
    entries = [
        conversation(5, 6, start=1),
        conversation(8, 8, start=2, turns=1),  # dropped at load: one turn
        {"id": "none"},  # dropped at load: no conversations
        conversation(3, 9, start=3),  # prompt too short
        conversation(9, 2, start=4),  # completion too short
        conversation(1025, 10, start=5),  # prompt too long
        conversation(1000, 1100, start=6),  # prompt + completion too long
        conversation(1024, 1024, start=7),  # exactly at both limits: kept
    ]
    entries += [conversation(4 + 3 * k, 10 + k, start=100 + k) for k in range(8)]
    # two prompts sharing their first 40 words (2 full chunks), then different
    entries.append({"id": "s1", "conversations": [{"from": "human", "value": words(40, 500) + " " + words(10, 900)},
                                                  {"from": "gpt", "value": words(12)}]})
    entries.append({"id": "s2", "conversations": [{"from": "human", "value": words(40, 500) + " " + words(20, 950)},
                                                  {"from": "gpt", "value": words(13)}]})
    return entries


def vllm_sharegpt(entries, count, *, seed, output_len=None, oversample=True):
    """vLLM 0.33 ShareGPTDataset.load_data + sample, with this test's word counts."""
    data = [e for e in entries if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    samples = []
    for entry in data:
        if len(samples) >= count:
            break
        prompt_len = len(entry["conversations"][0]["value"].split())
        out = len(entry["conversations"][1]["value"].split()) if output_len is None else output_len
        too_short = prompt_len < 4 or (output_len is None and out < 4)
        if too_short or prompt_len > 1024 or prompt_len + out > 2048:
            continue
        samples.append((prompt_len, out))
    if oversample and len(samples) < count:
        random.seed(seed)
        samples += [random.choice(samples) for _ in range(count - len(samples))]
    return samples


def write_json(path, value, *, gz=False):
    text = json.dumps(value)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def parser_args(argv):
    parser = argparse.ArgumentParser()
    add_dataset_args(parser)
    parser.add_argument("--num-prompts", dest="num_requests", type=int)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- tokenizer
def test_estimate_tokenizer_is_stated_and_stable(tmp_path):
    tok = load_tokenizer(None)
    assert "4 characters" in tok.describe
    assert len(tok.encode("abcdefghi")) == 3 and tok.encode("") == []
    assert tok.encode("hello world!") == tok.encode("hello world!")
    assert tok.encode("hello world, you")[:2] == tok.encode("hello world, me")[:2]
    with pytest.raises(ValueError, match="nowhere/tok"):
        load_tokenizer(str(tmp_path / "nowhere/tok"))
    (tmp_path / "bad.json").write_text("{" + SECRET)
    with pytest.raises(ValueError, match="bad.json") as info:
        load_tokenizer(str(tmp_path / "bad.json"))
    assert SECRET not in str(info.value)


def test_word_tokenizer_counts_words(word_tokenizer):
    assert word_tokenizer.encode(words(7)) == list(range(1, 8))
    assert word_tokenizer.num_special_tokens == 0
    assert "tokenizer.json" in word_tokenizer.describe


def test_random_random_equals_global_seed_shuffle():
    for n, seed in ((17, 0), (100, 42)):
        random.seed(seed)
        items = list(range(n))
        random.shuffle(items)
        ours = list(range(n))
        random.Random(seed).shuffle(ours)
        assert items == ours


# ---------------------------------------------------------------- sharegpt
@pytest.mark.parametrize("seed", [0, 7])
def test_sharegpt_follows_vllm(tmp_path, word_tokenizer, seed):
    entries = sharegpt_entries()
    path = write_json(tmp_path / "sg.json", entries)
    trace = sharegpt_trace(path, word_tokenizer, num_prompts=6, seed=seed)
    expected = vllm_sharegpt(entries, 6, seed=seed)
    assert list(zip(trace.prompt_len.tolist(), trace.output_len.tolist())) == expected
    assert not trace.has_arrivals and not trace.arrival_s.any()
    assert trace.metadata["dataset"] == "sharegpt" and trace.metadata["tokenizer"] == word_tokenizer.describe
    assert trace.prefix_block_tokens == PREFIX_CHUNK_TOKENS


def test_sharegpt_counts_every_skip_and_oversamples(tmp_path, word_tokenizer):
    entries = sharegpt_entries()
    path = write_json(tmp_path / "sg.json", entries)
    trace = sharegpt_trace(path, word_tokenizer, num_prompts=40, seed=3)
    expected = vllm_sharegpt(entries, 40, seed=3)
    assert list(zip(trace.prompt_len.tolist(), trace.output_len.tolist())) == expected
    meta = trace.metadata
    assert (meta["entries"], meta["dropped_fewer_than_two_turns"], meta["dropped_no_conversations"]) == (18, 1, 1)
    assert (meta["skipped_prompt_too_short"], meta["skipped_output_too_short"], meta["skipped_prompt_too_long"],
            meta["skipped_total_too_long"]) == (1, 1, 1, 1)
    assert meta["sampled"] == 12 and meta["oversampled"] == 28 and len(trace) == 40
    assert 1024 in trace.prompt_len  # the entry at both limits is kept
    with pytest.raises(ValueError):
        sharegpt_trace(path, word_tokenizer, num_prompts=0)
    short = sharegpt_trace(path, word_tokenizer, num_prompts=40, seed=3, oversample=False)
    assert len(short) == 12


def test_sharegpt_output_len_waives_only_the_output_minimum(tmp_path, word_tokenizer):
    entries = sharegpt_entries()
    path = write_json(tmp_path / "sg.json", entries)
    trace = sharegpt_trace(path, word_tokenizer, num_prompts=100, seed=0, output_len=1, oversample=False)
    assert list(zip(trace.prompt_len.tolist(), trace.output_len.tolist())) == \
        vllm_sharegpt(entries, 100, seed=0, output_len=1, oversample=False)
    assert trace.metadata["skipped_output_too_short"] == 0 and set(trace.output_len.tolist()) == {1}
    # the total rule uses the given output length: 1000 + 1100 was too long, 1000 + 1 fits
    assert trace.metadata["skipped_total_too_long"] == 0 and 1000 in trace.prompt_len
    big = sharegpt_trace(path, word_tokenizer, num_prompts=100, output_len=1030, oversample=False)
    assert big.metadata["skipped_total_too_long"] == 1  # 1024 + 1030 > 2048; 1000 + 1030 fits
    assert big.prompt_len.tolist() == [p for p, _ in vllm_sharegpt(entries, 100, seed=0, output_len=1030,
                                                                    oversample=False)]


def test_sharegpt_shared_prompt_text_shares_identities(tmp_path, word_tokenizer):
    entries = sharegpt_entries()
    path = write_json(tmp_path / "sg.json", entries)
    trace = sharegpt_trace(path, word_tokenizer, num_prompts=None, shuffle=False)  # file order
    ids = [trace.prefix_ids(i) for i in range(len(trace))]
    assert all(len(ids[i]) == math.ceil(trace.prompt_len[i] / 16) for i in range(len(trace)))
    s1, s2 = ids[-2], ids[-1]
    assert (s1[:2] == s2[:2]).all() and s1[2] != s2[2]
    others = {int(v) for row in ids[:-2] for v in row}
    assert not others & {int(v) for v in s1}


def test_sharegpt_gz_and_load_trace(tmp_path, word_tokenizer):
    entries = sharegpt_entries()
    path = write_json(tmp_path / "sg.json.gz", entries, gz=True)
    assert detect_format(path) == "sharegpt"
    trace = load_trace(path)
    assert trace.metadata["dataset"] == "sharegpt" and "estimate" in trace.metadata["tokenizer"]
    counted = load_trace(path, tokenizer=word_tokenizer)
    assert len(counted) == 12 and counted.metadata["skipped_prompt_too_long"] == 1
    assert sorted(counted.prompt_len.tolist()) == sorted(p for p, _ in vllm_sharegpt(entries, 100, seed=0, oversample=False))


@pytest.mark.parametrize("text, problem", [
    ('{"conversations": "' + SECRET + '"}', "expected a JSON array"),
    ('[{"conversations": [{"value": "' + SECRET + '"}, ]}]', "entry 0: not valid JSON"),
    ('[' + json.dumps(conversation(5, 5)) + ', {"id": "' + SECRET + '"}', "not closed"),
    ('[' + json.dumps(conversation(5, 5)) + '] "' + SECRET + '"', "text after the JSON array"),
    ('["' + SECRET + '"]', "entry 0: expected a JSON object"),
    ('[{"conversations": [{"value": 5}, {"value": "' + SECRET + '"}]}]', "turn 0"),
])
def test_sharegpt_errors_name_entry_and_line_not_content(tmp_path, word_tokenizer, text, problem):
    path = tmp_path / "bad.json"
    path.write_text("\n" + text)
    with pytest.raises(TraceFormatError, match=problem) as info:
        sharegpt_trace(path, word_tokenizer, num_prompts=1)
    assert SECRET not in str(info.value) and f"{path}:" in str(info.value)


def test_bounded_reading_refuses_a_large_entry(tmp_path, monkeypatch, word_tokenizer):
    monkeypatch.setattr(reading, "MAX_ENTRY_CHARS", 500)
    monkeypatch.setattr(reading, "READ_CHARS", 64)  # many refills
    small = [conversation(5, 6, start=k) for k in range(30)]
    path = write_json(tmp_path / "ok.json", small)
    entries = [entry for _, _, entry in reading.iter_json_array(path)]
    assert entries == small
    big = small[:3] + [{"conversations": [{"value": SECRET * 100}, {"value": "x"}]}]
    path = write_json(tmp_path / "big.json", big)
    with pytest.raises(TraceFormatError, match="entry 3 .*500 characters limit") as info:
        sharegpt_trace(path, word_tokenizer, num_prompts=1)
    assert SECRET not in str(info.value)
    monkeypatch.setattr(reading, "MAX_ENTRY_CHARS", 64 * 2**20)
    assert "64 MiB" in reading.limit_text(reading.MAX_ENTRY_CHARS)


def test_streamed_positions_are_lines_and_columns(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "READ_CHARS", 16)
    path = tmp_path / "lines.json"
    path.write_text('[\n  {"conversations": []},\n  {"conversations": []},\n  {"x": tru}\n]')
    expected = r"lines.json:4: entry 2: not valid JSON \(Expecting value, column 9\)"
    with pytest.raises(TraceFormatError, match=expected):
        list(reading.iter_json_array(path))


def test_fifo_is_refused(tmp_path, word_tokenizer):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="pipe.json: is a FIFO"):
        sharegpt_trace(fifo, word_tokenizer, num_prompts=1)
    with pytest.raises(TraceFormatError, match="FIFO"):
        load_trace(fifo)
    fifo_jsonl = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo_jsonl)
    with pytest.raises(TraceFormatError, match="FIFO"):
        custom_trace(fifo_jsonl, word_tokenizer, num_prompts=1)


# ---------------------------------------------------------------- random, prefix_repetition
@pytest.mark.parametrize("seed, input_len, output_len, ratio, prefix", [
    (0, 1024, 128, 0.0, 0), (5, 300, 50, 0.5, 32), (9, 100, 3, 0.9, 20)])
def test_random_lengths_equal_vllm_draws(seed, input_len, output_len, ratio, prefix):
    n = 50
    trace = random_trace(load_tokenizer(None), num_prompts=n, seed=seed, input_len=input_len,
                         output_len=output_len, range_ratio=ratio, prefix_len=prefix)
    rng = np.random.default_rng(seed)  # vLLM: get_sampling_params, inputs then outputs
    inputs = rng.integers(math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio)) + 1, size=n)
    outputs = rng.integers(max(1, math.floor(output_len * (1 - ratio))),
                           max(1, math.ceil(output_len * (1 + ratio))) + 1, size=n)
    assert (trace.prompt_len == prefix + inputs).all() and (trace.output_len == outputs).all()
    shared = prefix // 16
    first = [trace.prefix_ids(i) for i in range(n)]
    assert all((ids[:shared] == first[0][:shared]).all() for ids in first)
    tails = [int(v) for ids in first for v in ids[shared:]]
    assert len(tails) == len(set(tails))  # the rest is each request's own


def test_random_range_ratio_json_and_special_tokens(tmp_path):
    args = parser_args(["--dataset-name", "random", "--num-prompts", "20", "--seed", "4",
                        "--random-range-ratio", '{"input": 0.25, "output": 0.0}', "--random-input-len", "64"])
    trace = dataset_trace(args)
    rng = np.random.default_rng(4)
    assert (trace.prompt_len == rng.integers(48, 81, size=20)).all() and (trace.output_len == 128).all()
    with pytest.raises(ValueError, match="range ratio must be in"):
        dataset_trace(parser_args(["--dataset-name", "random", "--random-range-ratio", "1.0"]))
    with pytest.raises(ValueError, match="too small"):
        dataset_trace(parser_args(["--dataset-name", "random", "--random-input-len", "0"]))


def test_prefix_repetition_order_and_sharing():
    n, k, seed = 23, 4, 11
    trace = prefix_repetition_trace(load_tokenizer(None), num_prompts=n, seed=seed, prefix_len=40,
                                    suffix_len=30, num_prefixes=k, output_len=9)
    per = n // k
    order = [p for p in range(k) for _ in range(per)]  # vLLM builds prefix by prefix ...
    random.seed(seed)
    random.shuffle(order)  # ... then random.shuffle with the generator seeded in __init__
    assert len(trace) == k * per and trace.metadata["not_made_remainder"] == n - k * per
    assert (trace.prompt_len == 70).all() and (trace.output_len == 9).all()
    ids = [trace.prefix_ids(i) for i in range(len(trace))]
    for i in range(len(trace)):
        for j in range(len(trace)):
            same = (ids[i][:2] == ids[j][:2]).all()
            assert same == (order[i] == order[j])
            if i != j:
                assert not set(ids[i][2:].tolist()) & set(ids[j][2:].tolist())
    with pytest.raises(ValueError, match="at least"):
        prefix_repetition_trace(load_tokenizer(None), num_prompts=3, num_prefixes=4)


# ---------------------------------------------------------------- custom, hf
def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_custom_follows_vllm(tmp_path, word_tokenizer):
    rows = [{"prompt": words(3 + k, k), "output_tokens": 10 + k} for k in range(12)]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    order = list(range(12))
    random.seed(5)
    random.shuffle(order)
    trace = custom_trace(path, word_tokenizer, num_prompts=8, seed=5, output_len=-1)
    assert trace.prompt_len.tolist() == [3 + k for k in order[:8]]
    assert trace.output_len.tolist() == [10 + k for k in order[:8]]
    fixed = custom_trace(path, word_tokenizer, num_prompts=20, seed=5)  # default 256, oversampled
    random.seed(5)
    extra = [random.choice(range(12)) for _ in range(8)]
    assert fixed.prompt_len.tolist() == [3 + k for k in order] + [3 + order[r] for r in extra]
    assert set(fixed.output_len.tolist()) == {256} and fixed.metadata["oversampled"] == 8


def test_custom_lines_may_carry_a_priority(tmp_path, word_tokenizer):
    """pagesim's extension: a line's "priority" (vLLM's CustomDataset ignores it) follows the line
    through the shuffle; lines without one get 0; a file with none gives a trace without priorities."""
    rows = [{"prompt": words(3 + k, k), "output_tokens": 5, **({"priority": k % 3} if k != 4 else {})}
            for k in range(6)]
    trace = custom_trace(write_jsonl(tmp_path / "p.jsonl", rows), word_tokenizer, num_prompts=6, seed=2,
                         output_len=-1)
    assert [p for p in trace.priority.tolist()] == [0 if n == 7 else (n - 3) % 3 for n in trace.prompt_len.tolist()]
    plain = custom_trace(write_jsonl(tmp_path / "q.jsonl", [{"prompt": "w1 w2"}]), word_tokenizer, num_prompts=1)
    assert not plain.priority.any()
    for bad in (True, 1.5, "high", 2**31):
        path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "w1"}, {"prompt": "w2", "priority": bad}])
        with pytest.raises(TraceFormatError, match=r"r.jsonl:2: \"priority\" must be an integer"):
            custom_trace(path, word_tokenizer, num_prompts=1)


def test_custom_errors(tmp_path, word_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "w1 w2"}, {"text": SECRET}])
    with pytest.raises(TraceFormatError, match=r"c.jsonl:2: missing key 'prompt'"):
        custom_trace(path, word_tokenizer, num_prompts=1)
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "w1 w2"}])
    with pytest.raises(TraceFormatError, match=r"d.jsonl:1: missing key 'output_tokens'"):
        custom_trace(path, word_tokenizer, num_prompts=1, output_len=-1)
    (tmp_path / "e.jsonl").write_text('{"prompt": "ok"}\n{"prompt": "' + SECRET + '\n')
    with pytest.raises(TraceFormatError, match=r"e.jsonl:2: not valid JSON") as info:
        custom_trace(tmp_path / "e.jsonl", word_tokenizer, num_prompts=1)
    assert SECRET not in str(info.value)
    with pytest.raises(ValueError, match="jsonl"):
        custom_trace(tmp_path / "c.json", word_tokenizer, num_prompts=1)


def test_custom_line_limit(tmp_path, monkeypatch, word_tokenizer):
    monkeypatch.setattr(reading, "MAX_LINE_CHARS", 100)  # (a JSONL line's cap: a trace line's, 4 MiB)
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "w1 w2 w3"}, {"prompt": SECRET * 20}])
    with pytest.raises(TraceFormatError, match=r"c.jsonl:2: line longer than the 100 characters limit") as info:
        custom_trace(path, word_tokenizer, num_prompts=1)
    assert SECRET not in str(info.value)


def test_hf_jsonl_conversations(tmp_path, word_tokenizer):
    entries = [e for e in sharegpt_entries() if "conversations" in e]
    path = write_jsonl(tmp_path / "h.jsonl", entries)
    trace = hf_trace(path, word_tokenizer, num_prompts=100, oversample=False)
    # vLLM's ConversationDataset rules (its shuffle is datasets' own: compare as sets)
    kept = vllm_sharegpt(entries, 100, seed=0, oversample=False)
    assert sorted(trace.prompt_len.tolist()) == sorted(p for p, _ in kept)
    assert trace.metadata["dropped_fewer_than_two_turns"] == 1
    fixed = hf_trace(path, word_tokenizer, num_prompts=100, output_len=7, oversample=False)
    assert len(fixed) == 16 and set(fixed.output_len.tolist()) == {7}  # a fixed output length skips nothing


def test_hf_parquet_columns(tmp_path, word_tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    prompts = [words(4 + k, k) for k in range(10)]
    table = pa.table({"question": prompts, "answer": [words(5 + k) for k in range(10)],
                      "n_out": list(range(20, 30))})
    pq.write_table(table, tmp_path / "d.parquet")
    trace = hf_trace(tmp_path / "d.parquet", word_tokenizer, num_prompts=10, prompt_column="question",
                     output_column="answer", shuffle=False)
    assert trace.prompt_len.tolist() == list(range(4, 14)) and trace.output_len.tolist() == list(range(5, 15))
    counts = hf_trace(tmp_path / "d.parquet", word_tokenizer, num_prompts=10, prompt_column="question",
                      output_column="n_out", shuffle=False)
    assert counts.output_len.tolist() == list(range(20, 30))
    with pytest.raises(TraceFormatError, match="no column 'missing'"):
        hf_trace(tmp_path / "d.parquet", word_tokenizer, num_prompts=1, prompt_column="missing", output_len=3)


# ---------------------------------------------------------------- command line
def test_cli_validation(tmp_path):
    assert not dataset_name_given(parser_args([]))
    assert dataset_name_given(parser_args(["--dataset-name", "random"]))
    cases = [
        (["--dataset-name", "sharegpt"], "needs --dataset-path"),
        (["--dataset-name", "sharegpt", "--dataset-path", "x.json", "--random-input-len", "5"],
         "--random-input-len is for --dataset-name random, not sharegpt"),
        (["--dataset-name", "random", "--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--random-input-len", "5"], "give --dataset-name"),
        (["--dataset-name", "random", "--dataset-path", "x"], "--dataset-path is for"),
        (["--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "none.json")], "no such file"),
    ]
    for argv, message in cases:
        with pytest.raises(ValueError, match=message):
            dataset_trace(parser_args(argv))
    trace = dataset_trace(parser_args(["--dataset-name", "prefix_repetition", "--num-prompts", "20"]))
    assert len(trace) == 20 and (trace.prompt_len == 512).all() and (trace.output_len == 128).all()
