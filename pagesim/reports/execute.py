"""Running a study: its missing runs on an executor, each result stored the moment it arrives.

Executors yield records in completion order; the driver appends each to ``results.jsonl`` at once
(``ResultsStore``), so an interrupted study resumes where it stopped. A run that failed is a record
with its error (the study goes on); the next invocation retries it. One study at a time writes a
folder (a lock on ``DIR/.lock``), and only a folder that is new, empty or a study's own
(``check_study_folder``; never ``/``, the home folder or one holding the current folder).
Progress: a bar on a terminal, otherwise a line per finished run (its id, settings and seconds),
so logs and CI show it.

- ``local``: a process pool of ``workers`` processes (default: the CPUs), or in-process for one.
  Workers are *spawned* (a fresh interpreter, not a fork), so they inherit neither the folder's
  lock nor the command's signal handlers, and each dies with the study: the kernel kills it when
  its parent goes (Linux ``PR_SET_PDEATHSIG``), and a watchdog thread exits it when its parent
  changes (everywhere else, and for a parent already gone before the worker started). So a study
  killed with ``kill -9`` leaves no worker behind holding anything, and the same command resumes.
  A worker is replaced by a fresh one after ``RUNS_PER_WORKER`` runs (``max_tasks_per_child``), so
  whatever a run leaves behind in its process (a cache, a leak, a fragmented heap) is bounded by
  that many runs, however long the study.
- ``ray``: one Ray task per run; ``ray.init(address=...)`` joins a cluster (``auto``, or
  ``ray://host:10001``), and with no address starts a local instance of ``workers`` CPUs. Each
  node needs pagesim installed in the same version; the same configs give the same records.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.engine.catalog.hf_config import ModelConfigWarning
from pagesim.engine.output_folders import check_fill_folder, own_opener
from pagesim.engine.outputs import OutputFile
from pagesim.reports.run_config import RunConfig, run_id
from pagesim.reports.runner import run_one
from pagesim.reports.spec import StudySpec
from pagesim.reports.store import ResultsStore
from pagesim.traces.source import show_as_lines

EXECUTORS = ("local", "ray")


@dataclass
class StudyOutcome:
    out_dir: Path
    total: int
    reused: int  # completed by an earlier invocation
    ran: int  # this invocation (failed ones of earlier invocations included: they are retried)
    failed: int  # of this spec's runs, as they stand now


RUNS_PER_WORKER = 100  # runs a worker serves before a fresh process replaces it (starting one: about a second)


class _RecyclingPool(ProcessPoolExecutor):
    """A process pool whose workers leave after ``max_tasks_per_child`` runs, each replaced at once.

    NOTE: CPython 3.11 to 3.13 (gh-115634, fixed in later releases): with runs queued, a worker
    leaving at its limit may not be replaced (the pool counts an idle worker that has left), and
    the study hangs once every worker has left. This pool starts a worker whenever it has fewer
    than ``max_workers``, as the fix does; the executor's own lock serializes the calls.
    """

    def _adjust_process_count(self) -> None:
        if len(self._processes) < self._max_workers:
            self._spawn_process()


def run_local(configs: list[RunConfig], workers: int, address: str | None = None, *,
              runs_per_worker: int = RUNS_PER_WORKER) -> Iterator[dict[str, Any]]:
    if address is not None:
        raise ValueError("--address is for the ray executor")
    if workers == 1 or len(configs) <= 1:
        for config in configs:
            yield run_one(config)
        return
    pool = _RecyclingPool(max_workers=min(workers, len(configs)), mp_context=multiprocessing.get_context("spawn"),
                          initializer=_worker_start, initargs=(os.getpid(),), max_tasks_per_child=runs_per_worker)
    try:
        futures = [pool.submit(run_one, c) for c in configs]
        for future in as_completed(futures):
            try:
                record = future.result()
            except BrokenProcessPool:  # a worker was killed (the OOM killer, a signal, a crash in C)
                raise ValueError("a worker process died (killed by a signal: out of memory?); the runs finished so "
                                 "far are kept, and the same command resumes the rest") from None
            yield record
    except BaseException:  # interrupted (Ctrl-C, SIGTERM, the consumer stopped): leave no worker behind
        processes = list(getattr(pool, "_processes", {}).values())
        for process in processes:
            process.terminate()
        for process in processes:  # one that ignores SIGTERM (stuck in C code) is killed
            process.join(timeout=STOP_S)
            if process.is_alive():
                process.kill()
        # NOTE: wait for the pool's manager thread to see its workers gone; left running, it raced
        # interpreter exit (``concurrent.futures``' atexit join wrote to a closed pipe: a traceback
        # after "interrupted:", seen once in CI).
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCHDOG_S = 1.0  # how often a worker checks that its parent is still there
STOP_S = 5.0  # how long a stopped worker has to exit before it is killed


def _worker_start(parent_pid: int) -> None:
    """A pool worker's first act: die with the study, and leave Ctrl-C to it.

    SIGINT is ignored here: the main process catches it and stops the pool (a worker's own
    ``KeyboardInterrupt`` would only print a traceback). SIGTERM keeps its default (exit), which
    is how the pool is stopped.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    show_as_lines("study")  # a trace's repairs as one line each (a spawned worker has not inherited the hook)
    # A config.json of an unknown architecture was noted once when the study planned its runs
    # (reports.spec), not again by each worker for each run.
    warnings.filterwarnings("ignore", category=ModelConfigWarning)
    _kill_me_with_parent()
    if os.getppid() != parent_pid:  # the study died before this worker got here
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="pagesim-parent-watchdog", daemon=True).start()


