"""Running ``pagesim`` on bad input in a fresh process, and judging how it failed.

``run_pagesim`` starts the installed entry point in its own session (stdin closed, no GPU, one
thread) through ``LAUNCHER``, a bare interpreter that forks, execs pagesim and reports what
``os.wait4`` says of it: the exit status, the peak resident memory (``ru_maxrss``, its reaped
children included) and the CPU time it used (user + system, likewise). A case's time limit bounds
that CPU time, which a busy machine hardly changes (issue 56: wall-clock bounds failed on a shared
machine); the wall clock only guards against hangs: a watchdog kills the whole process group when
``WATCHDOG_FACTOR`` times the limit (plus a grace) passes, or the resident memory grows past
``GUARD_RSS_BYTES``, so a command that hangs on a FIFO or reads ``/dev/zero`` without end fails the
test instead of taking the machine down.

``error_line`` checks the shape a refusal must have: stderr, apart from pagesim's own warning lines
and an argparse usage block before the error, is exactly one ``pagesim CMD: error: ...`` line, and
nowhere a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ENTRY_POINT = Path(sys.executable).with_name("pagesim")
PAGESIM = [str(_ENTRY_POINT)] if _ENTRY_POINT.exists() else [sys.executable, "-m", "pagesim.engine.cli"]
ENV = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

MAX_RSS_BYTES = 500 * 1024 * 1024  # the bound for any refusal
GUARD_RSS_BYTES = 2 * MAX_RSS_BYTES  # past this the watchdog kills: a failure either way, the machine spared
GRACE_S = 5.0  # the watchdog waits this long past its time, so an overrun is measured, not cut at the limit
WATCHDOG_FACTOR = 10  # wall clock allowed per second of a case's limit: a hang guard, far above a busy machine's

# NOTE: Linux carries a process's peak RSS across exec (the pre-exec high-water mark of a forked
# parent counts), so a child forked straight from pytest (torch imported, hundreds of MB) would
# report pytest's memory as its own. The launcher is a small interpreter: what it carries is small.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as fh:
    fh.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
"""

_WARNING = re.compile(r"^pagesim [\w-]+( [\w-]+)?: warning: ")


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    wall_s: float
    max_rss_bytes: int
    killed_for: str | None  # "time" or "memory" when the watchdog stopped it
    cpu_s: float = 0.0  # user + system CPU time, its reaped children included

    def describe(self) -> str:
        killed = f", killed for {self.killed_for}" if self.killed_for else ""
        return (f"pagesim {' '.join(self.argv)}\n-> exit {self.returncode} in {self.wall_s:.1f} s "
                f"({self.cpu_s:.1f} s of CPU), "
                f"peak {self.max_rss_bytes / 2**20:.0f} MiB{killed}\nstdout: {self.stdout[-1500:]!r}\n"
                f"stderr: {self.stderr[-3000:]!r}")


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_pagesim(argv: list[str], *, cwd: Path, limit_s: float) -> Outcome:
    """``pagesim ARGV`` in ``cwd``: its exit status, output, wall and CPU time and peak memory; killed
    when ``limit_s`` x ``WATCHDOG_FACTOR`` (+ ``GRACE_S``) of wall clock passes."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as report:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, report.name, *PAGESIM, *argv], cwd=cwd,
                                env=ENV, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        killed_for: list[str] = []
        finished = threading.Event()

        def watch() -> None:
            while not finished.wait(0.05):
                if time.monotonic() - started > limit_s * WATCHDOG_FACTOR + GRACE_S:
                    killed_for.append("time")
                elif any(_rss_bytes(pid) > GUARD_RSS_BYTES for pid in _children(proc.pid)):
                    killed_for.append("memory")
                else:
                    continue
                for pid in _children(proc.pid):  # pagesim itself: the launcher still reports its peak
                    _kill(pid)
                return

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        try:
            proc.wait()
        finally:
            wall_s = time.monotonic() - started
            finished.set()
            watchdog.join()
            _kill_group(proc.pid)  # anything it started and left behind
        said = report.read().split() or [proc.returncode, 0, 0.0]
        returncode, max_rss_kib, cpu_s = int(said[0]), int(said[1]), float(said[2])
        out.seek(0)
        err.seek(0)
        return Outcome(tuple(argv), returncode, out.read().decode(errors="replace"),
                       err.read().decode(errors="replace"), wall_s, max_rss_kib * 1024,
                       killed_for[0] if killed_for else None, cpu_s)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(child) for child in fh.read().split()]
    except OSError:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def error_line(outcome: Outcome, command: str) -> str:
    """The one ``pagesim COMMAND: error: ...`` line of a refusal (its message), or an AssertionError
    saying what else stderr held."""
    assert "Traceback" not in outcome.stderr, "a traceback:\n" + outcome.describe()
    lines = [line for line in outcome.stderr.splitlines() if line.strip() and not _WARNING.match(line)]
    prefix = re.compile(rf"^pagesim {re.escape(command)}( [\w-]+)?: error: ")
    errors = [k for k, line in enumerate(lines) if prefix.match(line)]
    assert len(errors) == 1, f"expected one 'pagesim {command}: error:' line:\n" + outcome.describe()
    before = lines[:errors[0]]
    usage = bool(before) and before[0].startswith("usage: ") and all(line.startswith(" ") for line in before[1:])
    assert not before or usage, "lines before the error that are not a usage block:\n" + outcome.describe()
    assert errors[0] == len(lines) - 1, "lines after the error:\n" + outcome.describe()
    return prefix.sub("", lines[-1])
