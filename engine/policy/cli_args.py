"""The serving-policy flags every command that runs the policy takes (``simulate``, ``run``, and
later ``validate``): one definition, so the simulator and the engine are configured alike.

``add_policy_args`` adds them (returning the argument group, for a command's own additions);
``policy_overrides`` turns the given ones into ``SchedulerConfig`` overrides on top of the preset.
"""

from __future__ import annotations

import argparse
from typing import Any

#: flag attribute -> SchedulerConfig field (values taken as given)
_DIRECT = (("eviction", "eviction_policy"), ("preemption", "preemption_mode"), ("victim", "victim_policy"),
           ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"))
#: flag attribute -> SchedulerConfig field (on / off)
_SWITCHES = (("prefix_caching", "enable_prefix_caching"), ("chunked_prefill", "enable_chunked_prefill"))


def add_policy_args(parser: argparse.ArgumentParser):
    from engine.policy.eviction import EVICTION_POLICIES
    from engine.policy.preemption import PREEMPTION_MODES, VICTIM_POLICIES
    from engine.policy.presets import PRESETS

    s = parser.add_argument_group("policy")
    s.add_argument("--policy", default="pagesim", choices=list(PRESETS), help="scheduler preset (default pagesim)")
    s.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    s.add_argument("--eviction", choices=list(EVICTION_POLICIES), help="prefix-cache eviction policy")
    s.add_argument("--preemption", choices=[m for m in PREEMPTION_MODES if m != "cost"], help="preemption mode")
    s.add_argument("--victim", choices=list(VICTIM_POLICIES), help="preemption victim policy")
    s.add_argument("--prefix-caching", choices=["on", "off"], help="(default: the preset's)")
    s.add_argument("--chunked-prefill", choices=["on", "off"], help="(default: the preset's)")
    s.add_argument("--max-model-len", type=int, metavar="L", help="default: the model's context length")
    s.add_argument("--max-num-seqs", type=int, metavar="N", help="batch limit (default: the preset's)")
    s.add_argument("--max-num-batched-tokens", type=int, metavar="T", help="token budget per step")
    return s


def policy_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler settings the flags give (those left out stay the preset's)."""
    for flag in ("block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    overrides: dict[str, Any] = {}
    for flag, name in _DIRECT:
        value = getattr(args, flag)
        if value is not None:
            overrides[name] = value
    for flag, name in _SWITCHES:
        value = getattr(args, flag)
        if value is not None:
            overrides[name] = value == "on"
    return overrides
