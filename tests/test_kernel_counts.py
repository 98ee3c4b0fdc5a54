"""The fixed per-step costs of ``pagesim/sim/cost/kernel_counts.py`` against counts and latencies
written out by hand from its table (vLLM's model files) and NCCL's ring model."""

from __future__ import annotations

import pytest

from pagesim.engine.model_presets import MODEL_PRESETS
from pagesim.sim.cost.base import StepWork
from pagesim.sim.cost.kernel_counts import allreduce_s, kernels_per_step
from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams
from pagesim.sim.deployment import Deployment
from pagesim.sim.hardware import get_gpu_preset

PER_STEP_SMALL = 4  # embedding, final norm, the sampler's two
PER_STEP_PRICED = 1  # lm head


def test_dense_gqa_layer():
    # Llama 3 8B: input norm, rotary, post norm, activation (4 small); QKV, cache write, attention,
    # output, gate-up, down (6 priced); 32 layers
    assert kernels_per_step(MODEL_PRESETS["llama3-8b"], "bf16") == (PER_STEP_SMALL + 32 * 4, PER_STEP_PRICED + 32 * 6)
    # FP8 quantizes the input of its four GEMMs
    assert kernels_per_step(MODEL_PRESETS["llama3-8b"], "fp8") == (PER_STEP_SMALL + 32 * 8, PER_STEP_PRICED + 32 * 6)


def test_moe_layer_adds_routing_sorting_and_the_sum():
    # Mixtral: attention 2 small + 4 priced; MoE: post norm, top-k, sort, activation, sum (5 small),
    # router and the two expert GEMMs (3 priced)
    mixtral = MODEL_PRESETS["mixtral-8x7b"]
    assert kernels_per_step(mixtral, "bf16") == (PER_STEP_SMALL + 32 * 7, PER_STEP_PRICED + 32 * 7)
    # Qwen3-235B: q/k norms too; 94 layers; in FP8, 2 attention and 2 expert quantizations a layer
    qwen = MODEL_PRESETS["qwen3-235b-a22b"]
    assert kernels_per_step(qwen, "bf16") == (PER_STEP_SMALL + 94 * 8, PER_STEP_PRICED + 94 * 7)
    assert kernels_per_step(qwen, "fp8") == (PER_STEP_SMALL + 94 * 12, PER_STEP_PRICED + 94 * 7)


def test_deepseek_mla_dense_and_moe_layers_in_fp8():
    # 61 MLA layers: input norm, two latent norms, rotary (4 small) + 3 FP8 quantizations; 8 priced.
    # 3 dense layers: post norm, activation + 2 quantizations; gate-up, down.
    # 58 MoE layers: 5 small + 2 quantizations, a shared expert's activation + 2 quantizations;
    # router, two expert GEMMs, the shared expert's gate-up and down.
    small = PER_STEP_SMALL + 61 * (4 + 3) + 3 * (2 + 2) + 58 * (5 + 2 + 1 + 2)
    priced = PER_STEP_PRICED + 61 * 8 + 3 * 2 + 58 * (3 + 2)
    assert kernels_per_step(MODEL_PRESETS["deepseek-v3"], "fp8") == (small, priced) == (1023, 785)
    # on the step: 1,023 x 3 us + 785 x 0.5 us = 3.46 ms, whatever the batch
    model = RooflineCostModel(Deployment(MODEL_PRESETS["deepseek-v3"], get_gpu_preset("h200"), 8), RooflineParams())
    for tokens in (1, 4096):
        work = StepWork(num_seqs=1, num_tokens=tokens, num_prefill_seqs=1, num_prefill_tokens=tokens)
        assert model.step_cost(work).terms["kernel_launch"] == pytest.approx(1023 * 3e-6 + 785 * 0.5e-6, rel=1e-12)
    assert model.step_cost(StepWork()).terms["kernel_launch"] == 0.0  # a step that computes nothing launches none


def test_allreduce_latency_is_nccls_ring():
    assert allreduce_s(1, 6.6e-6, 0.6e-6) == 0.0
    assert allreduce_s(2, 6.6e-6, 0.6e-6) == pytest.approx(7.8e-6, rel=1e-12)
    assert allreduce_s(4, 6.6e-6, 0.6e-6) == pytest.approx(10.2e-6, rel=1e-12)
    assert allreduce_s(8, 6.6e-6, 0.6e-6) == pytest.approx(15.0e-6, rel=1e-12)
    # a one-token decode's all-reduces at TP 8 on an H100 pair are their latency (and 14 KB on the link)
    model = RooflineCostModel(Deployment(MODEL_PRESETS["llama3-70b"], get_gpu_preset("h100-sxm"), 8), RooflineParams())
    work = StepWork(num_seqs=1, num_tokens=1, num_decode_seqs=1, decode_context_tokens=10, num_sampled=1)
    per = 2 * 7 / 8 * 8192 * 2 / (450e9 * 0.7) + 15e-6
    assert model.step_cost(work).terms["tp_comm"] == pytest.approx(80 * 2 * per, rel=1e-12)
