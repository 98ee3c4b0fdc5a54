"""Synthetic workloads: a ``WorkloadSpec`` says what traffic looks like; ``generate`` draws a trace.

What a spec can ask for, all drawn from one ``numpy`` generator seeded by ``spec.seed`` (the same
spec and seed give the same trace, column for column):

- **arrivals** from an arrival process (``pagesim.traces.generate.arrivals``);
- **lengths**: prompt and output tokens from two length distributions, or (prompt, output)
  pairs resampled from a length file (``pagesim.traces.generate.lengths``);
- **shared system prompts**: ``count`` prompts of ``tokens`` tokens each; a ``fraction`` of
  requests starts with one of them, chosen uniformly, before its own tokens;
- **multi-turn conversations**: the arrival process, slowed by the turns a conversation keeps
  (``mean_turns``, fewer if the context limit ends conversations early), gives conversation
  *starts*, so requests arrive at the process's rate; each has a geometric number of turns with
  mean ``mean_turns``; turn ``t``'s prompt is turn ``t-1``'s prompt
  and output plus new user tokens, and it arrives an exponential think time (mean
  ``think_time_s``) after turn ``t-1`` arrived. NOTE: this is open loop, so a short think time
  can bring turn ``t`` before turn ``t-1``'s answer could exist (about 15% of ``multi-turn-chat``
  follow-ups come within 5 s); a simulator that releases a turn only after the previous one
  finished plus a think time can do so from the ``conversation_id`` and ``turn`` columns. A conversation
  ends early rather than grow past ``max_context_tokens`` (prompt plus output). Conversations
  begin ``warmup_s`` before the trace's 0, so the trace is steady traffic from its first second
  (conversations already under way, not a ramp from none);
- **parallel sampling** ``n`` or **beam search** ``beam_width`` for a ``fraction`` of requests,
  and ``priority_levels`` uniformly drawn priorities.

Prompt contents are given as prefix identities of ``identity_block_tokens`` tokens whenever
something is shared (system prompts, conversation history): a system prompt is a run of identities
that tiles it exactly (with system prompts the identity size becomes ``gcd(identity_block_tokens,
tokens)``, so the request's own tokens start a fresh identity and nothing is lengthened);
a conversation's history is a chain of identities that each turn extends. The history includes
earlier answers under the conversation's identities, while a simulator's generated tokens have
contents of their own, so a replay hits cached *prompt* blocks of earlier turns but not their
cached answer blocks; ``prefix_reuse`` (which counts identities) is the upper bound with both. Identities are chained
like a prefix cache's hashes: an identity always follows the same ones. Without sharing, traces
carry no identities (every prompt is private, and the arrays stay small).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pagesim.traces.generate.arrivals import Poisson
from pagesim.traces.generate.lengths import LengthPairs, LogNormal
from pagesim.traces.limits import MAX_LENGTH_TOKENS
from pagesim.traces.trace import Trace


MAX_REQUESTS = 100_000_000  # ~5 GB of columns: beyond that, generate in parts
MAX_MEAN_TURNS = 1000
MAX_SYSTEM_PROMPTS = 1_000_000  # distinct shared system prompts (their identities are laid out up front)
MAX_SAMPLES = 1024  # parallel samples (n) or beams per request
MAX_PRIORITY_LEVELS = 2**31


@dataclass(frozen=True)
class SystemPrompts:
    count: int  # distinct system prompts
    tokens: int  # tokens in each
    fraction: float  # of requests (or conversations) that start with one

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SYSTEM_PROMPTS or not 1 <= self.tokens <= MAX_LENGTH_TOKENS:
            raise ValueError(f"system prompts need a count from 1 to {MAX_SYSTEM_PROMPTS:,} and tokens from 1 to "
                             f"{MAX_LENGTH_TOKENS:,}, got {self.count:,} and {self.tokens:,}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"system prompt fraction must be in [0, 1], got {self.fraction}")


@dataclass(frozen=True)
class Conversations:
    mean_turns: float  # >= 1; turns per conversation are geometric with this mean
    think_time_s: float  # mean gap between one turn's arrival and the next's
    # a conversation ends before a later turn's prompt + output exceed this (a first turn is kept)
    max_context_tokens: int = 32768
    warmup_s: float | None = None  # conversations start this long before 0; None: 5 x turns x think

    @property
    def effective_warmup_s(self) -> float:
        """Long enough that almost every conversation begun at the warm-up's start is over by 0."""
        return 5.0 * self.mean_turns * self.think_time_s if self.warmup_s is None else self.warmup_s

    def __post_init__(self) -> None:
        if self.warmup_s is not None and not 0 <= self.warmup_s < 1e9:
            raise ValueError(f"warm-up must be finite and >= 0 s, got {self.warmup_s}")
        if not 1 <= self.mean_turns <= MAX_MEAN_TURNS:
            raise ValueError(f"mean turns per conversation must be in [1, {MAX_MEAN_TURNS}], got {self.mean_turns}")
        if not 0 <= self.think_time_s < 1e9:
            raise ValueError(f"think time must be finite and >= 0 s, got {self.think_time_s}")
        if not 2 <= self.max_context_tokens <= MAX_LENGTH_TOKENS:
            raise ValueError(f"max_context_tokens must be from 2 to {MAX_LENGTH_TOKENS:,}, got {self.max_context_tokens:,}")


