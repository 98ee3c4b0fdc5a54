"""``pagesim.traces.inference_perf``: inference-perf output folders read back as a ``Trace`` and figures.

Small runs written here check the trace against hand-computed expectations: row counts
(``int(rate * duration)`` per stage), a constant stage's sends (its count, its last at the
stage's end, the next stage ``interval + 1`` s later), shared-prefix identities (a group's system
blocks shared, each prompt's own blocks repeated when the prompt recurs, the cycle restarting each
stage), random lengths taken by index within the stage, Poisson stages, timeouts and measured
figures. Every bad input is one ``InferencePerfError`` naming its file and key. The shared ground
truth's runs (``../shared/groundtruth``; skipped when absent) give ``rate x duration`` rows and
figures equal to their JSON files'.
"""

from __future__ import annotations

import copy
import json
import math
import os
import threading

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SHARED, scaled_examples
from pagesim.traces.inference_perf import (
    InferencePerfError,
    LatencyStats,
    LoadStage,
    MeasuredStage,
    ServerSettings,
    read_inference_perf,
)

GROUNDTRUTH = SHARED / "groundtruth"  # ../shared/groundtruth from the repository root

# A config.yaml as inference-perf wrote the ground truth's (every field, nulls included).
BASE = {
    "api": {"type": "completion", "streaming": True, "headers": None},
    "data": {
        "type": "shared_prefix", "path": None, "input_distribution": None, "output_distribution": None,
        "shared_prefix": {"num_groups": 3, "num_prompts_per_group": 4, "system_prompt_len": 40,
                          "question_len": 20, "output_len": 7},
    },
    "load": {"type": "constant", "interval": 1.0,
             "stages": [{"rate": 2.0, "duration": 10}, {"rate": 5.0, "duration": 4}],
             "sweep": None, "num_workers": 4, "worker_max_concurrency": 100, "worker_max_tcp_connections": 2500,
             "circuit_breakers": [], "request_timeout": None},
    "storage": {"local_storage": {"path": "/tmp/x/results", "report_file_prefix": None}},
    "server": {"type": "vllm", "model_name": "org/model", "base_url": "http://h:8000", "ignore_eos": True,
               "api_key": None},
    "tokenizer": {"pretrained_model_name_or_path": "org/model", "trust_remote_code": None, "token": None},
}
NORMAL = {"min": 5, "max": 60, "mean": 30.0, "std_dev": 10.0, "total_count": None}


def config(**changes) -> dict:
    """``BASE`` with ``changes``: ``{"load.interval": 2.0}``-style dotted keys; ``DROP`` removes one."""
    document = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = document
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is DROP:
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return document


DROP = object()


def write_run(folder, document: dict | str, *, metrics: dict | None = None, exp: dict | str | None = None):
    """An experiment folder: ``results/config.yaml`` (+ metrics files), and ``exp-config.yaml``."""
    results = folder / "results"
    results.mkdir(parents=True, exist_ok=True)
    text = document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False)
    (results / "config.yaml").write_text(text)
    for name, content in (metrics or {}).items():
        (results / name).write_text(content if isinstance(content, str) else json.dumps(content))
    if exp is not None:
        (folder / "exp-config.yaml").write_text(exp if isinstance(exp, str) else yaml.safe_dump(exp))
    return folder


def read(tmp_path, document=None, **kwargs):
    return read_inference_perf(write_run(tmp_path, BASE if document is None else document, **kwargs))


def stats(mean, median=None, p90=None, p99=None) -> dict:
    return {"mean": mean, "median": median or mean, "p90": p90 or mean, "p99": p99 or mean, "min": 0.0}


def metrics_file(ok=10, failed=0, e2e=2.0, ttft=0.05, rate=2.0) -> dict:
    return {
        "load_summary": {"count": ok + failed, "requested_rate": rate, "achieved_rate": rate and rate * 0.99},
        "successes": {"count": ok,
                      "latency": {"request_latency": stats(e2e, 1.9, 2.5, 3.0),
                                  "time_to_first_token": stats(ttft, 0.04, 0.07, 0.09),
                                  "time_per_output_token": stats(0.001)},
                      "prompt_len": stats(61.5), "output_len": stats(6.5)},
        "failures": {"count": failed, "request_latency": None, "prompt_len": None},
    }


