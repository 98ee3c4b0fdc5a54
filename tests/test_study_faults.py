"""A study under faults: killed, terminated, its results corrupted, its disk full.

Each test drives the installed ``pagesim`` in its own session, as a user's shell would, and checks
what the issue asks of the command after the fault:

- ``kill -9`` of the main process: no worker outlives it (the pids it had started, and anything in
  its process group, are gone within seconds), and the same command then resumes and finishes with
  every run of ``study.json`` exactly once, ``ok``, in ``results.jsonl``;
- SIGTERM: exit 143 with one line saying so, the finished runs kept, no worker left;
- a corrupt line in the middle of ``results.jsonl``: the report builds (with a warning) and leaves
  the file alone; the study sets the line aside in ``results.rejected.jsonl`` with its number and
  reruns that run;
- a full filesystem (a small tmpfs; root only, skipped otherwise) under ``report -o``/``--html`` or
  the study folder: one error line, and no temporary file left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.bad_inputs_harness import ENV, PAGESIM
from tests.processes import assert_none_left, descendants

pytestmark = pytest.mark.slow  # about a minute on two cores: studies of a few seconds, killed and resumed

# 8 runs of about a second each: two workers are busy for several seconds, long enough to kill mid-study
KILLABLE = """\
name = "faults"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 300
[base]
kv_cache_gb = 1.0
[[grid]]
block_size = [8, 16]
eviction = ["lru", "fifo"]
preemption = ["recompute", "swap"]
"""
QUICK = KILLABLE.replace("num_requests = 300", "num_requests = 40").replace('["lru", "fifo"]', '["lru"]')


def pagesim(*args: str, cwd: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*PAGESIM, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def start_study(spec: Path, out: Path) -> subprocess.Popen:
    """``pagesim study SPEC -o OUT --workers 2`` in its own session (its group is ours to search and clean)."""
    return subprocess.Popen([*PAGESIM, "study", str(spec), "-o", str(out), "--workers", "2", "--no-progress"],
                            cwd=spec.parent, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_records(proc: subprocess.Popen, results: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.fail(f"the study ended (exit {proc.returncode}) before it could be interrupted: "
                    f"{proc.communicate()[1][-3000:]}")
    pytest.fail(f"no {count} run record(s) in {results} after {timeout_s} s")


def message_lines(stderr: str) -> list[str]:
    """stderr's non-empty lines that are not pagesim warnings."""
    return [line for line in stderr.splitlines()
            if line.strip() and not re.match(r"^pagesim [\w-]+: warning: ", line)]


def records(results: Path, *, torn_end_ok: bool = False) -> list[dict]:
    """Every line of ``results`` as JSON; ``torn_end_ok`` leaves out a last line without its newline
    (a kill can cut the write of the run record in flight)."""
    lines = results.read_text().split("\n")
    if lines[-1] and not torn_end_ok:
        raise AssertionError(f"{results} ends in a line cut short: {lines[-1][:200]!r}")
    return [json.loads(line) for line in lines[:-1]]


def run_ids(out: Path) -> list[str]:
    return json.loads((out / "study.json").read_text())["run_ids"]


