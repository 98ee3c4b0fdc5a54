"""Contiguous (Orca-style) reservation: exact first-fit placements, coalescing, fragmentation."""

from __future__ import annotations

import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagesim.engine.policy.baselines.contiguous import ContiguousAllocator


def test_first_fit_placements_and_reuse_of_a_freed_hole():
    allocator = ContiguousAllocator(100, "oracle", max_model_len=100)
    assert allocator.allocate("a", 10, 0) == 0
    assert allocator.allocate("b", 15, 5) == 10
    assert allocator.allocate("c", 30, 0) == 30
    assert allocator.holes == [(60, 40)]
    allocator.free("b")
    assert allocator.holes == [(10, 20), (60, 40)]
    # first fit: the first hole big enough, not the best-fitting one
    assert allocator.allocate("d", 15, 0) == 10
    assert allocator.holes == [(25, 5), (60, 40)]
    assert allocator.allocate("e", 10, 0) == 60  # the 5-slot hole is too small
    assert allocator.holes == [(25, 5), (70, 30)]
    assert allocator.allocate("f", 5, 0) == 25  # an exact fit removes the hole
    assert allocator.holes == [(70, 30)]
    allocator.check()


def test_free_coalesces_with_both_neighbours():
    allocator = ContiguousAllocator(100, "oracle", max_model_len=100)
    for request_id, start in (("a", 0), ("b", 10), ("c", 20), ("d", 30), ("e", 40)):
        assert allocator.allocate(request_id, 10, 0) == start
    allocator.free("b")
    allocator.free("d")
    assert allocator.holes == [(10, 10), (30, 10), (50, 50)]
    allocator.free("c")  # touches both holes: one merge of three pieces
    assert allocator.holes == [(10, 30), (50, 50)]
    allocator.free("e")  # touches the hole before and the hole after
    assert allocator.holes == [(10, 90)]
    allocator.free("a")  # touches only the hole after
    assert allocator.holes == [(0, 100)]
    allocator.check()


def test_external_fragmentation_is_real():
    allocator = ContiguousAllocator(100, "oracle", max_model_len=100)
    for index in range(10):
        assert allocator.allocate(index, 10, 0) == 10 * index
    for index in range(0, 10, 2):
        allocator.free(index)
    assert allocator.holes == [(0, 10), (20, 10), (40, 10), (60, 10), (80, 10)]
    assert allocator.num_free_slots == 50
    assert allocator.largest_hole_slots == 10
    assert allocator.external_fragmentation_slots == 40
    # half the memory is free, yet a 20-token request cannot be placed
    assert not allocator.can_allocate(20, 0)
    assert allocator.allocate("big", 20, 0) is None
    assert "big" not in allocator
    assert allocator.can_allocate(10, 0)
    allocator.check()


@pytest.mark.parametrize(
    ("reservation", "prompt_len", "output_len", "expected_slots"),
    [
        ("max", 5, 3, 1000),
        ("max", 1000, 0, 1000),
        ("pow2", 1, 0, 1),  # the prompt plus the output rounded up to a power of two (paper §6.1)
        ("pow2", 5, 3, 9),
        ("pow2", 5, 4, 9),
        ("pow2", 5, 25, 37),  # "if the true output length is 25, it reserves 32 positions"
        ("pow2", 300, 212, 556),
        ("pow2", 600, 300, 1000),  # 600 + 512 capped at max_model_len
        ("oracle", 5, 4, 9),
        ("oracle", 700, 300, 1000),
    ],
)
def test_reservation_sizes(reservation, prompt_len, output_len, expected_slots):
    allocator = ContiguousAllocator(4096, reservation, max_model_len=1000)
    assert allocator.reservation_slots(prompt_len, output_len) == expected_slots
    assert allocator.allocate("r", prompt_len, output_len) == 0
    assert allocator.num_reserved_slots == expected_slots
    assert allocator.holes == [(expected_slots, 4096 - expected_slots)]


def test_accounting_of_written_and_reserved_slots():
    allocator = ContiguousAllocator(1000, "max", max_model_len=100)
    assert allocator.memory_utilization == 0.0
    allocator.allocate("a", 10, 20)  # the prompt is written by its prefill
    assert (allocator.num_used_slots, allocator.num_reserved_slots) == (10, 100)
    assert allocator.internal_fragmentation_slots == 90
    allocator.append_tokens("a", 5)
    assert allocator.num_used_slots == 15
    assert allocator.internal_fragmentation_slots == 85
    assert allocator.memory_utilization == pytest.approx(0.15)
    allocator.allocate("b", 50, 0)
    assert allocator.start_slot("b") == 100
    assert allocator.memory_utilization == pytest.approx(65 / 200)
    assert allocator.num_free_slots == 800
    allocator.free("a")
    assert (allocator.num_used_slots, allocator.num_reserved_slots) == (50, 100)
    assert allocator.external_fragmentation_slots == 100  # the 100-slot hole before "b"
    allocator.check()


def test_append_may_fill_but_not_pass_the_reservation():
    allocator = ContiguousAllocator(100, "oracle", max_model_len=100)
    allocator.allocate("a", 4, 3)
    allocator.append_tokens("a", 3)
    with pytest.raises(ValueError, match="past its reservation of 7 slots"):
        allocator.append_tokens("a", 1)
    assert allocator.num_used_slots == 7


