"""Paged KV-cache kernels: Triton PagedAttention (decode, prefill), cache write, block copy, swap.

Every function has one signature for every backend (``backend="auto" | "triton" | "torch"``; see
``pagesim.kernels.ops``). ``pagesim.kernels.reference`` is the torch backend, the fast CPU path and the readable
statement of each kernel; ``pagesim.kernels.triton_attention`` and ``pagesim.kernels.triton_cache`` are the Triton
kernels; ``pagesim.kernels.swap`` moves blocks between GPU and CPU caches; ``pagesim.kernels.validate`` checks
arguments. Nothing here imports from ``pagesim/engine/``.
"""

from pagesim.kernels.ops import (
    BACKENDS,
    copy_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    resolve_backend,
    write_kv_cache,
)
from pagesim.kernels.swap import swap_blocks
from pagesim.kernels.validate import KernelArgumentError

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
