"""The roofline cost model: each operator of a step takes the longer of its compute time at an
achievable fraction of peak FLOP/s and its memory time at an achievable fraction of peak bandwidth.

Per step, on one GPU of a ``tp``-way replica (each GPU does ``1/tp`` of the work in parallel):

- ``linear``: every computed token passes the dense linear layers (attention projections, dense
  MLPs, shared experts, routers; 2 FLOPs per weight), sampled sequences also the lm head; the
  weights are read once per step. max(FLOPs / (peak x mfu), weight bytes / (bandwidth x
  mem_efficiency)): small batches are bandwidth-bound, large compute-bound. FP8 weights run at the
  GPU's FP8 peak where it has one (W8A8, as vLLM runs FP8 checkpoints on Hopper), else at the
  16-bit peak; the lm head (16-bit in FP8 checkpoints) at the 16-bit peak; MXFP4 experts at the
  16-bit peak (weight-only kernels).
- ``moe``: the routed experts of MoE layers, as vLLM's fused-MoE kernel runs them
  (``pagesim.sim.cost.fused_moe``): the weights of the *distinct* experts the step's ``T`` tokens
  touch, ``E (1 - (1 - k/E)^T)`` per layer under uniform routing (a Mixtral decode of one token
  reads 2 of 8, a batch of 64 nearly all 8), streamed at ``moe_mem_efficiency`` of bandwidth plus
  ``moe_expert_s`` each, and their FLOPs at the fraction of the 16-bit peak that measured fused-MoE
  kernels reach for experts of that size on one GPU (``moe_mfu``; FP8 experts too), the two added
  in quadrature (they overlap imperfectly). With expert parallelism each GPU holds ``E / ep``
  whole experts and does ``1/ep`` of the expert work; the traffic differs (``ep_comm``).
- ``prefill_attention``: ``2 x heads x (qk_dim + v_dim)`` FLOPs per causal (query, key) pair and
  layer (GQA: ``4 x heads x head_dim``), at ``attention_efficiency`` of peak, or reading the cached
  context's K/V if that is longer. Sliding-window layers count only the pairs within the window.
  MLA prefills in its decompressed form (vLLM's), so the cached context's latents are also
  up-projected to keys and values (``2 x kv_lora_rank x heads x (qk_nope + v)`` FLOPs per token).
- ``decode_attention``: memory-bound: the K/V of every token each decoding sequence attends to
  (sliding-window layers: at most the window, also when the cache holds the whole context), read at ``mem_efficiency`` of bandwidth, times
  ``1 + block_overhead_tokens / block_size`` (1 for a contiguous cache, which has no blocks): the
  cost a paged kernel pays per block (a table lookup, a short, less coalesced read), which makes
  small blocks cost more. Which kernel is a named setting (``ATTENTION_KERNELS``,
  ``--attention-kernel``): ``flash`` (the default) is today's paged decode as vLLM runs it
  (FlashAttention 2/3 with a paged KV cache, vLLM V1's default backend on Hopper, or FlashInfer),
  which gathers a block's K/V through the table inside the same pipelined tile loop as a
  contiguous read: no per-block term (0 tokens); ``paged-2023`` is the PagedAttention paper's own
  kernel (vLLM's 2023 ``paged_attention_v1``), 4 tokens: a 16-token block costs 1.25x a
  contiguous read, in line with the 20-26% that the paper (Kwon et al., SOSP 2023, §7.1, Fig.
  18a) measured for it over FasterTransformer's, and 1-token blocks 5x (``reproduce kwon2023``
  uses it). MLA decodes in
  its absorbed form (vLLM's): all heads read one latent per token, ``2 x heads x (2 kv_lora_rank +
  qk_rope)`` FLOPs per token and layer, which on Hopper is about as compute- as memory-bound, so
  the term is the larger of the two.
- ``cache_write``: the new tokens' K/V written once; ``cow_copy``: each copied block read and
  written; ``sampling``: logits (fp32, vocabulary wide) read and written per sampled sequence, plus
  a fixed cost when anything samples.
- ``tp_comm``: two all-reduces per layer of the step's hidden states (ring: ``2 (tp-1)/tp`` of the
  bytes over the GPU link) plus NCCL's ring latency each (``allreduce_latency_s`` and
  ``allreduce_hop_s`` per ring step: ``pagesim.sim.cost.kernel_counts``); zero at tp = 1. With expert
  parallelism an MoE layer's second all-reduce is replaced by ``ep_comm``: each token's hidden
  state dispatched to its ``k`` experts and combined back (all-to-all, ``(ep-1)/ep`` of it crossing
  the link).
- ``kernel_launch``: the kernels a step launches whatever its batch, counted from the model's
  structure (``pagesim.sim.cost.kernel_counts``): ``kernel_s`` for each small one (norms, rotary,
  routing, FP8 quantization) and ``launch_gap_s`` for each the other terms price; DeepSeek's 61
  layers launch about 1,800 a step.
- ``cpu_overhead``: the engine's own per-step time (the sampler's synchronisation, output
  handling) as a fixed part plus a part per scheduled sequence (hidden under asynchronous
  scheduling: ``pagesim.sim.serving_path``).
  With vLLM 0.15's KV offloading connector (``--offload-connector 0.15``) the scheduler also
  pays for its CPU manager's walks through the offload store (``pagesim.sim.cost.connector_cpu``:
  ``offload_scan_entry_s`` per entry walked, ``offload_refusal_s`` per refused offer); under
  asynchronous scheduling (``scheduler_overlap`` 1, which the serving path sets) that time and the
  per-sequence part run beside the forward pass, and only what exceeds it lengthens the step.
- ``swap``: blocks over the host link at ``pcie_efficiency`` of its bandwidth (each GPU moves
  its own share over its own link; the link is full duplex, so a step's swap-outs and swap-ins
  overlap and the larger of the two sets the time).

The efficiencies are stated defaults, not fits to any serving run (the fused-MoE and kernel
figures come from published kernel measurements, each module says which); ``pagesim calibrate``
replaces this model with one measured on the real kernels. Nothing here depends on the scheduler,
so a block-size or policy what-if changes only the ``StepWork`` it is given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from pagesim.engine.catalog.params import param_breakdown
from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.cost.connector_cpu import OFFLOAD_REFUSAL_S, OFFLOAD_SCAN_ENTRY_S, exposed_cpu_s
from pagesim.sim.cost.fused_moe import MOE_EXPERT_S, MOE_MEM_EFFICIENCY, FusedMoeCost
from pagesim.sim.cost.kernel_counts import (KERNEL_S, LAUNCH_GAP_S, NCCL_RING_BASE_S, NCCL_RING_HOP_S, allreduce_s,
                                            kernels_per_step)
from pagesim.sim.deployment import Deployment


@dataclass(frozen=True, slots=True)
class RooflineParams:
    mfu: float = 0.7  # achievable fraction of peak FLOP/s in the linear layers
    attention_efficiency: float = 0.5  # of peak FLOP/s in prefill attention
    mem_efficiency: float = 0.8  # achievable fraction of HBM bandwidth
    block_overhead_tokens: float = 0.0  # paged decode: per-block cost, in tokens' worth of reading (ATTENTION_KERNELS)
    pcie_efficiency: float = 0.8  # of the host link's bandwidth for swaps
    interconnect_efficiency: float = 0.7
    allreduce_latency_s: float = NCCL_RING_BASE_S  # a small all-reduce's base latency (kernel_counts)
    allreduce_hop_s: float = NCCL_RING_HOP_S  # and per ring step over the GPU link
    kernel_s: float = KERNEL_S  # per small kernel of a step (kernel_counts)
    launch_gap_s: float = LAUNCH_GAP_S  # per kernel the other terms price (kernel_counts)
    moe_mfu: float = 0.0  # fused-MoE fraction of the 16-bit peak; 0: by expert size (fused_moe)
    moe_mem_efficiency: float = MOE_MEM_EFFICIENCY  # fused-MoE weight streaming, of HBM bandwidth
    moe_expert_s: float = MOE_EXPERT_S  # and per expert it touches (fused_moe)
    sampling_fixed_s: float = 50e-6
    cpu_step_s: float = 0.5e-3  # per-step engine time besides its kernels (1 ms with them for a dense 7B)
    cpu_per_seq_s: float = 10e-6  # per scheduled sequence
    offload_scan_entry_s: float = OFFLOAD_SCAN_ENTRY_S  # vLLM 0.15's offload manager, per entry walked (connector_cpu)
    offload_refusal_s: float = OFFLOAD_REFUSAL_S  # and per offer it refused
    # 1 (asynchronous scheduling, which the serving path sets): the scheduler's CPU work for a step
    # (cpu_per_seq_s, the connector's walks) runs beside the forward pass; 0: before it
    scheduler_overlap: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise ValueError(f"roofline parameter {f.name} must be a finite number >= 0, got {value!r}")
        if self.moe_mfu > 1:
            raise ValueError(f"roofline parameter moe_mfu must be 0 (by expert size) or in (0, 1], "
                             f"got {self.moe_mfu!r}")
        if self.scheduler_overlap not in (0, 1):
            raise ValueError(f"roofline parameter scheduler_overlap must be 0 or 1, got {self.scheduler_overlap!r}")
        for name in ("mfu", "moe_mem_efficiency", "attention_efficiency", "mem_efficiency", "pcie_efficiency",
                     "interconnect_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"roofline parameter {name} must be in (0, 1], got {getattr(self, name)!r}")

    def with_overrides(self, overrides: dict[str, float]) -> RooflineParams:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown roofline parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(self, **overrides)


#: Paged decode kernels by name: the roofline parameters each sets (see the module docstring).
ATTENTION_KERNELS: dict[str, dict[str, float]] = {
    "flash": {"block_overhead_tokens": 0.0},  # FlashAttention / FlashInfer paged KV (vLLM V1's backends)
    "paged-2023": {"block_overhead_tokens": 4.0},  # the PagedAttention paper's kernel (Kwon et al., 2023)
}


class RooflineCostModel(CostModel):
    name = "roofline"

    def __init__(self, deployment: Deployment, params: RooflineParams | None = None):
        self.deployment = deployment
        self.params = params or RooflineParams()
        m = deployment.model
        tp = deployment.tp
        p = self.params
        gpu = deployment.gpu
        parts = param_breakdown(m)
        weights = deployment.weights
        self._flops = gpu.dense_fp16_flops
        self._linear_flops = gpu.matmul_flops(fp8=weights.format == "fp8")
        # Weights every token multiplies (everything but embeddings, norms and routed experts).
        self._linear_weights = parts.linear / tp
        self._linear_bytes = weights.linear / tp
        self._lm_head_weights = m.hidden_size * m.vocab_size / tp
        self._lm_head_bytes = (weights.lm_head or weights.embedding) / tp  # a tied head reads the embedding
        self._bw = gpu.hbm_bytes_per_s * p.mem_efficiency
        layout = deployment.layout
        self._kv_token_bytes = deployment.kv_bytes_per_token_per_gpu
        self._block_token_bytes = layout.page_bytes_per_token
        # NOTE: the window saves attention work whatever the cache layout: vLLM's
        # --disable-hybrid-kv-cache-manager holds the whole context but still attends through
        # the window ("the compute of layers like sliding window is still saved").
        types = m.resolved_layer_types
        full_layers, window_layers = types.count("full"), types.count("sliding")
        self._window = self.attention_window = m.sliding_window if window_layers else None
        heads = m.num_attention_heads // tp
        pair_flops = 2 * heads * (m.qk_head_dim + m.v_head_dim)
        self._attn_flops_per_pair = full_layers * pair_flops
        self._window_attn_flops_per_pair = window_layers * pair_flops
        self._kv_full_token_bytes = full_layers * layout.layer_bytes_per_token
        self._kv_window_token_bytes = window_layers * layout.layer_bytes_per_token
        mla = m.mla
        self._mla_decode_flops = self._mla_context_flops = 0.0
        if mla is not None:
            self._mla_decode_flops = m.num_layers * 2 * heads * (2 * mla.kv_lora_rank + mla.qk_rope_head_dim)
            self._mla_context_flops = m.num_layers * 2 * mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        self._moe = None
        if m.moe is not None:
            self._moe = FusedMoeCost(m.moe, m.num_moe_layers, m.hidden_size, tp, deployment.ep, weights.expert,
                                     gpu.hbm_bytes_per_s, self._flops, mem_efficiency=p.moe_mem_efficiency,
                                     expert_s=p.moe_expert_s, mfu=p.moe_mfu)
        self._ep = deployment.ep
        self._moe_layers = m.num_moe_layers
        small, priced = kernels_per_step(m, weights.format)
        self._kernel_launch_s = small * p.kernel_s + priced * p.launch_gap_s
        self._allreduce_s = allreduce_s(tp, p.allreduce_latency_s, p.allreduce_hop_s)
        self._vocab = m.vocab_size
        self._hidden_bytes_per_token = m.hidden_size * m.dtype_bytes
        self._num_layers = m.num_layers
        self._tp = tp
        self._pcie = gpu.pcie_bytes_per_s * p.pcie_efficiency
        self._link = gpu.interconnect_bytes_per_s * p.interconnect_efficiency

    def distinct_experts(self, num_tokens: int) -> float:
        """Expected experts of one MoE layer that ``num_tokens`` tokens touch (uniform top-k routing)."""
        return 0.0 if self._moe is None else self._moe.distinct_experts(num_tokens)

    def step_cost(self, work: StepWork) -> StepCost:
        p = self.params
        bw = self._bw
        block_bytes = (work.block_size or 0) * self._block_token_bytes
        terms = dict.fromkeys(TERMS, 0.0)
        if work.num_tokens:
            weight_bytes = self._linear_bytes + (self._lm_head_bytes if work.num_sampled else 0)
            if self._linear_flops == self._flops:
                flops = 2 * (work.num_tokens * self._linear_weights + work.num_sampled * self._lm_head_weights)
                compute = flops / (self._flops * p.mfu)
            else:  # FP8 linear layers at the FP8 peak; the lm head stays a 16-bit GEMM
                compute = (2 * work.num_tokens * self._linear_weights / (self._linear_flops * p.mfu)
                           + 2 * work.num_sampled * self._lm_head_weights / (self._flops * p.mfu))
            terms["linear"] = max(compute, weight_bytes / bw)
            if self._moe is not None:
                terms["moe"] = self._moe.seconds(work.num_tokens)
            terms["cache_write"] = work.num_tokens * self._kv_token_bytes / bw
            terms["kernel_launch"] = self._kernel_launch_s
            if self._tp > 1:
                terms["tp_comm"], terms["ep_comm"] = self._comm_s(work.num_tokens)
        overlap = p.scheduler_overlap == 1
        # every step pays it; the per-sequence part runs beside the forward pass when they overlap
        terms["cpu_overhead"] = p.cpu_step_s if overlap else p.cpu_step_s + p.cpu_per_seq_s * work.num_seqs
        if work.prefill_attention_pairs:
            terms["prefill_attention"] = self._prefill_attention_s(work)
        if work.decode_context_tokens:
            terms["decode_attention"] = self._decode_attention_s(work)
        if work.num_cow_blocks:
            terms["cow_copy"] = 2 * work.num_cow_blocks * block_bytes / bw
        if work.num_sampled:
            terms["sampling"] = p.sampling_fixed_s + 2 * work.num_sampled * self._vocab * 4 / bw
        if work.num_swap_out_blocks or work.num_swap_in_blocks:
            # PCIe is full duplex: swap-outs and swap-ins of one step move side by side
            terms["swap"] = max(work.num_swap_out_blocks, work.num_swap_in_blocks) * block_bytes / self._pcie
        if work.offload_scan_entries or work.offload_refusals:  # (vLLM 0.15's connector: connector_cpu)
            cpu = work.offload_scan_entries * p.offload_scan_entry_s + work.offload_refusals * p.offload_refusal_s
            forward = 0.0
            if overlap:  # what the scheduler does beside the forward pass, against it
                cpu += p.cpu_per_seq_s * work.num_seqs
                forward = sum(v for k, v in terms.items() if k not in ("cpu_overhead", "swap"))
            terms["cpu_overhead"] += exposed_cpu_s(cpu, forward, overlap=overlap)
        return StepCost(terms)

    def _comm_s(self, num_tokens: int) -> tuple[float, float]:
        """(tensor-parallel all-reduces, expert-parallel all-to-all) seconds of a step."""
        tp = self._tp
        allreduce_bytes = num_tokens * self._hidden_bytes_per_token
        per_allreduce = 2 * (tp - 1) / tp * allreduce_bytes / self._link + self._allreduce_s
        if self._ep == 1:
            return self._num_layers * 2 * per_allreduce, 0.0
        ep, layers = self._ep, self._moe_layers
        # dispatch and combine: each GPU's share of the tokens, k copies each, (ep-1)/ep of them remote
        moved = num_tokens / ep * self._moe.moe.experts_per_token * self._hidden_bytes_per_token * (ep - 1) / ep
        all_to_all = layers * 2 * (moved / self._link + self._allreduce_s)
        return (2 * self._num_layers - layers) * per_allreduce, all_to_all

    def _prefill_attention_s(self, work: StepWork) -> float:
        p = self.params
        if self._window is None:  # (one product each, as before windows existed: the same floats)
            compute = work.prefill_attention_pairs * self._attn_flops_per_pair
            memory = work.prefill_context_tokens * self._kv_token_bytes
        else:
            compute = (work.prefill_attention_pairs * self._attn_flops_per_pair
                       + work.prefill_window_pairs * self._window_attn_flops_per_pair)
            memory = (work.prefill_context_tokens * self._kv_full_token_bytes
                      + work.prefill_window_context_tokens * self._kv_window_token_bytes)
        if self._mla_context_flops:
            compute += work.prefill_context_tokens * self._mla_context_flops
        return max(compute / (self._flops * p.attention_efficiency), memory / self._bw)

    def _decode_attention_s(self, work: StepWork) -> float:
        overhead = self._block_overhead(work)
        if self._window is not None:
            read = (work.decode_context_tokens * self._kv_full_token_bytes
                    + work.decode_window_context_tokens * self._kv_window_token_bytes)
            return read / self._bw * overhead
        seconds = work.decode_context_tokens * self._kv_token_bytes / self._bw * overhead
        if self._mla_decode_flops:
            compute = work.decode_context_tokens * self._mla_decode_flops / (self._flops * self.params.attention_efficiency)
            seconds = max(seconds, compute)
        return seconds

    def _block_overhead(self, work: StepWork) -> float:
        return 1.0 + self.params.block_overhead_tokens / work.block_size if work.block_size else 1.0

    def decode_attention_fn(self, work: StepWork):
        # The operations of _decode_attention_s, in its order; 0 for no context, as step_cost.
        overhead = self._block_overhead(work)
        if self._window is not None:
            full, windowed, bw = self._kv_full_token_bytes, self._kv_window_token_bytes, self._bw
            return lambda context, window_context: (
                (context * full + window_context * windowed) / bw * overhead if context else 0.0)
        per_token, bw = self._kv_token_bytes, self._bw
        if self._mla_decode_flops:
            mla, peak = self._mla_decode_flops, self._flops * self.params.attention_efficiency
            return lambda context, _: max(context * per_token / bw * overhead, context * mla / peak) if context else 0.0
        decode = lambda context, _: context * per_token / bw * overhead if context else 0.0  # noqa: E731
        decode.linear_in_context = (per_token, bw, overhead)  # (skip-ahead inlines its operations)
        return decode

    def decode_attention_s(self, work: StepWork, decode_context_tokens: np.ndarray,
                           decode_window_context_tokens: np.ndarray | None = None) -> np.ndarray | None:
        # The same operations in the same order as step_cost, elementwise (exact in float64: the
        # byte counts are integers well below 2**53, as Python's are before its one division).
        ctx = np.asarray(decode_context_tokens, dtype=np.int64)
        if self._window is not None:
            if decode_window_context_tokens is None:
                return None
            window_ctx = np.asarray(decode_window_context_tokens, dtype=np.int64)
            read = ctx * self._kv_full_token_bytes + window_ctx * self._kv_window_token_bytes
            seconds = read / self._bw * self._block_overhead(work)
            return np.where(ctx != 0, seconds, 0.0)
        seconds = ctx * self._kv_token_bytes / self._bw * self._block_overhead(work)
        if self._mla_decode_flops:
            compute = ctx * self._mla_decode_flops / (self._flops * self.params.attention_efficiency)
            seconds = np.maximum(seconds, compute)
        return np.where(ctx != 0, seconds, 0.0)

    def describe(self) -> dict:
        d = self.deployment
        return {"name": self.name, "model": d.model.name, "gpu": d.gpu.name, "tp": d.tp, "ep": d.ep,
                "weights": d.weights.format, "weight_gib_per_gpu": round(d.weight_bytes_per_gpu / 2**30, 3),
                "kv_cache_dtype": d.kv_cache_dtype, "params": asdict(self.params)}
