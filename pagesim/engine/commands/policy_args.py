"""The serving-policy flags every command that runs the policy takes (``simulate``, ``run``, and
later ``validate``): one definition, so the simulator and the engine are configured alike.

``add_policy_args`` adds them (returning the argument group, for a command's own additions);
``policy_overrides`` turns the given ones into ``SchedulerConfig`` overrides on top of the preset.

``--plugin FILE.py:CLASS`` loads a policy piece from the user's own file (``user_plugins``) and
registers it by name; the flag of its kind (``--victim``, ``--eviction``, ``--preemption``,
``--scheduler``) selects it. So those flags take no argparse ``choices`` (a plug-in's name is known
only once it is loaded): ``policy_overrides`` loads the plug-ins first, then checks every name
against its registry, and refuses a plug-in that is loaded but not selected.
"""

from __future__ import annotations

import argparse
from typing import Any

#: flag attribute -> SchedulerConfig field (values taken as given)
_DIRECT = (("eviction", "eviction_policy"), ("preemption", "preemption_mode"), ("victim", "victim_policy"),
           ("kv_offloading_policy", "offload_eviction_policy"), ("scheduling_policy", "scheduling_policy"),
           ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
           ("offload_connector", "offload_connector"))
#: flag attribute -> SchedulerConfig field (on / off)
_SWITCHES = (("prefix_caching", "enable_prefix_caching"), ("chunked_prefill", "enable_chunked_prefill"))


def _builtin_choices() -> dict[str, list[str]]:
    """Flag -> the built-in names it takes ('cost' needs a cost function, which no flag gives)."""
    from pagesim.engine.policy.plugins.user import KINDS, builtin_names

    return {kind: [n for n in builtin_names(kind) if n != "cost"] for kind in KINDS}


def add_policy_args(parser: argparse.ArgumentParser):
    from pagesim.engine.policy.offload.manager import CONNECTORS
    from pagesim.engine.policy.scheduling.presets import PRESETS

    choices = _builtin_choices()

    s = parser.add_argument_group("policy")
    s.add_argument("--policy", default="pagesim", choices=list(PRESETS), help="scheduler preset (default pagesim)")
    s.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    s.add_argument("--eviction", metavar="NAME",
                   help=f"prefix-cache eviction policy: {', '.join(choices['eviction'])}, or a --plugin's")
    s.add_argument("--preemption", metavar="NAME",
                   help=f"preemption mode: {', '.join(choices['preemption'])}, or a --plugin's")
    s.add_argument("--victim", metavar="NAME",
                   help=f"preemption victim policy: {', '.join(choices['victim'])}, or a --plugin's")
    s.add_argument("--scheduler", metavar="NAME", help="scheduler class: default, or a --plugin's Scheduler subclass")
    s.add_argument("--plugin", action="append", default=[], metavar="FILE:CLASS",
                   help="load your own VictimPolicy, EvictionPolicy, PreemptionMode, OffloadPolicy or Scheduler "
                        "subclass (engine.policy) from FILE.py (or module.path:CLASS) and register it by its `name` "
                        "(else the class name); select it with --victim / --eviction / --preemption / "
                        "--kv-offloading-policy / --scheduler NAME (a plug-in loaded but not selected is an error; repeatable; "
                        "see examples/)")
    s.add_argument("--scheduling-policy", choices=["fcfs", "priority"],
                   help="vLLM's flag: fcfs (first come first served, the default) or priority (vLLM 0.33: waiting "
                        "requests by (priority, arrival time, id), victims the least important running request, "
                        "recompute preemption)")
    s.add_argument("--prefix-caching", choices=["on", "off"], help="(default: the preset's)")
    s.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_const", const="on",
                   help="vLLM's name for --prefix-caching on")
    s.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_const", const="off",
                   help="vLLM's name for --prefix-caching off")
    s.add_argument("--chunked-prefill", choices=["on", "off"], help="(default: the preset's)")
    s.add_argument("--enable-chunked-prefill", dest="chunked_prefill", action="store_const", const="on",
                   help="vLLM's name for --chunked-prefill on")
    s.add_argument("--no-enable-chunked-prefill", dest="chunked_prefill", action="store_const", const="off",
                   help="vLLM's name for --chunked-prefill off")
    s.add_argument("--max-model-len", type=int, metavar="L", help="default: the model's context length")
    s.add_argument("--max-num-seqs", type=int, metavar="N", help="batch limit (default: the preset's)")
    s.add_argument("--max-num-batched-tokens", type=int, metavar="T", help="token budget per step")
    s.add_argument("--kv-offloading-size", type=float, metavar="GIB",
                   help="a second KV tier: GiB of CPU memory holding copies of prefix-cache blocks, loaded back "
                        "instead of recomputed (vLLM's flag; needs prefix caching; default: none)")
    s.add_argument("--kv-offloading-backend", choices=["native"], default="native",
                   help="vLLM's offloading backend: native (its OffloadingConnector; the one modelled)")
    s.add_argument("--kv-offloading-policy", metavar="NAME",
                   help=f"the offload store's eviction policy: {', '.join(choices['kv_offloading_policy'])} (lru, "
                        f"the default, and arc as vLLM's), or a --plugin's")
    s.add_argument("--num-offload-blocks", type=int, metavar="N",
                   help="the offload store's size in blocks (overrides --kv-offloading-size)")
    s.add_argument("--offload-sync-load-budget-bytes", type=int, metavar="N",
                   help="KV offloading: bytes a step may load from the offload store synchronously (vLLM's connector "
                        "option sync_load_budget_bytes, counted per GPU; default 0: every load asynchronous, the "
                        "request parked until its copy is done); a load that fits and leaves a token to compute runs "
                        "in its own step")
    s.add_argument("--offload-connector", choices=list(CONNECTORS),
                   help="KV offloading: which vLLM's OffloadingConnector to follow: 0.33 (the default) or 0.15 "
                        "(vLLM 0.15.1's: every full block stored, a store reported done only when its request "
                        "finishes, victims found by walking the whole store, which costs the scheduler CPU time)")
    s.add_argument("--prefix-cache-retention-interval", metavar="N|dense",
                   help="sliding-window groups: key only the window's tail at resume points (0, vLLM 0.33's "
                        "default), also one per N tokens, or every full block (dense)")
    return s


