"""A study runs nothing unasked and builds nothing unbounded: a spec's plug-ins load only with
``allow_plugins`` (``--allow-plugins``), a grid's size is checked against ``--max-runs`` before any
run is enumerated, and the folder's lock names its holder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagesim.engine.cli import main
from pagesim.reports.spec import MAX_RUNS, SpecError, StudySpec, parse_spec
from tests.processes import descendants

ROOT = Path(__file__).resolve().parents[1]
SOURCE = """
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 20
[base]
kv_cache_gb = 1.0
"""
LOUD = """
from pathlib import Path
from pagesim.engine.policy.scheduling.preemption import VictimPolicy
Path(__file__).with_name("ran.txt").write_text("the plug-in's file ran")
class Loud(VictimPolicy):
    name = "{name}"
    def choose(self, running):
        return running[-1]
"""


def _loud(tmp_path: Path, name: str = "loud") -> Path:
    """A victim plug-in registered as ``name`` (each test its own: the registry is per process)."""
    path = tmp_path / "loud.py"
    path.write_text(LOUD.replace("{name}", name))
    return path


def test_a_spec_with_plugins_runs_none_of_their_code_unless_allowed(tmp_path):
    text = f'plugins = ["{_loud(tmp_path)}:Loud"]\n' + SOURCE + '[[grid]]\nvictim = ["running-tail", "loud"]\n'
    with pytest.raises(SpecError, match=r"would run the code in .*loud\.py.*--allow-plugins"):
        parse_spec(text)
    assert not (tmp_path / "ran.txt").exists()
    assert len(parse_spec(text, allow_plugins=True).runs()) == 2
    assert (tmp_path / "ran.txt").exists()


def test_a_plugin_added_by_set_is_refused_too(tmp_path):
    with pytest.raises(SpecError, match="--allow-plugins"):
        parse_spec(SOURCE, [f'plugins=["{_loud(tmp_path, "loud-set")}:Loud"]'])
    assert not (tmp_path / "ran.txt").exists()


def test_the_study_command_refuses_plugins_in_one_line_and_runs_them_when_allowed(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'plugins = ["{_loud(tmp_path, "loud-cli")}:Loud"]\n' + SOURCE + '[[grid]]\nvictim = ["loud-cli"]\n')
    with pytest.raises(SystemExit) as exc:
        main(["study", str(spec), "-o", str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err and "loud.py" in err and "--allow-plugins" in err, err
    assert not (tmp_path / "ran.txt").exists() and not (tmp_path / "out" / "results.jsonl").exists()
    assert main(["study", str(spec), "-o", str(tmp_path / "out"), "--workers", "1", "--no-progress",
                 "--allow-plugins"]) == 0


def test_a_huge_grid_is_counted_before_it_is_enumerated(monkeypatch):
    axes = "\n".join(f"block_size = [{', '.join(str(8 * (k + 1)) for k in range(100))}]".replace("block_size", key)
                     for key in ("block_size", "max_num_seqs", "num_gpu_blocks"))

    def enumerated(spec):  # counted from the axes, not by enumerating them (asserted without a clock)
        raise AssertionError("the grid was enumerated before its size was checked")

    with monkeypatch.context() as patched:
        patched.setattr(StudySpec, "runs", enumerated)
        with pytest.raises(SpecError, match=r"the grids make 1,000,000 runs, more than the 10,000 .* --max-runs "
                                             r"1000000"):
            parse_spec(SOURCE + "[[grid]]\n" + axes)
    assert MAX_RUNS == 10_000
    small = SOURCE + "[[grid]]\nblock_size = [8, 16, 32]\n"
    with pytest.raises(SpecError, match="the grids make 3 runs, more than the 2"):
        parse_spec(small, max_runs=2)
    assert len(parse_spec(small, max_runs=3).runs()) == 3


def test_max_runs_on_the_command_line(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(SOURCE + "[[grid]]\nblock_size = [8, 16, 32]\n")
    for flag, message in ((["--max-runs", "2"], "--max-runs 3"), (["--max-runs", "0"], "--max-runs must be >= 1")):
        with pytest.raises(SystemExit):
            main(["study", str(spec), "-o", str(tmp_path / "out"), "--no-progress", *flag])
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_a_second_study_on_a_folder_is_told_the_holders_pid(tmp_path):
    from pagesim.reports.execute import _exclusive

    out = tmp_path / "study"
    out.mkdir()
    with _exclusive(out):
        assert (out / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]
        script = ("import sys; from pathlib import Path; from pagesim.reports.execute import _exclusive\n"
                  "try:\n    _exclusive(Path(sys.argv[1])).__enter__()\nexcept ValueError as e:\n    print(e)\n")
        held = subprocess.run([sys.executable, "-c", script, str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert f"another pagesim study (pid {os.getpid()}) is writing {out}" in held.stdout, held
        assert (out / ".lock").read_text().split()[0] == str(os.getpid())  # the refused study blanked nothing
    with _exclusive(out):  # released with its holder
        pass


def test_a_non_finite_setting_is_refused():
    """``inf`` would be hashed into the run's id but stored as null, so its record could never be
    matched again (the study would run it on every invocation)."""
    for text in ("[base]\nengine_overhead_ms = inf\n", "[base]\nkv_cache_gb = nan\n"):
        with pytest.raises(SpecError, match="expected a finite number"):
            parse_spec(SOURCE.replace("[base]\n", text, 1).replace("kv_cache_gb = 1.0\n", "", 1))


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the workers through /proc")
def test_a_worker_killed_under_the_study_is_one_line(tmp_path):
    """The OOM killer taking a worker: one error line (exit 2), the finished runs kept, no traceback."""
    spec = tmp_path / "spec.toml"
    spec.write_text(SOURCE.replace("num_requests = 20", "num_requests = 600") +
                    "[[grid]]\nblock_size = [8, 16, 32, 64]\npreemption = [\"recompute\", \"swap\"]\n")
    proc = subprocess.Popen([sys.executable, "-m", "pagesim.engine.cli", "study", str(spec), "-o", str(tmp_path / "out"),
                             "--workers", "2", "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        workers: list[int] = []
        while time.time() < deadline and proc.poll() is None:
            workers = [p for p in descendants(proc.pid)
                       if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert workers, "no worker seen"
        time.sleep(1.0)
        os.kill(workers[0], 9)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert line.startswith("pagesim study: error: a worker process died"), err
