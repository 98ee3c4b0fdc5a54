"""Malformed trace files: refused with one ``FILE:LINE: problem`` line, or repaired with a warning.

Every case is checked twice: through the Python API (``load_trace`` raises ``TraceFormatError``,
a ``ValueError``, whose message starts with the path and the offending line) and through the
command line (``pagesim trace stats PATH`` exits 2 with exactly one ``pagesim trace: error:``
line on stderr, never a traceback). Repairs (a cut-off last line, BurstGPT's failed rows) are
``TraceWarning``s, shown by the command line as one ``pagesim trace: warning:`` line (exit 0)
and turned into errors by ``--strict``.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from datetime import datetime, timedelta

import numpy as np
import pytest

from pagesim.engine.cli import main
from tests.conftest import SHARED
from pagesim.traces.errors import TraceFormatError, TraceWarning
from pagesim.traces.loaders import load_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def azure_rows(count: int, start_s: int = 0) -> str:
    """``count`` valid Azure rows, one second apart."""
    return "".join(
        f"2023-11-16 18:{(start_s + i) // 60 % 60:02d}:{(start_s + i) % 60:02d}.{i:07d},{100 + i},{10 + i}\n"
        for i in range(count)
    )


def mooncake_row(timestamp: int, input_length: int = 600, output_length: int = 10, **override) -> str:
    row = {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": list(range(-(-input_length // 512))),
    }
    row.update(override)
    return json.dumps({k: v for k, v in row.items() if v is not _DROP})


_DROP = object()


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------- helpers
def api_error(path, *, line: int | None, words=(), fmt: str | None = None, **options) -> TraceFormatError:
    """``load_trace`` refuses ``path`` with ``PATH:LINE: ...`` (or ``PATH: ...``) naming ``words``."""
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, fmt, **options)
    error = info.value
    assert isinstance(error, ValueError)
    message = str(error)
    assert "\n" not in message
    if line is None:
        assert message.startswith(f"{path}: "), message
        assert not re.match(rf"{re.escape(str(path))}:\d+:", message), message
    else:
        assert message.startswith(f"{path}:{line}: "), message
        assert error.line == line
    for word in words:
        assert word.lower() in message.lower(), (word, message)
    return error


def cli_run(capsys, path, *extra: str):
    """``pagesim trace stats PATH ...``: (exit code, stdout, stderr lines)."""
    capsys.readouterr()
    try:
        code = main(["trace", "stats", str(path), *extra])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def cli_error(capsys, path, *extra: str, line: int | None, words=()) -> str:
    """The command line refuses ``path``: exit 2, one ``error:`` line on stderr, no traceback."""
    code, out, err = cli_run(capsys, path, *extra)
    assert code == 2, (code, out, err)
    assert len(err) == 1, err
    assert err[0].startswith("pagesim trace: error: "), err
    assert "Traceback" not in err[0]
    assert out == ""
    message = err[0].removeprefix("pagesim trace: error: ")
    if line is None:
        assert message.startswith(f"{path}: "), message
    else:
        assert message.startswith(f"{path}:{line}: "), message
    for word in words:
        assert word.lower() in message.lower(), (word, message)
    return message


def both(capsys, path, *, line: int | None, words=(), fmt: str | None = None, cli_extra=()):
    """The same refusal through the API and through the command line (same message)."""
    error = api_error(path, line=line, words=words, fmt=fmt)
    extra = list(cli_extra) + (["--format", fmt] if fmt else [])
    message = cli_error(capsys, path, *extra, line=line, words=words)
    assert message == str(error)
    return error


# --------------------------------------------------------------------- sanity
def test_valid_files_load(tmp_path, capsys):
    azure = write(tmp_path, "a.csv", AZURE_HEADER + azure_rows(5))
    trace = load_trace(azure)
    assert len(trace) == 5 and trace.prompt_len.tolist() == [100, 101, 102, 103, 104]
    mooncake = write(tmp_path, "m.jsonl", "\n".join(mooncake_row(t * 100) for t in range(4)) + "\n")
    trace = load_trace(mooncake)
    assert len(trace) == 4 and trace.prefix_block_tokens == 512
    assert np.allclose(trace.arrival_s, [0.0, 0.1, 0.2, 0.3])
    code, out, err = cli_run(capsys, azure, "--json")
    assert code == 0 and err == []
    assert json.loads(out)["requests"] == 5


# --------------------------------------------------------------------- missing columns / keys
def test_azure_missing_generated_tokens_column(tmp_path, capsys):
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    error = both(capsys, path, line=1, words=("missing column", "GeneratedTokens"), fmt="azure")
    assert "TIMESTAMP, ContextTokens" in str(error)  # says what the header does have
    # detected (not named): two of Azure's three columns are enough to recognise it
    both(capsys, path, line=1, words=("missing column", "GeneratedTokens"))


def test_mooncake_row_missing_hash_ids(tmp_path, capsys):
    text = "\n".join([mooncake_row(0), mooncake_row(10), mooncake_row(20, hash_ids=_DROP), mooncake_row(30)]) + "\n"
    path = write(tmp_path, "m.jsonl", text)
    both(capsys, path, line=3, words=("missing key", "hash_ids"))
    both(capsys, path, line=3, words=("missing key", "hash_ids"), fmt="mooncake")


# --------------------------------------------------------------------- bad numbers
@pytest.mark.parametrize(
    "value, words",
    [
        ("abc", ("ContextTokens", "expected a number", "found text that is not one")),
        ("-5", ("ContextTokens", ">= 1", "a negative number")),
        ("0", ("ContextTokens", ">= 1", "found 0")),
        ("12.5", ("ContextTokens", "whole number", "a fraction")),
        ("", ("ContextTokens", "expected a number")),
    ],
    ids=["non-numeric", "negative", "zero", "fractional", "empty"],
)
def test_azure_bad_prompt_length(tmp_path, capsys, value, words):
    rows = azure_rows(6).splitlines(keepends=True)
    stamp, _, output = rows[3].rstrip("\n").split(",")
    rows[3] = f"{stamp},{value},{output}\n"  # file line 5
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    error = both(capsys, path, line=5, words=words)
    if value not in ("", "0"):  # the value is described, never quoted (a file may hold a secret there)
        assert value not in str(error).removeprefix(str(path))


@pytest.mark.parametrize(
    "value, words",
    [("abc", ("expected a number",)), ("-3", (">= 1",)), ("0", (">= 1",)), ("7.25", ("whole number",))],
    ids=["non-numeric", "negative", "zero", "fractional"],
)
def test_azure_bad_output_length(tmp_path, capsys, value, words):
    rows = azure_rows(4).splitlines(keepends=True)
    stamp, prompt, _ = rows[1].rstrip("\n").split(",")
    rows[1] = f"{stamp},{prompt},{value}\n"  # file line 3
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    both(capsys, path, line=3, words=("GeneratedTokens", *words))


def test_whole_numbers_written_with_a_point_are_accepted(tmp_path):
    rows = azure_rows(2).replace(",100,", ",100.0,")
    trace = load_trace(write(tmp_path, "a.csv", AZURE_HEADER + rows))
    assert trace.prompt_len.tolist() == [100, 101]


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("input_length", "many", ("input_length", "expected a number")),
        ("input_length", -600, ("input_length", ">= 1")),
        ("input_length", 0, ("input_length", ">= 1")),
        ("input_length", 600.5, ("input_length", "whole number")),
        ("output_length", 0, ("output_length", ">= 1")),
        ("output_length", 2.5, ("output_length", "whole number")),
        ("output_length", None, ("output_length", "expected a number")),
        ("timestamp", "soon", ("timestamp", "expected a number")),
    ],
)
def test_mooncake_bad_numbers(tmp_path, capsys, field, value, words):
    bad = json.loads(mooncake_row(20))
    bad[field] = value
    text = "\n".join([mooncake_row(0), mooncake_row(10), json.dumps(bad), mooncake_row(30)]) + "\n"
    path = write(tmp_path, "m.jsonl", text)
    both(capsys, path, line=3, words=words, fmt="mooncake")


# --------------------------------------------------------------------- order
def test_unsorted_timestamps_name_the_later_line(tmp_path, capsys):
    rows = [
        "2023-11-16 18:15:10.0000000,10,10",
        "2023-11-16 18:15:20.0000000,11,11",
        "2023-11-16 18:15:30.0000000,12,12",
        "2023-11-16 18:15:25.0000000,13,13",  # line 5: earlier than line 4
        "2023-11-16 18:15:40.0000000,14,14",
    ]
    path = write(tmp_path, "a.csv", AZURE_HEADER + "\n".join(rows) + "\n")
    error = both(capsys, path, line=5, words=("sorted", "line 4"))
    assert "5 s before" in str(error)


def test_mooncake_unsorted_timestamps_name_the_later_line(tmp_path, capsys):
    text = "\n".join([mooncake_row(0), mooncake_row(500), mooncake_row(400), mooncake_row(900)]) + "\n"
    path = write(tmp_path, "m.jsonl", text)
    both(capsys, path, line=3, words=("sorted", "line 2"))


def test_row_earlier_than_the_first_is_reported_as_unsorted(tmp_path, capsys):
    rows = ["2023-11-16 18:15:50.0000000,10,10", "2023-11-16 18:15:40.0000000,11,11"]
    path = write(tmp_path, "a.csv", AZURE_HEADER + "\n".join(rows) + "\n")
    both(capsys, path, line=3, words=("sorted",))


# --------------------------------------------------------------------- row shape
def test_row_with_too_many_fields(tmp_path, capsys):
    rows = azure_rows(5).splitlines(keepends=True)
    rows[2] = rows[2].rstrip("\n") + ",99\n"  # line 4
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    both(capsys, path, line=4, words=("expected 3 fields", "found 4"))


def test_short_row_in_the_middle_is_an_error(tmp_path, capsys):
    rows = azure_rows(5).splitlines(keepends=True)
    rows[1] = rows[1].rsplit(",", 1)[0] + "\n"  # line 3 has 2 fields
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    both(capsys, path, line=3, words=("expected 3 fields", "found 2"))


def test_short_last_row_ending_in_newline_is_an_error_not_a_repair(tmp_path, capsys):
    rows = azure_rows(4)
    text = AZURE_HEADER + rows + "2023-11-16 18:20:00.0000000,55\n"  # complete line, short row: line 6
    path = write(tmp_path, "a.csv", text)
    both(capsys, path, line=6, words=("expected 3 fields", "found 2"))


def test_blank_lines_are_skipped_and_lines_still_counted(tmp_path, capsys):
    rows = azure_rows(4).splitlines(keepends=True)
    rows.insert(2, "\n")  # blank line 4; rows now on lines 2, 3, 5, 6
    stamp, _, output = rows[4].rstrip("\n").split(",")
    rows[4] = f"{stamp},x,{output}\n"  # line 6
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    both(capsys, path, line=6, words=("ContextTokens", "text that is not one"))


def test_mooncake_json_array_instead_of_object(tmp_path, capsys):
    text = "\n".join([mooncake_row(0), "[1, 2, 3]", mooncake_row(30)]) + "\n"
    both(capsys, write(tmp_path, "m.jsonl", text), line=2, words=("JSON object", "list"), fmt="mooncake")


# --------------------------------------------------------------------- truncated last line
def _truncated_azure(tmp_path):
    text = AZURE_HEADER + azure_rows(4) + "2023-11-16 18:20:00.0000000,5"  # no newline: line 6 cut
    return write(tmp_path, "a.csv", text)


def _truncated_mooncake(tmp_path):
    text = "\n".join(mooncake_row(t * 10) for t in range(4)) + "\n" + mooncake_row(40)[:25]  # line 5 cut
    return write(tmp_path, "m.jsonl", text)


@pytest.mark.parametrize(
    "make, line, rows, words",
    [
        (_truncated_azure, 6, 4, ("cut off", "2 of 3 fields", "dropped")),
        (_truncated_mooncake, 5, 4, ("cut off", "JSON", "dropped")),
    ],
    ids=["azure-short-row", "mooncake-incomplete-json"],
)
def test_truncated_last_line_is_repaired_with_a_warning(tmp_path, capsys, make, line, rows, words):
    path = make(tmp_path)
    with pytest.warns(TraceWarning) as record:
        trace = load_trace(path)
    assert len(trace) == rows
    messages = [str(w.message) for w in record if issubclass(w.category, TraceWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:{line}: "), messages
    for word in words:
        assert word.lower() in messages[0].lower()

    # command line: one warning line, statistics printed, exit 0
    code, out, err = cli_run(capsys, path, "--json")
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith(f"pagesim trace: warning: {path}:{line}: "), err
    assert json.loads(out)["requests"] == rows

    # --strict: the repair is refused as one error line
    message = cli_error(capsys, path, "--strict", line=line, words=("cut off", "--strict"))
    assert "warning" not in message.lower()


def test_incomplete_json_in_the_middle_is_not_repaired(tmp_path, capsys):
    lines = [mooncake_row(t * 10) for t in range(5)]
    lines[2] = lines[2][:30]  # line 3 cut, but more lines follow
    path = write(tmp_path, "m.jsonl", "\n".join(lines))  # no final newline either
    both(capsys, path, line=3, words=("not valid JSON",))


def test_incomplete_json_last_line_ending_in_newline_is_not_repaired(tmp_path, capsys):
    text = "\n".join(mooncake_row(t * 10) for t in range(3)) + "\n" + mooncake_row(30)[:20] + "\n"
    both(capsys, write(tmp_path, "m.jsonl", text), line=4, words=("not valid JSON",))


def test_invalid_json_in_the_middle(tmp_path, capsys):
    lines = [mooncake_row(t * 10) for t in range(6)]
    lines[3] = '{"timestamp": 30, "input_length": 600,, "output_length": 10}'
    path = write(tmp_path, "m.jsonl", "\n".join(lines) + "\n")
    both(capsys, path, line=4, words=("not valid JSON", "column"))


# --------------------------------------------------------------------- empty / absent
@pytest.mark.parametrize("fmt", [None, "azure", "mooncake"])
@pytest.mark.parametrize("text", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_file(tmp_path, capsys, fmt, text):
    path = write(tmp_path, "empty.csv", text)
    both(capsys, path, line=None, words=("empty file",), fmt=fmt)


@pytest.mark.parametrize("fmt", [None, "azure"])
def test_header_only_file(tmp_path, capsys, fmt):
    path = write(tmp_path, "a.csv", AZURE_HEADER)
    both(capsys, path, line=None, words=("no requests", "only a header"), fmt=fmt)


def test_burstgpt_header_only_file(tmp_path, capsys):
    path = write(tmp_path, "b.csv", BURSTGPT_HEADER)
    both(capsys, path, line=None, words=("no requests",))


@pytest.mark.parametrize("fmt", [None, "azure", "mooncake", "pagesim"])
def test_nonexistent_path(tmp_path, capsys, fmt):
    path = tmp_path / "nowhere" / "trace.csv"
    both(capsys, path, line=None, words=("no such file",), fmt=fmt)


@pytest.mark.parametrize("fmt", [None, "azure", "mooncake"])
def test_directory_instead_of_a_file(tmp_path, capsys, fmt):
    path = tmp_path / "a_folder"
    path.mkdir()
    both(capsys, path, line=None, words=("directory",), fmt=fmt)


# --------------------------------------------------------------------- Mooncake hash_ids
@pytest.mark.parametrize(
    "input_length, ids, expected",
    [(600, [0], 2), (600, [0, 1, 2], 2), (512, [0, 1], 1), (513, [0], 2), (100, [], 1)],
)
def test_mooncake_hash_ids_count(tmp_path, capsys, input_length, ids, expected):
    text = "\n".join([mooncake_row(0), mooncake_row(10, input_length=input_length, hash_ids=ids),
                      mooncake_row(20)]) + "\n"
    path = write(tmp_path, "m.jsonl", text)
    error = both(capsys, path, line=2, words=("hash_ids", f"input_length {input_length}"), fmt="mooncake")
    assert f"= {expected}" in str(error) and f"{len(ids)} ids" in str(error)


def test_mooncake_hash_ids_count_boundaries_accepted(tmp_path):
    text = "\n".join([
        mooncake_row(0, input_length=1, hash_ids=[7]),
        mooncake_row(1, input_length=512, hash_ids=[7]),
        mooncake_row(2, input_length=513, hash_ids=[7, 8]),
        mooncake_row(3, input_length=1024, hash_ids=[7, 8]),
    ]) + "\n"
    trace = load_trace(write(tmp_path, "m.jsonl", text))
    assert [len(trace.prefix_ids(i)) for i in range(4)] == [1, 1, 2, 2]


@pytest.mark.parametrize(
    "ids",
    [["a", "b"], [0, 1.5], [0, -1], [True, False], "0,1", [[0], [1]], None],
    ids=["strings", "float", "negative", "bools", "string", "nested", "null"],
)
def test_mooncake_hash_ids_not_integers(tmp_path, capsys, ids):
    text = "\n".join([mooncake_row(0), mooncake_row(10), mooncake_row(20, hash_ids=ids)]) + "\n"
    path = write(tmp_path, "m.jsonl", text)
    both(capsys, path, line=3, words=("hash_ids", "non-negative integers"), fmt="mooncake")


# --------------------------------------------------------------------- gzip
def test_gzip_files_load_like_plain_ones(tmp_path, capsys):
    azure_text = AZURE_HEADER + azure_rows(20)
    mooncake_text = "\n".join(mooncake_row(t * 7, input_length=100 + 50 * t) for t in range(20)) + "\n"
    for name, text in (("a.csv", azure_text), ("m.jsonl", mooncake_text)):
        plain = write(tmp_path, name, text)
        packed = tmp_path / f"{name}.gz"
        packed.write_bytes(gzip.compress(text.encode(), mtime=0))
        a, b = load_trace(plain), load_trace(packed)
        for column in ("arrival_s", "prompt_len", "output_len"):
            assert np.array_equal(getattr(a, column), getattr(b, column))
        assert a.has_prefix_ids == b.has_prefix_ids
        code, out, err = cli_run(capsys, packed, "--json")
        assert code == 0 and err == [] and json.loads(out)["requests"] == 20


def test_gzip_errors_are_still_named_by_line(tmp_path, capsys):
    rows = azure_rows(5).splitlines(keepends=True)
    rows[3] = rows[3].replace(",103,", ",-103,")  # line 5
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress((AZURE_HEADER + "".join(rows)).encode(), mtime=0))
    both(capsys, path, line=5, words=("ContextTokens", ">= 1"))


def _gzip_payload() -> bytes:
    text = AZURE_HEADER + azure_rows(2000)
    return gzip.compress(text.encode(), mtime=0)


@pytest.mark.parametrize("fmt", [None, "azure"])
@pytest.mark.parametrize("damage", ["not-gzip", "truncated", "crc"])
def test_corrupt_gzip_gives_a_clean_error(tmp_path, capsys, damage, fmt):
    data = _gzip_payload()
    if damage == "not-gzip":
        data = b"this is not gzip data at all\n" * 10
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # flip the stored CRC32 (the trailer's first 4 bytes)
        data = data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]
    path = tmp_path / "a.csv.gz"
    path.write_bytes(data)
    both(capsys, path, line=None, fmt=fmt, words=("cannot read",))


@pytest.mark.parametrize("fmt", [None, "azure"])
def test_corrupt_deflate_stream_gives_a_clean_error(tmp_path, capsys, fmt):
    data = bytearray(_gzip_payload())
    data[10] = 0x07  # first deflate block header: BFINAL=1, BTYPE=11 (reserved, invalid)
    path = tmp_path / "a.csv.gz"
    path.write_bytes(bytes(data))
    both(capsys, path, line=None, fmt=fmt, words=("cannot read",))


# --------------------------------------------------------------------- BurstGPT
BURSTGPT_ROWS = [
    "5,ChatGPT,100,20,120,Conversation log",  # line 2
    "6,GPT-4,50,0,50,Conversation log",  # line 3: failed
    "7,ChatGPT,30,0,30,API log",  # line 4: failed
    "8,ChatGPT,10,5,15,API log",  # line 5
    "9,GPT-4,40,8,48,API log",  # line 6
    "12,ChatGPT,70,9,79,Conversation log",  # line 7
]


@pytest.fixture
def burstgpt(tmp_path):
    return write(tmp_path, "BurstGPT_1.csv", BURSTGPT_HEADER + "\n".join(BURSTGPT_ROWS) + "\n")


@pytest.mark.parametrize(
    "model, log_type, failed, first_failed, prompts, arrivals",
    [
        (None, None, 2, 3, [100, 10, 40, 70], [0, 3, 4, 7]),
        ("ChatGPT", None, 1, 4, [100, 10, 70], [0, 3, 7]),
        ("GPT-4", None, 1, 3, [40], [0]),
        (None, "API log", 1, 4, [10, 40], [0, 1]),
        (None, "Conversation log", 1, 3, [100, 70], [0, 7]),
        ("ChatGPT", "Conversation log", 0, None, [100, 70], [0, 7]),
        ("ChatGPT", "API log", 1, 4, [10], [0]),
    ],
)
def test_burstgpt_failed_rows_and_filters(burstgpt, capsys, model, log_type, failed, first_failed, prompts, arrivals):
    with pytest.warns(TraceWarning) if failed else _no_trace_warnings() as record:
        trace = load_trace(burstgpt, model=model, log_type=log_type)
    assert trace.prompt_len.tolist() == prompts
    assert trace.arrival_s.tolist() == arrivals
    assert trace.metadata["failed_rows"] == failed
    assert trace.metadata["model"] == model and trace.metadata["log_type"] == log_type
    messages = [str(w.message) for w in record if issubclass(w.category, TraceWarning)]
    if failed:
        assert len(messages) == 1
        assert messages[0].startswith(f"{burstgpt}: dropped {failed} failed request(s)"), messages
        assert f"line {first_failed}" in messages[0]
    else:
        assert messages == []

    flags = []
    if model:
        flags += ["--burstgpt-model", model]
    if log_type:
        flags += ["--burstgpt-log-type", log_type]
    code, out, err = cli_run(capsys, burstgpt, "--json", *flags)
    assert code == 0, err
    stats = json.loads(out)
    assert stats["requests"] == len(prompts) and stats["failed_rows"] == failed
    if failed:
        assert len(err) == 1 and err[0].startswith(f"pagesim trace: warning: {burstgpt}: dropped {failed} "), err
        cli_error(capsys, burstgpt, "--json", "--strict", *flags, line=None, words=("dropped", "--strict"))
    else:
        assert err == []


class _no_trace_warnings:
    """Context manager recording warnings (like pytest.warns) but requiring none."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        record = self._catch.__enter__()
        warnings.simplefilter("always")
        return record

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


