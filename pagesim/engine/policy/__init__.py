"""pagesim's serving policy: block pool, prefix cache, eviction, requests, scheduler, presets.

Pure Python (no torch, no simpy): the simulator and the real engine both drive these objects
unchanged. ``Scheduler.schedule()`` returns a frozen ``SchedulerOutput`` (the one seam between
policy and execution) and the executor answers with ``Scheduler.update()``.
"""

from pagesim.engine.policy.memory.block_key import BlockKey
from pagesim.engine.policy.memory.block_pool import BlockPool, NoFreeBlocksError
from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.baselines.contiguous_scheduler import ContiguousScheduler
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.memory.kv_manager import KVCacheManager
from pagesim.engine.policy.scheduling.output import DecisionLog, ScheduledSequence, SchedulerOutput
from pagesim.engine.policy.scheduling.preemption import PREEMPTION_MODES, VICTIM_POLICIES, CostPreemption
from pagesim.engine.policy.scheduling.presets import PRESETS, make_config
from pagesim.engine.policy.scheduling.request import Request, RequestStatus, Sequence
from pagesim.engine.policy.scheduling.scheduler import Scheduler
from pagesim.engine.policy.memory.swap_pool import SwapPool, SwapSpaceExhausted

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
