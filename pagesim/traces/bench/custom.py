"""A custom JSONL dataset, ``{"prompt": ..., "output_tokens": ...}`` per line, as
``vllm bench serve --dataset-name custom`` samples it (vLLM 0.33 ``CustomDataset``,
datasets.py:2425-2550).

Following vLLM: the file must be ``.jsonl`` (:2453; ``.jsonl.gz`` is accepted here too); every
line needs ``"prompt"`` (:2457); the lines are shuffled with ``random.seed(seed);
random.shuffle`` (:2471-2473) unless ``--disable-shuffle``; the first ``num_prompts`` are taken
(:2500-2502), nothing is skipped for its length; the output length is ``--custom-output-len``
(default 256, :1647-1653) unless that is -1 (or None), when each line's ``output_tokens`` is used
and must be there (:2507-2521, ``int()`` of it); fewer lines than ``num_prompts`` are oversampled
(:2546, :289-330).

Deviations: vLLM applies the tokenizer's chat template to the prompt before counting it unless
``--skip-chat-template`` (:2527-2535); here the prompt is counted as written (as with
``--skip-chat-template``), and the trace says so. A prompt of 0 tokens, which a Trace cannot
hold, is skipped and counted. A line missing ``prompt``, or whose ``output_tokens`` is not a
whole number >= 1, is an error naming the line, checked on every line (vLLM checks the lines it
samples, and truncates ``12.7`` to 12); so is an ``output_tokens`` above ``MAX_LENGTH_TOKENS``
(16,777,216; ``1e300`` is not a count). A line may be at most 4 MiB, as a trace's line.

Extension: a line may carry ``"priority"``, an integer (lower is more important, vLLM's
convention; 0 where a line has none), read by ``--scheduling-policy priority`` as the request's
priority when the client sends one. vLLM's ``CustomDataset`` ignores the key (``vllm bench serve``
sends no priority), so a file with priorities stands for clients that send them.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from pagesim.traces.bench.common import count_problem, dataset_trace, oversample_rows, shuffled
from pagesim.traces.bench.reading import iter_jsonl
from pagesim.traces.bench.tokenizer import Tokenizer, warn_if_one_id
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.trace import Trace

DEFAULT_CUSTOM_OUTPUT_LEN = 256  # vLLM's --custom-output-len default
MAX_PRIORITY = 2**31 - 1  # a line's "priority" (pagesim's extension) lies within +- this


def whole_count(value) -> int | None:
    """``value`` as vLLM's ``int(item["output_tokens"])`` would read it, if it is a whole number
    (an int, an integral float, or a string of digits); otherwise None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def custom_trace(path: str | os.PathLike[str], tokenizer: Tokenizer, *, num_prompts: int, seed: int = 0,
                 output_len: int | None = DEFAULT_CUSTOM_OUTPUT_LEN, shuffle: bool = True,
                 oversample: bool = True) -> Trace:
    """The requests ``vllm bench serve --dataset-name custom`` would send, in its order."""
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    name = os.fspath(path)
    if not name.endswith((".jsonl", ".jsonl.gz")):
        raise ValueError(f"{name}: the custom dataset reads JSONL files named *.jsonl (as vLLM's CustomDataset)")
    from_file = output_len is None or output_len == -1
    problem = None if from_file else count_problem(output_len, "--custom-output-len")
    if problem is not None:
        raise ValueError(f"{problem} (or -1 for each line's output_tokens), got {output_len}")
    rows: list[tuple[int, str, int, int]] = []  # (line, prompt, output length, priority)
    has_priority = False
    for line, obj in iter_jsonl(path, what="line"):
        prompt = obj.get("prompt")
        if not isinstance(prompt, str):
            problem = "missing key 'prompt'" if "prompt" not in obj else "\"prompt\" must be a string"
            raise TraceFormatError(path, problem, line)
        if from_file:
            if "output_tokens" not in obj:
                raise TraceFormatError(path, "missing key 'output_tokens' (needed when --custom-output-len "
                                       "is -1)", line)
            count = whole_count(obj["output_tokens"])
            problem = count_problem(count, "output_tokens")
            if problem is not None:
                raise TraceFormatError(path, problem, line)
        else:
            count = output_len
        priority = obj.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise TraceFormatError(path, f"\"priority\" must be an integer within +-{MAX_PRIORITY:,}, got {priority!r}",
                                   line)
        has_priority = has_priority or "priority" in obj
        rows.append((line, prompt, count, priority))
    if not rows:
        raise TraceFormatError(path, "no requests (the file has no JSON lines)")
    order = shuffled(len(rows), seed) if shuffle else list(range(len(rows)))
    taken = [rows[i] for i in order[:num_prompts]]
    prompt_ids = tokenizer.encode_batch([prompt for _, prompt, _, _ in taken])
    kept = [(ids, count, priority) for ids, (_, _, count, priority) in zip(prompt_ids, taken) if len(ids) > 0]
    warn_if_one_id(tokenizer, [ids for ids, _, _ in kept], path)
    empty = len(taken) - len(kept)
    extra = oversample_rows(len(kept), num_prompts, seed) if oversample else []
    kept += [kept[row] for row in extra]
    metadata = {"dataset": "custom", "tokenizer": tokenizer.describe, "seed": seed, "lines": len(rows),
                "skipped_empty_prompt": empty, "sampled": len(kept) - len(extra), "oversampled": len(extra),
                "shuffled": bool(shuffle), "chat_template": "not applied (prompts counted as written)",
                "output_len": "from output_tokens" if from_file else output_len}
    trace = dataset_trace(prompt_tokens=[ids for ids, _, _ in kept], output_len=np.asarray([c for _, c, _ in kept]),
                          source=f"custom:{path}", metadata=metadata)
    if has_priority:  # (a pagesim extension: see the module docstring)
        trace = replace(trace, priority=np.asarray([p for _, _, p in kept], dtype=np.int64))
    return trace
