"""The roofline cost model: each operator of a step takes the longer of its compute time at an
achievable fraction of peak FLOP/s and its memory time at an achievable fraction of peak bandwidth.

Per step, on one GPU of a ``tp``-way replica (each GPU does ``1/tp`` of the work in parallel):

- ``linear``: every computed token passes all linear layers (2 FLOPs per weight), sampled
  sequences also the lm head; the weights are read once per step. max(FLOPs / (peak x mfu),
  weight bytes / (bandwidth x mem_efficiency)): small batches are bandwidth-bound, large compute-bound.
- ``prefill_attention``: 4 FLOPs per head dimension per causal (query, key) pair (QK^T and PV),
  at ``attention_efficiency`` of peak, or reading the cached context's K/V if that is longer.
- ``decode_attention``: memory-bound: the K/V of every token each decoding sequence attends to,
  read at ``mem_efficiency`` of bandwidth, times ``1 + block_overhead_tokens / block_size``
  (1 for a contiguous cache, which has no blocks): a paged kernel pays a fixed cost per block (a table lookup, a short, less coalesced read), so
  small blocks cost more. With the default 4 tokens, a 16-token block costs 1.25x a contiguous
  read, in line with the 20-26% that the PagedAttention paper (Kwon et al., SOSP 2023, §7.1,
  Fig. 18a) measured for its kernel over FasterTransformer's, and 1-token blocks 5x.
- ``cache_write``: the new tokens' K/V written once; ``cow_copy``: each copied block read and
  written; ``sampling``: logits (fp32, vocabulary wide) read and written per sampled sequence, plus
  a fixed cost when anything samples.
- ``tp_comm``: two all-reduces per layer of the step's hidden states (ring: ``2 (tp-1)/tp`` of the
  bytes over the GPU link) plus a latency each; zero at tp = 1.
- ``cpu_overhead``: the engine's own per-step time (scheduling, input preparation, launch) as a
  fixed part plus a part per scheduled sequence.
- ``swap``: blocks over the host link at ``pcie_efficiency`` of its bandwidth (each GPU moves
  its own share over its own link; the link is full duplex, so a step's swap-outs and swap-ins
  overlap and the larger of the two sets the time).

The efficiencies are stated defaults, not fits; issue "Calibration" replaces this model with one
measured on the real kernels. Nothing here depends on the scheduler, so a block-size or policy
what-if changes only the ``StepWork`` it is given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from sim.cost.base import TERMS, CostModel, StepCost, StepWork
from sim.deployment import Deployment


@dataclass(frozen=True, slots=True)
class RooflineParams:
    mfu: float = 0.7  # achievable fraction of peak FLOP/s in the linear layers
    attention_efficiency: float = 0.5  # of peak FLOP/s in prefill attention
    mem_efficiency: float = 0.8  # achievable fraction of HBM bandwidth
    block_overhead_tokens: float = 4.0  # paged decode: per-block cost, in tokens' worth of reading
    pcie_efficiency: float = 0.8  # of the host link's bandwidth for swaps
    interconnect_efficiency: float = 0.7
    allreduce_latency_s: float = 8e-6
    sampling_fixed_s: float = 50e-6
    cpu_step_s: float = 1e-3  # per-step engine overhead
    cpu_per_seq_s: float = 10e-6  # per scheduled sequence

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise ValueError(f"roofline parameter {f.name} must be a finite number >= 0, got {value!r}")
        for name in ("mfu", "attention_efficiency", "mem_efficiency", "pcie_efficiency", "interconnect_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"roofline parameter {name} must be in (0, 1], got {getattr(self, name)!r}")

    def with_overrides(self, overrides: dict[str, float]) -> RooflineParams:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown roofline parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(self, **overrides)


class RooflineCostModel(CostModel):
    name = "roofline"

    def __init__(self, deployment: Deployment, params: RooflineParams | None = None):
        self.deployment = deployment
        self.params = params or RooflineParams()
        m = deployment.model
        tp = deployment.tp
        p = self.params
        gpu = deployment.gpu
        # Weights of the linear layers of all layers (everything but embeddings and norms).
        per_layer = 2 * m.hidden_size * m.q_size + 2 * m.hidden_size * m.kv_size
        per_layer += (3 if m.mlp == "swiglu" else 2) * m.hidden_size * m.intermediate_size
        self._linear_weights = m.num_layers * per_layer / tp
        self._lm_head_weights = m.hidden_size * m.vocab_size / tp
        self._dtype = m.dtype_bytes
        self._flops = gpu.dense_fp16_flops
        self._bw = gpu.hbm_bytes_per_s * p.mem_efficiency
        self._kv_token_bytes = deployment.kv_bytes_per_token_per_gpu
        self._attn_flops_per_pair = 4 * m.num_layers * (m.num_attention_heads // tp) * m.head_dim
        self._vocab = m.vocab_size
        self._hidden_bytes_per_token = m.hidden_size * m.dtype_bytes
        self._num_layers = m.num_layers
        self._tp = tp
        self._pcie = gpu.pcie_bytes_per_s * p.pcie_efficiency
        self._link = gpu.interconnect_bytes_per_s * p.interconnect_efficiency

    def step_cost(self, work: StepWork) -> StepCost:
        p = self.params
        bw = self._bw
        block_bytes = (work.block_size or 0) * self._kv_token_bytes
        terms = dict.fromkeys(TERMS, 0.0)
        if work.num_tokens:
            flops = 2 * (work.num_tokens * self._linear_weights + work.num_sampled * self._lm_head_weights)
            weight_bytes = (self._linear_weights + (self._lm_head_weights if work.num_sampled else 0)) * self._dtype
            terms["linear"] = max(flops / (self._flops * p.mfu), weight_bytes / bw)
            terms["cache_write"] = work.num_tokens * self._kv_token_bytes / bw
            if self._tp > 1:
                allreduce_bytes = work.num_tokens * self._hidden_bytes_per_token
                per_layer = 2 * (2 * (self._tp - 1) / self._tp * allreduce_bytes / self._link + p.allreduce_latency_s)
                terms["tp_comm"] = self._num_layers * per_layer
        terms["cpu_overhead"] = p.cpu_step_s + p.cpu_per_seq_s * work.num_seqs  # every step pays it
        if work.prefill_attention_pairs:
            terms["prefill_attention"] = max(
                work.prefill_attention_pairs * self._attn_flops_per_pair / (self._flops * p.attention_efficiency),
                work.prefill_context_tokens * self._kv_token_bytes / bw,
            )
        if work.decode_context_tokens:
            terms["decode_attention"] = work.decode_context_tokens * self._kv_token_bytes / bw * self._block_overhead(work)
        if work.num_cow_blocks:
            terms["cow_copy"] = 2 * work.num_cow_blocks * block_bytes / bw
        if work.num_sampled:
            terms["sampling"] = p.sampling_fixed_s + 2 * work.num_sampled * self._vocab * 4 / bw
        if work.num_swap_out_blocks or work.num_swap_in_blocks:
            # PCIe is full duplex: swap-outs and swap-ins of one step move side by side
            terms["swap"] = max(work.num_swap_out_blocks, work.num_swap_in_blocks) * block_bytes / self._pcie
        return StepCost(terms)

    def _block_overhead(self, work: StepWork) -> float:
        return 1.0 + self.params.block_overhead_tokens / work.block_size if work.block_size else 1.0

    def decode_attention_s(self, work: StepWork, decode_context_tokens: np.ndarray) -> np.ndarray:
        # The same operations in the same order as step_cost, elementwise (exact in float64).
        ctx = np.asarray(decode_context_tokens, dtype=np.int64)
        return np.where(ctx != 0, ctx * self._kv_token_bytes / self._bw * self._block_overhead(work), 0.0)

    def describe(self) -> dict:
        d = self.deployment
        return {"name": self.name, "model": d.model.name, "gpu": d.gpu.name, "tp": d.tp, "params": asdict(self.params)}
