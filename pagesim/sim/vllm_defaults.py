"""The batch limits ``vllm serve`` picks when it is not told, so that ``--policy vllm-v1`` runs what
a user's server runs.

vLLM 0.33 (``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults``, the
``OPENAI_API_SERVER`` usage context that ``vllm serve`` runs under) sizes ``max_num_seqs`` and
``max_num_batched_tokens`` by the GPU's memory and name:

| GPU | ``max_num_batched_tokens`` | ``max_num_seqs`` |
|---|---|---|
| 160 GiB or more (B200, B300) | 16,384 | 1,024 |
| 70 GiB or more, not an A100 (H100, H200, H20, MI300X, ...) | 8,192 | 1,024 |
| any other (A100 of either size, L40S, A10G, ...) | 2,048 | 256 |

Without chunked prefill the token budget is at least ``max_model_len`` (as vLLM's). The offline
``LLM`` class has larger defaults (16,384 tokens on H100 and H200); pagesim models the server.
pagesim's own presets keep 256 sequences and 8,192 tokens (``pagesim.engine.policy.scheduling.config``).
"""

from __future__ import annotations

from pagesim.sim.hardware import GpuPreset

GIB = 2**30


def vllm_serve_batch_limits(gpu: GpuPreset) -> dict[str, int]:
    """``max_num_seqs`` and ``max_num_batched_tokens`` that ``vllm serve`` picks on ``gpu``."""
    if gpu.memory_bytes >= 160 * GIB:
        return {"max_num_batched_tokens": 16384, "max_num_seqs": 1024}
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    return {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
