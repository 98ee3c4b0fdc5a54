"""The opt-in compiled build (pagesim/engine/compiled.py): its module list, its guard against stale
extension files, and the declared types mypyc checks as the compiled modules run.

The compiled build itself is built and run by CI (``.ci/run``: the same tests and figures with
``PAGESIM_COMPILE=1``); these tests hold on any install."""

import importlib.util
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

from pagesim import engine
from pagesim.engine import compiled


def test_every_listed_module_exists_once_and_is_importable():
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)
    for path in compiled.MODULES:
        assert path.endswith(".py") and os.path.isfile(os.path.join(compiled.ROOT, path)), path
        assert importlib.util.find_spec(path[:-3].replace("/", ".")) is not None, path


def test_this_install_reports_what_it_runs_compiled():
    names = {path[:-3].replace("/", ".") for path in compiled.MODULES}
    assert set(engine.COMPILED) <= names
    for name in engine.COMPILED:  # (each one imports from its extension file)
        origin = importlib.util.find_spec(name).origin
        assert origin.endswith(tuple(EXTENSION_SUFFIXES)), (name, origin)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A project root of two modules, one of them "compiled" (an extension file beside it)."""
    for name in ("a", "b"):
        (tmp_path / "pagesim" / "engine" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pagesim" / "engine" / f"{name}.py").write_text(f"X = {name!r}\n")
    monkeypatch.setattr(compiled, "ROOT", str(tmp_path))
    monkeypatch.setattr(compiled, "MODULES", ("pagesim/engine/a.py", "pagesim/engine/b.py"))
    return tmp_path


def test_a_pure_install_has_nothing_compiled(tree):
    assert compiled.compiled_modules() == []


def test_a_compiled_module_runs_only_while_its_source_is_the_one_built(tree):
    extension = tree / "pagesim" / "engine" / f"a{EXTENSION_SUFFIXES[0]}"
    extension.write_bytes(b"")
    with pytest.raises(compiled.StaleBuild, match="pagesim/engine/a.py"):  # no record of the build at all
        compiled.compiled_modules()
    compiled.write_manifest()
    assert compiled.compiled_modules() == ["pagesim.engine.a"]
    (tree / "pagesim" / "engine" / "b.py").write_text("X = 'changed'\n")  # (not compiled: nothing runs stale)
    assert compiled.compiled_modules() == ["pagesim.engine.a"]
    (tree / "pagesim" / "engine" / "a.py").write_text("X = 'changed'\n")
    with pytest.raises(compiled.StaleBuild) as stale:
        compiled.compiled_modules()
    message = str(stale.value)
    assert "pagesim/engine/a.py" in message and "pagesim/engine/b.py" not in message
    assert compiled.REBUILD in message and compiled.CLEAN in message
    assert isinstance(stale.value, ImportError)
    extension.unlink()  # what a plain build does first (setup.py)
    assert compiled.compiled_modules() == []


def test_the_command_says_a_stale_build_in_one_line(tmp_path):
    """``pagesim`` on a stale build: the message and exit 2, not a traceback (a library import
    gets the ImportError itself)."""
    root = tmp_path / "root"
    package = root / "pagesim" / "engine"
    package.mkdir(parents=True)
    (root / "pagesim" / "__init__.py").write_text("")
    source = open(os.path.join(compiled.ROOT, "pagesim", "engine", "__init__.py")).read()
    (package / "__init__.py").write_text(source)
    module = open(os.path.join(compiled.ROOT, "pagesim", "engine", "compiled.py")).read()
    (package / "compiled.py").write_text(module.replace(
        'MODULES: tuple[str, ...] = (', 'MODULES: tuple[str, ...] = ("pagesim/engine/a.py",) or ('))
    (package / "a.py").write_text("X = 1\n")
    (package / f"a{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    script = f"import sys; sys.path.insert(0, {str(root)!r}); sys.argv[0] = {{argv0!r}}; import pagesim.engine"
    env = {**os.environ, "PYTHONPATH": ""}
    as_command = subprocess.run([sys.executable, "-c", script.format(argv0="/usr/bin/pagesim")],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
    assert as_command.returncode == 2
    assert as_command.stderr.count("\n") == 1 and "pagesim/engine/a.py" in as_command.stderr, as_command.stderr
    as_library = subprocess.run([sys.executable, "-c", script.format(argv0="-c")],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
    assert as_library.returncode == 1 and "StaleBuild" in as_library.stderr


def test_the_compiled_modules_declared_types_hold():
    """mypyc checks declared types at run time: a wrong annotation in a compiled module is a
    TypeError there, so the annotations of every compiled module must type-check."""
    api = pytest.importorskip("mypy.api", reason="mypy (the [dev] extra) checks the compiled modules' types")
    out, err, status = api.run(["--ignore-missing-imports", "--follow-imports=silent", "--no-incremental",
                                *(os.path.join(compiled.ROOT, path) for path in compiled.MODULES)])
    assert status == 0, out + err


# ------------------------------------------------- the written-out __init__ of hot dataclasses
def _written_out():
    from pagesim.engine.policy.fast_path.fast_forward import Advanced, DecodeRun, DecodeStep
    from pagesim.engine.policy.scheduling.output import ScheduledSequence, SchedulerOutput
    from pagesim.engine.policy.scheduling.request import Request, Sequence
    from pagesim.engine.policy.scheduling.steps.base import Step
    from pagesim.engine.policy.memory.usage import KvUsage

    return [DecodeRun, Advanced, DecodeStep, Step, Request, Sequence, ScheduledSequence, SchedulerOutput, KvUsage]


@pytest.mark.parametrize("cls", _written_out(), ids=lambda cls: cls.__name__)
def test_a_written_out_init_takes_the_dataclass_fields(cls):
    """Its parameters are the fields ``@dataclass`` would take, in order, with the same defaults
    (``None`` standing for a default factory's fresh value)."""
    import dataclasses
    import inspect

    if cls.__module__ in engine.COMPILED:
        pytest.skip("compiled, a function's signature is (*args, **kwargs): checked in the pure-Python run")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        if f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name
        elif f.default is dataclasses.MISSING:
            assert p.default is inspect.Parameter.empty, f.name
        else:
            assert p.default == f.default and type(p.default) is type(f.default), f.name


@pytest.mark.parametrize("cls", _written_out(), ids=lambda cls: cls.__name__)
def test_a_written_out_init_sets_every_field(cls):
    """Each field gets its own argument, or the dataclass default (a fresh one from a factory)."""
    import dataclasses

    from pagesim.engine.policy.scheduling.request import Request

    if cls.__module__ in engine.COMPILED and cls is not Request:
        pytest.skip("compiled, the fields take only their declared types (checked in the pure-Python run)")
    fields = dataclasses.fields(cls)
    given = {f.name: object() for f in fields if f.init and f.default is dataclasses.MISSING
             and f.default_factory is dataclasses.MISSING}
    if cls is Request:  # (its __post_init__ checks its arguments, and makes its first sequence)
        given = {"request_id": "r", "prompt_len": 3, "max_tokens": 2}
    made = cls(**given)
    for f in fields:
        value = getattr(made, f.name)
        if f.name in given:
            assert value is given[f.name], f.name
        elif cls is Request and f.name in ("seqs", "live_seqs"):
            assert [s.index for s in value] == [0]
        elif f.default_factory is not dataclasses.MISSING:
            assert value == f.default_factory(), f.name
            if f.default_factory() is not f.default_factory():  # (a factory of fresh values: one each)
                assert value is not getattr(cls(**given), f.name), f.name
        else:
            assert value == f.default and type(value) is type(f.default), f.name
    if any(f.init for f in fields if f.name not in given):  # every optional argument lands in its own field
        optional = {f.name: object() for f in fields if f.init and f.name not in given}
        if cls is not Request:
            made = cls(**given, **optional)
            assert all(getattr(made, name) is value for name, value in optional.items())
