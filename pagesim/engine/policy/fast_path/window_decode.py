"""Skip-ahead for a hybrid KV cache: a steady decode's pool calls when sliding windows drop blocks.

With sliding-window layer groups (``pagesim.engine.policy.memory.hybrid_kv``), a pure decode step makes, for
each running sequence in scheduling order, the calls ``VllmV1StepOrder._schedule_running`` and
``Scheduler.run`` make, in this order:

1. **drop**: ``remove_skipped_blocks``: every sliding group releases the blocks that left the
   window of the step's token (at ``num_computed_tokens``); a block whose count reaches 0 goes to
   the front of the free list, or to the eviction order if it carries a key;
2. **allocate**: ``reserve``: a new block in every group, group after group, when the token
   starts a block;
3. **register**: ``register``: the block the token completes gets its key in every full group
   (and in a sliding group where ``_kept_blocks`` says so), with prefix caching on.

Between those events a decode step makes no pool call. Each kind recurs with a period of
``block_size`` steps per sequence, so the events of ``k`` steps are known in advance, as in the
one-group case (``pagesim.engine.policy.fast_path.fast_forward.decode_events``), and they are applied *by calling
the KV manager's own methods*, one event at a time, in the step-by-step order: the same block
ids, the same eviction order, the same keys. A drop at step 1 may release several blocks (the
first decode after a prefill drops the prompt's blocks behind the window); later drops release
one block per sliding window type every ``block_size`` steps.

A drop raises the free count, which the one-group case never does; so the number of steps a
batch can run without preempting is bounded by the allocations alone (drops only add room), and a
queue head refused for blocks is not a stable refusal here (``fast_forward.queues_stay_refused``).

Requirements checked by ``fast_forward._decoders``: one live sequence per request (a request's
drops all come before its allocations, so several would interleave otherwise), the last block of
every group's table held by this sequence alone (no copy-on-write), and the blocks registered up
to the computed tokens.
"""

from __future__ import annotations

from pagesim.engine.policy.memory.hybrid_kv import skipped_blocks
from pagesim.engine.policy.scheduling.request import Sequence, num_dropped


def hybrid_events(kv, computed: list[int], seqs: list[Sequence], k: int) -> list[int]:
    """The drops, allocations and registrations of ``k`` decode steps of ``seqs`` (at
    ``computed``), sorted in step-by-step order; each is ``(step * len(seqs) + position) * 3 +
    kind`` (0 drop, 1 allocate, 2 register)."""
    bs = kv.block_size
    n = len(seqs)
    windows = [w for w, _ in kv.sliding_types]  # (each distinct window once)
    caching = kv.enable_prefix_caching
    events: list[int] = []
    if k == 1:  # (an admitting step's decodes: step 1's events alone, already in order)
        n3 = 3 * n
        for i, (seq, c) in enumerate(zip(seqs, computed)):
            code = n3 + 3 * i
            if _behind_window(kv, seq, c):  # (a drop at step 1; the periodic ones start at step 2)
                events.append(code)
            if c % bs == 0:  # (c + j - 1) % bs == 0 at j = 1
                events.append(code + 1)
            if caching and (c + 1) % bs == 0:  # (c + j) % bs == 0 at j = 1
                events.append(code + 2)
        return events
    for i, (seq, c) in enumerate(zip(seqs, computed)):
        base = 3 * i
        # Drops: at step 1 where a sliding table still holds a block behind the window; from
        # step 2 on, where the window's start crosses a block boundary: (c + j - w) % bs == 0,
        # c + j - 1 >= w (skipped_blocks grows from step j - 1 to step j).
        drop_steps: set[int] = set()
        if _behind_window(kv, seq, c):
            drop_steps.add(1)
        for w in windows:
            first = max(2, w - c + 1)
            first += (w - c - first) % bs  # the first j >= first with (c + j - w) % bs == 0
            drop_steps.update(range(first, k + 1, bs))
        for j in drop_steps:
            events.append((j * n) * 3 + base)
        first = (-c) % bs + 1  # the steps that allocate: (c + j - 1) % bs == 0
        events.extend(range((first * n) * 3 + base + 1, ((k + 1) * n) * 3, bs * n * 3))
        if caching:
            first = (-c - 1) % bs + 1  # the steps that fill a block: (c + j) % bs == 0
            events.extend(range((first * n) * 3 + base + 2, ((k + 1) * n) * 3, bs * n * 3))
    events.sort()
    return events


