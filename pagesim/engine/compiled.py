"""The opt-in compiled build: which modules mypyc compiles, and the guard that no stale one runs.

``PAGESIM_COMPILE=1 pip install -e .`` (``setup.py``, through the build backend in ``_build/``)
compiles the modules of ``MODULES`` with mypyc into extension files beside their sources; Python
then imports the extension, not the source. Everything else stays pure Python, and a plain
``pip install -e .`` is the pure-Python install it always was (no mypy, no C compiler): every build,
compiled or not, first deletes the extension files a previous one left.

Invariants:
- The decisions, step and request tables and summaries of a run are the same compiled or not:
  the compiled modules are these very sources (mypyc checks their declared types as they run, so
  the annotations of these modules are kept true: ``mypy`` on them is part of the test suite).
- No process runs a compiled module whose source changed since the build. The build writes the
  sha256 of every source it compiled (``MANIFEST``); ``compiled_modules()``, called by
  ``pagesim/engine/__init__.py`` and ``pagesim/sim/__init__.py`` before any of these modules can be imported,
  compares them and raises ``StaleBuild`` naming the changed files and the two ways out.
  A pure install has no extension files and pays a few ``stat`` calls.

Standard library only: ``setup.py`` reads this file before anything is installed.
"""

from __future__ import annotations

import os
from importlib.machinery import EXTENSION_SUFFIXES

#: The compiled modules, as paths from the project's root: the policy's step loop and its fast
#: path, the pool, its eviction orders and prefix index, the KV manager, and the simulator's
#: replica loop (where a run spends its time).
MODULES: tuple[str, ...] = (
    "pagesim/engine/policy/scheduling/admission.py",
    "pagesim/engine/policy/memory/block_key.py",
    "pagesim/engine/policy/memory/block_pool.py",
    "pagesim/engine/policy/fast_path/bulk_decode.py",
    "pagesim/engine/policy/memory/eviction.py",
    "pagesim/engine/policy/fast_path/fast_forward.py",
    "pagesim/engine/policy/memory/kv_manager.py",
    "pagesim/engine/policy/scheduling/output.py",
    "pagesim/engine/policy/scheduling/planning.py",
    "pagesim/engine/policy/memory/prefix_cache.py",
    "pagesim/engine/policy/scheduling/request.py",
    "pagesim/engine/policy/scheduling/sampling.py",
    "pagesim/engine/policy/scheduling/lag.py",
    "pagesim/engine/policy/scheduling/scheduler.py",
    "pagesim/engine/policy/scheduling/steps/base.py",
    "pagesim/engine/policy/scheduling/steps/vllm_v0.py",
    "pagesim/engine/policy/scheduling/steps/vllm_v1.py",
    "pagesim/engine/policy/memory/usage.py",
    "pagesim/sim/decode_spans.py",
    "pagesim/sim/replica.py",
    "pagesim/sim/skip_ahead.py",
    "pagesim/sim/token_runs.py",
)

#: The build's record of what it compiled: ``{path: sha256 of the source}`` (beside this file).
MANIFEST = "_compiled_sources.json"

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (above pagesim/)
REBUILD = "PAGESIM_COMPILE=1 pip install -e ."
CLEAN = "pip install -e ."


class StaleBuild(ImportError):
    """A compiled module's source changed since the build (or the build's record is missing)."""


def source_digest(path: str) -> str:
    import hashlib  # (here: a pure install never needs it)

    with open(os.path.join(ROOT, path), "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def write_manifest() -> None:
    """Record the digests of the sources about to be compiled (``setup.py``, compiled builds)."""
    import json

    with open(os.path.join(ROOT, "pagesim", "engine", MANIFEST), "w") as out:
        json.dump({path: source_digest(path) for path in MODULES}, out, indent=1, sort_keys=True)


def extension_files(path: str) -> list[str]:
    """The extension files beside source ``path`` (one, in a compiled build; none otherwise)."""
    stem = os.path.join(ROOT, path[:-3])
    return [stem + suffix for suffix in EXTENSION_SUFFIXES if os.path.exists(stem + suffix)]


def compiled_modules() -> list[str]:
    """The dotted names of the modules this install runs compiled (empty for a pure install),
    having checked each against the build's record of its source (``StaleBuild`` if one differs)."""
    compiled = [path for path in MODULES if extension_files(path)]
    if not compiled:
        return []
    import json

    try:
        with open(os.path.join(ROOT, "pagesim", "engine", MANIFEST)) as record:
            built = json.load(record)
    except (OSError, ValueError):
        built = {}
    changed = [path for path in compiled if built.get(path) != source_digest(path)]
    if changed:
        raise StaleBuild(
            f"pagesim: {len(changed)} compiled module(s) no longer match their source ({', '.join(changed)}): "
            f"rebuild with `{REBUILD}`, or go back to pure Python with `{CLEAN}`")
    return [path[:-3].replace("/", ".") for path in compiled]


def describe(names: list[str]) -> str:
    """The build in words (``pagesim --version``, the benchmark's header)."""
    return f"{len(names)} of {len(MODULES)} modules compiled with mypyc" if names else "pure Python"
