"""Walk a set of request ids in the order vLLM's process walked it (``PYTHONHASHSEED=0``).

Some of vLLM's decisions depend on the order a ``set[str]`` is iterated in: vLLM 0.33's
offloading connector tells its eviction policy of the requests finished in a step by walking a
set of their ids, and the CPU blocks those requests free are reused in that order. A set's order
follows its members' hashes, and a string's hash follows the interpreter's hash seed, so the
golden decision logs were made with ``PYTHONHASHSEED=0`` and a replay under another seed makes
other decisions. pagesim's answers must not depend on how the process was started (a simulation
run twice gives the same figures; ``pytest`` is run without the variable), so where the policy
keeps such a set it stores ``Seed0Str`` ids: strings whose hash is the one CPython gives them with
hash seed 0 (SipHash-1-3 with a zero key over the string's internal bytes, CPython 3.11+'s
``_Py_HashBytes``). A Python ``set`` of them iterates exactly as a set of plain strings does in a
process started with ``PYTHONHASHSEED=0``: a set's order depends only on its members' hashes and
the sequence of adds and removes.

Invariant: ``hash(Seed0Str(s))`` equals ``hash(s)`` in a CPython 3.11+ process with
``PYTHONHASHSEED=0`` (checked by tests/test_seed0_set.py in such a child process).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["Seed0Str", "seed0_hash"]

_MASK = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _siphash13_zero_key(data: bytes) -> int:
    """SipHash-1-3 (one compression round, three finalization rounds) with key (0, 0)."""
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573

    def sip_round() -> None:
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & _MASK
        v2 = (v2 + v3) & _MASK
        v1 = _rotl(v1, 13) ^ v0
        v3 = _rotl(v3, 16) ^ v2
        v0 = _rotl(v0, 32)
        v2 = (v2 + v1) & _MASK
        v0 = (v0 + v3) & _MASK
        v1 = _rotl(v1, 17) ^ v2
        v3 = _rotl(v3, 21) ^ v0
        v2 = _rotl(v2, 32)

    n = len(data)
    full = n - n % 8
    for i in range(0, full, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        sip_round()
        v0 ^= m
    b = ((n & 0xFF) << 56) | int.from_bytes(data[full:], "little")
    v3 ^= b
    sip_round()
    v0 ^= b
    v2 ^= 0xFF
    sip_round()
    sip_round()
    sip_round()
    return v0 ^ v1 ^ v2 ^ v3


@lru_cache(maxsize=65536)
def seed0_hash(s: str) -> int:
    """``hash(s)`` in a CPython 3.11+ process started with ``PYTHONHASHSEED=0``."""
    if not s:
        return 0
    top = max(map(ord, s))
    # CPython hashes a string's compact storage: 1, 2 or 4 bytes a character (little-endian here).
    data = s.encode("latin-1") if top < 0x100 else (
        s.encode("utf-16-le", "surrogatepass") if top < 0x10000 else s.encode("utf-32-le", "surrogatepass"))
    x = _siphash13_zero_key(data)
    x = x - (1 << 64) if x >> 63 else x  # (Py_hash_t is signed)
    return -2 if x == -1 else x


class Seed0Str(str):
    """A string that hashes as it would under ``PYTHONHASHSEED=0`` (equal to the plain string)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return seed0_hash(str(self))
