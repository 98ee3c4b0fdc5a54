"""A study's workers stay small however many runs they serve (issue 56: 6.7 MB a run, 3.25 GB
after 955 runs): a process keeps no earlier run's deployment (``pagesim.sim.gc_policy``), and a worker is
replaced by a fresh process after ``RUNS_PER_WORKER`` runs (``pagesim.reports.execute``), without the
hang CPython 3.11-3.13 has there (gh-115634). ``benchmarks/bench_study_memory.py`` measures the
workers' memory; these tests check the mechanisms, with no timing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.bad_inputs_harness import ENV

ROOT = Path(__file__).resolve().parents[1]
TINY = """
name = "tiny"
[source]
workload = "shared-system-prompt"
rate = 8.0
num_requests = 20
[base]
seed = [{seeds}]
"""


def python(script: str, spec: str, timeout_s: float = 240) -> dict:
    """Run ``script`` in a fresh interpreter (one that has frozen nothing, as a worker) with the
    study spec ``spec`` as ``sys.argv[1]``; its last stdout line, as JSON."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), spec], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_process_running_many_simulations_keeps_few_earlier_runs_deployments():
    """Earlier runs' deployments (scheduler, block pool: a reference cycle) are collected before a
    run freezes the heap, once they may make a quarter of it (``pagesim.sim.gc_policy``: CPython's rule for
    full collections); before, every one stayed (frozen, then never collected): 40 pools after 40
    runs."""
    out = python("""
        import gc, json, sys
        from pagesim.engine.policy.memory.block_pool import BlockPool
        from pagesim.reports.runner import run_one
        from pagesim.reports.spec import parse_spec

        alive, statuses = [], []
        for config in parse_spec(sys.argv[1]).runs():
            statuses.append(run_one(config)["status"])
            alive.append(sum(1 for o in gc.get_objects() if isinstance(o, BlockPool)))
        print(json.dumps({"ok": statuses, "alive": alive}))
    """, TINY.format(seeds=", ".join(str(k) for k in range(40))))
    assert out["ok"] == ["ok"] * 40
    alive = out["alive"]
    collections = sum(1 for before, after in zip(alive, alive[1:]) if after < before)
    assert max(alive) <= 10 and collections >= 3, f"block pools alive after each run: {alive}"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the workers through /proc")
def test_workers_are_replaced_after_their_runs_and_the_study_finishes():
    """Two workers, two runs each, twelve runs queued at once (what hangs a stock 3.11 pool): every
    run comes back, served by more processes than two, never more than two at a time."""
    out = python("""
        import json, os, sys
        from pagesim.reports.execute import run_local
        from pagesim.reports.run_config import run_id
        from pagesim.reports.spec import parse_spec
        from tests.processes import descendants

        def workers():
            return {pid for pid in descendants(os.getpid())
                    if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read()}

        runs = parse_spec(sys.argv[1]).runs()
        seen, most, records = set(), 0, []
        for record in run_local(runs, 2, runs_per_worker=2):
            records.append(record)
            alive = workers()
            seen |= alive
            most = max(most, len(alive))
        print(json.dumps({"ids": sorted(r["id"] for r in records), "expected": sorted(map(run_id, runs)),
                          "ok": [r["status"] for r in records], "seen": len(seen), "most": most}))
    """, TINY.format(seeds=", ".join(map(str, range(12)))), timeout_s=300)
    assert out["ids"] == out["expected"] and out["ok"] == ["ok"] * 12
    assert out["seen"] > 2, f"only {out['seen']} worker processes served 12 runs at 2 runs a worker"
    assert out["most"] <= 2
