"""The opt-in compiled build (``pagesim/engine/compiled.py``); all other metadata is in ``pyproject.toml``.

Inside a real build (``_build/pagesim_build.py`` says when and which), an editable build first
deletes the extension files and the source record a previous compiled build left in the source
tree, so a plain ``pip install -e .`` is pure Python again; with ``PAGESIM_COMPILE=1`` a build then
records the sources' digests and compiles the listed modules with mypyc (default mode: one shared
library, so calls across modules stay in C). A wheel's extension files are built outside the tree.
"""

import glob
import os
import runpy

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _extensions() -> list:
    phase = os.environ.get("_PAGESIM_BUILD_PHASE")
    if not phase:
        return []
    compiled = runpy.run_path(os.path.join(HERE, "pagesim", "engine", "compiled.py"))  # (not `import engine`: not built yet)
    if phase == "editable":
        stale = [f for path in compiled["MODULES"] for f in compiled["extension_files"](path)]
        stale += glob.glob(os.path.join(HERE, "*__mypyc.*"))  # mypyc's shared library
        stale += glob.glob(os.path.join(HERE, "pagesim", "engine", compiled["MANIFEST"]))
        for leftover in stale:
            os.remove(leftover)
            print(f"pagesim: removed {os.path.relpath(leftover, HERE)} (a previous compiled build's)")
    if os.environ.get("PAGESIM_COMPILE", "") in ("", "0"):
        return []
    from mypyc.build import mypycify

    compiled["write_manifest"]()
    return mypycify(["--ignore-missing-imports", "--follow-imports=silent", *compiled["MODULES"]], opt_level="3")


setup(ext_modules=_extensions())
