"""The public kernel functions: one signature, three backends (``auto``, ``triton``, ``torch``).

``auto`` runs Triton on CUDA tensors and torch on CPU tensors. ``triton`` on CPU tensors runs in
Triton's interpreter, which must be chosen before the Triton kernels are first imported
(``TRITON_INTERPRET=1`` in the environment); it is slow and meant for tests. Every function checks
its arguments (``pagesim.kernels.validate``) before any backend runs, so both backends refuse the same
inputs with the same message.

Shapes: caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``; block tables
``[num_seqs, max_blocks_per_seq]`` int32; a token's slot is ``block_id * block_size + offset``.
"""

from __future__ import annotations

import importlib
from typing import Literal

import torch

from pagesim.kernels import reference
from pagesim.kernels.validate import (
    TRITON_DTYPES,
    KernelArgumentError,
    check_attention,
    check_copy,
    check_prefill_layout,
    check_write,
)

Backend = Literal["auto", "triton", "torch"]
BACKENDS = ("auto", "triton", "torch")


def _triton_module(name: str):
    try:
        return importlib.import_module(f"pagesim.kernels.{name}")
    except ImportError as exc:  # pragma: no cover - triton is a dependency on Linux
        raise KernelArgumentError(f"the triton backend needs the triton package ({exc})") from exc


def resolve_backend(fn: str, backend: str, device: torch.device) -> str:
    """``"triton"`` or ``"torch"`` for a call on ``device``; a clear error for what cannot run."""
    if backend not in BACKENDS:
        raise KernelArgumentError(f"{fn}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return "torch"
    if device.type == "cuda":
        return "triton"
    if backend == "auto":
        return "torch"
    if device.type != "cpu":
        raise KernelArgumentError(f"{fn}: the triton backend runs on CUDA, or on CPU in the interpreter; got {device}")
    if not _triton_module("triton_attention").interpreting():
        raise KernelArgumentError(
            f"{fn}: backend='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "in the environment before the kernels are first used, or use backend='torch'"
        )
    return "triton"


def _triton_for(fn: str, backend: str, t: torch.Tensor) -> bool:
    """Whether the call runs on Triton; float64 (a torch-backend dtype) is refused there."""
    if resolve_backend(fn, backend, t.device) == "torch":
        return False
    if t.dtype not in TRITON_DTYPES:
        raise KernelArgumentError(
            f"{fn}: {str(t.dtype).removeprefix('torch.')} runs on the torch backend only "
            "(the Triton kernels take float32, float16 or bfloat16)"
        )
    return True


def _check_positive_int(fn: str, name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise KernelArgumentError(f"{fn}: {name} must be a positive int or None, got {value!r}")


def paged_decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, >= 1, tokens in the cache incl. the new one
    scale: float,
    *,
    backend: Backend = "auto",
    max_context_len: int | None = None,
    num_splits: int | None = None,
    window: int | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence attends to its sequence's cached tokens through the block table
    (with a sliding ``window``, to its last ``window`` tokens only; the blocks before are not read).

    ``max_context_len`` (the largest of ``context_lens``) spares a device synchronisation when the
    caller knows it; ``num_splits`` forces the flash-decoding split count (Triton; default chosen
    from the grid size and context length; at most 64 and one per 64-token tile). On CUDA, values
    are trusted (no device synchronisation): a ``max_context_len`` below a sequence's length
    shortens only the splits before the last, never the sequence.
    """
    fn = "paged_decode_attention"
    check_attention(fn, query, key_cache, value_cache, block_tables, context_lens, scale, seq_lens_name="context_lens")
    _check_positive_int(fn, "max_context_len", max_context_len)
    _check_positive_int(fn, "num_splits", num_splits)
    _check_positive_int(fn, "window", window)
    if max_context_len is not None and context_lens.device.type == "cpu" and context_lens.numel():
        if max_context_len < int(context_lens.max()):
            raise KernelArgumentError(
                f"{fn}: max_context_len={max_context_len} is below the longest context ({int(context_lens.max())})"
            )
    if not _triton_for(fn, backend, query):
        return reference.decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale, window)
    return _triton_module("triton_attention").decode_attention(
        query, key_cache, value_cache, block_tables, context_lens, scale,
        max_context_len=max_context_len, num_splits=num_splits, window=window,
    )


def paged_prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed in order
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32: sequence i's queries are [start[i], start[i+1])
    seq_lens: torch.Tensor,  # [num_seqs] int32: tokens in the cache, this chunk included
    scale: float,
    *,
    backend: Backend = "auto",
    max_query_len: int | None = None,
    window: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """A chunk of new tokens per sequence attends to the cached prefix and causally to itself.

    The chunk's own K/V must already be in the cache (``write_kv_cache`` first): sequence ``i``'s
    queries are its last ``q_len`` of ``seq_lens[i]`` tokens, and query ``j`` sees positions
    ``0 .. seq_lens[i] - q_len + j`` (with a sliding ``window``, the last ``window`` of them; blocks
    wholly before the first query's window are not read). A whole prompt is the case of an empty
    prefix.
    """
    fn = "paged_prefill_attention"
    num_seqs = seq_lens.shape[0] if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1 else None
    check_attention(
        fn, query, key_cache, value_cache, block_tables, seq_lens, scale, seq_lens_name="seq_lens", num_seqs=num_seqs
    )
    check_prefill_layout(fn, query, query_start_loc, seq_lens)
    _check_positive_int(fn, "max_query_len", max_query_len)
    _check_positive_int(fn, "window", window)
    if max_query_len is not None and query_start_loc.device.type == "cpu" and seq_lens.numel():
        longest = int((query_start_loc[1:] - query_start_loc[:-1]).max())
        if max_query_len < longest:
            raise KernelArgumentError(f"{fn}: max_query_len={max_query_len} is below the longest chunk ({longest})")
    if not _triton_for(fn, backend, query):
        return reference.prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                                           window)
    return _triton_module("triton_attention").prefill_attention(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, max_query_len=max_query_len,
        window=window,
    )


def write_kv_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int32/int64; -1 skips the token
    *,
    backend: Backend = "auto",
) -> None:
    """Write each token's K/V into its slot (in place)."""
    fn = "write_kv_cache"
    check_write(fn, key, value, key_cache, value_cache, slot_mapping)
    if not _triton_for(fn, backend, key_cache):
        reference.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    else:
        _triton_module("triton_cache").write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def copy_blocks(
    key_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,  # [num_pairs, 2] (src, dst), on the caches' device
    *,
    backend: Backend = "auto",
) -> None:
    """One step's copy-on-write copies, for every layer, in one launch (in place)."""
    fn = "copy_blocks"
    check_copy(fn, key_caches, value_caches, block_mapping)
    if not _triton_for(fn, backend, key_caches[0]):
        reference.copy_blocks(key_caches, value_caches, block_mapping)
    else:
        _triton_module("triton_cache").copy_blocks(key_caches, value_caches, block_mapping)
