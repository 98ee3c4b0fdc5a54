"""Implicit decoders: a steady decode batch's steps applied in bulk, touching only the sequences
whose block boundary falls in them.

For a pool whose eviction order batches and reads no block stats (``lru``), decisions not
recorded and one KV group (``pagesim.engine.policy.fast_path.fast_forward`` decides when: ``bulk_ok``).

The idea. In a steady decode batch every sequence computes one token per step, so its computed
tokens before scheduler step ``t`` are ``offset + t``, with an offset that stays the same while
the batch is carried from step to step (``DecodeRun.offsets``). A sequence allocates a block in
step ``t`` exactly when ``(offset + t) % block_size == 0`` and fills one when
``(offset + t + 1) % block_size == 0``: it depends on ``t`` only through ``t % block_size``. So the
batch keeps its sequences in ``block_size`` **buckets** by ``(-offset) % block_size``, each in
scheduling order (a sequence joins at the back of the running order, and leaving keeps the order
of the rest): in step ``t`` bucket ``t % block_size`` allocates and bucket ``(t + 1) % block_size``
fills a block. A skip of ``k`` steps, or the one step that admits beside the decodes
(``apply_lazily``), makes its pool calls from a bucket per step, O(steps + blocks), and writes no
sequence's counters or tokens. A skip longer than ``LAZY_BLOCKS`` blocks' steps, in which every
sequence crosses several boundaries anyway, goes through ``apply_in_bulk``, one pass over the
sequences that settles them too.

The pool calls are those of the step-by-step path, allocations in step order then scheduling
order, registrations in the same order; as in ``apply_in_bulk`` all of a stretch's allocations come
before its registrations, which commute for such a pool (which block an allocation takes depends
only on the free list and the eviction order, and a registration touches neither).

**Sequences lag.** Their own counters (``num_computed_tokens``, ``num_filled_tokens``,
``num_registered_blocks``) and unnamed outputs are left where they were, and brought up to date
(``settle``) only when something reads them. So are their lazy keys, in a batch whose sequences
all key lazily (``keys_lazily``: every block their decodes fill is unique to them, as generated
blocks are; ``DecodeRun.eager`` counts the others): no such block can be looked up, and with no
block stats the order of registration does not matter, so the steps make none, and settling
gives each full block past the sequence's lazy start that has no key its ``LAZY_KEY``
(``key_lazily``). Everything is settled: the scheduler settles its lazy batch
(``Scheduler._lazy_run``) before ``schedule()``, ``update()``, ``kv_usage()``,
``abort_request()`` and ``check()`` (``Scheduler.settle``); ``fast_forward`` settles a sequence
before it finishes and before a block key is made from its tokens, and the whole batch before
it builds a batch afresh or when the batch is not carried on. Block tables, the pool's free list,
eviction order and counts, and every count the step metrics read are never behind; only the
keys of blocks in use may be, and only lazy ones.

Invariant: a lazy batch's sequence has computed ``offset + Scheduler.next_step`` tokens; its own
fields may say fewer, never more, and ``settle`` makes them exactly what the step-by-step path
leaves (``tests/test_fast_path_state.py`` compares them after every step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagesim.engine.policy.scheduling.lag import key_lazily, settle_one
from pagesim.engine.policy.scheduling.request import Sequence

if TYPE_CHECKING:
    from pagesim.engine.policy.memory.block_pool import BlockPool
    from pagesim.engine.policy.fast_path.fast_forward import DecodeRun
    from pagesim.engine.policy.memory.kv_manager import KVCacheManager

#: A bucket: ``(sequence, offset)`` pairs in scheduling order.
Bucket = list[tuple[Sequence, int]]

#: A skip of at most this many blocks' steps is applied from the buckets, a longer one in one pass
#: over the sequences. Measured in instructions per request (cachegrind, the Azure conversation
#: trace and 5,000 ShareGPT-like requests): 4 beats 1 and 16 on both.
LAZY_BLOCKS = 4


def make_buckets(seqs: list[Sequence], offsets: list[int], bs: int) -> list[Bucket]:
    """The batch's sequences by ``(-offset) % bs`` (the steps ``t`` with ``t % bs`` equal to it
    allocate a block), each bucket in scheduling order."""
    buckets: list[Bucket] = [[] for _ in range(bs)]
    join(buckets, seqs, offsets, bs)
    return buckets


def join(buckets: list[Bucket], seqs: list[Sequence], offsets: list[int], bs: int) -> None:
    """Sequences joining the batch at the back of its scheduling order."""
    for seq, offset in zip(seqs, offsets):
        buckets[-offset % bs].append((seq, offset))


def leave(buckets: list[Bucket], seq: Sequence, offset: int, bs: int) -> None:
    """A sequence leaving the batch (it finished)."""
    bucket = buckets[-offset % bs]
    for i, (member, _) in enumerate(bucket):
        if member is seq:
            del bucket[i]
            return
    raise AssertionError(f"sequence {seq.seq_id} is not in its bucket")


def bucket_sizes(run: DecodeRun, bs: int) -> list[int]:
    """How many of the run's sequences have ``(-offset) % bs == r``, for ``r = 0 .. bs - 1`` (its
    buckets' sizes, also counted for a run without buckets). Before step ``t`` such a sequence
    has ``computed % bs == (t - r) % bs``: what a span's idle slots follow from."""
    return residue_counts(run.buckets, run.offsets, bs)