@pytest.mark.parametrize(
    "model, log_type, words",
    [
        ("Claude", None, ("no row has Model 'Claude'", "ChatGPT", "GPT-4")),
        (None, "Batch log", ("no row has Log Type 'Batch log'", "API log", "Conversation log")),
        ("chatgpt", None, ("no row has Model 'chatgpt'",)),  # exact, case-sensitive match
    ],
)
def test_burstgpt_filter_matching_nothing(burstgpt, capsys, model, log_type, words):
    with pytest.raises(TraceFormatError) as info:
        load_trace(burstgpt, model=model, log_type=log_type)
    assert str(info.value).startswith(f"{burstgpt}: ")
    for word in words:
        assert word in str(info.value)
    flags = ["--burstgpt-model", model] if model else ["--burstgpt-log-type", log_type]
    cli_error(capsys, burstgpt, *flags, line=None, words=words)


def test_burstgpt_filters_leaving_only_failed_rows(burstgpt, capsys):
    # GPT-4 conversation rows exist, but the only one failed
    with pytest.warns(TraceWarning, match="dropped 1 failed"):
        with pytest.raises(TraceFormatError, match="no requests left") as info:
            load_trace(burstgpt, model="GPT-4", log_type="Conversation log")
    assert str(info.value).startswith(f"{burstgpt}: ")
    code, out, err = cli_run(capsys, burstgpt, "--burstgpt-model", "GPT-4", "--burstgpt-log-type",
                             "Conversation log")
    # the repair is reported, then the refusal: one error line, last, no traceback
    assert code == 2 and out == ""
    assert len(err) == 2, err
    assert err[0].startswith(f"pagesim trace: warning: {burstgpt}: dropped 1 failed"), err
    assert err[1] == f"pagesim trace: error: {info.value}"


