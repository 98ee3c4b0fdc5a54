"""The offload store's eviction policies and the store itself against trusted simple models.

Each built-in offload policy (``lru``, ``arc``, ``lfu``: pagesim/engine/policy/offload/policies.py) has a
reference model here written from its definition (the policy docstrings and vLLM 0.33's
behaviour, /work/scratch/vllm_offload_spec.md section 4) with plain lists, dicts and sorting:

- ``lru``: a key ranks ``(request rank, -position)`` while its request runs (a request gets the
  next counter value the first time it offers, stores or uses a key, a refused offer included,
  as vLLM 0.33's manager records an offer's access before it allocates; a use raises a rank,
  never lowers it) and a fresh ``(counter, 0)`` per key, tail to head, when the request finishes; the smallest
  evictable rank outside ``protected`` goes first;
- ``lfu``: ``(finished requests that reused the key, lru rank)``;
- ``arc``: T1/T2/B1/B2 as lists (least recent first) and the target ``p``, moved exactly as the
  spec says (a new key always enters T1; a reused key moves to T2 when its request finishes;
  eviction from T1 while its shrinking size is at least ``int(p)``, else T2, else T1).

A Hypothesis ``RuleBasedStateMachine`` per policy drives the real policy and its model with the
same random calls and compares victims (or ``None``) and contents after every call (for ARC also
``p`` and the four lists). Keys are unorderable, so a policy that sorted them would fail.

``OffloadStore`` gets its own machine: random ``prepare_store`` / ``prepare_load`` /
``complete`` over a small key universe, against a model store that drives the *reference*
policy the way the store's docstring says, so the victims, the slots handed out, the
``on_release`` calls and the all-or-nothing refusal are all predicted, and ``is_ready`` is exactly
"ready or loading".

Also here: the scheduler config's offload validation, and the manager's ``request_finished``
contract (which keys a finished request stored or used).
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.offload import OFFLOAD_POLICIES, OffloadStore, make_offload_policy
from pagesim.engine.policy.offload.store import READY, STORING
from tests.conftest import scaled_examples

NUM_KEYS = 10
REQUESTS = ("r0", "r1", "r2")


@dataclass(frozen=True)
class Key:
    """A block key stand-in: hashable, equal by value, never ordered (a policy may not sort keys).
    Its position in a request's sequence is its index, so no two keys share a rank."""

    index: int

    def __repr__(self) -> str:
        return f"k{self.index}"


KEYS = [Key(i) for i in range(NUM_KEYS)]


# ================================================================== reference policies
class RefLRU:
    """``lru`` from its definition: ranks in a dict, victims by sorting."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rank: dict[Key, tuple[int, int]] = {}
        self.evictable: set[Key] = set()
        self.request_rank: dict[str, int] = {}
        self.counter = 0

    def _request(self, request_id: str) -> int:
        if request_id not in self.request_rank:
            self.counter += 1
            self.request_rank[request_id] = self.counter
        return self.request_rank[request_id]

    def priority(self, key: Key) -> tuple:
        return self.rank[key]

    def insert(self, key, request_id, position):
        self.rank[key] = (self._request(request_id), -position)

    def store_miss(self, keys):
        pass

    def access(self, keys, request_id, positions):
        rank = self._request(request_id)
        for key, position in zip(keys, positions):
            if key in self.rank:
                self.rank[key] = max(self.rank[key], (rank, -position))

    def request_finished(self, request_id, keys, reused):
        self.request_rank.pop(request_id, None)
        for key in reversed(keys):  # tail first: the head ends up the most recent
            if key in self.rank:
                self.counter += 1
                self.rank[key] = (self.counter, 0)

    def set_evictable(self, key, evictable):
        (self.evictable.add if evictable else self.evictable.discard)(key)

    def evict(self, count, protected):
        if count <= 0:
            return []
        candidates = sorted((k for k in self.evictable if k not in protected), key=self.priority)
        if len(candidates) < count:
            return None
        victims = candidates[:count]
        for key in victims:
            self.forget(key)
        return victims

    def forget(self, key):
        del self.rank[key]
        self.evictable.discard(key)

    def contents(self) -> set:
        return set(self.rank)


class RefLFU(RefLRU):
    """``lfu``: fewest finished requests that reused the key since it was stored, then ``lru``."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.uses: dict[Key, int] = {}

    def priority(self, key):
        return (self.uses[key], self.rank[key])

    def insert(self, key, request_id, position):
        self.uses[key] = 0
        super().insert(key, request_id, position)

    def request_finished(self, request_id, keys, reused):
        for key in reused:
            if key in self.uses:
                self.uses[key] += 1
        super().request_finished(request_id, keys, reused)

    def forget(self, key):
        super().forget(key)
        del self.uses[key]


