"""vLLM bench datasets (``vllm bench serve --dataset-name ...``, vLLM 0.33) as pagesim traces.

Each dataset becomes a ``Trace`` of the requests vLLM would send, in its order, with prompt
and output lengths counted as vLLM counts them (``tokenizer``), prefix identities of 16-token
chunks so shared prompt content hits the prefix cache (``identities``), no arrival times
(``has_arrivals=False``: an arrival process is applied later), and metadata saying which
tokenizer counted and what was skipped and why.

- ``sharegpt``: ShareGPT JSON, streamed (``sharegpt``, ``reading``);
- ``random``, ``prefix_repetition``: synthetic, lengths equal to vLLM's for the same seed
  (``synthetic``);
- ``custom``: JSONL of ``{"prompt", "output_tokens"}`` (``custom``);
- ``hf``: a Hugging Face dataset file on disk, Parquet or JSONL (``hf``);
- ``sonnet``: lines of a poem file under one instruction, a shared prefix (``sonnet``; vLLM 0.11.0's
  rules: vLLM 0.33 dropped it);
- ``burstgpt``: a BurstGPT CSV's GPT-4 token counts (``burstgpt``).

``cli`` holds vLLM's flag names and ``dataset_trace(args)``.
"""

from pagesim.traces.bench.burstgpt import burstgpt_trace
from pagesim.traces.bench.cli import DATASET_NAMES, add_dataset_args, dataset_name_given, dataset_trace
from pagesim.traces.bench.custom import custom_trace
from pagesim.traces.bench.hf import hf_trace
from pagesim.traces.bench.identities import PREFIX_CHUNK_TOKENS, chunk_identities
from pagesim.traces.bench.sharegpt import sharegpt_trace
from pagesim.traces.bench.sonnet import sonnet_trace
from pagesim.traces.bench.synthetic import prefix_repetition_trace, random_trace
from pagesim.traces.bench.tokenizer import load_tokenizer

__all__ = ["DATASET_NAMES", "PREFIX_CHUNK_TOKENS", "add_dataset_args", "burstgpt_trace", "chunk_identities",
           "custom_trace", "dataset_name_given", "dataset_trace", "hf_trace", "load_tokenizer",
           "prefix_repetition_trace", "random_trace", "sharegpt_trace", "sonnet_trace"]