def test_burstgpt_filter_on_another_format_is_refused(tmp_path, capsys):
    path = write(tmp_path, "a.csv", AZURE_HEADER + azure_rows(3))
    with pytest.raises(ValueError, match="BurstGPT"):
        load_trace(path, model="ChatGPT")
    code, _, err = cli_run(capsys, path, "--burstgpt-model", "ChatGPT")
    assert code == 2 and len(err) == 1 and err[0].startswith("pagesim trace: error: ")


def test_burstgpt_bad_number_names_its_line(tmp_path, capsys):
    rows = list(BURSTGPT_ROWS)
    rows[3] = "8,ChatGPT,ten,5,15,API log"  # line 5
    path = write(tmp_path, "b.csv", BURSTGPT_HEADER + "\n".join(rows) + "\n")
    error = both(capsys, path, line=5, words=("Request tokens", "text that is not one"))
    assert "ten" not in str(error).removeprefix(str(path))  # described, not quoted


# --------------------------------------------------------------------- Azure timestamps
def test_azure_seven_fractional_digits(tmp_path):
    stamps = [
        "2023-11-16 18:15:46.6805900",
        "2023-11-16 18:15:46.6805919",  # the 7th digit is 100 ns: +1.9 us
        "2023-11-16 18:15:50.9951690",
        "2023-11-16 18:32:49.8038100",
        "2023-11-17 00:00:00.0000001",  # across midnight
    ]
    text = AZURE_HEADER + "".join(f"{s},{10 + i},{20 + i}\n" for i, s in enumerate(stamps))
    trace = load_trace(write(tmp_path, "a.csv", text))
    expected_ns = [0, 1_900, 4_314_579_000, 1_023_123_220_000, 20_653_319_410_100]
    assert trace.arrival_s.tolist() == [ns / 1e9 for ns in expected_ns]
    # the same instants from Python's datetime (microseconds) plus the seventh digit
    first = datetime.fromisoformat(stamps[0][:-1])

    def ns_after_first(stamp: str) -> int:
        micro = (datetime.fromisoformat(stamp[:-1]) - first) // timedelta(microseconds=1)
        return micro * 1000 + (int(stamp[-1]) - int(stamps[0][-1])) * 100

    assert [ns_after_first(s) for s in stamps] == expected_ns
    assert trace.prompt_len.tolist() == [10, 11, 12, 13, 14]
    assert trace.output_len.tolist() == [20, 21, 22, 23, 24]