class RefARC:
    """``arc`` as vLLM 0.33 runs it, lists least recent first. ``keys`` of a finished request
    that it did not reuse are the ones it only inserted (the policy contract)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.t1: list[Key] = []
        self.t2: list[Key] = []
        self.b1: list[Key] = []
        self.b2: list[Key] = []
        self.p = 0.0
        self.evictable: set[Key] = set()

    @staticmethod
    def _to_end(lst, key):
        lst.remove(key)
        lst.append(key)

    def store_miss(self, keys):
        for key in reversed(keys):
            if key in self.b1:
                self.p = min(self.p + max(1.0, len(self.b2) / len(self.b1)), float(self.capacity))
                self._to_end(self.b1, key)
            elif key in self.b2:
                self.p = max(self.p - max(1.0, len(self.b1) / len(self.b2)), 0.0)
                self._to_end(self.b2, key)

    def insert(self, key, request_id, position):
        for ghosts in (self.b1, self.b2):
            if key in ghosts:
                ghosts.remove(key)
        self.t1.append(key)

    def access(self, keys, request_id, positions):
        pass

    def request_finished(self, request_id, keys, reused):
        for key in reversed(keys):
            if key in self.t1:
                if key in reused:
                    self.t1.remove(key)
                    self.t2.append(key)
                else:
                    self._to_end(self.t1, key)
            elif key in self.t2:
                self._to_end(self.t2, key)

    def set_evictable(self, key, evictable):
        (self.evictable.add if evictable else self.evictable.discard)(key)

    def evict(self, count, protected):
        if count <= 0:
            return []

        def first(lst, chosen):
            return next((k for k in lst if k in self.evictable and k not in protected and k not in chosen), None)

        chosen: list[Key] = []
        t1_size = len(self.t1)  # shrinks as T1 gives up keys
        for _ in range(count):
            key = first(self.t1, chosen) if t1_size >= int(self.p) else None
            if key is None:
                key = first(self.t2, chosen)
            if key is None:
                key = first(self.t1, chosen)
            if key is None:
                return None  # (nothing changed yet)
            if key in self.t1:
                t1_size -= 1
            chosen.append(key)
        for key in chosen:
            self.evictable.discard(key)
            if key in self.t1:
                self.t1.remove(key)
                self.b1.append(key)
            else:
                self.t2.remove(key)
                self.b2.append(key)
        for ghosts in (self.b1, self.b2):
            del ghosts[: max(0, len(ghosts) - self.capacity)]
        return chosen

    def contents(self) -> set:
        return set(self.t1) | set(self.t2)


REFERENCE = {"lru": RefLRU, "lfu": RefLFU, "arc": RefARC}


def test_every_built_in_offload_policy_has_a_reference_model():
    built_in = {name for name, cls in OFFLOAD_POLICIES.items() if cls.__module__ == "pagesim.engine.policy.offload.policies"}
    assert built_in == set(REFERENCE)


def assert_same_policy_state(real, model) -> None:
    assert len(real) == len(model.contents())
    for key in KEYS:
        assert (key in real) == (key in model.contents()), f"{key}: held {key in real}, model {key in model.contents()}"
    if isinstance(model, RefARC):
        assert list(real.t1) == model.t1, f"T1 {list(real.t1)}, model {model.t1}"
        assert list(real.t2) == model.t2, f"T2 {list(real.t2)}, model {model.t2}"
        # (the ghost lists hold the keys' hashes)
        assert list(real.b1) == [hash(k) for k in model.b1], f"B1 {list(real.b1)}, model {model.b1}"
        assert list(real.b2) == [hash(k) for k in model.b2], f"B2 {list(real.b2)}, model {model.b2}"
        assert real.p == model.p, f"p {real.p}, model {model.p}"


# ================================================================== policy machines
key_lists = st.lists(st.sampled_from(KEYS), max_size=5, unique=True)


class PolicyMachine(RuleBasedStateMachine):
    """The real policy and its model under the calls the store makes (and a few it does not:
    accesses of keys not held, finishes of keys long gone)."""

    policy = "lru"

    @initialize(capacity=st.integers(1, 6))
    def setup(self, capacity):
        note(f"{self.policy}, capacity {capacity}")
        self.real = make_offload_policy(self.policy, capacity)
        self.model = REFERENCE[self.policy](capacity)
        self.capacity = capacity

    def held(self) -> list[Key]:
        return [k for k in KEYS if k in self.model.contents()]

    @precondition(lambda self: len(self.model.contents()) < self.capacity)
    @rule(data=st.data(), request_id=st.sampled_from(REQUESTS))
    def insert(self, data, request_id):
        key = data.draw(st.sampled_from([k for k in KEYS if k not in self.model.contents()]), label="key")
        note(f"insert({key}, {request_id})")
        self.real.insert(key, request_id, key.index)
        self.model.insert(key, request_id, key.index)

    @rule(keys=key_lists)
    def store_miss(self, keys):
        keys = [k for k in keys if k not in self.model.contents()]  # (the store offers only keys it lacks)
        note(f"store_miss({keys})")
        self.real.store_miss(keys)
        self.model.store_miss(keys)

    @rule(keys=key_lists, request_id=st.sampled_from(REQUESTS))
    def access(self, keys, request_id):
        positions = [k.index for k in keys]
        note(f"access({keys}, {request_id})")
        self.real.access(keys, request_id, positions)
        self.model.access(keys, request_id, positions)

    @rule(keys=key_lists, data=st.data(), request_id=st.sampled_from(REQUESTS))
    def request_finished(self, keys, data, request_id):
        keys = sorted(keys, key=lambda k: k.index)  # prefix order
        reused = set(data.draw(st.lists(st.sampled_from(keys), unique=True), label="reused")) if keys else set()
        note(f"request_finished({request_id}, {keys}, reused={sorted(reused, key=lambda k: k.index)})")
        self.real.request_finished(request_id, keys, reused)
        self.model.request_finished(request_id, keys, reused)

    @precondition(lambda self: self.model.contents())
    @rule(data=st.data(), evictable=st.booleans())
    def set_evictable(self, data, evictable):
        key = data.draw(st.sampled_from(self.held()), label="key")
        note(f"set_evictable({key}, {evictable})")
        self.real.set_evictable(key, evictable)
        self.model.set_evictable(key, evictable)

    @rule(count=st.integers(0, 4), protected=key_lists)
    def evict(self, count, protected):
        protected = set(protected)
        victims = self.real.evict(count, protected)
        expected = self.model.evict(count, protected)
        note(f"evict({count}, {sorted(protected, key=lambda k: k.index)}) -> {victims}")
        assert victims == expected, f"evict({count}) gave {victims}, model {expected}"
        if victims:
            event(f"{self.policy}: evicted {len(victims)}")
        elif victims is None:
            event(f"{self.policy}: evict refused")

    @invariant()
    def same_state(self):
        if hasattr(self, "real"):
            assert_same_policy_state(self.real, self.model)


class LRUPolicyMachine(PolicyMachine):
    policy = "lru"


class ARCPolicyMachine(PolicyMachine):
    policy = "arc"


class LFUPolicyMachine(PolicyMachine):
    policy = "lfu"


_policy_settings = settings(max_examples=scaled_examples(60), stateful_step_count=40, deadline=None)
TestLRUPolicy = _policy_settings(LRUPolicyMachine).TestCase
TestARCPolicy = _policy_settings(ARCPolicyMachine).TestCase
TestLFUPolicy = _policy_settings(LFUPolicyMachine).TestCase


@pytest.mark.parametrize("policy", sorted(REFERENCE))
def test_long_random_call_sequences_match_the_model(policy):
    """Thousands of calls: LRU/LFU's heap compacts (stale entries pile up past 64) on the way."""
    rng = random.Random(zlib.crc32(policy.encode()))
    capacity = 8
    keys = [Key(i) for i in range(24)]
    real, model = make_offload_policy(policy, capacity), REFERENCE[policy](capacity)
    held = model.contents
    for _ in range(4000):
        op = rng.random()
        request_id = rng.choice(REQUESTS)
        if op < 0.2 and len(held()) < capacity:
            key = rng.choice([k for k in keys if k not in held()])
            real.insert(key, request_id, key.index)
            model.insert(key, request_id, key.index)
        elif op < 0.3:
            miss = [k for k in rng.sample(keys, 3) if k not in held()]
            real.store_miss(miss)
            model.store_miss(miss)
        elif op < 0.55:
            some = rng.sample(keys, rng.randint(1, 6))
            real.access(some, request_id, [k.index for k in some])
            model.access(some, request_id, [k.index for k in some])
        elif op < 0.65:
            some = sorted(rng.sample(keys, rng.randint(0, 6)), key=lambda k: k.index)
            reused = {k for k in some if rng.random() < 0.5}
            real.request_finished(request_id, some, reused)
            model.request_finished(request_id, some, reused)
        elif op < 0.9 and held():
            key = rng.choice(sorted(held(), key=lambda k: k.index))
            flag = rng.random() < 0.7
            real.set_evictable(key, flag)
            model.set_evictable(key, flag)
        else:
            count, protected = rng.randint(0, 3), set(rng.sample(keys, rng.randint(0, 4)))
            assert real.evict(count, protected) == model.evict(count, protected)
        assert_same_policy_state(real, model)