# ------------------------------------------------------------------ stages and send times
def test_two_constant_stages_send_rate_times_duration_each_and_follow_after_interval_and_lead(tmp_path):
    run = read(tmp_path)
    assert run.stages == (LoadStage(2.0, 10.0, 0.0), LoadStage(5.0, 4.0, 12.0))  # 0 + 10 + 1 s interval + 1 s lead
    trace = run.trace(seed=1)
    assert len(trace) == 20 + 20
    assert run.stage_of_rows(trace).tolist() == [0] * 20 + [1] * 20
    first, second = trace.arrival_s[:20], trace.arrival_s[20:]
    # ConstantLoadTimer: the count exactly, the first one gap after the origin, the last at the end
    assert 0 < first[0] and first[-1] == 10.0 and np.all(np.diff(first) >= 0)
    assert 12.0 < second[0] and second[-1] == 16.0
    assert trace.metadata["stage_start_s"] == [0.0, 12.0]
    assert trace.metadata["stage_num_requests"] == [20, 20]


def test_constant_gaps_are_exponential_scaled_to_the_duration_not_evenly_spaced(tmp_path):
    run = read(tmp_path, config(**{"load.stages": [{"rate": 50.0, "duration": 100}]}))
    gaps = np.diff(np.r_[0.0, run.trace(seed=2).arrival_s])
    assert len(gaps) == 5000 and math.isclose(gaps.sum(), 100.0)
    cv = gaps.std() / gaps.mean()  # 1 for exponential gaps, 0 for a metronome
    assert 0.9 < cv < 1.1


def test_interval_zero_and_the_stage_count_truncates_as_inference_perf_does(tmp_path):
    run = read(tmp_path, config(**{"load.interval": 0, "load.stages": [{"rate": 0.29, "duration": 100},
                                                                         {"rate": 3.0, "duration": 2}]}))
    assert [s.num_requests for s in run.stages] == [int(0.29 * 100), 6]  # 28: the float product truncated
    assert run.stages[1].start_s == 101.0


def test_poisson_stages_send_their_count_and_the_next_starts_after_the_last_send(tmp_path):
    run = read(tmp_path, config(**{"load.type": "poisson", "load.interval": 2.5,
                                   "load.stages": [{"rate": 20.0, "duration": 50}, {"rate": 4.0, "duration": 10}]}))
    trace = run.trace(seed=5)
    assert len(trace) == 1000 + 40
    first, second = trace.arrival_s[:1000], trace.arrival_s[1000:]
    origin = trace.metadata["stage_start_s"][1]
    assert origin == first[-1] + 2.5 + 1.0 and second[0] > origin
    assert 1000 / first[-1] == pytest.approx(20.0, rel=0.15)
    # each second's sends are spread over it, and every second that ends whole ends with a send
    full_seconds = np.floor(first[first < math.floor(first[-1])] - 1e-9)
    assert set(np.unique(full_seconds) + 1.0) <= set(first)
    assert np.array_equal(run.trace(seed=5).arrival_s, trace.arrival_s)
    assert not np.array_equal(run.trace(seed=6).arrival_s, trace.arrival_s)


# ------------------------------------------------------------------ shared prefix
def test_shared_prefix_prompts_cycle_in_one_order_restarting_each_stage(tmp_path):
    run = read(tmp_path)  # 3 groups x 4 prompts: 40 system + 20 question tokens -> 7
    assert run.workload == "shared_prefix: 3 groups x 4 prompts, 40 + 20 -> 7 tokens"
    trace = run.trace(seed=0, prefix_block_tokens=16)
    assert set(trace.prompt_len) == {60} and set(trace.output_len) == {7}
    ids = [tuple(trace.prefix_ids(i)) for i in range(len(trace))]
    assert all(len(row) == 4 for row in ids)  # ceil(60 / 16)
    assert len(set(ids[:12])) == 12  # each of the 12 prompts once per cycle
    assert ids[12:20] == ids[:8]  # the cycle goes on ...
    assert ids[20:32] == ids[:12]  # ... and stage 1 starts it again
    # blocks 0-1 (tokens 0-31) lie in the system prompt: shared by a group; block 2 (32-47)
    # straddles into the question and block 3 is the question's: the prompt's own
    systems = {row[:2] for row in ids}
    assert len(systems) == 3
    for system in systems:
        members = {row for row in ids if row[:2] == system}
        assert len(members) == 4 and len({row[2] for row in members}) == 4
    own = [set(row[2:]) for row in set(ids)]
    assert all(a.isdisjoint(b) for k, a in enumerate(own) for b in own[k + 1:])
    assert set().union(*own).isdisjoint(set().union(*systems))


