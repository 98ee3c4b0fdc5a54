"""pagesim's serving policy (``pagesim.engine.policy``, pure Python) and, later, its real engine (torch).

Importing ``pagesim.engine`` or ``pagesim.engine.policy`` must not import torch or simpy: the simulator runs the
policy at scale without either, and a test checks ``sys.modules``.
"""

import os as _os
import sys as _sys

from pagesim.engine.compiled import StaleBuild as _StaleBuild, compiled_modules as _compiled_modules

try:
    #: The modules this install runs compiled (``pagesim/engine/compiled.py``; empty: pure Python).
    COMPILED: list[str] = _compiled_modules()
except _StaleBuild as _exc:
    if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "pagesim":  # the command: one line, exit 2
        print(f"error: {_exc}", file=_sys.stderr)
        raise SystemExit(2) from None
    raise
