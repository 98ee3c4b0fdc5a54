"""Requests: validation, and prefix identity (traces without text) shared at any block size."""

from __future__ import annotations

import pytest

from pagesim.engine.policy import Request, Scheduler, make_config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_len=0, max_tokens=1), "prompt_len must be >= 1"),
        (dict(prompt_len=4, max_tokens=0), "max_tokens must be >= 1"),
        (dict(prompt_len=3, prompt_token_ids=[1, 2], max_tokens=1), "prompt_len 3 but 2 prompt token ids"),
        (dict(prompt_len=4, max_tokens=1, n=2, beam_width=2), "not both"),
        (dict(prompt_len=4, max_tokens=1, prefix_block_ids=[1]), "prefix_block_tokens must be >= 1"),
        (dict(prompt_len=0, prompt_token_ids=[1], prefix_block_ids=[1], prefix_block_tokens=4, max_tokens=1), "not both"),
    ],
)
def test_bad_requests_are_refused_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Request("r", **kwargs)


def hit_tokens(block_size: int, a: dict, b: dict) -> int:
    """Admit ``a`` and run it one step, then admit ``b``: how many of b's tokens hit the cache."""
    scheduler = Scheduler(make_config("vllm-v1", block_size=block_size, num_gpu_blocks=256, max_num_batched_tokens=4096))
    scheduler.add_request(Request("a", **a))
    scheduler.update(scheduler.schedule())
    scheduler.add_request(Request("b", **b))
    out = scheduler.schedule()
    scheduler.check()
    return out.new["b"]


@pytest.mark.parametrize("block_size, expected", [(4, 40), (8, 40), (16, 32), (6, 36), (64, 0)])
def test_prefix_identities_share_the_same_tokens_at_any_block_size(block_size, expected):
    """Trace-style prompts: identities of 16-token blocks (like Mooncake's 512-token hash ids).
    Both prompts start with identities 1, 2 (32 tokens) and the first 8 tokens of identity 3's
    block; b's prompt is cut there, so 40 tokens are shared and b's last token is recomputed."""
    a = dict(prompt_len=60, prefix_block_ids=[1, 2, 3, 4], prefix_block_tokens=16, max_tokens=2)
    b = dict(prompt_len=41, prefix_block_ids=[1, 2, 3], prefix_block_tokens=16, max_tokens=2)
    # shared: 40 tokens; b's hit is capped below its 41 tokens and rounded down to full blocks
    assert hit_tokens(block_size, a, b) == expected


def test_different_identities_never_hit():
    a = dict(prompt_len=32, prefix_block_ids=[1, 2], prefix_block_tokens=16, max_tokens=2)
    b = dict(prompt_len=32, prefix_block_ids=[1, 5], prefix_block_tokens=16, max_tokens=2)
    assert hit_tokens(4, a, b) == 16


def test_prompts_without_identities_and_unnamed_outputs_are_unique_to_their_sequence():
    a = dict(prompt_len=32, max_tokens=20)
    assert hit_tokens(4, a, dict(prompt_len=32, max_tokens=2)) == 0


def test_a_preempted_request_finds_its_own_generated_blocks_again():
    """Unnamed generated tokens are unique to their sequence, so only the request itself can hit
    them: after a recompute preemption it re-admits with its prompt and outputs cached."""
    scheduler = Scheduler(
        make_config("vllm-v1", block_size=4, num_gpu_blocks=9, max_num_batched_tokens=64, max_model_len=128)
    )
    # 8 usable blocks of 4; both grow to 4 blocks (16 tokens), then 'a' needs a fifth: 'b' goes,
    # its 4 full blocks stay cached; 'a' finishes after taking one of them (b's tail, LRU).
    scheduler.add_request(Request("a", prompt_len=8, max_tokens=12))
    scheduler.add_request(Request("b", prompt_len=8, max_tokens=20))
    resumed = {}
    while scheduler.has_unfinished_requests:
        out = scheduler.schedule()
        resumed.update(out.resumed)
        scheduler.update(out)
        scheduler.check()
    assert resumed == {"b": 12}  # its 8 prompt tokens and 4 of its generated tokens


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("kind", ["plain", "identities", "ragged identities", "token ids"])
def test_block_contents_are_block_content_block_by_block(kind, block_size):
    """``Request.block_contents`` (one call for a run of blocks, as ``KVCacheManager.block_key``
    makes keys) gives exactly ``block_content`` of each block, whichever of its fast paths
    applies: prompts with no token ids (by no identity, or by identities of whole blocks, or of
    segments a block straddles), prompts of token ids, unnamed outputs, and outputs with a named
    token or not yet generated; every start and stop, so runs that cross the prompt's end too."""
    from pagesim.engine.policy.scheduling.request import Sequence

    prompt = {"plain": {}, "identities": dict(prefix_block_ids=[7, 8, 9], prefix_block_tokens=16),
              "ragged identities": dict(prefix_block_ids=[7, 8], prefix_block_tokens=6),
              "token ids": dict(prompt_token_ids=list(range(100, 140)))}[kind]
    request = Request("r", prompt_len=40, max_tokens=30, **prompt)
    for index, outputs in enumerate(([None] * 20, [None] * 5 + [3] + [None] * 14, [])):
        seq = Sequence(request, index, output_token_ids=list(outputs))
        for start in range(0, 64, block_size):
            for stop in range(start, 64 + 1, block_size):
                expected = [request.block_content(seq, s, s + block_size) for s in range(start, stop, block_size)]
                assert request.block_contents(seq, start, stop, block_size) == expected, (outputs, start, stop)
