"""Telling a stalled scheduler from a busy one, for any executor's step loop.

Invariant: a step that schedules, moves, rejects and preempts nothing while requests are
unfinished is a policy bug, not a wait (rejection keeps unservable requests out, so with nothing running the
scheduler can always admit something), unless requests are parked while their KV loads from the
offload store (``SchedulerOutput.parked``): such a step waits for those copies, up to
``MAX_IDLE_STEPS`` of them. A step that copies to or from the offload store is progress. A step that only preempts (vLLM v0 does this when the
last running request cannot grow) frees blocks for the next one: a few in a row are progress,
``MAX_IDLE_STEPS`` are not. The simulator and the engine both feed every ``SchedulerOutput`` to
a ``ProgressWatch`` and raise their own error when it says the run has stalled.
"""

from __future__ import annotations

from pagesim.engine.policy.scheduling.output import SchedulerOutput

#: Consecutive steps that schedule nothing (only preemptions) before a run is declared stalled.
MAX_IDLE_STEPS = 1000


class ProgressWatch:
    def __init__(self) -> None:
        self.idle_steps = 0  # consecutive steps that computed and moved nothing

    def stalled(self, out: SchedulerOutput, *, decoded: bool = False) -> bool:
        """Count ``out`` and say whether the run has stopped making progress (``decoded``: the step
        also decoded sequences ``out.scheduled`` does not list, as a simulator's decode step does)."""
        if (decoded or out.scheduled or out.blocks_to_swap_out or out.blocks_to_swap_in or out.rejected  # a rejection ends a request
                or out.blocks_to_load or out.blocks_to_store):
            self.idle_steps = 0
        else:
            self.idle_steps += 1
        # (a step whose requests are parked while their loads run waits for those copies)
        return self.idle_steps > MAX_IDLE_STEPS or bool(self.idle_steps and not out.preempted and not out.parked)
