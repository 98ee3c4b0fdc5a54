"""The roofline cost model on the models that are not plain dense GQA: mixture of experts (Mixtral,
DeepSeek V3, Qwen3 MoE, gpt-oss), FP8 weights, MLA, sliding windows, an fp8 KV cache, expert
parallelism, and the refusal of weights that do not fit; plus GPU aliases through the CLI.

As in ``tests/test_cost_model.py``, the expected values are written out by hand from the formulas
in ``pagesim/sim/cost/roofline.py``'s docstring and the datasheet numbers in ``pagesim/sim/hardware.py`` (H100 SXM:
3,350 GB/s HBM, 989 / 1,979 TFLOPS bf16 / fp8 dense, 450 GB/s NVLink one way; H200: 4,800 GB/s,
the same peaks; A100 80 GB: 2,039 GB/s, 312 TFLOPS, no fp8), with the model shapes as literals,
so they do not reuse the module's own arithmetic.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.cli import main
from pagesim.engine.model_presets import MODEL_PRESETS
from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput
from pagesim.sim.cost.base import TERMS, StepWork
from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams
from pagesim.sim.deployment import Deployment, GiB
from pagesim.sim.hardware import GPU_PRESETS, get_gpu_preset
from tests.conftest import scaled_examples

# Datasheet numbers at the default efficiencies (mem 0.8, mfu 0.7, attention 0.5, link 0.7)
H100_BW = 3350e9 * 0.8
H200_BW = 4800e9 * 0.8
A100_80_BW = 2039e9 * 0.8
BF16_PEAK = 989e12  # H100 SXM and H200
FP8_PEAK = 1979e12
A100_PEAK = 312e12
H100_LINK = 450e9 * 0.7
ALLREDUCE_LATENCY_TP2 = 6.6e-6 + 2 * 1 * 0.6e-6  # NCCL's ring: 6.6 us and 0.6 us a step, 2 (tp - 1) steps
ALLREDUCE_LATENCY_TP8 = 6.6e-6 + 2 * 7 * 0.6e-6
# The fused MoE (pagesim/sim/cost/fused_moe.py): experts streamed at 0.86 of HBM plus 0.4 us each;
# its FLOPs at a fraction of the 16-bit peak set by one expert's weights on a GPU.
H100_MOE_BW = 3350e9 * 0.86
H200_MOE_BW = 4800e9 * 0.86
EXPERT_S = 0.4e-6
MOE_MFU_WIDE = 0.49  # 88 M weights an expert slice and more (Mixtral at TP 1 and 2)
BLOCK_OVERHEAD_16 = 1.0  # today's paged kernel (the default, flash) pays no per-block cost

# Mixtral 8x7B: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, 8 experts (top 2) of MLP 14336,
# vocabulary 32000, bf16.
MX_LAYERS, MX_HIDDEN, MX_HEADS, MX_KV_HEADS, MX_HEAD_DIM = 32, 4096, 32, 8, 128
MX_EXPERTS, MX_TOP_K, MX_EXPERT_MLP, MX_VOCAB = 8, 2, 14336, 32000
MX_ATTENTION = MX_LAYERS * (2 * MX_HIDDEN * MX_HEADS * MX_HEAD_DIM + 2 * MX_HIDDEN * MX_KV_HEADS * MX_HEAD_DIM)
MX_ROUTER = MX_LAYERS * MX_HIDDEN * MX_EXPERTS
MX_LM_HEAD = MX_HIDDEN * MX_VOCAB
MX_EXPERT_BYTES = 3 * MX_HIDDEN * MX_EXPERT_MLP * 2  # gate, up, down in bf16: 352,321,536 bytes

# DeepSeek V3: 61 layers (3 dense, 58 MoE), hidden 7168, 128 heads, MLA (q_lora 1536, kv_lora 512,
# rope 64, nope 128, v 128), 256 routed experts (8 per token) + 1 shared of 2048, dense MLP 18432,
# vocabulary 129280; FP8 linear weights (1 byte), embedding, lm head and router in bf16.
DS_LAYERS, DS_MOE_LAYERS, DS_DENSE_LAYERS, DS_HIDDEN, DS_HEADS = 61, 58, 3, 7168, 128
DS_Q_LORA, DS_KV_LORA, DS_ROPE, DS_NOPE, DS_V = 1536, 512, 64, 128, 128
DS_EXPERTS, DS_TOP_K, DS_EXPERT_MLP, DS_DENSE_MLP, DS_VOCAB = 256, 8, 2048, 18432, 129280
DS_ATTENTION = DS_LAYERS * (
    DS_HIDDEN * DS_Q_LORA + DS_Q_LORA * DS_HEADS * (DS_NOPE + DS_ROPE)  # q_a, q_b
    + DS_HIDDEN * (DS_KV_LORA + DS_ROPE)  # kv_a_proj_with_mqa
    + DS_KV_LORA * DS_HEADS * (DS_NOPE + DS_V)  # kv_b
    + DS_HEADS * DS_V * DS_HIDDEN  # o
)
DS_DENSE = DS_DENSE_LAYERS * 3 * DS_HIDDEN * DS_DENSE_MLP
DS_SHARED = DS_MOE_LAYERS * 1 * 3 * DS_HIDDEN * DS_EXPERT_MLP
DS_ROUTER = DS_MOE_LAYERS * DS_HIDDEN * DS_EXPERTS
DS_LM_HEAD = DS_HIDDEN * DS_VOCAB
DS_EXPERT_BYTES = 3 * DS_HIDDEN * DS_EXPERT_MLP * 1  # fp8
DS_KV_TOKEN = DS_LAYERS * (DS_KV_LORA + DS_ROPE) * 2  # one bf16 latent + rotary key per layer: 70,272

# gpt-oss-120b: 36 layers alternating sliding (window 128, layer 0 first) and full, 8 KV heads of 64.
OSS_LAYERS, OSS_WINDOW, OSS_KV_HEADS, OSS_HEAD_DIM, OSS_HEADS = 36, 128, 8, 64, 64
OSS_LAYER_KV = 2 * OSS_KV_HEADS * OSS_HEAD_DIM * 2  # K and V in bf16: 2,048 bytes per token and layer

# Llama 3 8B (dense): 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocabulary 128256.
LLAMA_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
LLAMA_LM_HEAD = 4096 * 128256
LLAMA_KV_TOKEN = 2 * 32 * 8 * 128 * 2


def cost_model(name: str, gpu: str, tp: int = 1, ep: int = 1, weight_dtype: str = "auto",
               kv_cache_dtype: str = "auto", **params) -> RooflineCostModel:
    return RooflineCostModel(Deployment(MODEL_PRESETS[name], get_gpu_preset(gpu), tp, ep, weight_dtype,
                                        kv_cache_dtype), RooflineParams(**params))


def output_of(*seqs: tuple[int, int, bool]) -> SchedulerOutput:
    """A scheduler output of (tokens already computed, new tokens, samples) per sequence."""
    scheduled = tuple(ScheduledSequence(f"r{i}", 0, start, new, (), 16, samples)
                      for i, (start, new, samples) in enumerate(seqs))
    return SchedulerOutput(
        step=0, scheduled=scheduled, num_scheduled_tokens={s.request_id: s.num_new_tokens for s in scheduled},
        new={}, resumed={}, swapped_in=(), preempted=(), rejected={},
        blocks_to_copy=(), blocks_to_swap_out=(), blocks_to_swap_in=(),
        num_free_blocks=0, num_free_cpu_blocks=0, num_cached_free_blocks=0,
    )


def decodes(batch: int, context: int = 100, block_size: int | None = 16, window: int | None = None) -> StepWork:
    """``batch`` sequences decoding the token after ``context`` cached ones."""
    return StepWork.from_output(output_of(*[(context, 1, True)] * batch), block_size, window)


def test_model_shapes_used_here_are_the_presets():
    mx = MODEL_PRESETS["mixtral-8x7b"]
    assert (mx.num_layers, mx.hidden_size, mx.num_attention_heads, mx.num_kv_heads, mx.head_dim, mx.vocab_size,
            mx.moe.num_experts, mx.moe.experts_per_token, mx.moe.intermediate_size, mx.moe.shared_experts,
            mx.moe.first_dense_layers, mx.dtype_bytes) == (32, 4096, 32, 8, 128, 32000, 8, 2, 14336, 0, 0, 2)
    ds = MODEL_PRESETS["deepseek-v3"]
    assert (ds.num_layers, ds.num_moe_layers, ds.hidden_size, ds.num_attention_heads, ds.vocab_size,
            ds.intermediate_size, ds.weight_format) == (61, 58, 7168, 128, 129280, 18432, "fp8")
    assert (ds.mla.kv_lora_rank, ds.mla.qk_rope_head_dim, ds.mla.qk_nope_head_dim, ds.mla.v_head_dim,
            ds.mla.q_lora_rank) == (512, 64, 128, 128, 1536)
    assert (ds.moe.num_experts, ds.moe.experts_per_token, ds.moe.intermediate_size, ds.moe.shared_experts,
            ds.moe.first_dense_layers) == (256, 8, 2048, 1, 3)
    oss = MODEL_PRESETS["gpt-oss-120b"]
    assert (oss.num_layers, oss.sliding_window, oss.num_kv_heads, oss.head_dim, oss.num_attention_heads) == (
        36, 128, 8, 64, 64)
    assert oss.resolved_layer_types.count("sliding") == 18 == oss.resolved_layer_types.count("full")
    assert MX_EXPERT_BYTES == 352_321_536 and DS_KV_TOKEN == 70_272


# ============================================================================ 1. MoE
def test_distinct_experts_is_the_uniform_routing_expectation():
    mixtral = cost_model("mixtral-8x7b", "h100-sxm")
    assert mixtral.distinct_experts(0) == 0.0
    assert mixtral.distinct_experts(1) == pytest.approx(2.0, rel=1e-12)  # one token reads 2 of 8
    for tokens in (1, 2, 3, 4, 7, 16, 64, 256, 4096):
        assert mixtral.distinct_experts(tokens) == pytest.approx(8 * (1 - 0.75**tokens), rel=1e-12), tokens
    assert mixtral.distinct_experts(64) > 7.9999  # a batch of 64 touches nearly all 8
    deepseek = cost_model("deepseek-v3", "h200", 8)
    assert deepseek.distinct_experts(1) == pytest.approx(8.0, rel=1e-12)
    assert deepseek.distinct_experts(100) == pytest.approx(256 * (1 - (248 / 256) ** 100), rel=1e-12)
    assert cost_model("llama3-8b", "h100-sxm").distinct_experts(100) == 0.0  # dense: no experts


def test_mixtral_decode_at_batch_one_reads_two_of_eight_experts():
    cost = cost_model("mixtral-8x7b", "h100-sxm").step_cost(decodes(1))
    moe_read_s = MX_LAYERS * 2 * (MX_EXPERT_BYTES / H100_MOE_BW + EXPERT_S)  # 22.5 GB at 2.88 TB/s: 7.85 ms
    moe_flops_s = 2 * 1 * MX_TOP_K * (3 * MX_HIDDEN * MX_EXPERT_MLP) * MX_LAYERS / (BF16_PEAK * MOE_MFU_WIDE)
    assert moe_read_s > 100 * moe_flops_s  # one token: bandwidth-bound by far
    assert cost.terms["moe"] == pytest.approx(math.hypot(moe_read_s, moe_flops_s), rel=1e-9)
    assert cost.terms["moe"] == pytest.approx(0.0078524, rel=1e-4)
    # the dense part apart: attention projections, routers and the lm head (the token samples)
    linear_s = (MX_ATTENTION + MX_ROUTER + MX_LM_HEAD) * 2 / H100_BW
    assert cost.terms["linear"] == pytest.approx(linear_s, rel=1e-9)
    # a prefill chunk that does not sample reads no lm head
    chunk = cost_model("mixtral-8x7b", "h100-sxm").step_cost(StepWork.from_output(output_of((0, 1, False)), 16))
    assert chunk.terms["linear"] == pytest.approx((MX_ATTENTION + MX_ROUTER) * 2 / H100_BW, rel=1e-9)


def test_mixtral_decode_at_batch_256_reads_nearly_all_experts():
    cost = cost_model("mixtral-8x7b", "h100-sxm").step_cost(decodes(256))
    distinct = 8 * (1 - 0.75**256)
    read_s = MX_LAYERS * distinct * (MX_EXPERT_BYTES / H100_MOE_BW + EXPERT_S)  # 90.2 GB: 31.4 ms
    flops_s = 2 * 256 * MX_TOP_K * 3 * MX_HIDDEN * MX_EXPERT_MLP * MX_LAYERS / (BF16_PEAK * MOE_MFU_WIDE)
    assert read_s > 2 * flops_s  # 256 tokens x 2 experts still read more than they compute
    assert cost.terms["moe"] == pytest.approx(math.hypot(read_s, flops_s), rel=1e-9)
    # the dense part: 256 tokens through the projections and the lm head, or the weights read once
    dense_flops_s = 2 * 256 * (MX_ATTENTION + MX_ROUTER + MX_LM_HEAD) / (BF16_PEAK * 0.7)
    dense_bytes_s = (MX_ATTENTION + MX_ROUTER + MX_LM_HEAD) * 2 / H100_BW
    assert cost.terms["linear"] == pytest.approx(max(dense_flops_s, dense_bytes_s), rel=1e-9)
    # in between, the distinct experts of 4 tokens: 8 (1 - (6/8)^4) = 5.47
    four = cost_model("mixtral-8x7b", "h100-sxm").step_cost(decodes(4))
    four_read_s = MX_LAYERS * 8 * (1 - 0.75**4) * (MX_EXPERT_BYTES / H100_MOE_BW + EXPERT_S)
    four_flops_s = 2 * 4 * MX_TOP_K * 3 * MX_HIDDEN * MX_EXPERT_MLP * MX_LAYERS / (BF16_PEAK * MOE_MFU_WIDE)
    assert four.terms["moe"] == pytest.approx(math.hypot(four_read_s, four_flops_s), rel=1e-9)


def test_moe_long_prefill_is_compute_bound_at_the_fused_moe_efficiency():
    # 8192 tokens x 2 experts: 2 FLOPs per weight of each expert a token multiplies, at 0.49 of the
    # 16-bit peak (Mixtral's wide experts), with the weight stream adding in quadrature
    cost = cost_model("mixtral-8x7b", "h100-sxm").step_cost(StepWork.from_output(output_of((0, 8192, False)), 16))
    flops_s = 2 * 8192 * MX_TOP_K * 3 * MX_HIDDEN * MX_EXPERT_MLP * MX_LAYERS / (BF16_PEAK * MOE_MFU_WIDE)
    read_s = MX_LAYERS * 8 * (MX_EXPERT_BYTES / H100_MOE_BW + EXPERT_S)
    assert flops_s > 5 * read_s
    assert cost.terms["moe"] == pytest.approx(math.hypot(flops_s, read_s), rel=1e-9)
    assert cost.terms["moe"] == pytest.approx(flops_s, rel=0.02)


@pytest.mark.parametrize(("tokens", "measured_us"), [(1, 144.03), (2, 229.28), (4, 351.10), (8, 434.98),
                                                      (16, 471.49), (128, 491.39), (1536, 1122.93)])
def test_mixtral_fused_moe_layer_matches_vllms_h100_kernel_benchmark(tokens, measured_us):
    # vLLM's benchmarks/kernels/benchmark_moe.py, Mixtral-8x7B at TP 2 in BF16 on an H100, tuned
    # config (vllm-project/vllm#24700): the time of one layer's fused MoE at each token count
    model = cost_model("mixtral-8x7b", "h100-sxm", 2)
    layer_us = model.step_cost(StepWork.from_output(output_of((0, tokens, False)), 16)).terms["moe"] / MX_LAYERS * 1e6
    assert layer_us == pytest.approx(measured_us, rel=0.15)


@pytest.mark.parametrize(("tokens", "measured_us"), [(16, (164.64, 185.40)), (128, (247.67, 273.72))])
def test_qwen3_30b_fused_moe_layer_matches_vllms_h100_kernel_benchmark(tokens, measured_us):
    # the same benchmark for Qwen3-30B-A3B in FP8 at TP 1 (128 experts of 4.7 M weights, top 8):
    # the figures before and after that PR's config change
    model = cost_model("qwen3-30b-a3b", "h100-sxm", weight_dtype="fp8")
    layer_us = model.step_cost(StepWork.from_output(output_of((0, tokens, False)), 16)).terms["moe"] / 48 * 1e6
    low, high = measured_us
    assert low * 0.9 <= layer_us <= high * 1.1


def test_fused_moe_efficiency_follows_the_expert_size_between_the_anchors():
    from pagesim.sim.cost.fused_moe import MOE_MFU_ANCHORS, moe_mfu

    assert MOE_MFU_ANCHORS == ((4.7e6, 0.2), (12.6e6, 0.29), (88e6, 0.49))
    assert moe_mfu(1e6) == 0.2 and moe_mfu(4.7e6) == 0.2  # held below the smallest measured expert
    assert moe_mfu(12.6e6) == pytest.approx(0.29, rel=1e-12)
    assert moe_mfu(1e9) == 0.49  # and above the largest
    # log-linear between: DeepSeek V3's experts at TP 8 hold 3 x 7168 x 2048 / 8 = 5.5 M weights
    shard = 3 * DS_HIDDEN * DS_EXPERT_MLP / 8
    expected = 0.2 + (0.29 - 0.2) * math.log(shard / 4.7e6) / math.log(12.6e6 / 4.7e6)
    assert moe_mfu(shard) == pytest.approx(expected, rel=1e-12)
    assert cost_model("deepseek-v3", "h200", 8)._moe.mfu == pytest.approx(expected, rel=1e-12)
    # expert parallelism keeps each expert whole on its GPU: the larger GEMM is the more efficient
    assert cost_model("deepseek-v3", "h200", 8, 8)._moe.mfu == pytest.approx(moe_mfu(3 * DS_HIDDEN * DS_EXPERT_MLP))
    assert cost_model("mixtral-8x7b", "h100-sxm", moe_mfu=0.3)._moe.mfu == 0.3  # a number overrides the table


def test_deepseek_v3_decode_at_batch_one():
    cost = cost_model("deepseek-v3", "h200", 8).step_cost(decodes(1))
    # 8 of 256 experts in each of 58 MoE layers, one byte per weight, an eighth of each on each GPU
    moe_read_s = DS_MOE_LAYERS * 8 * (DS_EXPERT_BYTES / 8 / H200_MOE_BW + EXPERT_S)
    assert cost.terms["moe"] == pytest.approx(moe_read_s, rel=0.01)
    # the shared expert is in `linear`, with the attention projections and the three dense MLPs
    # (fp8), the routers and the lm head (bf16)
    linear_s = ((DS_ATTENTION + DS_DENSE + DS_SHARED) * 1 + (DS_ROUTER + DS_LM_HEAD) * 2) / 8 / H200_BW
    assert cost.terms["linear"] == pytest.approx(linear_s, rel=1e-9)
    assert cost.terms["moe"] > 0 and cost.terms["ep_comm"] == 0.0


# ============================================================================ 2. FP8
def test_fp8_weights_halve_the_linear_bytes_but_not_embedding_or_lm_head():
    bf16 = Deployment(MODEL_PRESETS["llama3-8b"], get_gpu_preset("h100-sxm"), weight_dtype="bf16")
    fp8 = Deployment(MODEL_PRESETS["llama3-8b"], get_gpu_preset("h100-sxm"), weight_dtype="fp8")
    assert fp8.weights.format == "fp8" and bf16.weights.format == "bf16"
    assert bf16.weights.linear == LLAMA_LINEAR * 2 and fp8.weights.linear == LLAMA_LINEAR * 1
    assert fp8.weights.embedding == bf16.weights.embedding == LLAMA_LM_HEAD * 2
    assert fp8.weights.lm_head == bf16.weights.lm_head == LLAMA_LM_HEAD * 2
    # a small decode batch reads the fp8 linear weights and the 16-bit lm head
    work = decodes(4)
    c_fp8 = cost_model("llama3-8b", "h100-sxm", weight_dtype="fp8").step_cost(work)
    c_bf16 = cost_model("llama3-8b", "h100-sxm", weight_dtype="bf16").step_cost(work)
    assert c_fp8.terms["linear"] == pytest.approx((LLAMA_LINEAR * 1 + LLAMA_LM_HEAD * 2) / H100_BW, rel=1e-9)
    assert c_bf16.terms["linear"] == pytest.approx((LLAMA_LINEAR + LLAMA_LM_HEAD) * 2 / H100_BW, rel=1e-9)
    # without the lm head exactly half
    chunk = StepWork.from_output(output_of((0, 4, False)), 16)
    assert (cost_model("llama3-8b", "h100-sxm", weight_dtype="fp8").step_cost(chunk).terms["linear"]
            == pytest.approx(cost_model("llama3-8b", "h100-sxm").step_cost(chunk).terms["linear"] / 2, rel=1e-12))


@pytest.mark.parametrize(("gpu", "peak"), [("h100-sxm", FP8_PEAK), ("a100-80gb", A100_PEAK)])
def test_fp8_compute_bound_prefill_runs_at_the_gpus_fp8_peak(gpu, peak):
    assert GPU_PRESETS["h100-sxm"].dense_fp8_flops == 1979e12 and GPU_PRESETS["a100-80gb"].dense_fp8_flops is None
    work = StepWork.from_output(output_of((0, 8192, False)), 16)  # a chunk that does not sample
    fp8 = cost_model("llama3-8b", gpu, weight_dtype="fp8").step_cost(work)
    flops_s = 2 * 8192 * LLAMA_LINEAR / (peak * 0.7)
    assert flops_s > LLAMA_LINEAR / (H100_BW if gpu == "h100-sxm" else A100_80_BW)
    assert fp8.terms["linear"] == pytest.approx(flops_s, rel=1e-9)
    bf16 = cost_model("llama3-8b", gpu).step_cost(work)
    assert bf16.terms["linear"] == pytest.approx(2 * 8192 * LLAMA_LINEAR / ((989e12 if gpu == "h100-sxm" else 312e12)
                                                                           * 0.7), rel=1e-9)


def test_fp8_checkpoints_lm_head_stays_a_16_bit_gemm():
    # The docstring: "FP8 weights run at the GPU's FP8 peak"; an FP8 checkpoint's lm head stays
    # 16-bit (engine.catalog.params), so its GEMM runs at the 16-bit peak. A decode batch of 2048
    # on an H100 is compute-bound: the linear layers at 1,979 TFLOPS, the lm head at 989.
    work = decodes(2048)
    linear_s = 2 * 2048 * LLAMA_LINEAR / (FP8_PEAK * 0.7)
    lm_head_s = 2 * 2048 * LLAMA_LM_HEAD / (BF16_PEAK * 0.7)
    assert linear_s + lm_head_s > (LLAMA_LINEAR * 1 + LLAMA_LM_HEAD * 2) / H100_BW
    cost = cost_model("llama3-8b", "h100-sxm", weight_dtype="fp8").step_cost(work)
    assert cost.terms["linear"] == pytest.approx(linear_s + lm_head_s, rel=1e-9)


def test_deepseek_experts_compute_at_the_16_bit_rate_in_fp8_and_bf16():
    # vLLM's FP8 fused MoE is no faster than its BF16 one at the same shape (fused_moe's docstring):
    # both run at the fraction of the 16-bit peak their expert size gives; FP8 halves the bytes only
    from pagesim.sim.cost.fused_moe import moe_mfu

    work = StepWork.from_output(output_of((0, 16384, False)), 16)
    flops_s = 2 * 16384 * DS_TOP_K * 3 * DS_HIDDEN * DS_EXPERT_MLP * DS_MOE_LAYERS / 8 / (
        BF16_PEAK * moe_mfu(3 * DS_HIDDEN * DS_EXPERT_MLP / 8))
    fp8 = cost_model("deepseek-v3", "h200", 8).step_cost(work)
    fp8_read_s = DS_MOE_LAYERS * 256 * (DS_EXPERT_BYTES / 8 / H200_MOE_BW + EXPERT_S)
    assert fp8.terms["moe"] == pytest.approx(math.hypot(flops_s, fp8_read_s), rel=1e-6)
    bf16 = cost_model("deepseek-v3", "h200", 8, weight_dtype="bf16").step_cost(work)
    bf16_read_s = DS_MOE_LAYERS * 256 * (2 * DS_EXPERT_BYTES / 8 / H200_MOE_BW + EXPERT_S)
    assert bf16.terms["moe"] == pytest.approx(math.hypot(flops_s, bf16_read_s), rel=1e-6)


# ============================================================================ 3. MLA
def test_mla_kv_bytes_per_token_are_the_replicated_latent():
    for tp in (1, 8):
        d = Deployment(MODEL_PRESETS["deepseek-v3"], get_gpu_preset("h200"), tp)
        assert d.kv_bytes_per_token_per_gpu == 70_272 == DS_KV_TOKEN, tp
        assert d.block_bytes_per_gpu(16) == 16 * 70_272


@pytest.mark.parametrize("block_size", [1, 16, 64, None])
def test_mla_decode_is_the_larger_of_latent_read_and_absorbed_compute(block_size):
    context = 4 * 3001  # four sequences decoding after 3000 cached tokens
    work = decodes(4, 3000, block_size)
    assert work.decode_context_tokens == context
    overhead = 1.0  # (today's paged kernel: no per-block cost at any block size)
    read_s = context * DS_LAYERS * (DS_KV_LORA + DS_ROPE) * 2 / H200_BW * overhead
    compute_s = context * DS_LAYERS * 2 * (DS_HEADS // 8) * (2 * DS_KV_LORA + DS_ROPE) / (BF16_PEAK * 0.5)
    model = cost_model("deepseek-v3", "h200", 8)
    cost = model.step_cost(work)
    assert cost.terms["decode_attention"] == pytest.approx(max(read_s, compute_s), rel=1e-9)
    if block_size == 16:
        # 16 heads per GPU: reading the 1,152-byte latent takes 4.3 times the compute
        assert read_s > compute_s
        assert read_s / compute_s == pytest.approx(5.326 / 1.25, rel=1e-3)
    # the vectorized form gives the same, bit for bit
    vec = model.decode_attention_s(work, [context, 0, 17])
    assert vec[0] == cost.terms["decode_attention"] and vec[1] == 0.0


def test_mla_decode_at_tp1_is_compute_bound():
    # all 128 heads on one GPU: the absorbed-form FLOPs outweigh the latent read
    work = decodes(4, 3000, 16)
    read_s = 4 * 3001 * DS_KV_TOKEN / H200_BW * BLOCK_OVERHEAD_16
    compute_s = 4 * 3001 * DS_LAYERS * 2 * DS_HEADS * (2 * DS_KV_LORA + DS_ROPE) / (BF16_PEAK * 0.5)
    assert compute_s > read_s
    cost = cost_model("deepseek-v3", "h200", 1).step_cost(work)
    assert cost.terms["decode_attention"] == pytest.approx(compute_s, rel=1e-9)


# =================================================================== 4. sliding window
def test_sliding_window_decode_reads_the_window_in_windowed_layers():
    work = decodes(1, 9_999, 16, window=128)  # context 10,000 with the new token
    assert (work.decode_context_tokens, work.decode_window_context_tokens) == (10_000, 128)
    read = 18 * 10_000 * 2 * 8 * 64 * 2 + 18 * 128 * 2 * 8 * 64 * 2
    cost = cost_model("gpt-oss-120b", "h100-sxm").step_cost(work)
    assert cost.terms["decode_attention"] == pytest.approx(read / H100_BW * BLOCK_OVERHEAD_16, rel=1e-9)
    # a short context is not capped
    short = decodes(2, 49, 16, window=128)
    assert (short.decode_context_tokens, short.decode_window_context_tokens) == (100, 100)
    assert cost_model("gpt-oss-120b", "h100-sxm").step_cost(short).terms["decode_attention"] == pytest.approx(
        36 * 100 * OSS_LAYER_KV / H100_BW * BLOCK_OVERHEAD_16, rel=1e-9)


def test_disabling_the_hybrid_manager_keeps_the_attention_window():
    """vLLM's --disable-hybrid-kv-cache-manager holds the whole context in every layer's cache, but
    its sliding layers still attend through the window (vllm/v1/core/kv_cache_planning.py,
    unify_hybrid_kv_cache_specs: "the compute of layers like sliding window is still saved"): the
    attention terms are the hybrid cache's, the cache's layout is one full group."""
    work = decodes(1, 9_999, 16, window=128)
    hybrid = Deployment(MODEL_PRESETS["gpt-oss-120b"], get_gpu_preset("h100-sxm"))
    whole = Deployment(MODEL_PRESETS["gpt-oss-120b"], get_gpu_preset("h100-sxm"), hybrid_kv=False)
    read = 18 * 10_000 * 2 * 8 * 64 * 2 + 18 * 128 * 2 * 8 * 64 * 2
    for d in (hybrid, whole):
        cost = RooflineCostModel(d, RooflineParams())
        assert cost.attention_window == 128
        assert cost.step_cost(work).terms["decode_attention"] == pytest.approx(
            read / H100_BW * BLOCK_OVERHEAD_16, rel=1e-9)
    assert whole.layout.windows == (None,) and hybrid.layout.windows == (128, None)
    assert whole.block_bytes_per_gpu(16) == 2 * hybrid.block_bytes_per_gpu(16)  # 36 layers a block, not 18


@pytest.mark.parametrize(("start", "new", "window_pairs", "window_context"), [
    (0, 300, (1 + 128) * 128 // 2 + (300 - 128) * 128, 0),  # keys 1..128, then capped at 128
    (0, 100, 100 * 101 // 2, 0),  # shorter than the window: all causal pairs
    (1000, 300, 300 * 128, 127),  # every query sees the window: 127 cached keys plus itself
    (50, 100, (51 + 128) * 78 // 2 + 128 * 22, 50),  # positions 50..149: 51..128 keys, then 128
])
def test_sliding_window_prefill_pairs_are_capped(start, new, window_pairs, window_context):
    work = StepWork.from_output(output_of((start, new, True)), 16, 128)
    full_pairs = new * start + new * (new + 1) // 2
    assert (work.prefill_attention_pairs, work.prefill_context_tokens) == (full_pairs, start)
    assert (work.prefill_window_pairs, work.prefill_window_context_tokens) == (window_pairs, window_context)
    # brute force: each query at position p attends min(p + 1, 128) keys
    assert work.prefill_window_pairs == sum(min(p + 1, 128) for p in range(start, start + new))
    cost = cost_model("gpt-oss-120b", "h100-sxm").step_cost(work)
    pair_flops = 2 * OSS_HEADS * (64 + 64)  # per pair and layer: QK^T and PV
    compute_s = (18 * full_pairs + 18 * window_pairs) * pair_flops / (BF16_PEAK * 0.5)
    memory_s = (18 * start + 18 * window_context) * OSS_LAYER_KV / H100_BW
    assert cost.terms["prefill_attention"] == pytest.approx(max(compute_s, memory_s), rel=1e-9)


# ==================================================================== 5. fp8 KV cache
@pytest.mark.parametrize(("name", "bf16_token_bytes"), [
    ("llama3-8b", LLAMA_KV_TOKEN), ("deepseek-v3", DS_KV_TOKEN), ("gpt-oss-120b", 36 * OSS_LAYER_KV)])
def test_fp8_kv_cache_halves_token_and_block_bytes(name, bf16_token_bytes):
    gpu = get_gpu_preset("h200")
    auto = Deployment(MODEL_PRESETS[name], gpu)
    fp8 = Deployment(MODEL_PRESETS[name], gpu, kv_cache_dtype="fp8")
    assert auto.kv_bytes_per_token_per_gpu == bf16_token_bytes
    assert fp8.kv_bytes_per_token_per_gpu == bf16_token_bytes // 2
    assert fp8.block_bytes_per_gpu(16) * 2 == auto.block_bytes_per_gpu(16)
    cache_bytes = 10 * GiB
    assert fp8.num_blocks(cache_bytes, 16) == cache_bytes // (auto.block_bytes_per_gpu(16) // 2)
    assert fp8.num_blocks(cache_bytes, 16) in (2 * auto.num_blocks(cache_bytes, 16),
                                               2 * auto.num_blocks(cache_bytes, 16) + 1)
    # and the decode read halves with it
    work = decodes(4, 500, 16, window=MODEL_PRESETS[name].sliding_window)
    a = RooflineCostModel(auto).step_cost(work).terms
    b = RooflineCostModel(fp8).step_cost(work).terms
    assert b["cache_write"] == pytest.approx(a["cache_write"] / 2, rel=1e-12)
    if name != "deepseek-v3":  # MLA at tp 1 is compute-bound, which the cache dtype does not change
        assert b["decode_attention"] == pytest.approx(a["decode_attention"] / 2, rel=1e-12)


def test_fp8_kv_cache_doubles_llama_blocks_exactly():
    gpu = get_gpu_preset("h100-sxm")
    auto = Deployment(MODEL_PRESETS["llama3-8b"], gpu)
    fp8 = Deployment(MODEL_PRESETS["llama3-8b"], gpu, kv_cache_dtype="fp8")
    cache_bytes = 30 * GiB  # a multiple of both block sizes: 15,360 blocks of 2 MiB, 30,720 of 1 MiB
    assert auto.block_bytes_per_gpu(16) == 16 * 131_072 and fp8.block_bytes_per_gpu(16) == 16 * 65_536
    assert auto.num_blocks(cache_bytes, 16) == 15_360
    assert fp8.num_blocks(cache_bytes, 16) == 30_720


# ============================================================== 6. expert parallelism
def test_expert_parallel_mixtral_comm_by_hand():
    work = decodes(4)
    tokens = 4
    tp_only = cost_model("mixtral-8x7b", "h100-sxm", 2).step_cost(work)
    ep = cost_model("mixtral-8x7b", "h100-sxm", 2, 2).step_cost(work)
    hidden_bytes = tokens * MX_HIDDEN * 2
    per_allreduce = 2 * (2 - 1) / 2 * hidden_bytes / H100_LINK + ALLREDUCE_LATENCY_TP2
    # tensor parallel: two all-reduces in each of the 32 layers
    assert tp_only.terms["tp_comm"] == pytest.approx(32 * 2 * per_allreduce, rel=1e-9)
    assert tp_only.terms["ep_comm"] == 0.0
    # expert parallel: every layer is MoE, so one all-reduce each (after attention) ...
    assert ep.terms["tp_comm"] == pytest.approx(32 * 1 * per_allreduce, rel=1e-9)
    # ... and dispatch + combine: each GPU's 2 tokens, 2 copies each, half of them to the other GPU
    moved = tokens / 2 * MX_TOP_K * MX_HIDDEN * 2 * (2 - 1) / 2
    assert ep.terms["ep_comm"] > 0
    assert ep.terms["ep_comm"] == pytest.approx(32 * 2 * (moved / H100_LINK + ALLREDUCE_LATENCY_TP2), rel=1e-9)
    # the expert bytes and FLOPs per GPU are those of tensor parallelism; each GPU touches half as
    # many (whole) experts, so pays half the per-expert time
    distinct = 8 * (1 - 0.75**4)
    flops_s = 2 * tokens * MX_TOP_K * 3 * MX_HIDDEN * MX_EXPERT_MLP * MX_LAYERS / 2 / (BF16_PEAK * MOE_MFU_WIDE)
    tp_read_s = MX_LAYERS * distinct * (MX_EXPERT_BYTES / 2 / H100_MOE_BW + EXPERT_S)
    ep_read_s = MX_LAYERS * distinct * (MX_EXPERT_BYTES / 2 / H100_MOE_BW + EXPERT_S / 2)
    assert tp_only.terms["moe"] == pytest.approx(math.hypot(tp_read_s, flops_s), rel=1e-9)
    assert ep.terms["moe"] == pytest.approx(math.hypot(ep_read_s, flops_s), rel=1e-9)
    assert ep.terms["linear"] == tp_only.terms["linear"]


def test_expert_parallel_keeps_the_weight_bytes_per_gpu():
    for name, tp in (("mixtral-8x7b", 2), ("deepseek-v3", 8), ("qwen3-30b-a3b", 4)):
        gpu = get_gpu_preset("h200")
        assert (Deployment(MODEL_PRESETS[name], gpu, tp, tp).weight_bytes_per_gpu
                == Deployment(MODEL_PRESETS[name], gpu, tp).weight_bytes_per_gpu), name


def test_expert_parallel_deepseek_has_three_dense_layers_of_two_allreduces():
    work = decodes(8)
    ep = cost_model("deepseek-v3", "h200", 8, 8).step_cost(work)
    per_allreduce = 2 * 7 / 8 * 8 * DS_HIDDEN * 2 / H100_LINK + ALLREDUCE_LATENCY_TP8  # H200 has the same link
    assert ep.terms["tp_comm"] == pytest.approx((2 * 61 - 58) * per_allreduce, rel=1e-9)
    moved = 8 / 8 * DS_TOP_K * DS_HIDDEN * 2 * 7 / 8
    assert ep.terms["ep_comm"] == pytest.approx(58 * 2 * (moved / H100_LINK + ALLREDUCE_LATENCY_TP8), rel=1e-9)


def test_expert_parallel_degree_must_be_tp_and_needs_experts():
    mixtral, llama, h100 = MODEL_PRESETS["mixtral-8x7b"], MODEL_PRESETS["llama3-8b"], get_gpu_preset("h100")
    with pytest.raises(ValueError, match=r"--ep 4: .*tensor-parallel.*give --ep 2"):
        Deployment(mixtral, h100, 2, 4)
    with pytest.raises(ValueError, match=r"--ep 2: .*give --ep 1"):
        Deployment(mixtral, h100, 1, 2)
    with pytest.raises(ValueError, match="--ep 2: llama3-8b has no experts to spread"):
        Deployment(llama, h100, 2, 2)
    with pytest.raises(ValueError, match="8 experts do not split evenly over 16"):
        Deployment(mixtral, h100, 16, 16)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="expert-parallel degree must be a positive integer"):
            Deployment(mixtral, h100, 2, bad)
    assert Deployment(mixtral, h100, 2, 2).ep == 2


# ========================================================== 7. weights that do not fit
# Llama 3.1 405B: 126 layers, hidden 16384, 128 heads, 8 KV heads of 128, MLP 53248, vocabulary 128256.
L405_PARAMS = (126 * (2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248)  # projections, MLPs
               + 2 * 128256 * 16384  # embedding and lm head
               + 126 * 2 * 16384 + 16384)  # two RMSNorms per layer and the final one
H100_MEMORY = 81_559 * 2**20


def test_weights_that_do_not_fit_are_refused_with_the_numbers():
    assert L405_PARAMS == 405_853_388_800
    weights_gib = L405_PARAMS * 2 / 2**30  # 756.0 GiB
    d = Deployment(MODEL_PRESETS["llama3.1-405b"], get_gpu_preset("h100"), 1)
    with pytest.raises(ValueError) as exc:
        d.check_weights_fit(0.9)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith("llama3.1-405b does not fit on h100-sxm x1")
    assert f"{weights_gib:.1f} GiB in bf16" in message and "756.0 GiB" in message
    assert f"{H100_MEMORY * 0.9 / 2**30:.1f} GiB" in message  # 71.7 GiB usable
    assert f"{H100_MEMORY / 2**30:.1f} GiB" in message  # of 79.6 GiB
    # 8 GPUs would hold 94.5 GiB each, more than 71.7: 16 is the smallest power of two that fits
    assert L405_PARAMS * 2 / 8 > 0.9 * H100_MEMORY > L405_PARAMS * 2 / 16
    assert f"try --tp 16 ({weights_gib / 16:.1f} GiB of weights per GPU)" in message
    Deployment(MODEL_PRESETS["llama3.1-405b"], get_gpu_preset("h100"), 16).check_weights_fit(0.9)
    with pytest.raises(ValueError, match="does not fit on h100-sxm x8"):
        Deployment(MODEL_PRESETS["llama3.1-405b"], get_gpu_preset("h100"), 8).check_weights_fit(0.9)


def test_checkpoint_formats_decide_what_fits():
    h200, h100 = get_gpu_preset("h200"), get_gpu_preset("h100")
    deepseek = MODEL_PRESETS["deepseek-v3"]
    Deployment(deepseek, h200, 8).check_weights_fit(0.9)  # FP8: ~84 GB per GPU of 126 GiB
    with pytest.raises(ValueError, match=r"deepseek-v3 does not fit on h200 x8: .* in bf16\).*--tp 16"):
        Deployment(deepseek, h200, 8, weight_dtype="bf16").check_weights_fit(0.9)
    # gpt-oss-120b: 36 layers x 128 experts x 3 x 2880 x 2880 weights at 4.25 bits fit one H100
    expert_bytes = 36 * 128 * 3 * 2880 * 2880 * 17 / 32
    assert expert_bytes / GiB < 0.9 * H100_MEMORY / GiB
    oss = Deployment(MODEL_PRESETS["gpt-oss-120b"], h100)
    oss.check_weights_fit(0.9)
    assert oss.weights.format == "mxfp4" and oss.weights.routed_experts == pytest.approx(expert_bytes, rel=1e-12)
    with pytest.raises(ValueError, match="gpt-oss-120b does not fit on h100-sxm x1"):
        Deployment(MODEL_PRESETS["gpt-oss-120b"], h100, weight_dtype="bf16").check_weights_fit(0.9)


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


SMALL = ["--workload", "kwon2023-sharegpt", "--rate", "1", "--num-requests", "5"]


def assert_one_error_line(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *args)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("pagesim simulate: error: ")
    return lines[0]


def test_cli_refuses_a_model_that_does_not_fit(capsys):
    line = assert_one_error_line(capsys, ["--model", "llama3.1-405b", "--gpu", "h100", *SMALL, "--json"])
    assert "--tp 16" in line and "756.0 GiB" in line


# ======================================================================= 8. GPU aliases
@pytest.mark.parametrize("gpu", ["h100", "H100", "NVIDIA H100 80GB HBM3", "h100-sxm"])
def test_gpu_aliases_simulate_on_h100_sxm(capsys, tmp_path, gpu):
    rc, out, err = simulate(capsys, "--gpu", gpu, *SMALL, "--json", "--out", str(tmp_path))
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["requests_completed"] == 5
    # --json's summary does not name the GPU; run_info.json does, twice
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["deployment"]["gpu"] == "h100-sxm"
    assert info["deployment"]["cost_model"]["gpu"] == "h100-sxm"
    # the same run as the canonical name, step for step
    rc, canonical, _ = simulate(capsys, "--gpu", "h100-sxm", *SMALL, "--json")
    assert rc == 0
    drop_wall = lambda s: {k: v for k, v in json.loads(s).items() if k != "sim_wall_s"}  # noqa: E731
    assert drop_wall(out) == drop_wall(canonical)


def test_unknown_gpu_names_the_near_match(capsys):
    line = assert_one_error_line(capsys, ["--gpu", "h10", *SMALL, "--json"])
    assert "unknown GPU 'h10'" in line and "h100-sxm" in line


# ================================================== 9. properties over the MoE/MLA/window models
ALLOWED_TP = {"mixtral-8x7b": [1, 2, 4, 8], "deepseek-v3": [1, 2, 4, 8, 16], "gpt-oss-120b": [1, 2, 4, 8],
              "qwen3-30b-a3b": [1, 2, 4, 8]}
deployments = st.sampled_from(sorted(ALLOWED_TP)).flatmap(
    lambda name: st.tuples(st.just(name), st.sampled_from(ALLOWED_TP[name]), st.booleans(), st.booleans()))
sequences = st.tuples(st.integers(0, 20_000), st.integers(1, 600), st.booleans())


def build(name: str, tp: int, use_ep: bool, hybrid: bool, gpu: str) -> tuple[RooflineCostModel, int]:
    ep = tp if use_ep and tp > 1 else 1
    d = Deployment(MODEL_PRESETS[name], get_gpu_preset(gpu), tp, ep, hybrid_kv=hybrid)
    return RooflineCostModel(d, RooflineParams()), ep


@settings(max_examples=scaled_examples(100), deadline=None)
@given(batch=st.lists(sequences, min_size=0, max_size=12), deployment=deployments,
       gpu=st.sampled_from(sorted(GPU_PRESETS)), block_size=st.sampled_from([1, 16, 64, None]))
def test_terms_are_non_negative_and_add_up(batch, deployment, gpu, block_size):
    name, tp, use_ep, hybrid = deployment
    model, ep = build(name, tp, use_ep, hybrid, gpu)
    work = StepWork.from_output(output_of(*batch), block_size, MODEL_PRESETS[name].sliding_window)
    cost = model.step_cost(work)
    assert tuple(cost.terms) == TERMS
    assert all(math.isfinite(v) and v >= 0.0 for v in cost.terms.values()), cost.terms
    assert cost.total_s == pytest.approx(sum(cost.terms.values()), rel=1e-12)
    assert cost.swap_s == 0.0 and cost.compute_s == pytest.approx(cost.total_s, rel=1e-12)
    assert (cost.terms["moe"] > 0) == (work.num_tokens > 0)  # every model here has experts
    assert (cost.terms["tp_comm"] > 0) == (tp > 1 and work.num_tokens > 0)
    assert (cost.terms["ep_comm"] > 0) == (ep > 1 and work.num_tokens > 0)
    assert (cost.terms["decode_attention"] > 0) == (work.decode_context_tokens > 0)
    assert cost.terms["cpu_overhead"] == pytest.approx(0.5e-3 + 10e-6 * len(batch))
    assert (cost.terms["kernel_launch"] > 0) == (work.num_tokens > 0)
    if work.num_tokens:
        # uniform routing never reads more than all experts, nor fewer than one token's k
        moe = MODEL_PRESETS[name].moe
        assert moe.experts_per_token - 1e-9 <= model.distinct_experts(work.num_tokens) <= moe.num_experts


@settings(max_examples=scaled_examples(100), deadline=None)
@given(batch=st.lists(sequences, min_size=0, max_size=12), extra=sequences, deployment=deployments,
       gpu=st.sampled_from(["h100-sxm", "h200", "a100-80gb", "mi300x"]), block_size=st.sampled_from([1, 16, None]))
def test_larger_batch_is_never_cheaper(batch, extra, deployment, gpu, block_size):
    name, tp, use_ep, hybrid = deployment
    model, _ = build(name, tp, use_ep, hybrid, gpu)
    window = MODEL_PRESETS[name].sliding_window
    base = model.step_cost(StepWork.from_output(output_of(*batch), block_size, window))
    more = model.step_cost(StepWork.from_output(output_of(*batch, extra), block_size, window))
    assert more.total_s >= base.total_s
    for term in TERMS:
        assert more.terms[term] >= base.terms[term], term
