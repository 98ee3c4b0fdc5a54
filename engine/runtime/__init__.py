"""The engine's execution side (torch): KV-cache tensors and swap space, the step's batch, paged
attention, the runner that carries out a ``SchedulerOutput``, sampling, the engine loop and the
no-paging reference check. The policy (``engine.policy``) decides; this package executes.

Names are imported on first use, so ``pagesim --help`` (which loads ``engine.runtime.cli``) does
not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "engine.runtime.engine",
    "EngineStalled": "engine.runtime.engine",
    "RequestRecord": "engine.runtime.engine",
    "RequestTooLong": "engine.runtime.engine",
    "StepRecord": "engine.runtime.engine",
    "PagedKVCache": "engine.runtime.kv_cache",
    "ExecutionError": "engine.runtime.runner",
    "ModelRunner": "engine.runtime.runner",
    "SamplingParams": "engine.runtime.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine.runtime' has no attribute {name!r}")
