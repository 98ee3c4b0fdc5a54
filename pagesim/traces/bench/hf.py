"""A Hugging Face dataset file already on disk (Parquet or JSONL), sampled like vLLM 0.33's
``--dataset-name hf`` conversation datasets, with the columns named on the command line.

vLLM's ``hf`` dataset loads a hub dataset by name (``HuggingFaceDataset.load_data``,
datasets.py:3118-3128) and picks a class by that name. Nothing is downloaded here: the file is
read with ``pyarrow`` (Parquet, in record batches) or line by line (JSONL), and its columns say
what a request is:

- a conversations column (``--hf-conversations-column``, default ``conversations``): as
  ``ConversationDataset.sample`` (:3144-3194): rows with fewer than two turns are dropped
  (:3156), the first turn's ``value`` is the prompt and the second's the completion (:3165);
- or ``--hf-prompt-column`` (text) with ``--hf-output-column`` (a completion text, counted, or
  an output token count).

As in ``ConversationDataset``: ``--hf-output-len`` replaces every output length, and only when
it is not given are pairs that ``is_valid_sequence`` refuses skipped (:3171-3174); fewer valid
rows than asked are oversampled (:3191, :289-330).

Deviation: vLLM shuffles with ``datasets``' ``shuffle(seed=seed)`` (:3127-3128; a shard and
buffer shuffle when streaming), which cannot be reproduced without that library and the
hub's sharding; here the rows are shuffled with ``random.Random(seed)``, as ShareGPT's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from pagesim.traces.bench.common import (checked_text, count_problem, dataset_trace, invalid_reason, oversample_rows,
                                 shuffled, take_valid)
from pagesim.traces.bench.custom import whole_count
from pagesim.traces.bench.reading import iter_jsonl
from pagesim.traces.bench.tokenizer import Tokenizer, warn_if_one_id
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.limits import MAX_LENGTH_TOKENS
from pagesim.traces.loaders.stream import require_regular_file
from pagesim.traces.trace import Trace

PARQUET_BATCH_ROWS = 4096


def _rows(path: str | os.PathLike[str], columns: list[str]) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` for each row, ``row`` holding ``columns`` (those the file has)."""
    name = os.fspath(path).lower()
    if name.endswith(".parquet"):
        require_regular_file(path)
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("reading a Parquet dataset needs pyarrow: pip install pyarrow") from None
        try:
            table = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow's own error types
            raise TraceFormatError(path, f"cannot read as Parquet ({type(exc).__name__})") from None
        present = set(table.schema_arrow.names)
        missing = [c for c in columns if c not in present]
        if missing:
            # (the file's own column names are not quoted: a message never holds what a file holds)
            raise TraceFormatError(path, f"no column {missing[0]!r} among its {len(present)} columns")
        row = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
            for item in batch.to_pylist():
                yield f"row {row}", item
                row += 1
    elif name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
        for line, obj in iter_jsonl(path, what="row"):
            yield f"line {line}", obj
    else:
        raise ValueError(f"{os.fspath(path)}: the hf dataset reads a local .parquet or .jsonl file "
                         "(nothing is downloaded)")


def _text(path, where: str, value, what: str) -> str:
    if not isinstance(value, str):
        raise TraceFormatError(path, f"{where}: {what} must be text")
    return checked_text(path, value, f"{where}: {what}")


