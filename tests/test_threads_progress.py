"""torch's CPU threads (``pagesim.engine.threads``) and progress off a terminal (``pagesim.engine.progress``).

``--threads`` on ``run``, ``calibrate`` and ``validate``: one check (>= 1), the count torch is given
and reported (``threads`` in the JSON), and each command's default: ``run`` the usable CPUs less
the load, ``calibrate`` 1, ``validate`` the profile's. Progress: with stderr not a terminal (as
under pytest) each long command prints a line every ``pagesim.engine.progress.LINE_INTERVAL_S``, here
shortened; the tests assert that the lines appear, never when (the machines are shared).
"""

from __future__ import annotations

import functools
import io
import json
import re
import sys

import pytest

torch = pytest.importorskip("torch")

import pagesim.engine.progress as progress_module  # noqa: E402
import pagesim.engine.threads as threads_module  # noqa: E402
from pagesim.engine.cli import main  # noqa: E402
from pagesim.engine.progress import ProgressLines, progress  # noqa: E402
from tests.calibration_support import TINY_GRID, calibrate_tiny  # noqa: E402

RUN = ["run", "--model", "tiny", "--workload", "kwon2023-alpaca", "--num-requests", "16", "--block-size", "8",
       "--num-gpu-blocks", "64", "--json"]
VALIDATE = ["validate", "--workload", "kwon2023-alpaca", "--num-requests", "6", "--rate", "50", "--noise-runs", "0",
            "--no-reference", "--json"]
SHORT_INTERVAL_S = 1e-3


