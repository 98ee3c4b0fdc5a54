"""Capacity calculator and ``pagesim memory``: the worked example, exactly, and clean errors."""

from __future__ import annotations

import json

import pytest

import pagesim.engine.cli as cli
from pagesim.engine.model_presets import MODEL_PRESETS
from pagesim.engine.catalog.capacity import RequestFootprint, compute_capacity, paged_footprint

WORKED_LENGTHS = [128, 700, 1500, 300, 2900, 50, 4100, 900]


def worked_example():
    return compute_capacity(
        MODEL_PRESETS["llama3-8b"], WORKED_LENGTHS, block_size=16, max_model_len=8192, kv_bytes=64e9
    )


def test_worked_example():
    report = worked_example()
    assert report.bytes_per_token == 131_072  # 2 * 32 layers * 8 KV heads * 128 * 2 bytes
    assert report.tokens == 10_578
    assert report.contiguous_slots == 65_536
    assert f"{report.contiguous_utilization:.1%}" == "16.1%"
    assert report.paged_slots == 10_640
    assert report.paged_blocks == 665
    assert f"{report.paged_utilization:.1%}" == "99.4%"
    assert report.requests[1] == RequestFootprint(length_tokens=700, blocks=44, idle_slots=4)
    assert report.total_blocks == 30_517  # floor(64e9 / (16 * 131072))
    assert report.contiguous_capacity_slots == 488_281
    assert report.contiguous_capacity_requests == 59
    assert report.paged_capacity_requests == 367
    assert report.idle_slots_max == 15


def test_per_request_detail_and_invariants():
    report = worked_example()
    assert [(r.blocks, r.idle_slots) for r in report.requests] == [
        (8, 0), (44, 4), (94, 4), (19, 4), (182, 12), (4, 14), (257, 12), (57, 12),
    ]
    assert report.tokens <= report.paged_slots < report.tokens + report.num_requests * 16
    assert sum(r.idle_slots for r in report.requests) == report.paged_slots - report.tokens


@pytest.mark.parametrize(
    ("length", "block_size", "blocks", "idle"),
    [(1, 16, 1, 15), (16, 16, 1, 0), (17, 16, 2, 15), (700, 1, 700, 0), (700, 256, 3, 68)],
)
def test_paged_footprint(length, block_size, blocks, idle):
    assert paged_footprint(length, block_size) == RequestFootprint(length, blocks, idle)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": [128, 9000]}, "length 9000 at index 1 exceeds max_model_len 8192"),
        ({"lengths": []}, "at least one request"),
        ({"lengths": [5, 0]}, "length at index 1 must be a positive integer, got 0"),
        ({"lengths": [5, 2.5]}, "length at index 1 must be a positive integer"),
        ({"block_size": 0}, "block_size must be a positive integer, got 0"),
        ({"max_model_len": -1}, "max_model_len must be a positive integer"),
        ({"kv_bytes": float("inf")}, "kv_bytes must be a positive finite number"),
        ({"kv_bytes": 0}, "kv_bytes must be a positive finite number"),
    ],
)
def test_compute_errors(kwargs, message):
    arguments = dict(lengths=WORKED_LENGTHS, block_size=16, max_model_len=8192, kv_bytes=64e9)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        compute_capacity(MODEL_PRESETS["llama3-8b"], **arguments)


def test_cli_json_is_the_worked_example(capsys):
    assert cli.main(["memory", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model_name"] == "llama3-8b"
    assert result["bytes_per_token"] == 131_072
    assert result["tokens"] == 10_578
    assert result["paged_slots"] == 10_640
    assert result["paged_utilization"] == pytest.approx(10_578 / 10_640)
    assert result["contiguous_slots"] == 65_536
    assert result["contiguous_utilization"] == pytest.approx(10_578 / 65_536)
    assert result["paged_capacity_requests"] == 367
    assert result["contiguous_capacity_requests"] == 59
    assert result["total_blocks"] == 30_517
    assert result["block_size"] == 16
    assert result["requests"][1] == {"length_tokens": 700, "blocks": 44, "idle_slots": 4}


def test_cli_human_output(capsys):
    assert cli.main(["memory"]) == 0
    out = capsys.readouterr().out
    for expected in ("llama3-8b", "131,072 bytes", "10,578 tokens", "65,536", "16.1%",
                     "10,640", "99.4%", "59 requests", "367 requests"):
        assert expected in out, expected
    detail = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert detail == [["1", "700", "44", "4"]]


def test_cli_options(capsys):
    argv = ["memory", "--json", "--model", "llama2-7b", "--lengths", "100, 200",
            "--block-size", "32", "--kv-bytes", "1GiB"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_per_token"] == 524_288
    assert result["max_model_len"] == 4096  # the model's max_position_embeddings
    assert result["paged_slots"] == 4 * 32 + 7 * 32
    assert result["kv_bytes"] == 2**30
    assert result["total_blocks"] == 2**30 // (32 * 524_288)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lengths", "128,abc"], "--lengths item 1 is 'abc', not an integer"),
        (["--lengths", "128,-5"], "--lengths item 1 is -5; lengths must be positive"),
        (["--lengths", ""], "--lengths is empty"),
        (["--block-size", "0"], "block_size must be a positive integer, got 0"),
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--lengths", "9000"], "length 9000 at index 0 exceeds max_model_len 8192"),
        (["--kv-bytes", "lots"], "--kv-bytes 'lots' is not a byte count"),
        (["--kv-bytes=-1e9"], "--kv-bytes must be a positive number"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["memory", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim memory: error: ")
    assert message in err
    assert "Traceback" not in err
