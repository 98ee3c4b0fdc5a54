"""User plug-ins (``--plugin FILE.py:CLASS``): each kind loads from a file of its own and is
registered by name; every bad spec is one clear error; the plug-in really runs in ``simulate``,
in a study's worker processes and on the engine (``pagesim run``)."""

from __future__ import annotations

import json
import multiprocessing
import re
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy.plugins.user import KINDS, SCHEDULERS, load_plugin, scheduler_class, source_digest
from pagesim.reports.run_config import run_id
from pagesim.reports.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'most_remaining_victim.py'}:MostRemainingVictim"
SIM = ["simulate", "--no-progress", "--json", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "50",
       "--num-gpu-blocks", "300"]

VICTIM = """
from pagesim.engine.policy.scheduling.preemption import VictimPolicy

class CountingVictim(VictimPolicy):
    name = "counting"
    calls = 0

    def choose(self, candidates):
        type(self).calls += 1
        return candidates[-1]
"""
EVICTION = """
from collections import OrderedDict
from pagesim.engine.policy.memory.eviction import EvictionPolicy

class MostRecentFirst(EvictionPolicy):  # no `name`: registered as the class name
    def __init__(self, stats):
        super().__init__(stats)
        self._order = OrderedDict()

    def add(self, block_id):
        self._order[block_id] = None

    def remove(self, block_id):
        del self._order[block_id]

    def pop(self):
        return self._order.popitem(last=True)[0] if self._order else None

    def __len__(self):
        return len(self._order)

    def __contains__(self, block_id):
        return block_id in self._order
"""
MODE = """
from pagesim.engine.policy.scheduling.preemption import PreemptionMode

class AlwaysSwap(PreemptionMode):
    name = "always-swap"

    def choose(self, request, *, num_blocks, num_tokens):
        return "swap"
"""
SCHEDULER = """
from pagesim.engine.policy.scheduling.scheduler import Scheduler

class CountingScheduler(Scheduler):
    name = "counting-scheduler"
    steps = 0

    def schedule(self):
        type(self).steps += 1
        return super().schedule()
"""


pytestmark = pytest.mark.usefixtures("plugin_registries")  # (conftest: each test starts from the built-ins)


