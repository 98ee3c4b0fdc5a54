"""What ``pagesim trace stats`` reports about a trace.

Counts, span and rate (rows / (last - first arrival), as the shared traces' README computes it),
prompt and output lengths (mean, p50, p99 with linear interpolation, min, max) and, when the
trace has prefix identities, ``prefix_reuse``: the fraction of identity references that repeat
an identity already referenced by an earlier request or block, which is the hit ratio of an
infinite prefix cache at the identities' own granularity (36.6 % for Mooncake's conversation
trace at 512 tokens).

``prefix_reuse_at(trace, block_size)`` asks the same at another block size, the way a prefix
cache sees it: only full blocks count, and a block is a hit only if the *whole prefix* up to its
end was seen before (prefix caches chain block hashes). Prefixes are compared through their
identities: each identity position gets a class numbering the distinct identity chains, and a
block ending ``t`` tokens into identity ``k`` is the pair (class of ``ids[:k+1]``, ``t``).
"""

from __future__ import annotations

import numpy as np

from pagesim.traces.trace import Trace


def _summary(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": round(float(values.mean()), 2),
        "p50": round(float(np.percentile(values, 50)), 2),
        "p99": round(float(np.percentile(values, 99)), 2),
        "min": int(values.min()),
        "max": int(values.max()),
    }


def count_distinct(values: np.ndarray) -> int:
    """Distinct values, by sorting (numpy 2's hash-based ``unique`` is several times slower here)."""
    if values.size == 0:
        return 0
    ordered = np.sort(values)
    return 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))


def prefix_reuse(trace: Trace, *, distinct: int | None = None) -> float | None:
    """Fraction of identity references that repeat an earlier one (None without identities);
    ``distinct`` is the number of distinct identities, if already counted."""
    values = trace.prefix_id_values
    if values is None or values.size == 0:
        return None
    return 1.0 - (count_distinct(values) if distinct is None else distinct) / values.size


def chain_classes(trace: Trace) -> np.ndarray:
    """For each identity reference, a number shared exactly by equal identity chains ``ids[:k+1]``."""
    classes = np.empty(trace.prefix_id_values.size, dtype=np.int64)
    seen: dict[tuple[int, int], int] = {}
    values = trace.prefix_id_values.tolist()
    offsets = trace.prefix_id_offsets.tolist()
    for i in range(len(trace)):
        parent = -1
        for position in range(offsets[i], offsets[i + 1]):
            key = (parent, values[position])
            parent = seen.setdefault(key, len(seen))
            classes[position] = parent
    return classes


def prefix_reuse_at(trace: Trace, block_size: int) -> float | None:
    """Ideal prefix-cache hit ratio over full blocks of ``block_size`` tokens (None without identities)."""
    if trace.prefix_id_values is None:
        return None
    if block_size < 1:
        raise ValueError("block size must be >= 1")
    identity_tokens = trace.prefix_block_tokens
    classes = chain_classes(trace)
    full_blocks = trace.prompt_len // block_size
    has_ids = np.diff(trace.prefix_id_offsets) > 0
    full_blocks = np.where(has_ids, full_blocks, 0)
    total = int(full_blocks.sum())
    if total == 0:
        return None
    row = np.repeat(np.arange(len(trace)), full_blocks)
    block_index = np.arange(total) - np.repeat(np.cumsum(full_blocks) - full_blocks, full_blocks)
    end = (block_index + 1) * block_size  # tokens covered by the prefix ending with this block
    k = (end - 1) // identity_tokens  # identity holding the block's last token
    within = end - k * identity_tokens  # tokens of that identity inside the prefix
    chain = classes[trace.prefix_id_offsets[row] + k]
    keys = chain * (identity_tokens + 1) + within
    return 1.0 - count_distinct(keys) / keys.size


def trace_stats(trace: Trace, *, block_size: int | None = None) -> dict:
    if len(trace) == 0:
        raise ValueError("the trace has no requests")
    stats: dict = {
        "source": trace.source,
        "requests": len(trace),
        "duration_s": round(trace.duration_s, 3) if trace.has_arrivals else None,
        "rate_rps": None if trace.rate_rps is None else float(f"{trace.rate_rps:.6g}"),
        "input_tokens": _summary(trace.prompt_len),
        "output_tokens": _summary(trace.output_len),
    }
    distinct = None if trace.prefix_id_values is None else count_distinct(trace.prefix_id_values)
    reuse = prefix_reuse(trace, distinct=distinct)
    if reuse is not None:
        stats["prefix_block_tokens"] = trace.prefix_block_tokens
        stats["prefix_reuse"] = round(reuse, 4)
        stats["distinct_prefix_blocks"] = distinct
        if block_size is not None:
            at = prefix_reuse_at(trace, block_size)
            stats[f"prefix_reuse_at_{block_size}"] = None if at is None else round(at, 4)
    if trace.has_conversations:
        stats["conversations"] = int(np.unique(trace.conversation_id).size)
        stats["turns"] = _summary(np.bincount(np.unique(trace.conversation_id, return_inverse=True)[1]))
    if (trace.n > 1).any():
        stats["parallel_sampling_requests"] = int((trace.n > 1).sum())
    if (trace.beam_width > 1).any():
        stats["beam_search_requests"] = int((trace.beam_width > 1).sum())
    if trace.metadata:
        stats.update({k: v for k, v in trace.metadata.items() if v is not None})
    if trace.has_arrivals and len(trace) > 1:
        stats["distinct_arrival_times"] = count_distinct(trace.arrival_s)
    return stats
