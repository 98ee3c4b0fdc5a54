"""Bounded reading of user-named files: regular files only, lines and gzip output capped, columns
streamed, every refusal one ``FILE[:LINE]: problem`` line that quotes no more than a short excerpt.

Every reader of a file a user names is tried on a FIFO (which must not block: a watchdog writes
to the FIFO to free a reader that waits on it, and the test then fails), on ``/dev/zero`` and on
a folder. Trace files are also tried with gzip bombs (the cap lowered, so the test is quick),
over-long lines, NUL bytes and binary garbage; a property test checks that reading in small
blocks and small chunks gives exactly what one whole-text parse gives (quoted newlines, blank
lines, CRLF, a BOM). Oracle specs with keys the format does not have are refused by name.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import threading
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagesim.engine.cli import main
from pagesim.engine.files import InputFileError, read_small_text
from pagesim.engine.oracle import VERSION_PRESETS, load_spec
from pagesim.engine.policy import DecisionLog
from pagesim.traces.errors import TraceFormatError, TraceWarning
from pagesim.traces.loaders import columns as columns_module
from pagesim.traces.loaders import load_trace
from pagesim.traces.loaders import stream
from pagesim.traces.loaders import text as text_module
from pagesim.traces.loaders.stream import LineBlocks, decompression_cap
from pagesim.traces.loaders.text import read_csv
from pagesim.traces.loaders.columns import Numbers

SHARED_ORACLE = Path(__file__).resolve().parents[2] / "shared" / "oracle"
LENGTHS_HEADER = "num_prefill_tokens,num_decode_tokens\n"
SECRET = "SECRET-CONTENT"


def one_line(message: str, path, prefix: str = "") -> str:
    """``message`` is one short line starting with ``prefix`` and ``path``; returns it."""
    assert "\n" not in message and message.startswith(f"{prefix}{path}"), message
    assert len(message) < 400 + len(str(path)), message
    return message


def gz(path: Path, data: bytes, level: int = 1) -> Path:
    path.write_bytes(gzip.compress(data, compresslevel=level))
    return path


# ----------------------------------------------------------------------------- who reads what
def _load_profile(path):
    from pagesim.sim.cost.profile import load_profile

    return load_profile(path)


def _hf_config(path):
    from pagesim.engine.catalog.hf_config import preset_from_hf_config

    return preset_from_hf_config(path)


def _llama_config(path):
    from pagesim.engine.model.config import LlamaConfig

    return LlamaConfig.from_hf(path)


def _bench_result(path):
    from pagesim.sim.bench_result import load_result

    return load_result(path)


def _tokenizer(path):
    from pagesim.traces.bench.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _sharegpt(path):
    from pagesim.traces.bench.sharegpt import sharegpt_trace
    from pagesim.traces.bench.tokenizer import EstimateTokenizer

    return sharegpt_trace(path, EstimateTokenizer(), num_prompts=1)


def _custom(path):
    from pagesim.traces.bench.custom import custom_trace
    from pagesim.traces.bench.tokenizer import EstimateTokenizer

    return custom_trace(path, EstimateTokenizer(), num_prompts=1)


READERS = {  # reader, the file name it is given, what its messages start with before the path
    "trace": (load_trace, "trace.csv", ""),
    "trace-jsonl": (lambda p: load_trace(p, "jsonl"), "trace.jsonl", ""),
    "sharegpt": (_sharegpt, "sharegpt.json", ""),
    "custom-jsonl": (_custom, "custom.jsonl", ""),
    "profile": (_load_profile, "profile.json", ""),
    "oracle-spec": (load_spec, "case.spec.json", ""),
    "decision-log": (DecisionLog.read_jsonl, "case.log.jsonl", ""),
    "hf-config": (_hf_config, "config.json", "cannot read model config "),
    "llama-config": (_llama_config, "config.json", "cannot read model config "),
    "bench-result": (_bench_result, "result.json", ""),
    "tokenizer": (_tokenizer, "tokenizer.json", "--tokenizer: "),
}


def refused(name: str, path) -> str:
    """The one-line ``ValueError`` reader ``name`` raises on ``path``, within 10 s even if it
    waits on a FIFO."""
    reader, _, prefix = READERS[name]
    outcome: dict = {}

    def run():
        try:
            reader(path)
        except ValueError as exc:
            outcome["error"] = exc
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["other"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked on the FIFO: give it a writer that leaves at once
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(10)
        pytest.fail(f"reading {path} blocked")
    assert "other" not in outcome, outcome
    assert "error" in outcome, f"{path} was read without an error"
    return one_line(str(outcome["error"]), path, prefix)


@pytest.mark.parametrize("name", list(READERS))
def test_a_fifo_is_refused_by_name_without_blocking(tmp_path, name):
    file_name = READERS[name][1]
    fifo = tmp_path / file_name
    os.mkfifo(fifo)
    assert "is a FIFO" in refused(name, fifo)


@pytest.mark.parametrize("name", list(READERS))
def test_dev_zero_is_refused_by_name(tmp_path, name):
    file_name = READERS[name][1]
    link = tmp_path / file_name
    link.symlink_to("/dev/zero")
    assert "is a device" in refused(name, link)


@pytest.mark.parametrize("name", [n for n in READERS if n not in ("llama-config", "tokenizer")])
def test_a_folder_is_refused_by_name(tmp_path, name):
    # (LlamaConfig.from_hf and load_tokenizer take a folder and read the file inside it)
    file_name = READERS[name][1]
    folder = tmp_path / file_name
    folder.mkdir()
    assert "is a directory" in refused(name, folder)


def test_dev_zero_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["trace", "stats", "/dev/zero"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["pagesim trace: error: /dev/zero: is a device, not a regular file: refusing to read it as a "
                   "trace file"]


# ----------------------------------------------------------------------------- small files
def test_read_small_text_checks_size_and_encoding(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_bytes(b"a = 1\n" * 100)
    assert read_small_text(path, limit_bytes=600, what="study spec").count("\n") == 100
    with pytest.raises(InputFileError, match=r"spec.toml: 600 bytes, larger than the 599 bytes a study spec may be"):
        read_small_text(path, limit_bytes=599, what="study spec")
    path.write_bytes(b"\xef\xbb\xbfa = 1\nb = '\xe9t\xe9'\n")
    with pytest.raises(InputFileError) as info:
        read_small_text(path, limit_bytes=100, what="study spec")
    assert str(info.value) == f"{path}:2: not UTF-8 text (byte 0xe9 at column 6)"
    with pytest.raises(InputFileError, match="no such file"):
        read_small_text(tmp_path / "absent.toml", limit_bytes=100, what="study spec")


def test_a_huge_profile_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from pagesim.sim.cost import profile

    path = tmp_path / "profile.json"
    path.write_text("{" + " " * 5000 + "}")
    monkeypatch.setattr(profile, "MAX_PROFILE_BYTES", 1000)
    with pytest.raises(profile.ProfileError, match=r"profile.json: 4.88 KiB, larger than the 1000 bytes a profile"):
        profile.load_profile(path)


# ----------------------------------------------------------------------------- gzip bombs
def test_a_gzip_bomb_of_valid_rows_stops_at_the_cap(tmp_path):
    rows = LENGTHS_HEADER.encode() + b"100,10\n" * (50 * 2**20 // 7)  # 50 MiB of valid rows
    bomb = gz(tmp_path / "rows.csv.gz", rows)
    assert bomb.stat().st_size < 2**20
    with decompression_cap(2**20), pytest.raises(TraceFormatError) as info:
        load_trace(bomb)
    message = one_line(str(info.value), bomb)
    assert "more than 1 MiB" in message and "--max-decompressed-gb" in message


def test_the_default_cap_is_a_ratio_with_a_floor(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "DEFAULT_FLOOR_BYTES", 2**20)
    monkeypatch.setattr(stream, "DEFAULT_RATIO", 10)
    bomb = gz(tmp_path / "rows.csv.gz", LENGTHS_HEADER.encode() + b"100,10\n" * (8 * 2**20 // 7), level=9)
    ratio_cap = stream.DEFAULT_RATIO * bomb.stat().st_size
    assert ratio_cap < 2**20  # so the floor is the cap
    with pytest.raises(TraceFormatError) as info:
        load_trace(bomb)
    message = one_line(str(info.value), bomb)
    assert "more than 1 MiB" in message and "10 x its size" in message and "--max-decompressed-gb" in message
    # an ordinary gzip (a few times smaller than its text) is read whole
    plain = LENGTHS_HEADER + "".join(f"{random.Random(k).randint(1, 9999)},{k % 500 + 1}\n" for k in range(3000))
    assert len(load_trace(gz(tmp_path / "ok.csv.gz", plain.encode()))) == 3000


def test_a_gzip_of_zeros_is_refused_at_its_first_line(tmp_path):
    zeros = zlib.compressobj(1, zlib.DEFLATED, 31)  # a gzip stream
    bomb = tmp_path / "zeros.csv.gz"
    bomb.write_bytes(b"".join(zeros.compress(bytes(2**20)) for _ in range(50)) + zeros.flush())
    with pytest.raises(TraceFormatError) as info:
        load_trace(bomb)
    assert one_line(str(info.value), bomb) == f"{bomb}:1: a NUL byte at column 1: binary data, not text"


def test_the_cap_flag_on_the_command_line(tmp_path, capsys):
    bomb = gz(tmp_path / "rows.csv.gz", LENGTHS_HEADER.encode() + b"100,10\n" * (2 * 2**20 // 7))
    for extra, words in ((["--max-decompressed-gb", "0.001"], ("rows.csv.gz", "--max-decompressed-gb")),
                         (["--max-decompressed-gb", "0"], ("--max-decompressed-gb", "> 0")),
                         (["--max-decompressed-gb", "nan"], ("--max-decompressed-gb",))):
        with pytest.raises(SystemExit) as exit_:
            main(["trace", "stats", str(bomb), *extra])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("pagesim trace: error: "), err
        assert all(word in err[0] for word in words), err
    assert main(["trace", "stats", str(bomb), "--max-decompressed-gb", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 2 * 2**20 // 7


def test_a_damaged_gzip_is_one_line(tmp_path):
    whole = gzip.compress((LENGTHS_HEADER + "10,5\n" * 5000).encode())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError) as info:
        load_trace(cut)
    assert "cannot read (damaged gzip data): Compressed file ended" in one_line(str(info.value), cut)


# ----------------------------------------------------------------------------- lines and bytes
def test_an_over_long_line_names_its_line_and_the_limit(tmp_path):
    csv_path = tmp_path / "long.csv"
    csv_path.write_text(LENGTHS_HEADER + "10,5\n" + "1" * (5 * 2**20) + ",5\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(csv_path)
    assert one_line(str(info.value), csv_path) == f"{csv_path}:3: line longer than the 4 MiB limit for one CSV row"
    jsonl = tmp_path / "long.jsonl"
    jsonl.write_text('{"prompt_len": 1, "output_len": 1}\n{"prompt_len": "' + SECRET * 400_000 + '"}\n')
    with pytest.raises(TraceFormatError) as info:
        load_trace(jsonl, "jsonl")
    assert one_line(str(info.value), jsonl).startswith(f"{jsonl}:2: line longer than the 4 MiB limit")
    assert SECRET not in str(info.value)


def test_an_unclosed_quote_is_refused_at_the_row_it_opens(tmp_path):
    path = tmp_path / "quote.csv"
    path.write_text(LENGTHS_HEADER + "1,2\n" + '"x\n",' * 1_200_000 + "\n")  # one row of many short lines
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert one_line(str(info.value), path).startswith(f"{path}:3: a row longer than the 4 MiB limit for one CSV row")
    path.write_text(LENGTHS_HEADER + "1,2\n" + '"' + "x\n" * 100_000)  # one field of many lines
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert one_line(str(info.value), path).startswith(f"{path}:3: a field longer than 131,072 characters")


def test_the_line_limit_counts_characters_not_bytes(tmp_path):
    path = tmp_path / "wide.txt"
    path.write_text("é" * 8 + "\n" + "é" * 11 + "\n", encoding="utf-8")  # 16 and 22 bytes
    blocks = LineBlocks(path, max_line_chars=10)
    with pytest.raises(TraceFormatError, match=r"wide.txt:2: line longer than the 10 characters limit"):
        list(blocks)
    path.write_text("é" * 9 + "\n" + "é" * 10, encoding="utf-8")
    assert "".join(text for _, text in LineBlocks(path, max_line_chars=10)) == path.read_text()


def test_binary_garbage_is_named_by_line_and_column_not_quoted(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "READ_BYTES", 7)  # the bad byte lies blocks away from the start
    path = tmp_path / "latin1.csv"
    path.write_bytes((LENGTHS_HEADER + "10,5\n20,6\n").encode() + "3é,7\n".encode("latin-1"))
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}:4: not UTF-8 text (byte 0xe9 at column 2)"
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(random.Random(0).randbytes(64 * 1024))
    monkeypatch.setattr(stream, "READ_BYTES", 2**20)
    for reader in (load_trace, lambda p: load_trace(p, "jsonl"), DecisionLog.read_jsonl, _bench_result):
        with pytest.raises(ValueError) as info:
            reader(garbage)
        message = one_line(str(info.value), garbage)
        assert "\\x" not in message, message  # no bytes of the file


def test_nul_bytes_are_named_at_their_line(tmp_path):
    path = tmp_path / "nul.csv"
    path.write_text(LENGTHS_HEADER + "10,5\n1\0\0\0,5\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert one_line(str(info.value), path) == f"{path}:3: a NUL byte at column 2: binary data, not text"
    path = tmp_path / "nul.jsonl"
    path.write_text('{"prompt_len": 1, "output_len": 2}\n{"prompt_len": 1,\0 "output_len": 2}\n')
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, "jsonl")
    assert one_line(str(info.value), path) == f"{path}:2: a NUL byte at column 18: binary data, not text"


# ----------------------------------------------------------------------------- streaming
def _reference_rows(text: str) -> tuple[list[list[str]], list[int]]:
    """Non-blank rows after the header and the line each began on, from one parse of the whole text."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows, starts, end, header_seen = [], [], 0, False
    for row in reader:
        start, end = end + 1, reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if header_seen:
            rows.append(row)
            starts.append(start)
        header_seen = True
    return rows, starts


