"""The roofline cost model and the deployment's memory budget, against values computed by hand.

The expected values below are written out from the formulas in ``pagesim/sim/cost/roofline.py``'s
docstring and the datasheet numbers in ``pagesim/sim/hardware.py`` (A100 40 GB: 1,555 GB/s HBM, 312
TFLOPS fp16, 32 GB/s PCIe, 300 GB/s NVLink), with the model shapes spelled out as literals, so
they do not reuse the module's own arithmetic.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.engine.model_presets import MODEL_PRESETS
from pagesim.engine.policy import ContiguousScheduler, make_config
from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput
from pagesim.sim.cost.base import TERMS, StepCost, StepWork
from pagesim.sim.cost.roofline import ATTENTION_KERNELS, RooflineCostModel, RooflineParams
from pagesim.sim.deployment import Deployment, GiB
from pagesim.sim.hardware import GPU_PRESETS, get_gpu_preset
from pagesim.sim.simulator import SimOptions, Simulation
from tests.conftest import scaled_examples
from pagesim.traces.trace import Trace

# Llama 3 8B: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocabulary 128256.
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
LINEAR_WEIGHTS = LAYERS * (2 * HIDDEN * (HEADS * HEAD_DIM) + 2 * HIDDEN * (KV_HEADS * HEAD_DIM) + 3 * HIDDEN * MLP)
LM_HEAD = HIDDEN * VOCAB
KV_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # key + value, fp16: 131,072 bytes
# A100 40 GB at the default efficiencies
PEAK = 312e12
BW = 1555e9 * 0.8
PCIE = 32e9 * 0.8
LINK = 300e9 * 0.7
# Llama 3 8B's kernels a step: 4 small ones per layer (input norm, rotary, post norm, activation) at
# 3 us plus 4 per step (embedding, final norm, the sampler's two); 6 priced ones per layer (QKV,
# cache write, attention, output, gate-up, down) plus the lm head at their 0.5 us launch gap.
KERNELS_S = (4 + LAYERS * 4) * 3e-6 + (1 + LAYERS * 6) * 0.5e-6


def llama(tp: int = 1, **params) -> RooflineCostModel:
    return RooflineCostModel(Deployment(MODEL_PRESETS["llama3-8b"], get_gpu_preset("a100-40gb"), tp),
                             RooflineParams(**params))


def output_of(*seqs: tuple[int, int, bool], copies: int = 0, swap_out: int = 0, swap_in: int = 0) -> SchedulerOutput:
    """A scheduler output of (tokens already computed, new tokens, samples) per sequence."""
    scheduled = tuple(ScheduledSequence(f"r{i}", 0, start, new, (), 16, samples)
                      for i, (start, new, samples) in enumerate(seqs))
    return SchedulerOutput(
        step=0, scheduled=scheduled, num_scheduled_tokens={s.request_id: s.num_new_tokens for s in scheduled},
        new={}, resumed={}, swapped_in=(), preempted=(), rejected={},
        blocks_to_copy=tuple((i, i + 1000) for i in range(copies)),
        blocks_to_swap_out=tuple((i, i) for i in range(swap_out)),
        blocks_to_swap_in=tuple((i, i) for i in range(swap_in)),
        num_free_blocks=0, num_free_cpu_blocks=0, num_cached_free_blocks=0,
    )


def test_model_shapes_used_here_are_the_presets():
    m = MODEL_PRESETS["llama3-8b"]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
            m.intermediate_size, m.vocab_size) == (LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB)
    assert KV_TOKEN == 131_072 == m.kv_bytes_per_token
    g = GPU_PRESETS["a100-40gb"]
    assert (g.hbm_bytes_per_s, g.dense_fp16_flops, g.pcie_bytes_per_s, g.interconnect_bytes_per_s) == (
        1555e9, 312e12, 32e9, 300e9)


# ------------------------------------------------------------------------ one step by hand
def test_decode_step_by_hand():
    # four sequences decoding their 101st token (100 cached + the new one), blocks of 16
    work = StepWork.from_output(output_of(*[(100, 1, True)] * 4), block_size=16)
    assert (work.num_seqs, work.num_tokens, work.num_decode_seqs, work.decode_context_tokens, work.num_sampled,
            work.num_prefill_seqs, work.prefill_attention_pairs) == (4, 4, 4, 404, 4, 0, 0)
    cost = llama().step_cost(work)
    flops_s = 2 * (4 * LINEAR_WEIGHTS + 4 * LM_HEAD) / (PEAK * 0.7)
    bytes_s = (LINEAR_WEIGHTS + LM_HEAD) * 2 / BW
    assert bytes_s > flops_s  # a small decode batch is bandwidth-bound
    expected = {
        "linear": bytes_s,  # 15.0 GB of weights at 1,244 GB/s: 12.07 ms
        "prefill_attention": 0.0,
        "decode_attention": 404 * KV_TOKEN / BW,  # today's paged kernel (flash): no per-block term
        "cache_write": 4 * KV_TOKEN / BW,
        "cow_copy": 0.0,
        "tp_comm": 0.0,
        "moe": 0.0,  # a dense model has no experts
        "ep_comm": 0.0,
        "sampling": 50e-6 + 2 * 4 * VOCAB * 4 / BW,
        "kernel_launch": KERNELS_S,
        "cpu_overhead": 0.5e-3 + 4 * 10e-6,
        "swap": 0.0,
    }
    assert cost.terms.keys() == set(TERMS)
    for term in TERMS:
        assert cost.terms[term] == pytest.approx(expected[term], rel=1e-12, abs=0.0), term
    assert cost.terms["linear"] == pytest.approx(0.0120654, rel=1e-5)
    assert cost.total_s == pytest.approx(sum(expected.values()), rel=1e-12)
    # the PagedAttention paper's kernel pays 4 tokens' worth per 16-token block
    paper = llama(**ATTENTION_KERNELS["paged-2023"]).step_cost(work)
    assert paper.terms["decode_attention"] == pytest.approx(404 * KV_TOKEN / BW * (1 + 4 / 16), rel=1e-12)
    assert {k: v for k, v in paper.terms.items() if k != "decode_attention"} == {
        k: v for k, v in cost.terms.items() if k != "decode_attention"}


def test_prefill_step_by_hand():
    # a 1000-token chunk after 200 cached prompt tokens, ending at the prompt's last token
    work = StepWork.from_output(output_of((200, 1000, True)), block_size=16)
    pairs = 1000 * 200 + 1000 * 1001 // 2
    assert (work.num_prefill_seqs, work.num_prefill_tokens, work.prefill_attention_pairs,
            work.prefill_context_tokens, work.num_decode_seqs, work.num_sampled) == (1, 1000, pairs, 200, 0, 1)
    cost = llama().step_cost(work)
    flops_s = 2 * (1000 * LINEAR_WEIGHTS + 1 * LM_HEAD) / (PEAK * 0.7)
    assert flops_s > (LINEAR_WEIGHTS + LM_HEAD) * 2 / BW  # a long prefill is compute-bound
    attention_flops_s = pairs * 4 * LAYERS * HEADS * HEAD_DIM / (PEAK * 0.5)
    assert attention_flops_s > 200 * KV_TOKEN / BW
    expected = {
        "linear": flops_s,
        "prefill_attention": attention_flops_s,
        "decode_attention": 0.0,
        "cache_write": 1000 * KV_TOKEN / BW,
        "cow_copy": 0.0,
        "tp_comm": 0.0,
        "moe": 0.0,  # a dense model has no experts
        "ep_comm": 0.0,
        "sampling": 50e-6 + 2 * 1 * VOCAB * 4 / BW,
        "kernel_launch": KERNELS_S,
        "cpu_overhead": 0.5e-3 + 10e-6,
        "swap": 0.0,
    }
    for term in TERMS:
        assert cost.terms[term] == pytest.approx(expected[term], rel=1e-12, abs=0.0), term
    assert cost.terms["linear"] == pytest.approx(0.0639179, rel=1e-5)


def test_prefill_chunk_that_does_not_sample_skips_lm_head_and_sampling():
    sampled = llama().step_cost(StepWork.from_output(output_of((0, 64, True)), block_size=16))
    chunk = llama().step_cost(StepWork.from_output(output_of((0, 64, False)), block_size=16))
    assert chunk.terms["sampling"] == 0.0 and sampled.terms["sampling"] > 0.0
    assert chunk.terms["linear"] == pytest.approx(LINEAR_WEIGHTS * 2 / BW, rel=1e-12)  # no lm head read
    assert sampled.terms["linear"] == pytest.approx((LINEAR_WEIGHTS + LM_HEAD) * 2 / BW, rel=1e-12)
    assert chunk.terms["prefill_attention"] == sampled.terms["prefill_attention"]


def test_empty_step_costs_only_the_engine_overhead():
    # a step that only preempts still runs the engine's loop once
    cost = llama().step_cost(StepWork())
    assert cost.terms == {**dict.fromkeys(TERMS, 0.0), "cpu_overhead": RooflineParams().cpu_step_s}
    assert cost.total_s == RooflineParams().cpu_step_s


def test_copy_on_write_by_hand():
    cost = llama().step_cost(StepWork(num_cow_blocks=3, block_size=16))
    assert cost.terms["cow_copy"] == pytest.approx(2 * 3 * 16 * KV_TOKEN / BW, rel=1e-12)


# --------------------------------------------------------------------------------- swaps
@pytest.mark.parametrize(("out", "into"), [(10, 0), (0, 7), (3, 5)])
def test_swap_time_is_bytes_over_pcie_at_its_efficiency(out, into):
    cost = llama().step_cost(StepWork(num_swap_out_blocks=out, num_swap_in_blocks=into, block_size=16))
    expected = max(out, into) * 16 * KV_TOKEN / PCIE  # the link is full duplex: both directions at once
    assert cost.swap_s == pytest.approx(expected, rel=1e-12)
    assert cost.compute_s == RooflineParams().cpu_step_s and cost.total_s == cost.swap_s + cost.compute_s
    # 10 blocks of 16 tokens: 20.97 MB at 25.6 GB/s
    assert llama().swap_seconds(10, 16) == pytest.approx(10 * 16 * 131_072 / 25.6e9, rel=1e-12)
    assert llama(pcie_efficiency=0.4).swap_seconds(10, 16) == pytest.approx(2 * llama().swap_seconds(10, 16))


def test_swap_is_reported_apart_from_compute():
    work = StepWork.from_output(output_of((50, 1, True), swap_out=4, swap_in=2), block_size=16)
    cost = llama().step_cost(work)
    assert cost.swap_s == pytest.approx(4 * 16 * KV_TOKEN / PCIE)  # 4 out beside 2 in
    assert cost.compute_s == pytest.approx(cost.total_s - cost.swap_s)
    assert cost.compute_s == pytest.approx(llama().step_cost(
        StepWork.from_output(output_of((50, 1, True)), block_size=16)).total_s)


# ------------------------------------------------------------------- tensor parallelism
def test_tp2_halves_weight_bytes_and_kv_per_gpu():
    model, gpu = MODEL_PRESETS["llama3-8b"], get_gpu_preset("a100-40gb")
    one, two = Deployment(model, gpu, 1), Deployment(model, gpu, 2)
    assert one.weight_bytes_per_gpu == 2 * 8_030_261_248
    assert two.weight_bytes_per_gpu == 8_030_261_248
    assert two.kv_heads_per_gpu == 4 and two.kv_bytes_per_token_per_gpu == KV_TOKEN // 2
    assert Deployment(model, gpu, 16).kv_heads_per_gpu == 1  # fewer KV heads than GPUs: replicated
    # a bandwidth-bound decode reads half the weights per GPU
    work = StepWork.from_output(output_of(*[(100, 1, True)] * 4), block_size=16)
    c1, c2 = llama(1).step_cost(work), llama(2).step_cost(work)
    assert c2.terms["linear"] == pytest.approx(c1.terms["linear"] / 2, rel=1e-12)
    assert c2.terms["decode_attention"] == pytest.approx(c1.terms["decode_attention"] / 2, rel=1e-12)
    # two ring all-reduces per layer of 4 tokens' hidden states, plus NCCL's ring latency each
    # (6.6 us and 0.6 us for each of its 2 (tp - 1) steps)
    allreduce = 4 * HIDDEN * 2
    expected_comm = LAYERS * 2 * (2 * (2 - 1) / 2 * allreduce / LINK + 6.6e-6 + 2 * 0.6e-6)
    assert c1.terms["tp_comm"] == 0.0
    assert c2.terms["tp_comm"] == pytest.approx(expected_comm, rel=1e-12)


def test_deployment_rejects_a_bad_tensor_parallel_degree():
    model, gpu = MODEL_PRESETS["llama3-8b"], get_gpu_preset("a100-40gb")
    for tp in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match="positive integer"):
            Deployment(model, gpu, tp)
    with pytest.raises(ValueError, match="not divisible"):
        Deployment(model, gpu, 3)


# ------------------------------------------------------------------------ monotonicity
def test_todays_kernel_reads_paged_kv_as_fast_as_contiguous():
    model = llama()
    costs = {bs: model.step_cost(StepWork(num_seqs=8, num_tokens=8, num_decode_seqs=8, decode_context_tokens=4000,
                                          num_sampled=8, block_size=bs)).terms["decode_attention"]
             for bs in (None, 1, 16, 256)}
    assert len(set(costs.values())) == 1 and costs[16] == pytest.approx(4000 * KV_TOKEN / BW)


def test_decode_attention_strictly_decreases_with_block_size():
    model = llama(**ATTENTION_KERNELS["paged-2023"])  # (today's kernel has no per-block term: next test)
    costs = [model.step_cost(StepWork(num_seqs=8, num_tokens=8, num_decode_seqs=8, decode_context_tokens=8 * 500,
                                      num_sampled=8, block_size=bs)).terms["decode_attention"]
             for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(a > b for a, b in pairwise(costs)), costs
    # 1-token blocks cost 5x a contiguous read, 16-token blocks 1.25x
    contiguous = 8 * 500 * KV_TOKEN / BW
    assert costs[0] == pytest.approx(5 * contiguous) and costs[4] == pytest.approx(1.25 * contiguous)
    # and so does a whole decode step
    totals = [model.step_cost(StepWork(num_seqs=8, num_tokens=8, num_decode_seqs=8, decode_context_tokens=4000,
                                       num_sampled=8, block_size=bs)).total_s for bs in (1, 4, 16, 64)]
    assert all(a > b for a, b in pairwise(totals))


sequences = st.tuples(st.integers(0, 4000), st.integers(1, 600), st.booleans())


@settings(max_examples=scaled_examples(100), deadline=None)
@given(batch=st.lists(sequences, min_size=0, max_size=12), extra=sequences,
       tp=st.sampled_from([1, 2, 4]), block_size=st.sampled_from([1, 16, 128]),
       copies=st.integers(0, 4), swaps=st.integers(0, 4))
def test_larger_batch_is_never_cheaper(batch, extra, tp, block_size, copies, swaps):
    model = llama(tp)
    base = model.step_cost(StepWork.from_output(output_of(*batch, copies=copies, swap_out=swaps), block_size))
    more = model.step_cost(StepWork.from_output(output_of(*batch, extra, copies=copies, swap_out=swaps), block_size))
    assert more.total_s >= base.total_s
    for term in TERMS:
        assert more.terms[term] >= base.terms[term], term


@settings(max_examples=scaled_examples(100), deadline=None)
@given(batch=st.lists(sequences, min_size=0, max_size=12), tp=st.sampled_from([1, 2, 8]),
       model=st.sampled_from(["llama3-8b", "opt-13b", "qwen2.5-7b", "tiny"]),
       gpu=st.sampled_from(sorted(GPU_PRESETS)), block_size=st.sampled_from([1, 4, 16, 32]),
       copies=st.integers(0, 5), swap_out=st.integers(0, 5), swap_in=st.integers(0, 5))
def test_terms_are_non_negative_and_add_up(batch, tp, model, gpu, block_size, copies, swap_out, swap_in):
    preset = MODEL_PRESETS[model]
    if preset.num_attention_heads % tp:
        tp = 1
    cost_model = RooflineCostModel(Deployment(preset, get_gpu_preset(gpu), tp))
    work = StepWork.from_output(output_of(*batch, copies=copies, swap_out=swap_out, swap_in=swap_in), block_size)
    cost = cost_model.step_cost(work)
    assert tuple(cost.terms) == TERMS
    assert all(math.isfinite(v) and v >= 0.0 for v in cost.terms.values())
    assert cost.total_s == pytest.approx(sum(cost.terms.values()), rel=1e-12)
    assert cost.compute_s == pytest.approx(cost.total_s - cost.swap_s, rel=1e-12, abs=1e-18)
    assert (cost.swap_s > 0) == bool(swap_out or swap_in)
    assert (cost.terms["tp_comm"] > 0) == (tp > 1 and work.num_tokens > 0)
    assert (cost.terms["kernel_launch"] > 0) == (work.num_tokens > 0)  # a step that computes launches kernels
    if work.num_tokens:
        assert cost.terms["cpu_overhead"] == pytest.approx(0.5e-3 + 10e-6 * len(batch))


def test_step_cost_totals():
    cost = StepCost({"linear": 1.0, "swap": 0.5, "sampling": 0.25})
    assert (cost.total_s, cost.compute_s, cost.swap_s) == (1.75, 1.25, 0.5)
    assert StepCost({"linear": 1.0}).swap_s == 0.0


# ------------------------------------------------------------------------- parameters
@pytest.mark.parametrize(("name", "value", "match"), [
    ("mfu", 0.0, r"mfu must be in \(0, 1\]"),
    ("mfu", 1.5, r"mfu must be in \(0, 1\]"),
    ("attention_efficiency", 0.0, "attention_efficiency"),
    ("mem_efficiency", 2.0, "mem_efficiency"),
    ("pcie_efficiency", 0.0, "pcie_efficiency"),
    ("interconnect_efficiency", 1.01, "interconnect_efficiency"),
    ("moe_mem_efficiency", 0.0, "moe_mem_efficiency"),
    ("moe_mfu", 1.5, "moe_mfu must be 0"),
    ("kernel_s", -1e-6, "kernel_s"),
    ("cpu_step_s", -1e-3, ">= 0"),
    ("block_overhead_tokens", -1.0, ">= 0"),
    ("sampling_fixed_s", "0.1", "must be a finite number"),
    ("allreduce_latency_s", True, "must be a finite number"),
    ("mfu", None, "must be a finite number"),
])
def test_roofline_params_validation(name, value, match):
    with pytest.raises(ValueError, match=match):
        RooflineParams(**{name: value})


def test_roofline_params_overrides():
    params = RooflineParams().with_overrides({"cpu_step_s": 0.004, "mfu": 0.5})
    assert params.cpu_step_s == 0.004 and params.mfu == 0.5 and params.mem_efficiency == 0.8
    with pytest.raises(ValueError, match="unknown roofline parameter.*foo"):
        RooflineParams().with_overrides({"foo": 1.0})
    with pytest.raises(ValueError, match="mfu"):
        RooflineParams().with_overrides({"mfu": 2.0})
    assert RooflineParams(block_overhead_tokens=0).block_overhead_tokens == 0  # zero is allowed


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_roofline_params_reject_non_finite_values(value):
    with pytest.raises(ValueError):
        RooflineParams(cpu_step_s=value)


# -------------------------------------------------------------------------- deployment
def test_opt13b_kv_cache_on_a100_40gb():
    d = Deployment(MODEL_PRESETS["opt-13b"], get_gpu_preset("a100-40gb"))
    assert d.kv_bytes_per_token_per_gpu == 819_200  # 2 x 40 layers x 40 heads x 128 x 2 bytes
    assert d.block_bytes_per_gpu(16) == 16 * 819_200
    assert d.num_blocks(12 * GiB, 16) == 983  # the PagedAttention paper's 12 GB cache
    assert d.num_blocks(12 * GiB, 1) == 15_728
    with pytest.raises(ValueError, match="holds no block"):
        d.num_blocks(16 * 819_200 - 1, 16)
    assert d.num_blocks(16 * 819_200, 16) == 1


def test_kv_cache_bytes_by_hand():
    d = Deployment(MODEL_PRESETS["llama3-8b"], get_gpu_preset("a100-40gb"))
    budget = math.floor(40_960 * 2**20 * 0.9)
    weights = 2 * 8_030_261_248
    widest = 2 * HIDDEN + (HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM) + 2 * MLP
    reserve = 8192 * widest * 2 + 256 * VOCAB * 4 + GiB // 2
    assert d.activation_reserve_bytes(8192, 256) == reserve
    assert d.kv_cache_bytes(0.9, 8192, 256) == budget - weights - reserve
    # more memory for the cache with a higher utilization, less with a bigger step
    assert d.kv_cache_bytes(0.95, 8192, 256) > d.kv_cache_bytes(0.9, 8192, 256) > d.kv_cache_bytes(0.9, 16384, 256)


def test_kv_cache_bytes_errors():
    d = Deployment(MODEL_PRESETS["llama3-8b"], get_gpu_preset("a100-40gb"))
    for util in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="utilization"):
            d.kv_cache_bytes(util, 8192, 256)
    big = Deployment(MODEL_PRESETS["llama3-70b"], get_gpu_preset("l40s"))
    with pytest.raises(ValueError, match="does not fit on l40s x1"):
        big.kv_cache_bytes(0.9, 8192, 256)
    # the same model fits across enough GPUs
    assert Deployment(MODEL_PRESETS["llama3-70b"], get_gpu_preset("h200"), 2).kv_cache_bytes(0.9, 8192, 256) > 0


def test_gpu_presets():
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu_preset("v100")
    assert get_gpu_preset(" A100-40GB ") is GPU_PRESETS["a100-40gb"]
    for gpu in GPU_PRESETS.values():
        assert gpu.memory_bytes > 16 * 10**9 and gpu.hbm_bytes_per_s > 0 and gpu.pcie_bytes_per_s > 0  # L4: 24 GB


# ------------------------------------------------------------- the contiguous baseline
def test_contiguous_baseline_step_time_does_not_depend_on_block_size():
    tr = Trace(arrival_s=np.array([0.0, 0.0, 1.0]), prompt_len=np.array([100, 60, 80]),
               output_len=np.array([20, 30, 10]))
    decode = {}
    for block_size in (1, 16):
        config = make_config("pagesim", block_size=block_size, num_gpu_blocks=4096 // block_size)
        scheduler = ContiguousScheduler(config, reservation="oracle", capacity_slots=4096)
        result = Simulation(tr, scheduler, llama(), SimOptions()).run()
        decode[block_size] = result.summary["time_by_term_s"]["decode_attention"]
    assert decode[1] == pytest.approx(decode[16], rel=1e-9)
