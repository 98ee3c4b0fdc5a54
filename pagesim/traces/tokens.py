"""Pseudo-token ids for prompts known only by length and prefix-block identities.

An engine needs token ids; a trace such as Mooncake gives only ``hash_ids``, each standing for
512 tokens. ``prompt_token_ids`` expands them so that **each identity gives the same tokens
wherever it appears**: the token at offset ``o`` of identity ``h`` is a fixed hash of ``(h, o)``,
so a block that is only partly used (the prompt's last) holds exactly the identity's first
tokens. Two prompts therefore share exactly the tokens their identities share, and a prefix
cache hashing blocks of *any* size (16, 64, 512, ...) finds the sharing the trace describes.

Tokens of a request without identities are drawn from that request's own stream (keyed by its
row), so they are shared with nobody. Token ids lie in ``[first_token, vocab_size)``, leaving the
lowest ids (BOS, EOS, padding in most vocabularies) unused. The hash is splitmix64, computed with
numpy on whole prompts; equal 16-token blocks from different identities have probability about
``vocab ** -16`` of colliding.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NO_IDENTITY = np.uint64(0xD1B54A32D192ED03)  # salt for requests without identities


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _check_vocabulary(vocab_size: int, first_token: int) -> None:
    if first_token < 0 or vocab_size < first_token + 256:
        raise ValueError(f"pseudo-tokens need a vocabulary of at least {first_token + 256} ids "
                         f"(got vocab_size {vocab_size}); a tiny one would make unrelated blocks collide")


def identity_tokens(ids, block_tokens: int, num_tokens: int, *, vocab_size: int, first_token: int = 3) -> np.ndarray:
    """The first ``num_tokens`` pseudo-tokens of the identities ``ids`` (``block_tokens`` each)."""
    _check_vocabulary(vocab_size, first_token)
    ids = np.asarray(ids, dtype=np.uint64)
    if num_tokens > len(ids) * block_tokens:
        raise ValueError(f"{len(ids)} identities of {block_tokens} tokens cannot cover {num_tokens} tokens")
    positions = np.arange(num_tokens, dtype=np.uint64)
    owner = ids[positions // np.uint64(block_tokens)]
    offset = positions % np.uint64(block_tokens)
    with np.errstate(over="ignore"):
        mixed = splitmix64(splitmix64(owner) + offset)
    return (mixed % np.uint64(vocab_size - first_token)).astype(np.int64) + first_token


def private_tokens(row: int, num_tokens: int, *, vocab_size: int, first_token: int = 3) -> np.ndarray:
    """``num_tokens`` pseudo-tokens belonging to request ``row`` alone."""
    _check_vocabulary(vocab_size, first_token)
    with np.errstate(over="ignore"):
        stream = splitmix64(np.full(1, row, dtype=np.uint64) ^ _NO_IDENTITY)[0]
        mixed = splitmix64(stream + np.arange(num_tokens, dtype=np.uint64) * _GOLDEN)
    return (mixed % np.uint64(vocab_size - first_token)).astype(np.int64) + first_token
