"""KV-cache manager: block tables of sequences on top of the GPU pool, the CPU swap pool and the
prefix cache. It knows nothing about queues; the scheduler asks it ``blocks_to_reserve`` /
``can_swap_in`` and then acts (nano-vllm's split).

What it does for one sequence:
- **reserve** slots ``[start, end)`` before they are computed: new blocks at the end of the table,
  then copy-on-write for every existing block the write touches that another table also holds
  (the pool's ``(src, dst)`` pairs are returned: the executor copies ``src`` into ``dst``);
- **prefix hit** at admission: the longest run of leading full blocks whose keys are cached, capped
  so the last known token is always recomputed (vLLM v1: a prompt of exactly ``k`` cached blocks
  hits ``k - 1``); hit blocks are touched (taken out of the eviction order);
- **register** full blocks in the prefix cache as their tokens are scheduled (vLLM v1 registers at
  schedule time, so a request admitted later in the same step can hit them). A block whose content
  is unique to its sequence (``lazy_from``: a prompt with no token ids and no prefix identity, or
  unnamed generated tokens, for a request with one sample) gets the pool's ``LAZY_KEY`` instead of
  its chained key: only its own sequence could ever look it up, after a recompute preemption, so
  its key is made (``materialize``) when its table is released with the request unfinished.
  Eviction order, counts and every lookup are as with eager keys; one key per full block was the
  simulator's largest cost (issue 23). Only with a built-in eviction policy that never reads keys.
- **count** the blocks a request preempted by recompute had cached when it was released and did
  not find again when it came back (``num_resume_blocks_lost``: hits lost to evictions; a
  statistic, O(1) per preemption, no decision reads it);
- **fork** a child that shares every block (reference count + 1);
- **free** a table (last block first; see ``BlockPool``);
- **swap out / in** a request's sequences to and from CPU blocks, with the mappings the executor
  must copy. By default a block shared by several sequences moves once and stays shared
  (``preserve_sharing``); vLLM v0 moved it once per sequence, which its preset reproduces.

Invariants (checked by ``check``): every table's blocks are in use; a block's reference count is
the number of (GPU) tables holding it; a table holds ``ceil(filled / block_size)`` blocks, so at
most ``block_size - 1`` slots per sequence are idle; only full blocks carry keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar, Protocol, cast

from mypy_extensions import mypyc_attr

from pagesim.engine.policy.memory.block_key import BlockKey, HashFn, default_hash
from pagesim.engine.policy.memory.block_pool import LAZY_KEY, BlockPool
from pagesim.engine.policy.scheduling.request import Request, Sequence
from pagesim.engine.policy.memory.swap_pool import SwapPool


#: ``lazy_from`` of a sequence none of whose blocks is unique to it.
NEVER = 1 << 62


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PrefixHit(Protocol):
    """A prefix hit as ``find_cached_prefix`` finds it and ``touch_prefix`` takes it: the hit
    blocks' ids (``list[int]``) here, a ``HybridHit`` (every layer group's) in a hybrid manager.
    Callers take only its length in blocks."""

    def __len__(self) -> int: ...


# (Compiled builds: HybridKVCacheManager, interpreted, subclasses it; see pagesim/engine/compiled.py.)
@mypyc_attr(allow_interpreted_subclasses=True)
class KVCacheManager:
    #: One table per sequence (``HybridKVCacheManager`` keeps one per layer group).
    hybrid: ClassVar[bool] = False  # (a class's: compiled, an instance attribute would hide a subclass's)
    num_groups = 1

    def __init__(
        self,
        block_pool: BlockPool,
        swap_pool: SwapPool,
        *,
        block_size: int,
        enable_prefix_caching: bool,
        hash_fn: HashFn = default_hash,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.pool = block_pool
        self.swap = swap_pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        # Lazy keys need a policy that never reads a cached block's key (a built-in one: a
        # plug-in may look); a hybrid cache gives them in its full-attention groups only.
        self.lazy_keys = (enable_prefix_caching
                          and type(block_pool.eviction).__module__ == "pagesim.engine.policy.memory.eviction"
                          and not block_pool.eviction.uses_key_tree)
        # the pool's keys, where full blocks are registered (None: no prefix caching): what
        # settling a batch of implicit decoders brings up to date (scheduling.lag.settle_one)
        self.registered_keys = block_pool.keys if enable_prefix_caching else None
        # Blocks recomputed requests had cached at their preemption and missed at their return
        # (count_resume_loss); each preempted sequence's cached blocks until it is back.
        self.num_resume_blocks_lost = 0
        self._cached_at_preemption: dict[Sequence, int] = {}

    # ------------------------------------------------------------ counting
    def blocks_to_reserve(self, seq: Sequence, start: int, end: int) -> int:
        """Blocks that ``reserve(seq, start, end)`` would take: new ones plus copy-on-write copies."""
        return self.reserve_need(seq.block_table, self.pool.ref_counts, start, end)

    def reserve_need(
        self,
        table: list[int],
        ref_counts: list[int] | None,
        start: int,
        end: int,
        pending: dict[int, int] | None = None,
    ) -> int:
        """Blocks a write of slots ``[start, end)`` into ``table`` takes. ``ref_counts`` says
        which blocks are shared (``None``: none is). ``pending`` carries, across several tables
        reserved in turn, how many holders of a shared block have not copied it yet: of k holders
        writing into it, k - 1 copy and the last writes in place."""
        bs = self.block_size
        num_end_blocks = -(-end // bs)  # cdiv, inlined: a hot path
        num_blocks = len(table)
        num_new = num_end_blocks - num_blocks if num_end_blocks > num_blocks else 0
        if end <= start or ref_counts is None:
            return num_new
        num_cow = 0
        for i in range(start // bs, num_end_blocks if num_end_blocks < num_blocks else num_blocks):
            block_id = table[i]
            holders = ref_counts[block_id] if pending is None else pending.get(block_id, ref_counts[block_id])
            if holders > 1:
                num_cow += 1
                if pending is not None:
                    pending[block_id] = holders - 1
        return num_new + num_cow

    # ----------------------------------------------------------- reserving
    def reserve(self, seq: Sequence, start: int, end: int) -> list[tuple[int, int]]:
        """Make slots ``[start, end)`` writable by ``seq``; returns copy-on-write ``(src, dst)`` pairs."""
        table = seq.block_table
        old_len = len(table)
        copies = grow_table(self.pool, table, self.block_size, start, end)
        if copies or len(table) != old_len:
            seq.table_snapshot = None
        if end > seq.num_filled_tokens:
            seq.num_filled_tokens = end
        return copies

    def remove_skipped_blocks(self, seq: Sequence) -> int:
        """Release blocks that left every attention window (only sliding-window groups have any:
        ``HybridKVCacheManager``); called before a running sequence's step is counted. Returns
        the table entries dropped."""
        return 0

    def admission_blocks(self, seqs: list[Sequence], hits: list, plan: list[tuple[Sequence, int]],
                         prompt_len: int) -> tuple[int, int, int]:
        """(new blocks, hit blocks an admission takes off the free count, distinct hit blocks) of
        admitting ``seqs`` with ``hits``: every sequence's whole known length (vLLM v1), less its
        hits and, for parked sequences, less the prompt blocks they will share with the leader."""
        bs = self.block_size
        if len(seqs) == 1 and not hits[0] and not seqs[0].parked:  # (the commonest: one sequence, no hit)
            return cdiv(seqs[0].num_tokens, bs), 0, 0
        shared = prompt_len // bs
        new_blocks = sum(cdiv(seq.num_tokens, bs) - (shared if seq.parked else len(h)) for seq, h in zip(seqs, hits))
        hit_blocks = {b for h in hits for b in h}
        return new_blocks, self.num_evictable(hit_blocks), len(hit_blocks)

    def plan_need(self, plan: list[tuple[Sequence, int]]) -> int:
        """Blocks reserving ``plan`` takes in every layer group: hybrid managers only (one group
        counts through ``Planner.blocks_needed``)."""
        raise NotImplementedError("plan_need counts layer groups: HybridKVCacheManager's")

    # -------------------------------------------------------- prefix cache
    def block_key(self, seq: Sequence, index: int) -> BlockKey:
        """Key of ``seq``'s full block ``index``, computing (and remembering) the chain up to it."""
        keys = seq.block_keys
        num_keys = len(keys)
        if index < num_keys:
            return keys[index]
        bs = self.block_size
        parent: BlockKey | None = keys[-1] if num_keys else None
        hash_fn = self.hash_fn
        append = keys.append
        for content in seq.request.block_contents(seq, num_keys * bs, (index + 1) * bs, bs):
            parent = BlockKey(parent, content, hash_fn)
            append(parent)
        assert parent is not None  # (index >= num_keys: at least one link was made)
        return parent

    def find_cached_prefix(self, seq: Sequence) -> PrefixHit:
        """Block ids of the longest cached prefix of ``seq`` (empty with caching off), never
        covering the last known token. Does not take references (``touch_prefix`` does)."""
        pool = self.pool
        if not self.enable_prefix_caching or not len(pool.cache):  # (an empty index: lazy keys are never in it)
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        lookup, stored = pool.cache.lookup, pool.keys  # (pool.lookup)
        keys = seq.block_keys
        bs = self.block_size
        content, hash_fn = seq.request.block_content, self.hash_fn
        for j in range(max_blocks):
            if j < len(keys):
                key = keys[j]
            else:  # block_key(seq, j): one more link (one call per block walked is a hot path)
                key = BlockKey(keys[-1] if j else None, content(seq, j * bs, j * bs + bs), hash_fn)
                keys.append(key)
            block_id = lookup(key)
            if block_id is None:
                break
            hits.append(block_id)
            canonical = stored[block_id]
            assert isinstance(canonical, BlockKey)  # (a cached block carries its key: one group, a BlockKey)
            if canonical is not key:
                self.adopt_key(seq, j, canonical)
        return hits

    def count_resume_loss(self, seq: Sequence, num_hit_blocks: int) -> int:
        """At the return of ``seq``, preempted by recompute, whose prefix hit (from either tier)
        is ``num_hit_blocks`` long: count the blocks it had cached when it was released, up to
        the lookup's cap, that it did not find (evicted since, or cut off behind an evicted one:
        hits a cache that never evicts would have served) in ``num_resume_blocks_lost``; returns
        how many."""
        cached = self._cached_at_preemption.pop(seq, 0) if self._cached_at_preemption else 0
        lost = min(cached, (seq.num_tokens - 1) // self.block_size) - num_hit_blocks
        if lost <= 0:
            return 0
        self.num_resume_blocks_lost += lost
        return lost

    def adopt_key(self, seq: Sequence, index: int, canonical: BlockKey) -> None:
        """Use ``canonical``, a stored key equal to ``seq``'s key of block ``index``, in its place."""
        # NOTE: chain our later keys onto the stored one, so verifying the next hit compares one
        # link (``is``), not the whole chain again.
        keys = seq.block_keys
        keys[index] = canonical
        if index + 1 < len(keys):
            keys[index + 1] = BlockKey(canonical, keys[index + 1].content, self.hash_fn)

    def load_prefix(self, seq: Sequence, keys: list[BlockKey], *, register: bool = True) -> list[int]:
        """Extend ``seq``'s prefix hit with fresh blocks for these keys (their content comes from
        the offload store: the executor copies it in), registered in the prefix cache at once, or,
        with ``register`` False (an asynchronous load), when the load is done (``register``);
        returns the blocks."""
        pool = self.pool
        blocks = pool.allocate_many(len(keys))
        if register:
            for block_id, key in zip(blocks, keys):
                pool.cache_block(block_id, key)
        seq.block_table.extend(blocks)
        seq.table_snapshot = None
        num_tokens = len(seq.block_table) * self.block_size
        seq.num_computed_tokens = seq.num_filled_tokens = num_tokens
        if register:
            seq.num_registered_blocks = len(seq.block_table)
        return blocks

    def num_evictable(self, block_ids: Iterable[int]) -> int:
        """How many of these cached blocks nobody holds (touching them removes them from the free count)."""
        ref_counts = self.pool.ref_counts
        return sum(1 for b in block_ids if ref_counts[b] == 0)

    def touch_prefix(self, seq: Sequence, hit: PrefixHit) -> None:
        """Start ``seq``'s (empty) table with the hit blocks (``find_cached_prefix``'s)."""
        assert not seq.block_table, "a prefix hit starts an empty table"
        hit_block_ids = cast("list[int]", hit)  # (this manager's hits are lists of block ids)
        pool = self.pool
        for block_id in hit_block_ids:
            pool.touch(block_id)
        seq.block_table.extend(hit_block_ids)
        seq.table_snapshot = None
        num_tokens = len(hit_block_ids) * self.block_size
        seq.num_computed_tokens = num_tokens
        seq.num_filled_tokens = num_tokens
        seq.num_registered_blocks = len(hit_block_ids)

    def register(self, seq: Sequence, num_tokens: int) -> None:
        """Give every full block within ``seq``'s first ``num_tokens`` tokens its key (once)."""
        if not self.enable_prefix_caching:
            return
        known = seq.request.prompt_len + len(seq.output_token_ids)  # seq.num_tokens, inlined
        num_full = (num_tokens if num_tokens < known else known) // self.block_size
        first = seq.num_registered_blocks
        if num_full <= first:  # the common case: no block filled up
            return
        pool = self.pool
        keys = pool.keys
        table = seq.block_table
        lazy = self._lazy_start(seq)
        eager_end = num_full if num_full < lazy else lazy
        chain = seq.block_keys
        if first < eager_end:
            made = len(chain)
            if eager_end > made and any(keys[b] is None for b in table[max(first, made):eager_end]):
                self.block_key(seq, eager_end - 1)  # (the keys through the range's end, in one go)
            pool.cache_unkeyed(table[first:eager_end], chain[first:eager_end])
        if num_full > lazy:
            pool.cache_lazy_unkeyed(table[max(first, lazy):num_full])
        seq.num_registered_blocks = num_full

    def register_block(self, seq: Sequence, index: int) -> None:
        """Give ``seq``'s full block ``index`` its key, if it has none (one block of ``register``)."""
        block_id = seq.block_table[index]
        pool = self.pool
        if pool.keys[block_id] is None:
            if index >= self._lazy_start(seq):
                pool.cache_lazy((block_id,))
            else:
                pool.cache_block(block_id, self.block_key(seq, index))

    def _lazy_start(self, seq: Sequence) -> int:
        """Where ``seq``'s lazy keys start in this cache (``NEVER`` with lazy keys off)."""
        if not self.lazy_keys:
            return NEVER
        return seq.lazy_from if seq.lazy_from >= 0 else self.lazy_from(seq)

    def lazy_from(self, seq: Sequence) -> int:
        """The first block index from which ``seq``'s content is unique to it (``NEVER``: none).

        A block's key chains every block before it, so once a block holds a segment no other
        request can have, every later block is unique too: a prompt token with no identity
        (``Request.block_content``'s ``("prompt", request_id, ...)``), or an unnamed generated
        token (``("out", request_id, index, ...)``). A request with several samples shares its
        prompt blocks between them, so it never has lazy keys. A prompt of token ids
        (another request may send the same tokens) is unique only from its first output on, when the
        simulator leaves outputs unnamed. Remembered in ``seq.lazy_from`` once known."""
        request = seq.request
        prompt_len = request.prompt_len
        if request.n > 1 or request.beam_width > 1:
            seq.lazy_from = NEVER
            return NEVER
        ids, size = request.prefix_block_ids, request.prefix_block_tokens
        if request.prompt_token_ids is not None:
            named = prompt_len
        else:
            named = 0 if ids is None or not size else min(prompt_len, len(ids) * size)
        if named < prompt_len:
            seq.lazy_from = named // self.block_size
        elif seq.output_token_ids:  # the block holding the first output is unique if it is unnamed
            seq.lazy_from = prompt_len // self.block_size if seq.output_token_ids[0] is None else NEVER
        else:
            return NEVER  # only prompt blocks can be full yet: decide at the first output
        return seq.lazy_from

    # ------------------------------------------------------ fork and free
    def fork(self, parent: Sequence, child: Sequence) -> None:
        # (only a request of several samples or beams forks, and such a request never has lazy
        # keys: ``free`` counts on a sequence with a lazy start holding its unique blocks alone)
        assert not 0 <= parent.lazy_from < NEVER, f"sequence {parent.seq_id} has lazy keys: it cannot be forked"
        pool = self.pool
        for block_id in parent.block_table:
            pool.incref(block_id)
        child.block_table = list(parent.block_table)
        child.table_snapshot = None
        child.num_filled_tokens = parent.num_filled_tokens
        child.num_offered_blocks = parent.num_offered_blocks  # (the offload store has been offered them)

    def share_prefix(self, leader: Sequence, seq: Sequence, num_blocks: int) -> None:
        """Start ``seq``'s empty table with ``leader``'s first ``num_blocks`` (computed) blocks."""
        assert not seq.block_table and leader.num_computed_tokens >= num_blocks * self.block_size
        pool = self.pool
        shared = leader.block_table[:num_blocks]
        for block_id in shared:
            pool.incref(block_id)
        seq.block_table = shared
        seq.table_snapshot = None
        seq.num_computed_tokens = seq.num_filled_tokens = num_blocks * self.block_size
        seq.num_registered_blocks = min(leader.num_registered_blocks, num_blocks)

    def free(self, seq: Sequence, *, final: bool = False) -> None:
        """Release ``seq``'s GPU table (its cached blocks stay findable until evicted). Unless the
        sequence is leaving for good (``final``: finished, aborted, rejected), its lazily keyed
        blocks get their real keys first: it may look them up when it is recomputed."""
        if final:
            if self._cached_at_preemption:  # (a preempted request that leaves without coming back)
                self._cached_at_preemption.pop(seq, None)
        elif seq.num_registered_blocks:
            self._cached_at_preemption[seq] = seq.num_registered_blocks
        if seq.block_table:
            if not final and 0 <= seq.lazy_from < seq.num_registered_blocks:
                self._materialize(seq)
            # Its blocks from its lazy start on hold content no other request has (``lazy_from``,
            # known only for a request of one sample: none is forked), and its first registered
            # blocks carry keys, the rest none (its registrations are up to date: it is settled).
            table = seq.block_table
            unique_from = seq.lazy_from if seq.lazy_from >= 0 else len(table)
            self.pool.free_table(table, (unique_from, seq.num_registered_blocks if self.registered_keys is not None
                                         else 0))
        seq.block_table = []
        seq.table_snapshot = None
        seq.num_filled_tokens = 0
        seq.num_registered_blocks = 0

    def _materialize(self, seq: Sequence) -> None:
        pool = self.pool
        keys = pool.keys
        table = seq.block_table
        for i in range(seq.lazy_from, seq.num_registered_blocks):
            if keys[table[i]] is LAZY_KEY:
                pool.materialize(table[i], self.block_key(seq, i))

    def free_cpu(self, seq: Sequence) -> None:
        for block_id in seq.cpu_block_table:
            self.swap.free(block_id)
        seq.cpu_block_table = []

    # ------------------------------------------------------------ swapping
    def blocks_to_swap_out(self, seqs: Iterable[Sequence], *, preserve_sharing: bool) -> int:
        """CPU blocks a swap-out of these sequences takes."""
        return _count_blocks([s.block_table for s in seqs], preserve_sharing)

    def blocks_to_swap_in(self, seqs: Iterable[Sequence], *, preserve_sharing: bool) -> int:
        """GPU blocks a swap-in of these sequences takes (before any new tokens)."""
        return _count_blocks([s.cpu_block_table for s in seqs], preserve_sharing)

    def swap_out(self, seqs: list[Sequence], *, preserve_sharing: bool) -> list[tuple[int, int]]:
        """Move these sequences' tables to CPU blocks; returns ``(gpu, cpu)`` copies, in order."""
        mapping: list[tuple[int, int]] = []
        moved: dict[int, int] = {}
        for seq in seqs:
            cpu_table = _move_table(seq.block_table, moved, preserve_sharing, self.swap.allocate, self.swap.incref, mapping)
            filled = seq.num_filled_tokens
            self.free(seq)
            if self._cached_at_preemption:  # (swapped, not recomputed: it comes back with its blocks)
                self._cached_at_preemption.pop(seq, None)
            seq.num_filled_tokens = filled
            seq.cpu_block_table = cpu_table
        return mapping

    def swap_in(self, seqs: list[Sequence], *, preserve_sharing: bool) -> list[tuple[int, int]]:
        """Bring these sequences' tables back to fresh GPU blocks; returns ``(cpu, gpu)`` copies."""
        mapping: list[tuple[int, int]] = []
        moved: dict[int, int] = {}
        for seq in seqs:
            gpu_table = _move_table(seq.cpu_block_table, moved, preserve_sharing, self.pool.allocate, self.pool.incref, mapping)
            self.free_cpu(seq)
            seq.block_table = gpu_table
            seq.table_snapshot = None
            # The blocks came back under new ids: give their full blocks their keys again.
            seq.num_registered_blocks = 0
            self.register(seq, seq.num_computed_tokens)
        return mapping

    # ----------------------------------------------------------- checking
    def check(self, requests: Iterable[Request], held: Iterable[Sequence] = ()) -> None:
        """Assert the manager's invariants against every live request and the sequences ``held``
        outside them (a P/D connector's; O(blocks); for tests)."""
        self.pool.check()
        self.swap.check()
        bs = self.block_size
        gpu_refs = [0] * self.pool.num_blocks
        cpu_refs = [0] * self.swap.num_blocks
        seqs = [seq for request in requests for seq in request.seqs]
        seqs.extend(held)
        for seq in seqs:
            for b in seq.block_table:
                gpu_refs[b] += 1
            for b in seq.cpu_block_table:
                cpu_refs[b] += 1
            if seq.block_table:
                assert len(seq.block_table) == cdiv(seq.num_filled_tokens, bs), (
                    f"{seq.seq_id}: {len(seq.block_table)} blocks for {seq.num_filled_tokens} slots"
                )
                idle = len(seq.block_table) * bs - seq.num_filled_tokens
                assert 0 <= idle <= bs - 1
            if seq.table_snapshot is not None:
                assert seq.table_snapshot == tuple(seq.block_table), f"{seq.seq_id}: stale table snapshot"
            for i, b in enumerate(seq.block_table):
                key = self.pool.keys[b]
                if key is not None:
                    assert (i + 1) * bs <= seq.num_filled_tokens, f"partial block {b} is keyed"
        for b in range(self.pool.first_block_id, self.pool.num_blocks):
            assert gpu_refs[b] == self.pool.ref_counts[b], (
                f"block {b}: ref {self.pool.ref_counts[b]} but held by {gpu_refs[b]} tables"
            )
        assert cpu_refs == self.swap.ref_counts, "CPU ref counts differ from the tables holding them"


def grow_table(pool: BlockPool, table: list[int], block_size: int, start: int, end: int) -> list[tuple[int, int]]:
    """Make slots ``[start, end)`` of ``table`` writable: new blocks at its end, then a private copy
    of every existing block the write touches that another table also holds; returns the
    copy-on-write ``(src, dst)`` pairs."""
    bs = block_size
    old_len = len(table)
    num_end_blocks = -(-end // bs)  # cdiv, inlined: a hot path
    if num_end_blocks > old_len:
        table += pool.allocate_many(num_end_blocks - old_len)
    copies: list[tuple[int, int]] = []
    if end > start:
        ref_counts = pool.ref_counts
        for i in range(start // bs, num_end_blocks if num_end_blocks < old_len else old_len):
            src = table[i]
            if ref_counts[src] > 1:
                # NOTE: a shared block that is being written is never full (full blocks hold
                # only computed tokens), so it carries no key and the copy needs none.
                dst = pool.allocate()
                pool.free(src)
                table[i] = dst
                copies.append((src, dst))
    return copies


def _count_blocks(tables: list[list[int]], distinct: bool) -> int:
    if distinct:
        return len({b for table in tables for b in table})
    return sum(len(table) for table in tables)


def _move_table(
    table: list[int],
    moved: dict[int, int],
    preserve_sharing: bool,
    allocate: Callable[[], int],
    incref: Callable[[int], None],
    mapping: list[tuple[int, int]],
) -> list[int]:
    """The table's blocks mapped to blocks of the other pool, in order. ``moved`` remembers, across
    the tables of one swap, where a block already went: with ``preserve_sharing`` a block that
    several tables hold moves once and stays shared; without, it moves once per table (vLLM v0)."""
    new_table = []
    for src in table:
        dst = moved.get(src) if preserve_sharing else None
        if dst is None:
            dst = allocate()
            moved[src] = dst
            mapping.append((src, dst))
        else:
            incref(dst)
        new_table.append(dst)
    return new_table
