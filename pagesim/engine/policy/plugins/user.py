"""User plug-ins: a policy piece from the user's own Python file, named ``FILE.py:CLASS`` (or
``module.path:CLASS``), so a change to the serving policy is simulated and validated without
editing pagesim.

The class decides its kind by what it subclasses (all in ``pagesim.engine.policy``):

- ``VictimPolicy`` (``scheduling/preemption.py``): which running request is preempted (``--victim``);
- ``EvictionPolicy`` (``memory/eviction.py``): which cached block is given up (``--eviction``);
- ``PreemptionMode`` (``scheduling/preemption.py``): swap or recompute the victim (``--preemption``);
- ``OffloadPolicy`` (``offload/policies.py``): which block the offload store gives up
  (``--kv-offloading-policy``);
- ``Scheduler`` (``scheduling/scheduler.py``): anything else the scheduler does (``--scheduler``).

``load_plugin`` imports the file once per process (loading the same spec again returns the same
class) and registers the class under its name (its own ``name`` attribute, else the class name)
in ``VICTIM_POLICIES``, ``EVICTION_POLICIES``, ``PREEMPTION_MODES``, ``OFFLOAD_POLICIES`` or ``SCHEDULERS``, where the
usual setting selects it. Loading registers; it never selects. A name already held by a built-in
or by another class is refused. Another process (a study's worker) is given the spec string,
never the class, and loads it itself; ``source_digest`` lets a study tell an edited file.

Every failure is one ``PluginError`` (a ``ValueError``) line that names the spec and, for an
error raised while the file runs, the file and line; ``SystemExit`` and ``KeyboardInterrupt``
raised by the file itself are such failures too (a plug-in cannot end pagesim), and so is its
``os._exit`` (``exit_guard``: it raises ``SystemExit`` in a plug-in's files, which would
otherwise end the process with the status it names, 0 included). A registered
class is guarded (``plugin_guard``): what its methods return is checked and what they raise is
one such line too, naming the method.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES, EvictionPolicy
from pagesim.engine.policy.plugins.exit_guard import watch
from pagesim.engine.policy.offload.policies import OFFLOAD_POLICIES, OffloadPolicy
from pagesim.engine.policy.plugins.guard import PluginError, deepest_line, describe, guard
from pagesim.engine.policy.plugins.lookup import lookup
from pagesim.engine.policy.scheduling.preemption import PREEMPTION_MODES, VICTIM_POLICIES, PreemptionMode, VictimPolicy
from pagesim.engine.policy.scheduling.scheduler import Scheduler

#: Scheduler classes by name: the policy's own, and the ``Scheduler`` subclasses plug-ins add.
SCHEDULERS: dict[str, type[Scheduler]] = {"default": Scheduler}


@dataclass(frozen=True, slots=True)
class Kind:
    base: type
    registry: dict[str, type]
    noun: str


#: kind -> what a plug-in of that kind subclasses and where it is registered; the kind is also
#: the flag (``--victim``; ``flag``) and the study setting (``victim``) that selects it by name.
KINDS: dict[str, Kind] = {
    "victim": Kind(VictimPolicy, VICTIM_POLICIES, "victim policy"),
    "eviction": Kind(EvictionPolicy, EVICTION_POLICIES, "eviction policy"),
    "preemption": Kind(PreemptionMode, PREEMPTION_MODES, "preemption mode"),
    "kv_offloading_policy": Kind(OffloadPolicy, OFFLOAD_POLICIES, "offload eviction policy"),
    "scheduler": Kind(Scheduler, SCHEDULERS, "scheduler"),
}
SPEC_FORM = "FILE.py:CLASS or module.path:CLASS"


def flag(kind: str) -> str:
    """The command-line flag that selects a plug-in of ``kind`` (``--kv-offloading-policy``)."""
    return "--" + kind.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Plugin:
    spec: str  # as given: what another process is handed to load it again
    kind: str  # a key of KINDS
    name: str  # under which it is registered
    cls: type
    file: str | None  # the source file, when the module has one

    @property
    def noun(self) -> str:
        return KINDS[self.kind].noun


def load_plugins(specs: Iterable[str]) -> list[Plugin]:
    return [load_plugin(spec) for spec in specs]


def load_plugin(spec: str) -> Plugin:
    if not isinstance(spec, str):
        raise PluginError(f"plugin {spec!r}: expected a string, {SPEC_FORM}")
    where, sep, class_name = spec.rpartition(":")  # rpartition: a Windows path has a colon of its own
    if not sep or not where or not class_name.isidentifier():
        raise PluginError(f"plugin {spec!r}: expected {SPEC_FORM}")
    module = _import(where, spec)
    cls = getattr(module, class_name, None)
    if cls is None:
        own = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise PluginError(f"plugin {spec!r}: {where} has no class {class_name} "
                          f"(its classes: {', '.join(own) or 'none'})")
    if not isinstance(cls, type):
        raise PluginError(f"plugin {spec!r}: {class_name} in {where} is not a class (its type: {type(cls).__name__})")
    kinds = [kind for kind, k in KINDS.items() if issubclass(cls, k.base)]
    if not kinds:
        bases = [k.base.__name__ for k in KINDS.values()]
        raise PluginError(f"plugin {spec!r}: {class_name} subclasses none of {', '.join(bases[:-1])} or {bases[-1]} "
                          f"(engine.policy)")
    if len(kinds) > 1:
        bases = " and ".join(KINDS[k].base.__name__ for k in kinds)
        raise PluginError(f"plugin {spec!r}: {class_name} subclasses {bases}; a plug-in is one of them")
    kind = kinds[0]
    if inspect.isabstract(cls):
        raise PluginError(f"plugin {spec!r}: {class_name} leaves abstract method(s) "
                          f"{', '.join(sorted(cls.__abstractmethods__))} unimplemented")
    # NOTE: the class's own ``name`` only: one inherited from a built-in would clash with it.
    name = cls.__dict__.get("name", class_name)
    if not isinstance(name, str) or not name:
        raise PluginError(f"plugin {spec!r}: {class_name}.name must be a non-empty string, got {name!r}")
    registry = KINDS[kind].registry
    held = registry.get(name)
    if held is not None and held is not cls:
        owner = "a built-in" if _is_builtin(held) else f"{held.__qualname__} from another plug-in"
        raise PluginError(f"plugin {spec!r}: {KINDS[kind].noun} name {name!r} is taken by {owner}; "
                          f"give {class_name} a `name = \"...\"` of its own")
    guard(cls, spec, kind)
    registry[name] = cls
    return Plugin(spec, kind, name, cls, getattr(module, "__file__", None))


def builtin_names(kind: str) -> list[str]:
    """The names of ``kind`` that pagesim itself defines (plug-ins loaded in this process left out)."""
    return [name for name, cls in KINDS[kind].registry.items() if _is_builtin(cls)]


def _is_builtin(cls: type) -> bool:
    return cls.__module__.startswith("pagesim.")


def scheduler_class(name: str | None) -> type[Scheduler]:
    """The scheduler class a ``--scheduler`` / study ``scheduler`` names (``None``: the default)."""
    return lookup(SCHEDULERS, name or "default", "scheduler")


def source_digest(plugins: Iterable[Plugin]) -> str:
    """SHA-256 (16 hex digits) over the plug-ins' source files as they are on disk now."""
    h = hashlib.sha256()
    for plugin in plugins:
        h.update(plugin.spec.encode())
        if plugin.file is not None:
            h.update(Path(plugin.file).read_bytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ import
def _import(where: str, spec: str):
    if where.endswith(".py") or "/" in where or "\\" in where or Path(where).exists():
        return _import_file(Path(where), spec)
    if not all(part.isidentifier() for part in where.split(".")):
        raise PluginError(f"plugin {spec!r}: no such file {where}")
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (where == exc.name or where.startswith(exc.name + ".")):
            raise PluginError(f"plugin {spec!r}: no such file or module {where}") from None
        raise PluginError(f"plugin {spec!r}: {_failure(exc, None, where)}") from None
    except BaseException as exc:  # noqa: BLE001 - the user's module may raise anything while it runs
        if _is_interruption(exc):
            raise
        raise PluginError(f"plugin {spec!r}: {_failure(exc, None, where)}") from None


def _import_file(path: Path, spec: str):
    if path.is_dir():
        raise PluginError(f"plugin {spec!r}: {path} is a folder, not a Python file (.py)")
    if not path.is_file():
        raise PluginError(f"plugin {spec!r}: no such file {path}")
    if path.suffix != ".py":
        raise PluginError(f"plugin {spec!r}: {path} is not a Python file (.py)")
    resolved = path.resolve()
    stem = re.sub(r"\W", "_", resolved.stem)
    module_name = f"pagesim_plugin_{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:10]}"
    module = sys.modules.get(module_name)
    if module is not None:  # loaded before in this process: the same classes, already registered
        return module
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    watch(resolved)  # before it runs: its os._exit raises (exit_guard), at import time and in its methods
    # NOTE: in sys.modules before it runs, as `import` does: dataclasses and pickle look it up by name.
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - the user's file may raise anything while it runs
        del sys.modules[module_name]
        if _is_interruption(exc):
            raise
        raise PluginError(f"plugin {spec!r}: {_failure(exc, resolved, str(path))}") from None
    return module


def _is_interruption(exc: BaseException) -> bool:
    """SIGTERM while the file runs (``pagesim.engine.cli.Terminated``, a ``KeyboardInterrupt`` subclass):
    the run is being stopped, not failed by the file. A plain ``KeyboardInterrupt`` is taken as
    the file's own (``raise KeyboardInterrupt``); a Ctrl-C during an import is reported the same."""
    return isinstance(exc, KeyboardInterrupt) and type(exc) is not KeyboardInterrupt


def _failure(exc: BaseException, path: Path | None, shown: str) -> str:
    """``FILE line N: ErrorType: message``, at the deepest line of the user's file (``path``;
    ``None``: the deepest line outside the import machinery)."""
    if isinstance(exc, SyntaxError):
        file = shown if path is not None and exc.filename and Path(exc.filename) == path else exc.filename
        return f"{file} line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    where = deepest_line(exc, None if path is None else {os.path.realpath(path): shown})
    return f"{where}: {describe(exc)}" if where else describe(exc)