_FIELD = st.one_of(st.integers(1, 10**6).map(str), st.just('"7"'), st.just('"1\n2"'), st.just('"x\r\ny"'))


@given(rows=st.lists(st.tuples(_FIELD, st.integers(1, 999)), min_size=1, max_size=40),
       blanks=st.lists(st.integers(0, 45), max_size=6), newline=st.sampled_from(["\n", "\r\n"]),
       bom=st.booleans(), read_bytes=st.sampled_from([1, 3, 16, 2**20]), chunk_rows=st.sampled_from([1, 2, 5, 2**16]))
def test_blocks_and_chunks_read_what_one_parse_reads(tmp_path_factory, rows, blanks, newline, bom, read_bytes,
                                                     chunk_rows):
    lines = ["note,prompt,output"] + [f"{note},{n},{n % 7 + 1}" for n, (note, _) in enumerate(rows, start=1)]
    for k in sorted(blanks, reverse=True):
        lines.insert(min(k, len(lines)), "  " if k % 2 else "")
    text = newline.join(lines) + newline
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "READ_BYTES", read_bytes)
        patch.setattr(text_module, "CHUNK_ROWS", chunk_rows)
        patch.setattr(columns_module, "CHUNK_ROWS", chunk_rows)
        table = read_csv(path, {"prompt": Numbers("prompt", integer=True), "note": _Strings("note")})
    expected_rows, expected_starts = _reference_rows(text)
    assert table.lines.tolist() == expected_starts
    assert table.columns["prompt"].tolist() == [int(row[1]) for row in expected_rows]
    assert table.columns["note"] == [row[0] for row in expected_rows]


