"""``vllm bench serve``'s datasets sonnet and burstgpt and its result-file, arrival and no-op flags, for
``simulate`` and ``run``; "did you mean" only for typos; vLLM's ``max_concurrent_requests``.

Expected values come from vLLM's rules reimplemented here, apart from ``pagesim.traces.bench``: vLLM 0.11.0's
``SonnetDataset.sample`` (deprecated there; 0.33 has no sonnet dataset), vLLM 0.33's
``BurstGPTDataset`` (pandas' ``sample``, whose row choice is NumPy's ``RandomState.choice``),
``_get_current_request_rate`` / ``get_request`` (ramp-up), the result file's key order and name
(serve.py:2300-2341, ``compute_result_filename``) and ``calculate_metrics``' per-second count.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import stat

import numpy as np
import pytest

from pagesim.engine.cli import build_parser, main, nearest_flag, typo_distance, unknown_flags_message
from pagesim.sim.bench_result import PerRequest, bench_result, load_result
from tests.bad_inputs_harness import error_line, run_pagesim
from tests.test_bench_datasets import word_tokenizer  # noqa: F401 (a fixture, shared with the datasets' tests)
from tests.test_bench_metrics import vllm_per_second
from pagesim.traces.bench import burstgpt_trace, sonnet_trace
from pagesim.traces.bench.burstgpt import sample_rows
from pagesim.traces.bench.ramp_up import RampUp, ramp_up_from_args
from pagesim.traces.bench.sonnet import BASE_PROMPT


# ---------------------------------------------------------------- helpers

def write_poem(path, num_lines: int = 40) -> list[str]:
    """Lines of 2 to 12 words, so a prompt's length varies with the lines drawn."""
    lines = [" ".join(f"w{(7 * k + j) % 2000}" for j in range(2 + (5 * k) % 11)) + "\n" for k in range(num_lines)]
    path.write_text("".join(lines))
    return lines


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": note: " in line]


RANDOM = ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "8", "--num-prompts", "12"]


# ---------------------------------------------------------------- sonnet
def vllm_sonnet_lengths(lines, count_tokens, *, num_prompts, seed, input_len, prefix_len):
    """vLLM 0.11.0 ``SonnetDataset.sample`` (no chat template: prompts counted as written), with
    ``random.seed(seed)`` as serve.py's main does first: the prompt lengths it keeps, in order."""
    avg_len = sum(count_tokens(line) for line in lines) / len(lines)
    base_offset = count_tokens(BASE_PROMPT)
    num_input_lines = round((input_len - base_offset) / avg_len)
    num_prefix_lines = max(round((prefix_len - base_offset) / avg_len), 0)
    prefix_lines = lines[:num_prefix_lines]
    random.seed(seed)
    kept = []
    while len(kept) < num_prompts:
        extra = random.choices(lines, k=num_input_lines - num_prefix_lines)
        prompt_len = count_tokens(BASE_PROMPT + "".join(prefix_lines + extra))
        if prompt_len <= input_len:
            kept.append(prompt_len)
    return kept, num_prefix_lines


def test_sonnet_draws_vllms_lines_under_one_shared_prefix(tmp_path, word_tokenizer):
    lines = write_poem(tmp_path / "poem.txt")
    trace = sonnet_trace(tmp_path / "poem.txt", word_tokenizer, num_prompts=30, seed=3, input_len=90,
                         output_len=7, prefix_len=40)
    expected, num_prefix_lines = vllm_sonnet_lengths(lines, word_tokenizer.count, num_prompts=30, seed=3,
                                                     input_len=90, prefix_len=40)
    assert trace.prompt_len.tolist() == expected
    assert (trace.prompt_len <= 90).all() and trace.output_len.tolist() == [7] * 30
    assert trace.metadata["num_prefix_lines"] == num_prefix_lines > 0
    # the instruction and the prefix lines: the same leading chunks in every prompt
    shared = (word_tokenizer.count(BASE_PROMPT + "".join(lines[:num_prefix_lines]))) // 16
    firsts = {tuple(trace.prefix_ids(i)[:shared].tolist()) for i in range(len(trace))}
    assert shared >= 1 and len(firsts) == 1
    assert len({tuple(trace.prefix_ids(i).tolist()) for i in range(len(trace))}) > 1  # the drawn lines differ


