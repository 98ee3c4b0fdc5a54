"""An oracle workload spec (``case_NNN.spec.json``): the vLLM version, its scheduler settings and
the requests with the step each arrives at. Format: ``shared/oracle/README.md`` §1.

``load_spec`` validates everything it reads and names the file and field of anything wrong, so a
bad spec is one error line, never a traceback. A key it does not know, at the top level, in
``config`` (where v1 specs have no v0 keys) or in a request, is refused by name with the keys
allowed there: a setting the replay would silently ignore is a setting it would get wrong. The
file must be a regular file of at most ``MAX_SPEC_BYTES``. ``OracleSpec.scheduler_config``
maps the settings onto a preset (``vllm-v1`` for 0.32.0, ``vllm-v0`` for 0.6.3):
``num_blocks`` -> ``num_gpu_blocks`` (v1 counts its null block in it, as the preset does), and v0's
``preemption_mode: null`` -> vLLM's default rule (``vllm-v0``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.files import read_json
from engine.policy import SchedulerConfig, make_config

#: vLLM version in a spec -> the preset that reproduces it.
VERSION_PRESETS = {"0.32.0": "vllm-v1", "0.6.3": "vllm-v0"}

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
_TOP_KEYS = ("config", "requests", "vllm_version")
_REQUEST_KEYS = ("id", "arrival_step", "prompt_token_ids", "max_tokens", "n", "ignore_eos")
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


@dataclass(frozen=True, slots=True)
class OracleSpec:
    path: str
    vllm_version: str
    config: dict[str, Any]
    requests: tuple[OracleRequest, ...]

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


def _refuse_unknown(obj: dict, allowed, where: str) -> None:
    unknown = [key for key in obj if key not in allowed]
    if unknown:
        name = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:39] + "…"
        raise ValueError(f"{where}: unknown key {name!r} (allowed: {', '.join(allowed)})")


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
    _refuse_unknown(config, tuple(keys), f"{path}: config (vLLM {version})")
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
        _refuse_unknown(r, _REQUEST_KEYS, where)
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
        parsed.append(OracleRequest(rid, step, tuple(tokens), max_tokens, n))
    return OracleSpec(str(path), version, dict(config), tuple(parsed))
