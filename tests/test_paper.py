"""The PagedAttention reproduction (sim/paper.py): its derivation and its command line."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from sim.cost.base import StepWork
from sim.paper import PAPER, PAPER_OPERATING_POINTS, PaperSetup, derived_engine_overhead
from sim.setup import build


def test_derived_overhead_puts_the_roofline_at_the_papers_step_times():
    setup = PaperSetup(engine_overhead_s=(0.0, 0.0))
    roofline = build(setup.spec("paged")).cost_model
    fixed, per_seq = derived_engine_overhead(roofline)
    assert 0 < fixed < 0.02 and 0 < per_seq < 1e-3
    for running, rate, prompt, output in PAPER_OPERATING_POINTS:
        batch = round(running)
        work = StepWork(num_seqs=batch, num_tokens=batch, num_decode_seqs=batch,
                        decode_context_tokens=batch * round(prompt + output / 2), num_sampled=batch)
        littles_law_step_s = running / rate / output
        assert roofline.step_cost(work).total_s + fixed + batch * per_seq == pytest.approx(littles_law_step_s)
        # and the setup that uses it prices that step the same way
        fitted = build(PaperSetup().spec("paged")).cost_model
        assert fitted.step_cost(work).total_s == pytest.approx(littles_law_step_s)


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
    assert "Orca (Max)" in text and "20.4%" in text and "Step times: roofline + engine overhead" in text


@pytest.mark.parametrize("argv", [["--figures", "3"], ["--quick", "--figures", "18b"], ["--engine-overhead-ms", "x"],
                                  ["--engine-overhead-ms", "1"], ["--num-requests", "0"]])
def test_bad_reproduce_arguments_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "kwon2023", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim reproduce: error:") and "Traceback" not in err