def policy_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler settings the flags give (those left out stay the preset's)."""
    for flag in ("block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    _check_names(args)
    budget = getattr(args, "offload_sync_load_budget_bytes", None)
    if budget is not None and budget < 0:
        raise ValueError(f"--offload-sync-load-budget-bytes must be >= 0, got {budget}")
    overrides: dict[str, Any] = {}
    if budget:
        overrides["offload_sync_load_budget_bytes"] = budget
    for flag, name in _DIRECT:
        value = getattr(args, flag)
        if value is not None:
            overrides[name] = value
    for flag, name in _SWITCHES:
        value = getattr(args, flag)
        if value is not None:
            overrides[name] = value == "on"
    retention = getattr(args, "prefix_cache_retention_interval", None)
    if retention is not None:
        if retention.strip().lower() in ("dense", "none"):
            overrides["prefix_cache_retention_interval"] = None
        else:
            try:
                overrides["prefix_cache_retention_interval"] = int(retention)
            except ValueError:
                raise ValueError(f"--prefix-cache-retention-interval takes a number of tokens or 'dense', "
                                 f"got {retention!r}") from None
    return overrides


def _check_names(args: argparse.Namespace) -> None:
    """Load ``--plugin``s (registering their names), then check each named plug-in flag."""
    from pagesim.engine.policy.plugins.user import KINDS, flag, load_plugins

    plugins = load_plugins(args.plugin)
    choices = _builtin_choices()
    for plugin in plugins:
        if plugin.name not in choices[plugin.kind]:
            choices[plugin.kind].append(plugin.name)
    for kind, k in KINDS.items():
        value = getattr(args, kind)
        if value is not None and value not in choices[kind]:
            raise ValueError(f"{flag(kind)}: unknown {k.noun} {value!r}; choose one of {', '.join(choices[kind])}")
    for plugin in plugins:
        if getattr(args, plugin.kind) != plugin.name:
            raise ValueError(f"--plugin {plugin.spec} is the {plugin.noun} {plugin.name!r}, but {flag(plugin.kind)} "
                             f"does not select it (add {flag(plugin.kind)} {plugin.name})")


def offload_blocks(args: argparse.Namespace, block_bytes: int) -> int | None:
    """The offload store's blocks the flags ask for (``None``: neither flag given):
    ``--num-offload-blocks``, else ``--kv-offloading-size`` GiB in blocks of ``block_bytes`` (one
    block of every layer, keys and values, over all the replica's GPUs, as vLLM sizes it)."""
    n, gib = getattr(args, "num_offload_blocks", None), getattr(args, "kv_offloading_size", None)
    if n is not None:
        if n < 0:
            raise ValueError(f"--num-offload-blocks must be >= 0, got {n}")
        return n
    if gib is None:
        return None
    if not 0 <= gib < 2.0**32:
        raise ValueError(f"--kv-offloading-size must be a number of GiB >= 0, got {gib:g}")
    blocks = int(gib * 2**30) // block_bytes
    if gib > 0 and blocks < 1:
        raise ValueError(f"--kv-offloading-size {gib:g} GiB holds no block of {block_bytes:,} bytes")
    return blocks
