"""What both readings share: the README §2 token stream, ceiling division and the two ways a
replay stops early."""

from __future__ import annotations

import zlib


class StepLimitExceeded(RuntimeError):
    """The workload did not finish within ``max_steps`` (a livelock outside the README's scope,
    e.g. a v0 swapped prefill larger than the token budget)."""


class SwapSpaceExhausted(RuntimeError):
    """README §5 *swap_need*: vLLM 0.6.3 raises when a swap-out does not fit the CPU pool
    (§6: out of scope). Raised so that callers can discard such workloads."""


def sampled_token(request_id: str, position: int) -> int:
    """README §2 "Generated tokens": the token sampled at 0-based sequence position
    ``position``."""
    return 10000 + zlib.crc32(f"{request_id}:{position}".encode()) % 40000


def cdiv(a: int, b: int) -> int:
    """Ceiling division that is also correct for negative ``a`` (needed by §5 *touched*)."""
    return -(-a // b)
