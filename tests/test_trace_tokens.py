"""Prefix identities become tokens that share exactly what the identities share, at any block size.

A Mooncake-style trace gives each prompt as chained ``hash_ids`` of 512 tokens. The engine needs
token ids (``pagesim.traces.tokens``), the simulator uses the identities directly (``Request``'s identity
mode), and ``trace stats --block-size`` predicts the ideal hit ratio from identities alone
(``pagesim.traces.stats.prefix_reuse_at``). All three must agree with the ground truth computed here
from the materialised tokens: a full block of B tokens is reusable exactly when the whole prefix
up to its end appeared before.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tests.conftest import scaled_examples
from pagesim.traces.stats import prefix_reuse_at
from pagesim.traces.tokens import identity_tokens
from pagesim.traces.trace import Trace

ID_TOKENS = 512
VOCAB = 32000
BLOCK_SIZES = (16, 64, 512)


@st.composite
def chained_traces(draw):
    """Requests whose hash ids extend earlier requests' chains, as Mooncake's do."""
    chains: list[list[int]] = []
    next_id = 0
    rows: list[tuple[int, list[int]]] = []
    for _ in range(draw(st.integers(2, 8))):
        if chains and draw(st.booleans()):
            parent = draw(st.sampled_from(chains))
            keep = draw(st.integers(0, len(parent)))
            ids = parent[:keep]
        else:
            ids = []
        extra = draw(st.integers(0 if ids else 1, 3))
        ids = ids + list(range(next_id, next_id + extra))
        next_id += extra
        chains.append(ids)
        # the last identity may be partial: 1..512 of its tokens
        prompt_len = (len(ids) - 1) * ID_TOKENS + draw(st.integers(1, ID_TOKENS))
        rows.append((prompt_len, ids))
    offsets = np.r_[0, np.cumsum([len(ids) for _, ids in rows])]
    return Trace(
        arrival_s=np.arange(len(rows), dtype=float),
        prompt_len=[p for p, _ in rows],
        output_len=np.ones(len(rows), dtype=int),
        prefix_id_values=np.array([v for _, ids in rows for v in ids], dtype=np.int64),
        prefix_id_offsets=offsets,
        prefix_block_tokens=ID_TOKENS,
    )


def _shared_tokens(trace: Trace, a: int, b: int) -> int:
    """Tokens two prompts share by their identities: equal leading ids, cut by both lengths."""
    ids_a, ids_b = trace.prefix_ids(a), trace.prefix_ids(b)
    common = 0
    while common < min(len(ids_a), len(ids_b)) and ids_a[common] == ids_b[common]:
        common += 1
    return min(common * ID_TOKENS, int(trace.prompt_len[a]), int(trace.prompt_len[b]))


def _token_blocks(tokens: np.ndarray, block_size: int) -> list[bytes]:
    """Chained keys of the full blocks: the bytes of the whole prefix up to each block's end."""
    return [tokens[: (j + 1) * block_size].tobytes() for j in range(len(tokens) // block_size)]


@settings(max_examples=scaled_examples(40), deadline=None)
@given(chained_traces())
def test_pseudo_tokens_share_exactly_what_identities_share(trace):
    tokens = [trace.prompt_token_ids(i, vocab_size=VOCAB) for i in range(len(trace))]
    for block_size in BLOCK_SIZES:
        blocks = [_token_blocks(t, block_size) for t in tokens]
        for a in range(len(trace)):
            for b in range(a + 1, len(trace)):
                shared_blocks = sum(x == y for x, y in zip(blocks[a], blocks[b]))
                assert shared_blocks == _shared_tokens(trace, a, b) // block_size, (a, b, block_size)


@settings(max_examples=scaled_examples(40), deadline=None)
@given(chained_traces())
def test_identity_mode_requests_match_token_mode(trace):
    """The simulator's identity contents and the engine's token contents give the same sharing."""
    for block_size in BLOCK_SIZES:
        by_identity, by_tokens = [], []
        for i in range(len(trace)):
            for mode, out in ((None, by_identity), (VOCAB, by_tokens)):
                request = trace.request(i, vocab_size=mode)
                seq = request.seqs[0]
                full = request.prompt_len // block_size
                prefix: list = []
                keys = []
                for j in range(full):
                    content = request.block_content(seq, j * block_size, (j + 1) * block_size)
                    prefix.append(content)
                    keys.append(tuple(prefix))
                out.append(keys)
        # equal prefix keys under one representation exactly when equal under the other
        flat_id = [k for keys in by_identity for k in keys]
        flat_tok = [k for keys in by_tokens for k in keys]
        for x in range(len(flat_id)):
            for y in range(x + 1, len(flat_id)):
                assert (flat_id[x] == flat_id[y]) == (flat_tok[x] == flat_tok[y])


@settings(max_examples=scaled_examples(40), deadline=None)
@given(chained_traces())
def test_prefix_reuse_at_block_size_matches_tokens(trace):
    tokens = [trace.prompt_token_ids(i, vocab_size=VOCAB) for i in range(len(trace))]
    for block_size in BLOCK_SIZES:
        seen: set[bytes] = set()
        hits = total = 0
        for t in tokens:
            for key in _token_blocks(t, block_size):
                hits += key in seen
                total += 1
                seen.add(key)
        expected = None if total == 0 else hits / total
        got = prefix_reuse_at(trace, block_size)
        assert (got is None) == (expected is None)
        if expected is not None:
            assert abs(got - expected) < 1e-12


def test_identity_tokens_are_stable_and_in_vocabulary():
    tokens = identity_tokens([7, 9], ID_TOKENS, 600, vocab_size=300)
    again = identity_tokens([7], ID_TOKENS, 512, vocab_size=300)
    assert np.array_equal(tokens[:512], again)  # the same identity gives the same tokens anywhere
    assert tokens.min() >= 3 and tokens.max() < 300  # low ids (BOS/EOS/pad) left unused
    other = identity_tokens([8], ID_TOKENS, 512, vocab_size=VOCAB)
    assert not np.array_equal(identity_tokens([7], ID_TOKENS, 512, vocab_size=VOCAB)[:16], other[:16])


def test_too_few_identities_or_a_tiny_vocabulary_is_refused():
    import pytest

    with pytest.raises(ValueError, match="cannot cover"):
        identity_tokens([1], ID_TOKENS, 513, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="vocabulary of at least"):
        identity_tokens([1], ID_TOKENS, 10, vocab_size=4)