def test_lru_evicts_a_running_requests_tail_first_and_a_finished_requests_head_last():
    """The docstring's example, spelled out: while r0 runs its keys rank by position (tail
    first); when it finishes its head becomes the most recent key of all."""
    lru = make_offload_policy("lru", 8)
    for i in range(3):
        lru.insert(KEYS[i], "r0", i)
        lru.set_evictable(KEYS[i], True)
    lru.insert(KEYS[5], "r1", 0)
    lru.set_evictable(KEYS[5], True)
    assert lru.evict(1, set()) == [KEYS[2]]  # r0's tail
    lru.request_finished("r0", [KEYS[0], KEYS[1], KEYS[2]], set())
    assert lru.evict(2, set()) == [KEYS[5], KEYS[1]]  # r1 started later but r0 finished since


def test_arc_moves_a_reused_key_to_t2_only_when_its_request_finishes_and_adapts_on_ghosts():
    arc = make_offload_policy("arc", 2)
    a, b, c = KEYS[:3]
    for key in (a, b):
        arc.insert(key, "r0", key.index)
        arc.set_evictable(key, True)
    arc.access([a], "r1", [0])
    assert list(arc.t2) == []  # a use alone promotes nothing
    arc.request_finished("r1", [a], {a})
    assert list(arc.t1) == [b] and list(arc.t2) == [a]
    assert arc.evict(1, set()) == [b]  # |T1| = 1 >= int(p) = 0: T1 first
    assert list(arc.b1) == [hash(b)]  # (ghosts are hashes)
    arc.store_miss([b])  # a request offers b again: recency would have kept it
    assert arc.p == 1.0
    arc.insert(c, "r2", 2)
    arc.set_evictable(c, True)
    assert arc.evict(1, set()) == [c]  # |T1| = 1 >= 1
    assert arc.evict(1, set()) == [a]  # T1 empty: T2
    assert arc.evict(1, set()) is None


