"""The cost-model interface: what one scheduler step asks of the hardware, and how long it takes.

``StepWork`` condenses a ``SchedulerOutput`` into the quantities that decide a step's time:
tokens through the linear layers, query-key pairs of prefill attention, K/V tokens read by decode
attention, sampled sequences, copy-on-write and swapped blocks. It is built in one pass over the
scheduled sequences, so a cost model is O(1) per step whatever the batch. For a model with
sliding-window layers (``window``), the same quantities are also counted as those layers see
them: a query attends at most ``window`` keys, so ``prefill_window_pairs``,
``prefill_window_context_tokens`` and ``decode_window_context_tokens`` cap each at the window.

A ``CostModel`` turns it into a ``StepCost``: seconds per term, reported separately so a user can
see where time goes. ``swap`` is kept apart from the rest (``compute_s``) because the simulator
decides whether it runs synchronously with the step (vLLM v0) or overlapped with it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from pagesim.engine.policy.scheduling.output import SchedulerOutput

#: The terms every cost model reports, in display order.
TERMS = ("linear", "moe", "prefill_attention", "decode_attention", "cache_write", "cow_copy", "tp_comm",
         "ep_comm", "sampling", "kernel_launch", "cpu_overhead", "swap")


def window_pairs(start: int, new: int, window: int) -> int:
    """Causal (query, key) pairs of queries ``[start, start + new)`` that attend at most ``window``
    keys each (themselves included): ``sum(min(p + 1, window))`` over their positions ``p``."""
    a, b = start + 1, start + new  # the keys each query sees, unwindowed, run from a to b
    if b <= window:
        return (a + b) * new // 2
    if a >= window:
        return window * new
    return (a + window) * (window - a + 1) // 2 + window * (b - window)


# NOTE: a value, never changed once built, but not frozen: a frozen dataclass costs four times as
# much to build, and the simulator builds a few per step it runs (hashable all the same).
@dataclass(slots=True, unsafe_hash=True)
class StepWork:
    num_seqs: int = 0  # sequences computing tokens this step
    num_tokens: int = 0  # tokens computed (prefill chunks + decodes)
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    prefill_attention_pairs: int = 0  # causal (query, key) pairs of the prefill chunks
    prefill_context_tokens: int = 0  # cached K/V tokens the prefill chunks read
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # K/V tokens read by decode attention (incl. the new token)
    num_sampled: int = 0  # sequences that sample a token
    num_cow_blocks: int = 0
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0
    # The same as sliding-window layers see them (0 for a model without such layers).
    prefill_window_pairs: int = 0
    prefill_window_context_tokens: int = 0
    decode_window_context_tokens: int = 0
    block_size: int | None = 16  # None: a contiguous cache (no blocks)
    # vLLM 0.15's offloading connector: the store entries its CPU manager walked for this step's
    # offers and the offers it refused (SchedulerOutput's; scheduler CPU time, not GPU work)
    offload_scan_entries: int = 0
    offload_refusals: int = 0

    @classmethod
    def from_output(cls, output: SchedulerOutput, block_size: int | None, window: int | None = None) -> StepWork:
        if window is not None:
            return cls._with_window(output, block_size, window)
        num_tokens = prefill_seqs = prefill_tokens = pairs = prefill_ctx = 0
        decode_seqs = decode_ctx = sampled = 0
        for s in output.scheduled:
            new = s.num_new_tokens
            start = s.num_computed_tokens
            num_tokens += new
            if s.samples:
                sampled += 1
            if new == 1 and s.samples and start > 0:
                decode_seqs += 1
                decode_ctx += start + 1
            else:
                prefill_seqs += 1
                prefill_tokens += new
                prefill_ctx += start
                pairs += new * start + new * (new + 1) // 2
        return cls(
            num_seqs=len(output.scheduled), num_tokens=num_tokens,
            num_prefill_seqs=prefill_seqs, num_prefill_tokens=prefill_tokens,
            prefill_attention_pairs=pairs, prefill_context_tokens=prefill_ctx,
            num_decode_seqs=decode_seqs, decode_context_tokens=decode_ctx, num_sampled=sampled,
            num_cow_blocks=len(output.blocks_to_copy),
            num_swap_out_blocks=len(output.blocks_to_swap_out),
            num_swap_in_blocks=len(output.blocks_to_swap_in),
            block_size=block_size, offload_scan_entries=output.offload_scan_entries,
            offload_refusals=output.offload_refusals,
        )

    @classmethod
    def _with_window(cls, output: SchedulerOutput, block_size: int | None, window: int) -> StepWork:
        work = cls.from_output(output, block_size)
        win_pairs = win_ctx = win_decode = 0
        for s in output.scheduled:
            new, start = s.num_new_tokens, s.num_computed_tokens
            if new == 1 and s.samples and start > 0:
                win_decode += min(start + 1, window)
            else:
                win_pairs += window_pairs(start, new, window)
                win_ctx += min(start, window - 1)
        return replace(work, prefill_window_pairs=win_pairs, prefill_window_context_tokens=win_ctx,
                       decode_window_context_tokens=win_decode)


@dataclass(frozen=True, slots=True)
class StepCost:
    terms: dict[str, float]  # seconds per term (TERMS), swap included

    @property
    def swap_s(self) -> float:
        return self.terms.get("swap", 0.0)

    @property
    def compute_s(self) -> float:
        """Everything but the swap transfers."""
        return sum(v for k, v in self.terms.items() if k != "swap")

    @property
    def total_s(self) -> float:
        """The step's time when swaps run synchronously with it."""
        return sum(self.terms.values())


