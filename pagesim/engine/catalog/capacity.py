"""How many requests fit in a KV cache: paged blocks vs contiguous max-length slabs.

The calculator people reach for first. Given a model (which fixes the bytes one token costs), the
lengths the requests hold, a block size, a maximum model length and a KV-cache budget in bytes:

- a *contiguous* system reserves ``max_model_len`` slots per request up front, so it holds
  ``len(lengths) * max_model_len`` slots and fits ``kv_bytes // (max_model_len * bytes_per_token)``
  requests whatever their true lengths;
- a *paged* system holds ``ceil(length / block_size)`` blocks per request, wasting under one block
  each (the idle slots of the last block), and fits ``total_blocks / mean blocks per request``
  requests of the same mix.

Models with sliding-window layers keep one block table per layer group
(``pagesim.engine.catalog.kv_layout``, vLLM v1's hybrid KV-cache manager); a block then holds one group's
layers, and in a sliding group a request holds only the blocks its window still reaches: at
length ``L`` (while its last token is computed) ``cdiv(L, bs) - floor(max(0, L - W) / bs)`` of
them, for ``min(L, W)`` tokens. Counts are then summed over groups (``groups`` breaks them down),
and a contiguous system reserves ``max_model_len`` slots in full-attention groups and
``min(W, max_model_len)`` in sliding ones (a ring buffer of the window). ``--kv-cache-dtype fp8``
halves a 16-bit model's bytes per token.

Everything is integer arithmetic except the two utilization ratios, so the counts are exact.
Invariants: ``tokens <= paged_slots < tokens + len(lengths) * block_size * num_groups``; each
request's ``idle_slots <= (block_size - 1) * num_groups`` (with sliding groups, a window's first
block may also hold a few tokens the window no longer reaches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pagesim.engine.catalog.kv_layout import KvLayout, kv_layout
from pagesim.engine.model_presets import ModelPreset


@dataclass(slots=True, frozen=True)
class RequestFootprint:
    """One request under paging: its tokens, its blocks, and the unused slots of its last block."""

    length_tokens: int
    blocks: int
    idle_slots: int


@dataclass(slots=True, frozen=True)
class GroupFootprint:
    """One layer group of the KV cache and what the request mix holds in it."""

    kind: str  # "full" or "sliding"
    window: int | None
    layers: tuple[int, ...]
    blocks: int
    tokens: int  # tokens the mix needs in this group (windows applied)


@dataclass(slots=True, frozen=True)
class CapacityReport:
    """Paged vs contiguous footprint and capacity of one request mix (all counts exact)."""

    model_name: str
    bytes_per_token: int
    context_length: int  # the model's max_position_embeddings
    kv_cache_dtype: str
    block_size: int
    block_bytes: int  # one block of one group: block_size x group_size layers
    max_model_len: int
    kv_bytes: int
    num_requests: int
    tokens: int
    paged_blocks: int
    paged_slots: int
    paged_utilization: float
    contiguous_slots: int
    contiguous_slab_slots: int  # reserved per request: max_model_len per full group, the window per sliding one
    contiguous_utilization: float
    total_blocks: int
    contiguous_capacity_slots: int
    paged_capacity_requests: int
    contiguous_capacity_requests: int
    idle_slots_max: int
    requests: tuple[RequestFootprint, ...]
    groups: tuple[GroupFootprint, ...]
    group_size: int  # layers per group, padding included

    @property
    def mean_blocks_per_request(self) -> float:
        return self.paged_blocks / self.num_requests

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (requests as a list of dicts)."""
        result = asdict(self)
        result["requests"] = [asdict(request) for request in self.requests]
        result["groups"] = [dict(asdict(group), layers=list(group.layers)) for group in self.groups]
        result["mean_blocks_per_request"] = self.mean_blocks_per_request
        return result


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _kv_bytes_int(kv_bytes: float) -> int:
    # Accept 64e9 (a float) as users write it; bytes are whole, so round down.
    if isinstance(kv_bytes, bool) or not isinstance(kv_bytes, (int, float)):
        raise ValueError(f"kv_bytes must be a number, got {kv_bytes!r}")
    if not math.isfinite(kv_bytes) or kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be a positive finite number of bytes, got {kv_bytes!r}")
    return math.floor(kv_bytes)


