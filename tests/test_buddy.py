"""Buddy placement (pagesim/engine/policy/baselines/buddy.py) and the contiguous allocator that uses it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.policy.baselines.buddy import BuddySpace, order_for
from pagesim.engine.policy.baselines.contiguous import ContiguousAllocator
from tests.conftest import scaled_examples


def test_capacity_is_cut_into_aligned_power_of_two_arenas():
    space = BuddySpace(15_728)  # the paper's OPT-13B cache: 12 GiB / 800 KiB per token
    assert space.holes() == [(0, 8192), (8192, 4096), (12288, 2048), (14336, 1024), (15360, 256),
                             (15616, 64), (15680, 32), (15712, 16)]
    assert space.num_free_slots == 15_728 and space.largest_free_slots == 8192


def test_requests_round_up_split_and_merge_back():
    space = BuddySpace(64)
    assert order_for(1) == 0 and order_for(5) == 3 and order_for(8) == 3 and order_for(9) == 4
    a = space.allocate(5)  # 8 slots: 64 -> 32 + 16 + 8 + [8]
    assert a == (0, 8)
    assert space.holes() == [(8, 8), (16, 16), (32, 32)]
    b = space.allocate(16)
    assert b == (16, 16)
    c = space.allocate(3)  # 4 slots from the free 8 at 8
    assert c == (8, 4) and space.holes() == [(12, 4), (32, 32)]
    space.free(*a)
    assert space.holes() == [(0, 8), (12, 4), (32, 32)]  # 0's buddy (8) is split: no merge
    space.free(*c)
    assert space.holes() == [(0, 16), (32, 32)]
    space.free(*b)
    assert space.holes() == [(0, 64)]
    space.check([])


def test_blocks_never_merge_across_arenas():
    space = BuddySpace(24)  # arenas 16 + 8
    x, y = space.allocate(16), space.allocate(8)
    assert (x, y) == ((0, 16), (16, 8))
    space.free(*y)
    space.free(*x)
    assert space.holes() == [(0, 16), (16, 8)]
    assert not space.fits_ever(17) and space.fits_ever(16)


def test_the_paper_max_baseline_holds_seven_2048_slot_slabs():
    allocator = ContiguousAllocator(15_728, "max", max_model_len=2048, placement="buddy")
    starts = [allocator.allocate(i, 100, 200) for i in range(8)]
    # smallest sufficient free block first: the 2048 arena, then the 4096 one split, then the 8192 one
    assert starts[:7] == [12288, 8192, 10240, 0, 2048, 4096, 6144] and starts[7] is None
    allocator.check()


def test_buddy_rounds_an_oracle_reservation_up():
    allocator = ContiguousAllocator(1024, "oracle", max_model_len=1024, placement="buddy")
    assert allocator.allocate("a", 161, 338) == 0  # 499 slots -> a 512-slot block
    assert allocator.num_reserved_slots == 512 and allocator.internal_fragmentation_slots == 512 - 161
    with pytest.raises(ValueError, match="can never fit"):
        ContiguousAllocator(1000, "oracle", max_model_len=1000, placement="buddy").allocate("b", 600, 10)
    with pytest.raises(ValueError, match="placement must be one of"):
        ContiguousAllocator(100, "oracle", max_model_len=100, placement="best-fit")


@settings(max_examples=scaled_examples(100), deadline=None)
@given(capacity=st.integers(1, 300),
       ops=st.lists(st.tuples(st.booleans(), st.integers(1, 300), st.integers(0, 10**6)), max_size=60))
def test_buddy_space_tiles_the_capacity_under_any_sequence(capacity, ops):
    space = BuddySpace(capacity)
    held: list[tuple[int, int]] = []
    for alloc, size, pick in ops:
        if alloc or not held:
            block = space.allocate(size)
            if block is None:
                assert not space.can_allocate(size)
            else:
                assert block[1] == 1 << order_for(size) and block[1] >= size
                held.append(block)
        else:
            space.free(*held.pop(pick % len(held)))
        space.check(held)
        assert space.num_free_slots + sum(s for _, s in held) == capacity
    for block in held:
        space.free(*block)
    assert space.num_free_slots == capacity and len(space.holes()) == bin(capacity).count("1")


def test_a_request_buddy_placement_can_never_hold_is_rejected_not_stalled():
    from pagesim.engine.policy import ContiguousScheduler, Request, make_config

    # 7,008 slots = arenas 4,096 + 2,048 + 512 + 256 + 64 + 32: a 6,000-slot Max slab fits the
    # capacity but no buddy block
    config = make_config("pagesim", num_gpu_blocks=438, block_size=16, max_model_len=6000)
    sched = ContiguousScheduler(config, reservation="max", placement="buddy")
    request = Request("r0", prompt_len=10, max_tokens=5)
    assert not sched.add_request(request) and "cannot all be placed in 7008" in request.reject_reason
    # eight oracle slabs of 1,025 slots each take a 2,048-slot block: 16,384 > 15,728
    config = make_config("pagesim", num_gpu_blocks=983, block_size=16, max_model_len=2048)
    sched = ContiguousScheduler(config, reservation="oracle", placement="buddy")
    request = Request("r1", prompt_len=1000, max_tokens=25, n=8)
    assert not sched.add_request(request) and "16384 slots" in request.reject_reason
    assert sched.add_request(Request("r2", prompt_len=1000, max_tokens=25, n=7))


def test_writes_stop_at_the_requested_reservation_not_the_buddy_block():
    allocator = ContiguousAllocator(1024, "oracle", max_model_len=1024, placement="buddy")
    allocator.allocate("a", 100, 29)  # 129 requested, a 256-slot block
    allocator.append_tokens("a", 29)
    with pytest.raises(ValueError, match="past its reservation of 129 slots"):
        allocator.append_tokens("a", 1)
