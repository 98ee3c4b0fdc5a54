"""Mooncake traces (Qin et al., FAST 2025; kvcache-ai/Mooncake ``FAST25-release/traces``).

Format: JSONL with ``timestamp`` (milliseconds from the start), ``input_length``,
``output_length`` and ``hash_ids``: the identities of the prompt's 512-token blocks, chained
like a prefix cache's hashes, so equal leading ids mean a shared, reusable prefix. Every row has
``len(hash_ids) == ceil(input_length / 512)``; the last block may be partial and then stands for
that identity's first tokens only. The ids become the trace's prefix identities as they are, so
sharing survives at any simulated block size (``traces.tokens`` expands them into pseudo-tokens).

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

from traces.errors import TraceFormatError
from traces.loaders.build import build_trace, check_identity_list, csr
from traces.loaders.text import PathArg, read_jsonl, to_numbers
from traces.trace import Trace

MOONCAKE_BLOCK_TOKENS = 512
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def load_mooncake(path: PathArg, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    stamps, inputs, outputs, hash_ids, lines = [], [], [], [], []
    for line, obj in read_jsonl(path):
        try:
            stamps.append(obj["timestamp"])
            inputs.append(obj["input_length"])
            outputs.append(obj["output_length"])
            ids = obj["hash_ids"]
        except KeyError as exc:
            raise TraceFormatError(path, f"missing key {exc.args[0]!r} (a Mooncake row has "
                                   f"{', '.join(KEYS)})", line) from None
        check_identity_list(path, ids, line, "hash_ids")
        hash_ids.append(ids)
        lines.append(line)
    if not lines:
        raise TraceFormatError(path, "no requests")
    values, offsets = csr(hash_ids)
    prompt_len = to_numbers(path, inputs, lines, "input_length", integer=True, minimum=1)
    wrong = np.flatnonzero(np.diff(offsets) != -(-prompt_len // block_tokens))
    if wrong.size:
        row = int(wrong[0])
        raise TraceFormatError(
            path, f"hash_ids: {len(hash_ids[row])} ids for input_length {prompt_len[row]}, expected "
            f"ceil({prompt_len[row]} / {block_tokens}) = {-(-prompt_len[row] // block_tokens)}", lines[row])
    return build_trace(
        path, lines,
        arrival_s=to_numbers(path, stamps, lines, "timestamp", integer=False) / 1000.0,
        prompt_len=prompt_len,
        output_len=to_numbers(path, outputs, lines, "output_length", integer=True, minimum=1),
        prefix_id_values=values,
        prefix_id_offsets=offsets,
        prefix_block_tokens=block_tokens,
        source=f"mooncake:{path}",
    )
