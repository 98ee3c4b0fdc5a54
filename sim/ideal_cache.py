"""The best prefix hit rate any eviction policy could reach on a trace: Belady's MIN at the cache's
size, and an infinite cache's.

Why: when a study's eviction policies tie, the reader needs to know whether no policy *could*
differ (the reusable blocks fit in the cache, or they are so far apart that no cache of this
size keeps them) or the policies leave hits on the table. Both figures come from the trace alone.

The reference stream. Request ``r`` (in arrival order; the time of its references is its
position ``t``) refers to each of its prompt's full blocks, as the simulator keys them: block
``j``'s key stands for the prompt's tokens through the block's end, so it is equal across requests
exactly when their prefix identities agree through the identity holding the block's last token
(``traces.trace``: identities of ``P`` tokens; with none, a prompt is unique to its request and
refers to nothing anyone else can hit). A reference *scores* a hit only below the lookup's cap
(``(prompt_len - 1) // block_size`` blocks: the last known token is always recomputed, as vLLM v1
does and ``KVCacheManager.find_cached_prefix`` follows); a reference at the cap still brings the
block in.

The ideal cache holds ``capacity`` blocks and knows the future (MIN, with bypass: a block need not
be kept at all). Keeping a block from one reference to its next scoring one is a *reuse interval*
``[t_a, t_b)`` that takes one slot throughout and earns one hit; MIN is the most intervals held
with at most ``capacity`` at any time, found greedily: intervals by start, and whenever more than
``capacity`` are held, drop the one that ends last (Belady's farthest next use). That is an upper
bound for every eviction policy on this stream: a real cache also holds running requests' blocks
and generated tokens, and needs a hit's whole prefix, which only lowers what it gets. (It is the
stream in arrival order; a scheduler that admits out of order sees another stream.) The infinite
cache keeps every interval: every scoring reference but each block's first is a hit.

Blocks travel in groups: a prefix identity's blocks are referred to by the same requests, apart
from where a prompt ends inside it, so the blocks of one identity node are cut into *classes* at
every prompt end (and cap) that falls inside it; a class's blocks have identical intervals and
are handled as one interval of that weight (MIN may keep part of one).

Cost: numpy over the ``E`` identity entries and the block classes (``O(E log E)``; a per-depth
loop of at most the longest prompt's identity count), then one Python loop with two heaps over
the ``I`` reuse intervals (``O(I log I)``, about a microsecond each): the Mooncake conversation
trace's hour (12,031 requests, 289k identities) has about 10^5 intervals. Memory ``O(E + I)``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from traces.trace import Trace


@dataclass(frozen=True, slots=True)
class IdealCache:
    """What an ideal cache of ``capacity_blocks`` would have served of ``prompt_tokens``;
    ``+`` pools two streams served by separate caches (a cluster's replicas)."""

    capacity_blocks: int
    prompt_tokens: int
    ideal_hit_tokens: int  # MIN at capacity_blocks
    infinite_hit_tokens: int  # a cache that never evicts
    reusable_blocks: int  # distinct blocks some later request could hit

    def __add__(self, other: IdealCache) -> IdealCache:
        return IdealCache(*(getattr(self, name) + getattr(other, name) for name in self.__slots__))

    @property
    def ideal_hit_rate(self) -> float | None:
        return self.ideal_hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def infinite_hit_rate(self) -> float | None:
        return self.infinite_hit_tokens / self.prompt_tokens if self.prompt_tokens else None


def ideal_cache(trace: Trace, block_size: int, capacity_blocks: int, rows: np.ndarray | None = None) -> IdealCache:
    """The ideal and infinite caches' hits on ``trace``'s rows ``rows`` (sorted row indices or a
    mask; default all) at ``block_size`` tokens a block, the ideal one holding ``capacity_blocks``."""
    if block_size < 1 or capacity_blocks < 0:
        raise ValueError(f"block_size must be >= 1 and capacity_blocks >= 0, got {block_size}, {capacity_blocks}")
    prompt_tokens = int(trace.prompt_len.sum() if rows is None else trace.prompt_len[rows].sum())
    if trace.prefix_id_values is None:  # (no prompt shares anything: no copy of a million rows to learn it)
        return IdealCache(capacity_blocks, prompt_tokens, 0, 0, 0)
    intervals = reuse_intervals(trace if rows is None else trace.take(rows), block_size)
    return IdealCache(capacity_blocks=capacity_blocks, prompt_tokens=prompt_tokens,
                      ideal_hit_tokens=block_size * belady_hits(intervals, capacity_blocks),
                      infinite_hit_tokens=block_size * int(intervals.weights.sum()),
                      reusable_blocks=intervals.reusable_blocks)


@dataclass(frozen=True)
class ReuseIntervals:
    """Reuse intervals ``[starts, ends)`` (request positions, ``start < end``), each ending at a
    scoring reference, of ``weights`` blocks each; ``reusable_blocks``: the distinct blocks they
    cover (those some later request could hit)."""

    starts: np.ndarray
    ends: np.ndarray
    weights: np.ndarray
    reusable_blocks: int


def reuse_intervals(trace: Trace, block_size: int) -> ReuseIntervals:
    """The reuse intervals of ``trace``'s block references (module docstring)."""
    empty = np.zeros(0, np.int64)
    none = ReuseIntervals(empty, empty, empty, 0)
    if trace.prefix_id_values is None or not len(trace) or not int(trace.prefix_id_offsets[-1]):
        return none
    ident = trace.prefix_block_tokens
    offsets = trace.prefix_id_offsets
    counts = np.diff(offsets)
    row = np.repeat(np.arange(len(trace), dtype=np.int64), counts)  # each identity entry's request
    depth = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    node = _prefix_nodes(trace.prefix_id_values, depth)
    # the blocks of node (depth d): those whose last token lies in identity d
    lo = depth * ident // block_size
    width = (depth + 1) * ident // block_size - lo
    full = trace.prompt_len // block_size  # full blocks of each prompt
    cap = (trace.prompt_len - 1) // block_size  # blocks a lookup may hit
    covered = np.clip(full[row] - lo, 0, width)  # of the node's blocks, those this request refers to
    scored = np.clip(cap[row] - lo, 0, width)  # and those it may hit
    keep = covered > 0
    node, row, covered, scored = node[keep], row[keep], covered[keep], scored[keep]
    if not len(node):
        return none
    # classes: each node's blocks cut at every covered / scored count inside it
    span = int(width.max()) + 1
    cuts = _distinct(np.concatenate([node * span + covered, (node * span + scored)[scored > 0]]))
    cut_node, cut_at = cuts // span, cuts % span
    new_node = np.r_[True, cut_node[1:] != cut_node[:-1]]
    class_weight = cut_at - np.where(new_node, 0, np.r_[0, cut_at[:-1]])
    first = np.searchsorted(cuts, node * span)  # the node's first class
    last = np.searchsorted(cuts, node * span + covered)  # the class ending at covered
    last_scored = np.searchsorted(cuts, node * span + scored, side="right") - 1
    per_entry = last - first + 1
    total = int(per_entry.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(per_entry) - per_entry, per_entry)
    ref_class = np.repeat(first, per_entry) + within
    ref_time = np.repeat(row, per_entry)
    ref_scores = ref_class <= np.repeat(last_scored, per_entry)
    order = np.lexsort((ref_time, ref_class))
    ref_class, ref_time, ref_scores = ref_class[order], ref_time[order], ref_scores[order]
    pair = (ref_class[1:] == ref_class[:-1]) & ref_scores[1:]
    reused = ref_class[1:][pair]
    return ReuseIntervals(ref_time[:-1][pair], ref_time[1:][pair], class_weight[reused],
                          int(class_weight[_distinct(reused)].sum()))


def _distinct(values: np.ndarray) -> np.ndarray:
    """``values``' distinct elements, sorted (a sort: ``np.unique``'s hash table is slower here)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def _prefix_nodes(values: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each identity entry (CSR order: a request's entries consecutive, depth 0 first), the id
    of its prefix: entries get equal ids exactly when their requests' identities agree from the
    first through this one. One ``np.unique`` per depth."""
    _, rank = np.unique(values, return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    num_values = int(rank.max()) + 1
    node = np.empty(len(values), np.int64)
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    next_id = 0
    for d in range(len(bounds) - 1):
        at = by_depth[bounds[d]:bounds[d + 1]]
        key = rank[at] if d == 0 else node[at - 1] * num_values + rank[at]  # (entry at - 1: the parent)
        _, ids = np.unique(key, return_inverse=True)
        node[at] = ids.reshape(-1) + next_id
        next_id += int(ids.max()) + 1
    return node


def belady_hits(intervals: ReuseIntervals, capacity: int) -> int:
    """The most interval weight held with at most ``capacity`` held at any time (``[start, end)``
    half open; part of an interval's weight may be held): Belady's MIN, by start, dropping the
    held intervals that end last. ``O(I log I)`` for ``I`` intervals, one heap push each."""
    starts, ends, weights = intervals.starts, intervals.ends, intervals.weights
    if capacity <= 0 or not len(starts):
        return 0
    total = int(weights.sum())
    horizon = int(ends.max()) + 1
    load = np.zeros(horizon + 1, np.int64)  # weight held at each time if nothing is dropped
    np.add.at(load, starts, weights)
    np.add.at(load, ends, -weights)
    if int(np.cumsum(load).max()) <= capacity:
        return total  # (everything fits: the infinite cache's hits)
    order = np.lexsort((ends, starts))
    start_list, end_list, left = starts[order].tolist(), ends[order].tolist(), weights[order].tolist()
    ending = [0] * horizon  # weight held that stops being held at each time (its interval's end)
    farthest: list[tuple[int, int]] = []  # (-end, i) of intervals added: the latest end first
    held = dropped = 0
    now = 0  # held counts what ends after now
    push, pop = heapq.heappush, heapq.heappop
    for i, (start, end) in enumerate(zip(start_list, end_list)):
        if start != now:
            held -= sum(ending[now + 1:start + 1])
            now = start
        weight = left[i]
        held += weight
        ending[end] += weight
        push(farthest, (-end, i))
        while held > capacity:
            # NOTE: the top has the latest end of all, so never one that already ended (the one
            # just added ends after now); an interval dropped whole is popped as it is met.
            j = farthest[0][1]
            cut = min(left[j], held - capacity)
            left[j] -= cut
            held -= cut
            ending[end_list[j]] -= cut
            dropped += cut
            if not left[j]:
                pop(farthest)
    return total - dropped
