"""vLLM 0.33's synthetic datasets, ``random`` and ``prefix_repetition``: the same lengths from the
same seed, and prompts whose shared parts share prefix identities.

Text is not generated (a simulator needs lengths and sharing, not words); each prompt gets
seeded pseudo-token ids (``pagesim.traces.bench.identities.pseudo_tokens``): one id stream per shared
prefix, one per request for the rest. vLLM decodes its random ids to text and re-encodes it,
retrying up to 10 times until the count matches (``gen_prompt_decode_to_target_len``,
datasets.py:494-552); lengths here are the targets that loop aims at, which it reaches for
tokenizers that round-trip.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np

from pagesim.engine.memory_fit import require_host, sized_by
from pagesim.traces.bench.common import dataset_trace
from pagesim.traces.bench.identities import pseudo_tokens
from pagesim.traces.bench.tokenizer import Tokenizer
from pagesim.traces.trace import Trace


def parse_range_ratio(value) -> tuple[float, float]:
    """``(input_ratio, output_ratio)`` from ``--random-range-ratio``: a float for both, or a JSON
    object ``{"input": a, "output": b}`` (vLLM 0.33 ``_parse_range_ratio``, datasets.py:2040-2049,
    and ``_resolve_range_ratios``, utils.py:19-36); each must lie in [0, 1) (utils.py:62-65)."""
    if isinstance(value, (int, float)):
        ratios = (float(value), float(value))
    elif isinstance(value, tuple) and len(value) == 2:  # already parsed
        ratios = (float(value[0]), float(value[1]))
    elif isinstance(value, dict):
        ratios = parse_range_ratio(json.dumps(value))
    else:
        text = str(value)
        try:
            ratios = (float(text), float(text))
        except ValueError:
            from pagesim.engine.files import InputFileError, loads_json

            try:  # (the guarded reader: a flag's value nested 20,000 deep is refused, not a RecursionError)
                given = loads_json(text, path="--random-range-ratio")
            except InputFileError:
                raise ValueError(f"--random-range-ratio: expected a number or a JSON object "
                                 f"{{\"input\": R, \"output\": R}}, got {text[:40]!r}") from None
            if not isinstance(given, dict) or not {"input", "output"} <= given.keys():
                raise ValueError("--random-range-ratio: a JSON object needs \"input\" and \"output\" keys") from None
            try:
                ratios = (float(given["input"]), float(given["output"]))
            except (TypeError, ValueError):
                raise ValueError("--random-range-ratio: \"input\" and \"output\" must be numbers") from None
    for name, ratio in zip(("input", "output"), ratios):
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"--random-range-ratio: the {name} range ratio must be in [0, 1), got {ratio}")
    return ratios


def random_lengths(num_requests: int, *, input_len: int, output_len: int, range_ratio=0.0,
                   prefix_len: int = 0, num_special_tokens: int = 0, seed: int = 0):
    """``(sampled input lengths, output lengths, bounds)`` as vLLM 0.33 draws them.

    ``get_sampling_params`` (utils.py:39-99), called first thing with the dataset's
    ``np.random.default_rng(seed)`` (datasets.py:579, :617-624): the tokenizer's special tokens
    come off the input length, inputs are uniform integers in ``[floor(L(1-r)), ceil(L(1+r))]``,
    outputs in ``[max(1, floor(O(1-r))), max(1, ceil(O(1+r)))]``, drawn as two vectors, inputs first
    (its third draw, vocabulary offsets, comes after and changes neither). The prompt is the
    shared prefix plus the sampled input (``total_input_len = prefix_len + input_len``, :753).
    """
    input_ratio, output_ratio = parse_range_ratio(range_ratio)
    real_input_len = max(0, int(input_len) - int(num_special_tokens))
    input_low = math.floor(real_input_len * (1 - input_ratio))
    input_high = math.ceil(real_input_len * (1 + input_ratio))
    if prefix_len < 0:
        raise ValueError(f"--random-prefix-len must be >= 0, got {prefix_len}")
    if prefix_len + input_low < 1:  # RandomDataset.sample's check, datasets.py:600-618
        raise ValueError(f"--random-input-len is too small: the shortest prompt (prefix {prefix_len} + "
                         f"{input_low} sampled tokens, after {num_special_tokens} special tokens) would be empty")
    output_low = max(math.floor(output_len * (1 - output_ratio)), 1)
    output_high = max(math.ceil(output_len * (1 + output_ratio)), 1)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    return input_lens, output_lens, {"input": [input_low, input_high], "output": [output_low, output_high]}


def random_trace(tokenizer: Tokenizer, *, num_prompts: int, seed: int = 0, input_len: int = 1024,
                 output_len: int = 128, range_ratio=0.0, prefix_len: int = 0) -> Trace:
    """``vllm bench serve --dataset-name random`` (vLLM 0.33 ``RandomDataset``, datasets.py:555-769):
    every request starts with the same ``prefix_len`` tokens (drawn once, :631-632), then its own
    sampled input; no shuffle, no oversampling. ``tokenizer`` only says how many special tokens
    to take off the input length (none for the estimate)."""
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    input_lens, output_lens, bounds = random_lengths(
        num_prompts, input_len=input_len, output_len=output_len, range_ratio=range_ratio,
        prefix_len=prefix_len, num_special_tokens=tokenizer.num_special_tokens, seed=seed)
    flags = f"--random-input-len {input_len} and --random-prefix-len {prefix_len} x --num-prompts {num_prompts}"
    _require_tokens(flags, num_prompts * prefix_len + int(input_lens.sum()), prefix_len + int(input_lens.max()))
    with sized_by(flags):
        prefix = pseudo_tokens(seed, "prefix", 0, prefix_len)
        prompts = [np.concatenate([prefix, pseudo_tokens(seed, "random", i, int(n))]) for i, n in enumerate(input_lens)]
    metadata = {"dataset": "random", "tokenizer": _lengths_only(tokenizer), "seed": seed, "input_len": input_len,
                "output_len": output_len, "range_ratio": list(parse_range_ratio(range_ratio)),
                "prefix_len": prefix_len, "num_special_tokens": tokenizer.num_special_tokens,
                "sampled_input_range": bounds["input"], "sampled_output_range": bounds["output"]}
    return dataset_trace(prompt_tokens=prompts, output_len=output_lens, source=f"random:seed={seed}",
                         metadata=metadata)


def prefix_repetition_order(num_prompts: int, num_prefixes: int, *, seed: int = 0,
                            shuffle: bool = True) -> list[tuple[int, int]]:
    """``(prefix, suffix)`` indices of each request in vLLM 0.33's order.

    ``PrefixRepetitionRandomDataset.sample`` (datasets.py:4197-4268) builds ``num_prompts //
    num_prefixes`` requests per prefix, prefix by prefix (:4210-4215, :4233-4250; the remainder is not made),
    then ``random.shuffle``s them with the global generator seeded by ``random.seed(seed)`` in
    ``__init__`` (:4194, :4263-4264) and untouched in between, which ``random.Random(seed)``
    reproduces.
    """
    if num_prefixes < 1:
        raise ValueError(f"--prefix-repetition-num-prefixes must be >= 1, got {num_prefixes}")
    per_prefix = num_prompts // num_prefixes
    if per_prefix == 0:
        raise ValueError(f"the number of prompts ({num_prompts}) must be at least "
                         f"--prefix-repetition-num-prefixes ({num_prefixes}), as vLLM requires")
    order = [(p, k) for p in range(num_prefixes) for k in range(per_prefix)]
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def prefix_repetition_trace(tokenizer: Tokenizer, *, num_prompts: int, seed: int = 0, prefix_len: int = 256,
                            suffix_len: int = 256, num_prefixes: int = 10, output_len: int = 128,
                            shuffle: bool = True) -> Trace:
    """``vllm bench serve --dataset-name prefix_repetition``: ``num_prefixes`` prefixes of
    ``prefix_len`` tokens, each followed by its own ``suffix_len`` tokens, ``output_len`` out;
    prompt length ``prefix_len + suffix_len`` (:4242-4244); no oversampling (vLLM makes
    ``num_prefixes * (num_prompts // num_prefixes)`` requests)."""
    for flag, value, low in (("prefix-len", prefix_len, 0), ("suffix-len", suffix_len, 0),
                             ("output-len", output_len, 1)):
        if value < low:
            raise ValueError(f"--prefix-repetition-{flag} must be >= {low}, got {value}")
    if prefix_len + suffix_len < 1:
        raise ValueError("--prefix-repetition-prefix-len + --prefix-repetition-suffix-len must be >= 1")
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    order = prefix_repetition_order(num_prompts, num_prefixes, seed=seed, shuffle=shuffle)
    per_prefix = num_prompts // num_prefixes
    flags = (f"--prefix-repetition-prefix-len {prefix_len} and --prefix-repetition-suffix-len {suffix_len} x "
             f"--num-prompts {num_prompts}")
    _require_tokens(flags, len(order) * (prefix_len + suffix_len) + num_prefixes * prefix_len, prefix_len + suffix_len)
    with sized_by(flags):
        prefixes = [pseudo_tokens(seed, "prefix", p, prefix_len) for p in range(num_prefixes)]
        prompts = [np.concatenate([prefixes[p], pseudo_tokens(seed, "suffix", p * per_prefix + k, suffix_len)])
                   for p, k in order]
    metadata = {"dataset": "prefix_repetition", "tokenizer": _lengths_only(tokenizer), "seed": seed,
                "prefix_len": prefix_len, "suffix_len": suffix_len, "num_prefixes": num_prefixes,
                "output_len": output_len, "requested": num_prompts,
                "not_made_remainder": num_prompts - len(order), "shuffled": bool(shuffle)}
    return dataset_trace(prompt_tokens=prompts, output_len=np.full(len(order), output_len),
                         source=f"prefix_repetition:seed={seed}", metadata=metadata)


#: Bytes the prompts' token ids take: an int64 a token kept, and while the longest prompt is made
#: about four more arrays of its length (``pseudo_tokens``' uint64 steps, the concatenation).
TOKEN_BYTES, MAKING_BYTES = 8, 5 * 8


def _require_tokens(flags: str, total_tokens: int, longest_tokens: int) -> None:
    """Refuse prompts whose token ids would not fit in memory, naming the flags that sized them."""
    require_host(TOKEN_BYTES * total_tokens + MAKING_BYTES * longest_tokens, f"{flags}: {total_tokens:,} token ids")


def _lengths_only(tokenizer: Tokenizer) -> str:
    """What the tokenizer did here: lengths are drawn in tokens, so it only counts special tokens."""
    return f"{tokenizer.describe}; lengths drawn in tokens, so only its {tokenizer.num_special_tokens} special " \
           f"token(s) per prompt matter"
