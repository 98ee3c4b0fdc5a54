"""ShareGPT conversations as ``vllm bench serve --dataset-name sharegpt`` samples them (vLLM 0.33).

The file is a JSON array of ``{"id", "conversations": [{"from", "value"}, ...]}`` (gzip allowed,
read streamed: ``pagesim.traces.bench.reading``). Following ``ShareGPTDataset`` (datasets.py:1327-1414):

1. load: keep entries that have ``"conversations"`` with at least two turns (:1343-1347); the
   others are dropped and counted;
2. shuffle the kept entries with ``random.seed(seed); random.shuffle`` (:1348-1350) unless
   shuffling is disabled (``--disable-shuffle``);
3. walk them in that order until ``num_prompts`` are sampled (:1368-1370): the first turn's
   ``value`` is the prompt, the second's the completion (:1371-1374, whoever speaks), both counted
   with the tokenizer (:1382-1384); ``output_len`` (``--sharegpt-output-len``) replaces the
   completion's length (:1385);
4. skip a pair ``is_valid_sequence`` refuses (:1386-1390; rule at :340-364): prompt or completion under 4 tokens
   (the completion rule is waived when ``output_len`` is given), prompt over 1024, prompt +
   output over 2048, with the output length actually used;
5. if fewer than ``num_prompts`` were sampled, ``maybe_oversample_requests`` repeats seeded
   random choices among them (:1411, :289-330), unless ``--no-oversample``.

Deviation, stricter than vLLM: an entry that is not an object, whose ``conversations`` is not a
list, or whose first two turns lack a string ``value`` is an error naming the entry (vLLM would
crash on it, or silently drop a non-object); so is a first or second turn longer than
``MAX_TEXT_CHARS`` (4 MiB), which no tokenizer is handed (vLLM would tokenize it, and drop it as
over 1024 tokens); vLLM only reads plain JSON, gzip is accepted here.
"""

from __future__ import annotations

import os

import numpy as np

from pagesim.traces.bench.common import checked_text, dataset_trace, invalid_reason, oversample_rows, shuffled, take_valid
from pagesim.traces.bench.reading import iter_json_array
from pagesim.traces.bench.tokenizer import Tokenizer, warn_if_one_id
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.trace import Trace

def read_sharegpt_pairs(path: str | os.PathLike[str], counts: dict) -> list[tuple[str, str]]:
    """Every entry's first two turns as ``(prompt, completion)``, in file order, for entries with
    ``conversations`` of at least two turns; ``counts`` gets ``entries`` and what was dropped."""
    pairs: list[tuple[str, str]] = []
    counts.update(entries=0, dropped_no_conversations=0, dropped_fewer_than_two_turns=0)
    for index, line, entry in iter_json_array(path, what="entry"):
        counts["entries"] += 1
        if not isinstance(entry, dict):
            raise TraceFormatError(path, f"entry {index}: expected a JSON object with \"conversations\", "
                                   f"found {type(entry).__name__}", line)
        if "conversations" not in entry:
            counts["dropped_no_conversations"] += 1
            continue
        turns = entry["conversations"]
        if not isinstance(turns, list):
            raise TraceFormatError(path, f"entry {index}: \"conversations\" must be a list of turns", line)
        if len(turns) < 2:
            counts["dropped_fewer_than_two_turns"] += 1
            continue
        texts = []
        for k in (0, 1):
            turn = turns[k]
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise TraceFormatError(path, f"entry {index}: turn {k} must be an object with a string \"value\"",
                                       line)
            texts.append(checked_text(path, turn["value"], f"entry {index}: turn {k}'s \"value\"", line))
        pairs.append((texts[0], texts[1]))
    return pairs


def sharegpt_trace(
    path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    *,
    num_prompts: int | None,
    seed: int = 0,
    output_len: int | None = None,
    shuffle: bool = True,
    oversample: bool = True,
) -> Trace:
    """The requests ``vllm bench serve --dataset-name sharegpt`` would send, in its order.

    ``num_prompts=None`` takes every valid entry (no oversampling): what ``pagesim trace stats``
    shows for a ShareGPT file.
    """
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    if output_len is not None and output_len < 1:
        raise ValueError(f"--sharegpt-output-len must be >= 1, got {output_len}")
    counts: dict = {}
    pairs = read_sharegpt_pairs(path, counts)
    order = shuffled(len(pairs), seed) if shuffle else range(len(pairs))
    skipped = {"prompt_too_short": 0, "output_too_short": 0, "prompt_too_long": 0, "total_too_long": 0}
    wanted = len(pairs) if num_prompts is None else num_prompts

    def encode(batch: list) -> tuple[list, list]:
        completion_lens = (tokenizer.count_batch([c for _, c in batch]) if output_len is None
                           else [output_len] * len(batch))
        return tokenizer.encode_batch([p for p, _ in batch]), completion_lens

    prompts, outputs, examined = take_valid(
        [pairs[i] for i in order], wanted, encode,
        lambda ids, out: invalid_reason(len(ids), out, skip_min_output_len_check=output_len is not None), skipped)
    warn_if_one_id(tokenizer, prompts, path)
    num_sampled = len(prompts)
    extra = oversample_rows(num_sampled, wanted, seed) if oversample and num_prompts is not None else []
    prompts += [prompts[row] for row in extra]
    outputs += [outputs[row] for row in extra]
    if not prompts:
        raise TraceFormatError(path, "no entry is a valid request (see vLLM's rules: at least two turns, "
                               "prompt and completion of 4+ tokens, prompt <= 1024, total <= 2048)")
    metadata = {
        "dataset": "sharegpt",
        "tokenizer": tokenizer.describe,
        **counts,
        "examined": examined,
        **{f"skipped_{name}": value for name, value in skipped.items()},
        "sampled": num_sampled,
        "oversampled": len(extra),
        "shuffled": bool(shuffle),
        "seed": seed,
    }
    if output_len is not None:
        metadata["output_len"] = output_len
    return dataset_trace(prompt_tokens=prompts, output_len=np.asarray(outputs), source=f"sharegpt:{path}",
                         metadata=metadata)
