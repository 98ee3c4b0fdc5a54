"""A second KV tier: an offload store in CPU memory behind the GPU prefix cache (vLLM 0.33's
native KV offloading). ``store.py`` holds the blocks and their states, ``policies.py`` the
eviction plug-ins (``lru``, ``arc``, ``lfu``), ``manager.py`` what the scheduler stores and
loads each step."""

from pagesim.engine.policy.offload.manager import OffloadManager
from pagesim.engine.policy.offload.policies import OFFLOAD_POLICIES, OffloadPolicy, make_offload_policy
from pagesim.engine.policy.offload.store import OffloadStore

__all__ = ["OFFLOAD_POLICIES", "OffloadManager", "OffloadPolicy", "OffloadStore", "make_offload_policy"]
