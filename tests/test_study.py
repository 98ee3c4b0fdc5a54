"""Studies: spec validation, resume after a kill, failing runs recorded, Ray = local, the PDF report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagesim.reports.execute import run_study
from pagesim.reports.run_config import run_id
from pagesim.reports.spec import SpecError, parse_spec
from pagesim.reports.store import ResultsStore
from tests.processes import assert_none_left

ROOT = Path(__file__).resolve().parents[1]

SMALL = """
name = "small"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 30
[base]
kv_cache_gb = 1.0
[[grid]]
block_size = [8, 16]
preemption = ["recompute", "swap"]
[[grid]]
allocator = ["paged", "max"]
[[grid]]
kv_cache_gb = [0.5, 1.0]
eviction = ["lru", "fifo"]
[[grid]]
rate_scale = [0.5, 1.0]
block_size = [8, 16]
"""


def test_grid_is_a_union_of_products_with_shared_runs_once():
    spec = parse_spec(SMALL)
    runs = spec.runs()
    assert len({run_id(c) for c in runs}) == len(runs)
    # 4 (block size x preemption) + 2 (allocators) + 4 (cache size x eviction) + 3 (rate x block size,
    # whose rate 1.0 / block size 16 run is the base run the allocator grid already has)
    assert len(runs) == 4 + 2 + 4 + 3
    assert {c["block_size"] for c in runs} == {8, 16}


@pytest.mark.parametrize(
    "text, message",
    [
        ("name = 'x'", r"a \[source\] table is required"),
        ("[source]\nworkload = 'shared-system-prompt'", "needs num_requests"),
        ("[source]\nworkload = 'w'\ntrace = 't'\nnum_requests = 1", "one of them"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[base]\nblock_sise = 8", "unknown setting"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[[grid]]\nblock_size = ['a']", "expected int"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[[grid]]\nreplicas = [1, 0]", "replicas must be >= 1"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[base]\nrouter = 'random'", "router = 'random' is not one of"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[base]\ngpu = 'tpu'", "gpu = 'tpu' is not one of"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\nprofile = 'p.json'", "unknown key"),
        ("name = ", "not valid TOML"),
        ("[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5\n[[grid]]\npreemption = ['swp']", "preemption = 'swp' is not one of"),
        ("[source]\nworkload = 'nope'\nnum_requests = 5", "source.workload = 'nope' is not one of"),
        ("[source]\ntrace = '/nonexistent.csv'", "no such file"),
        ("paper = 'x'\n[source]\nworkload = 'shared-system-prompt'\nnum_requests = 5", "compares with kwon2023 only"),
    ],
)
def test_bad_specs_are_refused_with_the_key(text, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_overrides_change_the_document():
    spec = parse_spec(SMALL, ["source.num_requests=12", "grid.0.block_size=[32]", "base.gpu=h100-sxm"])
    assert spec.source["num_requests"] == 12 and spec.base["gpu"] == "h100-sxm"
    assert spec.grids[0]["block_size"] == [32]
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_spec(SMALL, ["block_size"])
    with pytest.raises(SpecError, match="has no entry 9"):
        parse_spec(SMALL, ["grid.9.block_size=[8]"])


# vLLM 0.6.3's swap with no swap space: aborts while it runs (settings that cannot be built, such as a
# max_model_len past the model's context, are refused before the first run: test_bounds_upfront.py)
FAILING = ("[[grid]]\nswap_space_gb = [0.0, 4.0]\nrate = [30.0]\nkv_cache_gb = [0.5]\npolicy = ['vllm-v0']\n"
           "preemption = ['swap']\nprefix_caching = [false]\n")


def test_a_failing_run_is_recorded_and_the_study_completes(tmp_path):
    spec = parse_spec(SMALL.split("[[grid]]")[0] + FAILING)
    outcome = run_study(spec, tmp_path, workers=1, progress=False)
    records = ResultsStore(tmp_path / "results.jsonl").load()
    assert outcome.total == 2 and outcome.failed == 1 and len(records) == 2
    bad = next(r for r in records.values() if r["config"]["swap_space_gb"] == 0.0)
    good = next(r for r in records.values() if r["config"]["swap_space_gb"] == 4.0)
    assert bad["status"] == "error" and "SwapSpaceExhausted: swapping out" in bad["error"]
    assert "Traceback" in bad["traceback"] and bad["pagesim_version"]
    assert good["status"] == "ok" and good["summary"]["requests_completed"] == 30
    # the next invocation retries the failure (and only it); the newest attempt is the record
    again = run_study(spec, tmp_path, workers=1, progress=False)
    assert (again.reused, again.ran, again.failed) == (1, 1, 1)
    assert len(ResultsStore(tmp_path / "results.jsonl").load()) == 2


def test_one_study_writes_a_folder_at_a_time(tmp_path):
    import fcntl

    spec = parse_spec(SMALL.split("[[grid]]")[0])
    with open(tmp_path / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another pagesim study is writing"):
            run_study(spec, tmp_path, workers=1, progress=False)
    with pytest.raises(ValueError, match="--workers must be >= 1, got 0"):
        run_study(spec, tmp_path, workers=0, progress=False)


def _record(name: str, **extra) -> dict:
    config = {"name": name}
    return {"id": run_id(config), "config": config, "status": "ok", "summary": {}, **extra}


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    a, b, c = _record("a"), _record("b", x=float("nan")), _record("c")
    store.append(a)
    with open(store.path, "a") as fh:
        fh.write('{"id": "b", "stat')  # killed mid-write
    assert list(store.load()) == [a["id"]]
    assert store.path.read_text().endswith("}\n")
    store.append(b)
    assert list(store.load()) == [a["id"], b["id"]] and store.load()[b["id"]]["x"] is None
    # a corrupt line in the middle is not fatal (it was, before): set aside, with a warning
    with open(store.path, "a") as fh:
        fh.write("garbage\n" + json.dumps(c) + "\n")
    with pytest.warns(UserWarning, match=r"r.jsonl:3: not JSON"):
        assert list(store.load()) == [a["id"], b["id"], c["id"]]
    assert json.loads(store.rejected_path.read_text())["line"] == 3


def test_killed_study_resumes_and_every_run_appears_once(tmp_path):
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SMALL.replace("num_requests = 30", "num_requests = 60"))
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "pagesim.engine.cli", "study", str(spec_path), "-o", str(out), "--workers", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = out / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = ResultsStore(results).load()
    total = len(parse_spec(spec_path.read_text()).runs())
    assert 3 <= len(before) < total
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{total} runs ({len(before)} from before, {total - len(before)} now" in done.stdout
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    ids = [line["id"] for line in lines]
    assert len(ids) == len(set(ids)) == total
    assert all(before[i] == next(line for line in lines if line["id"] == i) for i in before)  # kept, not redone


def test_ray_executor_gives_the_local_results(tmp_path):
    pytest.importorskip("ray")
    spec = parse_spec(SMALL, ["source.num_requests=20"])
    spec.grids = spec.grids[:1]
    run_study(spec, tmp_path / "local", workers=2, progress=False)
    run_study(spec, tmp_path / "ray", executor="ray", workers=2, progress=False)
    local = ResultsStore(tmp_path / "local" / "results.jsonl").load()
    remote = ResultsStore(tmp_path / "ray" / "results.jsonl").load()
    assert set(local) == set(remote) and len(local) == 4
    for rid in local:
        for key in ("status", "config", "summary", "series", "deployment"):
            assert local[rid][key] == remote[rid][key], (rid, key)


def test_study_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[source]\nworkload = 'shared-system-prompt'\n")
    for args, message in (([str(bad)], "needs num_requests"), (["nope"], "not a preset (demo, kwon2023)")):
        out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "study", *args, "-o", str(tmp_path / "o")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "report", str(tmp_path), "-o", str(tmp_path / "r.pdf")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a study folder" in out.stderr
    failing = tmp_path / "failing.toml"
    failing.write_text(SMALL.split("[[grid]]")[0] + FAILING)
    out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "study", str(failing), "-o", str(tmp_path / "f"),
                          "--workers", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "2 runs (0 from before, 2 now, 1 failed)" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "report", str(tmp_path / "f")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "needs -o PDF, --html HTML, or both" in out.stderr
    out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "report", str(tmp_path / "f"), "--html",
                          str(tmp_path / "r.html"), "--noise-threshold", "100"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--noise-threshold is a percentage in [0, 100)" in out.stderr


def test_study_off_a_terminal_prints_a_line_per_run_and_the_findings(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SMALL.split("[[grid]]")[0] + "[[grid]]\nblock_size = [8, 16]\n")
    out = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "study", str(spec), "-o", str(tmp_path / "s"),
                          "--workers", "1", "--html", str(tmp_path / "s.html")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 2 and lines[0].startswith("[1/2] run ") and lines[1].startswith("[2/2] run ")
    assert any("block_size=8: ok in " in line for line in lines), lines
    assert "Findings:" in out.stdout and "- Block size (8, 16; 2 runs at 6 requests/s" in out.stdout
    assert (tmp_path / "s.html").stat().st_size > 10_000 and f"wrote {tmp_path / 's.html'}" in out.stdout
    quiet = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", "study", str(spec), "-o", str(tmp_path / "s"),
                            "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "[1/2]" not in quiet.stderr and "2 from before" in quiet.stdout


def test_ctrl_c_on_a_process_pool_keeps_finished_runs_and_leaves_no_worker(tmp_path):
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SMALL.replace("num_requests = 30", "num_requests = 60"))
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "pagesim.engine.cli", "study", str(spec_path), "-o", str(out), "--workers", "2", "--no-progress"]
    # Its own process group, as a terminal's Ctrl-C reaches; SIGINT at its default even where this test
    # runs as a background job (which starts with SIGINT ignored, and Python keeps it so).
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    results = out / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the study finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted:" in err and "the same command resumes" in err, err[-2000:]
    assert "Traceback" not in err
    # no live member of its group (the resource tracker exits as a zombie): polled, not looked at once
    # after a fixed 0.5 s, which a busy machine may take to reap an exiting worker
    assert_none_left({}, proc.pid, within_s=30)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == len(parse_spec(spec_path.read_text()).runs())


def test_a_study_written_before_later_settings_existed_has_the_same_runs():
    # study.json of an older pagesim has no value for settings added since (LATER_SETTINGS): they
    # are at their defaults, so its runs keep their ids (a report of it used to raise KeyError)
    from dataclasses import replace

    from pagesim.reports.spec import LATER_SETTINGS

    spec = parse_spec(SMALL)
    old = replace(spec, base={k: v for k, v in spec.base.items() if k not in LATER_SETTINGS})
    assert set(spec.base) & set(LATER_SETTINGS) and not set(old.base) & set(LATER_SETTINGS)
    assert [run_id(c) for c in old.runs()] == [run_id(c) for c in spec.runs()]
