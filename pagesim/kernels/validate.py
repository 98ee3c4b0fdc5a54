"""Argument checks shared by every kernel launcher, whichever backend runs it.

A kernel that reads through a block table trusts its arguments: a wrong dtype is reinterpreted
memory, a block id past the cache is an out-of-bounds read. So each public function checks shapes,
dtypes, strides and devices first and raises ``KernelArgumentError`` naming the function and the
argument. Values (context lengths, block ids, slots) are checked only on CPU tensors: on CUDA that
would cost a device synchronisation per call, and the engine's validation mode (poisoned freed
blocks) catches wrong values there instead, as vLLM trusts its own metadata.
"""

from __future__ import annotations

import math

import torch

# float64 runs on the torch backend only: the engine's exact reference checks on CPU use it.
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ATTENTION_DTYPES = (*TRITON_DTYPES, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256
MAX_BLOCK_SIZE = 1024


class KernelArgumentError(ValueError):
    """A kernel was called with an argument it does not support; the message names it."""


class _Checker:
    """Collects the name of the calling function so every message starts with it."""

    def __init__(self, fn: str):
        self.fn = fn

    def fail(self, message: str) -> KernelArgumentError:
        return KernelArgumentError(f"{self.fn}: {message}")

    def tensor(self, name: str, value: object, *, ndim: int) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise self.fail(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() != ndim:
            raise self.fail(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
        return value

    def dtype(self, name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
        if t.dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            raise self.fail(f"{name} must be one of {names}, got {str(t.dtype).removeprefix('torch.')}")

    def same_dtype(self, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
        if t.dtype != ref.dtype:
            raise self.fail(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")

    def same_device(self, tensors: dict[str, torch.Tensor]) -> torch.device:
        devices = {name: t.device for name, t in tensors.items()}
        first_name, first = next(iter(devices.items()))
        for name, dev in devices.items():
            if dev != first:
                raise self.fail(f"{name} is on {dev} but {first_name} is on {first}; all must be on one device")
        return first

    def dim_equals(self, name: str, t: torch.Tensor, dim: int, expected: int, what: str) -> None:
        if t.shape[dim] != expected:
            raise self.fail(f"{name}.shape[{dim}] must equal {what} ({expected}), got {t.shape[dim]}")

    def last_dim_contiguous(self, name: str, t: torch.Tensor) -> None:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise self.fail(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")

    def contiguous(self, name: str, t: torch.Tensor) -> None:
        if not t.is_contiguous():
            raise self.fail(f"{name} must be contiguous (strides {t.stride()} for shape {tuple(t.shape)})")


def check_caches(c: _Checker, key_cache: object, value_cache: object, *, key="key_cache", value="value_cache"):
    """``[num_blocks, block_size, num_kv_heads, head_dim]`` pairs of one shape and dtype."""
    k = c.tensor(key, key_cache, ndim=4)
    v = c.tensor(value, value_cache, ndim=4)
    c.dtype(key, k, ATTENTION_DTYPES)
    c.same_dtype(value, v, key, k)
    if k.shape != v.shape:
        raise c.fail(f"{value} has shape {tuple(v.shape)} but {key} has {tuple(k.shape)}; they must match")
    c.contiguous(key, k)
    c.contiguous(value, v)
    c.same_device({key: k, value: v})
    num_blocks, block_size, _, head_dim = k.shape
    if num_blocks < 1:
        raise c.fail(f"{key} has no blocks")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise c.fail(f"block size ({key}.shape[1]) must be in 1..{MAX_BLOCK_SIZE}, got {block_size}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise c.fail(f"head_dim ({key}.shape[3]) must be in 1..{MAX_HEAD_DIM}, got {head_dim}")
    return k, v


def check_attention(
    fn: str,
    query: object,
    key_cache: object,
    value_cache: object,
    block_tables: object,
    seq_lens: object,
    scale: object,
    *,
    seq_lens_name: str,
    num_seqs: int | None = None,
) -> None:
    """Checks common to decode and prefill attention (query is ``[tokens, heads, head_dim]``)."""
    c = _Checker(fn)
    q = c.tensor("query", query, ndim=3)
    c.dtype("query", q, ATTENTION_DTYPES)
    c.last_dim_contiguous("query", q)
    k, _ = check_caches(c, key_cache, value_cache)
    c.same_dtype("key_cache", k, "query", q)
    c.dim_equals("query", q, 2, k.shape[3], "head_dim of key_cache")
    num_heads, num_kv_heads = q.shape[1], k.shape[2]
    if num_heads % num_kv_heads:
        raise c.fail(
            f"query's {num_heads} heads are not a multiple of key_cache's {num_kv_heads} KV heads "
            "(grouped-query attention needs num_heads = group * num_kv_heads)"
        )
    bt = c.tensor("block_tables", block_tables, ndim=2)
    c.dtype("block_tables", bt, (torch.int32,))
    c.last_dim_contiguous("block_tables", bt)
    lens = c.tensor(seq_lens_name, seq_lens, ndim=1)
    c.dtype(seq_lens_name, lens, (torch.int32,))
    c.contiguous(seq_lens_name, lens)
    n = q.shape[0] if num_seqs is None else num_seqs
    c.dim_equals("block_tables", bt, 0, n, "the number of sequences")
    c.dim_equals(seq_lens_name, lens, 0, n, "the number of sequences")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise c.fail(f"scale must be a finite positive number, got {scale!r}")
    c.same_device({"query": q, "key_cache": k, "value_cache": value_cache, "block_tables": bt, seq_lens_name: lens})
    if lens.device.type == "cpu" and n:
        _check_lengths_and_tables(c, lens, bt, k.shape[0], k.shape[1], seq_lens_name)


def _check_lengths_and_tables(c, lens, bt, num_blocks, block_size, name) -> None:
    capacity = bt.shape[1] * block_size
    if int(lens.min()) < 1:
        raise c.fail(f"{name} must be >= 1, got {int(lens.min())} at index {int(lens.argmin())}")
    if int(lens.max()) > capacity:
        i = int(lens.argmax())
        raise c.fail(
            f"{name}[{i}] = {int(lens[i])} exceeds what block_tables can address "
            f"({bt.shape[1]} blocks x block size {block_size} = {capacity})"
        )
    used = torch.arange(bt.shape[1]) < ((lens.long() + block_size - 1) // block_size)[:, None]
    ids = bt[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise c.fail(f"block_tables holds block id {bad} within a sequence's length; the cache has {num_blocks} blocks")


def check_prefill_layout(fn: str, query: torch.Tensor, query_start_loc: object, seq_lens: torch.Tensor) -> None:
    """``query_start_loc`` is ``[num_seqs + 1]`` int32 offsets into query's tokens, starting at 0."""
    c = _Checker(fn)
    qsl = c.tensor("query_start_loc", query_start_loc, ndim=1)
    c.dtype("query_start_loc", qsl, (torch.int32,))
    c.contiguous("query_start_loc", qsl)
    c.dim_equals("query_start_loc", qsl, 0, seq_lens.shape[0] + 1, "the number of sequences + 1")
    c.same_device({"query": query, "query_start_loc": qsl})
    if qsl.device.type != "cpu":
        return
    starts = qsl.long()
    if int(starts[0]) != 0 or int(starts[-1]) != query.shape[0]:
        raise c.fail(f"query_start_loc must start at 0 and end at query.shape[0] ({query.shape[0]}), got {starts[0]}..{starts[-1]}")
    q_lens = starts[1:] - starts[:-1]
    if q_lens.numel() and int(q_lens.min()) < 0:
        raise c.fail("query_start_loc must be non-decreasing")
    longer = q_lens > seq_lens.long()
    if bool(longer.any()):
        i = int(longer.nonzero()[0])
        raise c.fail(f"sequence {i} has {int(q_lens[i])} query tokens but seq_lens[{i}] = {int(seq_lens[i])}")


def check_write(fn: str, key, value, key_cache, value_cache, slot_mapping) -> None:
    c = _Checker(fn)
    k = c.tensor("key", key, ndim=3)
    v = c.tensor("value", value, ndim=3)
    kc, _ = check_caches(c, key_cache, value_cache)
    c.same_dtype("key", k, "key_cache", kc)
    c.same_dtype("value", v, "key_cache", kc)
    if k.shape != v.shape:
        raise c.fail(f"value has shape {tuple(v.shape)} but key has {tuple(k.shape)}; they must match")
    c.dim_equals("key", k, 1, kc.shape[2], "num_kv_heads of key_cache")
    c.dim_equals("key", k, 2, kc.shape[3], "head_dim of key_cache")
    c.last_dim_contiguous("key", k)
    c.last_dim_contiguous("value", v)
    slots = c.tensor("slot_mapping", slot_mapping, ndim=1)
    c.dtype("slot_mapping", slots, INDEX_DTYPES)
    c.contiguous("slot_mapping", slots)
    c.dim_equals("slot_mapping", slots, 0, k.shape[0], "the number of tokens")
    c.same_device({"key": k, "value": v, "key_cache": kc, "value_cache": value_cache, "slot_mapping": slots})
    if slots.device.type == "cpu" and slots.numel():
        num_slots = kc.shape[0] * kc.shape[1]
        live = slots[slots >= 0].long()
        if int(slots.min()) < -1 or (live.numel() and int(live.max()) >= num_slots):
            bad = int(slots.min()) if int(slots.min()) < -1 else int(live.max())
            raise c.fail(f"slot {bad} is outside the cache's {num_slots} slots (-1 skips a token)")
        if live.unique().numel() != live.numel():
            raise c.fail("slot_mapping names a slot twice; each written slot must be distinct")


def check_block_mapping(c: _Checker, mapping: object, *, num_src: int, num_dst: int) -> torch.Tensor:
    m = c.tensor("block_mapping", mapping, ndim=2)
    c.dtype("block_mapping", m, INDEX_DTYPES)
    c.dim_equals("block_mapping", m, 1, 2, "2 (source, destination)")
    if m.device.type == "cpu" and m.numel():
        src, dst = m[:, 0].long(), m[:, 1].long()
        for name, ids, limit in (("source", src, num_src), ("destination", dst, num_dst)):
            if int(ids.min()) < 0 or int(ids.max()) >= limit:
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise c.fail(f"{name} block {bad} is outside 0..{limit - 1}")
        if dst.unique().numel() != dst.numel():
            raise c.fail("a destination block appears twice in block_mapping")
    return m


def check_copy(fn: str, key_caches, value_caches, block_mapping) -> None:
    c = _Checker(fn)
    if not isinstance(key_caches, (list, tuple)) or not isinstance(value_caches, (list, tuple)):
        raise c.fail("key_caches and value_caches must be lists of per-layer cache tensors")
    if len(key_caches) != len(value_caches) or not key_caches:
        raise c.fail(f"need one key and one value cache per layer, got {len(key_caches)} and {len(value_caches)}")
    first, _ = check_caches(c, key_caches[0], value_caches[0], key="key_caches[0]", value="value_caches[0]")
    for i, (k, v) in enumerate(zip(key_caches, value_caches)):
        k, v = check_caches(c, k, v, key=f"key_caches[{i}]", value=f"value_caches[{i}]")
        if k.shape != first.shape or k.dtype != first.dtype or k.device != first.device:
            raise c.fail(f"key_caches[{i}] differs from key_caches[0] in shape, dtype or device")
    m = check_block_mapping(c, block_mapping, num_src=first.shape[0], num_dst=first.shape[0])
    c.same_device({"key_caches[0]": first, "block_mapping": m})
    if m.device.type == "cpu" and m.numel():
        if bool(torch.isin(m[:, 1], m[:, 0]).any()):
            raise c.fail("a block is both a source and a destination of one block_mapping (order would matter)")
