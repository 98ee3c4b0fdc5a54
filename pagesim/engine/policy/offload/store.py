"""The offload store: a second KV tier (CPU memory) of ``num_blocks`` slots holding copies of
full GPU blocks, found by the same chained ``BlockKey`` as the prefix cache.

Each stored key has one slot and a state (vLLM 0.33's CPU offloading manager keeps the same
three, as a reference count):

- **storing** (``-1``): its copy GPU -> CPU was issued this step; not found by ``lookup``, not
  evictable (the copy is in flight);
- **ready** (``0``): found by ``lookup``; evictable;
- **loading** (``n > 0``): ``n`` copies CPU -> GPU were issued this step; found, not evictable.

A copy is done when the executor reports it (``complete_store`` / ``complete_load``, through
``OffloadManager.complete``): a key being stored is found by ``lookup`` as *pending* (vLLM's
``HIT_PENDING``), which holds back the request that looks it up (``OffloadManager.lookup``).

``prepare_store`` is all or nothing, as vLLM's: if the keys that are not stored yet need more
slots than are free plus evictable (outside the keys offered), nothing is stored and ``None``
comes back. Free slots are taken never-used first, then in the order they were freed.

Invariants (``check``): every slot is free or holds exactly one key; a key is evictable in the
policy exactly when it is ready; ``num_free_blocks + num_used_blocks == num_blocks``.
``on_release`` (default ``None``) is called with a slot whose content was evicted (the engine's
validation mode fills it with NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from pagesim.engine.policy.offload.policies import OffloadPolicy, make_offload_policy

STORING = -1
READY = 0


class OffloadStore:
    def __init__(self, num_blocks: int, policy: str = "lru"):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"an offload store needs at least one block, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.policy: OffloadPolicy = make_offload_policy(policy, num_blocks)
        # Whether the policy reads store_miss (ARC adapts there); else the store skips the call.
        self._hears_misses = type(self.policy).store_miss is not OffloadPolicy.store_miss
        self.slot_of: dict[Hashable, int] = {}
        self.state: dict[Hashable, int] = {}  # STORING, READY, or the number of loads in flight
        self.key_of: list[Hashable | None] = [None] * num_blocks
        self._num_never_used = num_blocks  # slots num_blocks - n .. num_blocks - 1 were never used
        self._freed: list[int] = []  # slots freed by evictions; the last freed is taken first
        self._storing: set[Hashable] = set()  # stores issued and not done
        self._loading: list[Hashable] = []  # one entry per load issued and not done
        self.on_release: Callable[[int], None] | None = None
        self.num_evictions = 0
        self.step_evictions = 0  # since the manager last cleared it (one step's, vLLM's offload_evictions)
        self.num_refused_blocks = 0  # offered blocks not stored: the store had no room
        # vLLM 0.15's CPU manager finds victims by walking all its entries in LRU order (an
        # OrderedDict) for those not pinned: the entries a step's offers walk, and the offers it
        # refused (each walked every entry), since the manager last cleared them (scan_work)
        self.step_scan_entries = 0
        self.step_refusals = 0
        # vLLM 0.15's manager records an offer's access only when it stores it (False: as it)
        self.access_on_refusal = True
        # bumped by every change to what the store holds or may evict: a refused offer whose
        # store is unchanged since is refused again (OffloadManager's shortcut)
        self.generation = 0

    @property
    def num_free_blocks(self) -> int:
        return self._num_never_used + len(self._freed)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    # ----------------------------------------------------------- lookups
    def is_ready(self, key: Hashable) -> bool:
        """Whether ``key`` can be loaded now (stored, its copy done)."""
        state = self.state.get(key)
        return state is not None and state >= READY

    def is_pending(self, key: Hashable) -> bool:
        """Whether ``key``'s store was issued and is not done yet (vLLM's ``HIT_PENDING``)."""
        return self.state.get(key) == STORING

    def __contains__(self, key: object) -> bool:
        return key in self.slot_of

    # ------------------------------------------------------------ stores
    def prepare_store(self, keys: list[Hashable], request_id: str, positions: list[int],
                      missed: set | None = None) -> dict[Hashable, int] | None:
        """Give every key of ``keys`` (distinct) not stored yet a slot (evicting by the policy);
        returns the slot of each key to copy, in order, or ``None`` if there is no room for them
        all (then nothing is stored). Keys already ready count as used by the request. The
        policy hears of a key offered while not stored once per request: ``missed`` holds those
        it heard of (updated; ``None``: tell it every time)."""
        state = self.state
        new: list[Hashable] = []
        new_positions: list[int] = []
        used: list[Hashable] = []
        used_positions: list[int] = []
        for key, position in zip(keys, positions):
            s = state.get(key)
            if s is None:
                new.append(key)
                new_positions.append(position)
            elif s >= READY:
                used.append(key)
                used_positions.append(position)
        policy = self.policy
        access_now = self.access_on_refusal or not new
        if (used or new) and access_now:
            # (vLLM records the access of the keys to store too, refused or not: none is stored, so
            # only a policy that ranks requests by their first access, as LRU does, hears of it)
            policy.access(used, request_id, used_positions)
        if not new:
            return {}
        if self._hears_misses:
            if missed is not None:
                new_misses = [key for key in new if key not in missed]
                missed.update(new_misses)
            else:
                new_misses = new
            if new_misses:
                policy.store_miss(new_misses)
        need = len(new) - self.num_free_blocks
        if need > 0:
            # (of the keys offered, only those ready could be evicted: protect them)
            victims = policy.evict(need, set(used))
            if victims is None:
                self.refuse(len(new))
                return None
            # (a walk that finds enough stops at the last victim: counted as if the unpinned
            # entries came first, as a finished request's entries do; a lower bound)
            self.step_scan_entries += need
            for key in victims:
                if state.get(key) != READY:  # (a plug-in's mistake: say so rather than corrupt the store)
                    raise ValueError(f"offload eviction policy {policy.name!r} evicted a key the store "
                                     f"{'does not hold' if key not in state else 'is copying'}")
            for key in victims:
                self._drop(key)
        if not access_now:
            policy.access(used, request_id, used_positions)
        self.generation += 1
        slots = {}
        slot_of, key_of, insert = self.slot_of, self.key_of, policy.insert
        storing = self._storing
        for key, position in zip(new, new_positions):
            slot = self._take_slot()
            slot_of[key] = slot
            key_of[slot] = key
            state[key] = STORING
            insert(key, request_id, position)
            storing.add(key)
            slots[key] = slot
        return slots

    def refuse(self, num_new: int) -> None:
        """Count an offer refused for want of room for its ``num_new`` keys not stored: vLLM
        0.15's manager walked every entry looking for victims."""
        self.num_refused_blocks += num_new
        self.step_scan_entries += len(self.slot_of)
        self.step_refusals += 1

    def _take_slot(self) -> int:
        if self._num_never_used:
            self._num_never_used -= 1
            return self.num_blocks - 1 - self._num_never_used
        return self._freed.pop()

    def _drop(self, key: Hashable) -> None:
        slot = self.slot_of.pop(key)
        del self.state[key]
        self.key_of[slot] = None
        self._freed.append(slot)
        self.num_evictions += 1
        self.step_evictions += 1
        if self.on_release is not None:
            self.on_release(slot)

    # ------------------------------------------------------------- loads
    def prepare_load(self, keys: list[Hashable], request_id: str, positions: list[int]) -> list[int]:
        """Pin these ready keys for a load this step; returns their slots, in order."""
        state = self.state
        slots = []
        for key in keys:
            s = state[key]
            assert s >= READY, "only a ready block can be loaded"
            if s == READY:
                self.policy.set_evictable(key, False)
            state[key] = s + 1
            self._loading.append(key)
            slots.append(self.slot_of[key])
        self.generation += 1
        self.policy.access(list(keys), request_id, positions)
        return slots

    # ---------------------------------------------------------- completions
    def complete_store(self, keys: list[Hashable]) -> None:
        """These keys' stores are done: they become ready (found by lookups, evictable)."""
        state = self.state
        storing = self._storing
        done = [key for key in keys if state.get(key) == STORING]
        for key in done:
            state[key] = READY
            storing.discard(key)
        if done:
            self.policy.set_evictable_many(done)
            self.generation += 1

    def complete(self) -> None:
        """Every copy in flight is done."""
        self.complete_store(list(self._storing))
        self.complete_load(list(self._loading))

    def complete_load(self, keys: list[Hashable]) -> None:
        """These keys' loads (one each) are done: they unpin."""
        state, policy, loading = self.state, self.policy, self._loading
        for key in keys:
            s = state[key] - 1
            state[key] = s
            loading.remove(key)
            if s == READY:
                policy.set_evictable(key, True)
        self.generation += 1

    # ------------------------------------------------------------ checking
    def check(self) -> None:
        """Assert the store's invariants (O(blocks); for tests)."""
        free = set(self._freed) | set(range(self.num_blocks - self._num_never_used, self.num_blocks))
        assert len(free) == self.num_free_blocks, "a slot is free twice"
        for slot, key in enumerate(self.key_of):
            if key is None:
                assert slot in free, f"offload slot {slot} is neither free nor holding a key"
            else:
                assert slot not in free, f"offload slot {slot} is free and holds a key"
                assert self.slot_of[key] == slot
        assert len(self.slot_of) == len(self.state) == self.num_used_blocks
        assert len(self.policy) == len(self.slot_of), "the policy and the store hold different keys"
        for key in self.slot_of:
            assert key in self.policy
        assert all(self.state[key] == STORING for key in self._storing)
        assert all(self.state.get(key, 0) > READY for key in self._loading)
