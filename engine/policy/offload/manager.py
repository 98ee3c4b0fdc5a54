"""The scheduler's side of KV offloading: what to store in the offload store, what a request can
load from it, and the copies each step names (vLLM 0.33's native ``OffloadingConnector``,
scheduler side, with one offload block per GPU block, its default).

What happens, step by step (``Scheduler`` calls these):

1. ``begin_step``: the last step's copies are done (``OffloadStore.complete``).
2. **Lookup** at admission (``lookup``): a waiting request (nothing computed) whose GPU prefix
   hit ends at block ``g`` continues the hit with the blocks ``g, g+1, ...`` that the store holds
   ready, up to the first it does not, never covering the last known token (as the GPU hit).
3. **Load** (``load``): each such block gets a fresh GPU block, registered in the GPU prefix cache
   at once; the ``(slot, GPU block)`` copies go in the step's ``blocks_to_load``, which the
   executor carries out *before* the forward pass, so the request's prefill runs in the same
   step. (vLLM loads asynchronously: the request waits, holding its blocks, for a step or more
   while the others compute. pagesim's executors make the step wait for its loads instead; the
   simulator's host link decides how long.)
4. **Offer** (``offer``): as a sequence's tokens are scheduled, its newly full blocks (prompt
   blocks only, vLLM's default ``offload_prompt_only``; every block with ``prompt_only=False``)
   are offered for storing. Blocks that were GPU prefix hits are offered too (they may not be
   stored yet), but not blocks just loaded.
5. ``end_step``: every offer of the step, in scheduling order, becomes a ``prepare_store`` (keys
   already stored are skipped; a request's offer is stored whole or not at all); the
   ``(GPU block, slot)`` copies go in ``blocks_to_store``, which the executor carries out *after*
   the forward pass (the blocks are written by it). vLLM offers the same blocks a refused offer
   held again at the next step; pagesim drops them (counted in ``num_refused_blocks``).
6. ``request_finished``: the policy learns which keys a finished request stored or used.

A recompute preemption starts a sequence's offers again from its first block (stored ones are
skipped). Swap space stays a separate pool, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from engine.policy.block_key import BlockKey
from engine.policy.offload.store import OffloadStore
from engine.policy.request import Request, Sequence


@dataclass(slots=True)
class _Seen:
    """The keys one request stored or used, for the policy's ``request_finished``."""

    keys: dict = field(default_factory=dict)  # key -> position, in the order first seen
    inserted: set = field(default_factory=set)  # stored by this request
    reused: set = field(default_factory=set)  # used without being stored by this request
    missed: set = field(default_factory=set)  # offered while not stored (the policy hears once)


