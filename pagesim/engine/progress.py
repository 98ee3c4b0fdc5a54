"""Progress on stderr for the long commands: a bar on a terminal, a line a minute otherwise.

On a terminal a tqdm bar redraws in place. When stderr is a file or a pipe (a log, CI, ``nohup``)
a bar is a stream of carriage returns, and a command that runs for minutes said nothing at all;
there ``ProgressLines`` prints one line every ``LINE_INTERVAL_S`` from a timer thread (so a long
step cannot hold it back), e.g. ``pagesim run: serving: 5/16 requests, 1234 tokens, 1m00s
elapsed``. ``--no-progress`` turns both off (``progress`` returns None). ``run``, ``simulate``,
``calibrate`` and ``validate`` use it; ``study`` prints a line per finished run instead.

``ProgressLines`` answers the calls the commands make of a tqdm bar (``update``, ``reset``,
``set_description``, ``close``), so a command holds either without asking which.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

LINE_INTERVAL_S = 60.0  # between two progress lines when stderr is not a terminal (tests shorten it)


def progress(command: str, desc: str, total: int | None, unit: str, *, disable: bool,
             detail: Callable[[], str] | None = None):
    """A tqdm bar on a terminal, ``ProgressLines`` otherwise, None with ``disable`` (``--no-progress``).
    ``detail`` adds to each line what the count does not say (e.g. tokens generated)."""
    if disable:
        return None
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, unit=unit, desc=desc, mininterval=0.5, leave=False, file=sys.stderr)
    return ProgressLines(command, desc, total, unit, detail=detail)


class ProgressLines:
    """A line ``pagesim COMMAND: DESC: DONE/TOTAL UNIT[, DETAIL], ELAPSED elapsed`` every
    ``LINE_INTERVAL_S`` (read when it starts) until ``close``; ``total`` None leaves out the count."""

    def __init__(self, command: str, desc: str, total: int | None, unit: str, *,
                 detail: Callable[[], str] | None = None):
        self.command, self.desc, self.total, self.unit, self.detail = command, desc, total, unit, detail
        self.n = 0
        self.started_s = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(LINE_INTERVAL_S,), daemon=True,
                                        name=f"pagesim {command} progress")
        self._thread.start()

    def update(self, n: int = 1) -> None:
        self.n += n

    def reset(self, total: int | None = None) -> None:
        self.n, self.total = 0, total

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def line(self) -> str:
        parts = [] if self.total is None else [f"{self.n}/{self.total} {self.unit}"]
        if self.detail is not None:
            parts.append(self.detail())
        parts.append(f"{_clock(time.monotonic() - self.started_s)} elapsed")
        return f"pagesim {self.command}: {self.desc}: {', '.join(parts)}"

    def _tick(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                print(self.line(), file=sys.stderr, flush=True)
            except (OSError, ValueError):  # stderr closed under us: progress is not worth an error
                return


def _clock(seconds: float) -> str:
    """``42s``, ``3m07s``, ``1h02m03s``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"