def test_azure_timestamps_without_fraction_parse(tmp_path):
    text = AZURE_HEADER + "2023-11-16 18:15:46,1,1\n2023-11-16 18:15:47.5,1,1\n2023-11-16 18:15:49,1,1\n"
    assert load_trace(write(tmp_path, "a.csv", text)).arrival_s.tolist() == [0.0, 1.5, 3.0]


@pytest.mark.parametrize(
    "stamp, words",
    [
        ("2023-11-16 25:61:00.0000000", ("TIMESTAMP", "expected a date and time")),
        ("yesterday", ("TIMESTAMP", "found text that is not one")),
        ("", ("TIMESTAMP",)),
    ],
    ids=["impossible-time", "words", "empty"],
)
def test_azure_bad_timestamp_names_its_line(tmp_path, capsys, stamp, words):
    rows = azure_rows(6).splitlines(keepends=True)
    _, prompt, output = rows[4].rstrip("\n").split(",")
    rows[4] = f"{stamp},{prompt},{output}\n"  # line 6
    path = write(tmp_path, "a.csv", AZURE_HEADER + "".join(rows))
    both(capsys, path, line=6, words=words)


# --------------------------------------------------------------------- the real Azure trace, damaged
SHARED_AZURE = SHARED / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def test_shared_azure_trace_with_one_corrupted_line(tmp_path, capsys):
    if not SHARED_AZURE.exists():
        pytest.skip(f"{SHARED_AZURE} is not here (shared traces absent)")
    copy = tmp_path / SHARED_AZURE.name
    shutil.copyfile(SHARED_AZURE, copy)
    code, out, err = cli_run(capsys, copy, "--json")
    assert code == 0 and err == [], err  # the intact copy loads

    lines = copy.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) > 5000
    stamp, context, _ = lines[4999].rstrip("\r\n").split(",")
    lines[4999] = f"{stamp},{context},abc\n"  # file line 5000
    copy.write_text("".join(lines), encoding="utf-8")

    message = cli_error(capsys, copy, "--json", line=5000, words=("GeneratedTokens", "text that is not one"))
    assert f"{copy}:5000:" in message


