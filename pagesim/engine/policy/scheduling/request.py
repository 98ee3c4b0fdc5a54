"""Requests and their sequences: what the scheduler schedules and the block tables belong to.

A ``Request`` is what a user sent: a prompt, an output length at which generation stops exactly
(EOS is ignored, as benchmark tools do), ``n`` parallel samples or a beam width, an arrival time
and a priority (lower value = more important, as in vLLM). It owns one or more ``Sequence``s
(vLLM v0's sequence group): one while the prompt is prefilled; with ``n > 1`` or beam search,
more are forked from it at the first sampling step, sharing its blocks by reference count.

A prompt is given either as token ids, or, for traces without text, as a length plus per-block
prefix identities (``prefix_block_ids``, each standing for ``prefix_block_tokens`` tokens; e.g.
Mooncake's hash ids of 512-token blocks). Prefix caching compares block *contents*; the content of
tokens ``[a, b)`` is the token ids themselves, or, in identity mode, the identity segments they
cover, so two prompts share a cached block exactly when they share those tokens, at any block
size. Generated tokens the executor did not name (a simulator reports counts, not ids) get
contents unique to their sequence, so only the sequence itself can hit them (after preemption);
a run of them is one segment ``("out", request, sequence index, start, end)``, never equal to a
token id or to another sequence's run.

Invariants: ``len(tokens) == prompt_len + len(output_token_ids)``;
``num_computed_tokens <= len(tokens)``; a sequence stops at exactly ``max_tokens`` outputs, or
at its own sample's length when parallel samples are given different ones (``sample_max_tokens``,
how a simulator lets samples end at lengths drawn from the workload).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence as SequenceT
from dataclasses import dataclass, field
from typing import cast

from pagesim.engine.policy.memory.block_key import BlockKey


#: vLLM v1's null block: what an executor reads where a sliding window dropped a block (never read).
NULL_BLOCK_ID = 0


def executor_table(table: SequenceT[int | None]) -> tuple[int, ...]:
    """``table`` as the executor sees it: the null block where a window dropped an entry (they
    lead the table: copied in C, not element by element)."""
    dropped = num_dropped(table)
    kept = cast("SequenceT[int]", table[dropped:])  # (the dropped entries, all None, lead the table)
    return (NULL_BLOCK_ID,) * dropped + tuple(kept) if dropped else tuple(kept)


def num_dropped(table: SequenceT[int | None]) -> int:
    """Entries a sliding window dropped from a table: they lead it, so a binary search finds them."""
    lo, hi = 0, len(table)
    while lo < hi:
        mid = (lo + hi) // 2
        if table[mid] is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def seq_id_of(request_id: str, index: int) -> str:
    """A sequence's id: how executors name it (e.g. in ``{seq_id: sampled token}``)."""
    return f"{request_id}#{index}"


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never run, or preempted by recompute
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap: its blocks are in CPU memory
    # parked while its KV loads from the offload store (vLLM's WAITING_FOR_REMOTE_KVS): holds its
    # blocks, not running, not scheduled (pagesim/engine/policy/offload/manager.py)
    LOADING = "loading"
    FINISHED = "finished"
    REJECTED = "rejected"  # can never be served (too long, or needs more blocks than exist)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_len: int
    max_tokens: int  # output tokens to generate; generation stops exactly there
    arrival_time_s: float = 0.0
    prompt_token_ids: SequenceT[int] | None = None
    prefix_block_ids: SequenceT[Hashable] | None = None
    prefix_block_tokens: int = 0  # tokens each prefix identity stands for
    n: int = 1  # parallel samples sharing the prompt's blocks
    beam_width: int = 1
    priority: int = 0  # lower is more important (vLLM's convention)
    # Parallel samples that end at different lengths: sample k stops after sample_max_tokens[k]
    # outputs (one entry per sample; the longest is max_tokens). None: all stop at max_tokens.
    sample_max_tokens: tuple[int, ...] | None = None

    # --- scheduler state (not user input) ---
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    seqs: list[Sequence] = field(default_factory=list, init=False)  # all, by index
    live_seqs: list[Sequence] = field(default_factory=list, init=False)  # the unfinished ones
    num_preemptions: int = field(default=0, init=False)
    was_preempted: bool = field(default=False, init=False)  # next admission is a resume
    has_run: bool = field(default=False, init=False)
    forked: bool = field(default=False, init=False)  # the n / beam samples exist
    reject_reason: str | None = field(default=None, init=False)
    admitted_seq_no: int = field(default=0, init=False)  # admission order (victim choice)
    # Hybrid caches: where a prefix this request shares with earlier ones ends, found at its last
    # prefix lookup (vLLM 0.33's shared_prefix_boundary; 0: none): a sliding group keys the
    # window's tail there, so the next request sharing the prefix can hit it.
    shared_prefix_boundary: int = field(default=0, init=False)
    # KV offloading: tokens its admission loads from the offload store (counted when it is admitted)
    num_loaded_tokens: int = field(default=0, init=False)

    # Written out, not generated by @dataclass (the same fields, in order; tests/test_compiled_build.py
    # checks): a compiled build compiles it with the class (pagesim/engine/compiled.py).
    def __init__(self, request_id: str, prompt_len: int, max_tokens: int, arrival_time_s: float = 0.0,
                 prompt_token_ids: SequenceT[int] | None = None, prefix_block_ids: SequenceT[Hashable] | None = None,
                 prefix_block_tokens: int = 0, n: int = 1, beam_width: int = 1, priority: int = 0,
                 sample_max_tokens: tuple[int, ...] | None = None) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.arrival_time_s = arrival_time_s
        self.prompt_token_ids = prompt_token_ids
        self.prefix_block_ids = prefix_block_ids
        self.prefix_block_tokens = prefix_block_tokens
        self.n = n
        self.beam_width = beam_width
        self.priority = priority
        self.sample_max_tokens = sample_max_tokens
        self.status = RequestStatus.WAITING
        self.seqs = []
        self.live_seqs = []
        self.num_preemptions = 0
        self.was_preempted = False
        self.has_run = False
        self.forked = False
        self.reject_reason = None
        self.admitted_seq_no = 0
        self.shared_prefix_boundary = 0
        self.num_loaded_tokens = 0
        self.__post_init__()

    # (Copies and pickles: compiled, an instance is made only through __init__, so a throwaway one
    # takes every attribute of the original; pagesim/engine/compiled.py.)
    def __reduce__(self) -> tuple:
        return _blank_request, (), self.__getstate__()

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        if self.prompt_token_ids is not None:
            if self.prompt_len in (0, None):
                self.prompt_len = len(self.prompt_token_ids)
            elif len(self.prompt_token_ids) != self.prompt_len:
                raise ValueError(
                    f"request {self.request_id}: prompt_len {self.prompt_len} but "
                    f"{len(self.prompt_token_ids)} prompt token ids"
                )
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1")
        if self.n < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: n and beam_width must be >= 1")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError(f"request {self.request_id}: use n or beam_width, not both")
        if self.prefix_block_ids is not None:
            if self.prompt_token_ids is not None:
                raise ValueError(f"request {self.request_id}: give token ids or prefix ids, not both")
            if self.prefix_block_tokens < 1:
                raise ValueError(f"request {self.request_id}: prefix_block_tokens must be >= 1")
        if self.sample_max_tokens is not None:
            lens = self.sample_max_tokens = tuple(self.sample_max_tokens)
            if self.n < 2 or len(lens) != self.n:
                raise ValueError(f"request {self.request_id}: sample_max_tokens needs one length per sample of n > 1")
            if min(lens) < 1 or max(lens) != self.max_tokens:
                raise ValueError(
                    f"request {self.request_id}: sample_max_tokens must be >= 1 with the longest equal to max_tokens"
                )
        self.seqs = [Sequence(self, index=0)]
        self.live_seqs = list(self.seqs)

    # ------------------------------------------------------------- derived
    @property
    def num_samples(self) -> int:
        """Sequences this request runs once forked (``n`` or the beam width)."""
        return max(self.n, self.beam_width)

    def max_tokens_of(self, seq: Sequence) -> int:
        """Outputs after which ``seq`` stops (its sample's own length, or ``max_tokens``)."""
        lens = self.sample_max_tokens
        return self.max_tokens if lens is None else lens[seq.index]

    @property
    def max_running_seqs(self) -> int:
        """vLLM v0's ``get_max_num_running_seqs``: ``n`` before the fork, unfinished seqs after."""
        if not self.forked and self.num_samples > 1:
            return self.num_samples
        return len(self.live_seqs)

    def add_seq(self, seq: Sequence) -> None:
        assert seq.index == len(self.seqs)
        self.seqs.append(seq)
        self.live_seqs.append(seq)

    def retire_seq(self, seq: Sequence, reason: str) -> None:
        """Mark ``seq`` finished (its blocks are the caller's to release)."""
        seq.finished = True
        seq.finish_reason = reason
        self.live_seqs.remove(seq)
        if reason == "pruned":  # a dropped beam's tokens are never read again
            seq.output_token_ids = []
            seq.block_keys = []

    def block_content(self, seq: Sequence, start: int, end: int) -> Hashable:
        """The content of ``seq``'s tokens ``[start, end)``: what a prefix-cache key hashes."""
        prompt_len = self.prompt_len
        # NOTE: three fast paths for what the general rule below gives (one key per full block is a
        # hot path): a prompt with neither token ids nor prefix ids is one segment unique to this
        # request (``_identity_segments``), so is a stretch within one prefix identity's tokens,
        # and a run of unnamed outputs is one segment.
        if start < end <= prompt_len and self.prompt_token_ids is None:
            ids = self.prefix_block_ids
            if ids is None:
                return (("prompt", self.request_id, start, end),)
            size = self.prefix_block_tokens
            if size:
                k = start // size
                if k < len(ids) and (end - 1) // size == k:
                    return ((ids[k], start - k * size, end - k * size),)
        if prompt_len <= start < end:
            outputs = seq.output_token_ids[start - prompt_len:end - prompt_len]
            if outputs.count(None) == len(outputs):
                return (("out", self.request_id, seq.index, start, end),)
        prompt_end = min(end, prompt_len)
        parts: list[Hashable] = []
        if start < prompt_end:
            if self.prompt_token_ids is not None:
                parts.extend(self.prompt_token_ids[start:prompt_end])
            else:
                parts.extend(self._identity_segments(start, prompt_end))
        if end > prompt_len:
            lo = max(start, prompt_len)
            outputs = seq.output_token_ids[lo - prompt_len:end - prompt_len]
            if outputs.count(None) == len(outputs):  # all unnamed (a simulator): one segment
                parts.append(("out", self.request_id, seq.index, lo, end))
            else:
                run_start = None  # unnamed tokens in [run_start, pos): one segment per run
                for pos, token in enumerate(outputs, lo):
                    if token is None:
                        if run_start is None:
                            run_start = pos
                        continue
                    if run_start is not None:
                        parts.append(("out", self.request_id, seq.index, run_start, pos))
                        run_start = None
                    parts.append(token)
                if run_start is not None:
                    parts.append(("out", self.request_id, seq.index, run_start, end))
        return tuple(parts)

    def block_contents(self, seq: Sequence, start: int, stop: int, bs: int) -> list[Hashable]:
        """``block_content`` of the consecutive ``bs``-token blocks starting at ``start``,
        ``start + bs``, ... below ``stop`` (``stop - start`` a multiple of ``bs``): the same
        values, in one call. Where ``block_content`` takes a fast path for every block (a prompt
        with no token ids, given by no identities or by identities whose segments are whole
        blocks, as Mooncake's 512-token hash ids; unnamed outputs), one tuple per block is made
        here without a call each."""
        prompt_len = self.prompt_len
        rid = self.request_id
        if stop <= prompt_len and self.prompt_token_ids is None:  # (block_content's first fast paths)
            ids = self.prefix_block_ids
            if ids is None:
                return [(("prompt", rid, s, s + bs),) for s in range(start, stop, bs)]
            size = self.prefix_block_tokens
            if size % bs == 0 and start % bs == 0 and (stop - 1) // size < len(ids):
                # (each block lies within the identity k = s // size)
                return [((ids[s // size], s % size, s % size + bs),) for s in range(start, stop, bs)]
        elif start >= prompt_len:  # (its third: a block of unnamed outputs)
            outputs = seq.output_token_ids[start - prompt_len:stop - prompt_len]
            if outputs.count(None) == len(outputs):
                index = seq.index
                return [(("out", rid, index, s, s + bs),) for s in range(start, stop, bs)]
        content = self.block_content
        return [content(seq, s, s + bs) for s in range(start, stop, bs)]

    def _identity_segments(self, start: int, end: int) -> list[Hashable]:
        size = self.prefix_block_tokens
        ids = self.prefix_block_ids or ()
        segments: list[Hashable] = []
        pos = start
        while pos < end:
            k = pos // size if size else len(ids)
            if k < len(ids):
                hi = min(end, (k + 1) * size)
                segments.append((ids[k], pos - k * size, hi - k * size))
            else:  # no identity known for these prompt tokens: unique to this request
                hi = end
                segments.append(("prompt", self.request_id, pos, hi))
            pos = hi
        return segments


@dataclass(slots=True, eq=False)
class Sequence:
    request: Request
    index: int  # 0 = the prompt's sequence; 1.. forked children in fork order
    output_token_ids: list[int | None] = field(default_factory=list)
    num_computed_tokens: int = 0
    # GPU block ids, logical order. (A hybrid cache whose group 0 slides puts None where the window
    # dropped a leading entry: hybrid_kv.py reads the table as list[int | None]; nothing else does.)
    block_table: list[int] = field(default_factory=list)
    cpu_block_table: list[int] = field(default_factory=list)  # while swapped out
    num_filled_tokens: int = 0  # token slots written into the table (v0's "filled")
    block_keys: list[BlockKey] = field(default_factory=list)  # keys of full blocks, in order
    num_registered_blocks: int = 0  # leading blocks given their key in the prefix cache
    num_offered_blocks: int = 0  # leading full blocks offered to the offload store (pagesim/engine/policy/offload)
    # The first block index from which this sequence's content is unique to it (its blocks get
    # lazy keys: KVCacheManager.lazy_from); -1 until known.
    lazy_from: int = -1
    finished: bool = False
    finish_reason: str | None = None
    # After a recompute preemption of a multi-sequence request, the sequences other than the
    # leader wait (parked, no blocks) until the leader has recomputed the prompt's full blocks,
    # then share them again, as they did after the original fork.
    parked: bool = False
    # Has sampled since its last (re)start: vLLM v0's "decode stage" (one new token per step),
    # as opposed to a prefill that may still end exactly one token short.
    decoding: bool = False
    # ``tuple(block_table)``, kept while the table is unchanged (the KV manager drops it on every
    # change), so a decode step does not copy a long table that did not change.
    table_snapshot: tuple[int, ...] | None = None
    # A hybrid KV cache (sliding-window layer groups; pagesim/engine/policy/memory/hybrid_kv.py) keeps one table
    # per group: ``block_table`` is group 0's, these are groups 1.. (None: one group). In a
    # sliding group the entries a window dropped are None (vLLM's null block).
    extra_tables: list[list[int | None]] | None = None
    extra_snapshot: tuple[tuple[int, ...], ...] | None = None  # ``extra_table_tuples()``, while unchanged

    # Written out, not generated by @dataclass (the same fields, in order; tests/test_compiled_build.py
    # checks): a compiled build compiles it with the class (pagesim/engine/compiled.py).
    def __init__(self, request: Request, index: int, output_token_ids: list[int | None] | None = None,
                 num_computed_tokens: int = 0, block_table: list[int] | None = None,
                 cpu_block_table: list[int] | None = None, num_filled_tokens: int = 0,
                 block_keys: list[BlockKey] | None = None, num_registered_blocks: int = 0, num_offered_blocks: int = 0,
                 lazy_from: int = -1, finished: bool = False, finish_reason: str | None = None, parked: bool = False,
                 decoding: bool = False, table_snapshot: tuple[int, ...] | None = None,
                 extra_tables: list[list[int | None]] | None = None,
                 extra_snapshot: tuple[tuple[int, ...], ...] | None = None) -> None:
        self.request = request
        self.index = index
        self.output_token_ids = [] if output_token_ids is None else output_token_ids
        self.num_computed_tokens = num_computed_tokens
        self.block_table = [] if block_table is None else block_table
        self.cpu_block_table = [] if cpu_block_table is None else cpu_block_table
        self.num_filled_tokens = num_filled_tokens
        self.block_keys = [] if block_keys is None else block_keys
        self.num_registered_blocks = num_registered_blocks
        self.num_offered_blocks = num_offered_blocks
        self.lazy_from = lazy_from
        self.finished = finished
        self.finish_reason = finish_reason
        self.parked = parked
        self.decoding = decoding
        self.table_snapshot = table_snapshot
        self.extra_tables = extra_tables
        self.extra_snapshot = extra_snapshot

    # (Copies and pickles: compiled, an instance is made only through __init__, so a throwaway one
    # takes every attribute of the original; pagesim/engine/compiled.py.)
    def __reduce__(self) -> tuple:
        return _blank_sequence, (), self.__getstate__()

    def block_table_tuple(self) -> tuple[int, ...]:
        snapshot = self.table_snapshot
        if snapshot is None:
            if self.extra_tables is None:
                snapshot = tuple(self.block_table)
            else:  # the executor sees the null block (0) where a window dropped a block
                snapshot = executor_table(self.block_table)
            self.table_snapshot = snapshot
        return snapshot

    def extra_table_tuples(self) -> tuple[tuple[int, ...], ...]:
        """Groups 1..'s tables as the executor sees them (the null block for dropped entries)."""
        if not self.extra_tables:
            return ()
        snapshot = self.extra_snapshot
        if snapshot is None:
            snapshot = self.extra_snapshot = tuple(map(executor_table, self.extra_tables))
        return snapshot

    @property
    def num_held_blocks(self) -> int:
        """GPU blocks this sequence's tables hold (every group's; dropped entries aside)."""
        if self.extra_tables is None:
            return len(self.block_table)
        table = self.block_table
        return len(table) - num_dropped(table) + sum(len(extra) - num_dropped(extra) for extra in self.extra_tables)

    @property
    def seq_id(self) -> str:
        return seq_id_of(self.request.request_id, self.index)

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_len + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_prefilling(self) -> bool:
        """Known tokens beyond the latest one are still to be computed (a decode computes one)."""
        return self.num_computed_tokens < self.num_tokens - 1

    def fork(self, index: int) -> Sequence:
        """A child with this sequence's tokens and progress, sharing nothing yet (the caller
        shares the blocks through the block manager)."""
        return Sequence(
            request=self.request,
            index=index,
            output_token_ids=list(self.output_token_ids),
            num_computed_tokens=self.num_computed_tokens,
            num_filled_tokens=self.num_filled_tokens,
            block_keys=list(self.block_keys),
            num_registered_blocks=self.num_registered_blocks,
            decoding=self.decoding,
        )


def _blank_request() -> Request:
    return Request("blank", 1, 1)


def _blank_sequence() -> Sequence:
    return Sequence(_blank_request(), 0)