class CostModel(ABC):
    """Seconds a step takes on a deployment; ``describe()`` says what the model assumes."""

    name: str = "cost model"
    #: The sliding window of the model's windowed layers, which ``StepWork`` counts for it (None:
    #: the model has none, or the cost model does not look at windows).
    attention_window: int | None = None

    @abstractmethod
    def step_cost(self, work: StepWork) -> StepCost: ...

    def decode_attention_s(self, work: StepWork, decode_context_tokens: np.ndarray,
                           decode_window_context_tokens: np.ndarray | None = None) -> np.ndarray | None:
        """The ``decode_attention`` term of steps that are ``work`` but for their decode context
        (and, for a model with ``attention_window``, their windowed decode context), vectorized,
        bit for bit what ``step_cost`` gives each; ``None`` if the model has no such form
        (skip-ahead then asks ``step_cost`` step by step). A model that implements it promises
        that no other term depends on either context."""
        return None

    def decode_attention_fn(self, work: StepWork) -> Callable[[int, int], float] | None:
        """The ``decode_attention`` term of ``work`` as a function of its decode context and its
        windowed decode context (``decode_window_context_tokens``; 0 without a window) alone, in
        Python floats, bit for bit what ``step_cost`` gives (``None``: the model has none).
        Skip-ahead uses it for short skips, where a vectorized call costs more than the
        arithmetic; the same promise as ``decode_attention_s``. A function that is
        ``context * per_token / bw * overhead`` for any context above 0 (the window's ignored)
        may say so with an attribute ``linear_in_context = (per_token, bw, overhead)``: skip-ahead
        then writes those operations out in its loop instead of calling it."""
        return None

    def usage_snapshot(self) -> object:
        """What ``step_cost`` records about its calls (the calibrated model counts extrapolations),
        so that skip-ahead, which costs steps it may not take, can put it back
        (``restore_usage``); ``None`` for a model that records nothing."""
        return None

    def restore_usage(self, snapshot: object) -> None:
        pass

    def swap_seconds(self, num_blocks: int, block_size: int) -> float:
        """Time to move ``num_blocks`` blocks over the host link (one direction)."""
        return self.step_cost(StepWork(num_swap_out_blocks=num_blocks, block_size=block_size)).swap_s

    def offload_seconds(self, num_blocks: int, block_size: int | None, *, to_gpu: bool) -> float:
        """Time to copy ``num_blocks`` blocks between the GPU cache and the offload store over the
        host link: loads (``to_gpu``) as swap-ins, stores as swap-outs (the same copies)."""
        work = (StepWork(num_swap_in_blocks=num_blocks, block_size=block_size) if to_gpu
                else StepWork(num_swap_out_blocks=num_blocks, block_size=block_size))
        return self.step_cost(work).swap_s

    def describe(self) -> dict:
        return {"name": self.name}