# ================================================================== the store machine
class ModelStore:
    """What ``OffloadStore`` should do, spelled out: states, slots and free slots (never-used ones
    first, in order, then the last freed first, as vLLM's), driving a reference policy."""

    def __init__(self, num_blocks: int, policy: str):
        self.policy = REFERENCE[policy](num_blocks)
        self.state: dict[Key, int] = {}
        self.slot: dict[Key, int] = {}
        self.never_used: deque[int] = deque(range(num_blocks))
        self.freed: list[int] = []

    @property
    def free(self) -> tuple[list[int], list[int]]:
        return list(self.never_used), list(self.freed)

    @property
    def num_free(self) -> int:
        return len(self.never_used) + len(self.freed)

    def evictable_outside(self, protected: set) -> int:
        return sum(1 for k, s in self.state.items() if s == READY and k not in protected)

    def prepare_store(self, keys, request_id):
        """(new keys, victims, slots given) or None if refused."""
        offered = list(dict.fromkeys(keys))
        new = [k for k in offered if k not in self.state]
        used = [k for k in offered if self.state.get(k, STORING) >= READY]
        if used or new:  # (the request's first offer ranks it, refused or not)
            self.policy.access(used, request_id, [k.index for k in used])
        if not new:
            return [], [], []
        self.policy.store_miss(new)
        need = len(new) - self.num_free
        victims = []
        if need > 0:
            victims = self.policy.evict(need, set(offered))
            if victims is None:
                return None
            for key in victims:
                del self.state[key]
                self.freed.append(self.slot.pop(key))
        slots = []
        for key in new:
            slot = self.never_used.popleft() if self.never_used else self.freed.pop()
            self.slot[key] = slot
            self.state[key] = STORING
            self.policy.insert(key, request_id, key.index)
            slots.append(slot)
        return new, victims, slots

    def prepare_load(self, keys, request_id):
        for key in keys:
            if self.state[key] == READY:
                self.policy.set_evictable(key, False)
            self.state[key] += 1
        self.policy.access(list(keys), request_id, [k.index for k in keys])
        return [self.slot[k] for k in keys]

    def complete(self, storing: list, loading: list):
        for key in storing:
            self.state[key] = READY
            self.policy.set_evictable(key, True)
        for key in loading:
            self.state[key] -= 1
            if self.state[key] == READY:
                self.policy.set_evictable(key, True)


