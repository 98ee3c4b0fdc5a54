"""The best prefix hit rate any eviction policy could reach on a trace: Belady's MIN at the cache's
size, and an infinite cache's.

Why: when a study's eviction policies tie, the reader needs to know whether no policy *could*
differ (the reusable blocks fit in the cache, or they are so far apart that no cache of this
size keeps them) or the policies leave hits on the table. Both figures come from the trace alone.

The reference stream. Request ``r`` (in arrival order; the time of its references is its
position ``t``) refers to each of its prompt's full blocks, as the simulator keys them: block
``j``'s key stands for the prompt's tokens through the block's end, so it is equal across requests
exactly when their prefix identities agree through the identity holding the block's last token
(``pagesim.traces.trace``: identities of ``P`` tokens; with none, a prompt is unique to its request and
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
from where a prompt ends inside it, so a node every reference of which covers (and may hit) all
its blocks is one *unit* of that many blocks, with one interval of that weight per reuse (MIN may
keep part of one); a node some prompt ends inside is cut, at every such end, into classes of
blocks with identical references, each a unit. A node only one request refers to is dropped
first: nothing can hit it.

Cost: numpy over the ``E`` identity entries and the units (``O(E log E)``; a per-depth loop of at
most the longest prompt's identity count), then, unless every interval fits at once, one Python
loop with a heap over the ``I`` reuse intervals (``O(I log I)``, about a microsecond each). The
Mooncake conversation trace's hour (12,031 requests, 289k identities) has about 10^5 intervals.
Memory ``O(E + I)``: a few 4- and 8-byte columns per identity entry, at the end of a run. Measured
on a busy 2-core machine: that hour at 16-token blocks, 0.14 s and 7 MiB at peak; 100,000
multi-turn-chat requests (1.4 hours, 2.6M identities, 2.1M intervals), 0.9 s and 147 MiB with a
cache that holds every interval, 3 s with one of 2,000 blocks.

The summary reads the infinite cache's hits for one more figure: the hit blocks a run missed that
had been cached (``pagesim.sim.cluster_metrics.missed_hit_blocks``).
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

import numpy as np

from pagesim.traces.trace import Trace


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


def ideal_cache(trace: Trace, block_size: int, capacity_blocks: int, rows: np.ndarray | None = None, *,
                hit_last_block: bool = False) -> IdealCache:
    """The ideal and infinite caches' hits on ``trace``'s rows ``rows`` (a mask, or row indices in
    the order the requests reach the cache; default all, in order) at ``block_size`` tokens a
    block, the ideal one holding ``capacity_blocks``."""
    if block_size < 1 or capacity_blocks < 0:
        raise ValueError(f"block_size must be >= 1 and capacity_blocks >= 0, got {block_size}, {capacity_blocks}")
    prompt_tokens = int(trace.prompt_len.sum() if rows is None else trace.prompt_len[rows].sum())
    if trace.prefix_id_values is None:  # (no prompt shares anything: no copy of a million rows to learn it)
        return IdealCache(capacity_blocks, prompt_tokens, 0, 0, 0)
    if rows is None:
        ordered = trace
    elif rows.dtype == bool or (rows.size < 2 or bool(np.all(np.diff(rows) > 0))):
        ordered = trace.take(rows)
    else:
        ordered = _in_order(trace, rows)
    intervals = reuse_intervals(ordered, block_size, hit_last_block=hit_last_block)
    return IdealCache(capacity_blocks=capacity_blocks, prompt_tokens=prompt_tokens,
                      ideal_hit_tokens=block_size * belady_hits(intervals, capacity_blocks),
                      infinite_hit_tokens=block_size * int(intervals.weights.sum()),
                      reusable_blocks=intervals.reusable_blocks)


def _in_order(trace: Trace, index: np.ndarray) -> Trace:
    """The requests at ``index`` (any order) as a trace in that order: their lengths and prefix
    identities (what the reuse intervals read), arrivals renumbered 0, 1, ..."""
    offsets = trace.prefix_id_offsets
    counts = np.diff(offsets)[index]
    starts = offsets[:-1][index]
    ends = np.cumsum(counts)
    gather = np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]) if len(ends) else 0)
    return Trace(arrival_s=np.arange(len(index), dtype=np.float64), prompt_len=trace.prompt_len[index],
                 output_len=trace.output_len[index], prefix_id_values=trace.prefix_id_values[gather],
                 prefix_id_offsets=np.concatenate([[0], ends]).astype(offsets.dtype),
                 prefix_block_tokens=trace.prefix_block_tokens)


@dataclass(frozen=True)
class ReuseIntervals:
    """Reuse intervals ``[starts, ends)`` (request positions, ``start < end``; int32), each ending
    at a scoring reference, of ``weights`` blocks each (int32); ``reusable_blocks``: the distinct
    blocks they cover (those some later request could hit)."""

    starts: np.ndarray
    ends: np.ndarray
    weights: np.ndarray
    reusable_blocks: int


def reuse_intervals(trace: Trace, block_size: int, *, hit_last_block: bool = False) -> ReuseIntervals:
    """The reuse intervals of ``trace``'s block references (module docstring); ``hit_last_block``:
    a prompt's last full block may be hit too (vLLM 0.33's offload connector loads it, and the
    request computes only its last token again: an upper bound then counts the whole block)."""
    empty = np.zeros(0, np.int32)
    none = ReuseIntervals(empty, empty, empty, 0)
    if trace.prefix_id_values is None or not len(trace) or not int(trace.prefix_id_offsets[-1]):
        return none
    ident = trace.prefix_block_tokens
    offsets = trace.prefix_id_offsets
    counts = np.diff(offsets)
    row = np.repeat(np.arange(len(trace), dtype=np.int32), counts)  # each identity entry's request
    depth = (np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)).astype(np.int32)
    node = _prefix_nodes(trace.prefix_id_values, offsets)
    shared = np.bincount(node)[node] > 1  # (a prefix only one request has can never be hit)
    node, row, depth = node[shared], row[shared], depth[shared]
    # the blocks of node (depth d): those whose last token lies in identity d
    lo = depth.astype(np.int64) * ident // block_size
    width = ((depth.astype(np.int64) + 1) * ident // block_size - lo).astype(np.int32)
    covered = np.clip(trace.prompt_len[row] // block_size - lo, 0, width).astype(np.int32)  # the node's blocks it refers to
    last = trace.prompt_len[row] if hit_last_block else trace.prompt_len[row] - 1
    scored = np.clip(last // block_size - lo, 0, width).astype(np.int32)  # and may hit
    del lo, depth
    keep = covered > 0
    node, row, width, covered, scored = node[keep], row[keep], width[keep], covered[keep], scored[keep]
    if not len(node):
        return none
    # Units: a node every reference of which covers and may hit all its blocks is one unit of
    # `width` blocks; a node some reference covers or may hit in part is cut into classes of
    # blocks with the same references (at every covered / scored count inside it).
    whole = (covered == width) & (scored == width)
    cut = np.zeros(int(node.max()) + 1, bool)
    cut[node[~whole]] = True
    cut_ref = cut[node]
    units = [node[~cut_ref].astype(np.int64)]
    times = [row[~cut_ref]]
    scores = [np.ones(int((~cut_ref).sum()), bool)]
    weights = [width[~cut_ref]]
    if cut_ref.any():  # these references by class: a node's blocks cut at every covered / scored count in it
        c_node, c_row, c_cov, c_sc = node[cut_ref].astype(np.int64), row[cut_ref], covered[cut_ref], scored[cut_ref]
        span = int(width.max()) + 1
        cuts = _distinct(np.concatenate([c_node * span + c_cov, (c_node * span + c_sc)[c_sc > 0]]))
        cut_node, cut_at = cuts // span, cuts % span
        class_weight = (cut_at - np.where(np.r_[True, cut_node[1:] != cut_node[:-1]], 0, np.r_[0, cut_at[:-1]]))
        first = np.searchsorted(cuts, c_node * span)  # the node's first class
        per_ref = np.searchsorted(cuts, c_node * span + c_cov) - first + 1  # its classes up to covered
        last_scored = np.searchsorted(cuts, c_node * span + c_sc, side="right") - 1
        within = np.arange(int(per_ref.sum()), dtype=np.int64) - np.repeat(np.cumsum(per_ref) - per_ref, per_ref)
        ref_class = np.repeat(first, per_ref) + within
        units.append(len(cut) + ref_class)
        times.append(np.repeat(c_row, per_ref))
        scores.append(ref_class <= np.repeat(last_scored, per_ref))
        weights.append(class_weight[ref_class].astype(np.int32))
    del node, row, width, covered, scored, whole, cut, cut_ref  # (memory: what is left is the references)
    unit = np.concatenate(units)
    order = np.lexsort((np.concatenate(times), unit))  # by unit, then time
    unit = unit[order]
    pair = (unit[1:] == unit[:-1]) & np.concatenate(scores)[order][1:]
    reused = unit[1:][pair]
    del unit
    time = np.concatenate(times)[order]
    reused_weight = np.concatenate(weights)[order][1:][pair]
    first = np.r_[True, reused[1:] != reused[:-1]]  # (each unit's first interval: its distinct blocks once)
    return ReuseIntervals(time[:-1][pair], time[1:][pair], reused_weight, int(reused_weight[first].sum()) if len(reused) else 0)


def _distinct(values: np.ndarray) -> np.ndarray:
    """``values``' distinct elements, sorted (a sort: ``np.unique``'s hash table is slower here)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def _prefix_nodes(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each identity entry (CSR: request ``i``'s identities are ``values[offsets[i]:offsets[i
    + 1]]``), the id of its prefix: entries get equal ids exactly when their requests' identities
    agree from the first through this one. Depth by depth (at most the longest prompt's identity
    count), over the requests that long: two ``np.unique`` each, no array of all entries but
    the answer (int32)."""
    counts = np.diff(offsets)
    starts = offsets[:-1]
    longest_first = np.argsort(-counts, kind="stable")
    alive = np.searchsorted(-counts[longest_first], -np.arange(int(counts.max())), side="left")  # (rows deeper than d)
    node = np.empty(int(offsets[-1]), np.int32)
    next_id = 0
    for d, num_rows in enumerate(alive.tolist()):
        at = starts[longest_first[:num_rows]] + d
        _, value = np.unique(values[at], return_inverse=True)
        key = value.reshape(-1) if d == 0 else node[at - 1].astype(np.int64) * (int(value.max()) + 1) + value.reshape(-1)
        _, ids = np.unique(key, return_inverse=True)
        node[at] = ids.reshape(-1) + next_id
        next_id += int(ids.max()) + 1
    return node


def belady_hits(intervals: ReuseIntervals, capacity: int) -> int:
    """The most interval weight held with at most ``capacity`` held at any time (``[start, end)``
    half open; part of an interval's weight may be held): Belady's MIN, by start, dropping the
    held intervals that end last. ``O(I log I)`` for ``I`` intervals, one heap push each; the
    columns are C arrays (4 bytes an interval) and the heap is pruned of what ended or was dropped,
    so memory follows the cache, not the trace."""
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
    start_of, end_of, left = (_c_ints(column[order]) for column in (starts, ends, weights))  # left: weight still held
    ending = [0] * horizon  # weight held that stops being held at each time (its interval's end)
    farthest: list[tuple[int, int]] = []  # (-end, i) of intervals added: the latest end first
    prune_at = 1024
    held = dropped = 0
    now = 0  # held counts what ends after now
    push, pop = heapq.heappush, heapq.heappop
    for i, (start, end, weight) in enumerate(zip(start_of, end_of, left)):
        if start != now:
            held -= ending[start] if start == now + 1 else sum(ending[now + 1:start + 1])
            now = start
        if held + weight > capacity and (not farthest or end >= -farthest[0][0]):
            # the new interval ends last of all: what does not fit of it is dropped at once
            cut = min(weight, held + weight - capacity)
            left[i] = weight = weight - cut
            dropped += cut
            if not weight:
                continue
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
            ending[end_of[j]] -= cut
            dropped += cut
            if not left[j]:
                pop(farthest)
        if len(farthest) > prune_at:  # (what ended or was dropped whole can never be popped usefully)
            farthest = [entry for entry in farthest if left[entry[1]] and -entry[0] > now]
            heapq.heapify(farthest)
            prune_at = max(1024, 2 * len(farthest))
    return total - dropped


def _c_ints(column: np.ndarray) -> array:
    """``column`` as a C array of 32-bit ints (no Python int held per element)."""
    out = array("i")
    out.frombytes(np.ascontiguousarray(column, dtype=np.int32).tobytes())
    return out