class _Strings:
    """A ``Column`` that keeps the text as it is (to compare fields exactly)."""

    def __init__(self, column: str):
        self.column = column

    def convert(self, path, values, lines):
        return list(values)

    def join(self, chunks):
        return [value for chunk in chunks for value in chunk]


def test_errors_and_repairs_in_later_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "CHUNK_ROWS", 3)
    monkeypatch.setattr(columns_module, "CHUNK_ROWS", 3)
    monkeypatch.setattr(stream, "READ_BYTES", 8)
    good = "".join(f"{k},{k + 1}\n" for k in range(1, 11))
    path = tmp_path / "t.csv"
    path.write_text(LENGTHS_HEADER + good + "5,x\n" + good)
    with pytest.raises(TraceFormatError, match=r"t.csv:12: num_decode_tokens: expected a number"):
        load_trace(path)
    path.write_text(LENGTHS_HEADER + good + "5,6,7\n" + good)
    with pytest.raises(TraceFormatError, match=r"t.csv:12: expected 2 fields, found 3"):
        load_trace(path)
    path.write_text(LENGTHS_HEADER + good + "5")  # cut off: dropped, with a warning
    with pytest.warns(TraceWarning, match=r"t.csv:12: last line is cut off"):
        assert load_trace(path).prompt_len.tolist() == list(range(1, 11))
    jsonl = tmp_path / "t.jsonl"
    rows = "".join(json.dumps({"prompt_len": 2, "output_len": k, "prefix_ids": [k, k + 1]}) + "\n" for k in range(1, 8))
    jsonl.write_text(rows + '{"prompt_len": 3, "output_len"')
    with pytest.warns(TraceWarning, match=r"t.jsonl:8: last line is cut off"):
        trace = load_trace(jsonl, "jsonl", prefix_block_tokens=1)
    assert trace.output_len.tolist() == list(range(1, 8)) and trace.prefix_id_offsets.tolist() == list(range(0, 16, 2))


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_blocks_of_blank_lines_are_skipped_and_counted(tmp_path, monkeypatch, newline):
    monkeypatch.setattr(stream, "READ_BYTES", 64)  # most blocks hold blank lines only
    blank = newline * 5000
    path = tmp_path / "blank.csv"
    path.write_text(blank + LENGTHS_HEADER + "1,2\n" + blank + "3,4\n" + blank + "5,x\n", newline="")
    with pytest.raises(TraceFormatError, match=r"blank.csv:15004: num_decode_tokens: expected a number"):
        load_trace(path)
    path = tmp_path / "blank.jsonl"
    path.write_text(blank + '{"prompt_len": 1, "output_len": 2}\n' + blank + '{"prompt_len": 1, "output_len": 0}\n',
                    newline="")
    with pytest.raises(TraceFormatError, match=r"blank.jsonl:10002: output_len: must be >= 1"):
        load_trace(path, "jsonl")