@settings(max_examples=scaled_examples(25))
@given(groups=st.integers(1, 5), per_group=st.integers(1, 5), system=st.integers(0, 70),
       question=st.integers(1, 40), output=st.integers(1, 9), block=st.sampled_from([1, 4, 16, 32]),
       rate=st.sampled_from([1.0, 3.0, 7.5]), duration=st.integers(1, 12), seed=st.integers(0, 2**32))
def test_shared_prefix_identities_hold_for_any_shape(tmp_path_factory, groups, per_group, system, question,
                                                       output, block, rate, duration, seed):
    document = config(**{"data.shared_prefix": {"num_groups": groups, "num_prompts_per_group": per_group,
                                                "system_prompt_len": system, "question_len": question,
                                                "output_len": output},
                         "load.stages": [{"rate": rate, "duration": duration}]})
    run = read_inference_perf(write_run(tmp_path_factory.mktemp("run"), document))
    trace = run.trace(seed=seed, prefix_block_tokens=block)
    count = int(rate * duration)
    prompts = groups * per_group
    assert len(trace) == count and set(trace.output_len) == {output} and set(trace.prompt_len) == {system + question}
    ids = [tuple(trace.prefix_ids(i)) for i in range(count)]
    assert all(len(row) == -(-(system + question) // block) for row in ids)
    assert all(ids[i] == ids[i + prompts] for i in range(count - prompts))  # a prompt recurs whole
    assert len(set(ids)) == min(prompts, count)
    shared = system // block  # blocks wholly inside the system prompt
    if count >= prompts:
        assert len({row[:shared] for row in ids}) == (groups if shared else 1)
    owners: dict[int, set] = {}  # identity -> the prompts (or groups) holding it
    for row in set(ids):
        for position, identity in enumerate(row):
            owners.setdefault(identity, set()).add(row[:shared] if position < shared else row)
    assert all(len(holders) == 1 for holders in owners.values())


def test_shared_prefix_current_field_names_and_distributions(tmp_path):
    run = read(tmp_path, config(**{"data.shared_prefix": {
        "num_unique_system_prompts": 2, "num_users_per_system_prompt": 3, "system_prompt_len": 32,
        "question_len": {"min": 10, "max": 30, "mean": 20, "std_dev": 8, "type": "normal"},
        "output_len": 5, "output_distribution": {"type": "fixed", "mean": 9.7, "min": 1, "max": 1},
        "seed": 7, "enable_multi_turn_chat": False, "multimodal": None}}))
    assert run.workload == "shared_prefix: 2 groups x 3 prompts, 32 + normal(mean 20, sd 8, 10..30) -> 9 tokens"
    trace = run.trace(seed=3)
    assert set(trace.output_len) == {9}  # the legacy distribution replaces output_len; fixed: int(mean)
    assert np.all((trace.prompt_len >= 42) & (trace.prompt_len <= 62))
    assert len({(tuple(trace.prefix_ids(i)), trace.prompt_len[i]) for i in range(len(trace))}) <= 6


# ------------------------------------------------------------------ random and synthetic
def random_config(kind="random", **changes):
    return config(**{"data.type": kind, "data.shared_prefix": None, "data.input_distribution": dict(NORMAL),
                     "data.output_distribution": {"min": 2, "max": 9, "mean": 4, "std_dev": 3, "total_count": None},
                     **changes})


def test_random_lengths_come_from_one_draw_indexed_by_request_number_within_the_stage(tmp_path):
    run = read(tmp_path, random_config())
    assert run.workload == "random: normal(mean 30, sd 10, 5..60) -> normal(mean 4, sd 3, 2..9) tokens"
    trace = run.trace(seed=4)
    assert len(trace) == 40 and not trace.has_prefix_ids
    assert np.all((trace.prompt_len >= 5) & (trace.prompt_len <= 60))
    assert np.all((trace.output_len >= 2) & (trace.output_len <= 9))
    # request n of stage 1 takes entry n, as request n of stage 0 did
    assert np.array_equal(trace.prompt_len[20:40], trace.prompt_len[:20])
    assert np.array_equal(trace.output_len[20:40], trace.output_len[:20])
    assert len(set(trace.prompt_len[:20])) > 3


def test_synthetic_prompts_before_2026_are_starts_of_one_text(tmp_path):
    run = read(tmp_path, random_config("synthetic"))
    trace = run.trace(seed=0, prefix_block_tokens=8)
    assert run.workload.startswith("synthetic (prompts are the starts of one text)")
    for i in range(len(trace)):
        assert trace.prefix_ids(i).tolist() == list(range(-(-int(trace.prompt_len[i]) // 8)))


def test_synthetic_prompts_of_2026_start_at_random_offsets(tmp_path):
    trace = read(tmp_path, random_config("synthetic", **{"data.corpus_file_path": None})).trace()
    assert not trace.has_prefix_ids and len(trace) == 40


# ------------------------------------------------------------------ settings and measured figures
def test_timeout_model_server_and_measured_figures(tmp_path):
    folder = write_run(tmp_path, config(**{"load.request_timeout": 30, "server.model_name": None}),
                       metrics={"stage_0_lifecycle_metrics.json": metrics_file(ok=19, failed=1),
                                "summary_lifecycle_metrics.json": metrics_file(ok=39, failed=1, rate=None)},
                       exp={"model": "org/model", "tensor_parallelism": 2, "max_model_len": 4096,
                            "max_num_batched_tokens": 2048, "max_num_seqs": 128, "app": "inference-perf"})
    run = read_inference_perf(folder / "results")  # from the results folder: ../exp-config.yaml
    assert run.request_timeout_s == 30.0 and run.client_timeout_s == 30.0
    assert run.model_name == "org/model"  # the tokenizer's, with server.model_name null
    assert run.ignore_eos and run.streaming
    assert run.server == ServerSettings("org/model", 2, 4096, 2048, 128)
    assert run.measured_stages == {0: MeasuredStage(
        successes=19, failures=1, e2e=LatencyStats(2.0, 1.9, 2.5, 3.0), ttft=LatencyStats(0.05, 0.04, 0.07, 0.09),
        mean_output_len=6.5, mean_prompt_len=61.5, requested_rate=2.0, achieved_rate=1.98)}
    assert run.measured_summary.successes == 39 and run.measured_summary.requested_rate is None
    assert "stage 0: 2/s x 10 s = 20 requests (constant), from 0 s; measured 19 ok, 1 failed" in run.describe()
    assert str(run) == run.describe()
    assert read_inference_perf(folder / "results" / "config.yaml").stages == run.stages


def test_a_null_timeout_is_aiohttps_300_s_and_absent_files_are_none(tmp_path):
    run = read(tmp_path)
    assert run.request_timeout_s is None and run.client_timeout_s == 300.0
    assert run.server == ServerSettings() and run.measured_stages == {} and run.measured_summary is None


def test_figures_without_streaming_have_no_ttft(tmp_path):
    figures = metrics_file()
    del figures["successes"]["latency"]["time_to_first_token"]
    figures["successes"]["output_len"] = None
    run = read(tmp_path, metrics={"stage_1_lifecycle_metrics.json": figures})
    assert run.measured_stages[1].ttft is None and run.measured_stages[1].mean_output_len is None


def test_a_report_file_prefix_names_the_metrics_files(tmp_path):
    run = read(tmp_path, config(**{"storage.local_storage.report_file_prefix": "run1-"}),
               metrics={"run1-stage_0_lifecycle_metrics.json": metrics_file(ok=3),
                        "stage_0_lifecycle_metrics.json": "not read"})
    assert run.measured_stages[0].successes == 3


# ------------------------------------------------------------------ bad inputs
SP = "data.shared_prefix"
BAD_CONFIGS = [
    ({"data.type": "foo"}, "data.type 'foo' is not supported (supported: shared_prefix, random, synthetic)"),
    ({"data.type": "shareGPT"}, "data.type 'shareGPT' is not supported"),
    ({"data.type": "mock"}, "data.type 'mock'"),
    ({"data.type": 3}, "data.type must be text"),
    ({"data": DROP}, "data is missing"),
    ({SP: None}, "data.shared_prefix is null"),
    ({"load": DROP}, "load is missing"),
    ({"load.type": "concurrent"}, "load.type 'concurrent' is not supported (supported: constant, poisson)"),
    ({"load.type": "trace_replay"}, "load.type 'trace_replay'"),
    ({"load.stages": DROP}, "load.stages is missing"),
    ({"load.stages": []}, "load.stages is empty"),
    ({"load.stages": "fast"}, "load.stages must be a list"),
    ({"load.stages.1": 5}, "load.stages[1] must be a mapping"),
    ({"load.stages.1.rate": "x"}, "load.stages[1].rate must be a number, found a string"),
    ({"load.stages.1.rate": 0}, "load.stages[1].rate must be > 0"),
    ({"load.stages.1.rate": -2.0}, "load.stages[1].rate must be > 0, found a negative number"),
    ({"load.stages.1.rate": float("nan")}, "load.stages[1].rate must be a number, found NaN"),
    ({"load.stages.1.rate": float("inf")}, "load.stages[1].rate must be a finite number"),
    ({"load.stages.1.rate": True}, "load.stages[1].rate must be a number, found a boolean"),
    ({"load.stages.1.rate": DROP}, "load.stages[1].rate is missing"),
    ({"load.stages.0.duration": 0}, "load.stages[0].duration must be > 0"),
    ({"load.stages.0.duration": 2.5}, "load.stages[0].duration must be a whole number"),
    ({"load.stages.0.duration": None}, "load.stages[0].duration is null"),
    ({"load.stages.0.rate": 0.05}, "load.stages[0] sends no request"),
    ({"load.stages.0.num_requests": 5}, "load.stages[0].num_requests is set"),
    ({"load.interval": -1}, "load.interval must be >= 0"),
    ({"load.request_timeout": 0}, "load.request_timeout must be > 0"),
    ({"load.sweep": {"type": "linear"}}, "load.sweep is set, which is not supported"),
    ({"load.num_workers": 0}, "load.num_workers is 0"),
    ({"load.lora_traffic_split": [{"name": "a", "split": 1.0}]}, "load.lora_traffic_split is set"),
    ({"server.ignore_eos": "yes"}, "server.ignore_eos must be true or false"),
    ({"api.type": "grpc"}, "api.type 'grpc' is not supported"),
    ({"storage.local_storage.report_file_prefix": "../x"}, "report_file_prefix must be a plain file-name prefix"),
    ({f"{SP}.num_groups": DROP}, "data.shared_prefix.num_groups is missing"),
    ({f"{SP}.num_prompts_per_group": DROP}, "data.shared_prefix.num_prompts_per_group is missing"),
    ({f"{SP}.system_prompt_len": DROP}, "data.shared_prefix.system_prompt_len is missing"),
    ({f"{SP}.question_len": DROP}, "data.shared_prefix.question_len is missing"),
    ({f"{SP}.output_len": DROP}, "data.shared_prefix.output_len is missing"),
    ({f"{SP}.question_len": "abc"}, "data.shared_prefix.question_len must be a number, found a string"),
    ({f"{SP}.output_len": 0}, "data.shared_prefix.output_len must be >= 1"),
    ({f"{SP}.num_groups": 2.5}, "data.shared_prefix.num_groups must be a whole number"),
    ({f"{SP}.num_unique_system_prompts": 3}, "data.shared_prefix gives both num_groups and num_unique_system_prompts"),
    ({f"{SP}.system_prompt_len": {"min": 1, "max": 9, "mean": 5, "std_dev": 1}},
     "data.shared_prefix.system_prompt_len is a distribution, which is not supported"),
    ({f"{SP}.question_len": {"min": 1, "max": 9, "mean": 5, "std_dev": 1, "type": "lognormal"}},
     "data.shared_prefix.question_len.type 'lognormal' is not supported (supported: normal, fixed)"),
    ({f"{SP}.question_len": {"min": 1, "max": 9, "mean": 50, "std_dev": 1}},
     "data.shared_prefix.question_len.mean must lie between"),
    ({f"{SP}.enable_multi_turn_chat": True}, "data.shared_prefix.enable_multi_turn_chat is set"),
    ({"data.multimodal": {"image": {}}}, "data.multimodal is set"),
]
BAD_RANDOM = [
    ({"data.input_distribution": None}, "data.input_distribution is null"),
    ({"data.output_distribution.min": 0}, "data.output_distribution.min must be >= 1"),
    ({"data.input_distribution.min": 70}, "data.input_distribution.min (70) must not exceed"),
    ({"data.input_distribution.std_dev": DROP}, "data.input_distribution.std_dev is missing"),
    ({"data.input_distribution.total_count": 10}, "data.input_distribution.total_count (10) is smaller"),
    ({"data.input_distribution.variance": 4.0}, "data.input_distribution gives both std_dev and variance"),
    ({"data.trace": {"file": "x.csv"}}, "data.trace is set"),
    ({"data.use_chat_template": True}, "data.use_chat_template is set"),
]
BAD_SYNTHETIC = [
    ({"data.corpus_file_path": "/data/book.txt"}, "data.corpus_file_path is set"),
    ({"data.input_distribution.max": 5000}, "data.input_distribution reaches 5,000 tokens"),
]


def _refused(tmp_path, document, words):
    with pytest.raises(InferencePerfError) as caught:
        read(tmp_path, document)
    message = str(caught.value)
    assert "config.yaml: " in message and words in message and "\n" not in message
    return message


@pytest.mark.parametrize(("changes", "words"), BAD_CONFIGS, ids=[w[:40] for _, w in BAD_CONFIGS])
def test_bad_configs_are_refused_naming_the_key(tmp_path, changes, words):
    _refused(tmp_path, config(**changes), words)


@pytest.mark.parametrize(("changes", "words"), BAD_RANDOM, ids=[w[:40] for _, w in BAD_RANDOM])
def test_bad_random_configs_are_refused_naming_the_key(tmp_path, changes, words):
    _refused(tmp_path, random_config(**changes), words)


@pytest.mark.parametrize(("changes", "words"), BAD_SYNTHETIC, ids=[w[:40] for _, w in BAD_SYNTHETIC])
def test_bad_synthetic_configs_are_refused_naming_the_key(tmp_path, changes, words):
    _refused(tmp_path, random_config("synthetic", **changes), words)


def test_a_string_that_is_no_name_is_described_not_quoted(tmp_path):
    message = _refused(tmp_path, config(**{"data.type": "a b\x1b[31m"}), "data.type (text that is no such name)")
    assert "\x1b" not in message


@pytest.mark.parametrize(("changes", "words"), [
    ({"server.ignore_eos": False}, "server.ignore_eos is false"),
    ({"api.type": "chat"}, "api.type 'chat' is not supported for a trace"),
])
def test_runs_whose_lengths_are_not_fixed_are_read_but_give_no_trace(tmp_path, changes, words):
    run = read(tmp_path, config(**changes))
    with pytest.raises(InferencePerfError, match=words):
        run.trace()


def test_bad_arguments_to_trace_and_stage_of_rows(tmp_path):
    run = read(tmp_path)
    for block in (0, -16, 2.5, True):
        with pytest.raises(ValueError, match="prefix_block_tokens"):
            run.trace(prefix_block_tokens=block)
    with pytest.raises(ValueError, match="the trace has 39 rows, but this run's stages send 40"):
        run.stage_of_rows(run.trace().head(39))


def test_folders_without_a_run_name_what_was_looked_for(tmp_path):
    with pytest.raises(InferencePerfError, match="no such file or folder"):
        read_inference_perf(tmp_path / "missing")
    with pytest.raises(InferencePerfError) as caught:
        read_inference_perf(tmp_path)
    assert str(tmp_path / "config.yaml") in str(caught.value)
    assert str(tmp_path / "results" / "config.yaml") in str(caught.value)


@pytest.mark.parametrize(("text", "words"), [
    ("load: [1, 2\ndata: {", "config.yaml: not valid YAML (line"),
    ("- 1\n- 2\n", "config.yaml: must hold a mapping"),
    ("", "config.yaml: must hold a mapping"),
    ("load: " + "[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
    ("".join(" " * k + "k:\n" for k in range(1000)), "nested more than 64 levels"),
    ("".join(" " * k + "k:\n" for k in range(66)), "nested more than 64 levels"),  # (within Python's stack)
    ("load: " + "9" * 10_000, "a number with too many digits"),
    ("load: {stages: [{rate: 1e3, duration: .inf}]}", "load.stages[0].duration must be a finite number"),
])
def test_malformed_yaml_is_one_line(tmp_path, text, words):
    with pytest.raises(InferencePerfError) as caught:
        read(tmp_path, text)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_fifo_or_a_huge_config_is_refused_without_reading_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    os.mkfifo(results / "config.yaml")
    done = []
    worker = threading.Thread(target=lambda: done.append(pytest.raises(InferencePerfError, read_inference_perf,
                                                                       tmp_path)), daemon=True)
    worker.start()
    worker.join(10)
    assert done and "FIFO" in str(done[0].value)
    (results / "config.yaml").unlink()
    (results / "config.yaml").write_bytes(b"#" * (4 * 2**20 + 1))
    with pytest.raises(InferencePerfError, match="larger than the 4 MiB"):
        read_inference_perf(tmp_path)


@pytest.mark.parametrize(("name", "content", "words"), [
    ("stage_0_lifecycle_metrics.json", "{\"successes\": ", "stage_0_lifecycle_metrics.json:1: not JSON"),
    ("stage_0_lifecycle_metrics.json", "[]", "must hold a JSON object"),
    ("stage_0_lifecycle_metrics.json", {"failures": {"count": 0}}, "successes is missing"),
    ("stage_1_lifecycle_metrics.json", "nan", "successes.latency.request_latency.p99 must be a number, found NaN"),
    ("summary_lifecycle_metrics.json", "negative", "failures.count must be >= 0"),
    ("stage_2_lifecycle_metrics.json", {}, "stage_2_lifecycle_metrics.json: is stage 2's, but config.yaml has 2"),
    ("stage_0_lifecycle_metrics.json", "[" * 100_000, "JSON nested more than 64 levels"),
])
def test_bad_metrics_files_are_refused_naming_the_file_and_key(tmp_path, name, content, words):
    if content == "nan":
        content = json.dumps(metrics_file()).replace('"p99": 3.0', '"p99": NaN')
    elif content == "negative":
        content = metrics_file()
        content["failures"]["count"] = -1
    with pytest.raises(InferencePerfError) as caught:
        read(tmp_path, metrics={name: content})
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_exp_config_is_refused_naming_its_key(tmp_path):
    with pytest.raises(InferencePerfError, match="exp-config.yaml: tensor_parallelism must be a number, found a string"):
        read(tmp_path, exp={"model": "m", "tensor_parallelism": "two"})


# ------------------------------------------------------------------ the shared ground truth
EXPERIMENTS = sorted(p.parent.parent for p in GROUNDTRUTH.glob("*/*/results/config.yaml"))
needs_groundtruth = pytest.mark.skipif(not EXPERIMENTS, reason=f"no ground truth at {GROUNDTRUTH}")


def _json(path):
    return json.loads(path.read_text())


def _expected(figures: dict) -> MeasuredStage:
    """A lifecycle metrics file's figures, picked out by hand."""
    ok, latency = figures["successes"], figures["successes"].get("latency") or {}

    def stats_of(name):
        entry = latency.get(name)
        return None if entry is None else LatencyStats(entry["mean"], entry["median"], entry["p90"], entry["p99"])

    def mean_of(entry):
        return None if entry is None else entry["mean"]

    return MeasuredStage(ok["count"], figures["failures"]["count"], stats_of("request_latency"),
                         stats_of("time_to_first_token"), mean_of(ok.get("output_len")), mean_of(ok.get("prompt_len")),
                         figures["load_summary"].get("requested_rate"), figures["load_summary"].get("achieved_rate"))


@needs_groundtruth
@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=[p.name for p in EXPERIMENTS])
def test_every_groundtruth_run_gives_rate_times_duration_rows_and_its_own_figures(experiment):
    run = read_inference_perf(experiment)
    document = yaml.safe_load((experiment / "results" / "config.yaml").read_text())
    stages = document["load"]["stages"]
    assert [(s.rate_per_s, s.duration_s) for s in run.stages] == [(s["rate"], s["duration"]) for s in stages]
    trace = run.trace(seed=0)
    assert len(trace) == sum(int(s["rate"] * s["duration"]) for s in stages)
    assert np.bincount(run.stage_of_rows(trace)).tolist() == [int(s["rate"] * s["duration"]) for s in stages]
    shared = document["data"]["shared_prefix"]
    assert set(trace.prompt_len) == {shared["system_prompt_len"] + shared["question_len"]}
    assert set(trace.output_len) == {shared["output_len"]}
    assert len({tuple(trace.prefix_ids(i)) for i in range(len(trace))}) == 100
    results = experiment / "results"
    assert run.measured_stages == {k: _expected(_json(results / f"stage_{k}_lifecycle_metrics.json"))
                                   for k in range(len(stages))}
    assert run.measured_summary == _expected(_json(results / "summary_lifecycle_metrics.json"))
    assert run.server.max_num_seqs == 128 and run.server.max_num_batched_tokens == 2048
    assert run.client_timeout_s == 300.0
    assert read_inference_perf(results).measured_stages == run.measured_stages


@needs_groundtruth
def test_the_llama_general_run_matches_the_shared_readme():
    (experiment,) = [p for p in EXPERIMENTS if p.name.endswith("llama-2-7b-tp1-general")]
    run = read_inference_perf(experiment)
    assert run.num_requests == 4_800 + 12_000 and run.model_name == "meta-llama/Llama-2-7b-hf"
    assert run.workload == "shared_prefix: 10 groups x 10 prompts, 100 + 447 -> 248 tokens"
    zero, one = run.measured_stages[0], run.measured_stages[1]
    assert (round(zero.e2e.mean, 2), round(zero.ttft.mean, 4), round(zero.ttft.p99, 3)) == (2.06, 0.0271, 0.037)
    assert (round(one.e2e.mean, 2), round(one.ttft.mean, 4), round(one.ttft.p99, 3)) == (4.16, 0.0519, 0.072)
    per_token_ms = (one.e2e.mean - one.ttft.mean) / (248 - 1) * 1e3
    assert round(per_token_ms, 2) == 16.62
    assert run.server == ServerSettings("meta-llama/Llama-2-7b-hf", 1, 4096, 2048, 128)


@needs_groundtruth
def test_the_llama_reasoning_run_counts_its_timeouts_as_failures():
    (experiment,) = [p for p in EXPERIMENTS if p.name.endswith("llama-2-7b-tp1-reasoning")]
    measured = read_inference_perf(experiment).measured_stages[0]
    assert (measured.successes, measured.failures) == (732, 4_068)


def test_inference_perf_07_prompt_tokens_read_as_the_prompt_length(tmp_path):
    """inference-perf 0.7 writes ``successes.prompt_tokens`` (with ``total``, ``cached`` ...) where
    earlier versions wrote ``prompt_len``: the mean is read from either."""
    newer = metrics_file()
    newer["successes"]["prompt_tokens"] = {**stats(545.4), "total": 54540, "cached": 0}
    del newer["successes"]["prompt_len"]
    run = read(tmp_path, metrics={"stage_0_lifecycle_metrics.json": newer})
    assert run.measured_stages[0].mean_prompt_len == 545.4