def free_slots(store: OffloadStore) -> tuple[list[int], list[int]]:
    """The store's free slots: (never used, in the order they will be taken; freed, last taken first)."""
    never = store._num_never_used
    return list(range(store.num_blocks - never, store.num_blocks)), list(store._freed)


class StoreMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 6), policy=st.sampled_from(sorted(REFERENCE)))
    def setup(self, num_blocks, policy):
        note(f"store of {num_blocks} blocks, {policy}")
        self.store = OffloadStore(num_blocks, policy)
        self.released: list[int] = []
        self.store.on_release = self.released.append
        self.model = ModelStore(num_blocks, policy)
        self.storing: list[Key] = []  # issued since the last complete(), in order
        self.loading: list[Key] = []

    def snapshot(self):
        s = self.store
        return dict(s.slot_of), dict(s.state), list(s.key_of), free_slots(s), s.num_evictions, len(s.policy)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6, unique=True),
          request_id=st.sampled_from(REQUESTS))
    def prepare_store(self, keys, request_id):  # (the manager offers distinct keys)
        store, model = self.store, self.model
        before = self.snapshot()
        free_before = {slot for slots in free_slots(store) for slot in slots}
        offered = set(keys)
        new = [k for k in dict.fromkeys(keys) if k not in model.state]
        room = model.num_free + model.evictable_outside(offered)
        self.released.clear()
        made = store.prepare_store(keys, request_id, [k.index for k in keys])
        made = None if made is None else list(made.items())
        expected = model.prepare_store(keys, request_id)
        note(f"prepare_store({keys}, {request_id}) -> {made}")
        if made is None:
            event("store: refused")
            assert expected is None, f"refused, but the model stores {expected}"
            assert len(new) > room, f"refused {len(new)} new keys with room for {room}"
            assert self.snapshot() == before, "a refused prepare_store changed the store"
            assert self.released == []
            return
        assert expected is not None, "stored, but the model refuses"
        assert len(new) <= room
        exp_new, victims, slots = expected
        assert [k for k, _ in made] == exp_new, "stores the keys not held, in order"
        assert [slot for _, slot in made] == slots, f"slots {[s for _, s in made]}, model {slots}"
        victim_slots = [before[0][k] for k in victims]
        assert self.released == victim_slots, f"on_release got {self.released}, victims' slots {victim_slots}"
        for key in victims:
            assert before[1][key] == READY and key not in offered, f"evicted {key} in state {before[1][key]}"
        assert len(victims) == max(0, len(exp_new) - len(free_before))
        given = [slot for _, slot in made]
        assert len(set(given)) == len(given), "a slot given twice"
        assert set(given) <= free_before | set(victim_slots), "a slot given that was not free"
        if victims:
            event("store: evicted")
        self.storing += exp_new

    @precondition(lambda self: any(s >= READY for s in self.model.state.values()))
    @rule(data=st.data(), request_id=st.sampled_from(REQUESTS))
    def prepare_load(self, data, request_id):
        ready = [k for k in KEYS if self.model.state.get(k, STORING) >= READY]
        keys = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=4), label="keys")
        slots = self.store.prepare_load(keys, request_id, [k.index for k in keys])
        note(f"prepare_load({keys}, {request_id}) -> {slots}")
        assert slots == self.model.prepare_load(keys, request_id)
        self.loading += keys

    @rule()
    def complete(self):
        note("complete()")
        self.store.complete()
        self.model.complete(self.storing, self.loading)
        self.storing, self.loading = [], []

    @rule(request_id=st.sampled_from(REQUESTS), keys=key_lists, data=st.data())
    def request_finished(self, request_id, keys, data):
        keys = sorted(keys, key=lambda k: k.index)
        reused = set(data.draw(st.lists(st.sampled_from(keys), unique=True), label="reused")) if keys else set()
        note(f"request_finished({request_id}, {keys}, {reused})")
        self.store.policy.request_finished(request_id, keys, reused)
        self.model.policy.request_finished(request_id, keys, reused)

    @invariant()
    def agrees(self):
        if not hasattr(self, "store"):
            return
        store, model = self.store, self.model
        store.check()
        assert store.state == model.state
        assert store.slot_of == model.slot
        assert free_slots(store) == model.free
        assert store.num_free_blocks + store.num_used_blocks == store.num_blocks
        for key in KEYS:
            state = model.state.get(key)
            assert store.is_ready(key) == (state is not None and state >= READY), f"{key} in state {state}"
            assert (key in store) == (state is not None)
        assert_same_policy_state(store.policy, model.policy)