def _cleanup(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait()


# ----------------------------------------------------------------------------- kill -9, SIGTERM
def test_kill_9_of_the_main_process_then_the_same_command_resumes(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(KILLABLE)
    out = tmp_path / "study"
    proc = start_study(spec, out)
    try:
        wait_for_records(proc, out / "results.jsonl", 1)
        workers = descendants(proc.pid)
        assert workers, "the study runs no worker processes"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert_none_left(workers, proc.pid)
    finally:
        _cleanup(proc)
    before = {r["id"]: r for r in records(out / "results.jsonl", torn_end_ok=True)}
    ids = run_ids(out)
    assert 1 <= len(before) < len(ids)

    done = pagesim("study", str(spec), "-o", str(out), "--workers", "2", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    after = records(out / "results.jsonl")
    assert Counter(r["id"] for r in after) == Counter(ids), "every run exactly once"
    assert all(r["status"] == "ok" for r in after), [r.get("error") for r in after if r["status"] != "ok"]
    assert all(before[i] == next(r for r in after if r["id"] == i) for i in before), "finished runs kept, not redone"
    assert f"{len(ids)} runs ({len(before)} from before, {len(ids) - len(before)} now, 0 failed)" in done.stdout


def test_sigterm_exits_143_with_one_line_and_keeps_finished_runs(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(KILLABLE)
    out = tmp_path / "study"
    proc = start_study(spec, out)
    try:
        wait_for_records(proc, out / "results.jsonl", 1)
        workers = descendants(proc.pid)
        kept_before = (out / "results.jsonl").read_bytes().count(b"\n")
        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as `kill PID` does
        stdout, stderr = proc.communicate(timeout=60)
        assert_none_left(workers, proc.pid)
    finally:
        _cleanup(proc)
    assert proc.returncode == 143, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr
    lines = message_lines(stderr)
    assert len(lines) == 1 and "terminated" in lines[0], stderr[-3000:]
    assert stdout.strip() == ""
    kept = records(out / "results.jsonl")
    assert len(kept) >= kept_before and all(r["status"] == "ok" for r in kept)
    assert {r["id"] for r in kept} <= set(run_ids(out))


# ----------------------------------------------------------------------------- a corrupt middle line
def test_a_corrupt_middle_line_is_set_aside_and_its_run_done_again(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(QUICK)
    out = tmp_path / "study"
    first = pagesim("study", str(spec), "-o", str(out), "--workers", "1", "--no-progress", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    results = out / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    assert len(lines) == 4
    damaged_id = json.loads(lines[1])["id"]
    lines[1] = lines[1][:120] + b"\x00\x00#garbled#" + lines[1][-80:]  # still one line; no longer JSON
    results.write_bytes(b"".join(lines))
    corrupt = results.read_bytes()

    report = pagesim("report", str(out), "-o", str(tmp_path / "report.pdf"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Traceback" not in report.stderr
    assert re.search(r"results\.jsonl(:2\b|.*\bline 2\b)", report.stderr), report.stderr[-3000:]
    assert (tmp_path / "report.pdf").stat().st_size > 0
    assert results.read_bytes() == corrupt, "the report changed the results file"

    again = pagesim("study", str(spec), "-o", str(out), "--workers", "1", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert "4 runs (3 from before, 1 now, 0 failed)" in again.stdout, again.stdout
    rejected = [json.loads(line) for line in (out / "results.rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2], rejected
    assert "garbled" in json.dumps(rejected)
    after = records(results)
    assert Counter(r["id"] for r in after) == Counter(run_ids(out))
    assert all(r["status"] == "ok" for r in after) and damaged_id in {r["id"] for r in after}

    clean = pagesim("report", str(out), "--html", str(tmp_path / "report.html"), cwd=tmp_path)
    assert clean.returncode == 0 and "results.jsonl" not in clean.stderr, clean.stderr[-3000:]


# ----------------------------------------------------------------------------- a full filesystem
@contextmanager
def small_tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path``; the test is skipped where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> Path:
    from pagesim.reports.execute import run_study
    from pagesim.reports.spec import parse_spec

    out = tmp_path_factory.mktemp("faults") / "study"
    run_study(parse_spec(QUICK), out, workers=1, progress=False)
    return out


def one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode > 0, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = message_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"pagesim {command}: error: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("flag, name", [("-o", "report.pdf"), ("--html", "report.html")])
def test_report_onto_a_full_disk_is_one_line_and_leaves_nothing(finished_study, tmp_path, flag, name):
    with small_tmpfs(tmp_path / "full", "64k") as full:
        done = pagesim("report", str(finished_study), flag, str(full / name), cwd=tmp_path)
        line = one_error_line(done, "report")
        assert name in line and "no space left on device" in line.lower(), line
        assert sorted(os.listdir(full)) == [], "left on the full disk"


def test_study_onto_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(QUICK.replace("num_requests = 40", "num_requests = 60"))
    with small_tmpfs(tmp_path / "full", "48k") as full:
        proc = start_study(spec, full / "study")
        try:
            stdout, stderr = proc.communicate(timeout=120)
            assert_none_left({}, proc.pid)
        finally:
            _cleanup(proc)
        line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), "study")
        assert str(full / "study") in line and "no space left on device" in line.lower(), line
        leftovers = [p.name for p in (full / "study").iterdir() if ".tmp" in p.name]
        assert not leftovers, leftovers
