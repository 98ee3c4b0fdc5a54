"""``vllm bench serve``'s dataset flags (vLLM 0.33 ``add_dataset_parser``, datasets.py:1579-1870,
and ``add_random_dataset_base_args``, :1873-1934), with its names and defaults, and the Trace
they describe (``get_samples``, :2052-2420, for the datasets here).

Flags specific to one dataset default to None here so that giving one to another dataset can be
refused; the vLLM defaults apply when they are left out (and are shown in ``--help``). ``sonnet``
follows vLLM 0.11.0 (deprecated there, gone from 0.33: ``pagesim.traces.bench.sonnet``). The number
of prompts and the seed are read from ``args.num_requests`` (``--num-prompts``; vLLM's default
1000 when absent) and ``args.seed`` (0 when absent), flags another part of the command line adds.
"""

from __future__ import annotations

import argparse

from pagesim.traces.bench import sonnet
from pagesim.traces.bench.burstgpt import burstgpt_trace
from pagesim.traces.bench.custom import DEFAULT_CUSTOM_OUTPUT_LEN, custom_trace
from pagesim.traces.bench.hf import hf_trace
from pagesim.traces.bench.sharegpt import sharegpt_trace
from pagesim.traces.bench.synthetic import parse_range_ratio, prefix_repetition_trace, random_trace
from pagesim.traces.bench.tokenizer import load_tokenizer
from pagesim.traces.trace import Trace

DATASET_NAMES = ("sharegpt", "random", "prefix_repetition", "custom", "hf", "sonnet", "burstgpt")
DEFAULT_NUM_PROMPTS = 1000  # vLLM's --num-prompts default (datasets.py:71)
WITH_PATH = ("sharegpt", "custom", "hf", "sonnet", "burstgpt")

# flag (dest) -> (dataset it belongs to, vLLM's default)
DATASET_FLAGS: dict[str, tuple[tuple[str, ...], object]] = {
    "sharegpt_output_len": (("sharegpt",), None),
    "random_input_len": (("random",), 1024),
    "random_output_len": (("random",), 128),
    "random_range_ratio": (("random",), "0.0"),
    "random_prefix_len": (("random",), 0),
    "prefix_repetition_prefix_len": (("prefix_repetition",), 256),
    "prefix_repetition_suffix_len": (("prefix_repetition",), 256),
    "prefix_repetition_num_prefixes": (("prefix_repetition",), 10),
    "prefix_repetition_output_len": (("prefix_repetition",), 128),
    "custom_output_len": (("custom",), DEFAULT_CUSTOM_OUTPUT_LEN),
    "hf_output_len": (("hf",), None),
    "hf_prompt_column": (("hf",), None),
    "hf_output_column": (("hf",), None),
    "hf_conversations_column": (("hf",), "conversations"),
    "sonnet_input_len": (("sonnet",), sonnet.DEFAULT_INPUT_LEN),
    "sonnet_output_len": (("sonnet",), sonnet.DEFAULT_OUTPUT_LEN),
    "sonnet_prefix_len": (("sonnet",), sonnet.DEFAULT_PREFIX_LEN),
    "dataset_path": (WITH_PATH, None),
    "disable_shuffle": (("sharegpt", "custom", "hf", "prefix_repetition"), False),
    "no_oversample": (("sharegpt", "custom", "hf"), False),
}