def _kill_me_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when its parent exits (even by ``kill -9``).

    NOTE: strictly, when the parent *thread* that started it ends: the main thread for the first
    workers, the pool's manager thread for their replacements, which ends only after the pool has
    stopped its workers (or with the process).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no libc to call: the watchdog alone
        pass


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent is gone (this process was handed to another parent)."""
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_S)
    os._exit(1)


def run_ray(configs: list[RunConfig], workers: int, address: str | None = None) -> Iterator[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ValueError("the ray executor needs Ray: pip install 'ray>=2.9' (or pagesim[ray])") from None
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"num_cpus": workers} if address is None else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **kwargs)
    try:
        remote = ray.remote(num_cpus=1)(run_one)
        pending = [remote.remote(c) for c in configs]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        if started_here:
            ray.shutdown()


RUNNERS = {"local": run_local, "ray": run_ray}


def run_study(spec: StudySpec, out_dir: str | Path, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True) -> StudyOutcome:
    if executor not in RUNNERS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    workers = resolve_workers(workers)
    out = Path(out_dir)
    check_study_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        return _run_locked(spec, out, executor, workers, address, progress)


#: What a study folder holds: its results, the lines set aside, the spec as run, the lock, the report
#: ``pagesim study`` suggests writing beside them, and older versions' staged copies of these.
STUDY_FILES = ("results.jsonl", "results.rejected.jsonl", "study.json", ".lock", "report.pdf", "report.html",
               "results.jsonl.*.tmp", "study.json.*.tmp", "report.pdf.*.tmp", "report.html.*.tmp")


def check_study_folder(out: str | Path, flag: str = "-o") -> None:
    """``out`` as a study folder: nothing there, or a folder holding only a study's own files as
    regular files (``STUDY_FILES``): so a study resumes in its folder, and never writes into a
    folder of other things, nor through a link planted among its files (``pagesim.engine.outputs``)."""
    check_fill_folder(out, flag, STUDY_FILES, what="study folder")


def resolve_workers(workers: int | None) -> int:
    """``--workers`` as a count (None: the CPUs), refused below 1."""
    if workers is None:
        return os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    return workers


@contextlib.contextmanager
def _exclusive(out: Path):
    """One study writes a folder at a time: a second one would run every run twice.

    The lock is ``flock`` on ``DIR/.lock``, which the kernel releases when the holder's open file
    goes away (its process exits, however it ends), so a lock never outlives its study; the file
    names the holder's pid, for the message a second study prints. The descriptor is not
    inherited by anything the study starts (Python opens files non-inheritable, and workers are
    spawned, not forked).
    """
    # (not "w": that would blank the holder's pid before we know; never through a link: own_opener)
    with open(out / ".lock", "a+", opener=own_opener) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(_held_message(out, fh)) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()} {socket.gethostname()}\n")
        fh.flush()
        yield


def _held_message(out: Path, fh) -> str:
    """Who holds ``out``'s lock, as far as the lock file and ``/proc`` tell."""
    fh.seek(0)
    words = fh.read(300).split()
    pid = int(words[0]) if words and words[0].isdigit() else None
    host = words[1] if len(words) > 1 else None
    if pid is None:
        return f"another pagesim study is writing {out}; wait for it, or use another folder"
    if host is not None and host != socket.gethostname():  # (another machine sharing the folder: its pids are not ours)
        return f"another pagesim study (pid {pid} on {host}) is writing {out}; wait for it, or use another folder"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return (f"{out}/.lock is held, but the study that took it (pid {pid}) is gone: a process it started "
                f"still holds the lock (`fuser {out}/.lock` names it); stop that process, then run again")
    except PermissionError:
        pass  # alive, another user's
    return f"another pagesim study (pid {pid}) is writing {out}; wait for it, or use another folder"


