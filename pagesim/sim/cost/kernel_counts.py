"""The fixed costs of a step that do not shrink with its batch: the GPU kernels it launches,
counted from the model's structure, and what an all-reduce costs before its first byte.

**Kernels.** A decoder layer is not a handful of large GEMMs: each norm, rotary embedding,
activation, router top-k, token sort, expert sum and FP8 activation quantization is its own small
kernel, which takes a few microseconds however little it has to do. NVIDIA measured about 3 us per
short kernel replayed from a CUDA graph ("Getting Started with CUDA Graphs", NVIDIA Technical
Blog, 2019: a 2.9 us kernel, 3.4 us per kernel in a graph), so a *small* kernel costs ``KERNEL_S``
(3 us) and a *priced* one (a GEMM, the attention, the cache write, the expert GEMMs: kernels whose
execution the roofline's terms already time) adds its launch gap, ``LAUNCH_GAP_S`` (0.5 us). A
dense 7B model's 32 layers come to about 0.5 ms a step; DeepSeek-V3/R1's 61 layers (MLA's extra
projections and norms, a shared expert, FP8 quantization before every GEMM) to about 3.5 ms, a
third of the 11 ms a real 8x H200 server takes per token at concurrency 4
(``../shared/groundtruth/large-moe-public.md``), which a roofline alone misses.

Per layer, as vLLM's model files run them (``vllm/model_executor/models/llama.py``,
``mixtral.py``, ``qwen3_moe.py``, ``deepseek_v2.py``; 0.15.1 and 0.33.0 alike), a fused residual
add and RMSNorm counted once:

==================  ==============================================  ========================================
part                small kernels                                   priced kernels
==================  ==============================================  ========================================
GQA / MHA attention input norm, rotary (+ q/k norm: Qwen3, Gemma 3)   QKV, cache write, attention, output
MLA attention       input norm, the latent norms (1-2), rotary      q_a + kv_a (or q and kv_a), q_b or none,
                                                                    key up-projection, attention and its
                                                                    split-KV combine, value up-projection,
                                                                    output, cache write: 8
dense MLP           post-attention norm, activation                 gate-up, down
MoE                 post-attention norm, top-k, token sort,         router, the two expert GEMMs
                    activation, weighted sum
shared experts      activation                                      gate-up, down
FP8 weights         an activation quantization per FP8 GEMM
per step            embedding, final norm, the sampler's two        lm head
==================  ==============================================  ========================================

Tensor-parallel all-reduces are not counted here: their fixed cost is ``allreduce_s``.

**All-reduce latency.** NCCL's own tuning model (``src/graph/tuning.cc``) prices a small ring
all-reduce with the LL protocol at a base latency of 6.6 us plus 0.6 us for each of its
``2 (n - 1)`` steps over NVLink: 7.8 us over 2 GPUs, 10.2 over 4, 15 over 8. vLLM's own
all-reduce measured the same order on H100s: 8.7-9.5 us at TP 2 and 10-12 us at TP 8 for messages
up to 32 KB (sgl-project/sglang#2904, vLLM's custom all-reduce without CUDA graphs).
"""

from __future__ import annotations

from pagesim.engine.catalog.model import ModelPreset

#: A small kernel of a step replayed from a CUDA graph: its launch gap plus its shortest execution.
KERNEL_S = 3e-6
#: The launch gap alone, for a kernel whose execution the roofline already prices.
LAUNCH_GAP_S = 0.5e-6
#: NCCL ring / LL protocol: base latency and per-step latency over NVLink (``tuning.cc``).
NCCL_RING_BASE_S = 6.6e-6
NCCL_RING_HOP_S = 0.6e-6


def kernels_per_step(model: ModelPreset, weight_format: str) -> tuple[int, int]:
    """(small kernels, priced kernels) one forward step launches, whatever its batch (the table in
    the module docstring)."""
    fp8 = 1 if weight_format == "fp8" else 0
    if model.mla is not None:
        attention_small = 2 + (2 if model.mla.q_lora_rank else 1)  # input norm, rotary, latent norm(s)
        # FP8 GEMMs: q_a + kv_a, q_b, o (or q, kv_a, o); the key and value up-projections stay 16-bit
        attention_priced, attention_gemms = 8, 3
    else:
        attention_small = 2 + (1 if model.qk_norm else 0)
        attention_priced, attention_gemms = 4, 2
    small = 4 + model.num_layers * (attention_small + fp8 * attention_gemms)
    priced = 1 + model.num_layers * attention_priced
    moe = model.moe
    dense_layers = model.num_layers if moe is None else moe.first_dense_layers
    small += dense_layers * (2 + fp8 * 2)
    priced += dense_layers * 2
    if moe is not None:
        shared = bool(moe.shared_experts)
        small += model.num_moe_layers * (5 + fp8 * 2 + (1 + fp8 * 2 if shared else 0))
        priced += model.num_moe_layers * (3 + (2 if shared else 0))
    return small, priced


def allreduce_s(tp: int, base_s: float, hop_s: float) -> float:
    """Latency of one small all-reduce over ``tp`` GPUs in a ring: ``base + 2 (tp - 1) hop``."""
    return base_s + 2 * (tp - 1) * hop_s if tp > 1 else 0.0
