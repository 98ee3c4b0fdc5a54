"""Prefix identities for benchmark prompts: one per 16-token chunk, a hash of the chunk's token ids.

A prefix cache shares what two prompts share at the start. For a trace to carry that, prompt
``i`` gets one identity per chunk of ``PREFIX_CHUNK_TOKENS`` tokens: identity ``k`` is a 63-bit
hash of ``tokens[16k:16k+16]`` and of the chunk's length (the last chunk may be short, and a
short chunk never equals a full one). The policy's prefix cache chains block keys (a block's
key includes its parent's), so two prompts share cached blocks exactly as long as their chunks
agree from the first one on; ``pagesim.engine.policy.scheduling.request`` turns identities into block content at any
block size (``_identity_segments``). At block sizes that are multiples of 16 this is the sharing
vLLM would see with the same token ids; below 16, a prompt's short last chunk shares nothing.

Synthetic datasets (random, prefix_repetition) have no text: they get seeded pseudo-token ids
(``pseudo_tokens``), the same ids for a shared prefix and ids of their own for the rest.
"""

from __future__ import annotations

import numpy as np

from pagesim.traces.tokens import splitmix64

PREFIX_CHUNK_TOKENS = 16  # tokens per prefix identity
_MASK_63 = np.uint64(2**63 - 1)
_PAD = np.uint64(0xFFFF_FFFF_FFFF_FFFF)  # fills a short chunk's unused slots (its length is hashed too)


def chunk_identities(token_lists: list) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(values, offsets)`` of every prompt's chunk identities (``ceil(len / 16)`` each)."""
    lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    chunks = -(-lengths // PREFIX_CHUNK_TOKENS)
    offsets = np.zeros(len(token_lists) + 1, np.int64)
    np.cumsum(chunks, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, np.int64), offsets
    flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists]).astype(np.uint64)
    # each token's chunk (global) and slot within it
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    within = np.arange(len(flat)) - starts
    chunk = np.repeat(offsets[:-1], lengths) + within // PREFIX_CHUNK_TOKENS
    matrix = np.full((total, PREFIX_CHUNK_TOKENS), _PAD, np.uint64)
    matrix[chunk, within % PREFIX_CHUNK_TOKENS] = flat
    # each chunk's length: 16, except a prompt's last chunk
    chunk_len = np.full(total, PREFIX_CHUNK_TOKENS, np.uint64)
    last = offsets[1:][chunks > 0] - 1
    chunk_len[last] = (lengths[chunks > 0] - (chunks[chunks > 0] - 1) * PREFIX_CHUNK_TOKENS).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = splitmix64(chunk_len)
        for k in range(PREFIX_CHUNK_TOKENS):
            mixed = splitmix64(mixed ^ matrix[:, k])
    return (mixed & _MASK_63).astype(np.int64), offsets


def pseudo_tokens(seed: int, stream: str, key: int, count: int) -> np.ndarray:
    """``count`` int64 pseudo-token ids of stream ``(seed, stream, key)``: the same arguments give
    the same ids, different ones unrelated ids."""
    salt = np.uint64(int.from_bytes(stream.encode()[:8].ljust(8, b"\0"), "little"))
    with np.errstate(over="ignore"):
        base = splitmix64(splitmix64(np.uint64(seed) ^ salt) + np.uint64(key))
        ids = splitmix64(base + np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return (ids & np.uint64(2**31 - 1)).astype(np.int64)
