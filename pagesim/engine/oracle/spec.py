"""An oracle workload spec (``case_NNN.spec.json``): the vLLM version, its scheduler settings and
the requests with the step each arrives at. Format: ``shared/oracle/README.md`` §1.

``load_spec`` validates everything it reads and names the file and field of anything wrong, so a
bad spec is one error line, never a traceback. A key it does not know, at the top level, in
``config`` (where v1 specs have no v0 keys) or in a request, is refused by name with the keys
allowed there: a setting the replay would silently ignore is a setting it would get wrong. The
file must be a regular file of at most ``MAX_SPEC_BYTES``. ``OracleSpec.scheduler_config``
maps the settings onto a preset (``vllm-v1`` for 0.32.0 and 0.33.0, ``vllm-v0`` for 0.6.3):
``num_blocks`` -> ``num_gpu_blocks`` (v1 counts its null block in it, as the preset does), and v0's
``preemption_mode: null`` -> vLLM's default rule (``vllm-v0``). Of vLLM 0.33.0's keys
(``README-0.33.md``) it reads priority scheduling's (config ``scheduling_policy``; per request
``priority`` and ``arrival_time``), the hybrid KV-cache manager's (``kv_group_windows``: one entry
per KV-cache group in vLLM's group order, ``null`` or a window in tokens;
``prefix_cache_retention_interval``: ``null`` or a count of tokens >= 0, checked as the preset checks
it) and KV offloading's (``num_offload_blocks``, ``offload_eviction_policy`` ``lru`` or ``arc``,
``offload_prompt_only``, ``offload_sync_load_budget_bytes``, and the fake worker's
``offload_load_steps`` / ``offload_store_steps``, each at least 1); a 0.33 key in a spec of another
version is refused as one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.engine.files import read_json
from pagesim.engine.policy import SchedulerConfig, make_config

#: vLLM version in a spec -> the preset that reproduces it. vLLM 0.33.0's specs (``README-0.33.md``)
#: replay through ``vllm-v1`` with 0.32's step loop; of their keys, those of priority scheduling.
VERSION_PRESETS = {"0.32.0": "vllm-v1", "0.6.3": "vllm-v0", "0.33.0": "vllm-v1"}

_CONFIG_KEYS = {
    "block_size": int,
    "num_blocks": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "max_model_len": int,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "watermark": (int, float),
}
_V0_KEYS = {"num_cpu_blocks": int, "preemption_mode": (str, type(None))}
#: vLLM 0.33's optional config keys the replay reads (README-0.33.md: ``vllm-0.33-v1-priority/``,
#: ``vllm-0.33-v1-hybrid/``)
_V033_KEYS = {"scheduling_policy": str, "kv_group_windows": list, "prefix_cache_retention_interval": (int, type(None)),
              "num_offload_blocks": int, "offload_eviction_policy": str, "offload_prompt_only": bool,
              "offload_sync_load_budget_bytes": int, "offload_load_steps": int, "offload_store_steps": int}
#: the offload keys that are settings of the scheduler (the other two are the fake worker's)
_OFFLOAD_SETTINGS = ("num_offload_blocks", "offload_eviction_policy", "offload_prompt_only",
                     "offload_sync_load_budget_bytes")
#: offload keys and the least each may be
_OFFLOAD_MINIMUM = {"num_offload_blocks": 1, "offload_sync_load_budget_bytes": 0, "offload_load_steps": 1,
                    "offload_store_steps": 1}
_TOP_KEYS = ("config", "requests", "vllm_version")
_REQUEST_KEYS = ("id", "arrival_step", "prompt_token_ids", "max_tokens", "n", "ignore_eos")
#: vLLM 0.33's optional request keys: ``priority`` (lower is more important), ``arrival_time`` (seconds;
#: default ``float(arrival_step)``, vLLM's ``Request.arrival_time``)
_V033_REQUEST_KEYS = ("priority", "arrival_time")
_SCHEDULING_POLICIES = ("fcfs", "priority")
#: the least each count in config may be
_CONFIG_MINIMUM = {"block_size": 1, "num_blocks": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
                   "max_model_len": 1, "num_cpu_blocks": 0}
MAX_SPEC_BYTES = 64 * 2**20  # the shared specs are a few KiB
_PREEMPTION_MODES = {None: "vllm-v0", "swap": "swap", "recompute": "recompute"}
#: Arrival steps beyond this are refused: the replay steps through every idle step before them.
MAX_ARRIVAL_STEP = 1_000_000


@dataclass(frozen=True, slots=True)
class OracleRequest:
    request_id: str
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    n: int = 1
    priority: int = 0  # (vLLM 0.33 specs) lower is more important
    arrival_time: float | None = None  # (vLLM 0.33 specs) seconds; None: float(arrival_step)


@dataclass(frozen=True, slots=True)
class OracleSpec:
    path: str
    vllm_version: str
    config: dict[str, Any]
    requests: tuple[OracleRequest, ...]

    @property
    def num_kv_groups(self) -> int:
        """KV-cache groups (vLLM 0.33 hybrid specs: one per ``kv_group_windows`` entry; else 1)."""
        return len(self.config.get("kv_group_windows", (None,)))

    @property
    def offload_steps(self) -> tuple[int, int]:
        """(loads, stores): steps a copy takes in the fake worker (a copy issued by step t's
        ``schedule()`` is reported done in step t + L - 1's output; README-0.33.md)."""
        c = self.config
        return c.get("offload_load_steps", 1), c.get("offload_store_steps", 1)

    @property
    def offloads(self) -> bool:
        return bool(self.config.get("num_offload_blocks"))

    @property
    def preset(self) -> str:
        return VERSION_PRESETS[self.vllm_version]

    @property
    def is_v0(self) -> bool:
        return self.preset == "vllm-v0"

    def scheduler_config(self, preset: str | None = None) -> SchedulerConfig:
        c = self.config
        settings: dict[str, Any] = dict(
            block_size=c["block_size"],
            num_gpu_blocks=c["num_blocks"],
            max_num_seqs=c["max_num_seqs"],
            max_num_batched_tokens=c["max_num_batched_tokens"],
            max_model_len=c["max_model_len"],
            enable_prefix_caching=c["enable_prefix_caching"],
            enable_chunked_prefill=c["enable_chunked_prefill"],
            watermark=float(c["watermark"]),
        )
        if "scheduling_policy" in c:
            settings["scheduling_policy"] = c["scheduling_policy"]
        if "kv_group_windows" in c:
            settings["kv_group_windows"] = tuple(c["kv_group_windows"])
        if "prefix_cache_retention_interval" in c:
            settings["prefix_cache_retention_interval"] = c["prefix_cache_retention_interval"]
        for key in _OFFLOAD_SETTINGS:
            if key in c:
                settings[key] = c[key]
        if c.get("offload_sync_load_budget_bytes"):
            # NOTE: vLLM's budget counts the model's bytes per block; the specs' budgets are 0 or
            # 1 TiB, so any block size gives the same decisions: one byte per block.
            settings["offload_block_bytes"] = 1
        if self.is_v0:
            settings["num_cpu_blocks"] = c["num_cpu_blocks"]
            settings["preemption_mode"] = _PREEMPTION_MODES[c["preemption_mode"]]
        try:
            return make_config(preset or self.preset, **settings)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None


def _check(value: Any, kind: Any, where: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ValueError(f"{where} must be {names}, got {value!r}")
    return value


def _refuse_unknown(obj: dict, allowed, where: str, later: str = "") -> None:
    """Refuse the first key of ``obj`` not in ``allowed``; ``later``: what to say of a key that a
    later vLLM version's specs have (README-0.33.md), this version's not."""
    unknown = [key for key in obj if key not in allowed]
    if unknown:
        name = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:39] + "…"
        if name in _V033_KEYS or name in _V033_REQUEST_KEYS:
            later = later or " (a vLLM 0.33.0 key)"
        else:
            later = ""
        raise ValueError(f"{where}: unknown key {name!r}{later} (allowed: {_key_list(allowed)})")


def _key_list(keys) -> str:
    """``keys`` for a message, the ``offload_*`` ones as one brace group (the line stays short)."""
    offload = [key[len("offload_"):] for key in keys if key.startswith("offload_")]
    rest = [key for key in keys if not key.startswith("offload_")]
    if len(offload) > 1:
        rest.append("offload_{" + ",".join(offload) + "}")
    else:
        rest += [f"offload_{key}" for key in offload]
    return ", ".join(rest)


def load_spec(path: str | Path) -> OracleSpec:
    """Read and validate a spec file; every problem is a ``ValueError`` naming the file and field."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ValueError(f"{path}: no such spec file")
    raw = read_json(path, limit_bytes=MAX_SPEC_BYTES, what="oracle spec")
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a spec is a JSON object with config, requests and vllm_version")
    _refuse_unknown(raw, _TOP_KEYS, f"{path}")
    for key in _TOP_KEYS:
        if key not in raw:
            raise ValueError(f"{path}: missing {key!r}")
    version = raw["vllm_version"]
    if not isinstance(version, str) or version not in VERSION_PRESETS:
        raise ValueError(
            f"{path}: vllm_version {version!r} has no preset; known: "
            + ", ".join(f"{v} ({p})" for v, p in VERSION_PRESETS.items())
        )
    config = raw["config"]
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config must be an object")
    keys = dict(_CONFIG_KEYS)
    if VERSION_PRESETS[version] == "vllm-v0":
        keys.update(_V0_KEYS)
    optional = _V033_KEYS if version == "0.33.0" else {}
    _refuse_unknown(config, (*keys, *optional), f"{path}: config (vLLM {version})")
    for key, kind in optional.items():
        if key in config:
            _check(config[key], kind, f"{path}: config.{key}")
    windows = config.get("kv_group_windows", [None])
    if not windows or not all(w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 1) for w in windows):
        raise ValueError(f"{path}: config.kv_group_windows must be a non-empty list of null (full attention) or "
                         f"windows in tokens >= 1, got {windows!r}")
    for key, least in _OFFLOAD_MINIMUM.items():
        if key in config and isinstance(config[key], int) and config[key] < least:
            raise ValueError(f"{path}: config.{key} must be >= {least}, got {config[key]}")
    if config.get("offload_eviction_policy", "lru") not in ("lru", "arc"):
        raise ValueError(f"{path}: config.offload_eviction_policy must be lru or arc (vLLM's), "
                         f"got {config['offload_eviction_policy']!r}")
    interval = config.get("prefix_cache_retention_interval", 0)
    if interval is not None and interval < 0:
        raise ValueError(f"{path}: config.prefix_cache_retention_interval must be null or >= 0, got {interval}")
    if config.get("scheduling_policy", "fcfs") not in _SCHEDULING_POLICIES:
        raise ValueError(f"{path}: config.scheduling_policy must be one of {', '.join(_SCHEDULING_POLICIES)}, "
                         f"got {config['scheduling_policy']!r}")
    request_keys = (*_REQUEST_KEYS, *_V033_REQUEST_KEYS) if optional else _REQUEST_KEYS
    for key, kind in keys.items():
        if key not in config:
            raise ValueError(f"{path}: config is missing {key!r}")
        _check(config[key], kind, f"{path}: config.{key}")
        if key in _CONFIG_MINIMUM and config[key] < _CONFIG_MINIMUM[key]:
            raise ValueError(f"{path}: config.{key} must be >= {_CONFIG_MINIMUM[key]}, got {config[key]}")
    if not (math.isfinite(config["watermark"]) and 0 <= config["watermark"] < 1):
        raise ValueError(f"{path}: config.watermark must be in [0, 1), got {config['watermark']!r}")
    if VERSION_PRESETS[version] == "vllm-v0" and config["preemption_mode"] not in _PREEMPTION_MODES:
        raise ValueError(f"{path}: config.preemption_mode must be null, 'swap' or 'recompute'")
    requests = raw["requests"]
    if not isinstance(requests, list) or not requests:
        raise ValueError(f"{path}: requests must be a non-empty list")
    parsed = []
    seen = set()
    last_step = 0
    for i, r in enumerate(requests):
        where = f"{path}: requests[{i}]"
        if not isinstance(r, dict):
            raise ValueError(f"{where} must be an object")
        _refuse_unknown(r, request_keys, where)
        for key in ("id", "arrival_step", "prompt_token_ids", "max_tokens"):
            if key not in r:
                raise ValueError(f"{where} is missing {key!r}")
        rid = _check(r["id"], str, f"{where}.id")
        if not rid or rid in seen:
            raise ValueError(f"{where}.id {rid!r} is empty or repeated")
        seen.add(rid)
        step = _check(r["arrival_step"], int, f"{where}.arrival_step")
        if not 0 <= step <= MAX_ARRIVAL_STEP:
            raise ValueError(f"{where}.arrival_step must be in 0..{MAX_ARRIVAL_STEP}, got {step}")
        if step < last_step:
            raise ValueError(f"{where}: requests must be in arrival_step order")
        last_step = step
        tokens = _check(r["prompt_token_ids"], list, f"{where}.prompt_token_ids")
        if not tokens or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError(f"{where}.prompt_token_ids must be a non-empty list of token ids")
        n = _check(r.get("n", 1), int, f"{where}.n")
        if n < 1:
            raise ValueError(f"{where}.n must be >= 1")
        if n > 1 and VERSION_PRESETS[version] != "vllm-v0":
            raise ValueError(f"{where}.n must be 1 (parallel samples are a v0 case)")
        if r.get("ignore_eos", True) is not True:
            raise ValueError(f"{where}: ignore_eos must be true (the oracle's model never emits EOS)")
        max_tokens = _check(r["max_tokens"], int, f"{where}.max_tokens")
        if max_tokens < 1:
            raise ValueError(f"{where}.max_tokens must be >= 1")
        if len(tokens) + max_tokens > config["max_model_len"]:
            # README §1; vLLM and pagesim stop differently at max_model_len (> vs >=).
            raise ValueError(f"{where}: prompt + max_tokens exceeds max_model_len {config['max_model_len']}")
        priority = _check(r.get("priority", 0), int, f"{where}.priority")
        arrival_time = r.get("arrival_time")
        if arrival_time is not None:
            _check(arrival_time, (int, float), f"{where}.arrival_time")
            if not math.isfinite(arrival_time):
                raise ValueError(f"{where}.arrival_time must be a finite number of seconds, got {arrival_time!r}")
            arrival_time = float(arrival_time)
        parsed.append(OracleRequest(rid, step, tuple(tokens), max_tokens, n, priority, arrival_time))
    return OracleSpec(str(path), version, dict(config), tuple(parsed))