def add_dataset_args(parser_or_group) -> None:
    """vLLM bench's dataset flags (those of the datasets in ``DATASET_NAMES``)."""
    add = parser_or_group.add_argument
    add("--dataset-name", choices=DATASET_NAMES, default=None,
        help="a vLLM bench dataset to sample requests from, as `vllm bench serve` does")
    add("--dataset-path", metavar="PATH", help="the dataset file (sharegpt: JSON; custom: JSONL; hf: Parquet or JSONL; "
        "sonnet: a text file of lines, e.g. vLLM's benchmarks/sonnet.txt; burstgpt: BurstGPT's CSV)")
    add("--tokenizer", metavar="PATH",
        help="a Hugging Face tokenizer folder or tokenizer.json to count tokens with "
             "(default: an estimate of 1 token per 4 characters)")
    add("--disable-shuffle", action="store_true", default=None,
        help="keep the dataset's order instead of vLLM's seeded shuffle")
    add("--no-oversample", action="store_true", default=None,
        help="do not repeat requests when fewer valid ones than --num-prompts exist")
    add("--sharegpt-output-len", type=int, metavar="N",
        help="output tokens of every ShareGPT request (default: the completion's length)")
    add("--random-input-len", type=int, metavar="N", help="random: input tokens per request (default 1024)")
    add("--random-output-len", type=int, metavar="N", help="random: output tokens per request (default 128)")
    add("--random-range-ratio", metavar="R",
        help='random: lengths uniform in [L(1-R), L(1+R)]; a number or {"input": R, "output": R} (default 0.0)')
    add("--random-prefix-len", type=int, metavar="N",
        help="random: tokens of one prefix shared by every request, before the sampled input (default 0)")
    add("--prefix-repetition-prefix-len", type=int, metavar="N", help="prefix_repetition: prefix tokens (default 256)")
    add("--prefix-repetition-suffix-len", type=int, metavar="N", help="prefix_repetition: suffix tokens (default 256)")
    add("--prefix-repetition-num-prefixes", type=int, metavar="K",
        help="prefix_repetition: distinct prefixes; num_prompts // K requests each (default 10)")
    add("--prefix-repetition-output-len", type=int, metavar="N",
        help="prefix_repetition: output tokens per request (default 128)")
    add("--custom-output-len", type=int, metavar="N",
        help="custom: output tokens per request; -1 reads each line's output_tokens (default 256)")
    add("--hf-output-len", type=int, metavar="N", help="hf: output tokens per request (default: from the data)")
    add("--hf-prompt-column", metavar="COL", help="hf: the column holding the prompt text")
    add("--hf-output-column", metavar="COL", help="hf: the column holding the completion text or its token count")
    add("--hf-conversations-column", metavar="COL",
        help="hf: a ShareGPT-like column of turns, used without --hf-prompt-column (default conversations)")
    add("--sonnet-input-len", type=int, metavar="N",
        help=f"sonnet: the most input tokens of a prompt (default {sonnet.DEFAULT_INPUT_LEN})")
    add("--sonnet-output-len", type=int, metavar="N",
        help=f"sonnet: output tokens per request (default {sonnet.DEFAULT_OUTPUT_LEN})")
    add("--sonnet-prefix-len", type=int, metavar="N",
        help=f"sonnet: tokens of the prefix every prompt shares (default {sonnet.DEFAULT_PREFIX_LEN})")


def dataset_name_given(args: argparse.Namespace) -> bool:
    """Whether the command line asked for a vLLM bench dataset."""
    return getattr(args, "dataset_name", None) is not None


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _value(args: argparse.Namespace, dest: str):
    given = getattr(args, dest, None)
    return DATASET_FLAGS[dest][1] if given is None else given


def check_dataset_args(args: argparse.Namespace) -> str:
    """The dataset name, once the flags are known to fit together (else a one-line ValueError)."""
    name = getattr(args, "dataset_name", None)
    given = [dest for dest in DATASET_FLAGS if getattr(args, dest, None) is not None]
    if name is None:
        if given or getattr(args, "tokenizer", None) is not None:
            first = _flag(given[0]) if given else "--tokenizer"
            raise ValueError(f"{first} describes a vLLM bench dataset: give --dataset-name too")
        raise ValueError(f"no --dataset-name given (one of {', '.join(DATASET_NAMES)})")
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown --dataset-name {name!r} (one of {', '.join(DATASET_NAMES)})")
    for dest in given:
        owners = DATASET_FLAGS[dest][0]
        if name not in owners:
            raise ValueError(f"{_flag(dest)} is for --dataset-name {' / '.join(owners)}, not {name}")
    if name in WITH_PATH and getattr(args, "dataset_path", None) is None:
        raise ValueError(f"--dataset-name {name} needs --dataset-path PATH")
    return name