_store_settings = settings(max_examples=scaled_examples(80), stateful_step_count=40, deadline=None)
TestOffloadStore = _store_settings(StoreMachine).TestCase


def test_a_store_refused_for_lack_of_room_counts_the_refused_blocks():
    store = OffloadStore(2, "lru")
    assert store.prepare_store([KEYS[0], KEYS[1]], "r0", [0, 1]) == {KEYS[0]: 0, KEYS[1]: 1}
    assert store.prepare_store([KEYS[2]], "r1", [2]) is None  # both are still being copied
    assert store.num_refused_blocks == 1
    store.complete()
    assert store.prepare_store([KEYS[0], KEYS[2], KEYS[3]], "r1", [0, 2, 3]) is None  # k0 is protected
    assert store.num_refused_blocks == 3
    assert store.prepare_store([KEYS[0], KEYS[2]], "r1", [0, 2]) == {KEYS[2]: 1}  # k1 evicted
    assert store.num_evictions == 1


def test_store_rejects_an_empty_store_and_an_unknown_policy():
    with pytest.raises(ValueError, match="at least one block"):
        OffloadStore(0)
    with pytest.raises(ValueError, match="unknown offload eviction policy 'nope'; choose one of lru, arc, lfu"):
        OffloadStore(4, "nope")


