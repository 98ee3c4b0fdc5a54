"""A study's results survive corruption: a bad line anywhere is set aside (study) or skipped (report)
with its line number, its run counts as not run, and a write that fails leaves nothing torn."""

from __future__ import annotations

import errno
import base64
import json
import os
import warnings

import pytest

from pagesim.reports.execute import run_study
from pagesim.reports.pdf import build_report
from pagesim.reports.results import load_study
from pagesim.reports.run_config import run_id
from pagesim.reports.spec import parse_spec
from pagesim.reports.store import ResultsStore, ResultsWarning, parse_record

TINY = """
name = "tiny"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 12
[base]
kv_cache_gb = 1.0
[[grid]]
block_size = [8, 16]
eviction = ["lru", "fifo"]
"""


def record(name: str, **extra) -> dict:
    config = {"name": name}
    return {"id": run_id(config), "config": config, "status": "ok", "summary": {"x": 1}, **extra}


def line(rec: dict) -> bytes:
    return (json.dumps(rec, sort_keys=True) + "\n").encode()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-run study (the bytes of its results file, and its folder)."""
    out = tmp_path_factory.mktemp("tiny") / "study"
    run_study(parse_spec(TINY), out, workers=1, progress=False)
    return out


def copy_study(src, dst):
    dst.mkdir()
    for name in ("study.json", "results.jsonl"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


# ----------------------------------------------------------------------------- what is rejected, and why
BAD_LINES = {
    "nul": (b'{"id": "a\x00b"}', "NUL bytes"),
    "nul-only": (b"\x00\x00\x00\x00", "NUL bytes"),  # (json.loads would guess UTF-32 and fail without a line)
    "latin-1": ('{"id": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
    "not-json": (b"garbage", "not JSON"),
    "array": (b"[1, 2]", "a JSON list, not a run record"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    "huge-int": (b'{"id": ' + b"9" * 5000 + b"}", "not JSON"),
    "no-id": (json.dumps({"config": {}, "status": "ok", "summary": {}}).encode(), "no run id"),
    "no-config": (json.dumps({"id": "a", "status": "ok", "summary": {}}).encode(), "no config"),
    "bad-status": (json.dumps({**record("a"), "status": "done"}).encode(), 'status "done", not one of ok, error'),
    "ok-without-summary": (json.dumps({k: v for k, v in record("a").items() if k != "summary"}).encode(),
                           "status ok without a summary"),
    "ok-summary-null": (json.dumps({**record("a"), "summary": None}).encode(), "status ok without a summary"),
    "error-without-error": (json.dumps({**record("a"), "status": "error"}).encode(), "status error without the error"),
    "id-mismatch": (json.dumps({**record("a"), "id": "0123456789abcdef"}).encode(),
                    '"0123456789abcdef" is not its config\'s'),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_each_kind_of_bad_line_is_rejected_with_why(name):
    text, why = BAD_LINES[name]
    rec, problem = parse_record(text)
    assert rec is None and why in problem, problem
    assert len(problem) < 120  # one short phrase, no excerpt of the line


def test_a_valid_record_passes():
    rec = record("a", status="error", error="ValueError: x")
    del rec["summary"]
    assert parse_record(line(rec)[:-1]) == (rec, None)


@pytest.mark.parametrize("name", ["nul", "ok-without-summary", "id-mismatch"])
def test_a_bad_middle_line_is_set_aside_and_the_rest_kept(tmp_path, name):
    a, c = record("a"), record("c")
    store = ResultsStore(tmp_path / "results.jsonl")
    store.path.write_bytes(line(a) + BAD_LINES[name][0] + b"\n" + line(c) + b'{"id": "d", "sta')  # + a torn last line
    with pytest.warns(ResultsWarning, match=rf"results\.jsonl:2: .*set aside in results\.rejected\.jsonl"):
        assert store.load() == {a["id"]: a, c["id"]: c}
    assert store.path.read_bytes() == line(a) + line(c)  # rewritten clean (the torn tail dropped too)
    [aside] = [json.loads(x) for x in store.rejected_path.read_text().splitlines()]
    assert aside["line"] == 2 and BAD_LINES[name][1] in aside["problem"]
    assert aside["text"].encode("utf-8") == BAD_LINES[name][0]  # the line whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the next load is clean: no warning
        assert list(store.load()) == [a["id"], c["id"]]
    assert not list(tmp_path.glob("*.tmp"))


def test_reading_without_repair_skips_and_writes_nothing(tmp_path):
    a = record("a")
    store = ResultsStore(tmp_path / "results.jsonl")
    data = b"junk 1\n" + line(a) + b"junk 2\n\x00\n[]\n" + b"{}\n"
    store.path.write_bytes(data)
    with pytest.warns(ResultsWarning) as caught:
        assert store.load(repair=False) == {a["id"]: a}
    [warning] = caught
    message = str(warning.message)
    assert message.startswith(f"{store.path}: 5 lines are not run records (line 1: not JSON")
    assert "; and 2 more" in message and "skipped" in message and "\n" not in message
    assert store.path.read_bytes() == data and not store.rejected_path.exists()


def test_a_rejected_line_is_kept_whole_as_text_or_bytes(tmp_path):
    """It leaves results.jsonl, so results.rejected.jsonl holds all of it: a long line as text, a
    line that is not UTF-8 as its bytes."""
    store = ResultsStore(tmp_path / "results.jsonl")
    binary = b"\xff\xfe" + bytes(range(256))
    store.path.write_bytes(b"x" * 200_000 + b"\n" + binary.replace(b"\n", b"") + b"\n")
    with pytest.warns(ResultsWarning):
        assert store.load() == {}
    long, odd = [json.loads(x) for x in store.rejected_path.read_text().splitlines()]
    assert long["text"] == "x" * 200_000 and long["line"] == 1
    assert base64.b64decode(odd["bytes_base64"]) == binary.replace(b"\n", b"") and odd["line"] == 2


def test_a_fifo_or_device_is_refused_at_once(tmp_path):
    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"results\.jsonl: is a FIFO \(named pipe\), not a regular file"):
        ResultsStore(fifo).load(repair=False)
    fifo.unlink()
    fifo.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"results\.jsonl: is a device, not a regular file"):
        ResultsStore(fifo).load()


def test_an_append_onto_a_full_disk_leaves_no_torn_line(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path / "results.jsonl")
    store.append(record("a"))
    before = store.path.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):  # half the line reaches the disk, then the disk is full
        if len(data) > 8:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left on device") as caught:
        store.append(record("b"))
    monkeypatch.undo()
    assert caught.value.filename == str(store.path)
    assert store.path.read_bytes() == before


# ----------------------------------------------------------------------------- a study and its report
def test_a_corrupt_study_resumes_and_its_report_builds(finished, tmp_path):
    out = copy_study(finished, tmp_path / "study")
    results = out / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    assert len(lines) == 4
    damaged = json.loads(lines[1])
    lines[1] = lines[1][:100] + b"\x00\x00" + lines[1][-50:]  # NUL bytes in the middle: one line, not JSON
    no_summary = json.loads(lines[2])
    del no_summary["summary"]
    lines[2] = line(no_summary)  # an ok record without its summary is not complete
    results.write_bytes(b"".join(lines))
    corrupt = results.read_bytes()

    # the report: built from the two good runs, with a warning, the results file untouched
    with pytest.warns(ResultsWarning, match=r"2 lines are not run records \(line 2: NUL bytes.*; line 3: status ok"):
        study = load_study(out)
    assert len(study.records) == 2
    with pytest.warns(ResultsWarning):
        titles = build_report(out, tmp_path / "report.pdf", html=tmp_path / "report.html")
    assert "All runs" in titles and (tmp_path / "report.pdf").stat().st_size > 0
    assert results.read_bytes() == corrupt and not (out / "results.rejected.jsonl").exists()

    # the study: both lines set aside with their numbers, both runs done again
    with pytest.warns(ResultsWarning, match="set aside in results.rejected.jsonl"):
        outcome = run_study(parse_spec(TINY), out, workers=1, progress=False)
    assert (outcome.total, outcome.reused, outcome.ran, outcome.failed) == (4, 2, 2, 0)
    aside = [json.loads(x) for x in (out / "results.rejected.jsonl").read_text().splitlines()]
    assert [a["line"] for a in aside] == [2, 3]
    after = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(r["id"] for r in after) == sorted(json.loads((out / "study.json").read_text())["run_ids"])
    assert {damaged["id"], no_summary["id"]} <= {r["id"] for r in after if r["status"] == "ok" and r["summary"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResultsWarning)
        assert len(load_study(out).ok) == 4


@pytest.mark.parametrize("content, why", [
    (b"\xff\xfe{", "not UTF-8"),
    (b"{", "not JSON"),
    (b"[]", "a JSON list"),
    (b'{"run_ids": 3}', "no run_ids"),
    (b'{"run_ids": [[1]], "base": {}, "axes": {}, "source": {}, "name": "x"}', "run_ids holds"),
])
def test_a_bad_study_json_is_one_error_naming_it(tmp_path, content, why):
    (tmp_path / "study.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"study\.json: not a study description \({why}"):
        load_study(tmp_path)


def test_the_command_line_shows_the_warning_as_one_line(tmp_path, capsys):
    from pagesim.reports.store import ResultsWarning
    from pagesim.traces.source import reported_warnings

    store = ResultsStore(tmp_path / "results.jsonl")
    store.path.write_bytes(b"\x00\n" + line(record("a")))
    with reported_warnings("report", category=ResultsWarning):
        store.load(repair=False)
    assert capsys.readouterr().err == (f"pagesim report: warning: {store.path}:1: NUL bytes (first at character 0); "
                                       "skipped: its run counts as not run until `pagesim study` sets it aside and "
                                       "runs it again\n")
