"""The routed experts of an MoE layer as vLLM runs them: one fused-MoE kernel per expert GEMM
(Triton ``fused_moe``: tokens sorted by expert, each expert's rows multiplied by its weights), timed
as the longer of streaming the touched experts' weights and computing their tokens.

**Streaming.** A step reads the weights of every expert its tokens touch, ``E (1 - (1 - k/E)^T)``
per layer under uniform top-k routing (one Mixtral token reads 2 of 8 experts, 64 tokens nearly all
8). Each touched expert costs its bytes at ``moe_mem_efficiency`` of HBM bandwidth plus
``moe_expert_s`` of its own (the kernel's per-expert tile scheduling, padding of the expert's rows to
a tile, pipeline start). Both come from vLLM's own kernel benchmark on an H100
(``benchmarks/kernels/benchmark_moe.py``, vllm-project/vllm#24700): Mixtral-8x7B's experts at TP 2
(176 MB each) took 144, 229, 351, 435 and 471-494 us a layer for 1, 2, 4, 8 and 16-128 tokens,
which 0.86 of 3.35 TB/s and 0.4 us an expert reproduce within 15% (123, 216, 338, 445, 492 us);
Qwen3-30B-A3B's 128 small experts (4.7 MB each, FP8) took 165-185 us at 16 tokens and 248-274 us at
128, and the same two figures give 165 and 261 us.

**Computing.** Grouped GEMMs over scattered token rows reach a smaller fraction of peak than dense
GEMMs, and a smaller one the thinner each expert is on a GPU: ``moe_mfu`` of the 16-bit peak,
interpolated in the logarithm of the expert's weights on one GPU (``3 x hidden x intermediate /
tp``; its full size under expert parallelism) between published H100 measurements
(``MOE_MFU_ANCHORS``), and held at the end values outside them:

- 4.7 M weights (Qwen3-30B-A3B, TP 1): 0.2. vLLM's fused MoE in FP8 reached 170-188 TFLOP/s at
  2,048-4,096 tokens (vllm-project/vllm#24700), a Triton fused MoE in BF16 215 TFLOP/s at 32k
  tokens (ByteDance-Seed/VeOmni#460): 17-22% of 989.
- 12.6 M (hidden 4,096, expert 1,024): 0.29 (VeOmni#460: 283 TFLOP/s).
- 88 M (Mixtral-8x7B, TP 2): 0.49 (vllm#24700: 1,536 tokens in 1,123 us, 482 TFLOP/s).

FP8 experts run at the 16-bit rate: at the same shape vLLM's FP8 fused MoE (170-188 TFLOP/s) was no
faster than the BF16 Triton one (215), since each block of K is rescaled in the kernel's loop.
So a decode step is weight-bound at any batch a server runs, and a chunked-prefill step of
thousands of tokens of a thin-expert model (Qwen3-235B at TP 8: 2.4 M weights an expert slice) is
compute-bound at a fifth of peak.
"""

from __future__ import annotations

import math

from pagesim.engine.catalog.model import MoeShape

#: Fused-MoE weight streaming: fraction of HBM bandwidth, and the time of each touched expert.
MOE_MEM_EFFICIENCY = 0.86
MOE_EXPERT_S = 0.4e-6
#: (an expert's weights on one GPU, fraction of the 16-bit peak the fused MoE reaches), ascending.
MOE_MFU_ANCHORS: tuple[tuple[float, float], ...] = ((4.7e6, 0.2), (12.6e6, 0.29), (88e6, 0.49))


def moe_mfu(expert_weights_per_gpu: float) -> float:
    """The anchors' efficiency, log-linear between them and the end value outside."""
    anchors = MOE_MFU_ANCHORS
    if expert_weights_per_gpu <= anchors[0][0]:
        return anchors[0][1]
    for (x0, y0), (x1, y1) in zip(anchors, anchors[1:]):
        if expert_weights_per_gpu <= x1:
            t = math.log(expert_weights_per_gpu / x0) / math.log(x1 / x0)
            return y0 + t * (y1 - y0)
    return anchors[-1][1]


class FusedMoeCost:
    """Seconds of one step's routed experts on one GPU of a ``tp``-way replica (``ep`` = tp or 1)."""

    def __init__(self, moe: MoeShape, layers: int, hidden: int, tp: int, ep: int, expert_bytes: float,
                 hbm_bytes_per_s: float, peak_flops: float, *, mem_efficiency: float, expert_s: float,
                 mfu: float = 0.0):
        self.moe = moe
        self._layers = layers
        self._tp = tp
        self._expert_weights = 3 * hidden * moe.intermediate_size
        shard = self._expert_weights / (tp if ep == 1 else 1)  # expert parallelism keeps experts whole
        self.mfu = mfu or moe_mfu(shard)
        # Per touched expert: its bytes on this GPU (the same either way: ep = tp holds E/ep whole
        # experts) streamed, and its own time, which under ep only the GPU holding it pays
        self._per_expert_s = expert_bytes / tp / (hbm_bytes_per_s * mem_efficiency) + expert_s / ep
        self._flops = peak_flops * self.mfu

    def distinct_experts(self, num_tokens: int) -> float:
        """Expected experts of one MoE layer that ``num_tokens`` tokens touch (uniform top-k routing)."""
        if num_tokens <= 0:
            return 0.0
        e, k = self.moe.num_experts, self.moe.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** num_tokens)

    def seconds(self, num_tokens: int) -> float:
        read = self._layers * self.distinct_experts(num_tokens) * self._per_expert_s
        flops = 2 * num_tokens * self.moe.experts_per_token * self._expert_weights * self._layers / self._tp
        compute = flops / self._flops
        return math.hypot(compute, read)  # streaming and computing overlap imperfectly (module docstring)