@pytest.fixture(autouse=True)
def torch_threads():
    """The commands set torch's threads in this process: put back what the test found."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def short_interval(monkeypatch):
    monkeypatch.setattr(progress_module, "LINE_INTERVAL_S", SHORT_INTERVAL_S)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("threads") / "profile.json"
    calibrate_tiny(out, warmup=0, repeats=1)
    return str(out)


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize("cpus, load, quota, omp, expected", [
    ({0, 1}, 5.0, None, None, 1),  # a machine others keep busy: one thread
    ({0, 1}, 0.4, None, None, 2),  # a quiet one: all its CPUs
    (set(range(8)), 2.6, None, None, 5),  # less the load, rounded
    (set(range(8)), 0.0, 2.5, None, 3),  # a cgroup quota of 2.5 CPUs: 3 may run
    (set(range(8)), 9.0, None, "3", 3),  # OMP_NUM_THREADS: the user said how many
    (set(range(8)), 0.0, None, "lots", 8),  # (not a count: ignored)
])
def test_the_default_is_the_usable_cpus_less_the_load(monkeypatch, cpus, load, quota, omp, expected):
    monkeypatch.setattr(threads_module.os, "sched_getaffinity", lambda pid: cpus)
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(threads_module, "_cgroup_cpu_quota", lambda: quota)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert threads_module.default_threads() == expected


def test_inter_op_threads_are_set_once_per_process_and_intra_op_threads_every_time(monkeypatch):
    calls = []
    monkeypatch.setattr(threads_module, "_interop_set", False)
    monkeypatch.setattr(torch, "set_num_interop_threads", calls.append)
    assert threads_module.set_threads(1) == 1 == torch.get_num_threads()
    assert threads_module.set_threads(2) == 2 == torch.get_num_threads()
    assert calls == [1]

    def too_late(n):  # what torch says once inter-op work has run
        raise RuntimeError("Error: cannot set number of interop threads after parallel work has started")

    monkeypatch.setattr(threads_module, "_interop_set", False)
    monkeypatch.setattr(torch, "set_num_interop_threads", too_late)
    assert threads_module.set_threads(1) == 1  # the intra-op count still applies


@pytest.mark.parametrize("command", [RUN, ["calibrate", "--device", "cpu"], ["validate", "--profile", "p.json"]])
def test_threads_below_one_are_refused_in_one_line(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--threads", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--threads must be >= 1, got 0" in err, err


def test_run_reports_the_threads_it_ran_with(monkeypatch, capsys):
    assert main([*RUN, "--threads", "1", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["threads"] == 1 == torch.get_num_threads()
    monkeypatch.setattr(threads_module, "default_threads", lambda: 2)  # (the load here is not the test's to choose)
    assert main([*RUN[:-1], "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "torch kernels, 2 CPU threads)" in out.splitlines()[0], out
    assert torch.get_num_threads() == 2


def test_validate_runs_with_the_profiles_threads(profile, capsys):
    assert main([*VALIDATE, "--profile", profile, "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["threads"] == 1 == torch.get_num_threads()  # calibrate_tiny's 1


def test_validate_warns_of_threads_other_than_the_profiles_and_strict_refuses_them(profile, monkeypatch, capsys):
    from types import SimpleNamespace

    from pagesim.reports.validation.cli import _set_threads

    given = []
    monkeypatch.setattr(threads_module, "set_threads", given.append)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    measured = SimpleNamespace(settings={"threads": 1})
    _set_threads(SimpleNamespace(threads=None, strict=False), measured, cpu)
    _set_threads(SimpleNamespace(threads=1, strict=True), measured, cpu)
    assert capsys.readouterr().err == "" and given == [1, 1]
    _set_threads(SimpleNamespace(threads=2, strict=False), measured, cpu)
    assert given[-1] == 2
    assert "pagesim validate: warning: --threads 2: the profile was measured with 1 CPU thread(s)" in \
        capsys.readouterr().err
    monkeypatch.setattr(threads_module, "default_threads", lambda: 3)
    _set_threads(SimpleNamespace(threads=None, strict=True), SimpleNamespace(settings={"threads": 0}), cuda)
    assert given[-1] == 3 and capsys.readouterr().err == ""  # a CUDA profile records no CPU threads: run's default
    with pytest.raises(SystemExit) as exc:  # refused before any work
        main([*VALIDATE, "--profile", profile, "--no-progress", "--threads", "2", "--strict"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: --threads 2: the profile was measured with 1" in err, err


# ------------------------------------------------------------------ progress
def test_progress_is_a_bar_on_a_terminal_lines_otherwise_and_nothing_when_silenced(monkeypatch):
    assert progress("run", "serving", 4, "requests", disable=True) is None
    lines = progress("run", "serving", 4, "requests", disable=False)
    try:
        assert isinstance(lines, ProgressLines)  # pytest's stderr is not a terminal
    finally:
        lines.close()

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress("run", "serving", 4, "requests", disable=False)
    try:
        assert type(bar).__name__ == "tqdm"
    finally:
        bar.close()


def test_progress_lines_say_the_count_the_detail_and_the_time(monkeypatch, short_interval):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    lines = ProgressLines("run", "serving", 16, "requests", detail=lambda: "120 tokens")
    lines.update(5)
    # until the timer thread has printed a line since the update (never how soon: on a busy machine
    # its first line may come before the update, and says 0/16)
    while "5/16" not in err.getvalue():
        lines._stop.wait(SHORT_INTERVAL_S)
    lines.close()
    printed_lines = err.getvalue().splitlines()
    first = next(line for line in printed_lines if "5/16" in line)
    assert re.fullmatch(r"pagesim run: serving: 5/16 requests, 120 tokens, \d+s elapsed", first), first
    assert all(re.fullmatch(r"pagesim run: serving: [05]/16 requests, 120 tokens, \d+s elapsed", line)
               for line in printed_lines), printed_lines
    printed = len(err.getvalue())
    lines._stop.wait(10 * SHORT_INTERVAL_S)
    assert len(err.getvalue()) == printed  # closed: no more lines
    lines = ProgressLines("validate", "simulating", None, "")
    assert re.fullmatch(r"pagesim validate: simulating: \d+s elapsed", lines.line())
    lines.close()
    assert [progress_module._clock(s) for s in (0.4, 59.9, 187, 3723)] == ["0s", "59s", "3m07s", "1h02m03s"]


def test_run_prints_progress_lines_off_a_terminal_and_none_with_no_progress(short_interval, capsys):
    assert main([*RUN, "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^pagesim run: serving: \d+/16 requests, \d+ tokens, \d+s elapsed$", err, re.M), err
    assert main([*RUN, "--threads", "1", "--no-progress"]) == 0
    assert "pagesim run: serving" not in capsys.readouterr().err


def test_simulate_prints_progress_lines_off_a_terminal(short_interval, capsys):
    argv = ["simulate", "--workload", "kwon2023-alpaca", "--num-requests", "2000", "--rate", "50", "--json"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"^pagesim simulate: simulating: \d+/2000 requests, \d+s elapsed$", err, re.M), err
    assert main([*argv, "--no-progress"]) == 0
    assert "pagesim simulate: simulating" not in capsys.readouterr().err


def test_calibrate_prints_a_line_per_table_and_progress_lines(monkeypatch, short_interval, tmp_path, capsys):
    import pagesim.engine.calibrate.calibrate as calibrate_module

    monkeypatch.setattr(calibrate_module, "calibrate", functools.partial(calibrate_module.calibrate, grid=TINY_GRID))
    out = tmp_path / "p.json"
    assert main(["calibrate", "--device", "cpu", "--warmup", "0", "--repeats", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "pagesim calibrate: dense_layer (2 points)" in err
    assert re.search(r"^pagesim calibrate: \w+: \d+/\d+ points, \d+s elapsed$", err, re.M), err
    assert json.loads(out.read_text())["settings"]["threads"] == 1 == torch.get_num_threads()  # calibrate's default


def test_validate_prints_its_phases_and_lines_within_them_and_no_progress_silences_both(profile, short_interval,
                                                                                       capsys):
    assert main([*VALIDATE, "--profile", profile]) == 0
    err = capsys.readouterr().err
    assert "pagesim validate: engine on the wall clock\n" in err
    assert re.search(r"^pagesim validate: .+: \d+s elapsed$", err, re.M), err
    assert main([*VALIDATE, "--profile", profile, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "engine on the wall clock" not in err and "elapsed" not in err and "re-timing" not in err, err
