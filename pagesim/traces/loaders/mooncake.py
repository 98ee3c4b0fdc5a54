"""Mooncake traces (Qin et al., FAST 2025; kvcache-ai/Mooncake ``FAST25-release/traces``).

Format: JSONL with ``timestamp`` (milliseconds from the start), ``input_length``,
``output_length`` and ``hash_ids``: the identities of the prompt's 512-token blocks, chained
like a prefix cache's hashes, so equal leading ids mean a shared, reusable prefix. Every row has
``len(hash_ids) == ceil(input_length / 512)``; the last block may be partial and then stands for
that identity's first tokens only. The ids become the trace's prefix identities as they are, so
sharing survives at any simulated block size (``pagesim.traces.tokens`` expands them into pseudo-tokens).

NOTE: the conversation trace's timestamps are coarse: its 12,031 requests fall on 1,180
distinct stamps about 3 s apart, about ten at a time. Replayed literally that is a burst every
3 s, which is how the file records them, not necessarily how they arrived; ``--spread-ties``
(``Trace.spread_ties``) spreads each batch over its 3 s instead. ``trace stats`` reports
``distinct_arrival_times`` so the effect is visible.

The hash ids cover the prompt only. A follow-up turn's prompt holds the previous answer under
new ids, which a simulator's generated tokens never carry, so replaying the trace counts the
reuse of prompt blocks, not of cached output blocks (as Mooncake's own analysis does).
"""

from __future__ import annotations

import numpy as np

from pagesim.traces.errors import TraceFormatError
from pagesim.traces.loaders.build import build_trace
from pagesim.traces.loaders.columns import ChunkedColumns, Identities, Numbers
from pagesim.traces.loaders.stream import PathArg
from pagesim.traces.loaders.text import read_jsonl
from pagesim.traces.trace import Trace

MOONCAKE_BLOCK_TOKENS = 512
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def load_mooncake(path: PathArg, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    table = ChunkedColumns(path, {"prompt_len": Numbers("input_length", integer=True, minimum=1),
                                  "hash_ids": Identities("hash_ids"),
                                  "timestamp": Numbers("timestamp", integer=False),
                                  "output_len": Numbers("output_length", integer=True, minimum=1)})
    for line, obj in read_jsonl(path):
        try:
            table.add_row(line, [obj["input_length"], obj["hash_ids"], obj["timestamp"], obj["output_length"]])
        except KeyError as exc:
            raise TraceFormatError(path, f"missing key {exc.args[0]!r} (a Mooncake row has "
                                   f"{', '.join(KEYS)})", line) from None
    columns, lines = table.finish()
    if not len(lines):
        raise TraceFormatError(path, "no requests")
    prompt_len = columns["prompt_len"]
    values, offsets = columns["hash_ids"]
    counts = np.diff(offsets)
    wrong = np.flatnonzero(counts != -(-prompt_len // block_tokens))
    if wrong.size:
        row = int(wrong[0])
        raise TraceFormatError(
            path, f"hash_ids: {counts[row]} ids for input_length {prompt_len[row]}, expected "
            f"ceil({prompt_len[row]} / {block_tokens}) = {-(-prompt_len[row] // block_tokens)}", int(lines[row]))
    return build_trace(
        path, lines,
        arrival_s=columns["timestamp"] / 1000.0,
        prompt_len=prompt_len,
        output_len=columns["output_len"],
        prefix_id_values=values,
        prefix_id_offsets=offsets,
        prefix_block_tokens=block_tokens,
        source=f"mooncake:{path}",
    )