def _behind_window(kv, seq: Sequence, c: int) -> bool:
    """Whether a sliding table of ``seq`` still holds a block its next token's window left."""
    bs = kv.block_size
    for window, table in zip(kv.windows, kv.tables(seq)):
        if window is not None:
            skipped = min(skipped_blocks(window, c, bs), len(table))
            if skipped and table[skipped - 1] is not None:
                return True
    return False


class HybridCounts:
    """Per-step counts of what the events did, for the step rows (``pagesim.sim.decode_spans.DecodeSpanLog``)
    and the carried batch: blocks allocated (every group's) and evicted, table entries dropped,
    dropped blocks that left use (their count reached 0) and, of those, the ones that became
    cached (they carry a key); ``groups``: the cache's layer groups (each has a table)."""

    __slots__ = ("allocations", "evictions", "dropped", "freed", "cached", "groups")

    def __init__(self, k: int, groups: int):
        self.groups = groups
        self.allocations = [0] * k
        self.evictions = [0] * k
        self.dropped = [0] * k
        self.freed = [0] * k
        self.cached = [0] * k


def apply_hybrid_events(events: list[int], e: int, through_step: int, seqs: list[Sequence], computed: list[int],
                        kv, counts: HybridCounts) -> int:
    """Carry out the events of steps up to ``through_step`` from index ``e`` with the KV manager's
    own calls; returns the next index."""
    pool = kv.pool
    groups = counts.groups
    n3 = 3 * len(seqs)
    stop = (through_step + 1) * n3
    num = len(events)
    while e < num:
        code = events[e]
        if code >= stop:
            break
        j, rest = divmod(code, n3)
        i, kind = divmod(rest, 3)
        seq = seqs[i]
        position = computed[i] + j - 1  # the token step j computes
        if kind == 0:
            seq.num_computed_tokens = position  # (what remove_skipped_blocks reads)
            free, cached = pool.num_free_blocks, pool.num_cached_free_blocks
            counts.dropped[j - 1] += kv.remove_skipped_blocks(seq)
            counts.freed[j - 1] += pool.num_free_blocks - free
            counts.cached[j - 1] += pool.num_cached_free_blocks - cached
        elif kind == 1:  # (every group's table, one length, grows by a block: counts.groups blocks)
            evicted = pool.num_evictions
            copies = kv.reserve(seq, position, position + 1)
            assert not copies, "a steady decoder never copies on write"
            counts.allocations[j - 1] += groups
            counts.evictions[j - 1] += pool.num_evictions - evicted
        else:
            kv.register(seq, position + 1)
        e += 1
    return e


def table_counts(seqs: list[Sequence]) -> tuple[int, int]:
    """(blocks the sequences' tables hold, each table's count; entries windows dropped)."""
    held = dropped = 0
    for seq in seqs:
        for table in (seq.block_table, *(seq.extra_tables or ())):
            gone = num_dropped(table)
            held += len(table) - gone
            dropped += gone
    return held, dropped


def decode_record_tables(requests) -> tuple[dict, dict]:
    """A pure decode step's ``block_ids`` and ``group_block_ids`` (``SchedulerOutput.to_record``'s:
    the null block where a window dropped an entry; groups 1.. only when there are some)."""
    block_ids = {}
    group_block_ids = {}
    for request in requests:
        rid = request.request_id
        block_ids[rid] = {str(seq.index): list(seq.block_table_tuple()) for seq in request.live_seqs}
        groups = {str(seq.index): [list(t) for t in seq.extra_table_tuples()]
                  for seq in request.live_seqs if seq.extra_tables}
        if groups:
            group_block_ids[rid] = groups
    return block_ids, group_block_ids