@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_memory_holds_columns_not_text(tmp_path):
    rows = 200_000
    path = tmp_path / "big.csv"
    with open(path, "w") as out:
        out.write("arrival_s,prompt_len,output_len,note\n")
        out.writelines(f"{k * 0.01:.2f},{k % 4000 + 1},{k % 900 + 1},some text that is not kept\n"
                       for k in range(rows))
    tracemalloc.start()
    try:
        trace = load_trace(path, "csv")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = sum(v.nbytes for v in vars(trace).values() if isinstance(v, np.ndarray))
    # the columns, their line numbers, one chunk of rows as Python strings, one block of text
    print(f"peak {peak / 2**20:.1f} MiB, columns {kept / 2**20:.1f} MiB, file {path.stat().st_size / 2**20:.1f} MiB")
    assert len(trace) == rows and peak < kept + rows * 8 + 40 * 2**20, (peak / 2**20, kept / 2**20)


# ----------------------------------------------------------------------------- oracle specs
def _v0_spec() -> dict:
    return json.loads((SHARED_ORACLE / "vllm-0.6.3-v0" / "case_000.spec.json").read_text())


@pytest.mark.skipif(not SHARED_ORACLE.exists(), reason="needs ../shared/oracle")
def test_every_shared_oracle_spec_loads():
    """Every spec of a vLLM version pagesim has a preset for loads (vLLM 0.33's priority, hybrid and
    offload folders' too); a spec of another version is refused naming the versions known."""
    specs = sorted(SHARED_ORACLE.glob("*/case_*.spec.json"))
    known = [s for s in specs if json.loads(s.read_text())["vllm_version"] in VERSION_PRESETS]
    assert len(known) >= 20
    for spec in specs:
        version = json.loads(spec.read_text())["vllm_version"]
        if version in VERSION_PRESETS:
            load_spec(spec).scheduler_config()
        else:
            with pytest.raises(ValueError, match=f"vllm_version '{version}' has no preset; known: 0.32.0"):
                load_spec(spec)


