"""Plug-ins cannot take pagesim down (issue 24): a wrong return, an exception or ``sys.exit`` in
plug-in code is one ``error:`` line naming the plug-in and the method, exit status 2; and sizes
a run cannot hold (replicas, KV blocks) are refused before anything is built."""

from __future__ import annotations

import pickle
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy.plugins.guard import PluginError
from pagesim.engine.policy.plugins.user import KINDS, load_plugin
from tests.conftest import pure_python_only

ROOT = Path(__file__).resolve().parents[1]
SIM = ["simulate", "--no-progress", "--json", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "50",
       "--num-gpu-blocks", "300"]

VICTIMS = """
import sys

from pagesim.engine.policy.scheduling.preemption import VictimPolicy


class Str(VictimPolicy):
    name = "str"

    def choose(self, candidates):
        return "r1"


class Nothing(VictimPolicy):
    name = "nothing"

    def choose(self, candidates):
        return None


class Stranger(VictimPolicy):
    name = "stranger"

    def __init__(self):
        self.chosen = []

    def choose(self, candidates):  # a request it chose before, once that is no longer a candidate
        for request in self.chosen:
            if all(request is not c for c in candidates):
                return request
        self.chosen.append(candidates[-1])
        return candidates[-1]


class Raises(VictimPolicy):
    name = "raises"

    def choose(self, candidates):
        return self.lookup({})

    def lookup(self, table):
        return table["x"]


class Exits(VictimPolicy):
    name = "exits"

    def choose(self, candidates):
        sys.exit(0)


class Fine(VictimPolicy):
    name = "fine"

    def choose(self, candidates):
        return candidates[-1]
"""
EVICTION = """
from pagesim.engine.policy.memory.eviction import EvictionPolicy


class Garbage(EvictionPolicy):
    name = "garbage"

    def __init__(self, stats):
        super().__init__(stats)
        self._blocks = {}

    def add(self, block_id):
        self._blocks[block_id] = None

    def remove(self, block_id):
        del self._blocks[block_id]

    def pop(self):
        return "oldest"

    def __len__(self):
        return len(self._blocks)

    def __contains__(self, block_id):
        return block_id in self._blocks


class Empty(Garbage):
    name = "empty"

    def pop(self):
        return None
"""
OTHERS = """
from pagesim.engine.policy.scheduling.preemption import PreemptionMode
from pagesim.engine.policy.scheduling.scheduler import Scheduler


class Capitalised(PreemptionMode):
    name = "capitalised"

    def choose(self, request, *, num_blocks, num_tokens):
        return "Swap"


class Broken(Scheduler):
    name = "broken"

    def schedule(self):
        if self.next_step == 3:
            self.helper()
        return super().schedule()

    def helper(self):
        return self.no_such_setting


class Misuses(Scheduler):
    name = "misuses"

    def schedule(self):
        if self.next_step == 3:
            self.abort_request("no-such-request")
        return super().schedule()


class Aborts(Scheduler):
    name = "aborts"

    def schedule(self):
        return super().schedule()
"""


pytestmark = pytest.mark.usefixtures("plugin_registries")  # (conftest: each test starts from the built-ins)


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def line_of(text: str, fragment: str) -> int:
    """The line of ``write(.., text, ..)``'s file that holds ``fragment``."""
    return next(n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if fragment in line)