def test_csv_cut_right_after_a_comma_is_repaired(tmp_path):
    """A last line cut off just after a delimiter has every field but an empty last one."""
    path = write(tmp_path, "a.csv", AZURE_HEADER + azure_rows(3) + "2023-11-16 18:20:00.0000000,374,")
    with pytest.warns(TraceWarning, match=r"a\.csv:5: last line is cut off \(2 of 3 fields\)"):
        trace = load_trace(path)
    assert len(trace) == 3


def test_csv_empty_last_field_with_a_newline_is_an_error(tmp_path, capsys):
    path = write(tmp_path, "a.csv", AZURE_HEADER + azure_rows(3) + "2023-11-16 18:20:00.0000000,374,\n")
    both(capsys, path, line=5, words=("GeneratedTokens", "expected a number"))


@pytest.mark.parametrize(
    "name, text, missing",
    [
        ("a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", "GeneratedTokens"),
        ("b.csv", "Timestamp,Model,Request tokens,Log Type\n1,ChatGPT,3,Conversation log\n", "Response tokens"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n', "output_length"),
    ],
)
def test_detection_names_the_missing_column_of_a_recognised_format(tmp_path, capsys, name, text, missing):
    """Most of a format's columns are enough to recognise it, so the one missing is named."""
    path = write(tmp_path, name, text)
    both(capsys, path, line=1, words=(missing,))


def test_burstgpt_rows_with_no_request_tokens_are_dropped_and_reported(tmp_path):
    rows = ["5,ChatGPT,12,30,42,Conversation log", "6,ChatGPT,0,30,30,Conversation log",
            "7,ChatGPT,9,0,9,Conversation log", "8,GPT-4,4,4,8,API log"]
    path = write(tmp_path, "b.csv", BURSTGPT_HEADER + "\n".join(rows) + "\n")
    with pytest.warns(TraceWarning) as caught:
        trace = load_trace(path)
    messages = [str(w.message) for w in caught]
    assert any("1 failed request(s)" in m and "line 4" in m for m in messages)
    assert any("1 request(s) with 0 request tokens" in m and "line 3" in m for m in messages)
    assert trace.prompt_len.tolist() == [12, 4]
    assert trace.metadata["failed_rows"] == 1 and trace.metadata["empty_prompt_rows"] == 1



def test_blank_and_whitespace_lines_before_the_header(tmp_path, capsys):
    # two blank lines, the header on line 3, rows from line 4: the bad row is line 5
    path = write(tmp_path, "a.csv", "\n  \n" + AZURE_HEADER + azure_rows(3).replace(",101,", ",x,"))
    both(capsys, path, line=5, words=("ContextTokens", "expected a number"))
    path = write(tmp_path, "b.csv", "\n\nalpha,beta\n1,2\n")
    both(capsys, path, line=3, words=("cannot tell",))  # the header's own line


def test_a_used_column_named_twice_is_refused(tmp_path, capsys):
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                 "2023-11-16 18:15:46.6805900,1,2,3\n")
    both(capsys, path, line=1, words=("'ContextTokens' appears 2 times",))
    ok = write(tmp_path, "b.csv", AZURE_HEADER.strip() + ",x,x\n" + "2023-11-16 18:15:46.6805900,1,2,a,b\n")
    assert len(load_trace(ok)) == 1  # unused duplicates do not matter


def test_gzip_is_recognised_by_content_not_name(tmp_path):
    data = gzip.compress((AZURE_HEADER + azure_rows(4)).encode(), mtime=0)
    (tmp_path / "trace.csv").write_bytes(data)
    assert len(load_trace(tmp_path / "trace.csv")) == 4


def test_a_float_arrival_too_large_for_float64_is_an_error_line(tmp_path, capsys):
    path = write(tmp_path, "a.csv", "arrival_s,prompt_len,output_len\n0,10,10\n" + "9" * 400 + ",10,10\n")
    both(capsys, path, line=3, words=("arrival_s", "finite"))
