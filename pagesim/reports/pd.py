"""Disaggregated prefill/decode in a study: the P:D split of a GPU budget, the KV links, each pool's settings.

A study compares a *P:D split* of a fixed number of GPUs with colocated serving on the same GPUs
(``pagesim.sim.disagg``: a prefill pool, a decode pool, vLLM's proxy between them, the KV over a
modelled network). The settings, all absent by default (so a study without them keeps its run ids):

- ``gpus``: the GPU budget the split shares (an integer);
- ``pd_split``: ``"P:D"`` (``"1:7"``: one prefill and seven decode replicas) or ``"colocated"``
  (``gpus / tp`` colocated replicas behind ``router``, as ``replicas`` would give). A P:D run must
  spend the budget exactly: ``P x prefill tp + D x decode tp = gpus``;
- ``kv_link_bandwidth`` (GB/s per GPU and direction, every KV link; absent: the presets, NVLink
  within a node and the GPU's RDMA NIC between nodes), ``kv_link_latency_us`` (absent: 10 NVLink,
  30 RDMA) and ``gpus_per_node`` (absent: 8), as ``simulate``'s ``--kv-link-bandwidth``,
  ``--kv-link-latency-us`` and ``--gpus-per-node``;
- ``prefill_router`` / ``decode_router`` (absent: round-robin, vLLM's proxy);
- ``prefill_<key>`` / ``decode_<key>`` for each ``POOL_KEYS`` key: one pool's value of the study
  setting ``<key>`` (``prefill_tp = 2``, ``decode_max_num_seqs = 256``, ...), what ``simulate
  --prefill KEY=VALUE`` sets; absent: the run's own value of ``<key>``.

A setting moot for a run (``moot``) is left out of its config, so runs that differ only in it are
one run: the links, routers and pool settings mean nothing to a colocated run (a study over two
bandwidths has one colocated run, shared by both), and ``router`` nothing to a P:D run.

Invariant: this module imports nothing of the study's (``pagesim.reports.run_config`` imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

COLOCATED = "colocated"
POOLS = ("prefill", "decode")
#: The study settings a pool may set on its own (``prefill_tp``, ``decode_max_num_seqs``, ...).
POOL_KEYS = ("tp", "kv_cache_gb", "num_gpu_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
             "chunked_prefill", "prefix_caching", "preemption", "eviction")
POOL_SETTINGS = {f"{pool}_{key}": (pool, key) for pool in POOLS for key in POOL_KEYS}
LINK_SETTINGS = ("kv_link_bandwidth", "kv_link_latency_us", "gpus_per_node")
ROUTER_SETTINGS = ("prefill_router", "decode_router")
#: Settings only a P:D run has (moot for a colocated one).
PD_ONLY = (*LINK_SETTINGS, *ROUTER_SETTINGS, *POOL_SETTINGS)
#: Every setting of this module, with its type (the pool settings' types are their keys').
SETTING_TYPES: dict[str, Any] = {"gpus": int, "pd_split": str, "kv_link_bandwidth": float,
                                 "kv_link_latency_us": float, "gpus_per_node": int, "prefill_router": str,
                                 "decode_router": str}
SETTINGS = ("gpus", "pd_split", *PD_ONLY)
GB = 1e9  # (the network's GB: pagesim.sim.hardware.GB)


@dataclass(frozen=True)
class Split:
    """A run's deployment as the budget is split: ``prefill`` and ``decode`` replicas, or, for
    colocated serving, ``replicas`` (the other two None)."""

    gpus: int
    prefill: int | None = None
    decode: int | None = None
    replicas: int | None = None

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None


def parse_split(value: Any) -> tuple[int, int] | None:
    """``"P:D"`` as (P, D); None for ``"colocated"``; ValueError for anything else."""
    if value == COLOCATED:
        return None
    text = value if isinstance(value, str) else ""
    p, sep, d = text.partition(":")
    if not sep or not p.strip().isdigit() or not d.strip().isdigit() or int(p) < 1 or int(d) < 1:
        raise ValueError(f"pd_split = {value!r}: give \"P:D\" (prefill:decode replicas, each >= 1, e.g. \"1:7\") "
                         f"or \"{COLOCATED}\"")
    return int(p), int(d)


def is_disaggregated(config: dict[str, Any]) -> bool:
    value = config.get("pd_split")
    return value is not None and value != COLOCATED


def moot(config: dict[str, Any]) -> set[str]:
    """Settings that mean nothing to this run (module docstring)."""
    return {"router"} if is_disaggregated(config) else set(PD_ONLY)


def pool_tp(config: dict[str, Any], pool: str) -> int:
    return config.get(f"{pool}_tp") or config.get("tp") or 1


def split_of(config: dict[str, Any]) -> Split | None:
    """The run's split of its budget (None: a run without ``pd_split``); ValueError, in one line,
    for a split that does not spend the budget or a setting that contradicts it."""
    value = config.get("pd_split")
    gpus = config.get("gpus")
    if value is None:
        if gpus is not None:
            raise ValueError(f"gpus = {gpus} is the GPU budget a pd_split shares: give pd_split (\"P:D\" or "
                             f"\"{COLOCATED}\") too, or leave gpus out and give replicas")
        given = [k for k in PD_ONLY if config.get(k) is not None]
        if given:
            raise ValueError(f"{given[0]} sets a disaggregated run: give pd_split = \"P:D\" and gpus")
        return None
    if gpus is None:
        raise ValueError(f"pd_split = {value!r} needs gpus (the GPU budget it splits)")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if (config.get("replicas") or 1) != 1:
        raise ValueError(f"replicas = {config['replicas']}: with pd_split the replica counts come from gpus and tp "
                         f"(leave replicas out)")
    parsed = parse_split(value)
    tp = config.get("tp") or 1
    if parsed is None:
        if gpus % tp:
            raise ValueError(f"pd_split = \"{COLOCATED}\": gpus = {gpus} is not a whole number of replicas of tp {tp}")
        return Split(gpus, replicas=gpus // tp)
    p, d = parsed
    tp_p, tp_d = pool_tp(config, "prefill"), pool_tp(config, "decode")
    used = p * tp_p + d * tp_d
    if used != gpus:
        raise ValueError(f"pd_split = {value!r} uses {used} GPUs ({p} prefill x tp {tp_p} + {d} decode x tp {tp_d}), "
                         f"not the budget gpus = {gpus}")
    return Split(gpus, prefill=p, decode=d)


def check_links(config: dict[str, Any]) -> None:
    """The network settings' ranges (ValueError in one line)."""
    bandwidth, latency, per_node = (config.get(k) for k in LINK_SETTINGS)
    if bandwidth is not None and not 0 < bandwidth < math.inf:
        raise ValueError(f"kv_link_bandwidth must be a positive number of GB/s, got {bandwidth:g}")
    if latency is not None and not 0 <= latency < math.inf:
        raise ValueError(f"kv_link_latency_us must be a finite number of microseconds >= 0, got {latency:g}")
    if per_node is not None and per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {per_node}")
    for pool in POOLS:
        tp = pool_tp(config, pool)
        if per_node is not None and tp > per_node:
            raise ValueError(f"a {pool} replica of tp {tp} does not fit a node of gpus_per_node = {per_node}")