@dataclass(frozen=True)
class Sampling:
    n: int = 1  # parallel samples
    beam_width: int = 1
    fraction: float = 1.0  # of requests that sample this way (the rest: one greedy sample)

    def __post_init__(self) -> None:
        if self.n < 1 or self.beam_width < 1 or (self.n > 1 and self.beam_width > 1):
            raise ValueError("sampling needs n >= 1 and beam_width >= 1, not both > 1")
        if max(self.n, self.beam_width) > MAX_SAMPLES:
            raise ValueError(f"sampling needs n and beam_width of at most {MAX_SAMPLES}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"sampling fraction must be in [0, 1], got {self.fraction}")


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    arrivals: object = field(default_factory=lambda: Poisson(1.0))  # an arrival process
    prompt: object = field(default_factory=lambda: LogNormal(161.31, 1.0))  # a length distribution
    output: object = field(default_factory=lambda: LogNormal(337.99, 1.0))
    pairs: LengthPairs | None = None  # (prompt, output) pairs; replaces prompt and output
    system_prompts: SystemPrompts | None = None
    conversations: Conversations | None = None
    sampling: Sampling = field(default_factory=Sampling)
    priority_levels: int = 1
    identity_block_tokens: int = 64
    seed: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        if not 1 <= self.num_requests <= MAX_REQUESTS:
            raise ValueError(f"the number of requests must be in [1, {MAX_REQUESTS:,}], got {self.num_requests}")
        if not 1 <= self.priority_levels <= MAX_PRIORITY_LEVELS:
            raise ValueError(f"priority levels must be from 1 to {MAX_PRIORITY_LEVELS:,}")
        if not 1 <= self.identity_block_tokens <= MAX_LENGTH_TOKENS:
            raise ValueError(f"identity block size must be from 1 to {MAX_LENGTH_TOKENS:,} tokens")


def _lengths(spec: WorkloadSpec, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if spec.pairs is not None:
        return spec.pairs.sample(count, rng)
    return spec.prompt.sample(count, rng), spec.output.sample(count, rng)


def _conversations(spec: WorkloadSpec, rng: np.random.Generator, draw_system):
    """Per request, in arrival order: conversation, turn, arrival, prompt, output, system prompt.

    Conversations start by the arrival process, shifted to begin ``warmup_s`` before the trace's
    0, and their turns follow by think times. The trace is the first ``num_requests`` turns
    arriving at or after 0: a window of steady traffic, in which conversations begun during the
    warm-up are already under way (their first turn in the window has ``turn > 0`` and their
    history in its prompt) and the last ones are cut short, as in any window of a real trace.
    Enough conversations are drawn that every one starting before the window's end is in it.
    """
    conv = spec.conversations
    warmup_s = conv.effective_warmup_s
    # Requests arrive at the process's rate: conversations start as many times less often as
    # a conversation has turns. That is mean_turns unless the context limit ends conversations
    # early; then the turns actually kept are measured on a draw and the draw is repeated.
    kept_turns = conv.mean_turns
    for _ in range(4):
        start_process = spec.arrivals.scaled(1.0 / kept_turns).with_lead_in(warmup_s)
        *columns, measured = _draw_conversations(spec, rng, draw_system, start_process, warmup_s)
        if abs(measured / kept_turns - 1) <= 0.02:
            break
        kept_turns = measured
    return columns


MAX_TURN_DRAWS = 50_000_000  # turns drawn for one trace (window and warm-up): ~2 GB of columns


def _draw_conversations(spec: WorkloadSpec, rng, draw_system, start_process, warmup_s: float):
    """One draw of conversations covering the warm-up and a full window; see ``_conversations``.
    Returns the window's columns and the mean number of turns the conversations kept."""
    conv = spec.conversations
    count = spec.num_requests
    expected = count / conv.mean_turns + start_process.mean_rate_rps * warmup_s  # in window + warm-up
    if expected * conv.mean_turns > max(MAX_TURN_DRAWS, 4 * count):
        raise ValueError(
            f"the warm-up would draw about {expected * conv.mean_turns:,.0f} turns "
            f"({warmup_s:g} s of conversations starting at {start_process.mean_rate_rps:g}/s with "
            f"{conv.mean_turns:g} turns each); give a shorter --warmup or --think-time")
    num_conversations = int(expected * 1.25) + 16
    while True:
        if num_conversations > 64 * expected + 4096:
            raise ValueError("the conversations never fill the trace: check the arrival process "
                             "(its rate after the warm-up) and the context limit")
        turns = rng.geometric(1.0 / conv.mean_turns, num_conversations)
        draws = int(turns.sum())
        starts = start_process.times(num_conversations, rng) - warmup_s  # the lead-in ends at 0
        which_system, system_tokens = draw_system(num_conversations)
        user, output = _lengths(spec, draws, rng)
        think = rng.exponential(conv.think_time_s, draws) if conv.think_time_s > 0 else np.zeros(draws)
        conv_of = np.repeat(np.arange(num_conversations), turns)
        first = np.cumsum(turns) - turns  # index of each conversation's first turn
        turn = np.arange(draws) - first[conv_of]
        # arrival of turn t = start + think times of turns 0..t-1
        gaps = np.where(turn == 0, 0.0, np.r_[0.0, think[:-1]])
        arrival = starts[conv_of] + _segment_cumsum(gaps, first, turns)
        # prompt of turn t = system prompt + sum over earlier turns of (user + output) + user_t
        grown = _segment_cumsum(np.r_[0, (user + output)[:-1]] * (turn > 0), first, turns)
        prompt = system_tokens[conv_of] + grown + user
        fits = (prompt + output <= conv.max_context_tokens) | (turn == 0)
        # a conversation ends at its first turn that does not fit
        fits = _segment_cumsum((~fits).astype(np.int64), first, turns) == 0
        keep = np.flatnonzero(fits & (arrival >= 0))
        if keep.size >= count:
            order = keep[np.argsort(arrival[keep], kind="stable")][:count]
            if starts[-1] >= arrival[order[-1]]:  # no conversation missing from the window
                break
        num_conversations *= 2
    kept_turns = float(fits.sum()) / num_conversations
    return (conv_of[order], turn[order], arrival[order], prompt[order], output[order],
            which_system[conv_of[order]], kept_turns)


def _segment_cumsum(values: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` restarting at each segment (segments given by first index and length)."""
    total = np.cumsum(values)
    before = np.r_[0, total][first]  # sum of everything before each segment
    return total - np.repeat(before, lengths)


def generate(spec: WorkloadSpec) -> Trace:
    """Draw the trace ``spec`` describes (reproducible from ``spec.seed``)."""
    rng = np.random.default_rng(spec.seed)
    count = spec.num_requests
    system = spec.system_prompts
    block = spec.identity_block_tokens
    if system is not None:  # identities that tile the system prompt exactly
        block = math.gcd(block, system.tokens)
        if block < 4:  # 1-3 token identities would multiply the trace's size
            raise ValueError(
                f"a system prompt of {system.tokens} tokens cannot be tiled by identities of at least 4 "
                f"tokens dividing {spec.identity_block_tokens}; use a length that is a multiple of 4")
    system_blocks = 0 if system is None else system.tokens // block

    def draw_system(k: int) -> tuple[np.ndarray, np.ndarray]:
        """Which system prompt (-1 = none) for k requests or conversations, and its tokens."""
        if system is None:
            return np.full(k, -1, dtype=np.int64), np.zeros(k, dtype=np.int64)
        chosen = rng.random(k) < system.fraction
        which = np.where(chosen, rng.integers(0, system.count, k), -1)
        return which, np.where(which >= 0, system_blocks * block, 0)

    if spec.conversations is None:
        which_system, system_tokens = draw_system(count)
        arrival = spec.arrivals.times(count, rng)
        user, output = _lengths(spec, count, rng)
        prompt = system_tokens + user
        chain = np.arange(count)  # each request's own identities form their own chain
        conversation_id = turn = None
    else:
        conversation_id, turn, arrival, prompt, output, which_system = _conversations(spec, rng, draw_system)
        chain = conversation_id  # turns of a conversation extend one chain

    sampling = spec.sampling
    sampled = rng.random(count) < sampling.fraction
    n = np.where(sampled, sampling.n, 1)
    beam_width = np.where(sampled, sampling.beam_width, 1)
    priority = rng.integers(0, spec.priority_levels, count) if spec.priority_levels > 1 else None

    ids = offsets = None
    if system is not None or spec.conversations is not None:
        ids, offsets = prefix_identities(prompt, which_system, chain, block, system_blocks,
                                   0 if system is None else system.count)
    return Trace(
        arrival_s=arrival, prompt_len=prompt, output_len=output, n=n, beam_width=beam_width,
        priority=priority, conversation_id=conversation_id, turn=turn,
        prefix_id_values=ids, prefix_id_offsets=offsets,
        prefix_block_tokens=block if ids is not None else 0,
        source=f"workload:{spec.name} (seed {spec.seed})",
    )


def prefix_identities(prompt, which_system, chain, block: int, system_blocks: int, num_systems: int):
    """CSR identities: a system prompt's run of ids (if any), then the request's chain's ids.

    Per request: ``prompt`` tokens, ``which_system`` (its system prompt, -1 for none) and ``chain``
    (who owns the rest of its blocks). ``block`` tokens per identity; each system prompt is
    ``system_blocks`` identities long (its first ``system_blocks * block`` tokens), one of
    ``num_systems``. (``pagesim.traces.inference_perf`` builds its shared-prefix prompts with this too.)

    Ids ``[0, num_systems * system_blocks)`` are the system prompts'; chain ``c``'s ids start at
    ``num_systems * system_blocks + c * stride`` with a stride larger than any prompt's block
    count, so position ``p`` of a chain has the same id in every request of that chain.
    """
    counts = -(-prompt // block)
    offsets = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    row = np.repeat(np.arange(len(prompt)), counts)
    position = np.arange(offsets[-1]) - offsets[row]
    own_start = np.where(which_system >= 0, system_blocks, 0)[row]
    stride = int(counts.max()) + 1
    chain_base = num_systems * system_blocks + chain.astype(np.int64) * stride
    values = np.where(
        position < own_start,
        which_system[row] * system_blocks + position,
        chain_base[row] + position - own_start,
    )
    return values, offsets