def _priority_spec() -> dict:
    return json.loads((SHARED_ORACLE / "vllm-0.33-v1-priority" / "case_000.spec.json").read_text())


@pytest.mark.skipif(not SHARED_ORACLE.exists(), reason="needs ../shared/oracle")
@pytest.mark.parametrize("change, words", [
    (lambda s: s["config"].update(scheduling_policy="lottery"), ("config.scheduling_policy must be one of fcfs, priority",)),
    (lambda s: s["config"].update(scheduling_policy=1), ("config.scheduling_policy must be str",)),
    (lambda s: s["config"].update(kv_group_windows=[None, 0]), ("config.kv_group_windows must be a non-empty list",)),
    (lambda s: s["config"].update(kv_group_windows=[]), ("config.kv_group_windows must be a non-empty list",)),
    (lambda s: s["config"].update(kv_group_windows=16), ("config.kv_group_windows must be list",)),
    (lambda s: s["config"].update(prefix_cache_retention_interval=-4),
     ("config.prefix_cache_retention_interval must be null or >= 0",)),
    (lambda s: s["config"].update(num_offload_blocks=8, offload_load_steps=0), ("config.offload_load_steps must be >= 1",)),
    (lambda s: s["config"].update(num_offload_blocks=8, offload_eviction_policy="lfu"),
     ("config.offload_eviction_policy must be lru or arc",)),
    (lambda s: s["config"].update(num_offload_blocks="8"), ("config.num_offload_blocks must be int",)),
    (lambda s: s["config"].update(offload_sync_load_budget_bytes=-1), ("config.offload_sync_load_budget_bytes must be >= 0",)),
    (lambda s: s["config"].update(scheduling=1), ("config (vLLM 0.33.0): unknown key 'scheduling'",)),
    (lambda s: s["requests"][0].update(priority="high"), ("requests[0].priority must be int",)),
    (lambda s: s["requests"][0].update(arrival_time=float("inf")), ("requests[0].arrival_time must be a finite",)),
    (lambda s: s["requests"][0].update(deadline=3), ("requests[0]: unknown key 'deadline'", "allowed: id,")),
    # a 0.33 key under another version: refused by name, said to be a 0.33 key
    (lambda s: s.update(vllm_version="0.32.0"), ("config (vLLM 0.32.0): unknown key 'scheduling_policy' (a vLLM 0.33.0 key)",)),
])
def test_a_v033_spec_with_a_key_it_cannot_replay_is_refused_by_name(tmp_path, change, words):
    _refused_spec(tmp_path, _priority_spec(), change, words)


