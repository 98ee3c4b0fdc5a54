"""Preemption plug-ins: *which* running request gives up its blocks, and *how*.

When a running request cannot get the block it needs for its next tokens, the scheduler preempts
victims until it can. Two independent choices, each a small class registered by name:

Victim (``VICTIM_POLICIES``), chosen among the running requests not yet scheduled this step
(``candidates``, in running-list order; the request that needs the block is ``candidates[0]``):

- ``running-tail``: the last request of the running list. This is literally what vLLM does
  (v0 ``running.pop()``, v1 ``self.running.pop()`` under FCFS); the running list is kept in
  (re-)admission order, so the tail is the request admitted most recently.
- ``latest-arrival``: the request that arrived last (ties: admitted last). Under FCFS this differs
  from ``running-tail`` only when an early request was preempted and re-admitted late.
- ``fewest-blocks`` / ``most-blocks``: by GPU blocks held (ties: latest arrival); the first is the
  cheapest to recompute or swap, the second frees the most memory per preemption.
- ``priority``: the least important (largest ``priority`` value), ties latest arrival, as vLLM
  v1's priority scheduling orders victims (``max((priority, arrival_time))``); unlike vLLM, which
  may also un-schedule a request already scheduled this step, this plug-in chooses only among the
  requests not yet scheduled (ties: admitted last, where vLLM's ``max`` takes the first in running
  order). vLLM 0.33's own rule, with its priority waiting queue, is ``scheduling_policy="priority"``
  (config.py, ``steps/vllm_v1.py``).

Mode (``PREEMPTION_MODES``) for the chosen victim:

- ``recompute``: drop its blocks; it re-enters the front of the waiting queue and re-prefills its
  prompt plus everything generated so far (its cached blocks may still be hit).
- ``swap``: copy its blocks to the CPU swap pool; it waits in the swapped queue.
- ``vllm-v0``: vLLM v0's default rule: recompute when the request runs a single sequence, swap when
  it runs several (parallel samples or beams, whose shared blocks recompute would not share).
- ``cost``: ask a caller-supplied function for the cost of each mode and pick the cheaper one
  (``CostPreemption(cost_fn)``, ``cost_fn(request, mode, num_blocks, num_tokens) -> seconds``).

If the chosen mode is swap and the CPU pool lacks room, the scheduler falls back to recompute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, Literal

from pagesim.engine.policy.plugins.lookup import lookup
from pagesim.engine.policy.scheduling.request import Request

Mode = Literal["recompute", "swap"]


# --------------------------------------------------------------------- victims
class VictimPolicy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def choose(self, candidates: Sequence[Request]) -> Request:
        """Pick the victim among ``candidates`` (never empty)."""


def _arrival_order(r: Request) -> tuple[float, int]:
    return (r.arrival_time_s, r.admitted_seq_no)


def _num_gpu_blocks(r: Request) -> int:
    return sum(s.num_held_blocks for s in r.live_seqs)


class RunningTailVictim(VictimPolicy):
    name = "running-tail"

    def choose(self, candidates: Sequence[Request]) -> Request:
        return candidates[-1]


class LatestArrivalVictim(VictimPolicy):
    name = "latest-arrival"

    def choose(self, candidates: Sequence[Request]) -> Request:
        return max(candidates, key=_arrival_order)


class FewestBlocksVictim(VictimPolicy):
    name = "fewest-blocks"

    def choose(self, candidates: Sequence[Request]) -> Request:
        return min(candidates, key=lambda r: (_num_gpu_blocks(r), -r.arrival_time_s, -r.admitted_seq_no))


class MostBlocksVictim(VictimPolicy):
    name = "most-blocks"

    def choose(self, candidates: Sequence[Request]) -> Request:
        return max(candidates, key=lambda r: (_num_gpu_blocks(r), *_arrival_order(r)))


class PriorityVictim(VictimPolicy):
    name = "priority"

    def choose(self, candidates: Sequence[Request]) -> Request:
        return max(candidates, key=lambda r: (r.priority, *_arrival_order(r)))


VICTIM_POLICIES: dict[str, type[VictimPolicy]] = {
    cls.name: cls
    for cls in (RunningTailVictim, LatestArrivalVictim, FewestBlocksVictim, MostBlocksVictim, PriorityVictim)
}


# ----------------------------------------------------------------------- modes
class PreemptionMode(ABC):
    name: ClassVar[str]

    @abstractmethod
    def choose(self, request: Request, *, num_blocks: int, num_tokens: int) -> Mode:
        """``num_blocks``: GPU blocks a swap would move; ``num_tokens``: tokens a recompute redoes."""


class RecomputeMode(PreemptionMode):
    name = "recompute"

    def choose(self, request: Request, *, num_blocks: int, num_tokens: int) -> Mode:
        return "recompute"


class SwapMode(PreemptionMode):
    name = "swap"

    def choose(self, request: Request, *, num_blocks: int, num_tokens: int) -> Mode:
        return "swap"


class VllmV0Mode(PreemptionMode):
    name = "vllm-v0"

    def choose(self, request: Request, *, num_blocks: int, num_tokens: int) -> Mode:
        return "recompute" if request.max_running_seqs == 1 else "swap"


CostFn = Callable[[Request, Mode, int, int], float]


class CostPreemption(PreemptionMode):
    """Pick the cheaper mode by ``cost_fn(request, mode, num_blocks, num_tokens)`` (seconds).
    Ties go to recompute, which holds no CPU memory."""

    name = "cost"

    def __init__(self, cost_fn: CostFn | None = None):
        self.cost_fn = cost_fn

    def choose(self, request: Request, *, num_blocks: int, num_tokens: int) -> Mode:
        if self.cost_fn is None:
            raise ValueError("preemption mode 'cost' needs a cost function (CostPreemption(cost_fn))")
        swap_s = self.cost_fn(request, "swap", num_blocks, num_tokens)
        recompute_s = self.cost_fn(request, "recompute", num_blocks, num_tokens)
        return "swap" if swap_s < recompute_s else "recompute"


PREEMPTION_MODES: dict[str, type[PreemptionMode]] = {
    cls.name: cls for cls in (RecomputeMode, SwapMode, VllmV0Mode, CostPreemption)
}


def _make(spec, registry: dict, base: type, kind: str):
    return spec if isinstance(spec, base) else lookup(registry, spec, kind)()


def make_victim_policy(spec: str | VictimPolicy) -> VictimPolicy:
    return _make(spec, VICTIM_POLICIES, VictimPolicy, "victim policy")


def make_preemption_mode(spec: str | PreemptionMode) -> PreemptionMode:
    return _make(spec, PREEMPTION_MODES, PreemptionMode, "preemption mode")
