"""A poem file's lines as ``vllm bench serve --dataset-name sonnet`` samples them: one shared prefix of
the poem's first lines, then lines drawn at random, under one instruction.

vLLM 0.33 no longer has this dataset; its rules here are vLLM 0.11.0's, where it was deprecated
(benchmarks/datasets.py ``SonnetDataset``, :1730-1815, flags :1102-1123, ``get_samples`` :1358-1381):

- the file is read as lines (newlines kept); a line's length is its token count with the
  tokenizer's special tokens, and ``avg_len`` is their mean;
- ``base_offset`` is the token count of the instruction ``"Pick as many lines as you can from
  these poem lines:\\n"``; ``--sonnet-input-len`` must exceed it;
- ``num_input_lines = round((input_len - base_offset) / avg_len)`` and ``num_prefix_lines =
  max(round((prefix_len - base_offset) / avg_len), 0)`` (Python's ``round``); every prompt is the
  instruction, the file's first ``num_prefix_lines`` lines, then ``num_input_lines -
  num_prefix_lines`` lines drawn with ``random.choices`` from Python's generator seeded by
  ``--seed`` (serve.py:1169); a prompt longer than ``--sonnet-input-len`` tokens is drawn again,
  until ``--num-prompts`` are kept (no shuffle, no oversampling); every output is
  ``--sonnet-output-len`` tokens.

So every prompt shares the instruction and the prefix lines: that is what the dataset exercises
(prefix caching).

Deviations: vLLM wraps each prompt in the model's chat template before counting it (and, unless
``--backend openai-chat``, sends it wrapped). pagesim applies no chat template (as for the custom
dataset): ``base_offset`` and each prompt are counted as written, so prompts run short of vLLM's by
the template's few tokens, and a prompt vLLM would redraw for being a few tokens too long may be
kept. vLLM redraws forever when no prompt can fit; here the draws stop after
``MAX_DRAWS_PER_PROMPT`` per prompt asked for, with an error saying how many fitted. No text is
shipped: ``--dataset-path`` names the file, as in vLLM (``benchmarks/sonnet.txt`` in vLLM's
repository, Shakespeare's sonnets), because the prompts depend on the exact file (its lines, their
lengths, which ones open it), so a different text under the same name would give other prompts than
vLLM's.
"""

from __future__ import annotations

import os
import random

import numpy as np

from pagesim.engine.files import read_small_text
from pagesim.traces.bench.common import ENCODE_BATCH, dataset_trace
from pagesim.traces.bench.tokenizer import Tokenizer
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.trace import Trace

BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"  # vLLM's instruction (datasets.py:1779)
DEFAULT_INPUT_LEN = 550  # vLLM's --sonnet-input-len default
DEFAULT_OUTPUT_LEN = 150  # --sonnet-output-len
DEFAULT_PREFIX_LEN = 200  # --sonnet-prefix-len
MAX_POEM_BYTES = 64 * 2**20  # vLLM's sonnet.txt is 99 KB
MAX_DRAWS_PER_PROMPT = 100  # vLLM draws until a prompt fits; here the draws are bounded


def poem_lines(path: str | os.PathLike[str]) -> list[str]:
    """The file's lines, each with its newline, as Python's ``readlines`` gives them (``\\r\\n`` and
    ``\\r`` read as ``\\n``)."""
    text = read_small_text(path, limit_bytes=MAX_POEM_BYTES, what="sonnet dataset")  # (an InputFileError: one line)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]  # (the text after the last newline has none)
    if lines[-1] == "":
        lines.pop()
    return lines


def sonnet_trace(path: str | os.PathLike[str], tokenizer: Tokenizer, *, num_prompts: int, seed: int = 0,
                 input_len: int = DEFAULT_INPUT_LEN, output_len: int = DEFAULT_OUTPUT_LEN,
                 prefix_len: int = DEFAULT_PREFIX_LEN) -> Trace:
    """The requests ``vllm bench serve --dataset-name sonnet`` would send, in its order."""
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"--sonnet-output-len must be >= 1, got {output_len}")
    if prefix_len < 0:
        raise ValueError(f"--sonnet-prefix-len must be >= 0, got {prefix_len}")
    lines = poem_lines(path)
    if not lines:
        raise TraceFormatError(path, "no lines (the sonnet dataset draws the prompts' lines from the file)")
    line_tokens = tokenizer.count_batch(lines)
    avg_len = sum(line_tokens) / len(line_tokens)
    if avg_len <= 0:
        raise TraceFormatError(path, "every line counts 0 tokens")
    base_offset = len(tokenizer.encode(BASE_PROMPT))
    if input_len <= base_offset:
        raise ValueError(f"--sonnet-input-len must be higher than the instruction's length ({base_offset} tokens), "
                         f"got {input_len}")
    num_input_lines = round((input_len - base_offset) / avg_len)
    num_prefix_lines = max(round((prefix_len - base_offset) / avg_len), 0)
    prefix = BASE_PROMPT + "".join(lines[:num_prefix_lines])
    num_drawn_lines = num_input_lines - num_prefix_lines  # (random.choices draws none when this is < 1)
    draw = random.Random(seed)
    prompts: list = []
    too_long = 0
    max_draws = MAX_DRAWS_PER_PROMPT * num_prompts
    drawn = 0
    while len(prompts) < num_prompts and drawn < max_draws:
        batch = min(ENCODE_BATCH, max_draws - drawn)
        texts = [prefix + "".join(draw.choices(lines, k=num_drawn_lines)) for _ in range(batch)]
        drawn += batch
        for ids in tokenizer.encode_batch(texts):
            if len(prompts) == num_prompts:
                break  # NOTE: vLLM stops drawing here; the draws left in this batch change nothing kept
            if len(ids) <= input_len:
                prompts.append(ids)
            else:
                too_long += 1
    if len(prompts) < num_prompts:
        raise ValueError(f"sonnet: {len(prompts)} of {drawn} prompts drawn fit in --sonnet-input-len {input_len} "
                         f"({num_prefix_lines} prefix + {max(num_drawn_lines, 0)} drawn lines of about {avg_len:.1f} "
                         "tokens each); vLLM would keep drawing: raise --sonnet-input-len")
    metadata = {"dataset": "sonnet", "tokenizer": tokenizer.describe, "seed": seed, "lines": len(lines),
                "avg_line_tokens": avg_len, "base_offset": base_offset, "input_len": input_len,
                "output_len": output_len, "prefix_len": prefix_len, "num_prefix_lines": num_prefix_lines,
                "num_drawn_lines": max(num_drawn_lines, 0), "redrawn_too_long": too_long,
                "chat_template": "not applied (prompts counted as written)",
                "rules": "vLLM 0.11.0's SonnetDataset (deprecated there; not in vLLM 0.33)"}
    return dataset_trace(prompt_tokens=prompts, output_len=np.full(len(prompts), output_len),
                         source=f"sonnet:{path}", metadata=metadata)