# ================================================================== config validation
@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        ("pagesim", dict(enable_prefix_caching=False), "KV offloading .* needs prefix caching"),
        ("vllm-v1", dict(enable_prefix_caching=False), "KV offloading .* needs prefix caching"),
        ("vllm-v0", {}, "KV offloading"),  # (v0 has prefix caching off: either reason is right)
        ("vllm-v0", dict(enable_prefix_caching=True), "KV offloading .* needs the vllm-v1 step order"),
        ("vllm-v1", dict(kv_group_windows=(None, 64)), "KV offloading of a hybrid KV cache .* not modelled"),
        ("pagesim", dict(kv_group_windows=(None, 32), reserve_null_block=True), "hybrid KV cache"),
        ("pagesim", dict(offload_eviction_policy="nope"),
         "unknown offload eviction policy 'nope'; choose one of lru, arc, lfu"),
    ],
)
def test_offload_config_errors_are_one_clear_line(preset, overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        make_config(preset, num_offload_blocks=8, **overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "8"])
def test_num_offload_blocks_must_be_a_count(bad):
    with pytest.raises(ValueError, match="num_offload_blocks must be an integer >= 0"):
        make_config("pagesim", num_offload_blocks=bad)


def test_an_unknown_offload_policy_is_refused_even_with_offloading_off():
    with pytest.raises(ValueError, match="unknown offload eviction policy"):
        make_config("pagesim", offload_eviction_policy="lru2")


def test_offloading_off_configs_stay_valid_everywhere():
    """num_offload_blocks = 0 is no offloading: valid with every preset and cache layout."""
    for preset, overrides in [("vllm-v0", {}), ("pagesim", dict(enable_prefix_caching=False)),
                              ("vllm-v1", dict(kv_group_windows=(None, 64)))]:
        assert Scheduler(make_config(preset, num_offload_blocks=0, **overrides)).offload is None


# ================================================================== the manager's request_finished
def sampled_token(seq, sample_index: int) -> int:
    key = f"{seq.request.request_id}:{seq.index}:{sample_index}:{seq.num_tokens}"
    return 10_000 + zlib.crc32(key.encode()) % 40_000


def finished_calls(scheduler) -> list:
    """Wrap the store policy's ``request_finished`` to record ``(request, keys, reused)``."""
    calls = []
    policy = scheduler.offload.store.policy
    original = policy.request_finished

    def spy(request_id, keys, reused):
        calls.append((request_id, list(keys), set(reused)))
        original(request_id, keys, reused)

    policy.request_finished = spy
    return calls


def serve(scheduler, requests) -> None:
    """Serve ``requests`` to the end, and one step more while the offload store has bookkeeping
    left (vLLM's connector tells the policy that a request finished in the step after)."""
    for request in requests:
        scheduler.add_request(request)
    while scheduler.has_unfinished_requests or scheduler.offload.has_work:
        scheduler.update(scheduler.schedule(), sampled_token)


PROMPT = [1, 2, 3, 4, 5]  # two full blocks of 2 tokens


def test_request_finished_names_the_keys_a_request_stored_in_prefix_order():
    scheduler = Scheduler(make_config("pagesim", block_size=2, num_gpu_blocks=32, num_offload_blocks=8))
    calls = finished_calls(scheduler)
    serve(scheduler, [Request("a", 0, 2, prompt_token_ids=PROMPT)])
    keys = scheduler.offload.store.key_of[:2]
    assert calls == [("a", keys, set())]
    assert keys[1].parent is keys[0]