def _run_locked(spec: StudySpec, out: Path, executor: str, workers: int, address: str | None,
                progress: bool) -> StudyOutcome:
    runs = spec.runs()
    _write_study(out, spec, runs)
    store = ResultsStore(out / "results.jsonl")
    done = {i for i, r in store.load().items() if r["status"] == "ok"}
    todo = [c for c in runs if run_id(c) not in done]  # failed runs are retried
    bar = _bar(len(runs), len(runs) - len(todo), spec.name, progress)
    lines = progress and bar is None  # no terminal: a line per finished run, for logs and CI
    ran = 0
    try:
        for record in RUNNERS[executor](todo, workers, address):
            store.append(record)
            ran += 1
            if bar is not None:
                bar.update(1)
            if lines:
                print(_progress_line(record, spec.base, len(runs) - len(todo) + ran, len(runs)), file=sys.stderr,
                      flush=True)
            if record["status"] != "ok":
                print(f"run {record['id']} failed: {record['error']}", file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()
    records = store.load()
    current = {run_id(c) for c in runs}  # the file may also hold runs of an earlier version of the spec
    failed = sum(1 for i, r in records.items() if i in current and r["status"] != "ok")
    return StudyOutcome(out, len(runs), len(runs) - len(todo), ran, failed)


def _write_study(out: Path, spec: StudySpec, runs: list[RunConfig]) -> None:
    """``study.json``: the spec as run and its run ids, for the report (rewritten on each invocation)."""
    doc = {"name": spec.name, "description": spec.description, "paper": spec.paper, "source": spec.source,
           "base": spec.base, "grids": spec.grids, "axes": spec.axes(), "run_ids": [run_id(c) for c in runs]}
    with OutputFile(out / "study.json", own=True).open() as fh:  # (whole, never through a link)
        fh.write(json.dumps(doc, indent=1, sort_keys=True))


def _bar(total: int, initial: int, name: str, enabled: bool):
    """A progress bar on a terminal (or with PAGESIM_PROGRESS set); None otherwise."""
    if not enabled or not (sys.stderr.isatty() or "PAGESIM_PROGRESS" in os.environ):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="run", desc=f"study {name}", file=sys.stderr)


def _progress_line(record: dict[str, Any], base: dict[str, Any], done: int, total: int) -> str:
    """E.g. ``[7/31] run 3f2a... block_size=8, preemption=swap: ok in 0.8 s``."""
    from pagesim.reports.run_config import describe_config

    status = "ok" if record["status"] == "ok" else "failed"
    return (f"[{done}/{total}] run {record['id']} {describe_config(record['config'], base)}: {status} in "
            f"{record.get('wall_s', 0.0):.1f} s")
