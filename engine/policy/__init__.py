"""pagesim's serving policy: block pool, prefix cache, eviction, requests, scheduler, presets.

Pure Python (no torch, no simpy): the simulator and the real engine both drive these objects
unchanged. ``Scheduler.schedule()`` returns a frozen ``SchedulerOutput`` (the one seam between
policy and execution) and the executor answers with ``Scheduler.update()``.
"""

from engine.policy.block_key import BlockKey
from engine.policy.block_pool import BlockPool, NoFreeBlocksError
from engine.policy.config import SchedulerConfig
from engine.policy.contiguous_scheduler import ContiguousScheduler
from engine.policy.eviction import EVICTION_POLICIES
from engine.policy.kv_manager import KVCacheManager
from engine.policy.output import DecisionLog, ScheduledSequence, SchedulerOutput
from engine.policy.preemption import PREEMPTION_MODES, VICTIM_POLICIES, CostPreemption
from engine.policy.presets import PRESETS, make_config
from engine.policy.request import Request, RequestStatus, Sequence
from engine.policy.scheduler import Scheduler
from engine.policy.swap_pool import SwapPool, SwapSpaceExhausted

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
