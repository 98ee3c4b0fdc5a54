"""An offload eviction policy of one's own: give up the block stored first, however often it is used.

vLLM's ``lru`` keeps a prefix that requests keep loading; its ``arc`` also weighs how often a
block was reused. This policy is the plain baseline both are measured against: the CPU store is a
queue, and the block that has been stored longest goes first. It is an ``OffloadPolicy`` subclass
(pagesim/engine/policy/offload/policies.py) with ``name = "first-stored"``.

Use it with ``--plugin examples/first_stored_offload.py:FirstStored --kv-offloading-policy first-stored``
beside ``--enable-prefix-caching --kv-offloading-size GIB``.
"""

from collections import OrderedDict

from pagesim.engine.policy.offload import OffloadPolicy


class FirstStored(OffloadPolicy):
    name = "first-stored"  # what --kv-offloading-policy (or a study's kv_offloading_policy axis) calls it

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.order: OrderedDict = OrderedDict()  # keys held, first stored first
        self.evictable: set = set()  # keys whose copy is done and that no load is reading

    def insert(self, key, request_id: str, position: int) -> None:
        self.order[key] = None

    def set_evictable(self, key, evictable: bool) -> None:
        (self.evictable.add if evictable else self.evictable.discard)(key)

    def evict(self, count: int, protected: set):
        victims = []
        for key in self.order:  # first stored first
            if len(victims) == count:
                break
            if key in self.evictable and key not in protected:
                victims.append(key)
        if len(victims) < count:
            return None  # the store then stores nothing for this offer
        for key in victims:
            del self.order[key]
            self.evictable.discard(key)
        return victims

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, key) -> bool:
        return key in self.order
