"""Processes seen through ``/proc`` (Linux), for the tests that check a study leaves none behind:
what a process started, and what of it still runs (a zombie has exited and holds nothing: it only
waits for init to reap it)."""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: [state, ppid, pgrp, ..., starttime at 19, ...]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` now, with its start time (so a reused pid is not mistaken for it)."""
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            for child in children:
                stat = _stat(child)
                if stat is not None and child not in found:
                    found[child] = stat[19]
                    todo.append(child)
    return found


def still_running(processes: dict[int, str], pgid: int) -> list[str]:
    """Those of ``processes`` alive (not zombies), and any live member of process group ``pgid``."""
    alive = []
    for pid in [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]:
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX":
            continue
        if (pid in processes and stat[19] == processes[pid]) or int(stat[2]) == pgid:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            except OSError:
                cmdline = "?"
            alive.append(f"{pid}: {cmdline}")
    return alive


def assert_none_left(processes: dict[int, str], pgid: int, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while (left := still_running(processes, pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"left running {within_s:.0f} s after the study ended: {left}"