def raw_output_low(output_len: int, ratio: float) -> int:
    """The lower bound of the random dataset's output lengths before vLLM raises it to 1."""
    import math

    return math.floor(output_len * (1 - ratio))


def _note(args: argparse.Namespace, text: str) -> None:
    import sys

    print(f"pagesim {getattr(args, 'command', None) or 'bench'}: note: {text}", file=sys.stderr)


def num_prompts_of(args: argparse.Namespace) -> int:
    count = getattr(args, "num_requests", None)
    count = DEFAULT_NUM_PROMPTS if count is None else count
    if count < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {count}")
    return count


def dataset_trace(args: argparse.Namespace) -> Trace:
    """The requests ``vllm bench serve`` would send for these flags, in its order, with no
    arrival times (``has_arrivals=False``); every problem is a one-line ``ValueError``."""
    name = check_dataset_args(args)
    num_prompts = num_prompts_of(args)
    seed = getattr(args, "seed", None) or 0
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    tokenizer = load_tokenizer(getattr(args, "tokenizer", None))
    shuffle = not _value(args, "disable_shuffle")
    oversample = not _value(args, "no_oversample")
    path = getattr(args, "dataset_path", None)
    if name == "sharegpt":
        return sharegpt_trace(path, tokenizer, num_prompts=num_prompts, seed=seed,
                              output_len=_value(args, "sharegpt_output_len"), shuffle=shuffle, oversample=oversample)
    if name == "random":
        output_len = _value(args, "random_output_len")
        if output_len < 0:
            raise ValueError(f"--random-output-len must be >= 0, got {output_len}")
        trace = random_trace(tokenizer, num_prompts=num_prompts, seed=seed,
                             input_len=_value(args, "random_input_len"), output_len=output_len,
                             range_ratio=parse_range_ratio(_value(args, "random_range_ratio")),
                             prefix_len=_value(args, "random_prefix_len"))
        low, high = trace.metadata["sampled_output_range"]
        if low > raw_output_low(output_len, trace.metadata["range_ratio"][1]):  # not silent: vLLM's clamp applied
            _note(args, f"--random-output-len {output_len} gives output lengths in [{low}, {high}] tokens: vLLM 0.33 "
                        "raises a lower bound under 1 to 1 (datasets/utils.py:74-77), and so does pagesim")
        return trace
    if name == "prefix_repetition":
        return prefix_repetition_trace(
            tokenizer, num_prompts=num_prompts, seed=seed, prefix_len=_value(args, "prefix_repetition_prefix_len"),
            suffix_len=_value(args, "prefix_repetition_suffix_len"),
            num_prefixes=_value(args, "prefix_repetition_num_prefixes"),
            output_len=_value(args, "prefix_repetition_output_len"), shuffle=shuffle)
    if name == "custom":
        return custom_trace(path, tokenizer, num_prompts=num_prompts, seed=seed,
                            output_len=_value(args, "custom_output_len"), shuffle=shuffle, oversample=oversample)
    if name == "sonnet":
        return sonnet.sonnet_trace(path, tokenizer, num_prompts=num_prompts, seed=seed,
                                   input_len=_value(args, "sonnet_input_len"),
                                   output_len=_value(args, "sonnet_output_len"),
                                   prefix_len=_value(args, "sonnet_prefix_len"))
    if name == "burstgpt":
        return burstgpt_trace(path, num_prompts=num_prompts, seed=seed)
    return hf_trace(path, tokenizer, num_prompts=num_prompts, seed=seed, output_len=_value(args, "hf_output_len"),
                    prompt_column=_value(args, "hf_prompt_column"), output_column=_value(args, "hf_output_column"),
                    conversations_column=_value(args, "hf_conversations_column"), shuffle=shuffle,
                    oversample=oversample)