def test_a_key_another_request_is_storing_is_not_this_requests():
    """a and b share a prompt and are admitted in one step: a stores both blocks, b offers its GPU
    hits, finds them being stored and skips them. b neither stored nor used them, so its finish
    must not refresh their recency (LRU) or move them (ARC)."""
    scheduler = Scheduler(make_config("pagesim", block_size=2, num_gpu_blocks=32, num_offload_blocks=8))
    calls = finished_calls(scheduler)
    serve(scheduler, [Request("a", 0, 2, prompt_token_ids=PROMPT), Request("b", 0, 2, prompt_token_ids=PROMPT)])
    by_request = {rid: (keys, reused) for rid, keys, reused in calls}
    assert len(by_request["a"][0]) == 2
    assert by_request.get("b", ([], set())) == ([], set())


def test_a_request_reoffering_its_own_blocks_does_not_reuse_them():
    """n = 2: sample 0 stores the prompt's blocks, the forked sample 1 offers them again (ready by
    then). The request stored them itself: no reuse (ARC would promote them to T2, LFU count a use)."""
    scheduler = Scheduler(make_config("pagesim", block_size=2, num_gpu_blocks=32, num_offload_blocks=8,
                                      offload_eviction_policy="arc"))
    calls = finished_calls(scheduler)
    serve(scheduler, [Request("a", 0, 3, prompt_token_ids=PROMPT, n=2)])
    ((rid, keys, reused),) = calls
    assert len(keys) == 2
    assert reused == set()
    assert list(scheduler.offload.store.policy.t2) == []


def test_a_refused_offer_still_counts_the_ready_keys_it_used():
    """The store (2 blocks) holds a's two blocks; b shares the first, offers it with three new
    blocks: no room (the shared one is protected), refused. b did use the stored block (the policy
    was told so through ``access``): its finish must say so, and name the keys it offered, refused
    ones too (vLLM 0.33's CPUOffloadingManager records an offer's access before it allocates)."""
    scheduler = Scheduler(make_config("pagesim", block_size=2, num_gpu_blocks=32, num_offload_blocks=2))
    calls = finished_calls(scheduler)
    serve(scheduler, [Request("a", 0, 1, prompt_token_ids=PROMPT)])
    store = scheduler.offload.store
    shared = store.key_of[0]
    serve(scheduler, [Request("b", 0, 1, prompt_token_ids=[1, 2, 7, 7, 8, 8, 9, 9, 6])])
    # refused in b's step, and once more in the step after b finished (vLLM 0.33 offers a refused
    # request's blocks again then)
    assert store.num_refused_blocks == 3 + 3
    by_request = {rid: (keys, reused) for rid, keys, reused in calls}
    keys, reused = by_request["b"]
    assert keys[0] is shared and len(keys) == 4 and reused == {shared}


def test_a_sync_load_budget_needs_an_offload_store():
    with pytest.raises(ValueError, match="applies to loads from an offload store"):
        make_config("pagesim", offload_sync_load_budget_bytes=100)
    with pytest.raises(ValueError, match="offload_sync_load_budget_bytes must be an integer >= 0"):
        make_config("pagesim", num_offload_blocks=8, offload_sync_load_budget_bytes=-1)
    config = make_config("pagesim", num_offload_blocks=8, offload_sync_load_budget_bytes=100, offload_block_bytes=10)
    assert config.offload_sync_load_budget_bytes == 100


def test_the_cli_takes_the_budget_beside_an_offload_store_only(capsys):
    from pagesim.engine.cli import main

    base = ["simulate", "--workload", "shared-system-prompt", "--rate", "4", "--num-requests", "20",
            "--enable-prefix-caching", "--offload-sync-load-budget-bytes", "100"]
    with pytest.raises(SystemExit) as info:
        main(base)
    assert info.value.code == 2
    assert "applies to loads from an offload store" in capsys.readouterr().err
    assert main([*base, "--kv-offloading-size", "1", "--json"]) in (0, None)