def write(tmp_path: Path, text: str, name: str = "plugin.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------------ loading
@pytest.mark.parametrize("text, cls, kind, name", [
    (VICTIM, "CountingVictim", "victim", "counting"),
    (EVICTION, "MostRecentFirst", "eviction", "MostRecentFirst"),
    (MODE, "AlwaysSwap", "preemption", "always-swap"),
    (SCHEDULER, "CountingScheduler", "scheduler", "counting-scheduler"),
])
def test_each_kind_is_registered_by_name(tmp_path, text, cls, kind, name):
    spec = f"{write(tmp_path, text)}:{cls}"
    plugin = load_plugin(spec)
    assert (plugin.kind, plugin.name, plugin.cls.__name__, plugin.spec) == (kind, name, cls, spec)
    assert KINDS[kind].registry[name] is plugin.cls
    assert load_plugin(spec) == plugin  # idempotent: the same class, registered once
    assert load_plugin(f"{tmp_path}/./plugin.py:{cls}").cls is plugin.cls  # the file, however spelled
    if kind == "scheduler":
        assert scheduler_class(name) is plugin.cls and scheduler_class(None) is SCHEDULERS["default"]


def test_a_module_path_loads_too(tmp_path, monkeypatch):
    write(tmp_path, MODE, "pagesim_test_modes.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_plugin("pagesim_test_modes:AlwaysSwap").name == "always-swap"


def test_the_digest_follows_the_file(tmp_path):
    path = write(tmp_path, VICTIM)
    plugin = load_plugin(f"{path}:CountingVictim")
    before = source_digest([plugin])
    path.write_text(path.read_text() + "\n# edited\n")
    assert source_digest([plugin]) != before


BAD_SPECS = [
    ("{dir}/plugin.py", "expected FILE.py:CLASS or module.path:CLASS"),
    ("{dir}/plugin.py:", "expected FILE.py:CLASS"),
    (":CountingVictim", "expected FILE.py:CLASS"),
    ("{dir}/plugin.py:not-a-name", "expected FILE.py:CLASS"),
    ("{dir}/missing.py:X", r"no such file .*missing\.py"),
    ("{dir}/notes.txt:X", r"notes\.txt is not a Python file \(\.py\)"),
    ("{dir}:X", "is a folder, not a Python file"),
    ("no_such_pagesim_module:X", "no such file or module no_such_pagesim_module"),
    ("{dir}/plugin.py:Missing", r"plugin\.py has no class Missing \(its classes: CountingVictim\)"),
    ("{dir}/plugin.py:VictimPolicy", "leaves abstract method"),  # the imported base itself
    ("{dir}/other.py:CONSTANT", r"CONSTANT in .*other\.py is not a class \(its type: int\)"),
    ("{dir}/other.py:Plain", "Plain subclasses none of VictimPolicy, EvictionPolicy, PreemptionMode, OffloadPolicy or Scheduler"),
    ("{dir}/other.py:Both", "Both subclasses VictimPolicy and PreemptionMode; a plug-in is one of them"),
    ("{dir}/other.py:Abstract", r"Abstract leaves abstract method\(s\) choose unimplemented"),
    ("{dir}/other.py:Builtin", "victim policy name 'priority' is taken by a built-in; give Builtin a `name"),
    ("{dir}/other.py:Unnamed", "Unnamed.name must be a non-empty string"),
    ("{dir}/syntax.py:X", r"syntax\.py line 3: SyntaxError: "),
    ("{dir}/imports.py:X", r"imports\.py line 2: ModuleNotFoundError: No module named 'no_such_pagesim_dep'"),
    ("{dir}/raises.py:X", r"raises\.py line 2: RuntimeError: boom"),
]
OTHER = """
from pagesim.engine.policy.scheduling.preemption import PreemptionMode, VictimPolicy

CONSTANT = 3

class Plain:
    pass

class Both(VictimPolicy, PreemptionMode):
    def choose(self, *args, **kwargs):
        return None

class Abstract(VictimPolicy):
    pass

class Builtin(VictimPolicy):
    name = "priority"

    def choose(self, candidates):
        return candidates[0]

class Unnamed(Builtin):
    name = ""
"""


@pytest.mark.parametrize("spec, message", BAD_SPECS)
def test_a_bad_spec_is_one_clear_line(tmp_path, spec, message):
    write(tmp_path, VICTIM)
    write(tmp_path, OTHER, "other.py")
    write(tmp_path, "x = 1\n\ndef broken(:\n    pass\n", "syntax.py")
    write(tmp_path, "import os\nimport no_such_pagesim_dep\n", "imports.py")
    write(tmp_path, "def explode():\n    raise RuntimeError('boom')\nexplode()\n", "raises.py")
    (tmp_path / "notes.txt").write_text("not python")
    spec = spec.format(dir=tmp_path)
    with pytest.raises(ValueError, match=message) as info:
        load_plugin(spec)
    text = str(info.value)
    assert text.startswith(f"plugin {spec!r}: ") and "\n" not in text


def test_a_failed_file_can_be_fixed_and_loaded(tmp_path):
    path = write(tmp_path, "raise RuntimeError('not yet')\n")
    with pytest.raises(ValueError, match="not yet"):
        load_plugin(f"{path}:CountingVictim")
    path.write_text(VICTIM)
    assert load_plugin(f"{path}:CountingVictim").name == "counting"


def test_two_plugins_cannot_share_a_name(tmp_path):
    load_plugin(f"{write(tmp_path, VICTIM, 'a.py')}:CountingVictim")
    with pytest.raises(ValueError, match="'counting' is taken by CountingVictim from another plug-in"):
        load_plugin(f"{write(tmp_path, VICTIM, 'b.py')}:CountingVictim")


# ------------------------------------------------------------------ simulate
def simulate(capsys, *extra: str) -> dict:
    assert main([*SIM, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_runs_the_plugin(tmp_path, capsys):
    spec = f"{write(tmp_path, VICTIM)}:CountingVictim"
    summary = simulate(capsys, "--plugin", spec, "--victim", "counting")
    calls = KINDS["victim"].registry["counting"].calls
    assert calls == summary["preemptions"]["recompute"] > 0
    # the example preempts by remaining output, not by admission order: another preemption pattern
    default = simulate(capsys)
    example = simulate(capsys, "--plugin", EXAMPLE, "--victim", "most-remaining")
    assert example["requests_completed"] == default["requests_completed"] == 50
    assert example["preemptions"] != default["preemptions"]


def test_simulate_runs_a_scheduler_subclass(tmp_path, capsys):
    spec = f"{write(tmp_path, SCHEDULER)}:CountingScheduler"
    out = tmp_path / "run"
    summary = simulate(capsys, "--plugin", spec, "--scheduler", "counting-scheduler", "--out", str(out))
    assert summary["requests_completed"] == 50
    assert KINDS["scheduler"].registry["counting-scheduler"].steps > 0
    info = json.loads((out / "run_info.json").read_text())["deployment"]
    assert (info["plugins"], info["scheduler_class"]) == ([spec], "counting-scheduler")


@pytest.mark.parametrize("extra, message", [
    (["--plugin", "{victim}"], "is the victim policy 'counting', but --victim does not select it"),
    (["--victim", "counting"], r"--victim: unknown victim policy 'counting'; choose one of running-tail, .*priority$"),
    (["--plugin", "{victim}", "--victim", "nope"], "choose one of running-tail, .*priority, counting$"),
    (["--preemption", "cost"], "unknown preemption mode 'cost'; choose one of recompute, swap, vllm-v0$"),
    (["--scheduler", "mine"], "unknown scheduler 'mine'; choose one of default$"),
    (["--plugin", "{scheduler}", "--scheduler", "counting-scheduler", "--allocator", "max"],
     "--scheduler applies to the paged allocator only"),
    (["--plugin", "nowhere.py:X", "--victim", "x"], "no such file nowhere.py"),
])
def test_simulate_refuses_plugin_flags_that_do_not_fit(tmp_path, capsys, extra, message):
    files = {"victim": f"{write(tmp_path, VICTIM)}:CountingVictim",
             "scheduler": f"{write(tmp_path, SCHEDULER, 'sched.py')}:CountingScheduler"}
    with pytest.raises(SystemExit) as exc:
        main([*SIM, *(e.format(**files) for e in extra)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pagesim simulate: error: ") and "\n" not in err
    assert re.search(message, err), err


# ------------------------------------------------------------------ studies
STUDY = """
name = "plugin-study"
plugins = ["{example}"]
[source]
workload = "kwon2023-sharegpt"
rate = 4.0
num_requests = 50
[base]
num_gpu_blocks = 300
[[grid]]
victim = ["running-tail", "most-remaining"]
"""


def test_a_study_runs_plugins_in_worker_processes(tmp_path):
    from pagesim.reports.execute import run_study
    from pagesim.reports.store import ResultsStore

    spec = parse_spec(STUDY.format(example=EXAMPLE), allow_plugins=True)
    outcome = run_study(spec, tmp_path / "study", workers=2, progress=False)
    assert (outcome.total, outcome.failed) == (2, 0)
    records = ResultsStore(tmp_path / "study" / "results.jsonl").load()
    by_victim = {r["config"]["victim"]: r["summary"]["preemptions"] for r in records.values()}
    assert by_victim["most-remaining"] != by_victim["running-tail"]


def test_the_example_study_spec_is_valid(monkeypatch):
    monkeypatch.chdir(ROOT)  # its plug-in path is relative to the working directory, like a trace's
    runs = parse_spec((ROOT / "examples" / "most_remaining_study.toml").read_text(), allow_plugins=True).runs()
    assert sorted((c["victim"], c["rate_scale"]) for c in runs) == sorted(
        (v, r) for v in ("running-tail", "most-remaining") for r in (0.75, 1.0, 1.25))


def test_a_spawned_worker_loads_the_plugin_itself(tmp_path):
    from pagesim.reports.runner import run_one

    runs = parse_spec(STUDY.format(example=EXAMPLE), allow_plugins=True).runs()
    config = next(c for c in runs if c["victim"] == "most-remaining")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        record = pool.submit(run_one, config).result()
    assert record["status"] == "ok", record.get("error")
    assert record["summary"]["requests_completed"] == 50


def test_study_plugin_settings(tmp_path):
    plain = parse_spec(STUDY.replace('plugins = ["{example}"]\n', "").replace('"most-remaining"', '"priority"'))
    assert all("plugins" not in c and "scheduler" not in c for c in plain.runs())  # old run ids unchanged
    path = write(tmp_path, SCHEDULER)
    text = STUDY.format(example=f"{path}:CountingScheduler").replace(
        'victim = ["running-tail", "most-remaining"]', 'scheduler = ["default", "counting-scheduler"]')
    runs = parse_spec(text, allow_plugins=True).runs()
    assert ["scheduler" in c for c in runs] == [False, True]
    before = {run_id(c) for c in runs}
    path.write_text(path.read_text() + "\n# edited\n")
    after = {run_id(c) for c in parse_spec(text, allow_plugins=True).runs()}
    assert after.isdisjoint(before)  # an edited plug-in runs again


NO_PLUGINS = STUDY.replace('plugins = ["{example}"]\n', "")


@pytest.mark.parametrize("text, message", [
    (NO_PLUGINS, "victim = 'most-remaining' is not one of running-tail"),
    (STUDY.replace("{example}", "nowhere.py:X"), "spec: plugin 'nowhere.py:X': no such file nowhere.py"),
    (STUDY.replace('["{example}"]', '"{example}"'), r"plugins must be a list of \"FILE.py:CLASS\" strings"),
    (NO_PLUGINS.replace("[base]\n", '[base]\nplugins = ["{example}"]\n'), "base: plugins is a top-level key"),
])
def test_study_plugin_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(text.format(example=EXAMPLE), allow_plugins=True)


# ------------------------------------------------------------------ engine
RUN = ["run", "--workload", "kwon2023-alpaca", "--num-requests", "16", "--model", "tiny", "--block-size", "8",
       "--num-gpu-blocks", "24", "--check-reference", "--json", "--no-progress", "--preemption", "recompute"]


def test_run_serves_with_a_victim_plugin(tmp_path, capsys):
    spec = f"{write(tmp_path, VICTIM)}:CountingVictim"
    assert main([*RUN, "--plugin", spec, "--victim", "counting"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs_match_reference"] is True
    assert KINDS["victim"].registry["counting"].calls == summary["preemptions"]["recompute"] > 0


def test_run_serves_with_a_scheduler_subclass(tmp_path, capsys):
    spec = f"{write(tmp_path, SCHEDULER)}:CountingScheduler"
    assert main([*RUN, "--plugin", spec, "--scheduler", "counting-scheduler"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs_match_reference"] is True
    assert KINDS["scheduler"].registry["counting-scheduler"].steps > 0
