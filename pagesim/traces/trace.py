"""A request trace held column-wise: one numpy array per field, one row per request.

A trace is what a what-if study replays: when each request arrives (seconds from the trace's
start: loaders put the first row at 0, generators at the first inter-arrival gap), how long its
prompt is, how many tokens it generates (exactly; EOS is ignored, as benchmark tools do), and
optionally what its prompt *contains*, as prefix-block identities: ``prefix_ids[i]`` lists the
identities of request ``i``'s prompt blocks of ``prefix_block_tokens`` tokens each (Mooncake's
``hash_ids`` of 512-token blocks; the generators' shared system prompts and conversation
histories). Equal identities stand for equal tokens, so a prefix cache can hit on them at any
simulated block size (see ``pagesim.traces.tokens`` for the pseudo-token ids an engine needs).

Identities are stored as CSR: ``prefix_id_values`` (all identities, flat, int64) and
``prefix_id_offsets`` (``N + 1`` offsets into it). The rest are plain columns: ``n`` parallel
samples, ``beam_width``, ``priority`` (lower is more important, as in vLLM), and optional
``conversation_id`` / ``turn`` for multi-turn workloads. A million rows take about 50 MB.

Invariants (checked on construction, naming the first offending row): all columns have the
same length; arrivals are finite, non-negative and sorted; prompt and output lengths are >= 1;
``n`` and ``beam_width`` are >= 1 and not both > 1; request ``i`` has
``ceil(prompt_len[i] / prefix_block_tokens)`` identities or none at all.

Requests become the policy's ``Request`` objects only when asked (``request(i)``,
``requests()``), so a trace of millions of rows costs arrays, not objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from pagesim.engine.policy.scheduling.request import Request
from pagesim.traces.errors import TraceFormatError

_INT = np.int64


def _column(values, dtype, name: str, size: int) -> np.ndarray:
    try:
        given = np.asarray(values)
        if dtype is _INT and given.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                whole = np.isfinite(given) & (given == np.floor(given)) & (np.abs(given) < 2.0**63)
            if not whole.all():
                raise TraceFormatError(None, f"column {name} must hold whole numbers in int64",
                                       row=int(np.flatnonzero(~whole)[0]))
        array = np.ascontiguousarray(given, dtype=dtype)
    except (OverflowError, TypeError, ValueError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(None, f"column {name} cannot be held as {np.dtype(dtype).name}: {exc}") from None
    if array.ndim != 1 or array.shape[0] != size:
        raise TraceFormatError(None, f"column {name} has shape {array.shape}, expected ({size},)")
    return array


@dataclass(frozen=True, eq=False)
class Trace:
    arrival_s: np.ndarray  # float64 [N], seconds, sorted
    prompt_len: np.ndarray  # int64 [N], tokens, >= 1
    output_len: np.ndarray  # int64 [N], tokens generated, >= 1
    n: np.ndarray | None = None  # int64 [N], parallel samples (default 1)
    beam_width: np.ndarray | None = None  # int64 [N] (default 1)
    priority: np.ndarray | None = None  # int64 [N], lower = more important (default 0)
    conversation_id: np.ndarray | None = None  # int64 [N] or absent
    turn: np.ndarray | None = None  # int64 [N], 0-based turn within its conversation
    prefix_id_values: np.ndarray | None = None  # int64 [total identities]
    prefix_id_offsets: np.ndarray | None = None  # int64 [N + 1]
    prefix_block_tokens: int = 0  # tokens each identity stands for (0 = no identities)
    has_arrivals: bool = True  # False for length-only data given no arrival process
    source: str = ""  # where it came from, for reports ("azure:PATH", "workload:NAME", ...)
    metadata: dict = field(default_factory=dict)  # e.g. rows dropped by a loader

    def __post_init__(self) -> None:
        size = len(self.arrival_s)
        put = object.__setattr__
        put(self, "arrival_s", _column(self.arrival_s, np.float64, "arrival_s", size))
        for name in ("prompt_len", "output_len"):
            put(self, name, _column(getattr(self, name), _INT, name, size))
        for name, default in (("n", 1), ("beam_width", 1), ("priority", 0)):
            values = getattr(self, name)
            put(self, name, np.full(size, default, _INT) if values is None
                else _column(values, _INT, name, size))
        for name in ("conversation_id", "turn"):
            if getattr(self, name) is not None:
                put(self, name, _column(getattr(self, name), _INT, name, size))
        if (self.conversation_id is None) != (self.turn is None):
            raise TraceFormatError(None, "conversation_id and turn come together")
        if (self.prefix_id_values is None) != (self.prefix_id_offsets is None):
            raise TraceFormatError(None, "prefix_id_values and prefix_id_offsets come together")
        if self.prefix_id_values is not None:
            put(self, "prefix_id_offsets",
                _column(self.prefix_id_offsets, _INT, "prefix_id_offsets", size + 1))
            put(self, "prefix_id_values", np.ascontiguousarray(self.prefix_id_values, _INT))
        self._check()

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        def first(mask: np.ndarray) -> int | None:
            hits = np.flatnonzero(mask)
            return int(hits[0]) if hits.size else None

        checks = [
            # order first: a row earlier than the first one is out of order, not "negative"
            (np.r_[False, np.diff(self.arrival_s) < 0], "arrival times must be sorted"),
            (~np.isfinite(self.arrival_s) | (self.arrival_s < 0), "arrival time must be finite and >= 0"),
            (self.prompt_len < 1, "prompt length must be >= 1"),
            (self.output_len < 1, "output length must be >= 1"),
            ((self.n < 1) | (self.beam_width < 1), "n and beam_width must be >= 1"),
            ((self.n > 1) & (self.beam_width > 1), "use n or beam_width, not both"),
        ]
        if self.prefix_id_offsets is not None:
            offsets = self.prefix_id_offsets
            if self.prefix_block_tokens < 1:
                raise TraceFormatError(None, "prefix identities need prefix_block_tokens >= 1")
            if offsets[0] != 0 or offsets[-1] != len(self.prefix_id_values):
                raise TraceFormatError(None, "prefix_id_offsets must run from 0 to the number of identities")
            counts = np.diff(offsets)
            expected = -(-self.prompt_len // self.prefix_block_tokens)
            checks.append(((counts != 0) & (counts != expected),
                           f"a prompt needs ceil(prompt_len / {self.prefix_block_tokens}) "
                           "prefix identities (or none)"))
        for mask, problem in checks:
            row = first(mask)
            if row is not None:
                raise TraceFormatError(None, problem, row=row)

    # ------------------------------------------------------------- properties
    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_prefix_ids(self) -> bool:
        return self.prefix_id_values is not None

    @property
    def has_conversations(self) -> bool:
        return self.conversation_id is not None

    @property
    def duration_s(self) -> float:
        """Last arrival minus first (0 for fewer than two requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def rate_rps(self) -> float | None:
        """Requests per second over the span, as the shared README computes it (rows / span)."""
        span = self.duration_s
        return len(self) / span if self.has_arrivals and span > 0 else None

    def prefix_ids(self, i: int) -> np.ndarray | None:
        """Request ``i``'s prompt-block identities (a view), or None if the trace has none."""
        if self.prefix_id_values is None:
            return None
        lo, hi = self.prefix_id_offsets[i], self.prefix_id_offsets[i + 1]
        return self.prefix_id_values[lo:hi] if hi > lo else None

    # ------------------------------------------------------------- reshaping
    def take(self, rows: np.ndarray | slice) -> Trace:
        """The requests at ``rows`` (a slice, sorted indices or a boolean mask), in order."""
        index = np.atleast_1d(np.arange(len(self))[rows])
        if index.size > 1 and np.any(np.diff(index) <= 0):
            raise ValueError("take() needs increasing row indices (arrivals stay sorted)")
        changes = {
            name: getattr(self, name)[index]
            for name in ("arrival_s", "prompt_len", "output_len", "n", "beam_width", "priority")
        }
        for name in ("conversation_id", "turn"):
            if getattr(self, name) is not None:
                changes[name] = getattr(self, name)[index]
        if self.prefix_id_values is not None:
            starts = self.prefix_id_offsets[index]
            counts = self.prefix_id_offsets[index + 1] - starts
            changes["prefix_id_offsets"] = np.r_[0, np.cumsum(counts)]
            # gather each kept row's identities: positions start + 0..count-1
            within = np.arange(counts.sum()) - np.repeat(changes["prefix_id_offsets"][:-1], counts)
            changes["prefix_id_values"] = self.prefix_id_values[np.repeat(starts, counts) + within]
        return replace(self, **changes)

    def head(self, count: int) -> Trace:
        """The first ``count`` requests."""
        if count < 0:
            raise ValueError("count must be >= 0")
        return self.take(slice(0, count))

    def between(self, start_s: float, end_s: float | None = None, *, rebase: bool = True) -> Trace:
        """Requests arriving in ``[start_s, end_s)``; with ``rebase`` the window starts at 0."""
        if not np.isfinite(start_s) or (end_s is not None and not end_s >= start_s):
            raise ValueError(f"a time window needs a finite start <= end, got [{start_s}, {end_s})")
        lo = int(np.searchsorted(self.arrival_s, start_s, side="left"))
        hi = len(self) if end_s is None else int(np.searchsorted(self.arrival_s, end_s, side="left"))
        window = self.take(slice(lo, hi))
        if rebase and len(window):
            return replace(window, arrival_s=window.arrival_s - start_s)
        return window

    def time_scaled(self, factor: float) -> Trace:
        """Arrival times multiplied by ``factor`` (> 1 stretches the trace, lowering the rate)."""
        if not np.isfinite(factor) or factor <= 0:
            raise ValueError(f"time scale factor must be > 0, got {factor}")
        return replace(self, arrival_s=self.arrival_s * factor)

    def at_rate(self, target_rps: float) -> Trace:
        """The same arrival pattern compressed or stretched to ``target_rps`` requests per second."""
        rate = self.rate_rps
        if rate is None:
            if not self.has_arrivals:
                raise ValueError("this trace has no arrival times to rescale (a length-only trace "
                                 "needs an arrival process: --arrival and --rate)")
            raise ValueError("all of this trace's requests share one timestamp, so it has no rate to rescale "
                             "(keep more requests, or --spread-ties for a trace logged in batches)")
        if not np.isfinite(target_rps) or target_rps <= 0:
            raise ValueError(f"target rate must be > 0 requests/s, got {target_rps}")
        return self.time_scaled(rate / target_rps)

    def spread_ties(self, seed: int = 0) -> Trace:
        """Requests that share a timestamp spread uniformly over the gap to the next timestamp.

        Some traces log arrivals in batches (Mooncake's conversation trace: 12,031 requests on
        1,180 distinct stamps about 3 s apart); replayed literally, each batch is a burst. This
        spreads every batch over ``[t, t_next)`` (the last over the median gap), keeping the row
        order and every timestamp's batch inside its own interval. Reproducible from ``seed``.
        """
        if not self.has_arrivals:
            raise ValueError("this trace has no arrival times to spread (give it an arrival process)")
        times = self.arrival_s
        stamps, counts = np.unique(times, return_counts=True)
        if len(stamps) == len(times):
            return self
        if len(stamps) == 1:
            raise ValueError("every request has the same timestamp: there is no gap to spread them over")
        gaps = np.diff(stamps)
        widths = np.r_[gaps, np.median(gaps) if gaps.size else 1.0]
        offsets = np.random.default_rng(seed).random(len(times)) * np.repeat(widths, counts)
        group = np.repeat(np.arange(len(stamps)), counts)
        offsets = offsets[np.lexsort((offsets, group))]  # ascending within each batch
        return replace(self, arrival_s=np.repeat(stamps, counts) + offsets)

    # ------------------------------------------------------------- requests
    def prompt_token_ids(self, i: int, *, vocab_size: int) -> np.ndarray:
        """Pseudo-token ids for request ``i``'s prompt: equal identities give equal tokens
        (see ``pagesim.traces.tokens``); a prompt without identities gets tokens of its own."""
        from pagesim.traces.tokens import identity_tokens, private_tokens

        ids = self.prefix_ids(i)
        length = int(self.prompt_len[i])
        if ids is None:
            return private_tokens(i, length, vocab_size=vocab_size)
        return identity_tokens(ids, self.prefix_block_tokens, length, vocab_size=vocab_size)

    def request(self, i: int, *, request_id: str | None = None, vocab_size: int | None = None,
                sample_max_tokens: tuple[int, ...] | None = None) -> Request:
        """Row ``i`` as the policy's ``Request``.

        By default the prompt is a length plus identities (what a simulator needs); with
        ``vocab_size`` it carries pseudo-token ids instead (what an engine needs). Both give the
        same prefix-cache sharing. ``sample_max_tokens`` gives each of the row's ``n`` samples its
        own output length (``Request.sample_max_tokens``); ``max_tokens`` is then the longest.
        """
        num_rows = len(self.arrival_s)  # (len(self), read once: a call per request otherwise)
        if not -num_rows <= i < num_rows:
            raise IndexError(f"request {i} out of range for a trace of {num_rows}")
        i %= num_rows
        ids = self.prefix_ids(i)
        tokens = None
        if vocab_size is not None:
            tokens = self.prompt_token_ids(i, vocab_size=vocab_size).tolist()
            ids = None
        return Request(
            request_id=f"r{i}" if request_id is None else request_id,
            prompt_len=int(self.prompt_len[i]),
            max_tokens=int(self.output_len[i]) if sample_max_tokens is None else max(sample_max_tokens),
            arrival_time_s=float(self.arrival_s[i]),
            prompt_token_ids=tokens,
            prefix_block_ids=None if ids is None else ids.tolist(),
            prefix_block_tokens=self.prefix_block_tokens if ids is not None else 0,
            n=int(self.n[i]),
            beam_width=int(self.beam_width[i]),
            priority=int(self.priority[i]),
            sample_max_tokens=sample_max_tokens,
        )

    def requests(self, *, vocab_size: int | None = None) -> Iterator[Request]:
        """Every row as a ``Request``, built one at a time, in arrival order."""
        for i in range(len(self)):
            yield self.request(i, vocab_size=vocab_size)

    def __repr__(self) -> str:
        extras = []
        if self.has_prefix_ids:
            extras.append(f"prefix ids of {self.prefix_block_tokens} tokens")
        if self.has_conversations:
            extras.append(f"{len(np.unique(self.conversation_id))} conversations")
        more = f", {', '.join(extras)}" if extras else ""
        return f"Trace({len(self)} requests over {self.duration_s:.1f} s{more}, source={self.source!r})"