def residue_counts(buckets: list[Bucket] | None, offsets: list[int], bs: int) -> list[int]:
    """``bucket_sizes`` of a batch's ``buckets`` (when it has them) or ``offsets``."""
    if buckets is not None:
        return list(map(len, buckets))
    sizes = [0] * bs
    for offset in offsets:
        sizes[-offset % bs] += 1
    return sizes






def keys_lazily(kv: KVCacheManager, seq: Sequence) -> bool:
    """Whether every block a decode of ``seq`` fills gets a lazy key: its lazy keys start at or
    before its prompt's last block (a decoder has computed its whole prompt, so every block it
    fills from now on is past its lazy start). The same answer for the sequence's whole stay in
    a batch (its lazy start, once known, is fixed)."""
    return kv.lazy_keys and 0 <= kv._lazy_start(seq) <= seq.request.prompt_len // kv.block_size




def apply_lazily(run: DecodeRun, k: int, kv: KVCacheManager, pool: BlockPool, allocations: list[int], evictions: list[int],
                 sampled: int = 1) -> None:
    """The pool calls of the run's first ``k`` steps, from the buckets (step ``t``'s bucket
    ``t % bs`` allocates; a sequence may do so in several steps when ``k > bs``): every step's
    allocations, then every step's registrations (lazily keyed ones in one ``cache_lazy``), in
    step order, each step's in scheduling order. ``allocations`` and ``evictions`` get the
    per-step counts. No sequence's counters are written: the caller marks the run lazy.
    ``sampled=0`` for the one step of a ``DecodeStep``, whose tokens are sampled only by its
    update (its admissions come after these calls)."""
    bs = kv.block_size
    first = run.step
    buckets = run.buckets
    assert buckets is not None  # (implicit decoders)
    takers: Bucket = []
    plain = pool.num_plain_free_blocks  # taken first; every later allocation evicts
    taken = 0
    for j in range(k):
        bucket = buckets[(first + j) % bs]
        if bucket:
            count = allocations[j] = len(bucket)
            takers += bucket
            taken += count
            if taken > plain:  # (of this step's, those past the plain free blocks evict)
                evictions[j] = count if taken - count >= plain else taken - plain
    if takers:
        blocks = pool.allocate_many(taken)
        for (seq, _), block in zip(takers, blocks):
            seq.block_table.append(block)
            seq.table_snapshot = None
    if kv.enable_prefix_caching and run.eager:  # (none eager: the keys are given when settled)
        _register(run, first, k, kv, pool, first + k, sampled)


def _register(run: DecodeRun, first: int, k: int, kv: KVCacheManager, pool: BlockPool, end: int,
              sampled: int = 1) -> None:
    """Register the blocks the run's sequences fill in steps ``first .. first + k - 1``, in the
    step-by-step order; a block that gets a real key is keyed from its sequence's tokens, so that
    sequence is settled first (to step ``end``, the stretch's end, ``sampled`` or not: a key
    reads only its block's tokens, by position)."""
    bs = kv.block_size
    buckets = run.buckets
    assert buckets is not None  # (implicit decoders)
    keys = pool.keys
    lazy_start = kv._lazy_start
    lazy_keys = kv.lazy_keys
    lazy: list[int] = []
    for step in range(first, first + k):
        for seq, offset in buckets[(step + 1) % bs]:
            index = (offset + step + 1) // bs - 1  # the block this step's token completes
            block_id = seq.block_table[index]
            start = seq.lazy_from  # (kv._lazy_start(seq), its common case inlined)
            if start < 0 or not lazy_keys:
                start = lazy_start(seq)
            if index >= start and keys[block_id] is None:
                lazy.append(block_id)
            else:
                settle_one(seq, offset + end, bs, keys, sampled)
                kv.register_block(seq, index)
    if lazy:
        pool.cache_lazy(lazy)


