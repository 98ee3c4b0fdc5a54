"""pagesim's serving policy: block pool, prefix cache, eviction, requests, scheduler, presets.

Pure Python (no torch, no simpy): the simulator and the real engine both drive these objects
unchanged. ``Scheduler.schedule()`` returns a frozen ``SchedulerOutput`` (the one seam between
policy and execution) and the executor answers with ``Scheduler.update()``.
"""

from pagesim.engine.policy.block_key import BlockKey
from pagesim.engine.policy.block_pool import BlockPool, NoFreeBlocksError
from pagesim.engine.policy.config import SchedulerConfig
from pagesim.engine.policy.contiguous_scheduler import ContiguousScheduler
from pagesim.engine.policy.eviction import EVICTION_POLICIES
from pagesim.engine.policy.kv_manager import KVCacheManager
from pagesim.engine.policy.output import DecisionLog, ScheduledSequence, SchedulerOutput
from pagesim.engine.policy.preemption import PREEMPTION_MODES, VICTIM_POLICIES, CostPreemption
from pagesim.engine.policy.presets import PRESETS, make_config
from pagesim.engine.policy.request import Request, RequestStatus, Sequence
from pagesim.engine.policy.scheduler import Scheduler
from pagesim.engine.policy.swap_pool import SwapPool, SwapSpaceExhausted

__all__ = [
    "EVICTION_POLICIES",
    "PREEMPTION_MODES",
    "PRESETS",
    "VICTIM_POLICIES",
    "BlockKey",
    "BlockPool",
    "ContiguousScheduler",
    "CostPreemption",
    "DecisionLog",
    "KVCacheManager",
    "NoFreeBlocksError",
    "Request",
    "RequestStatus",
    "ScheduledSequence",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "Sequence",
    "SwapPool",
    "SwapSpaceExhausted",
    "make_config",
]
