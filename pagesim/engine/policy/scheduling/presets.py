"""Scheduler presets: named starting points for a study, each saying which behaviour it follows.

- ``pagesim``: pagesim's own clean policy: chunked prefill, prefix caching with LRU eviction,
  recompute preemption of the running tail, a 1% watermark kept free for the running requests
  when admitting (with nothing running there is no one to protect, so an idle pool admits into
  it, as v1 does; this way a request preempted late in its life can always come back), vLLM
  v1's step order (running, swapped, waiting: decodes and prefills share a step, admission
  continues while requests are swapped out), and none of the version quirks below: a step asks
  for the blocks it writes (v0 counts a touched block per running sequence), a copy-on-write is
  counted once per copy, a shared block swaps out once and stays shared, swap-space exhaustion
  falls back to recompute.
- ``vllm-v1``: vLLM's V1 engine core as of 0.32 (``vllm/v1/core/sched/scheduler.py`` with its
  ``KVCacheManager``/``BlockPool``), FCFS, synchronous scheduling: recompute-only preemption of the
  running tail, prefix caching with the LRU free queue (unhashed blocks first, cached ones in
  release order, a table released tail first), block 0 reserved as the null block, admission needs
  the whole known sequence minus cache hits to fit, watermark 0 (applied, when set, only while
  something runs), ``max_num_seqs`` counts requests. ``tests/test_oracle.py`` replays the
  oracle cases in ``shared/oracle/vllm-0.32-v1`` and asserts vLLM's decisions step for step.
  Differences: pagesim rejects up front what vLLM would accept but never finish (a prompt of
  ``max_model_len`` tokens; a request larger than the whole pool), where vLLM errors or
  preempts without end.
- ``vllm-v0``: vLLM 0.6.3's V0 scheduler with ``SelfAttnBlockSpaceManager`` and no prefix caching
  (``step_order="vllm-v0"``, ``steps/vllm_v0.py``): without chunked prefill, prefills before
  decodes and decodes only in a step that admitted no prompt, and no admission while anything is
  swapped out; with it, running first and prompts admitted even after a preemption; LIFO free
  list, 1% watermark always applied, the whole sequence reserved at admission, copy-on-write of
  shared partial blocks (the parent copies), vLLM's preemption rule (recompute for
  single-sequence requests, swap for multi-sequence groups), ``max_num_seqs`` counting sequences,
  v0's block accounting (a touched block per running sequence, full entries counted per sequence
  on a swap, shared blocks swapped once per sequence) and an error, not a fallback, when swap
  space runs out. ``tests/test_oracle.py`` replays ``shared/oracle/vllm-0.6.3-v0``.
  Differences: vLLM stops a sequence at ``len > max_model_len``, pagesim at ``>=`` (no oracle
  case reaches either); beam search is not modelled under this order (rejected on arrival);
  where vLLM would wait or repeat forever, pagesim lets the request through (the cases are listed
  in ``steps/vllm_v0.py``); where vLLM aborts (swap space out, recomputing a request with several
  running sequences), pagesim raises.

Batch limits vLLM picks per GPU and entrypoint (``max_num_seqs``, ``max_num_batched_tokens``) are
not part of a preset's identity; the values here are common ones and are meant to be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagesim.engine.policy.scheduling.config import SchedulerConfig


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    follows: str  # which implementation / version the preset reproduces
    settings: dict[str, Any]


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "pagesim",
            "pagesim's clean default policy",
            dict(
                enable_chunked_prefill=True,
                enable_prefix_caching=True,
                eviction_policy="lru",
                preemption_mode="recompute",
                victim_policy="running-tail",
                watermark=0.01,
                watermark_only_when_running=True,
            ),
        ),
        Preset(
            "vllm-v1",
            "vLLM 0.32 V1 engine core (FCFS, synchronous)",
            dict(
                enable_chunked_prefill=True,
                enable_prefix_caching=True,
                eviction_policy="lru",
                preemption_mode="recompute",
                victim_policy="running-tail",
                watermark=0.0,
                watermark_only_when_running=True,
                reserve_null_block=True,
                seq_limit_counts="requests",
                reserve_extent="scheduled",
                num_cpu_blocks=0,
            ),
        ),
        Preset(
            "vllm-v0",
            "vLLM 0.6.3 V0 scheduler (no prefix caching, synchronous)",
            dict(
                enable_chunked_prefill=False,
                enable_prefix_caching=False,
                eviction_policy="lru",
                preemption_mode="vllm-v0",
                victim_policy="running-tail",
                watermark=0.01,
                watermark_only_when_running=False,
                reserve_null_block=False,
                seq_limit_counts="sequences",
                reserve_extent="whole",
                step_order="vllm-v0",
                preserve_sharing_on_swap=False,
                on_swap_exhausted="raise",
            ),
        ),
    )
}


def make_config(preset: str = "pagesim", **overrides: Any) -> SchedulerConfig:
    """A ``SchedulerConfig`` from a preset, with any setting overridden (unknown names refused)."""
    try:
        base = PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown scheduler preset {preset!r}; choose one of {', '.join(PRESETS)}") from None
    return SchedulerConfig().with_overrides(**{**base.settings, **overrides, "extra": {"preset": preset}})
