"""pagesim run: the issue's commands (swap, recompute, parallel sampling) report preemptions and
outputs equal to the reference; bad input is one error line with exit status 2."""

from __future__ import annotations

import json

import pytest

from pagesim.engine.cli import main
from pagesim.engine.model import random_model, save_pretrained
from tests.engine_support import TINY

BASE = ["run", "--workload", "kwon2023-alpaca", "--num-requests", "16", "--model", "tiny", "--block-size", "8",
        "--num-gpu-blocks", "24", "--check-reference", "--json", "--no-progress"]
KEYS = {"requests_completed", "tokens_generated", "preemptions", "cow_copies", "swapped_blocks", "prefix_hit_tokens",
        "outputs_match_reference", "wall_s"}


def run_json(capsys, *extra) -> dict:
    assert main([*BASE, *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra,mode", [
    (["--preemption", "swap"], "swap"),
    (["--preemption", "recompute"], "recompute"),
    (["--preemption", "swap", "--n", "2", "--temperature", "0.8", "--top-p", "0.95"], "swap"),
])
def test_issue_commands(capsys, extra, mode):
    summary = run_json(capsys, *extra)
    assert KEYS <= set(summary)
    assert summary["preemptions"][mode] > 0
    assert summary["outputs_match_reference"] is True and summary["reference_mismatches"] == []
    assert summary["validation_mode"] is True and summary["requests_completed"] >= 14
    if "--n" in extra:
        assert summary["cow_copies"] > 0
    if mode == "swap":
        assert summary["swapped_blocks"] > 0


def test_out_dir_holds_the_decision_log_and_tables(tmp_path, capsys):
    from pagesim.engine.policy import DecisionLog

    out = tmp_path / "run"
    assert main(["run", "--workload", "kwon2023-alpaca", "--num-requests", "4", "--num-gpu-blocks", "64",
                 "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "4 completed" in text
    log = DecisionLog.read_jsonl(out / "decisions.jsonl")
    assert log[0]["step"] == 0 and set(log[0]["new"]) == {"r0", "r1", "r2", "r3"}
    assert (out / "requests.csv").read_text().count("\n") == 5
    assert json.loads((out / "summary.json").read_text())["requests_completed"] == 4
    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert len(outputs) == 4 and all(o["status"] == "completed" for o in outputs)


def test_a_model_folder_runs(tmp_path, capsys):
    save_pretrained(random_model(TINY, seed=9), tmp_path / "m")
    summary = run_json(capsys, "--preemption", "recompute", "--model", str(tmp_path / "m"))
    assert summary["outputs_match_reference"] is True and summary["dtype"] == "float64"


def error_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim run: error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize("extra,message", [
    (["--num-gpu-blocks", "0"], "--num-gpu-blocks must be >= 1"),
    (["--num-gpu-blocks", "1"], "none of the 16 requests can be served with 1 KV blocks of 16 tokens"),
    (["--n", "0"], "--n must be >= 1"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--top-p", "0"], r"top_p must be in \(0, 1\]"),
    (["--beam-width", "2", "--temperature", "1"], "beam search, which is deterministic"),
    (["--model", "no-such-model"], "unknown model preset 'no-such-model'"),
    (["--max-model-len", "4096"], "exceeds tiny's context"),
    (["--block-size", "0"], "--block-size must be >= 1"),
    (["--dtype", "float64", "--backend", "triton"], "the triton backend takes float32, float16 or bfloat16"),
    (["--model", "./no/such/folder"], "--model ./no/such/folder: no such folder"),
    (["--num-gpu-blocks", "24", "--gpu-memory-utilization", "0.5"], "give one of --num-gpu-blocks, --gpu-memory-utilization"),
    (["--kv-cache-gb", "1e308"], "--kv-cache-gb must be a positive number of GiB below"),
    (["--swap-space", "inf"], "--swap-space must be a number of GiB in"),
    (["--num-gpu-blocks", "4000000000"], r"need [\d.]+ GiB for the weights \(.* parameters in float64\) \+ [\d.]+ GiB "
                                         r"for the KV cache and swap space; [\d.]+ GiB is available in RAM"),
    (["--workload", "kwon2023-alpaca-beam", "--temperature", "1"], "beam search, which is deterministic"),
    (["--policy", "vllm-v0", "--beam-width", "3", "--num-gpu-blocks", "24", "--block-size", "8"],
     "none of the 16 requests can be served"),
])
def test_bad_input_is_one_error_line(capsys, extra, message):
    import re

    err = error_of(capsys, "run", "--workload", "kwon2023-alpaca", "--num-requests", "16", "--no-progress", *extra)
    assert re.search(message, err), err


def test_out_must_be_a_folder_before_anything_runs(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = error_of(capsys, "run", "--workload", "kwon2023-alpaca", "--num-requests", "2", "--out", str(afile))
    assert "exists and is not a folder" in err


def test_n_one_keeps_the_traces_beams(capsys):
    summary = run_json(capsys, "--preemption", "recompute", "--n", "3", "--beam-width", "1", "--num-requests", "4")
    assert summary["requests_completed"] + summary["requests_rejected"] == 4
    assert summary["tokens_generated"] > 0
    three = run_json(capsys, "--preemption", "recompute", "--n", "3", "--num-requests", "4")
    assert summary["tokens_generated"] == three["tokens_generated"]


def test_requests_longer_than_the_context(capsys):
    err = error_of(capsys, "run", "--workload", "kwon2023-sharegpt", "--num-requests", "40", "--no-progress")
    assert "longer than the context of 512 tokens" in err


def test_a_broken_model_folder(tmp_path, capsys):
    folder = tmp_path / "m"
    save_pretrained(random_model(TINY), folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    err = error_of(capsys, "run", "--workload", "kwon2023-alpaca", "--num-requests", "2", "--model", str(folder))
    assert "has shape" in err and "config.json implies" in err
