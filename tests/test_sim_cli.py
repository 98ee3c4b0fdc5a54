"""``pagesim simulate`` end to end: the JSON summary, the --out files, determinism, bad input.

Most runs go through ``pagesim.engine.cli.main`` in-process (fast); the determinism check runs the
installed ``pagesim`` entry point twice in fresh interpreters, with different hash seeds, so that
anything depending on ``PYTHONHASHSEED`` or process state would show.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagesim.engine.cli import main
from tests.conftest import SHARED

WORKLOAD = ["--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "50"]
SMALL = ["--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "20"]
STATS_KEYS = ("mean", "p50", "p99")
SUMMARY_KEYS = (
    "requests_completed", "requests_rejected", "throughput_rps", "throughput_tokens_s", "ttft_s", "tpot_s",
    "e2e_s", "normalized_latency_s_per_token", "memory_utilization", "avg_batched_requests", "preemptions",
    "prefix_hit_rate", "sim_wall_s",
)
AZURE_CONV = SHARED / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
PAGESIM = Path(sys.executable).with_name("pagesim")


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity (not JSON)."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def simulate_json(capsys, *args: str) -> dict:
    rc, out, err = simulate(capsys, "--json", *args)
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, "--json prints exactly one line"
    summary = strict_json(lines[0])
    assert isinstance(summary, dict)
    return summary


def check_summary(summary: dict, total: int) -> None:
    for key in SUMMARY_KEYS:
        assert key in summary, key
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(STATS_KEYS) <= set(summary[key]), key
    assert set(summary["preemptions"]) == {"swap", "recompute"}
    assert summary["requests_completed"] + summary["requests_rejected"] == total
    assert summary["sim_wall_s"] >= 0


# ------------------------------------------------------------------------------- --json
def test_json_summary(capsys):
    summary = simulate_json(capsys, *WORKLOAD)
    check_summary(summary, 50)
    assert summary["requests_total"] == 50
    assert summary["requests_completed"] == 50  # ShareGPT-like requests all fit on an A100
    assert summary["throughput_rps"] > 0 and summary["throughput_tokens_s"] > summary["throughput_rps"]
    ttft = summary["ttft_s"]
    assert 0 < ttft["p50"] <= ttft["p99"]
    assert 0 < summary["memory_utilization"] <= 1
    assert summary["avg_batched_requests"] >= 1
    assert summary["e2e_s"]["mean"] >= summary["ttft_s"]["mean"]


@pytest.mark.parametrize("allocator", ["max", "pow2", "oracle"])
def test_contiguous_allocators(capsys, allocator):
    summary = simulate_json(capsys, *SMALL, "--allocator", allocator)
    check_summary(summary, 20)
    assert summary["preemptions"] == {"swap": 0, "recompute": 0}
    assert summary["prefix_hit_rate"] is None  # no prefix cache


def test_max_allocator_wastes_memory_that_paging_does_not(capsys):
    paged = simulate_json(capsys, *SMALL)
    reserved = simulate_json(capsys, *SMALL, "--allocator", "max")
    assert reserved["memory_utilization"] < 0.5
    assert paged["memory_utilization"] > 0.9


@pytest.mark.parametrize("workload", ["kwon2023-alpaca-parallel", "kwon2023-alpaca-beam"])
@pytest.mark.parametrize("allocator", ["paged", "max"])
def test_parallel_and_beam_workloads(capsys, workload, allocator):
    summary = simulate_json(capsys, "--workload", workload, "--rate", "4", "--num-requests", "15",
                            "--allocator", allocator, "--max-model-len", "2048")
    check_summary(summary, 15)
    assert summary["requests_completed"] == 15


def test_swap_preemption_with_overlapped_swaps(capsys):
    args = [*SMALL, "--num-gpu-blocks", "150", "--preemption", "swap", "--block-size", "16"]
    sync = simulate_json(capsys, *args)
    overlapped = simulate_json(capsys, *args, "--overlap-swaps")
    assert sync["preemptions"]["swap"] > 0 and sync["swapped_blocks"]["out"] > 0
    assert sync["time_by_term_s"]["swap"] > 0
    assert overlapped["busy_s"] <= sync["busy_s"]


# -------------------------------------------------------------------------------- --out
def test_out_dir_files(capsys, tmp_path):
    out = tmp_path / "run"
    rc, stdout, _ = simulate(capsys, *WORKLOAD, "--json", "--out", str(out))
    assert rc == 0
    printed = strict_json(stdout)
    names = {"summary.json", "run_info.json", "requests.csv", "steps.csv", "decisions.jsonl", "timeline.json"}
    assert {p.name for p in out.iterdir()} == names  # and no *.tmp left behind

    summary = strict_json((out / "summary.json").read_text())
    assert summary == {k: v for k, v in printed.items() if k != "sim_wall_s"}

    info = strict_json((out / "run_info.json").read_text())
    assert info["deployment"]["model"] == "llama3-8b" and info["deployment"]["gpu"] == "a100-40gb"
    assert info["options"]["seed"] == 0 and "sim_wall_s" in info

    with open(out / "requests.csv", newline="") as f:
        requests = list(csv.DictReader(f))
    assert len(requests) == 50
    assert [r["request_id"] for r in requests] == [f"r{i}" for i in range(50)]
    assert {r["status"] for r in requests} == {"completed"}
    assert sum(int(r["output_tokens"]) for r in requests) == summary["generated_tokens"]

    with open(out / "steps.csv", newline="") as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == summary["steps"] > 0
    assert sum(float(s["duration_s"]) for s in steps) == pytest.approx(summary["busy_s"], rel=1e-5)

    records = [strict_json(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert len(records) == len(steps)
    assert [r["step"] for r in records] == [int(s["step"]) for s in steps]
    assert sorted(rid for r in records for rid in r["finished"]) == sorted(r["request_id"] for r in requests)
    for record, step in zip(records, steps):
        assert sum(record["scheduled"].values()) == int(step["num_tokens"])

    timeline = strict_json((out / "timeline.json").read_text())
    events = timeline["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X") == len(steps)
    assert sum(1 for e in events if e["ph"] == "b") == 2 * 50  # queued and running spans per request
    assert sum(1 for e in events if e["ph"] == "e") == 2 * 50


def test_out_without_json_prints_the_table(capsys, tmp_path):
    rc, stdout, _ = simulate(capsys, *SMALL, "--out", str(tmp_path / "o"))
    assert rc == 0
    assert "20 completed, 0 rejected" in stdout
    assert f"wrote {tmp_path / 'o'}/" in stdout
    assert (tmp_path / "o" / "summary.json").is_file()


def run_installed(out: Path, hash_seed: str, *extra: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    args = [str(PAGESIM), "simulate", "--no-progress", "--json", "--workload", "shared-system-prompt",
            "--rate", "8", "--num-requests", "60", "--num-gpu-blocks", "300", "--out", str(out), *extra]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert strict_json(done.stdout)["requests_total"] == 60


@pytest.mark.skipif(not PAGESIM.exists(), reason="the pagesim entry point is not installed beside python")
def test_same_seed_gives_identical_files_across_processes(tmp_path):
    # a tight pool with shared system prompts: prefix hits, evictions and preemptions all happen
    run_installed(tmp_path / "a", "1")
    run_installed(tmp_path / "b", "2")
    for name in ("summary.json", "decisions.jsonl", "requests.csv", "steps.csv", "timeline.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    summary = strict_json((tmp_path / "a" / "summary.json").read_text())
    assert summary["prefix_hit_rate"] > 0 and summary["prefix_evictions"] > 0
    assert sum(summary["preemptions"].values()) > 0


def test_different_seed_gives_a_different_run(capsys, tmp_path):
    simulate(capsys, *SMALL, "--seed", "1", "--out", str(tmp_path / "a"))
    simulate(capsys, *SMALL, "--seed", "1", "--out", str(tmp_path / "b"))
    simulate(capsys, *SMALL, "--seed", "2", "--out", str(tmp_path / "c"))

    def read(run: str, name: str) -> bytes:
        return (tmp_path / run / name).read_bytes()

    assert read("a", "summary.json") == read("b", "summary.json")
    assert read("a", "decisions.jsonl") == read("b", "decisions.jsonl")
    assert read("a", "summary.json") != read("c", "summary.json")


# ---------------------------------------------------------------------------- bad input
BAD_INPUT = {
    "block size 0": ["--block-size", "0"],
    "unknown model": ["--model", "gpt-17"],
    "cost param without value": ["--cost-param", "foo"],
    "cost param unknown": ["--cost-param", "foo=1"],
    "cost param out of range": ["--cost-param", "mfu=2"],
    "cost param not a number": ["--cost-param", "mfu=high"],
    "blocks and GiB": ["--num-gpu-blocks", "100", "--kv-cache-gb", "1"],
    "model does not fit": ["--model", "llama3-70b", "--gpu", "l40s"],
    "tp not dividing heads": ["--tp", "3"],
    "tp 0": ["--tp", "0"],
    "negative swap space": ["--swap-space", "-1"],
    "utilization above 1": ["--gpu-memory-utilization", "1.5"],
    "cache holds no block": ["--kv-cache-gb", "0.00001"],
    "max-num-seqs 0": ["--max-num-seqs", "0"],
    "slo 0": ["--slo-ttft", "0"],
    "budget below max-model-len without chunking": ["--chunked-prefill", "off", "--max-num-batched-tokens", "100"],
    "num-gpu-blocks 0": ["--num-gpu-blocks", "0"],
}


@pytest.mark.parametrize("args", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_is_one_error_line(capsys, args):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *SMALL, *args)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("pagesim simulate: error: ")


@pytest.mark.parametrize("args", [["--gpu", "v100"], ["--allocator", "buddy"], ["--block-size", "sixteen"]])
def test_argparse_errors_end_with_the_error_line(capsys, args):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *SMALL, *args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("pagesim simulate: error: ")


def test_missing_trace_file(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, "--trace", str(tmp_path / "nope.csv"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim simulate: error: ") and len(err.strip().splitlines()) == 1


def test_swap_space_exhausted_is_an_error_line(capsys):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *SMALL, "--policy", "vllm-v0", "--swap-space", "0", "--preemption", "swap",
                 "--num-gpu-blocks", "20")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim simulate: error: the run stopped where vLLM 0.6.3 aborts: swapping out ")
    assert "(more --swap-space, or --preemption recompute, lets it go on)" in err


def test_recomputing_parallel_samples_under_vllm_v0_is_an_error_line_that_says_what_goes_on(capsys):
    """vLLM 0.6.3 cannot recompute a group of several sequences: the hint names the modes that
    swap such a group, not recompute."""
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, "--workload", "kwon2023-alpaca-parallel", "--rate", "20", "--num-requests", "300",
                 "--num-gpu-blocks", "60", "--policy", "vllm-v0", "--preemption", "recompute")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim simulate: error: the run stopped where vLLM 0.6.3 aborts: vLLM 0.6.3 cannot "
                          "preempt ")
    assert err.strip().endswith("(--preemption vllm-v0 or swap lets it go on)") and len(err.strip().splitlines()) == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_cost_param_is_refused(capsys, value):
    with pytest.raises(SystemExit) as exc:
        simulate(capsys, *SMALL, "--json", "--cost-param", f"cpu_step_s={value}")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim simulate: error: roofline parameter cpu_step_s must be a finite number")
    assert "Traceback" not in err


# ------------------------------------------------------------------------- shared trace
@pytest.mark.skipif(not AZURE_CONV.is_file(), reason=f"shared trace {AZURE_CONV} not present")
def test_azure_conversation_trace(capsys):
    summary = simulate_json(capsys, "--trace", str(AZURE_CONV), "--num-requests", "200")
    check_summary(summary, 200)
    assert summary["requests_total"] == 200
    assert summary["requests_completed"] > 0


def test_rejections_are_explained_in_the_summary(capsys):
    summary = simulate_json(capsys, "--workload", "kwon2023-alpaca-beam", "--rate", "4", "--num-requests", "6",
                            "--policy", "vllm-v0", "--no-progress")
    assert summary["requests_rejected"] == 6 and summary["requests_completed"] == 0
    assert summary["rejection_reasons"] == {
        "beam search is not modelled under the vllm-v0 step order (use n for parallel samples)": 6}