def test_sonnet_through_simulate_hits_the_prefix_cache(tmp_path, capsys, word_tokenizer):
    write_poem(tmp_path / "poem.txt")
    rc, out, err = simulate(capsys, "--dataset-name", "sonnet", "--dataset-path", str(tmp_path / "poem.txt"),
                            "--tokenizer", str(word_tokenizer.path), "--sonnet-input-len", "90",
                            "--sonnet-prefix-len", "40", "--sonnet-output-len", "5", "--num-prompts", "20",
                            "--enable-prefix-caching", "--request-rate", "2", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["requests_completed"] == 20 and summary["prefix_hit_rate"] > 0.2


def test_sonnet_refusals_are_one_line(tmp_path, word_tokenizer):
    write_poem(tmp_path / "poem.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="higher than the instruction's length"):
        sonnet_trace(tmp_path / "poem.txt", word_tokenizer, num_prompts=3, input_len=5)
    with pytest.raises(ValueError, match="no lines"):
        sonnet_trace(tmp_path / "empty.txt", word_tokenizer, num_prompts=3)
    # the prefix alone is longer than any prompt may be: vLLM would draw for ever; here the draws stop
    with pytest.raises(ValueError, match=r"0 of \d+ prompts drawn fit in --sonnet-input-len 30"):
        sonnet_trace(tmp_path / "poem.txt", word_tokenizer, num_prompts=3, input_len=30, prefix_len=400)
    outcome = run_pagesim(["simulate", "--dataset-name", "sonnet", "--num-prompts", "2"], cwd=tmp_path, limit_s=60)
    assert outcome.returncode == 2 and "--dataset-name sonnet needs --dataset-path" in error_line(outcome, "simulate")


# ---------------------------------------------------------------- burstgpt
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write_burstgpt(path) -> list[tuple[int, int]]:
    """Rows of both models, one failed GPT-4 row; returns the (request, response) tokens vLLM keeps."""
    rows, kept = [BURSTGPT_HEADER], []
    for k in range(21):
        model = "GPT-4" if k % 3 else "ChatGPT"
        request, response = 50 + 3 * k, (0 if k == 4 else 10 + k)
        rows.append(f"{1000 + 7 * k},{model},{request},{response},{request + response},Conversation log")
        if model == "GPT-4" and response > 0:
            kept.append((request, response))
    path.write_text("\n".join(rows) + "\n")
    return kept


@pytest.mark.parametrize("num_prompts", [5, 30], ids=["sampled", "oversampled"])
def test_burstgpt_samples_vllms_rows(tmp_path, num_prompts):
    kept = write_burstgpt(tmp_path / "b.csv")
    with pytest.warns(Warning, match="dropped 1 failed request"):
        trace = burstgpt_trace(tmp_path / "b.csv", num_prompts=num_prompts, seed=4)
    rows = np.random.RandomState(4).choice(len(kept), size=num_prompts, replace=num_prompts > len(kept))
    assert list(zip(trace.prompt_len.tolist(), trace.output_len.tolist())) == [kept[r] for r in rows]
    assert not trace.has_arrivals  # the file's timestamps are not used
    # prompt i is the ids i, i + 1, ...: no two prompts share their first chunk
    assert len({trace.prefix_ids(i)[0] for i in range(len(trace))}) == len(trace)


def test_burstgpt_rows_are_pandas_sample():
    """pandas 3.1.1's ``DataFrame.sample(n, random_state=seed, replace=n > rows)`` on 17 rows picked
    these (run once with pandas, which pagesim does not need)."""
    assert sample_rows(17, 5, 0).tolist() == [1, 6, 8, 9, 13]
    assert sample_rows(17, 30, 4)[:8].tolist() == [14, 5, 1, 8, 8, 9, 7, 13]  # with replacement


def test_burstgpt_through_simulate_sends_at_the_request_rate(tmp_path, capsys):
    write_burstgpt(tmp_path / "b.csv")
    rc, out, err = simulate(capsys, "--dataset-name", "burstgpt", "--dataset-path", str(tmp_path / "b.csv"),
                            "--num-prompts", "8", "--request-rate", "4", "--json")
    assert rc == 0, err
    assert json.loads(out)["requests_completed"] == 8
    assert "dropped 1 failed request" in err  # vLLM drops them silently; pagesim says so
    outcome = run_pagesim(["simulate", "--dataset-name", "burstgpt", "--dataset-path", "b.csv", "--no-oversample"],
                          cwd=tmp_path, limit_s=60)
    assert "--no-oversample is for --dataset-name" in error_line(outcome, "simulate")


# ---------------------------------------------------------------- the result file
def result_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".json")


def test_label_and_metadata_as_vllm_writes_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = simulate(capsys, *RANDOM, "--max-concurrency", "2", "--save-result", "--label", "mine",
                          "--metadata", "version=0.3.3", " tp = 1", "model_id=renamed", "note=a=b")
    assert rc == 0, err
    (name,) = result_files(tmp_path)
    assert re.fullmatch(r"mine-infqps-concurrency2-llama3-8b-\d{8}-\d{6}\.json", name)
    result = json.loads((tmp_path / name).read_text())
    keys = list(result)
    # vLLM's order: the metadata after num_prompts, before request_rate; a key it names is overwritten in place
    assert keys[:11] == ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                         "version", "tp", "note", "request_rate"]
    assert result["label"] == "mine" and result["version"] == "0.3.3" and result["tp"] == "1"
    assert result["model_id"] == "renamed" and result["note"] == "a=b"


