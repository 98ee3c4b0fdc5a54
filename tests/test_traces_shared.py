"""The shared real traces load and reproduce the statistics their README gives.

Figures are from ``../shared/traces/README.md`` (computed there over every row, percentiles
linearly interpolated, rate = rows / (last - first arrival)). Skipped when the folder is absent.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagesim.engine.cli import main
from tests.conftest import SHARED
from pagesim.traces.loaders import detect_format, load_trace
from pagesim.traces.stats import trace_stats

TRACES = SHARED / "traces"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
SHAREGPT = TRACES / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

# file -> (format, rows, span_s, rate, (in mean, p50, p99, min, max), (out mean, p50, p99, min, max))
README = {
    AZURE: ("azure", 19_366, 3_501.7, 5.530, (1_154.7, 1_020, 4_142, 2, 14_050), (211.1, 129, 601, 7, 1_000)),
    MOONCAKE: ("mooncake", 12_031, 3_537.0, 3.401, (12_035.1, 6_909, 85_400, 891, 126_195),
               (342.6, 350, 1_118.5, 1, 2_000)),
    SHAREGPT: ("lengths", 30_731, None, None, (2_340.0, 1_730, 7_433.7, 1, 8_141), (438.7, 415, 998, 2, 1_024)),
}


def _needs(path):
    if not path.exists():
        pytest.skip(f"{path} is not here (shared traces absent)")


def _close(got, want):
    """Equal to the README's figure at the precision the README prints it."""
    decimals = len(str(want).split(".")[1]) if "." in str(want) else 0
    assert round(got, decimals) == pytest.approx(want), (got, want)


@pytest.mark.parametrize("path", list(README), ids=lambda p: p.parent.name)
def test_stats_reproduce_the_readme(path):
    _needs(path)
    fmt, rows, span, rate, inputs, outputs = README[path]
    assert detect_format(path) == fmt
    stats = trace_stats(load_trace(path))
    assert stats["requests"] == rows
    if span is None:
        assert stats["duration_s"] is None and stats["rate_rps"] is None
    else:
        _close(stats["duration_s"], span)
        _close(stats["rate_rps"], rate)
    for key, want in (("input_tokens", inputs), ("output_tokens", outputs)):
        got = stats[key]
        for name, value in zip(("mean", "p50", "p99", "min", "max"), want):
            _close(got[name], value)


def test_mooncake_prefix_reuse_and_blocks():
    _needs(MOONCAKE)
    trace = load_trace(MOONCAKE)
    stats = trace_stats(trace)
    assert stats["prefix_block_tokens"] == 512
    assert round(stats["prefix_reuse"] * 100, 1) == 36.6
    assert stats["distinct_prefix_blocks"] == 182_790
    blocks = np.diff(trace.prefix_id_offsets)
    assert round(float(blocks.mean()), 1) == 24.0 and np.median(blocks) == 14


def test_azure_cli_json_done_when(capsys):
    _needs(AZURE)
    assert main(["trace", "stats", str(AZURE), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 19_366
    assert round(stats["input_tokens"]["mean"], 1) == 1_154.7


def test_azure_arrivals_keep_sub_microsecond_order():
    """Seven-digit stamps: seconds from the first, to the microsecond, still sorted."""
    _needs(AZURE)
    trace = load_trace(AZURE)
    assert trace.arrival_s[0] == 0.0
    # line 3 of the file: 18:15:50.9951690 - 18:15:46.6805900
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert np.all(np.diff(trace.arrival_s) >= 0)


def test_sharegpt_lengths_with_an_arrival_process(capsys):
    _needs(SHAREGPT)
    code = main(["trace", "stats", str(SHAREGPT), "--rate", "5", "--num-requests", "20000", "--json"])
    assert code == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 20_000
    # Poisson at 5/s: the measured rate is within 5 standard errors (1/sqrt(k) relative)
    assert abs(stats["rate_rps"] / 5 - 1) < 5 / np.sqrt(20_000)


def test_trace_rescaled_and_cut(capsys):
    _needs(AZURE)
    assert main(["trace", "stats", str(AZURE), "--rate", "20", "--num-requests", "1000", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 1000
    assert stats["rate_rps"] == pytest.approx(20, rel=1e-6)
