"""``pagesim simulate`` on the models and GPUs of today's deployments (the catalog's done-when runs).

MoE (Mixtral on two H100s, DeepSeek V3 on eight H200s in its FP8 checkpoint) and hybrid-attention
(gpt-oss-120b on one H100, its experts in MXFP4) runs complete and report the expert and attention
terms; a 128k-context Llama 3.1 serves a real long-context trace rejecting only what exceeds its
context; the hybrid cache stays exact with skip-ahead requested; the calibrated cost model costs a
windowed model's sliding layers at their window.
"""

from __future__ import annotations

import pytest

from pagesim.engine.model_presets import MODEL_PRESETS
from pagesim.sim.cost.base import StepWork
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.profile import load_profile
from tests.conftest import SHARED
from tests.test_sim_cli import simulate, simulate_json

SHAREGPT = ["--workload", "kwon2023-sharegpt", "--rate", "2", "--num-requests", "60"]
MOONCAKE = SHARED / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"


@pytest.mark.parametrize(("args", "expert_comm"), [
    (["--model", "mixtral-8x7b", "--gpu", "h100", "--tp", "2"], False),
    (["--model", "deepseek-v3", "--gpu", "h200", "--tp", "8"], False),
    (["--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--ep", "8"], True),
    (["--model", "gpt-oss-120b", "--gpu", "h100"], False),
])
def test_moe_and_hybrid_models_complete_with_their_terms(capsys, args, expert_comm):
    summary = simulate_json(capsys, *args, *SHAREGPT)
    assert summary["requests_completed"] == 60 and summary["requests_rejected"] == 0
    terms = summary["time_by_term_s"]
    assert terms["moe"] > 0 and terms["decode_attention"] > 0 and terms["prefill_attention"] > 0
    assert (terms["ep_comm"] > 0) == expert_comm


def test_gpt_oss_keeps_its_sliding_layers_to_the_window(capsys):
    """The hybrid cache holds a smaller share of its memory than the same model with the window's
    whole context held (--disable-hybrid-kv-cache-manager; that both attend through the window is
    tests/test_roofline_models.py's)."""
    long_prompts = ["--workload", "shared-system-prompt", "--rate", "2", "--num-requests", "60"]
    hybrid = simulate_json(capsys, "--model", "gpt-oss-120b", "--gpu", "h100", *long_prompts)
    full = simulate_json(capsys, "--model", "gpt-oss-120b", "--gpu", "h100", "--disable-hybrid-kv-cache-manager",
                         *long_prompts)
    assert hybrid["memory_used_fraction"] < 0.75 * full["memory_used_fraction"]
    assert hybrid["requests_completed"] == full["requests_completed"] == 60


def test_weights_that_do_not_fit_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulate(capsys, "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--dtype", "bf16", *SHAREGPT)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and not captured.out
    err = captured.err
    assert err.count("\n") == 1 and "does not fit on h200 x8" in err and "--tp 16" in err and "Traceback" not in err


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/traces is absent")
def test_llama31_serves_the_long_context_trace(capsys):
    summary = simulate_json(capsys, "--trace", str(MOONCAKE), "--num-requests", "400", "--model", "llama3.1-8b",
                            "--gpu", "h100")
    assert summary["requests_completed"] + summary["requests_rejected"] == 400
    assert summary["requests_rejected"] <= 4  # under 1%: only prompts past 131,072 tokens


def test_the_calibrated_model_costs_sliding_layers_at_their_window():
    profile = load_profile("pagesim/sim/profiles/tiny-cpu.json")
    plain, windowed = CalibratedCostModel(profile), CalibratedCostModel(profile)
    plain.check_model(MODEL_PRESETS["tiny"])
    windowed.check_model(MODEL_PRESETS["tiny-swa"])
    assert (plain.window_layers, windowed.window_layers) == (0, 1)
    work = StepWork(num_seqs=4, num_tokens=4, num_decode_seqs=4, decode_context_tokens=4 * 400,
                    decode_window_context_tokens=4 * 16, num_sampled=4, block_size=16)
    full_cost = plain.step_cost(work).terms["decode_attention"]
    window_cost = windowed.step_cost(work).terms["decode_attention"]
    one_layer_full = full_cost / 2
    assert window_cost < full_cost
    assert window_cost == pytest.approx(one_layer_full + plain._t("decode_attention", 16, 4, 16))
