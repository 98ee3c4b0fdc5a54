"""``os._exit`` called by a plug-in's code is an error, never the end of pagesim.

``sys.exit`` raises ``SystemExit``, which the plug-in guard (``plugin_guard``) turns into one
``PluginError`` line; ``os._exit`` ends the process at once, with the status it was given, so a
plug-in's ``os._exit(0)`` in ``choose()`` used to end a run with exit 0, as if it had succeeded.

``watch(path)`` (called for each plug-in file before it runs) replaces ``os._exit`` (and
``posix._exit``, the same function) once per process with ``_exit``, which looks up its caller's
stack: where a frame runs code of a watched file, it raises ``PluginExit`` (a ``SystemExit``,
reported like ``sys.exit``), else it exits as ``os._exit`` does. A ``from os import _exit`` in a
plug-in file gets the replacement, since the file runs after ``watch``. Nothing changes on the hot
path: the plug-ins' methods are called as before, and only a call to ``os._exit`` pays for the
look-up. Exits that are not ``os._exit`` (``os.kill`` of its own process, ``os.abort``) end the
process by a signal, never with a success status, and are left alone.
"""

from __future__ import annotations

import os
import sys

_real_exit = os._exit
#: Real paths of the plug-in files loaded in this process (whose frames may not end it).
_watched: set[str] = set()


class PluginExit(SystemExit):
    """A plug-in's code called ``os._exit(status)``; raised in its place."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def watch(path: str | os.PathLike) -> None:
    """Refuse ``os._exit`` from code in ``path`` from now on (installing the replacement once)."""
    _watched.add(os.path.realpath(path))
    if os._exit is not _exit:
        os._exit = _exit
        posix = sys.modules.get("posix")
        if posix is not None:
            posix._exit = _exit


def _exit(status: int) -> None:
    frame = sys._getframe(1)
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename) in _watched:
            raise PluginExit(status)
        frame = frame.f_back
    _real_exit(status)
