"""A BurstGPT CSV's token counts as ``vllm bench serve --dataset-name burstgpt`` samples them.

vLLM 0.33 (benchmarks/datasets/datasets.py ``BurstGPTDataset``, :3015-3085; ``get_samples``,
:2315-2324) keeps the rows whose ``Model`` is ``GPT-4`` and whose ``Response tokens`` are above 0,
then takes ``--num-prompts`` of them with pandas' ``DataFrame.sample(n, random_state=seed)``
(with replacement when more are asked for than there are rows), which is NumPy's
``RandomState(seed).choice(rows, n, replace)``. Request ``i`` (in that order) has the row's
``Request tokens`` as its prompt length and ``Response tokens`` as its output length; its prompt
is the token ids ``i, i + 1, ...`` (modulo the vocabulary, decoded to text), so no two prompts
share a prefix. The file's timestamps are not used: the requests are sent at ``--request-rate``
like any dataset's. ``--disable-shuffle`` and ``--no-oversample``, which vLLM accepts and ignores
here, are refused.

The file is read by the BurstGPT trace loader (``pagesim.traces.loaders.burstgpt``), by column name (vLLM
reads the third and fourth columns, which are those in BurstGPT's files). It drops, with a
warning, rows with 0 response tokens (vLLM drops them silently) and rows with 0 request tokens,
which vLLM would send as empty prompts and pagesim cannot simulate.
"""

from __future__ import annotations

import os

import numpy as np

from pagesim.traces.bench.common import dataset_trace
from pagesim.traces.loaders.burstgpt import load_burstgpt
from pagesim.traces.trace import Trace

VLLM_MODEL = "GPT-4"  # the only rows vLLM keeps


def sample_rows(num_rows: int, num_prompts: int, seed: int) -> np.ndarray:
    """The rows pandas' ``sample(n=num_prompts, random_state=seed[, replace=True])`` picks."""
    return np.random.RandomState(seed).choice(num_rows, size=num_prompts, replace=num_prompts > num_rows)


def burstgpt_trace(path: str | os.PathLike[str], *, num_prompts: int, seed: int = 0) -> Trace:
    """The requests ``vllm bench serve --dataset-name burstgpt`` would send, in its order."""
    if num_prompts < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {num_prompts}")
    rows = load_burstgpt(path, model=VLLM_MODEL)
    picked = sample_rows(len(rows), num_prompts, seed)
    input_lens = rows.prompt_len[picked]
    output_lens = rows.output_len[picked]
    prompts = [np.arange(i, i + int(n), dtype=np.int64) for i, n in enumerate(input_lens)]
    metadata = {"dataset": "burstgpt", "tokenizer": "not used: the file gives token counts",
                "seed": seed, "rows": len(rows), "model": VLLM_MODEL, "oversampled": bool(num_prompts > len(rows)),
                "failed_rows": rows.metadata.get("failed_rows", 0),
                "empty_prompt_rows": rows.metadata.get("empty_prompt_rows", 0)}
    return dataset_trace(prompt_tokens=prompts, output_len=output_lens, source=f"burstgpt:{path}",
                         metadata=metadata)
