"""The column-wise ``Trace``: invariants, slicing, rescaling, conversion to requests, and the
``pagesim trace gen`` / ``list`` commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.cli import main
from engine.policy.request import Request
from traces.errors import TraceFormatError
from traces.generate import generate, workload_spec
from traces.loaders import load_trace
from traces.loaders.pagesim_jsonl import same_columns
from traces.trace import Trace


def _trace(**overrides):
    columns = dict(
        arrival_s=[0.0, 1.0, 2.5, 4.0],
        prompt_len=[10, 20, 33, 5],
        output_len=[1, 2, 3, 4],
        prefix_id_values=[1, 1, 2, 1, 2, 3, 9],
        prefix_id_offsets=[0, 1, 3, 6, 7],
        prefix_block_tokens=16,
    )
    columns.update(overrides)
    return Trace(**columns)


@pytest.mark.parametrize(
    "overrides, problem, row",
    [
        (dict(arrival_s=[0.0, 2.0, 1.0, 4.0]), "sorted", 2),
        (dict(arrival_s=[0.0, np.nan, 2.0, 4.0]), "finite", 1),
        (dict(prompt_len=[10, 0, 33, 5]), "prompt length", 1),
        (dict(output_len=[1, 2, 0, 4]), "output length", 2),
        (dict(n=[1, 2, 1, 1], beam_width=[1, 2, 1, 1]), "not both", 1),
        (dict(prefix_id_offsets=[0, 1, 2, 6, 7]), "ceil", 1),
    ],
)
def test_invariants_name_the_row(overrides, problem, row):
    with pytest.raises(TraceFormatError, match=problem) as caught:
        _trace(**overrides)
    assert caught.value.row == row


def test_columns_must_have_one_length():
    with pytest.raises(TraceFormatError, match="prompt_len has shape"):
        _trace(prompt_len=[1, 2, 3])


def test_take_keeps_each_rows_identities():
    trace = _trace()
    kept = trace.take(np.array([False, True, False, True]))
    assert kept.prompt_len.tolist() == [20, 5]
    assert kept.prefix_ids(0).tolist() == [1, 2] and kept.prefix_ids(1).tolist() == [9]
    assert trace.head(2).arrival_s.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="increasing"):
        trace.take(np.array([2, 1]))


def test_time_window_and_rate():
    trace = _trace()
    window = trace.between(1.0, 3.0)
    assert window.arrival_s.tolist() == [0.0, 1.5]
    assert trace.between(1.0, 3.0, rebase=False).arrival_s.tolist() == [1.0, 2.5]
    assert trace.rate_rps == pytest.approx(4 / 4.0)
    faster = trace.at_rate(2.0)
    assert faster.rate_rps == pytest.approx(2.0) and faster.arrival_s[-1] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="> 0"):
        trace.at_rate(0)
    no_arrivals = Trace(arrival_s=[0.0, 0.0], prompt_len=[1, 2], output_len=[1, 1], has_arrivals=False)
    with pytest.raises(ValueError, match="no arrival span"):
        no_arrivals.at_rate(3)


def test_requests_are_built_lazily_and_faithfully():
    trace = _trace(n=[1, 3, 1, 1], priority=[0, 0, 2, 0])
    requests = trace.requests()
    first = next(requests)
    assert isinstance(first, Request) and first.request_id == "r0" and first.prompt_len == 10
    second = next(requests)
    assert (second.n, second.max_tokens, second.arrival_time_s) == (3, 2, 1.0)
    assert list(second.prefix_block_ids) == [1, 2] and second.prefix_block_tokens == 16
    with_tokens = trace.request(2, vocab_size=1000)
    assert len(with_tokens.prompt_token_ids) == 33 and with_tokens.prefix_block_ids is None
    assert with_tokens.priority == 2
    with pytest.raises(IndexError):
        trace.request(4)


def test_gen_writes_a_trace_that_reads_back(tmp_path, capsys):
    out = tmp_path / "chat.jsonl.gz"
    code = main(["trace", "gen", "--workload", "multi-turn-chat", "--rate", "3", "--num-requests", "400",
                 "--seed", "7", "-o", str(out), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["requests"] == 400 and printed["path"] == str(out)
    again = load_trace(out)
    expected = generate(workload_spec("multi-turn-chat", rate_rps=3, num_requests=400, seed=7))
    assert same_columns(again, expected)
    assert main(["trace", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["conversations"] == printed["conversations"] and stats["prefix_reuse"] > 0.3


def test_gen_custom_workload(tmp_path, capsys):
    out = tmp_path / "custom.jsonl"
    code = main(["trace", "gen", "--rate", "5", "--num-requests", "300", "--arrival", "gamma:cv=3",
                 "--prompt-len", "uniform:10:20", "--output-len", "7", "--system-prompts", "2:100:0.5",
                 "--n", "2", "--sampling-fraction", "0.5", "--priority-levels", "3", "-o", str(out)])
    assert code == 0
    trace = load_trace(out)
    assert len(trace) == 300 and set(trace.output_len.tolist()) == {7}
    assert set(trace.n.tolist()) == {1, 2} and set(trace.priority.tolist()) == {0, 1, 2}
    assert trace.prefix_block_tokens == 64 and trace.has_prefix_ids


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "kwon2023-sharegpt", "--num-requests", "5"], "needs --rate"),
        (["--workload", "nope", "--rate", "1", "--num-requests", "5"], "invalid choice"),
        (["--rate", "1", "--num-requests", "5", "--prompt-len", "lognormal:mean=x", "--output-len", "3"],
         "length distribution"),
        (["--rate", "1", "--num-requests", "5", "--prompt-len", "3", "--output-len", "3", "--arrival", "weibull"],
         "unknown arrival process"),
        (["--rate", "-1", "--num-requests", "5", "--prompt-len", "3", "--output-len", "3"], "must be > 0"),
        (["--rate", "1", "--num-requests", "0", "--prompt-len", "3", "--output-len", "3"], "must be >= 1"),
    ],
)
def test_gen_refuses_bad_flags_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as caught:
        main(["trace", "gen", *argv, "-o", str(tmp_path / "x.jsonl")])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "x.jsonl").exists()


def test_list_names_formats_and_workloads(capsys):
    assert main(["trace", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("azure", "mooncake", "burstgpt", "kwon2023-sharegpt", "kwon2023-alpaca"):
        assert name in out
