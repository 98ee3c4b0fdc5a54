"""The serving policy's configuration: one validated dataclass, the knobs a what-if study turns.

The first group are the settings every serving engineer knows from vLLM (block size, pool sizes,
batch limits, chunked prefill, prefix caching, watermark); the second are the plug-ins (eviction
policy, victim choice, preemption mode); the last group are *fidelity switches* that exist only so
the ``vllm-v0`` / ``vllm-v1`` presets can reproduce quirks of those versions. pagesim's own default
leaves them at the clean setting, and each says how the clean setting differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.offload.manager import CONNECTORS
from pagesim.engine.policy.offload.policies import OFFLOAD_POLICIES
from pagesim.engine.policy.plugins.lookup import lookup
from pagesim.engine.policy.scheduling.preemption import PreemptionMode, VictimPolicy, make_preemption_mode, make_victim_policy
from pagesim.engine.policy.scheduling.waiting_queue import SCHEDULING_POLICIES

#: What the ``vllm-v0`` step order assumes (vLLM 0.6.3 without prefix caching; its block manager
#: reserves whole sequences, counts sequences against max_num_seqs and always keeps the watermark;
#: it raises when swap space runs out, since it cannot recompute a multi-sequence group instead).
V0_REQUIRES: dict[str, Any] = {
    "enable_prefix_caching": False,
    "reserve_extent": "whole",
    "seq_limit_counts": "sequences",
    "watermark_only_when_running": False,
    "reserve_null_block": False,
    "on_swap_exhausted": "raise",
}


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    # --- capacity and batching --------------------------------------------------------------
    block_size: int = 16  # tokens per KV block
    num_gpu_blocks: int = 1024  # physical GPU blocks (incl. the null block if reserved)
    num_cpu_blocks: int = 0  # CPU swap-space blocks
    max_num_seqs: int = 256  # most requests (or sequences, see seq_limit_counts) in a batch
    max_num_batched_tokens: int = 8192  # token budget per step
    max_model_len: int = 8192  # longest sequence (prompt + output)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    watermark: float = 0.0  # fraction of num_gpu_blocks kept free when admitting / swapping in
    # The attention window of each KV-cache layer group (None: full attention), in group order
    # (engine.catalog.kv_layout). One full group is the plain paged cache; anything else is vLLM
    # v1's hybrid KV-cache manager (pagesim/engine/policy/memory/hybrid_kv.py): a block table per group, blocks
    # that leave a window freed. Hybrid caches need vLLM v1's behaviour: the vllm-v1 step order,
    # recompute preemption, the null block for dropped entries, blocks reserved as scheduled.
    kv_group_windows: tuple[int | None, ...] = (None,)
    # Which full blocks of a sliding group get a prefix-cache key (vLLM 0.33's
    # --prefix-cache-retention-interval, default 0): 0 keys only the window's tail at the points a
    # later request can resume at (the prompt's replay boundary, a prefix shared with earlier
    # requests); N > 0 also one tail per N tokens; None keys every full block (dense).
    prefix_cache_retention_interval: int | None = 0

    # A second KV tier (pagesim/engine/policy/offload/): an offload store in CPU memory of this many
    # blocks (0: none; vLLM's --kv-offloading-size, in blocks) holding copies of full blocks, so
    # a prefix evicted from the GPU can be loaded back instead of recomputed. vLLM stores only
    # prompt blocks by default (offload_prompt_only); False stores generated blocks too.
    num_offload_blocks: int = 0
    offload_prompt_only: bool = True
    # How a load from the offload store runs (vLLM 0.33's connector option sync_load_budget_bytes,
    # 0 by default): with 0 every load is asynchronous, the request parked until the copy is done;
    # with a budget, a load that leaves a token to compute and fits the step's budget
    # (offload_block_bytes per block: one GPU's share of a KV block, as vLLM counts a worker's)
    # runs synchronously, in the request's own step.
    offload_sync_load_budget_bytes: int = 0
    offload_block_bytes: int = 0
    # Which vLLM's OffloadingConnector the offload store follows (OffloadManager): "0.33" (the
    # default) or "0.15" (vLLM 0.15.1's: every full block stored, a store reported done only once
    # its request has finished, its CPU manager's eviction a walk through every entry).
    offload_connector: str = "0.33"
    # Disaggregated prefill and decode (pagesim/engine/policy/disagg/): "nixl" gives the instance
    # vLLM 0.33's NixlConnector (--kv-transfer-config '{"kv_connector":"NixlConnector",...}'), whose
    # requests prefill for a remote decode or decode from a remote prefill as their transfer
    # parameters say; "" (the default): colocated serving, no connector.
    kv_connector: str = ""

    # Which waiting request is admitted first and which running one is preempted (vLLM's
    # --scheduling-policy): "fcfs", first come first served (the waiting queue in arrival order,
    # the victim the victim_policy plug-in's); or "priority", vLLM 0.33's
    # SchedulerConfig(policy="priority"): the waiting queue (new and preempted requests alike) by
    # (priority, arrival time, id) (pagesim/engine/policy/scheduling/waiting_queue.py), and the victim vLLM's own
    # rule over every running request, scheduled this step or not (steps/vllm_v1.py).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"

    # --- plug-ins -----------------------------------------------------------------------------
    eviction_policy: str = "lru"
    offload_eviction_policy: str = "lru"  # the offload store's (lru and arc as vLLM's, lfu)
    victim_policy: str | VictimPolicy = "running-tail"
    preemption_mode: str | PreemptionMode = "recompute"

    # --- fidelity switches (presets only; see each) --------------------------------------------
    # The passes of one step (pagesim/engine/policy/scheduling/steps/): "vllm-v1" (running, swapped, waiting; the
    # clean order) or "vllm-v0" (vLLM 0.6.3's orders, block accounting and budget; it needs
    # prefix caching off, the whole sequence reserved and max_num_seqs counting sequences).
    step_order: Literal["vllm-v1", "vllm-v0"] = "vllm-v1"
    # vLLM v1 reserves block 0 as a "null block" that is never handed out.
    reserve_null_block: bool = False
    # "requests": max_num_seqs counts requests (v1). "sequences": it counts running sequences,
    # so a request with n=3 counts 3 (v0).
    seq_limit_counts: Literal["requests", "sequences"] = "requests"
    # Apply the watermark to an admission only while something is running (v1, pagesim). False:
    # always (v0), which can refuse a request for good once it has grown into the watermark.
    watermark_only_when_running: bool = False
    # "scheduled": a step reserves blocks for the tokens it computes (v1, clean). "whole": reserve
    # the whole known sequence at once, even when chunked prefill computes only part of it (v0).
    reserve_extent: Literal["scheduled", "whole"] = "scheduled"
    # Move a block shared by several sequences once (clean) or once per sequence (v0).
    preserve_sharing_on_swap: bool = True
    # When swap space runs out: fall back to recompute (clean) or raise like vLLM 0.6.3.
    on_swap_exhausted: Literal["recompute", "raise"] = "recompute"
    # Record a decision-log entry per step (the simulator may turn it off at scale).
    record_decisions: bool = True

    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # preset metadata

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            positive(name)
        if not isinstance(self.num_cpu_blocks, int) or self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be an integer >= 0, got {self.num_cpu_blocks!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.num_gpu_blocks < 1 + self.reserve_null_block:
            raise ValueError("num_gpu_blocks leaves no usable block")
        lookup(EVICTION_POLICIES, self.eviction_policy, "eviction policy")
        make_victim_policy(self.victim_policy)
        make_preemption_mode(self.preemption_mode)
        if self.preemption_mode == "cost":
            raise ValueError("preemption mode 'cost' needs a cost function: pass CostPreemption(cost_fn)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            # vLLM refuses this too: a request preempted by recompute must re-prefill prompt and
            # output in one step, which could then exceed the budget forever.
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) when chunked prefill is off"
            )
        for name, allowed in (
            ("step_order", ("vllm-v1", "vllm-v0")),
            ("seq_limit_counts", ("requests", "sequences")),
            ("reserve_extent", ("scheduled", "whole")),
            ("on_swap_exhausted", ("recompute", "raise")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

        self._check_kv_groups()
        self._check_offload()
        self._check_kv_connector()
        self._check_scheduling_policy()
        if self.step_order == "vllm-v0":
            for name, required in V0_REQUIRES.items():
                if getattr(self, name) != required:
                    raise ValueError(
                        f"step_order 'vllm-v0' reproduces vLLM 0.6.3, which needs {name}={required!r} "
                        f"(got {getattr(self, name)!r})"
                    )

    def _check_scheduling_policy(self) -> None:
        policy = self.scheduling_policy
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {policy!r}")
        if policy == "fcfs":
            return
        why = "scheduling_policy 'priority' follows vLLM 0.33's v1 scheduler, which"
        if self.step_order != "vllm-v1":
            raise ValueError(f"{why} the vllm-v0 step order does not model; use the vllm-v1 or pagesim preset")
        victim = self.victim_policy if isinstance(self.victim_policy, str) else self.victim_policy.name
        if victim != "running-tail":
            raise ValueError(f"{why} chooses its victims by its own rule (the largest (priority, arrival time) "
                             f"among all running requests); the victim plug-in ({victim!r}) is for "
                             f"scheduling_policy 'fcfs'")
        if self.preemption_mode != "recompute":
            # (an un-scheduled victim has its step's tokens counted computed and its blocks keyed: recompute
            # drops both, as vLLM does; a swap would keep them)
            raise ValueError(f"{why} preempts by recompute only (vLLM v1 has no swap space); got preemption mode "
                             f"{self.preemption_mode if isinstance(self.preemption_mode, str) else self.preemption_mode.name!r}")
        if self.num_offload_blocks:
            raise ValueError(f"{why} may un-schedule a request whose blocks were offered to the offload store: "
                             f"priority scheduling with KV offloading is not modelled yet")

    def _check_kv_connector(self) -> None:
        if self.kv_connector not in ("", "nixl"):
            raise ValueError(f"kv_connector must be '' (colocated) or 'nixl', got {self.kv_connector!r}")
        if not self.kv_connector:
            return
        why = "disaggregated prefill/decode follows vLLM 0.33's NixlConnector, a vLLM v1 connector:"
        if self.step_order != "vllm-v1":
            raise ValueError(f"{why} it needs the vllm-v1 step order (the pagesim or vllm-v1 preset)")
        if self.num_offload_blocks:
            raise ValueError(f"{why} combining it with KV offloading (vLLM's MultiConnector) is not modelled")
        if self.is_hybrid:
            raise ValueError(f"{why} a hybrid KV cache (sliding-window layer groups) is not modelled; "
                             f"use a full-attention model, or --disable-hybrid-kv-cache-manager")

    def _check_offload(self) -> None:
        n = self.num_offload_blocks
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"num_offload_blocks must be an integer >= 0, got {n!r}")
        lookup(OFFLOAD_POLICIES, self.offload_eviction_policy, "offload eviction policy")
        for name in ("offload_sync_load_budget_bytes", "offload_block_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.offload_connector not in CONNECTORS:
            raise ValueError(f"offload_connector (--offload-connector) must be one of {', '.join(CONNECTORS)}, "
                             f"got {self.offload_connector!r}")
        if self.offload_connector == "0.15" and self.offload_sync_load_budget_bytes:
            raise ValueError("offload_sync_load_budget_bytes (--offload-sync-load-budget-bytes) is vLLM 0.33's: "
                             "vLLM 0.15's connector loads asynchronously only")
        if not n:
            if self.offload_sync_load_budget_bytes:
                raise ValueError("offload_sync_load_budget_bytes (--offload-sync-load-budget-bytes) applies to loads from "
                                 "an offload store: give one (--kv-offloading-size or --num-offload-blocks)")
            return
        if self.step_order != "vllm-v1":
            raise ValueError("KV offloading is vLLM v1's (the native OffloadingConnector): it needs the vllm-v1 "
                             "step order (the pagesim or vllm-v1 preset)")
        if not self.enable_prefix_caching:
            raise ValueError("KV offloading stores prefix-cache blocks by their keys: it needs prefix caching "
                             "(--enable-prefix-caching)")
        if self.is_hybrid:
            raise ValueError("KV offloading of a hybrid KV cache (sliding-window layer groups) is not modelled; "
                             "offload a full-attention model, or --disable-hybrid-kv-cache-manager")

    def _check_kv_groups(self) -> None:
        windows = self.kv_group_windows
        if not isinstance(windows, tuple) or not windows:
            raise ValueError(f"kv_group_windows must be a non-empty tuple, got {windows!r}")
        for window in windows:
            if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
                raise ValueError(f"kv_group_windows entries must be None or a positive int, got {window!r}")
        interval = self.prefix_cache_retention_interval
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 0
                                     or interval % self.block_size):
            raise ValueError(f"prefix_cache_retention_interval must be None, 0 or a positive multiple of "
                             f"block_size ({self.block_size}), got {interval!r}")
        if not self.is_hybrid:
            return
        why = "sliding-window layer groups follow vLLM v1's hybrid KV-cache manager, which"
        if self.step_order != "vllm-v1":
            raise ValueError(f"{why} the vllm-v0 step order (vLLM 0.6.3) does not model; use the vllm-v1 or "
                             f"pagesim preset")
        if isinstance(self.preemption_mode, str) and self.preemption_mode != "recompute":
            raise ValueError(f"{why} preempts by recompute only (vLLM v1 has no swap space); "
                             f"--preemption {self.preemption_mode} is not available for this model")
        if not self.reserve_null_block:
            raise ValueError(f"{why} needs the null block (block 0) for the entries a window dropped: "
                             f"reserve_null_block=True")
        if self.reserve_extent != "scheduled":
            raise ValueError(f"{why} reserves blocks for the tokens a step computes (reserve_extent='scheduled')")

    @property
    def is_hybrid(self) -> bool:
        """Whether the cache has sliding-window groups (a table per group; pagesim/engine/policy/memory/hybrid_kv.py)."""
        windows = self.kv_group_windows  # (each None or an int: _check_kv_groups)
        return windows.count(None) != len(windows)  # (any window, in C calls: read at every arrival)

    @property
    def sliding_window(self) -> int | None:
        """The (largest) sliding window of the cache's groups; None without one."""
        windows = [w for w in self.kv_group_windows if w is not None]
        return max(windows) if windows else None

    @property
    def watermark_blocks(self) -> int:
        return math.floor(self.watermark * self.num_gpu_blocks)

    @property
    def num_usable_gpu_blocks(self) -> int:
        return self.num_gpu_blocks - self.reserve_null_block

    def with_overrides(self, **overrides: Any) -> SchedulerConfig:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown scheduler setting(s): {', '.join(unknown)}")
        return replace(self, **overrides)
