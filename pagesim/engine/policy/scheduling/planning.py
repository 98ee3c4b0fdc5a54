"""Planning one request's step: how many tokens each of its sequences computes, and how many
blocks that takes. Pure functions of the request, the budget and the pool; the scheduler decides
what to do with the answer (run it, preempt for it, or wait).

Rules (vLLM v1's, generalised to multi-sequence requests):
- a decoding sequence (one token left) takes one token while the budget lasts;
- a prefilling sequence takes all its remaining tokens, or, with chunked prefill, what the budget
  has left; without chunking it waits for a step with room;
- beams are chosen across all of a request's sequences at once, so they decode together or not
  at all, and while some re-prefill after a recompute preemption the others are held one token
  short so that all sample in the same step;
- sequences *parked* after a recompute preemption wait until the leader holds the prompt's full
  blocks again, then share them (``unpark``) and compute only their own tokens;
- no step computes position ``max_model_len - 1`` or beyond (vLLM v1's cap).

Block needs count new blocks plus copy-on-write copies, where of k sequences writing one shared
block k - 1 copy. (vLLM 0.6.3 counts differently, one block per running sequence needed or not;
its step order, ``steps/vllm_v0.py``, keeps that accounting to itself.)
"""

from __future__ import annotations

from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.memory.kv_manager import KVCacheManager
from pagesim.engine.policy.scheduling.request import Request, Sequence

#: Tokens each sequence of one request computes this step, in sequence order.
Plan = list[tuple[Sequence, int]]


class Planner:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.block_size = config.block_size
        self.swap_pool = kv.swap
        self.pool = kv.pool

    def plan(self, request: Request, token_budget: int, hit_tokens: list[int] | None = None) -> Plan:
        """Tokens each live sequence computes this step (sequences given 0 are left out).

        - A decoding sequence (one token left) takes one token while the budget lasts.
        - A prefilling sequence takes all its remaining tokens, or, with chunked prefill, as many
          as the budget has left; without chunking it waits for a step with room.
        - A beam group re-prefilling after a recompute preemption holds every beam one token
          short until all have caught up; beams decode together or not at all: they are chosen
          across all sequences at once, so they must sample in the same step.
        - No step computes position ``max_model_len - 1`` or beyond (vLLM v1's cap).

        ``hit_tokens`` (admission) gives per-sequence prefix-hit tokens not yet taken.
        """
        cfg = self.config
        seqs = request.live_seqs
        if len(seqs) == 1 and not seqs[0].parked:
            # NOTE: the rules below for a lone sequence (no beams, nobody parked), restated
            # because this runs for every running request every step.
            seq = seqs[0]
            computed = hit_tokens[0] if hit_tokens is not None else seq.num_computed_tokens
            remaining = request.prompt_len + len(seq.output_token_ids) - computed  # num_tokens
            cap = cfg.max_model_len - 1 - computed
            if cap < remaining:
                remaining = cap
            if remaining <= 0:
                return []
            if remaining <= token_budget:
                return [(seq, remaining)]
            if cfg.enable_chunked_prefill and token_budget > 0:
                return [(seq, token_budget)]
            return []
        shared_tokens = request.prompt_len // self.block_size * self.block_size
        leader_computed = hit_tokens[0] if hit_tokens is not None else seqs[0].num_computed_tokens
        leader_has_prompt = leader_computed >= shared_tokens
        remaining_of: list[int | None] = []  # per sequence (None: parked, waiting for the leader)
        for i, seq in enumerate(seqs):
            computed = hit_tokens[i] if hit_tokens is not None else seq.num_computed_tokens
            if seq.parked:
                if not leader_has_prompt:  # waits for the leader (see unpark)
                    remaining_of.append(None)
                    continue
                computed = shared_tokens  # it will share the leader's hit prompt blocks
            remaining_of.append(min(seq.num_tokens - computed, cfg.max_model_len - 1 - computed))
        beams = request.beam_width > 1 and len(seqs) > 1
        catching_up = beams and any(r is None or r > 1 for r in remaining_of)
        counts = [0] * len(seqs)
        if beams and not catching_up:
            if len(seqs) > token_budget:
                return []
            return [(seq, 1) for seq in seqs]
        for i, r in enumerate(remaining_of):
            if r is None or r <= 0 or (r == 1 and catching_up):
                continue
            want = r - 1 if catching_up else r
            if want <= token_budget:
                counts[i] = want
            elif cfg.enable_chunked_prefill or catching_up:
                counts[i] = token_budget
            token_budget -= counts[i]
        return [(seq, n) for seq, n in zip(seqs, counts) if n > 0]

    def blocks_needed(self, plan: Plan, *, from_cpu: bool = False) -> int:
        """Blocks reserving the plan takes: new blocks plus copy-on-write copies. Of k sequences
        writing into one shared block, k - 1 copy (the last writes in place). ``from_cpu``: the
        tables are still swapped out and count as they will be once swapped in."""
        cfg = self.config
        kv = self.kv
        if kv.hybrid:  # a table per layer group (no swapping there)
            return kv.plan_need(plan)
        if len(plan) == 1 and not from_cpu:
            # NOTE: one table: nothing is pending from another table of the same request.
            seq, n = plan[0]
            end = seq.num_tokens if cfg.reserve_extent == "whole" else seq.num_computed_tokens + n
            return kv.reserve_need(seq.block_table, self.pool.ref_counts, seq.num_filled_tokens, end)
        if from_cpu:
            ref_counts = self.swap_pool.ref_counts if cfg.preserve_sharing_on_swap else None
        else:
            ref_counts = self.pool.ref_counts
        pending: dict[int, int] = {}
        need = 0
        for seq, n in plan:
            end = seq.num_tokens if cfg.reserve_extent == "whole" else seq.num_computed_tokens + n
            table = seq.cpu_block_table if from_cpu else seq.block_table
            need += kv.reserve_need(table, ref_counts, seq.num_filled_tokens, end, pending)
        return need

    def swap_in_need(self, request: Request, plan: Plan) -> int:
        """GPU blocks swapping ``request`` back in and running ``plan`` takes."""
        moved = self.kv.blocks_to_swap_in(request.live_seqs, preserve_sharing=self.config.preserve_sharing_on_swap)
        return moved + self.blocks_needed(plan, from_cpu=True)

    def unpark(self, request: Request) -> None:
        """Parked sequences share the leader's prompt blocks once the leader has them again."""
        leader = request.live_seqs[0]
        leader.parked = False  # the first live sequence always leads (its own prefill)
        shared = request.prompt_len // self.block_size
        if leader.block_table and leader.num_computed_tokens >= shared * self.block_size:
            for seq in request.live_seqs[1:]:
                if seq.parked:
                    self.kv.share_prefix(leader, seq, shared)
                    seq.parked = False
