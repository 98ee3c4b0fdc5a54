"""How many requests fit in a KV cache: paged blocks vs contiguous max-length slabs.

The calculator people reach for first. Given a model (which fixes the bytes one token costs), the
lengths the requests hold, a block size, a maximum model length and a KV-cache budget in bytes:

- a *contiguous* system reserves ``max_model_len`` slots per request up front, so it holds
  ``len(lengths) * max_model_len`` slots and fits ``kv_bytes // (max_model_len * bytes_per_token)``
  requests whatever their true lengths;
- a *paged* system holds ``ceil(length / block_size)`` blocks per request, wasting under one block
  each (the idle slots of the last block), and fits ``total_blocks / mean blocks per request``
  requests of the same mix.

Everything is integer arithmetic except the two utilization ratios, so the counts are exact.
Invariants: ``tokens <= paged_slots < tokens + len(lengths) * block_size``; each request's
``idle_slots <= block_size - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from engine.model_presets import ModelPreset


@dataclass(slots=True, frozen=True)
class RequestFootprint:
    """One request under paging: its tokens, its blocks, and the unused slots of its last block."""

    length_tokens: int
    blocks: int
    idle_slots: int


@dataclass(slots=True, frozen=True)
class CapacityReport:
    """Paged vs contiguous footprint and capacity of one request mix (all counts exact)."""

    model_name: str
    bytes_per_token: int
    block_size: int
    max_model_len: int
    kv_bytes: int
    num_requests: int
    tokens: int
    paged_blocks: int
    paged_slots: int
    paged_utilization: float
    contiguous_slots: int
    contiguous_utilization: float
    total_blocks: int
    contiguous_capacity_slots: int
    paged_capacity_requests: int
    contiguous_capacity_requests: int
    idle_slots_max: int
    requests: tuple[RequestFootprint, ...]

    @property
    def mean_blocks_per_request(self) -> float:
        return self.paged_blocks / self.num_requests

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (requests as a list of dicts)."""
        result = asdict(self)
        result["requests"] = [asdict(request) for request in self.requests]
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


def paged_footprint(length_tokens: int, block_size: int) -> RequestFootprint:
    """Blocks a request of ``length_tokens`` tokens holds, and the idle slots in its last block."""
    blocks = -(-length_tokens // block_size)  # ceil without floats
    return RequestFootprint(length_tokens, blocks, blocks * block_size - length_tokens)


def compute_capacity(
    preset: ModelPreset,
    lengths: Sequence[int],
    block_size: int,
    max_model_len: int,
    kv_bytes: float,
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
    bytes_per_token = preset.kv_bytes_per_token
    footprints = tuple(paged_footprint(length, block_size) for length in lengths)
    num_requests = len(footprints)
    tokens = sum(lengths)
    paged_blocks = sum(footprint.blocks for footprint in footprints)
    paged_slots = paged_blocks * block_size
    contiguous_slots = num_requests * max_model_len
    total_blocks = kv_bytes_int // (block_size * bytes_per_token)
    contiguous_capacity_slots = kv_bytes_int // bytes_per_token
    # floor(total_blocks / (paged_blocks / num_requests)) in integers, so no float rounding.
    paged_capacity_requests = total_blocks * num_requests // paged_blocks
    contiguous_capacity_requests = kv_bytes_int // (max_model_len * bytes_per_token)
    return CapacityReport(
        model_name=preset.name,
        bytes_per_token=bytes_per_token,
        block_size=block_size,
        max_model_len=max_model_len,
        kv_bytes=kv_bytes_int,
        num_requests=num_requests,
        tokens=tokens,
        paged_blocks=paged_blocks,
        paged_slots=paged_slots,
        paged_utilization=tokens / paged_slots,
        contiguous_slots=contiguous_slots,
        contiguous_utilization=tokens / contiguous_slots,
        total_blocks=total_blocks,
        contiguous_capacity_slots=contiguous_capacity_slots,
        paged_capacity_requests=paged_capacity_requests,
        contiguous_capacity_requests=contiguous_capacity_requests,
        idle_slots_max=block_size - 1,
        requests=footprints,
    )
