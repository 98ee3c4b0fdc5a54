"""Shared test settings.

Hypothesis profiles: ``default`` keeps example counts moderate so the suite fits CI's two cores;
``long`` (``HYPOTHESIS_PROFILE=long pytest``) runs ten times more examples for a deeper search.
Tests that need a minimum number of examples set ``max_examples`` themselves; the ``long`` profile
multiplies those through ``scaled_examples``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Triton kernels run on CPU tensors only in Triton's interpreter, which is chosen when a kernel is
# defined: set it before any test imports pagesim.kernels.triton_* (a CUDA machine runs them compiled).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every block table freed with a layout is checked against the pool (pagesim.engine.policy.memory.block_pool's
# BlockPool.check_layouts), here and in the command-line runs tests start.
os.environ.setdefault("PAGESIM_CHECK_LAYOUTS", "1")

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "long",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    max_examples=1000,
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
settings.load_profile(PROFILE)


#: The suite's slowest tests (``@pytest.mark.slow``: the deepest properties, the scripts that start
#: many processes) are left out of a plain ``pytest -q`` so that it stays a few minutes on two cores;
#: CI runs them too (``pytest -q -m slow``). They run whenever asked: ``-m slow`` (or any ``-m``),
#: ``PAGESIM_SLOW=1``, or a test named by its node id (``pytest tests/test_x.py::test_y``).
def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr") or os.environ.get("PAGESIM_SLOW") == "1" or any("::" in a for a in config.args):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


#: Tests that assert a wall-clock figure (an accuracy or a speed) run only when asked, on a machine
#: kept quiet for them: ``PAGESIM_TIMED_TESTS=1 pytest ...``. The default suite asserts no timing
#: (it must pass on a shared, busy machine; issue 56).
timed_only = pytest.mark.skipif(os.environ.get("PAGESIM_TIMED_TESTS") != "1",
                                reason="asserts a wall-clock figure: PAGESIM_TIMED_TESTS=1 on a quiet machine")


def scaled_examples(n: int) -> int:
    """``n`` examples by default, ten times more under the ``long`` profile."""
    return n * 10 if PROFILE == "long" else n


def pure_python_only(module: str, why: str):
    """Skip a test on a compiled build (pagesim/engine/compiled.py) that compiles ``module``: for tests
    that reach into it in ways only interpreted code allows (spying on the functions it calls,
    which compiled code calls directly; replacing an instance's method; deep-copying a scheduler,
    whose compiled parts are made only through their __init__). The pure-Python run has them."""
    from pagesim import engine

    return pytest.mark.skipif(module in engine.COMPILED, reason=f"{module} is compiled: {why}")


SHARED = Path(__file__).resolve().parents[2] / "shared"
_ALL_ORACLE_CASES = sorted((SHARED / "oracle").glob("*/case_*.spec.json")) if (SHARED / "oracle").is_dir() else []


def _oracle_version(spec_path: Path) -> str:
    import json

    return json.loads(spec_path.read_text())["vllm_version"]


#: the vLLM 0.33 folders the oracle replay reads (priority scheduling, the hybrid KV-cache manager, KV
#: offloading; issue 58)
ORACLE_033_FOLDERS = ("vllm-0.33-v1-priority", "vllm-0.33-v1-hybrid", "vllm-0.33-v1-offload")
#: the shared oracle's cases the presets reproduce: 0.32 v1, 0.6.3 v0, and 0.33's priority, hybrid and offload folders
ORACLE_CASES = [p for p in _ALL_ORACLE_CASES
                if _oracle_version(p) in ("0.32.0", "0.6.3") or p.parent.name in ORACLE_033_FOLDERS]
#: the cases of ``shared/oracle/README.md``'s own scope (0.32 v1 and 0.6.3 v0): what
#: ``tests/oracle_reference.py``, written from that README alone, is checked against
ORACLE_README_CASES = [p for p in ORACLE_CASES if _oracle_version(p) in ("0.32.0", "0.6.3")]
#: the other cases (a folder of a vLLM version or path the replay does not read yet; none today):
#: ``tests/test_oracle.py`` holds them as strict expected failures until it does
ORACLE_CASES_PENDING = [p for p in _ALL_ORACLE_CASES if p not in ORACLE_CASES]


def golden_log(spec_path: Path) -> Path:
    """The vLLM decision log beside an oracle spec (``case_NNN.log.jsonl``)."""
    return spec_path.with_name(spec_path.name.replace(".spec.json", ".log.jsonl"))


@pytest.fixture
def plugin_registries():
    """The plug-in registries (victim, eviction, preemption, scheduler) as the test found them,
    put back after it: a plug-in a test loads does not outlive the test."""
    from pagesim.engine.policy.plugins.user import KINDS

    saved = {kind: dict(k.registry) for kind, k in KINDS.items()}
    yield
    for kind, k in KINDS.items():
        k.registry.clear()
        k.registry.update(saved[kind])


@pytest.fixture
def one_thread():
    """One torch thread (tiny tensors; test workers share the cores), restored after
    (``pytestmark = pytest.mark.usefixtures("one_thread")`` in an engine test module)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
