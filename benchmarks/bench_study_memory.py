"""Resident memory of a study's workers, sampled from ``/proc`` while the study runs.

What is measured
----------------
``pagesim study`` runs a spec of ``--runs`` tiny runs (the ``shared-system-prompt`` workload,
``--requests`` requests each, one run per seed) on ``--workers`` worker processes, as a user would
(a subprocess of the real command line). A sampling thread reads, every ``--interval`` seconds,
the children of the study process (``/proc/PID/task/*/children``) and each child's ``VmRSS``
(``/proc/CHILD/status``), and the number of results in ``results.jsonl``. Printed:

- per worker process (a recycled pool has more of them than ``--workers``): its first and peak
  RSS, and the study's runs finished while it lived;
- the growth per run: for each worker, the slope of its RSS against the runs it served (the
  study's runs finished divided by the workers sharing them), averaged over the workers that
  served at least ``MIN_RUNS`` runs; a worker's samples count from its first result on, so its
  imports are not growth;
- the peak RSS of any worker, the figure issue 56 bounds: a 1,000-run study of 100 requests each
  on 2 workers ends with each worker under 600 MB.

``--runs 1000 --requests 100 --workers 2`` is that study; the default (300 runs) is the quick one.
Nothing is asserted: the figures are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIN_RUNS = 5  # a worker that served fewer runs says nothing about growth per run
MB = 1024 * 1024


def spec_text(runs: int, requests: int) -> str:
    seeds = ", ".join(str(i) for i in range(runs))
    return (f'name = "worker-memory"\n[source]\nworkload = "shared-system-prompt"\nrate = 8.0\n'
            f"num_requests = {requests}\n[base]\nseed = [{seeds}]\n")


def children(pid: int) -> list[int]:
    """``pid``'s children, whichever of its threads started them (a pool's replacement workers are
    started by its manager thread, and each thread's ``children`` lists its own)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(word) for word in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def is_worker(pid: int) -> bool:
    """A pool worker (spawned: ``-c 'from multiprocessing.spawn import spawn_main ...'``), not
    multiprocessing's resource tracker."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"spawn_main" in cmdline


def results_count(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@dataclass
class Worker:
    pid: int
    samples: list[tuple[int, int]] = field(default_factory=list)  # (study runs done, RSS bytes)

    @property
    def peak(self) -> int:
        return max(rss for _, rss in self.samples)


def sample(study_pid: int, results: Path, workers: dict[int, Worker], stop: threading.Event, interval_s: float):
    while not stop.is_set():
        done = results_count(results)
        for pid in children(study_pid):
            if pid not in workers and not is_worker(pid):
                continue
            rss = rss_bytes(pid)
            if rss is not None:
                workers.setdefault(pid, Worker(pid)).samples.append((done, rss))
        stop.wait(interval_s)


def growth_per_run(workers: dict[int, Worker], num_workers: int) -> float | None:
    """MB per run served: per worker the least-squares slope of its RSS against the study's runs
    done (from its first result on; a slope per study run times the workers sharing the runs),
    averaged over workers that served at least ``MIN_RUNS`` runs."""
    rates = []
    for w in workers.values():
        later = [(done, rss) for done, rss in w.samples if done > w.samples[0][0]]  # (after its first result)
        if len({done for done, _ in later}) < 2 or (later[-1][0] - later[0][0]) / num_workers < MIN_RUNS:
            continue
        slope = statistics.linear_regression([d for d, _ in later], [r / MB for _, r in later]).slope
        rates.append(slope * num_workers)
    return sum(rates) / len(rates) if rates else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.2, metavar="S", help="seconds between samples")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pagesim-bench-memory-") as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(spec_text(args.runs, args.requests))
        out = Path(tmp) / "study"
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pagesim.engine.cli", "study", str(spec), "-o", str(out),
                                 "--workers", str(args.workers)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        workers: dict[int, Worker] = {}
        stop = threading.Event()
        thread = threading.Thread(target=sample, args=(proc.pid, out / "results.jsonl", workers, stop, args.interval))
        thread.start()
        _, err = proc.communicate()
        stop.set()
        thread.join()
        wall_s = time.perf_counter() - started
        records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    failed = sum(1 for r in records if r.get("status") != "ok")
    print(f"study of {args.runs} runs x {args.requests} requests on {args.workers} workers: exit {proc.returncode}, "
          f"{len(records)} records ({failed} failed), {wall_s:.1f} s")
    if proc.returncode:
        print(err.strip().splitlines()[-1] if err.strip() else "(no message)")
    print(f"{'worker pid':>10} {'first MB':>9} {'peak MB':>8} {'study runs in its life':>23}")
    for w in sorted(workers.values(), key=lambda w: w.samples[0][0]):
        first_done, last_done = w.samples[0][0], w.samples[-1][0]
        print(f"{w.pid:>10} {w.samples[0][1] / MB:>9.0f} {w.peak / MB:>8.0f} {f'{first_done}..{last_done}':>23}")
    growth = growth_per_run(workers, args.workers)
    peak = max((w.peak for w in workers.values()), default=0) / MB
    print(f"worker processes: {len(workers)}; peak worker RSS: {peak:.0f} MB; growth per run served: "
          f"{'n/a' if growth is None else f'{growth:.2f} MB'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
