"""Admission rules: which requests the pool can ever serve, and how much of it an admission may use.

A request is rejected up front, with a reason, when no schedule could ever finish it:

- its prompt leaves no room for output within ``max_model_len`` (a sequence stops on reaching
  ``max_model_len`` tokens, so at most ``max_model_len - 1`` prompt tokens; vLLM caps
  ``max_tokens`` the same way);
- its samples could not decode together within the token budget or the sequence limit;
- its prompt needs more blocks than an admission can get (the pool, less the watermark where the
  watermark always applies);
- at its longest it needs more blocks than the pool has. The longest a sequence gets is
  ``prompt + max_tokens - 1`` *written* tokens (the last sampled token is never computed), capped
  at ``max_model_len - 1``; parallel samples share the prompt's full blocks.

Everything else is admitted eventually: a running request can always grow into the whole pool by
preempting the others, and a waiting one into the whole admission room once nothing else runs.

With a hybrid KV cache (sliding-window layer groups) every count is summed over the groups, a
sliding group counting at most the blocks its window and one step's chunk can hold
(``hybrid_kv.admission_cap``); parallel samples are counted without sharing, since after a
recompute preemption each re-prefills its own sequence there (vLLM v1 serves them as separate
requests), so the request must fit with nothing shared.
"""

from __future__ import annotations

from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.memory.hybrid_kv import admission_cap
from pagesim.engine.policy.memory.kv_manager import cdiv
from pagesim.engine.policy.scheduling.request import Request


def admission_watermark(config: SchedulerConfig, *, anything_running: bool) -> int:
    """Blocks an admission must leave free: the watermark, except in an idle pool when it applies
    only while something runs (vLLM v1, pagesim)."""
    if config.watermark_only_when_running and not anything_running:
        return 0
    return config.watermark_blocks


def admission_room(config: SchedulerConfig, num_usable_blocks: int) -> int:
    """Most blocks an admission can ever get: the pool less the watermark of an idle pool."""
    return num_usable_blocks - admission_watermark(config, anything_running=False)


def longest_written_tokens(request: Request, max_model_len: int) -> int:
    """KV slots one of the request's sequences ever writes."""
    return min(request.prompt_len + request.max_tokens - 1, max_model_len - 1)


def peak_blocks(request: Request, block_size: int, max_model_len: int) -> int:
    """Blocks the request holds at its longest, its samples sharing the prompt's full blocks."""
    samples = request.num_samples
    per_seq = cdiv(longest_written_tokens(request, max_model_len), block_size)
    shared = request.prompt_len // block_size if samples > 1 else 0
    return shared + samples * (per_seq - shared)


def hybrid_blocks(request: Request, config: SchedulerConfig, num_tokens: int) -> int:
    """Blocks ``num_tokens`` tokens of each of the request's samples take over every layer group
    of a hybrid cache (nothing shared), a sliding group capped at what its window and one chunk hold."""
    bs = config.block_size
    total = 0
    for window in config.kv_group_windows:
        per_seq = cdiv(num_tokens, bs)
        if window is not None:
            per_seq = min(per_seq, admission_cap(window, bs, config.max_num_batched_tokens, config.max_model_len))
        total += request.num_samples * per_seq
    return total


def limits_reason(request: Request, config: SchedulerConfig) -> str | None:
    """Why the request breaks a limit any scheduler has (model length, token budget, batch size),
    whatever its memory is, or ``None``."""
    if request.prompt_len >= config.max_model_len:
        return (
            f"prompt of {request.prompt_len} tokens leaves no room for output within "
            f"max_model_len {config.max_model_len}"
        )
    samples = request.num_samples
    if samples > config.max_num_batched_tokens:
        return f"{samples} samples cannot decode within max_num_batched_tokens {config.max_num_batched_tokens}"
    if config.seq_limit_counts == "sequences" and samples > config.max_num_seqs:
        return f"{samples} samples exceed max_num_seqs {config.max_num_seqs}"
    return None


def rejection_reason(request: Request, config: SchedulerConfig, num_usable_blocks: int) -> str | None:
    """Why the request can never be served, or ``None`` if it can."""
    reason = limits_reason(request, config)
    if reason is not None:
        return reason
    bs = config.block_size
    samples = request.num_samples
    room = admission_room(config, num_usable_blocks)
    prompt_blocks = cdiv(request.prompt_len, bs)
    if config.is_hybrid:
        return _hybrid_reason(request, config, num_usable_blocks, room)
    if prompt_blocks > room:
        return (
            f"its prompt needs {prompt_blocks} blocks of {bs} tokens but an admission can get at "
            f"most {room} (the pool above the watermark)"
        )
    peak = peak_blocks(request, bs, config.max_model_len)
    if peak > num_usable_blocks:
        longest = longest_written_tokens(request, config.max_model_len)
        return (
            f"needs {peak} blocks of {bs} tokens at its longest ({longest} tokens x {samples} "
            f"sample(s)) but the pool has {num_usable_blocks}"
        )
    return None


def _hybrid_reason(request: Request, config: SchedulerConfig, num_usable_blocks: int, room: int) -> str | None:
    bs = config.block_size
    groups = len(config.kv_group_windows)
    first_chunk = min(request.prompt_len, config.max_num_batched_tokens) if config.enable_chunked_prefill \
        else request.prompt_len
    admission = max(hybrid_blocks(request, config, request.prompt_len) // request.num_samples,
                    groups * cdiv(first_chunk, bs))
    if admission > room:
        return (f"its prompt needs {admission} blocks of {bs} tokens over {groups} layer groups but an admission "
                f"can get at most {room} (the pool above the watermark)")
    longest = longest_written_tokens(request, config.max_model_len)
    peak = hybrid_blocks(request, config, longest)
    if peak > num_usable_blocks:
        return (f"needs {peak} blocks of {bs} tokens over {groups} layer groups at its longest ({longest} tokens x "
                f"{request.num_samples} sample(s)) but the pool has {num_usable_blocks}")
    return None
