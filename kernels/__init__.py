"""Paged KV-cache kernels: Triton PagedAttention (decode, prefill), cache write, block copy, swap.

Every function has one signature for every backend (``backend="auto" | "triton" | "torch"``; see
``kernels.ops``). ``kernels.reference`` is the torch backend, the fast CPU path and the readable
statement of each kernel; ``kernels.triton_attention`` and ``kernels.triton_cache`` are the Triton
kernels; ``kernels.swap`` moves blocks between GPU and CPU caches; ``kernels.validate`` checks
arguments. Nothing here imports from ``engine/``.
"""

from kernels.ops import (
    BACKENDS,
    copy_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    resolve_backend,
    write_kv_cache,
)
from kernels.swap import swap_blocks
from kernels.validate import KernelArgumentError

__all__ = [
    "BACKENDS",
    "KernelArgumentError",
    "copy_blocks",
    "paged_decode_attention",
    "paged_prefill_attention",
    "resolve_backend",
    "swap_blocks",
    "write_kv_cache",
]
