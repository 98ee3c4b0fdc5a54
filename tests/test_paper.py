"""The PagedAttention reproduction (pagesim/sim/paper.py): its derivation and its command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from pagesim.engine.cli import main
from pagesim.sim.cost.base import StepWork
from pagesim.sim.paper import CALIBRATION_POINT, PAPER, PaperSetup, derived_engine_overhead
from pagesim.sim.setup import build
from pagesim.traces.generate import generate, workload_spec


def test_derived_overhead_puts_the_roofline_at_the_papers_step_time():
    setup = PaperSetup(engine_overhead_s=0.0)
    roofline = build(setup.spec("paged")).cost_model
    overhead = derived_engine_overhead(roofline, sample_requests=5000)
    assert 0.002 < overhead < 0.02  # a few ms per step, a Python engine without CUDA graphs
    # By hand: 30.42 running at 2 req/s stay 15.21 s each; over the workload's mean output,
    # less the prompt-only share exp(-rate x step), that is the decode step the fit must reach.
    point = CALIBRATION_POINT
    sample = generate(workload_spec(point["workload"], rate_rps=point["rate_rps"], num_requests=5000, seed=12345))
    o, p = sample.output_len.astype(float), sample.prompt_len.astype(float)
    stay = point["running"] / point["rate_rps"]
    step = stay / o.mean()
    for _ in range(100):
        step = math.exp(-point["rate_rps"] * step) * stay / o.mean()
    assert 0.035 < step < 0.045
    batch = round(point["running"])
    work = StepWork(num_seqs=batch, num_tokens=batch, num_decode_seqs=batch, num_sampled=batch,
                    decode_context_tokens=round(batch * (o * (p + o / 2)).mean() / o.mean()))
    fitted = build(replace(setup, engine_overhead_s=overhead).spec("paged")).cost_model
    assert fitted.step_cost(work).total_s == pytest.approx(step, rel=1e-9)
    assert PaperSetup(engine_overhead_s=0.001).overhead_s == 0.001


def test_setup_is_the_papers():
    built = build(PaperSetup().spec("max"))
    assert built.model.name == "opt-13b" and built.deployment.gpu.name == "a100-40gb"
    assert built.deployment.kv_bytes_per_token_per_gpu == 819_200
    assert built.scheduler.kv_usage().total_slots == 983 * 16  # 12 GiB / 800 KiB, in 16-token blocks
    assert built.scheduler.allocator.placement == "buddy"
    assert build(PaperSetup().spec("paged")).scheduler.config.max_model_len == 2048


def test_reproduce_prints_the_papers_numbers_beside_ours(capsys):
    assert main(["reproduce", "kwon2023", "--figures", "2,13", "--num-requests", "60", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert set(results["fig2_memory_utilization"]) == set(PAPER["fig2_memory_utilization"])
    for label, row in results["fig13_batched_requests"].items():
        assert set(row) == set(PAPER["fig13_batched_requests"][label])
        assert 0 < row["max"] <= 7  # 15,728 slots hold at most seven 2,048-slot Max reservations
    assert main(["reproduce", "kwon2023", "--figures", "2", "--num-requests", "60"]) == 0
    text = capsys.readouterr().out
    assert "Orca (Max)" in text and "20.4%" in text and "ms of engine overhead per step" in text


@pytest.mark.parametrize("argv", [["--figures", "3"], ["--quick", "--figures", "18b"], ["--engine-overhead-ms", "x"],
                                  ["--engine-overhead-ms", "-1"], ["--num-requests", "0"]])
def test_bad_reproduce_arguments_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "kwon2023", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "pagesim reproduce: error:" in err and "Traceback" not in err
