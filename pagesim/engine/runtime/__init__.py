"""The engine's execution side (torch): KV-cache tensors and swap space, the step's batch, paged
attention, the runner that carries out a ``SchedulerOutput``, sampling, the engine loop, a prefill
and a decode engine driven together (``disagg``) and the no-paging reference check. The policy (``pagesim.engine.policy``) decides; this package executes.

Names are imported on first use, so ``pagesim --help`` (which loads ``pagesim.engine.runtime.cli``) does
not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DisaggEngine": "pagesim.engine.runtime.disagg",
    "Engine": "pagesim.engine.runtime.engine",
    "EngineStalled": "pagesim.engine.runtime.engine",
    "RequestRecord": "pagesim.engine.runtime.engine",
    "RequestTooLong": "pagesim.engine.runtime.engine",
    "StepRecord": "pagesim.engine.runtime.engine",
    "PagedKVCache": "pagesim.engine.runtime.kv_cache",
    "PdSchedule": "pagesim.engine.runtime.disagg",
    "ExecutionError": "pagesim.engine.runtime.runner",
    "ModelRunner": "pagesim.engine.runtime.runner",
    "SamplingParams": "pagesim.engine.runtime.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagesim.engine.runtime' has no attribute {name!r}")