def hf_trace(path: str | os.PathLike[str], tokenizer: Tokenizer, *, num_prompts: int, seed: int = 0,
             output_len: int | None = None, prompt_column: str | None = None, output_column: str | None = None,
             conversations_column: str = "conversations", shuffle: bool = True, oversample: bool = True) -> Trace:
    """The requests a local Hugging Face dataset file gives, sampled as vLLM's conversation datasets."""
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    problem = None if output_len is None else count_problem(output_len, "--hf-output-len")
    if problem is not None:
        raise ValueError(f"{problem}, got {output_len}")
    if output_column is not None and prompt_column is None:
        raise ValueError("--hf-output-column goes with --hf-prompt-column")
    if prompt_column is not None and output_column is None and output_len is None:
        raise ValueError("--hf-prompt-column needs --hf-output-column (a completion or a token count) "
                         "or --hf-output-len")
    columns = [conversations_column] if prompt_column is None else \
        [c for c in (prompt_column, output_column) if c is not None]
    # each row as (prompt, completion text or token count or None); None marks a dropped row
    rows: list[tuple[str, str | int | None] | None] = []
    for where, item in _rows(path, columns):
        for column in columns:
            if column not in item:
                raise TraceFormatError(path, f"{where}: missing column {column!r}")
        if prompt_column is None:
            turns = item[conversations_column]
            if not isinstance(turns, list):
                raise TraceFormatError(path, f"{where}: {conversations_column!r} must be a list of turns")
            if len(turns) < 2:
                rows.append(None)
                continue
            pair = []
            for k in (0, 1):
                if not isinstance(turns[k], dict):
                    raise TraceFormatError(path, f"{where}: turn {k} must be an object with a \"value\"")
                pair.append(_text(path, where, turns[k].get("value"), f"turn {k}'s \"value\""))
            rows.append((pair[0], pair[1]))
        else:
            prompt = _text(path, where, item[prompt_column], f"column {prompt_column!r}")
            target = None if output_column is None else item[output_column]
            if target is not None and not isinstance(target, str):
                target = whole_count(target)
                if count_problem(target, "the count") is not None:
                    raise TraceFormatError(path, f"{where}: column {output_column!r} must be text or a whole "
                                           f"number from 1 to {MAX_LENGTH_TOKENS:,}")
            rows.append((prompt, target))
    # vLLM shuffles the whole dataset (load_data), then drops short conversations while sampling
    order = shuffled(len(rows), seed) if shuffle else list(range(len(rows)))
    dropped = sum(row is None for row in rows)
    candidates = [rows[i] for i in order if rows[i] is not None]
    skipped = {"prompt_too_short": 0, "output_too_short": 0, "prompt_too_long": 0, "total_too_long": 0,
               "empty_prompt": 0}

    def encode(batch: list) -> tuple[list, list]:
        if output_len is not None:
            return tokenizer.encode_batch([p for p, _ in batch]), [output_len] * len(batch)
        counted = tokenizer.count_batch([t if isinstance(t, str) else "" for _, t in batch])
        return (tokenizer.encode_batch([p for p, _ in batch]),
                [target if isinstance(target, int) else count for (_, target), count in zip(batch, counted)])

    def reason_of(ids: list, out: int) -> str | None:
        reason = invalid_reason(len(ids), out) if output_len is None else None
        if reason is None and len(ids) == 0:
            reason = "empty_prompt"  # a Trace cannot hold it (vLLM would send it)
        return reason

    prompts, outputs, examined = take_valid(candidates, num_prompts, encode, reason_of, skipped)
    warn_if_one_id(tokenizer, prompts, path)
    num_sampled = len(prompts)
    extra = oversample_rows(num_sampled, num_prompts, seed) if oversample else []
    prompts += [prompts[row] for row in extra]
    outputs += [outputs[row] for row in extra]
    if not prompts:
        raise TraceFormatError(path, "no row is a valid request")
    metadata = {"dataset": "hf", "tokenizer": tokenizer.describe, "seed": seed, "rows": len(rows),
                "dropped_fewer_than_two_turns": dropped, "examined": examined,
                **{f"skipped_{k}": v for k, v in skipped.items()}, "sampled": num_sampled,
                "oversampled": len(extra), "shuffled": bool(shuffle),
                "columns": {"prompt": prompt_column, "output": output_column}
                if prompt_column is not None else {"conversations": conversations_column}}
    if output_len is not None:
        metadata["output_len"] = output_len
    return dataset_trace(prompt_tokens=prompts, output_len=np.asarray(outputs), source=f"hf:{path}",
                         metadata=metadata)