def refused(capsys, argv: list[str]) -> str:
    """Run ``pagesim`` in-process; it must exit 2 with one stderr line, which is returned."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


# ------------------------------------------------------------------ wrong returns and exceptions
@pytest.mark.parametrize("cls, flags, message", [
    ("Str", ["--victim", "str"], r"choose\(\) returned a str \('r1'\); expected one of the \d+ candidate requests$"),
    ("Nothing", ["--victim", "nothing"], r"choose\(\) returned None; expected one of the \d+ candidate requests$"),
    ("Stranger", ["--victim", "stranger"],
     r"choose\(\) returned request '\w+', which is not one of the \d+ candidate requests \(the running"),
    ("Raises", ["--victim", "raises"], r"choose\(\) raised KeyError: 'x' \(victims\.py line {table}\)$"),
    ("Exits", ["--victim", "exits"],
     r"choose\(\) called sys\.exit\(0\) \(victims\.py line {exit}\); a plug-in cannot end pagesim$"),
])
def test_a_victim_plugin_that_misbehaves_is_one_line(tmp_path, capsys, monkeypatch, cls, flags, message):
    write(tmp_path, VICTIMS, "victims.py")
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, [*SIM, "--plugin", f"victims.py:{cls}", *flags])
    assert err.startswith(f"pagesim simulate: error: plugin 'victims.py:{cls}': "), err
    lines = {"table": line_of(VICTIMS, 'table["x"]'), "exit": line_of(VICTIMS, "sys.exit(0)")}
    assert re.search(message.format(**lines), err), err


@pytest.mark.parametrize("cls, message", [
    ("Garbage", r"pop\(\) returned a str \('oldest'\); expected the id \(an int\) of a block it holds"),
    ("Empty", r"pop\(\) returned None, but its __len__ says it holds \d+ evictable blocks"),
])
def test_an_eviction_plugin_returning_garbage_is_one_line(tmp_path, capsys, cls, message):
    spec = f"{write(tmp_path, EVICTION, 'evict.py')}:{cls}"
    err = refused(capsys, [*SIM, "--plugin", spec, "--eviction", cls.lower(), "--prefix-caching", "on"])
    assert err.startswith(f"pagesim simulate: error: plugin {spec!r}: ") and re.search(message, err), err


def test_a_preemption_mode_and_a_scheduler_subclass_are_guarded(tmp_path, capsys):
    path = write(tmp_path, OTHERS, "others.py")
    err = refused(capsys, [*SIM, "--plugin", f"{path}:Capitalised", "--preemption", "capitalised"])
    assert err.endswith(f"plugin '{path}:Capitalised': choose() returned a str ('Swap'); "
                        f"expected 'recompute' or 'swap'")
    err = refused(capsys, [*SIM, "--plugin", f"{path}:Broken", "--scheduler", "broken"])
    assert re.search(r"plugin '.*:Broken': schedule\(\) raised AttributeError: 'Broken' object has no attribute "
                     rf"'no_such_setting' \(.*others\.py line {line_of(OTHERS, 'no_such_setting')}\)$", err), err
    # raised in pagesim code the plug-in called: both lines
    err = refused(capsys, [*SIM, "--plugin", f"{path}:Misuses", "--scheduler", "misuses"])
    assert re.search(r"plugin '.*:Misuses': schedule\(\) raised ValueError: cannot abort request 'no-such-request': "
                     r"it is not unfinished in this scheduler \(in "
                     rf"pagesim/engine/policy/scheduling/scheduler\.py line \d+, called from .*others\.py line "
                     rf"{line_of(OTHERS, 'no-such-request')}\)$", err), err


@pure_python_only("pagesim.engine.policy.scheduling.scheduler", "the test makes a scheduler without its __init__")
def test_a_scheduler_subclass_lets_pagesims_own_errors_through(tmp_path, monkeypatch):
    """An error class pagesim defines, raised below the plug-in, keeps its type, so the command's
    own handling applies (``simulate`` restates vLLM 0.6.3's abort)."""
    from pagesim.engine.policy.scheduling.scheduler import Scheduler
    from pagesim.engine.policy.scheduling.steps.vllm_v0 import VllmV0Abort

    def abort(self):
        raise VllmV0Abort("as vLLM 0.6.3 would")

    cls = load_plugin(f"{write(tmp_path, OTHERS, 'others.py')}:Aborts").cls
    monkeypatch.setattr(Scheduler, "schedule", abort)
    with pytest.raises(VllmV0Abort, match="as vLLM 0.6.3 would"):
        cls.schedule(object.__new__(cls))


def test_a_guarded_class_is_still_the_users_class(tmp_path):
    """The registry holds the very class (identity, name, pickling by name); a well-behaved
    plug-in's results go through unchanged; loading again guards nothing twice."""
    plugin = load_plugin(f"{write(tmp_path, VICTIMS, 'victims.py')}:Fine")
    cls = plugin.cls
    assert sys.modules[cls.__module__].Fine is cls and KINDS["victim"].registry["fine"] is cls
    assert (cls.__name__, cls.choose.__name__) == ("Fine", "choose")
    candidates = ["a", "b"]
    assert cls().choose(candidates) is candidates[-1]
    assert type(pickle.loads(pickle.dumps(cls()))) is cls
    wrapper = cls.choose
    assert load_plugin(plugin.spec).cls is cls and cls.choose is wrapper
    with pytest.raises(PluginError, match=r"plugin '.*:Fine': choose\(\) raised IndexError: list index out of range "
                                          r"\(.*victims\.py line \d+\)$"):
        cls().choose([])
    odd = type("Odd", (cls,), {"choose": lambda self, candidates: "x"})
    assert odd().choose(["y"]) == "x"  # a subclass pagesim never loaded is not checked


# ------------------------------------------------------------------ exiting and interrupting
def test_a_plugin_file_calling_sys_exit_fails_the_run(tmp_path):
    """In a real process: `pagesim simulate` used to exit 0 having simulated nothing."""
    path = write(tmp_path, "import sys\n\nsys.exit(0)\n", "exits.py")
    proc = subprocess.run([sys.executable, "-m", "pagesim.engine.cli", *SIM, "--plugin", f"{path}:X"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"pagesim simulate: error: plugin '{path}:X': {path} line 3: SystemExit: the file called "
                           f"sys.exit(0); a plug-in cannot end pagesim\n")


def test_a_plugin_file_raising_keyboard_interrupt_is_reported(tmp_path, capsys):
    path = write(tmp_path, "raise KeyboardInterrupt\n", "stops.py")
    err = refused(capsys, [*SIM, "--plugin", f"{path}:X"])
    assert err == (f"pagesim simulate: error: plugin '{path}:X': {path} line 1: KeyboardInterrupt (raised by the "
                   f"plug-in's code; a plug-in cannot stop pagesim)")


def test_sigterm_during_a_plugin_import_still_interrupts(tmp_path):
    """``pagesim.engine.cli.Terminated`` (SIGTERM) is a real interruption, never the file's failure."""
    from pagesim.engine.cli import Terminated

    path = write(tmp_path, "from pagesim.engine.cli import Terminated\nraise Terminated()\n", "term.py")
    with pytest.raises(Terminated):
        load_plugin(f"{path}:X")


def test_keyboard_interrupt_in_a_method_stays_an_interruption(tmp_path):
    path = write(tmp_path, VICTIMS.replace("sys.exit(0)", "raise KeyboardInterrupt"), "victims.py")
    cls = load_plugin(f"{path}:Exits").cls
    with pytest.raises(KeyboardInterrupt):
        cls().choose(["a"])


# ------------------------------------------------------------------ sizes
@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if a scheduler (and so a KV cache) is built."""
    import pagesim.sim.setup

    def build_nothing(name):
        pytest.fail(f"a scheduler was built ({name})")

    monkeypatch.setattr(pagesim.sim.setup, "scheduler_class", build_nothing)


def test_too_many_replicas_are_refused_before_anything_is_built(capsys, nothing_built):
    err = refused(capsys, [*SIM, "--replicas", "10000"])
    assert err == ("pagesim simulate: error: --replicas 10000 is more than the 1024 this simulator builds "
                   "(each replica is a scheduler and KV cache of its own)")


@pytest.mark.parametrize("flags, message", [
    (["--num-gpu-blocks", "1000000000000"], r"the KV cache would be 1,000,000,000,000 GPU blocks \+ 2,048 CPU \(swap and offload\) blocks"),
    (["--swap-space", "100000000"], r"\+ 51,200,000,000 CPU \(swap and offload\) blocks = "),
    (["--replicas", "1024", "--num-gpu-blocks", "100000"],
     r"1024 replicas x \(100,000 GPU blocks \+ 2,048 CPU \(swap and offload\) blocks\) = 104,497,152 blocks, more than the 50,000,000"),
])
def test_a_kv_cache_too_large_to_build_is_refused_before_it_is_built(capsys, monkeypatch, flags, message):
    import pagesim.sim.setup

    if "--replicas" in flags:  # the first replica is built (and checked alone), the other 1023 are not
        built = []
        real = pagesim.sim.setup.scheduler_class
        monkeypatch.setattr(pagesim.sim.setup, "scheduler_class", lambda name: built.append(name) or real(name))
    else:
        monkeypatch.setattr(pagesim.sim.setup, "scheduler_class", lambda name: pytest.fail("a scheduler was built"))
    argv = [*(SIM[:-2] if "--num-gpu-blocks" in flags else SIM), *flags]  # (SIM's --num-gpu-blocks 300 replaced)
    err = refused(capsys, argv)
    assert re.search(message, err), err
    if "--replicas" in flags:
        assert built == ["default"]


def test_a_memory_error_prints_its_own_message(capsys, monkeypatch):
    import pagesim.sim.setup

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(pagesim.sim.setup, "scheduler_class", lambda name: exhausted)
    err = refused(capsys, SIM)
    assert err == "pagesim simulate: error: out of memory building a KV cache of 300 GPU and 2,048 CPU blocks"


# ------------------------------------------------------------------ correct plug-ins are left alone
CORRECT = """
import numpy as np

from pagesim.engine.policy.memory.eviction import LRUPolicy
from pagesim.engine.policy.scheduling.preemption import VictimPolicy


class NoPick(Exception):
    pass


class Careful(VictimPolicy):
    name = "careful"

    def _pick(self, candidates):
        raise NoPick()  # the plug-in's own signal, caught by its own caller

    def choose(self, candidates):
        try:
            return self._pick(candidates)
        except NoPick:
            return candidates[-1]


class NumpyIds(LRUPolicy):
    name = "numpy-ids"

    def pop(self):
        block_id = super().pop()
        return None if block_id is None else np.int64(block_id)


class Nested(LRUPolicy):
    name = "nested"

    def pop_many(self, count):
        return [[b] for b in super().pop_many(count)]
"""
PRESSURE = ["--kv-cache-gb", "0.2", "--prefix-caching", "on", "--rate", "50", "--num-requests", "300"]


@pytest.mark.parametrize("flags", [["--victim", "careful"], ["--eviction", "numpy-ids"]])
def test_a_correct_plugin_runs_as_it_would_unguarded(tmp_path, capsys, monkeypatch, flags):
    """An exception a plug-in raises and catches itself stays its own (its helpers are not
    wrapped), and a NumPy integer is a block id."""
    write(tmp_path, CORRECT, "correct.py")
    monkeypatch.chdir(tmp_path)
    name = {"--victim": "Careful", "--eviction": "NumpyIds"}[flags[0]]
    assert main(["simulate", "--no-progress", "--workload", "shared-system-prompt", *PRESSURE, "--json",
                 "--plugin", f"correct.py:{name}", *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_completed"] + summary["requests_rejected"] == 300 and summary["requests_completed"] > 200
    assert summary["preemptions"]["recompute"] + summary["preemptions"].get("swap", 0) > 0  # choose() was called


def test_a_return_too_odd_to_check_is_one_line(tmp_path, capsys, monkeypatch):
    write(tmp_path, CORRECT, "correct.py")
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, ["simulate", "--no-progress", "--workload", "shared-system-prompt", *PRESSURE,
                           "--plugin", "correct.py:Nested", "--eviction", "nested"])
    assert re.search(r"plugin 'correct\.py:Nested': pop_many\(\) returned a list \(\[\d+\]\); expected the id", err), err
