"""Each request's prompt and output length, and its prompt's contents as prefix identities.

Request ``n`` of a stage (counted from 0 in every stage: ``run_stage`` enqueues request numbers
``range(num_requests)`` and the 2026 sender restarts ``get_data()``; load_generator.py:226-229 at
3b6f82a) gets, by data type:

- ``shared_prefix``: inference-perf builds ``num_groups x prompts_per_group`` prompts group by
  group (a system prompt of ``system_prompt_len`` tokens, then each question), shuffles them once
  (``random.shuffle`` in 2025, unseeded; a seeded ``rng.permutation`` in 2026) and sends prompt
  ``n mod count`` of the shuffled list (shared_prefix_datagen.py:59-61 and :87-103 at 3b6f82a).
  Here the shuffle is drawn from the caller's generator. A prompt's blocks of
  ``prefix_block_tokens`` that lie wholly in its system prompt carry identities shared by its
  group; the rest (the block that straddles into the question, and the question's) carry
  identities of that prompt alone, the same every time the prompt recurs. The identities are
  ``pagesim.traces.generate.workload.prefix_identities``' (group = system prompt, prompt = chain).
- ``random``: lengths ``input_lengths[n]`` and ``output_lengths[n]`` of two arrays drawn once per
  run; every prompt is fresh random tokens, so no identities (nothing shared).
- ``synthetic``: the same lengths; a prompt is ``input_lengths[n]`` tokens of one built-in text.
  Before 2026's f624ba7 every prompt is the text's *start*, so any two share their shorter one's
  tokens: block ``j`` of every prompt carries identity ``j``. From then on each starts at a random
  offset (nothing shared; no identities). A config without ``data.corpus_file_path`` is read as
  the earlier (see ``config``).

Prompt lengths are the configured token counts. The server's count can differ: inference-perf
2025 decoded random token ids to text that the server re-tokenizes (the shared llama general runs
measured 575 prompt tokens for 547 configured); 2026 releases converge the text to the exact count.
"""

from __future__ import annotations

import numpy as np

from pagesim.traces.generate.workload import prefix_identities
from pagesim.traces.inference_perf.config import LengthWorkload, SharedPrefixWorkload


def shared_prefix_rows(workload: SharedPrefixWorkload, positions: np.ndarray, rng: np.random.Generator,
                       block_tokens: int) -> dict[str, np.ndarray]:
    """Trace columns for requests at ``positions`` (their index within their stage)."""
    count = workload.num_groups * workload.prompts_per_group
    question = workload.question.sample(count, rng)  # prompt p = group p // per_group, question p % per_group
    output = workload.output.sample(count, rng)
    order = rng.permutation(count)  # the one shuffle of the prompt list
    prompt_of_row = order[positions % count]
    group = prompt_of_row // workload.prompts_per_group
    prompt_len = workload.system_prompt_tokens + question[prompt_of_row]
    values, offsets = prefix_identities(prompt_len, group, prompt_of_row, block_tokens,
                                        workload.system_prompt_tokens // block_tokens, workload.num_groups)
    return {"prompt_len": prompt_len, "output_len": output[prompt_of_row],
            "prefix_id_values": values, "prefix_id_offsets": offsets}


def length_rows(workload: LengthWorkload, positions: np.ndarray, rng: np.random.Generator,
                block_tokens: int) -> dict[str, np.ndarray]:
    """Trace columns for ``random`` or ``synthetic`` requests at ``positions``."""
    prompt_len = workload.prompt.sample(workload.prompt_count, rng)[positions]
    output_len = workload.output.sample(workload.output_count, rng)[positions]
    columns = {"prompt_len": prompt_len, "output_len": output_len}
    if workload.shared_text:
        blocks = -(-prompt_len // block_tokens)
        offsets = np.zeros(len(prompt_len) + 1, dtype=np.int64)
        np.cumsum(blocks, out=offsets[1:])
        # block j of every prompt is block j of the one text
        columns["prefix_id_values"] = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], blocks)
        columns["prefix_id_offsets"] = offsets
    return columns


def rows(workload: SharedPrefixWorkload | LengthWorkload, positions: np.ndarray, rng: np.random.Generator,
         block_tokens: int) -> dict[str, np.ndarray]:
    build = shared_prefix_rows if isinstance(workload, SharedPrefixWorkload) else length_rows
    return build(workload, positions, rng, block_tokens)
