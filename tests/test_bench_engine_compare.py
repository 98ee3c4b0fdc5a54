"""vLLM bench's vocabulary on the real engine and in ``pagesim compare``: the engine's closed loop
never holds more than N requests, a request alone has its step gaps as ITLs, ``run --save-result``
writes vLLM's keys, and ``compare`` lays two hand-written result files side by side."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagesim.engine.cli import main
from pagesim.sim.bench_result import load_result
from pagesim.reports.compare import compare, distributions
from tests.engine_support import make_engine, request


def _in_flight_peak(records) -> int:
    events = sorted([(r.finish_s, -1) for r in records] + [(r.arrival_s, 1) for r in records])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def test_engine_closed_loop_keeps_at_most_n_in_flight():
    engine = make_engine(block_size=4, num_gpu_blocks=64)
    rng = np.random.default_rng(0)
    requests = [request(f"r{i}", rng.integers(3, 200, int(rng.integers(3, 12))).tolist(), int(rng.integers(2, 9)))
                for i in range(9)]  # all due at t=0
    engine.run(requests, max_concurrency=2)
    records = list(engine.records.values())
    assert all(r.status == "completed" for r in records)
    assert _in_flight_peak(records) == 2
    # the third request was sent only when one of the first two finished
    sent = sorted(r.arrival_s for r in records)
    finishes = sorted(r.finish_s for r in records)
    assert sent[2] >= finishes[0]


def test_a_request_alone_in_the_engine_has_its_step_gaps_as_itls():
    engine = make_engine(block_size=4, num_gpu_blocks=64)
    engine.run([request("r0", [5, 6, 7, 8, 9], 6)])
    (record,) = engine.records.values()
    ends = [s.start_s + s.duration_s for s in engine.steps]
    assert record.token_times_s == ends  # one token per step, every step
    itls = np.diff(record.token_times_s)
    assert len(itls) == 6 - 1
    assert itls.sum() == pytest.approx(record.finish_s - record.first_token_s, rel=1e-12)


def test_run_save_result_writes_vllm_keys(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert main(["run", "--workload", "kwon2023-alpaca", "--num-requests", "6", "--model", "tiny", "--block-size", "8",
                 "--num-gpu-blocks", "64", "--max-concurrency", "2", "--save-result", "--result-filename", str(path),
                 "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    result = load_result(path)
    assert result["completed"] == 6 and result["failed"] == 0 and result["max_concurrency"] == 2
    # the summary's is the exact peak in flight; the file's is vLLM's count per whole second (at least that)
    assert result["pagesim"]["max_concurrent_requests_exact"] == summary["max_concurrent_requests"] <= 2
    assert result["max_concurrent_requests"] >= summary["max_concurrent_requests"]
    assert {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "itls", "ttfts", "input_lens", "output_lens"} <= set(result)
    assert result["mean_ttft_ms"] == pytest.approx(1000 * summary["ttft_s"]["mean"], rel=1e-4)
    assert [len(g) for g in result["itls"]] == [n - 1 for n in result["output_lens"]]


# vLLM 0.33's `vllm bench serve --save-result --save-detailed` layout, written by hand
REAL = {
    "date": "20261201-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
    "model_id": "meta-llama/Meta-Llama-3-8B", "tokenizer_id": "meta-llama/Meta-Llama-3-8B", "num_prompts": 4,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2, "duration": 10.0, "completed": 4, "failed": 0,
    "total_input_tokens": 400, "total_output_tokens": 40, "request_throughput": 0.4, "request_goodput": None,
    "output_throughput": 4.0, "total_token_throughput": 44.0, "input_lens": [100] * 4, "output_lens": [10] * 4,
    "ttfts": [0.1, 0.2, 0.3, 0.4], "itls": [[0.05] * 9] * 4, "latencies": [0.55, 0.65, 0.75, 0.85],
    "start_times": [0.0, 0.0, 0.6, 0.7], "errors": ["", "", "", ""], "max_output_tokens_per_s": 20.0,
    "max_concurrent_requests": 2, "mean_ttft_ms": 250.0, "median_ttft_ms": 250.0, "std_ttft_ms": 111.8,
    "p99_ttft_ms": 399.0, "mean_tpot_ms": 50.0, "median_tpot_ms": 50.0, "std_tpot_ms": 0.0, "p99_tpot_ms": 50.0,
    "mean_itl_ms": 50.0, "median_itl_ms": 50.0, "std_itl_ms": 0.0, "p99_itl_ms": 50.0,
}


def test_compare_lays_two_files_side_by_side(tmp_path, capsys):
    sim = {**REAL, "backend": "pagesim", "duration": 12.5, "mean_ttft_ms": 300.0,
           "ttfts": [0.1, 0.2, 0.3, 10.0], "latencies": None, "pagesim": {"summary": {}}}
    del sim["latencies"]  # E2EL then comes from ttft + sum(itls), as vLLM's latency is
    result = compare(REAL, sim)
    rows = {r["metric"]: r for r in result["metrics"]}
    assert rows["duration"]["relative_difference"] == pytest.approx(0.25)
    assert rows["mean_ttft_ms"]["relative_difference"] == pytest.approx(0.2)
    assert rows["completed"]["relative_difference"] == 0.0
    assert "request_goodput" not in rows  # null in both
    # one TTFT of four moved past all the others: the CDFs differ by 1/4 at most
    assert result["ks_statistic"]["ttft"] == pytest.approx(0.25)
    assert distributions(sim)["e2el"] == pytest.approx([0.55, 0.65, 0.75, 10.45])
    assert result["ks_statistic"]["itl"] == 0.0

    a, b = tmp_path / "real.json", tmp_path / "sim.json"
    a.write_text(json.dumps(REAL))
    b.write_text("\n" + json.dumps(sim) + "\n")  # an --append-result file: its last object
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "mean_ttft_ms" in text and "+20.0%" in text and "Kolmogorov-Smirnov" in text


def test_compare_refuses_files_that_are_not_results(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(REAL))
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2, 3]")
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(a), str(junk)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "junk.json" in err and "Traceback" not in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SystemExit):
        main(["compare", str(a), str(other)])
    assert "share no vLLM bench metric" in capsys.readouterr().err


def test_open_loop_arrivals_keep_their_times_when_a_step_frees_requests():
    """Without a concurrency limit a request arriving during a step that finishes another is still
    stamped with its own arrival (TTFT counts from it), not with that step's end."""
    engine = make_engine(block_size=4, num_gpu_blocks=64)
    first = request("r0", [5, 6, 7, 8, 9] * 8, 1)  # finishes at the end of the first step
    second = request("r1", [9, 8, 7], 3, arrival_time_s=1e-5)  # arrives during that step
    engine.run([first, second])
    records = engine.records
    assert records["r0"].finish_s > 1e-5
    assert records["r1"].arrival_s == 1e-5