def pool_config(config: dict[str, Any], pool: str, replicas: int) -> dict[str, Any]:
    """The colocated config one pool's replicas are built from: the run's settings with the pool's
    own laid over (``prefill_tp`` as ``tp``, ...), ``replicas`` of them, no P/D settings. A pool
    that sizes its KV cache one way (``kv_cache_gb`` or ``num_gpu_blocks``) drops the run's other
    way, as ``simulate --prefill`` does."""
    out = {k: v for k, v in config.items() if k not in SETTINGS and k != "router"}
    own = {key: config[name] for name, (p, key) in POOL_SETTINGS.items() if p == pool and config.get(name) is not None}
    for key, other in (("kv_cache_gb", "num_gpu_blocks"), ("num_gpu_blocks", "kv_cache_gb")):
        if key in own and other not in own:
            out[other] = None
    out.update(own)
    out["replicas"] = replicas
    return out


def colocated_config(config: dict[str, Any], split: Split | None) -> dict[str, Any]:
    """A colocated run's config as it is built: ``replicas`` from the budget, no P/D settings."""
    if split is None:
        return config
    out = {k: v for k, v in config.items() if k not in SETTINGS}
    out["replicas"] = split.replicas
    return out


def network_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """``pagesim.sim.disagg.network.NetworkSpec``'s arguments from the run's link settings."""
    bandwidth, latency, per_node = (config.get(k) for k in LINK_SETTINGS)
    out: dict[str, Any] = {"bandwidth_bytes_per_s": None if bandwidth is None else bandwidth * GB,
                           "latency_s": None if latency is None else latency * 1e-6}
    if per_node is not None:
        out["gpus_per_node"] = per_node
    return out