class OffloadManager:
    def __init__(self, store: OffloadStore, kv, *, prompt_only: bool = True):
        self.store = store
        self.kv = kv  # KVCacheManager: block keys, the GPU pool
        self.block_size = kv.block_size
        self.prompt_only = prompt_only
        self._offers: list[tuple[str, list[BlockKey], list[int], list[int]]] = []  # this step's
        self._seen: dict[str, _Seen] = {}
        self.num_stored_blocks = 0
        self.num_loaded_blocks = 0  # at admissions (first ones and resumptions)

    # ----------------------------------------------------------- the step
    def begin_step(self) -> None:
        self.store.complete()

    def end_step(self) -> list[tuple[int, int]]:
        """The step's stores: ``(GPU block, slot)`` copies, in scheduling order."""
        offers, self._offers = self._offers, []
        store, keys_of = self.store, self.kv.pool.keys
        copies: list[tuple[int, int]] = []
        for request_id, keys, blocks, positions in offers:
            # NOTE: a block this step offered and then released and reused would hold other
            # content by the time the executor copies it; none of the step orders does that, and
            # a block whose key changed is left out rather than stored wrong.
            kept = [i for i, (key, block) in enumerate(zip(keys, blocks)) if keys_of[block] is key]
            if len(kept) != len(keys):
                keys, blocks, positions = ([x[i] for i in kept] for x in (keys, blocks, positions))
            seen = self._seen_by(request_id)
            slots = store.prepare_store(keys, request_id, positions, seen.missed) or {}
            state, inserted, seen_keys = store.state, seen.inserted, seen.keys
            for key, block, position in zip(keys, blocks, positions):
                slot = slots.get(key)
                if slot is not None:
                    copies.append((block, slot))
                    inserted.add(key)
                elif state.get(key, -1) >= 0:  # ready: used, even when the offer was refused
                    if key not in inserted:
                        seen.reused.add(key)
                else:  # being stored by another request, or refused: not this one's
                    continue
                if key not in seen_keys:
                    seen_keys[key] = position
        self.num_stored_blocks += len(copies)
        return copies

    def output_fields(self, loads: list[tuple[int, int]], hits: dict[str, int], stores: list[tuple[int, int]]) -> dict:
        """The step's ``SchedulerOutput`` fields of offloading."""
        return dict(num_free_offload_blocks=self.store.num_free_blocks, blocks_to_load=tuple(loads),
                    blocks_to_store=tuple(stores), offload_hits=MappingProxyType(hits))

    # ------------------------------------------------------------ lookups
    def lookup(self, seq: Sequence, first_block: int) -> list[BlockKey]:
        """Keys of the blocks after a GPU hit of ``first_block`` blocks that the store holds
        ready: consecutive, never covering the last known token."""
        store = self.store
        kv = self.kv
        keys: list[BlockKey] = []
        for j in range(first_block, (seq.num_tokens - 1) // self.block_size):
            key = kv.block_key(seq, j)
            if not store.is_ready(key):
                break
            stored = store.key_of[store.slot_of[key]]
            if stored is not key:  # (equal: compare later keys in one link, see adopt_key)
                kv.adopt_key(seq, j, stored)
            keys.append(stored)
        return keys

    def load(self, seq: Sequence, keys: list[BlockKey], gpu_blocks: list[int], first_block: int) -> list[tuple[int, int]]:
        """Pin ``keys`` for loading into ``gpu_blocks`` (the table's blocks from ``first_block``);
        returns the ``(slot, GPU block)`` copies."""
        request_id = seq.request.request_id
        positions = list(range(first_block, first_block + len(keys)))
        slots = self.store.prepare_load(keys, request_id, positions)
        seen = self._seen_by(request_id)
        for key, position in zip(keys, positions):
            seen.keys.setdefault(key, position)
            if key not in seen.inserted:
                seen.reused.add(key)
        seq.num_offered_blocks = first_block + len(keys)
        self.num_loaded_blocks += len(keys)
        return list(zip(slots, gpu_blocks))

    # ------------------------------------------------------------- offers
    def offer(self, seq: Sequence, num_tokens: int) -> None:
        """Offer ``seq``'s blocks that ``num_tokens`` computed tokens fill and were not offered."""
        request = seq.request
        limit = min(num_tokens, request.prompt_len if self.prompt_only else seq.num_tokens) // self.block_size
        first = seq.num_offered_blocks
        if limit <= first:
            return
        seq.num_offered_blocks = limit
        blocks = seq.block_table[first:limit]
        keys_of = self.kv.pool.keys  # (the blocks are registered: the scheduler offers after register)
        self._offers.append((request.request_id, [keys_of[b] for b in blocks], blocks, list(range(first, limit))))

    def restart(self, seq: Sequence) -> None:
        """``seq`` was preempted by recompute: offer its blocks again as they are recomputed."""
        seq.num_offered_blocks = 0

    def request_finished(self, request: Request) -> None:
        seen = self._seen.pop(request.request_id, None)
        if seen is not None:
            keys = sorted(seen.keys, key=seen.keys.__getitem__)  # prefix order
            self.store.policy.request_finished(request.request_id, keys, seen.reused)

    def _seen_by(self, request_id: str) -> _Seen:
        seen = self._seen.get(request_id)
        if seen is None:
            seen = self._seen[request_id] = _Seen()
        return seen
