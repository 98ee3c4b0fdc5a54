"""Where each table is measured: grids that cover what a step of the simulated model can ask.

Axes double from 1 (costs are near affine between neighbours, so interpolation errs little) up
to what the engine's defaults allow: the default token budget (``max(context length, 2048)``, at
most 8,192), 256 sequences (the default ``max_num_seqs``), contexts up to the model's context
length (at most 16,384; beyond, the fitted roofline form extrapolates and says so). Decode
attention, copies and swaps are measured at block sizes 8, 16 and 32 (vLLM's choices on CUDA);
prefill attention at 16 (its cost is the tokens' and context's, nearly independent of the block
size). ``quick`` keeps every axis's ends and fewer points in between, for tests and CI.
"""

from __future__ import annotations

from pagesim.engine.model.config import LlamaConfig

BLOCK_SIZES = (8, 16, 32)
MAX_CONTEXT = 16384  # longer contexts come from the fitted roofline form (a grid point must fit in memory)
MAX_TOKENS = 8192


def _doubling(lo: int, hi: int) -> list[int]:
    out, x = [], lo
    while x < hi:
        out.append(x)
        x *= 2
    return [*out, hi]


def grids(config: LlamaConfig, *, quick: bool = False, max_seqs: int = 256) -> dict[str, list[list[int]]]:
    """Table name -> one list of values per axis (the axes of ``pagesim.sim.cost.profile.TABLES``)."""
    context = min(config.max_position_embeddings, MAX_CONTEXT)
    # the default token budget: max(context, 2048) without chunked prefill (vLLM's rule)
    max_tokens = max(2048, min(config.max_position_embeddings, MAX_TOKENS))
    tokens = _doubling(1, max_tokens)
    seqs = _doubling(1, max_seqs)
    contexts = [1, *(c for c in _doubling(16, context) if c > 1)]
    prefill_context = [0, *_doubling(16, context)]
    blocks = _doubling(1, 256)
    cow_blocks = _doubling(1, 64)
    if quick:
        tokens = _thin(tokens)
        seqs = _thin(seqs)
        contexts = _thin(contexts)
        prefill_context = _thin(prefill_context)
        blocks, cow_blocks = _thin(blocks), _thin(cow_blocks)
    block_sizes = list(BLOCK_SIZES)
    return {
        "dense_layer": [tokens],
        "model_outer": [tokens],
        "lm_head": [seqs],
        "cache_write": [tokens],
        "decode_attention": [block_sizes, seqs, contexts],
        "prefill_attention": [tokens, prefill_context],
        "cow_copy": [block_sizes, cow_blocks],
        "swap_out": [block_sizes, blocks],
        "swap_in": [block_sizes, blocks],
        "sampling": [seqs],
        "batch_prep": [seqs],
        "policy": [seqs],
    }


def _thin(values: list[int]) -> list[int]:
    """Every other value, keeping both ends."""
    kept = values[::2]
    return kept if kept[-1] == values[-1] else [*kept, values[-1]]
