"""Priority scheduling (vLLM 0.33's ``SchedulerConfig(policy="priority")``): the waiting queue
against a plain sorted-list model, and the setting refused where it does not apply, by name.

The queue (``pagesim/engine/policy/scheduling/waiting_queue.py``) must pop requests in the order vLLM's heap does,
``(priority, arrival time, request id)``, whatever mix of pushes (new arrivals, preempted
requests put back with ``appendleft``), pops and removals (aborts) reaches it; the model is a
list kept sorted by that key.
"""

from __future__ import annotations

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagesim.engine.policy import make_config
from pagesim.engine.policy.scheduling.request import Request
from pagesim.engine.policy.scheduling.waiting_queue import PriorityWaitingQueue, priority_key


class PriorityQueueAgainstSortedList(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.queue = PriorityWaitingQueue()
        self.model: list[Request] = []
        self.num_made = 0

    def _push(self, request: Request, front: bool) -> None:
        (self.queue.appendleft if front else self.queue.append)(request)
        self.model.append(request)
        self.model.sort(key=priority_key)

    @rule(priority=st.integers(-2, 3), arrival=st.sampled_from([0.0, 0.5, 1.0, 2.5]), front=st.booleans())
    def push(self, priority, arrival, front):
        # ids drawn so that their string order differs from their creation order (r10 < r9)
        request = Request(f"r{(self.num_made * 7) % 23}-{self.num_made}", prompt_len=1, max_tokens=1,
                          arrival_time_s=arrival, priority=priority)
        self.num_made += 1
        note(f"push {request.request_id} ({priority}, {arrival}) {'front' if front else 'back'}")
        self._push(request, front)

    @precondition(lambda self: self.model)
    @rule()
    def pop(self):
        assert self.queue[0] is self.model[0]
        assert self.queue.popleft() is self.model.pop(0)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        request = data.draw(st.sampled_from(self.model))
        note(f"remove {request.request_id}")
        self.queue.remove(request)
        self.model.remove(request)
        assert request not in self.queue

    @invariant()
    def same_order(self):
        assert len(self.queue) == len(self.model) and bool(self.queue) == bool(self.model)
        assert list(self.queue) == self.model
        assert all(r in self.queue for r in self.model)


PriorityQueueAgainstSortedList.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_priority_queue_pops_in_vllms_order = PriorityQueueAgainstSortedList.TestCase


def test_an_empty_queue_says_so():
    queue = PriorityWaitingQueue()
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(IndexError):
        queue[0]
    with pytest.raises(ValueError, match="'x' is not waiting"):
        queue.remove(Request("x", prompt_len=1, max_tokens=1))


@pytest.mark.parametrize("settings_, words", [
    (dict(scheduling_policy="lottery"), "scheduling_policy must be one of fcfs, priority, got 'lottery'"),
    (dict(scheduling_policy="priority", victim_policy="fewest-blocks"), "the victim plug-in ('fewest-blocks')"),
    (dict(scheduling_policy="priority", preemption_mode="swap"), "preempts by recompute only"),
    (dict(scheduling_policy="priority", num_offload_blocks=8), "with KV offloading is not modelled yet"),
])
def test_a_policy_it_cannot_run_is_one_clear_error(settings_, words):
    with pytest.raises(ValueError, match=None) as info:
        make_config("vllm-v1", **settings_)
    assert words in str(info.value)


def test_vllm_v0_order_refuses_priority_scheduling():
    with pytest.raises(ValueError, match="scheduling_policy 'priority' .* vllm-v0 step order"):
        make_config("vllm-v0", scheduling_policy="priority")


def test_simulate_takes_the_flag_and_refuses_a_bad_name(capsys):
    from pagesim.engine.cli import main

    with pytest.raises(SystemExit):
        main(["simulate", "--scheduling-policy", "lottery"])
    assert "invalid choice: 'lottery'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "validate"])
def test_the_engine_refuses_priority_scheduling_for_now(command, capsys):
    # an un-scheduled victim's blocks stay registered in the prefix cache unwritten (vLLM 0.33 too):
    # the engine refuses the policy until --check-reference has been run against that
    from pagesim.engine.cli import main

    argv = [command, "--workload", "kwon2023-alpaca", "--rate", "4", "--num-requests", "2", "--model", "tiny",
            "--scheduling-policy", "priority"]
    if command == "validate":
        argv += ["--profile", "tiny-cpu"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--scheduling-policy priority is simulated only for now" in err and err.count("\n") == 1
