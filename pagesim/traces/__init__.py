"""Request traces: what a what-if study replays.

- ``pagesim.traces.trace.Trace``: requests held column-wise (numpy), with slicing, rescaling and lazy
  conversion to the policy's ``Request`` objects;
- ``pagesim.traces.loaders.load_trace``: real public traces (Azure, Mooncake, BurstGPT), length-only
  files, any CSV/JSONL with a column map, pagesim's own JSONL; ``.gz`` for all; errors name the
  file and line;
- ``pagesim.traces.generate``: arrival processes, length distributions, shared system prompts,
  multi-turn conversations, parallel sampling and beam search, and named workloads such as the
  PagedAttention paper's ``kwon2023-sharegpt`` and ``kwon2023-alpaca``;
- ``pagesim.traces.inference_perf``: an inference-perf output folder read back: the workload it sent as a
  ``Trace`` (its stages, shared-prefix groups, random lengths) and the latencies it measured;
- ``pagesim.traces.tokens``: pseudo-token ids for prompts known by prefix identities only;
- ``pagesim.traces.stats``: what ``pagesim trace stats`` prints, including prefix reuse;
- ``pagesim.traces.source``: the ``--trace`` / ``--workload`` flags every replaying command shares.
"""
