"""The base install simulates, studies and reports without torch; the real engine is the
``engine`` extra, and a command that needs it says so in one line (issue 59, part 2).

The commands run in child interpreters where an import hook makes ``torch``, ``triton`` and
``safetensors`` missing, as on a base install (this environment has them: the tests need them
elsewhere). The same was checked once by hand in a fresh virtual environment without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ONLY = ("torch", "triton", "safetensors")

# A child interpreter whose imports of the engine extra fail as on a base install; it runs the
# CLI under a __main__ guard, so a study's spawned workers (which re-import __main__) get the hook
# too and do not run the command again.
CHILD = f"""
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {ENGINE_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Missing())
if __name__ == "__main__":
    from pagesim.engine.cli import main
    status = main(sys.argv[1:])
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in {ENGINE_ONLY!r})
    if leaked:
        sys.exit(f"imported {{leaked}}")
    sys.exit(status)
"""


@pytest.fixture(scope="module")
def base_install(tmp_path_factory):
    script = tmp_path_factory.mktemp("base") / "pagesim_base.py"
    script.write_text(CHILD)

    def pagesim(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                              timeout=timeout, check=False)

    return pagesim


def test_the_base_dependencies_leave_the_engine_to_its_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements):
        return {r.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip() for r in requirements}

    extras = project["optional-dependencies"]
    assert not names(project["dependencies"]) & set(ENGINE_ONLY)
    assert names(extras["engine"]) == set(ENGINE_ONLY)
    assert "pagesim[engine]" in extras["dev"]  # (the README's test command installs the engine)


def test_simulate_runs_without_the_engine(base_install, tmp_path):
    done = base_install("simulate", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "30",
                        "--kv-offloading-size", "1", "--no-progress", "--json", "--out", str(tmp_path / "sim"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests_completed"] == 30
    assert (tmp_path / "sim" / "decisions.jsonl").is_file()


def test_a_study_and_its_report_run_without_the_engine(base_install, tmp_path):
    spec = tmp_path / "study.toml"
    spec.write_text('name = "base"\n[source]\nworkload = "shared-system-prompt"\nrate = 4.0\nnum_requests = 40\n'
                    '[base]\nkv_cache_gb = 2.0\n[[grid]]\nblock_size = [16, 32]\n')
    done = base_install("study", str(spec), "-o", str(tmp_path / "out"), "--workers", "2", "--no-progress",
                        "--report", str(tmp_path / "report.pdf"), "--html", str(tmp_path / "report.html"))
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "report.pdf").stat().st_size > 0 and (tmp_path / "report.html").stat().st_size > 0
    again = base_install("report", str(tmp_path / "out"), "-o", str(tmp_path / "again.pdf"))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow  # the demo: 31 simulations (about 15 s on two cores)
def test_the_demo_runs_without_the_engine(base_install, tmp_path):
    done = base_install("demo", "-o", str(tmp_path / "demo"), "--no-progress", timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "demo" / "report.pdf").stat().st_size > 0 and (tmp_path / "demo" / "report.html").is_file()
    assert len((tmp_path / "demo" / "demo-study" / "results.jsonl").read_text().splitlines()) == 31


@pytest.mark.parametrize("command", [
    ["run", "--model", "tiny", "--workload", "kwon2023-alpaca", "--num-requests", "2", "--no-progress"],
    ["calibrate", "--device", "cpu", "--model", "tiny", "--quick", "--no-progress"],
    ["validate", "--model", "tiny", "--profile", str(ROOT / "pagesim" / "sim" / "profiles" / "tiny-cpu.json")],
    ["simulate", "--model", "tiny", "--profile", str(ROOT / "pagesim" / "sim" / "profiles" / "tiny-cpu.json"), "--check-profile"],
], ids=lambda c: c[0] + ("-check-profile" if "--check-profile" in c else ""))
def test_an_engine_command_says_which_extra_to_install(base_install, tmp_path, command):
    if command[0] == "calibrate":
        command = [*command, "--out", str(tmp_path / "profile.json")]
    done = base_install(*command)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()  # (simulate says first that it re-times the probe)
    assert [line for line in lines if ": error: " in line] == lines[-1:], done.stderr
    assert lines[-1].startswith(f"pagesim {command[0]}: error: 'torch' is not installed")
    assert "pip install 'pagesim[engine]'" in lines[-1]
    assert not (tmp_path / "profile.json").exists()  # (calibrate wrote nothing)
