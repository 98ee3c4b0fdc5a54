"""What the benchmark datasets share: vLLM's validity rule, its oversampling, and the Trace they
all end in (no arrival times: an arrival process is applied later)."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from pagesim.traces.bench.identities import PREFIX_CHUNK_TOKENS, chunk_identities
from pagesim.traces.bench.tokenizer import MAX_TEXT_CHARS
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.limits import MAX_LENGTH_TOKENS
from pagesim.traces.loaders.stream import limit_text
from pagesim.traces.trace import Trace

# vLLM 0.33 is_valid_sequence's defaults (datasets.py:340-346)
MIN_LEN_TOKENS = 4
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048


def checked_text(path, text: str, where: str, line: int | None = None) -> str:
    """``text`` (a prompt or a completion, ``where`` naming it), or a ``TraceFormatError`` if it is
    longer than ``MAX_TEXT_CHARS``: no tokenizer is handed a longer one."""
    if len(text) > MAX_TEXT_CHARS:
        raise TraceFormatError(path, f"{where} is longer than the {limit_text(MAX_TEXT_CHARS)} limit for one text "
                               "(no tokenizer is handed a longer one)", line)
    return text


def count_problem(value: int | None, what: str) -> str | None:
    """Why ``value`` (a whole number read from a dataset, or None) is not a token count in
    ``[1, MAX_LENGTH_TOKENS]``, or None."""
    if value is None or not 1 <= value <= MAX_LENGTH_TOKENS:
        return f"{what} must be a whole number from 1 to {MAX_LENGTH_TOKENS:,}"
    return None


def invalid_reason(prompt_len: int, output_len: int, *, skip_min_output_len_check: bool = False) -> str | None:
    """Why vLLM 0.33's ``is_valid_sequence`` (datasets.py:340-364, defaults) refuses a pair, or
    None if it keeps it. A pair may break several rules; the first in vLLM's order is named."""
    if prompt_len < MIN_LEN_TOKENS:
        return "prompt_too_short"
    if not skip_min_output_len_check and output_len < MIN_LEN_TOKENS:
        return "output_too_short"
    if prompt_len > MAX_PROMPT_TOKENS:
        return "prompt_too_long"
    if prompt_len + output_len > MAX_TOTAL_TOKENS:
        return "total_too_long"
    return None


def oversample_rows(num_kept: int, num_requests: int, seed: int) -> list[int]:
    """The rows vLLM 0.33's ``maybe_oversample_requests`` (datasets.py:289-330) appends when fewer
    than ``num_requests`` were kept: ``random.seed(seed)`` then one ``random.choice`` over the kept
    requests per missing one (a fresh ``random.Random(seed)`` draws the same)."""
    if num_kept >= num_requests:
        return []
    if num_kept == 0:
        raise ValueError("no request is left to sample from (every entry was skipped; see the counts)")
    draw = random.Random(seed)
    kept = range(num_kept)
    return [draw.choice(kept) for _ in range(num_requests - num_kept)]


def shuffled(count: int, seed: int) -> list[int]:
    """The order ``random.seed(seed); random.shuffle(data)`` gives ``count`` items (vLLM 0.33
    ShareGPTDataset.load_data, datasets.py:1349-1351; CustomDataset.load_data, :2470-2472):
    ``shuffle`` depends only on the length, so shuffling indices gives the same permutation."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


ENCODE_BATCH = 256  # candidates tokenized together while sampling


def take_valid(candidates: list, wanted: int, encode: Callable[[list], tuple[list, list]],
               reason_of: Callable[[list, int], str | None], skipped: dict[str, int]) -> tuple[list, list, int]:
    """vLLM's sampling loop (ShareGPTDataset.sample, ConversationDataset.sample): walk the
    candidates in order, a batch at a time (``encode(batch)`` gives their prompt token ids and
    output lengths), skip each one ``reason_of(ids, output_len)`` names (counted in ``skipped``),
    and stop once ``wanted`` are kept. Returns the kept prompts, their output lengths, and how many
    candidates were examined."""
    prompts: list = []
    outputs: list[int] = []
    examined = 0
    for start in range(0, len(candidates), ENCODE_BATCH):
        if len(prompts) >= wanted:
            break
        prompt_ids, output_lens = encode(candidates[start:start + ENCODE_BATCH])
        for ids, out in zip(prompt_ids, output_lens):
            if len(prompts) >= wanted:
                break
            examined += 1
            reason = reason_of(ids, out)
            if reason is not None:
                skipped[reason] += 1
                continue
            prompts.append(ids)
            outputs.append(out)
    return prompts, outputs, examined


def dataset_trace(*, prompt_tokens: list, output_len, source: str, metadata: dict) -> Trace:
    """A Trace of prompts given as token ids (their lengths and 16-token chunk identities) and
    output lengths, in request order, all arriving at 0 with ``has_arrivals=False``."""
    values, offsets = chunk_identities(prompt_tokens)
    prompt_len = np.fromiter((len(t) for t in prompt_tokens), dtype=np.int64, count=len(prompt_tokens))
    return Trace(
        arrival_s=np.zeros(len(prompt_tokens)),
        prompt_len=prompt_len,
        output_len=np.asarray(output_len, dtype=np.int64),
        prefix_id_values=values,
        prefix_id_offsets=offsets,
        prefix_block_tokens=PREFIX_CHUNK_TOKENS,
        has_arrivals=False,
        source=source,
        metadata=metadata,
    )