def test_without_label_the_file_says_null_and_the_name_the_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert simulate(capsys, *RANDOM, "--save-result")[0] == 0
    (name,) = result_files(tmp_path)
    assert name.startswith("pagesim-infqps-llama3-8b-")
    assert json.loads((tmp_path / name).read_text())["label"] is None  # vLLM 0.33's, without --label


def test_append_result_adds_a_line(tmp_path, capsys):
    path = tmp_path / "all.json"
    assert simulate(capsys, *RANDOM, "--append-result", "--result-filename", str(path))[0] == 0
    first = path.read_text()
    assert not first.startswith("\n") and "\n" not in first  # a new file: the JSON alone
    assert simulate(capsys, *RANDOM, "--append-result", "--result-filename", str(path), "--label", "two")[0] == 0
    text = path.read_text()
    assert text.startswith(first) and text[len(first)] == "\n" and text.count("\n") == 1  # vLLM's: newline, JSON
    lines = [json.loads(line) for line in text.splitlines()]
    assert [r["label"] for r in lines] == [None, "two"] and load_result(path)["label"] == "two"
    # without --append-result the file is replaced
    assert simulate(capsys, *RANDOM, "--save-result", "--result-filename", str(path))[0] == 0
    assert "\n" not in path.read_text()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_append_result_refuses_a_fifo_with_no_reader_before_any_work(tmp_path):
    """--append-result follows the one rule of engine.outputs: a FIFO nobody reads is refused
    before the run (not waited on, not replaced)."""
    os.mkfifo(tmp_path / "pipe")
    outcome = run_pagesim(["simulate", *RANDOM, "--append-result", "--result-filename", "pipe"], cwd=tmp_path,
                          limit_s=60)
    assert outcome.returncode == 2 and "is a FIFO (named pipe) with no reader" in error_line(outcome, "simulate")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)