def apply_in_bulk(seqs: list[Sequence], computed: list[int], k: int, kv: KVCacheManager, pool: BlockPool,
                  allocations: list[int], evictions: list[int]) -> None:
    """``k`` decode steps of ``seqs`` (at ``computed`` before the first, their own fields perhaps
    lagging: they are settled too) for an eviction policy that batches and reads no block stats
    (``lru``), without recording: each sequence's unnamed tokens through the ``k`` steps and its
    counters (``set_computed``'s), in the one pass that finds its new and filled blocks, then the pool calls
    (``decode_events``' allocations and registrations) in bulk. The counters may be set before the
    registrations: these read a sequence's table, tokens and lazy start, never its counters. Every
    allocation in one ``allocate_many``, the blocks handed out in the order of the step-by-step
    path (by step, then scheduling position), then the registrations in that same order, the
    lazily keyed ones in one ``cache_lazy``. For such a policy the two kinds of call commute:
    which block an allocation takes depends only on the free list and the eviction order, and a
    registration touches neither (it keys a block in use, which is in neither); the index ends
    the same whichever comes first when a victim carries the key a block is given (each key's
    blocks keep their order). A sequence at computed ``c`` allocates at steps ``(-c) % bs + 1``,
    then every ``bs``; it fills a block the step before each (the first at step ``bs`` when it
    allocates at step 1)."""
    bs = kv.block_size
    n = len(seqs)
    caching = kv.enable_prefix_caching
    allocating: list[int] = []  # step * n + position: sorting orders them by step, then position
    filling: list[int] = []
    unnamed = [None] * k
    short = k <= bs  # (at most one of each per sequence)
    stop, stride = (k + 1) * n, bs * n  # (a longer one: every bs steps from the first)
    for i, (seq, c) in enumerate(zip(seqs, computed)):
        end = c + k
        outputs = seq.output_token_ids  # (set_computed's counters, and the tokens: settle_one's)
        missing = end + 1 - seq.request.prompt_len - len(outputs)
        outputs.extend(unnamed if missing == k else [None] * missing)
        seq.num_computed_tokens = end
        seq.num_filled_tokens = end
        first = (-c) % bs + 1  # the step that allocates
        fills = first - 1 if first > 1 else bs  # the step that fills a block
        if short:
            if first <= k:
                allocating.append(first * n + i)
            if caching and fills <= k:
                filling.append(fills * n + i)
        else:
            allocating.extend(range(first * n + i, stop, stride))
            if caching:
                filling.extend(range(fills * n + i, stop, stride))
        if caching and end // bs > seq.num_registered_blocks:
            key_lazily(pool.keys, seq, c // bs)  # (blocks filled before: their keys may have been left to settling)
            seq.num_registered_blocks = end // bs
    if allocating:
        allocating.sort()
        plain = pool.num_plain_free_blocks  # taken first; every later allocation evicts
        blocks = pool.allocate_many(len(allocating))
        for taken, code in enumerate(allocating):
            j, i = divmod(code, n)
            seq = seqs[i]
            seq.block_table.append(blocks[taken])
            seq.table_snapshot = None
            allocations[j - 1] += 1
            if taken >= plain:
                evictions[j - 1] += 1
    if filling:
        filling.sort()
        keys = pool.keys
        lazy = []
        for code in filling:
            j, i = divmod(code, n)
            seq = seqs[i]
            index = (computed[i] + j) // bs - 1  # the block its step-j token completes
            block_id = seq.block_table[index]
            if index >= kv._lazy_start(seq) and keys[block_id] is None:
                lazy.append(block_id)
            else:
                kv.register_block(seq, index)
        if lazy:
            pool.cache_lazy(lazy)
