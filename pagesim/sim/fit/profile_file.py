"""A fitted profile: the cost model's parameters fitted to measurements, as a versioned file.

One JSON document::

    {"schema": "pagesim-fitted-profile", "schema_version": 1, "kind": "fitted",
     "gpu": "h100-sxm", "server_flags": [...], "seed": 0,
     "fitted_on": [{"path", "kind", "sha256", "model", "tp", "vllm_version"}, ...],
     "held_out": [...as fitted_on...],
     "params": {NAME: {"value", "std", "start", "lower", "upper", "what"}, ...},
     "roofline": {NAME: value}, "serving_path": {"frontend_in_s": ..., "frontend_out_s": ...},
     "errors": {"fitted": [...], "held_out": [...], "leave_one_out": [...]},
     "fit": {"rounds": [...], "simulations": {...}, "wall_s": ..., "cost_before": ..., "cost_after": ...}}

``roofline`` and ``serving_path`` are what a run applies: the parameters describe the GPU and the
serving stack, so ``simulate --profile`` and ``replay --profile`` apply them to any model on that
GPU (``apply_profile``), under the roofline cost model; ``--cost-param`` and
``--frontend-latency-ms`` still win. A kernel-timed profile (``pagesim calibrate``,
``pagesim.sim.cost.profile``) is the other kind; ``read_fitted`` tells them apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from pathlib import Path

from pagesim.engine.files import InputFileError, read_json

SCHEMA = "pagesim-fitted-profile"
SCHEMA_VERSION = 1
MAX_BYTES = 64 << 20


class FittedProfileError(ValueError):
    """A fitted profile that is missing, malformed or for another GPU."""


def read_fitted(path: str | os.PathLike) -> dict | None:
    """The fitted profile at ``path``, checked (read once); ``None`` when it is not one (a
    kernel-timed profile, a shipped profile's name, or no file: that kind's loader says what is
    wrong). A file that names the fitted schema but breaks it raises ``FittedProfileError``."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data = read_json(p, limit_bytes=MAX_BYTES, what="profile")
    except InputFileError:
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise FittedProfileError(f"{p}: fitted profile schema_version {data.get('schema_version')!r}; this pagesim "
                                 f"reads {SCHEMA_VERSION}: fit it again with pagesim calibrate --from-measurements")
    from pagesim.sim.cost.roofline import RooflineParams

    roofline, path_terms = data.get("roofline"), data.get("serving_path")
    if not isinstance(roofline, dict) or not isinstance(path_terms, dict) or not isinstance(data.get("gpu"), str):
        raise FittedProfileError(f"{p}: a fitted profile needs gpu, roofline and serving_path")
    try:
        RooflineParams().with_overrides(roofline)
    except (TypeError, ValueError) as exc:
        raise FittedProfileError(f"{p}: roofline: {exc}") from None
    for key in ("frontend_in_s", "frontend_out_s"):
        value = path_terms.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise FittedProfileError(f"{p}: serving_path.{key} must be a finite number of seconds >= 0")
    return data


def digest(data: dict) -> str:
    """A fitted profile's SHA-256, over its content (a refitted profile has another)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def describe(data: dict, path) -> str:
    """The profile in words, as summaries state it."""
    models = sorted({m.get("model") or "?" for m in data.get("fitted_on", [])})
    return (f"fitted profile {path} ({len(data.get('fitted_on', []))} measurement(s) of {', '.join(models)} "
            f"on {data['gpu']})")


def apply_profile(args: argparse.Namespace, command: str) -> str | None:
    """With ``--profile`` naming a fitted profile: its parameters become the run's roofline
    parameters (before ``--cost-param``) and its frontend terms the serving path's (unless
    ``--frontend-latency-ms`` is given), and ``args.profile`` is cleared; returns the profile in
    words. A kernel-timed profile is left to the calibrated cost model (``None``), except under
    ``replay``, which has no use for one."""
    path = getattr(args, "profile", None)
    if path is None:
        return None
    data = read_fitted(path)
    if data is None:
        if command == "replay":
            raise ValueError(f"--profile {path}: replay takes a fitted profile (pagesim calibrate --from-measurements); "
                             "a kernel-timed profile times one device at tp 1 (use it with simulate or validate)")
        return None
    if getattr(args, "check_profile", False):
        raise ValueError(f"--check-profile re-times a kernel-timed profile's probe; {path} is fitted to measurements "
                         "and has none")
    from pagesim.sim.hardware import resolve_gpu_name

    if resolve_gpu_name(args.gpu) != resolve_gpu_name(data["gpu"]):
        raise ValueError(f"--profile {path} was fitted on {data['gpu']}: its efficiencies and overheads describe that "
                         f"GPU and serving stack, not --gpu {args.gpu} (give --gpu {data['gpu']}, or fit one there)")
    if getattr(args, "attention_kernel", "flash") != "flash":
        raise ValueError("--attention-kernel changes the roofline a fitted profile was fitted with; leave it out")
    args.cost_param = [f"{k}={v!r}" for k, v in data["roofline"].items()] + list(getattr(args, "cost_param", []))
    if getattr(args, "frontend_latency_ms", None) is None and hasattr(args, "frontend_latency_ms"):
        terms = data["serving_path"]
        args.frontend_latency_ms = [terms["frontend_in_s"] * 1e3, terms["frontend_out_s"] * 1e3]
    args.profile = None
    args.fitted_profile = str(path)
    return describe(data, path)


def write_fitted(path: Path, data: dict, *, force: bool) -> None:
    """Write ``data`` atomically to ``path`` (a regular file or nothing; another file only with ``force``)."""
    from pagesim.sim.cost.profile import profile_output

    if path.exists() and not force:
        raise ValueError(f"--out {path} exists; give --force to replace it")
    with profile_output(path, None).open() as fh:
        fh.write(json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