def paged_footprint(length_tokens: int, block_size: int, window: int | None = None) -> RequestFootprint:
    """Blocks a request of ``length_tokens`` tokens holds in one group (a sliding ``window``: only
    the blocks it still reaches), and the slots of those blocks that hold no needed token."""
    blocks = -(-length_tokens // block_size)  # ceil without floats
    needed = length_tokens
    if window is not None:
        blocks -= max(0, length_tokens - window) // block_size
        needed = min(length_tokens, window)
    return RequestFootprint(length_tokens, blocks, blocks * block_size - needed)


def _layout_footprint(layout: KvLayout, length: int, block_size: int) -> tuple[RequestFootprint, ...]:
    return tuple(paged_footprint(length, block_size, group.window) for group in layout.groups)


def compute_capacity(
    preset: ModelPreset,
    lengths: Sequence[int],
    block_size: int,
    max_model_len: int,
    kv_bytes: float,
    *,
    kv_cache_dtype: str = "auto",
) -> CapacityReport:
    """Compare paged and contiguous (max-length) KV-cache use for ``lengths`` in ``kv_bytes``.

    Raises ValueError for an empty list, a non-positive or non-integer length or size, or a
    length above ``max_model_len`` (naming the offending length and its index).
    """
    block_size = _positive_int("block_size", block_size)
    max_model_len = _positive_int("max_model_len", max_model_len)
    kv_bytes_int = _kv_bytes_int(kv_bytes)
    if len(lengths) == 0:
        raise ValueError("lengths must name at least one request")
    for index, length in enumerate(lengths):
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise ValueError(f"length at index {index} must be a positive integer, got {length!r}")
        if length > max_model_len:
            raise ValueError(
                f"length {length} at index {index} exceeds max_model_len {max_model_len}"
            )
    layout = kv_layout(preset, kv_cache_dtype=kv_cache_dtype)
    bytes_per_token = layout.bytes_per_token
    slot_bytes = layout.page_bytes_per_token  # one token in one group
    per_group = [_layout_footprint(layout, length, block_size) for length in lengths]
    footprints = tuple(
        RequestFootprint(length, sum(f.blocks for f in parts), sum(f.idle_slots for f in parts))
        for length, parts in zip(lengths, per_group)
    )
    num_requests = len(footprints)
    groups = tuple(
        GroupFootprint(group.kind, group.window, group.layers, sum(parts[g].blocks for parts in per_group),
                       sum(layout.tokens_held(group.window, length) for length in lengths))
        for g, group in enumerate(layout.groups)
    )
    tokens = sum(group.tokens for group in groups)
    paged_blocks = sum(footprint.blocks for footprint in footprints)
    paged_slots = paged_blocks * block_size
    slab = sum(layout.tokens_held(group.window, max_model_len) for group in layout.groups)
    contiguous_slots = num_requests * slab
    total_blocks = kv_bytes_int // (block_size * slot_bytes)
    contiguous_capacity_slots = kv_bytes_int // slot_bytes
    # floor(total_blocks / (paged_blocks / num_requests)) in integers, so no float rounding.
    paged_capacity_requests = total_blocks * num_requests // paged_blocks
    contiguous_capacity_requests = kv_bytes_int // (slab * slot_bytes)
    return CapacityReport(
        model_name=preset.name,
        bytes_per_token=bytes_per_token,
        context_length=preset.max_position_embeddings,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        block_bytes=block_size * slot_bytes,
        max_model_len=max_model_len,
        kv_bytes=kv_bytes_int,
        num_requests=num_requests,
        tokens=tokens,
        paged_blocks=paged_blocks,
        paged_slots=paged_slots,
        paged_utilization=tokens / paged_slots,
        contiguous_slots=contiguous_slots,
        contiguous_slab_slots=slab,
        contiguous_utilization=tokens / contiguous_slots,
        total_blocks=total_blocks,
        contiguous_capacity_slots=contiguous_capacity_slots,
        paged_capacity_requests=paged_capacity_requests,
        contiguous_capacity_requests=contiguous_capacity_requests,
        idle_slots_max=(block_size - 1) * len(layout.groups),
        requests=footprints,
        groups=groups,
        group_size=layout.group_size,
    )
