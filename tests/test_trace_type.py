"""The column-wise ``Trace``: invariants, slicing, rescaling, conversion to requests, and the
``pagesim trace gen`` / ``list`` commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy.scheduling.request import Request
from pagesim.traces.errors import TraceFormatError
from pagesim.traces.generate import generate, workload_spec
from pagesim.traces.loaders import load_trace
from pagesim.traces.loaders.pagesim_jsonl import same_columns
from pagesim.traces.trace import Trace


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
    with pytest.raises(ValueError, match="no arrival times to rescale"):
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
    assert trace.prefix_block_tokens == 4 and trace.has_prefix_ids  # gcd(64, 100): tiles the 100 tokens


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "kwon2023-sharegpt", "--num-requests", "5"], "need --rate"),
        (["--workload", "nope", "--rate", "1", "--num-requests", "5"], "invalid choice"),
        (["--rate", "1", "--num-requests", "5", "--prompt-len", "lognormal:mean=x", "--output-len", "3"],
         "length distribution"),
        (["--rate", "1", "--num-requests", "5", "--prompt-len", "3", "--output-len", "3", "--arrival", "weibull"],
         "unknown arrival process"),
        (["--rate", "-1", "--num-requests", "5", "--prompt-len", "3", "--output-len", "3"], "must be > 0"),
        (["--rate", "1", "--num-requests", "0", "--prompt-len", "3", "--output-len", "3"], "number of requests must be in"),
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


# ------------------------------------------------------------ flags that must not be lost or misread
def _stats(capsys, *argv) -> dict:
    assert main(["trace", "stats", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _gen(tmp_path, capsys, *argv) -> dict:
    assert main(["trace", "gen", *map(str, argv), "-o", str(tmp_path / "g.jsonl"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("arrival", [None, "gamma:cv=1", "constant"])
def test_rate_is_requests_per_second_for_conversations_too(tmp_path, capsys, arrival):
    extra = [] if arrival is None else ["--arrival", arrival]
    preset = _gen(tmp_path, capsys, "--workload", "multi-turn-chat", "--rate", 10, "--num-requests", 20000, *extra)
    custom = _gen(tmp_path, capsys, "--prompt-len", 10, "--output-len", 10, "--turns", 4, "--rate", 10,
                  "--num-requests", 20000, *extra)
    for stats in (preset, custom):
        # turns of one conversation cluster, so allow more than Poisson's 1/sqrt(k)
        assert stats["rate_rps"] == pytest.approx(10, rel=0.05), stats["rate_rps"]


def test_piecewise_arrivals_set_their_own_rate(tmp_path, capsys):
    stats = _gen(tmp_path, capsys, "--workload", "kwon2023-alpaca", "--num-requests", 1000,
                 "--arrival", "piecewise:10@1,10@100")
    assert 15 < stats["duration_s"] < 25  # 10 in the first 10 s, then 990 at 100/s


def test_length_only_files_with_recognised_columns_take_an_arrival_process(tmp_path, capsys):
    (tmp_path / "l.csv").write_text("prompt_tokens,completion_tokens\n" + "10,5\n" * 2000)
    stats = _stats(capsys, tmp_path / "l.csv", "--rate", 4)
    assert stats["arrival_process"] == "Poisson 4/s" and stats["rate_rps"] == pytest.approx(4, rel=0.15)
    (tmp_path / "l.jsonl").write_text('{"prompt_len": 5, "output_len": 3}\n' * 2000)
    stats = _stats(capsys, tmp_path / "l.jsonl", "--rate", 4, "--arrival", "constant")
    assert stats["rate_rps"] == pytest.approx(4 * 2000 / 1999)  # rows / span, gaps of exactly 1/4 s


def test_time_unit_applies_to_a_recognised_arrival_column(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("time,prompt_len,output_len\n0,1,1\n1500,1,1\n")
    assert _stats(capsys, tmp_path / "t.csv", "--time-unit", "ms")["duration_s"] == 1.5


def test_integers_too_large_for_floats_are_refused_not_rounded(tmp_path, capsys):
    (tmp_path / "c.csv").write_text("arrival_s,prompt_len,output_len,conversation_id,turn\n"
                                    "0,1,1,9007199254740993,0\n1,1,1,9007199254740992,0\n")
    assert _stats(capsys, tmp_path / "c.csv")["conversations"] == 2  # exact, not merged through float64
    (tmp_path / "p.csv").write_text("arrival_s,prompt_len,output_len,priority\n0,1,1,1e19\n")
    with pytest.raises(SystemExit):
        main(["trace", "stats", str(tmp_path / "p.csv")])
    assert "p.csv:2: priority:" in capsys.readouterr().err


def test_spread_ties_keeps_batches_in_their_interval():
    trace = Trace(arrival_s=[0, 0, 0, 3, 3, 6], prompt_len=[1] * 6, output_len=[1] * 6)
    spread = trace.spread_ties(seed=1)
    times = spread.arrival_s
    assert np.all(np.diff(times) >= 0) and len(np.unique(times)) == 6
    assert np.all((times[:3] >= 0) & (times[:3] < 3)) and np.all((times[3:5] >= 3) & (times[3:5] < 6))
    assert 6 <= times[5] < 9  # the last batch spreads over the median gap
    assert np.array_equal(spread.arrival_s, trace.spread_ties(seed=1).arrival_s)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["gen", "--prompt-len", "9", "--output-len", "9", "--rate", "1", "--num-requests", "5",
          "-o", "afile/x.jsonl"], "afile/x.jsonl: cannot be written (Not a directory)"),  # the parent is a file
        (["gen", "--workload", "kwon2023-alpaca", "--rate", "1", "--num-requests", "5", "--n", "4", "-o", "x"],
         "--n describes a custom workload"),
        (["gen", "--workload", "kwon2023-alpaca", "--rate", "1", "--num-requests", "5",
          "--arrival", "piecewise:1@1", "-o", "x"], "leave out --rate"),
        (["gen", "--prompt-len", "9", "--output-len", "9", "--rate", "1", "--num-requests", "5", "--turns", "3",
          "--think-time", "inf", "-o", "x"], "finite"),
        (["gen", "--prompt-len", "9", "--output-len", "9", "--rate", "1e4", "--num-requests", "10", "--turns", "1000",
          "-o", "x"], "the warm-up would draw about"),
        (["gen", "--workload", "kwon2023-sharegpt", "--rate", "1", "--num-requests", "5", "--spread-ties", "-o", "x"],
         "not for trace gen"),
        (["gen", "--workload", "kwon2023-sharegpt", "--rate", "1", "--num-requests", "5", "--format", "azure",
          "-o", "x"], "describe a --lengths FILE"),
        (["gen", "--prompt-len", "9", "--output-len", "9", "--rate", "1", "--num-requests", "1000000000",
          "-o", "x"], "must be in [1, 100,000,000]"),
        (["gen", "--prompt-len", "9", "--output-len", "9", "--rate", "1", "--num-requests", "5", "--warmup", "3",
          "-o", "x"], "--warmup applies to conversations"),
    ],
)
def test_more_bad_flags_are_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as caught:
        main(["trace", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len(err) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written, not even a temporary


def test_rate_holds_when_the_context_limit_cuts_conversations(tmp_path, capsys):
    """Fewer turns kept than mean_turns: conversations start more often, so requests still come at --rate."""
    stats = _gen(tmp_path, capsys, "--prompt-len", 200, "--output-len", 300, "--turns", 20, "--think-time", 1,
                 "--max-context", 2000, "--rate", 10, "--num-requests", 5000)
    assert stats["turns"]["mean"] < 5  # the limit did cut conversations short
    assert stats["rate_rps"] == pytest.approx(10, rel=0.08)


def test_piecewise_schedule_is_not_shifted_by_the_conversation_warm_up(tmp_path, capsys):
    _gen(tmp_path, capsys, "--prompt-len", 10, "--output-len", 10, "--turns", 2, "--think-time", 10,
         "--arrival", "piecewise:300@0,100@20,1000@0.5", "--num-requests", 3000)
    trace = load_trace(tmp_path / "g.jsonl")
    counts = np.histogram(trace.arrival_s, bins=[0, 300, 400, 10_000])[0]
    assert counts[0] == 0 and counts[1] > 1500  # nothing before 300 s, the burst in 300-400 s


def test_drawn_arrivals_keep_the_process_start(tmp_path):
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens\n" + "10,5\n" * 100)
    from pagesim.traces.generate.arrivals import Piecewise

    trace = load_trace(tmp_path / "l.csv", arrivals=Piecewise(((300.0, 0.0), (100.0, 20.0))))
    assert trace.arrival_s[0] >= 300  # not moved to 0


def test_spread_ties_from_the_command_line(tmp_path, capsys):
    rows = "".join(f"{t},10,5\n" for t in (0, 0, 0, 3, 3, 6))
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n" + rows)
    assert _stats(capsys, tmp_path / "t.csv")["distinct_arrival_times"] == 3
    assert _stats(capsys, tmp_path / "t.csv", "--spread-ties")["distinct_arrival_times"] == 6
    (tmp_path / "same.csv").write_text("arrival_s,prompt_len,output_len\n0,1,1\n0,1,1\n")
    with pytest.raises(SystemExit):
        main(["trace", "stats", str(tmp_path / "same.csv"), "--spread-ties"])
    assert "no gap to spread" in capsys.readouterr().err
