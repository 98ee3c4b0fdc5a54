"""The waiting queue under priority scheduling: requests ordered by (priority, arrival time, id).

vLLM 0.33 (``vllm/v1/core/sched/request_queue.py``, ``PriorityRequestQueue``; the order is
``Request.__lt__`` in ``vllm/v1/request.py``) keeps ``SchedulerConfig(policy="priority")``'s waiting
requests in a heap ordered by ``(priority, arrival_time, request_id)``: a smaller ``priority`` is
more important; ties go to the earlier arrival, then to the smaller id. A preempted request goes
back into the same heap ("prepend" is an ordinary push there), so it is not necessarily first.

``PriorityWaitingQueue`` has the part of ``collections.deque``'s interface the step orders use on
``Scheduler.waiting`` (``[0]`` for the head, ``popleft``, ``append`` / ``appendleft`` / ``extendleft``
all as a push, ``remove``, ``in``, ``len``, iteration in pop order), so the FCFS deque and this
queue are interchangeable. Request ids are unique in a scheduler, so the key is a total order and
any heap pops the requests in the same order as vLLM's.

Invariant: ``_heap`` is a binary min-heap of ``(priority, arrival_time_s, request_id, request)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from pagesim.engine.policy.scheduling.request import Request

#: ``scheduling_policy`` values (vLLM's ``--scheduling-policy``): first come first served, or priority.
SCHEDULING_POLICIES = ("fcfs", "priority")

_Entry = tuple[int, float, str, Request]


def priority_key(request: Request) -> tuple[int, float, str]:
    """vLLM 0.33's ``Request.__lt__`` order: (priority, arrival time, request id)."""
    return (request.priority, request.arrival_time_s, request.request_id)


class PriorityWaitingQueue:
    """A min-heap of waiting requests by ``priority_key`` (module docstring)."""

    __slots__ = ("_heap",)

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._heap: list[_Entry] = [(*priority_key(r), r) for r in requests]
        heapq.heapify(self._heap)

    def append(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time_s, request.request_id, request))

    # NOTE: vLLM's ``prepend_request`` is a push too: a preempted request takes its place by key.
    appendleft = append

    def extendleft(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.append(request)

    def popleft(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty waiting queue")
        return heapq.heappop(self._heap)[3]

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("a priority waiting queue gives only its head, [0]")
        if not self._heap:
            raise IndexError("the waiting queue is empty")
        return self._heap[0][3]

    def remove(self, request: Request) -> None:
        """Take ``request`` out (O(n), as vLLM's ``remove_request``; only aborts use it)."""
        for i, entry in enumerate(self._heap):
            if entry[3] is request:
                last = self._heap.pop()
                if i < len(self._heap):
                    self._heap[i] = last
                    heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id!r} is not waiting")

    def __contains__(self, request: object) -> bool:
        return any(entry[3] is request for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """The requests in pop order (O(n log n); for checks and reports)."""
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))