@pytest.mark.parametrize("argv, message", [
    (["--metadata", "version", "--save-result"], "--metadata takes KEY=VALUE items"),
    (["--label", "x"], "--label and --metadata go into the result file"),
    (["--num-warmups", "-1"], "--num-warmups must be >= 0"),
    (["--random-output-len", "-1"], "--random-output-len must be >= 0"),
    (["--backend", "vllm-pooling"], "benchmarks a pooling model"),
    (["--backend", "tgi"], "is not one of vllm bench serve's"),
    (["--random-range-ratio", "[" * 20000 + "]" * 20000], "--random-range-ratio: expected a number or a JSON object"),
], ids=["metadata", "label-without-file", "warmups", "output-len", "pooling", "unknown-backend", "deep-range-ratio"])
def test_bench_flag_refusals(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--no-progress", *RANDOM, *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------- ramp-up
def vllm_rates(strategy, start, end, count):
    """vLLM 0.33 ``_get_current_request_rate``, request by request."""
    rates = []
    for i in range(count):
        progress = i / max(count - 1, 1)
        rates.append(start + (end - start) * progress if strategy == "linear" else start * (end / start) ** progress)
    return rates


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_ramp_up_rate_rises_as_asked(strategy):
    ramp = RampUp(strategy, 2, 32)
    rates = vllm_rates(strategy, 2, 32, 200)
    assert ramp.rates_rps(200) == pytest.approx(rates, rel=1e-12)
    # burstiness inf: each gap is 1 / the request's rate, so the rate read off the gaps rises from 2 to 32
    times = ramp.send_times_s(200, burstiness=float("inf"))
    assert np.diff(times) == pytest.approx([1 / r for r in rates[1:]], rel=1e-12)
    assert times[0] == pytest.approx(1 / 2)
    # Poisson gaps (vLLM's np.random.gamma one draw at a time, seeded): the same, and faster at the end
    np.random.seed(5)
    gaps = [np.random.gamma(shape=1.0, scale=1.0 / r) for r in rates]
    poisson = ramp.send_times_s(200, burstiness=1.0, seed=5)
    assert poisson == pytest.approx(np.cumsum(gaps), rel=1e-12)
    assert np.mean(np.diff(poisson[:50])) > 4 * np.mean(np.diff(poisson[-50:]))
    # vLLM's rps_change_events: each whole rate reached, once, in order
    events = ramp.change_events(times)
    assert [e["rps"] for e in events] == list(range(2, 33))
    assert [e["send_time_s"] for e in events] == sorted(e["send_time_s"] for e in events)


def test_ramp_up_in_the_result_file_and_arrivals(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = simulate(capsys, "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "4",
                          "--num-prompts", "60", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1",
                          "--ramp-up-end-rps", "20", "--burstiness", "inf", "--save-result", "--label", "r")
    assert rc == 0, err
    (name,) = result_files(tmp_path)
    assert re.fullmatch(r"r-ramp-up-linear-1qps-20qps-llama3-8b-\d{8}-\d{6}\.json", name)
    result = json.loads((tmp_path / name).read_text())
    keys = list(result)
    assert keys[keys.index("max_concurrency") + 1:keys.index("max_concurrency") + 4] == [
        "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"]
    assert (result["ramp_up_strategy"], result["ramp_up_start_rps"], result["ramp_up_end_rps"]) == ("linear", 1, 20)
    assert result["request_rate"] == "inf"
    sent = np.asarray(result["start_times"])
    assert sent == pytest.approx(np.cumsum([1 / r for r in vllm_rates("linear", 1, 20, 60)]), rel=1e-9)
    assert [e["rps"] for e in result["pagesim"]["rps_change_events"]] == list(range(1, 21))


@pytest.mark.parametrize("argv, message", [
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5", "--request-rate", "3"],
     "leave out --request-rate"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"], "needs both"),
    (["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"], "apply with --ramp-up-strategy"),
    (["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "2"], "must not exceed"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "2"], "must be > 0"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "-1", "--ramp-up-end-rps", "2"], "must be >= 0"),
])
def test_ramp_up_checks(argv, message):
    args = argparse.Namespace(dataset_name="random", rate=None, ramp_up_strategy=None, ramp_up_start_rps=None,
                              ramp_up_end_rps=None)
    parsed = build_parser().parse_args(["simulate", *RANDOM, *argv])
    for key in ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps", "rate"):
        setattr(args, key, getattr(parsed, key))
    with pytest.raises(ValueError, match=message):
        ramp_up_from_args(args)


def test_ramp_up_needs_a_dataset(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "kwon2023-alpaca", "--num-requests", "5", "--ramp-up-strategy", "linear",
              "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"])
    assert "sends a --dataset-name dataset's requests" in capsys.readouterr().err


# ---------------------------------------------------------------- flags that change nothing here
def test_irrelevant_flags_get_one_note(capsys):
    rc, out, err = simulate(capsys, *RANDOM, "--backend", "openai-chat", "--temperature", "0.7", "--num-warmups",
                            "3", "--json")
    assert rc == 0, err
    (note,) = notes(err)
    assert note.startswith("pagesim simulate: note: ignored, irrelevant here: --backend openai-chat")
    assert "--temperature 0.7" in note and "--num-warmups 3" in note
    # and they change no figure
    rc, plain, _ = simulate(capsys, *RANDOM, "--json")
    strip = lambda text: {k: v for k, v in json.loads(text).items() if k != "sim_wall_s"}  # noqa: E731
    assert strip(out) == strip(plain)


def test_run_takes_vllms_backend_with_a_note_and_serves_warmups_apart(tmp_path, capsys):
    path = tmp_path / "run.json"
    assert main(["run", "--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "3",
                 "--num-prompts", "4", "--model", "tiny", "--block-size", "8", "--num-gpu-blocks", "64",
                 "--backend", "openai", "--num-warmups", "2", "--temperature", "0", "--enable-prefix-caching",
                 "--save-result", "--result-filename", str(path), "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    (note,) = notes(captured.err)
    assert "--backend openai" in note and "auto is used" in note
    assert "warming up with 2 request(s)" in captured.err
    summary = json.loads(captured.out)
    result = load_result(path)
    # the warm-ups count nowhere: four requests, each its own, and none hits a warm-up's cached prompt
    assert summary["requests_completed"] == 4 and result["completed"] == 4 and len(result["ttfts"]) == 4
    assert result["pagesim"]["num_warmups"] == 2 and summary["prefix_hit_tokens"] == 0


def test_random_output_len_zero_is_one_token_as_in_vllm(capsys):
    rc, out, err = simulate(capsys, "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "0",
                            "--num-prompts", "5", "--json")
    assert rc == 0, err
    (note,) = notes(err)
    assert "--random-output-len 0 gives output lengths in [1, 1] tokens" in note
    assert json.loads(out)["generated_tokens"] == 5


# ---------------------------------------------------------------- did you mean
def subparser(name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


@pytest.mark.parametrize("flag", ["--backend", "--label", "--temperature", "--num-warmups", "--metadata"])
def test_no_suggestion_for_a_name_that_is_no_typo(flag):
    """The issue's cases: difflib offered --trace for --backend, --rate for --label and
    --temperature, --num-requests for --num-warmups (validate has none of these flags)."""
    message = unknown_flags_message(subparser("validate"), [flag])
    assert "did you mean" not in message, message


@pytest.mark.parametrize("typo, meant", [
    ("--num-promts", "--num-prompts"), ("--rtae", "--rate"), ("--max-concurency", "--max-concurrency"),
    ("--dataset_name", "--dataset-name"), ("--tokenzier", "--tokenizer"), ("--request_rate", "--request-rate"),
])
def test_typos_get_the_flag_meant(typo, meant):
    assert f"({'did you mean ' + meant}?)" in unknown_flags_message(subparser("simulate"), [typo])


@pytest.mark.parametrize("flag", ["--top-k", "--ready-check-timeout-sec", "--lora-modules", "--random-mm-bucket-config",
                                  "--spec-bench-category", "--base-url"])
def test_vllm_flags_pagesim_does_not_use_are_named_as_such(flag):
    message = unknown_flags_message(subparser("simulate"), [flag, "1"])
    assert f"{flag} (a vllm bench serve flag pagesim does not use: " in message and "did you mean" not in message


def test_typo_distance():
    assert typo_distance("rate", "rtae") == 1  # one swap
    assert typo_distance("backend", "trace") > 2 and typo_distance("label", "rate") > 2
    assert typo_distance("num-warmups", "num-requests") > 2
    assert nearest_flag("--x", ["--n"]) is None  # too short to guess


# ---------------------------------------------------------------- max_concurrent_requests
def test_max_concurrent_requests_is_vllms_per_second_count():
    """A closed loop of 2 by hand: pairs sent at 0, 0.6, 1.2 and 1.8 s, each taking 0.6 s. Never
    more than 2 in flight; vLLM 0.33 counts a request in every whole second it touches, so second 0
    holds the pairs sent at 0 and 0.6 (4), second 1 those sent at 0.6, 1.2 and 1.8 (6)."""
    start = [0.0, 0.0, 0.6, 0.6, 1.2, 1.2, 1.8, 1.8]
    per = PerRequest(input_lens=[10] * 8, output_lens=[3] * 8, success=[True] * 8, start_times=start,
                     ttfts=[0.2] * 8, latencies=[0.6] * 8, itls=[[0.2, 0.2]] * 8)
    result = bench_result(per, duration_s=2.4, pagesim={})
    assert result["max_concurrent_requests"] == 6
    assert result["max_concurrent_requests"] == vllm_per_second(start, [0.2] * 8, [0.6] * 8, [[0.2, 0.2]] * 8)[1]
    assert result["pagesim"]["max_concurrent_requests_exact"] == 2
