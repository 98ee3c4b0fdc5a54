"""Sequences whose counters lag: the state the fast path leaves behind, and how it is settled.

The fast path (``pagesim.engine.policy.fast_path``) may apply a steady decode batch's steps without
writing each sequence's own counters and outputs (implicit decoders, ``bulk_decode``): a lagging
sequence has computed ``offset + Scheduler.next_step`` tokens while its fields may say fewer. The
scheduler holds such a batch (``Scheduler._lazy_run``, a ``LaggingBatch``) and settles it before
anything reads its sequences. The fast path depends on the scheduler and on this module; the
scheduler knows only this module's protocol and functions, never the fast path.

Invariant: ``settle`` makes a sequence's counters, keys and outputs exactly what the step-by-step
path leaves (``tests/test_fast_path_state.py`` compares them after every step), and settling twice
changes nothing.
"""

from __future__ import annotations

from typing import Protocol

from pagesim.engine.policy.memory.block_pool import LAZY_KEY
from pagesim.engine.policy.scheduling.request import Sequence


class LaggingBatch(Protocol):
    """A batch whose sequences lag: ``seqs[i]`` has computed ``offsets[i] + t`` tokens before the
    scheduler's step ``t`` (the fast path's ``DecodeRun`` is one)."""

    seqs: list[Sequence]
    offsets: list[int]

def settle(seqs: list[Sequence], offsets: list[int], step: int, bs: int, keys: list | None, sampled: int = 1) -> None:
    """Bring each of a batch's sequences to its state before scheduler step ``step`` (with
    ``sampled=0``: in the middle of step ``step - 1``, scheduled but not updated)."""
    for seq, offset in zip(seqs, offsets):
        settle_one(seq, offset + step, bs, keys, sampled)


def settle_one(seq: Sequence, computed: int, bs: int, keys: list | None, sampled: int = 1) -> None:
    """A decoder that has computed ``computed`` tokens, as the step-by-step path leaves it: that
    many computed and filled slots, its full blocks registered (with prefix caching: ``keys``,
    the pool's; ``None`` without), and an unnamed output for each token computed since, the last
    one only once it is ``sampled`` (between a step's ``schedule()`` and its ``update()`` it is
    not yet). Its full blocks from its lazy start on are given ``LAZY_KEY`` if they carry no key
    yet: a batch of sequences whose decodes key only lazily leaves that to here (``DecodeRun.eager``)."""
    if computed > seq.num_computed_tokens:  # (never backwards: settling twice changes nothing)
        seq.num_computed_tokens = computed
        seq.num_filled_tokens = computed
        if keys is not None and computed // bs > seq.num_registered_blocks:
            full = computed // bs
            key_lazily(keys, seq, full)
            seq.num_registered_blocks = full
    outputs = seq.output_token_ids
    missing = computed + sampled - seq.request.prompt_len - len(outputs)
    if missing > 0:
        outputs.extend([None] * missing)


def key_lazily(keys: list, seq: Sequence, full: int) -> None:
    """Give ``LAZY_KEY`` to ``seq``'s full blocks past its registered ones and its lazy start,
    up to block ``full``, that carry no key yet (those its decodes filled in a batch that left
    their registration to ``settle_one``; a pool with no block stats, so the order is free).
    Nothing for a sequence whose lazy start is not known (``lazy_from`` -1: never keyed lazily)."""
    start = seq.lazy_from
    if not 0 <= start < full:
        return
    first = seq.num_registered_blocks if seq.num_registered_blocks > start else start
    for block_id in seq.block_table[first:full]:
        if keys[block_id] is None:
            keys[block_id] = LAZY_KEY