def test_errors():
    allocator = ContiguousAllocator(100, "oracle", max_model_len=64)
    allocator.allocate("a", 10, 0)
    with pytest.raises(ValueError, match="already holds a reservation"):
        allocator.allocate("a", 10, 0)
    with pytest.raises(ValueError, match="exceeds max_model_len 64"):
        allocator.allocate("b", 60, 5)
    with pytest.raises(ValueError, match="prompt_len must be a positive int"):
        allocator.allocate("b", 0, 5)
    with pytest.raises(ValueError, match="output_len must be a non-negative int"):
        allocator.allocate("b", 1, -1)
    with pytest.raises(ValueError, match="holds no reservation"):
        allocator.free("b")
    with pytest.raises(ValueError, match="holds no reservation"):
        allocator.append_tokens("b", 1)
    with pytest.raises(ValueError, match="num_tokens must be a non-negative int"):
        allocator.append_tokens("a", -1)
    # a max-length slab bigger than the whole space can never fit: an error, not a wait
    too_small = ContiguousAllocator(100, "max", max_model_len=128)
    with pytest.raises(ValueError, match="can never fit in capacity_slots=100"):
        too_small.allocate("a", 1, 1)
    with pytest.raises(ValueError, match="can never fit"):
        too_small.can_allocate(1, 1)
    with pytest.raises(ValueError, match="reservation must be one of max, pow2, oracle"):
        ContiguousAllocator(100, "best", max_model_len=10)
    with pytest.raises(ValueError, match="capacity_slots must be a positive int"):
        ContiguousAllocator(0, "max", max_model_len=10)
    with pytest.raises(ValueError, match="max_model_len must be a positive int"):
        ContiguousAllocator(10, "max", max_model_len=None)  # type: ignore[arg-type]
    allocator.check()


class ContiguousMachine(RuleBasedStateMachine):
    """Drive the allocator and a slot-by-slot occupancy map side by side."""

    @initialize(
        capacity_slots=st.integers(1, 64),
        reservation=st.sampled_from(["max", "pow2", "oracle"]),
        max_model_len=st.integers(1, 48),
    )
    def setup(self, capacity_slots, reservation, max_model_len):
        self.allocator = ContiguousAllocator(capacity_slots, reservation, max_model_len)
        self.owner_by_slot: list[int | None] = [None] * capacity_slots
        self.written_by_request: dict[int, int] = {}
        self.next_request_id = 0

    def _model_first_fit(self, num_slots):
        run_start, run_length = 0, 0
        for slot, owner in enumerate(self.owner_by_slot):
            if owner is None:
                if run_length == 0:
                    run_start = slot
                run_length += 1
                if run_length == num_slots:
                    return run_start
            else:
                run_length = 0
        return None

    @rule(data=st.data())
    def allocate(self, data):
        max_model_len = self.allocator.max_model_len
        prompt_len = data.draw(st.integers(1, max_model_len), label="prompt_len")
        output_len = data.draw(st.integers(0, max_model_len - prompt_len), label="output_len")
        num_slots = self.allocator.reservation_slots(prompt_len, output_len)
        request_id = self.next_request_id
        self.next_request_id += 1
        note(f"allocate({request_id}, {prompt_len}, {output_len}) -> {num_slots} slots")
        if num_slots > self.allocator.capacity_slots:
            with pytest.raises(ValueError):
                self.allocator.allocate(request_id, prompt_len, output_len)
            return
        expected_start = self._model_first_fit(num_slots)
        assert self.allocator.can_allocate(prompt_len, output_len) == (expected_start is not None)
        assert self.allocator.allocate(request_id, prompt_len, output_len) == expected_start
        if expected_start is not None:
            for slot in range(expected_start, expected_start + num_slots):
                self.owner_by_slot[slot] = request_id
            self.written_by_request[request_id] = prompt_len

    @precondition(lambda self: self.written_by_request)
    @rule(data=st.data())
    def append(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.written_by_request)), label="request")
        room = self.owner_by_slot.count(request_id) - self.written_by_request[request_id]
        num_tokens = data.draw(st.integers(0, room), label="num_tokens")
        note(f"append_tokens({request_id}, {num_tokens})")
        self.allocator.append_tokens(request_id, num_tokens)
        self.written_by_request[request_id] += num_tokens

    @precondition(lambda self: self.written_by_request)
    @rule(data=st.data())
    def free(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.written_by_request)), label="request")
        note(f"free({request_id})")
        self.allocator.free(request_id)
        del self.written_by_request[request_id]
        self.owner_by_slot = [
            None if owner == request_id else owner
            for owner in self.owner_by_slot
        ]

    @invariant()
    def matches_model(self):
        if not hasattr(self, "allocator"):
            return
        self.allocator.check()
        allocator = self.allocator
        free_slots = self.owner_by_slot.count(None)
        assert allocator.num_free_slots == free_slots
        assert allocator.num_reserved_slots + allocator.num_free_slots == allocator.capacity_slots
        assert allocator.num_used_slots == sum(self.written_by_request.values())
        # holes are exactly the maximal runs of free slots
        runs, slot = [], 0
        while slot < len(self.owner_by_slot):
            if self.owner_by_slot[slot] is None:
                start = slot
                while slot < len(self.owner_by_slot) and self.owner_by_slot[slot] is None:
                    slot += 1
                runs.append((start, slot - start))
            else:
                slot += 1
        assert allocator.holes == runs
        largest = max((size for _, size in runs), default=0)
        assert allocator.external_fragmentation_slots == free_slots - largest


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