def _refused_spec(tmp_path, spec: dict, change, words) -> str:
    """``spec`` after ``change``, written and loaded: refused in one line holding every one of ``words``."""
    change(spec)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError) as info:
        load_spec(path)
    message = one_line(str(info.value), path)
    assert all(word in message for word in words), message
    return message


@pytest.mark.skipif(not SHARED_ORACLE.exists(), reason="needs ../shared/oracle")
@pytest.mark.parametrize("change, words", [
    (lambda s: s.update(schedule_policy="priority"), ("unknown key 'schedule_policy'", "allowed: config, requests")),
    (lambda s: s["config"].update(swap_space=4), ("config (vLLM 0.6.3): unknown key 'swap_space'", "num_cpu_blocks")),
    (lambda s: s["requests"][1].update(priority=1), ("requests[1]: unknown key 'priority'", "allowed: id,")),
    (lambda s: s["requests"][0].update({SECRET * 20: 1}), ("unknown key 'SECRET",)),
    (lambda s: s["config"].update(num_blocks=-1), ("config.num_blocks must be >= 1",)),
    (lambda s: s["config"].update(watermark=float("nan")), ("config.watermark",)),
])
def test_an_oracle_spec_with_an_unknown_key_is_refused_by_name(tmp_path, change, words):
    message = _refused_spec(tmp_path, _v0_spec(), change, words)
    assert message.count(SECRET) <= 2, message  # a long key is cut short
