"""What every step order shares: the record of one ``schedule()`` call in progress (``Step``) and
the interface a step order implements (``StepOrder``).

A step order decides *which* requests run this step and in what order; it acts only through the
scheduler's primitives (``Scheduler.run``, ``choose_mode``, ``preempt``, ``requeue``, ``swap_in``,
``admit``, ``reject_queued``) and its queues, so block
accounting, request state and the decision record are the same whichever order runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from engine.policy.output import Pair, ScheduledSequence

if TYPE_CHECKING:
    from engine.policy.scheduler import Scheduler


@dataclass(slots=True)
class Step:
    """What one ``schedule()`` call has decided so far."""

    step: int
    token_budget: int
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    tokens_per_request: dict[str, int] = field(default_factory=dict)
    new: dict[str, int] = field(default_factory=dict)
    resumed: dict[str, int] = field(default_factory=dict)
    swapped_in: list[str] = field(default_factory=list)
    preempted: list[tuple[str, str]] = field(default_factory=list)
    copies: list[Pair] = field(default_factory=list)
    swap_out: list[Pair] = field(default_factory=list)
    swap_in: list[Pair] = field(default_factory=list)
    loads: list[Pair] = field(default_factory=list)  # KV offloading: (slot, GPU block)
    offload_hits: dict[str, int] = field(default_factory=dict)  # request -> tokens loaded
    # Why the waiting pass stopped at a head it did not admit, if an order says (the skip-ahead
    # of fast_forward.py relies on it): "seq_limit", "no_plan", "blocks" or "budget"; "empty"
    # when the queue ran out; "swapped" when the order admits nothing while a request is swapped
    # out (vllm-v0); None when the order does not say or the pass did not run.
    waiting_stop: str | None = None
    # The same for the swapped pass and its queue's head.
    swapped_stop: str | None = None

    def only_computes(self) -> bool:
        """Whether the step admitted, resumed, swapped, preempted, copied and loaded nothing: it only
        computed tokens of running requests (with no rejection or offload store pending, a pure step)."""
        return not (self.new or self.resumed or self.swapped_in or self.preempted or self.copies or self.swap_out
                    or self.swap_in or self.loads)

    def reorder(self, rank: dict[str, int]) -> None:
        """Put the scheduled requests in the order ``rank`` gives (stable within a request)."""
        self.scheduled.sort(key=lambda s: rank[s.request_id])
        self.tokens_per_request = dict(sorted(self.tokens_per_request.items(), key=lambda kv: rank[kv[0]]))


class StepOrder(ABC):
    name: ClassVar[str]

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.config = scheduler.config

    def rejection_reason(self, request) -> str | None:
        """Why this order cannot serve ``request`` at all (checked on arrival), or ``None``."""
        return None

    @abstractmethod
    def schedule(self, st: Step) -> None:
        """Fill ``st`` with this step's decisions (called only while requests are unfinished)."""
