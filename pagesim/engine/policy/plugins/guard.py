"""Plug-in code under guard: a user's class runs inside pagesim's loops, so what it returns is
checked where pagesim takes it, and what it raises (``sys.exit`` included) becomes one
``PluginError`` line naming the plug-in, the method and the line of the user's file.

``guard(cls, spec, kind)`` wraps, in place and once, the methods pagesim calls on a plug-in of
that kind (``CHECKS``) and every function the plug-in's own classes define; each wrapper calls
the original and checks its result. The class stays the same object, so its registry entry,
``type(self)``, class attributes and pickling by name are those of the user's class. Built-in
policies are never guarded: the hot path pays nothing for plug-ins it does not run.

What a wrapper lets through unchanged:

- a ``PluginError``: already attributed (a victim plug-in's, seen from a scheduler plug-in);
- ``KeyboardInterrupt``: Ctrl-C (or SIGTERM, ``pagesim.engine.cli.Terminated``) landing while plug-in
  code runs is the user stopping the run, which exits as an interruption does (130 or 143, never
  0); one the method raises itself cannot be told apart and exits the same way;
- for a ``Scheduler`` subclass, an error class pagesim defines (vLLM v0's abort, say) or a
  ``MemoryError``, raised in pagesim code it called: the commands catch those by type.

Anything else (``SystemExit``, any error raised in the plug-in's file, or one raised in pagesim
code under a plug-in method) is the plug-in's; for the last the message gives both lines. An
``os._exit`` in the plug-in's files raises ``SystemExit`` too (``exit_guard``), so it is reported
the same way instead of ending the process.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import reprlib
import sys
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pagesim.engine.policy.plugins import exit_guard
from pagesim.engine.policy.plugins.exit_guard import PluginExit, watch
from pagesim.engine.policy.scheduling.output import SchedulerOutput
from pagesim.engine.policy.scheduling.request import Request

#: Dunder methods pagesim calls on plug-ins (others, e.g. ``__repr__``, are left alone).
CALLED_DUNDERS = frozenset({"__init__", "__len__", "__contains__"})
EXCERPT_CHARS = 60  # of a wrong value's repr, or of an exception's message, in a message


class PluginError(ValueError):
    """A plug-in failed to load, raised, exited, or returned what pagesim cannot use. A
    ``ValueError``, so the command line prints it as one ``error:`` line and exits 2."""


# ------------------------------------------------------------------ return checks
# Each takes (the plug-in instance, what the method returned, its args, its kwargs) and answers
# what was wrong, after "METHOD() ", or None.
Check = Callable[[object, object, tuple, dict], "str | None"]


def _check_victim(policy, result, args, kwargs) -> str | None:
    candidates = args[0] if args else kwargs["candidates"]
    if any(result is c for c in candidates):
        return None
    them = f"{len(candidates)} candidate request{'' if len(candidates) == 1 else 's'}"
    if isinstance(result, Request):
        return (f"returned request {result.request_id!r}, which is not one of the {them} "
                f"(the running requests not yet scheduled this step)")
    return f"returned {excerpt(result)}; expected one of the {them}"


def _check_mode(mode, result, args, kwargs) -> str | None:
    if isinstance(result, str) and result in ("recompute", "swap"):
        return None
    return f"returned {excerpt(result)}; expected 'recompute' or 'swap'"


def _check_popped(policy, result, args, kwargs) -> str | None:
    if result is None:
        held = len(policy)
        return None if held == 0 else f"returned None, but its __len__ says it holds {held} evictable blocks"
    return _not_evictable(policy.stats, result)


def _check_popped_many(policy, result, args, kwargs) -> str | None:
    count = args[0] if args else kwargs["count"]
    if not isinstance(result, list):
        return f"returned {excerpt(result)}; expected a list of at most {count} block ids"
    if len(result) > count:
        return f"returned {len(result)} blocks; {count} were asked for"
    if len(set(map(_hashable, result))) != len(result):
        return f"returned a block twice: {excerpt(result)}"
    for block_id in result:
        problem = _not_evictable(policy.stats, block_id)
        if problem is not None:
            return problem
    return None


def _hashable(value):
    return value if isinstance(value, (int, str, float, bytes, type(None))) else id(value)


def _not_evictable(stats, block_id) -> str | None:
    """What is wrong with ``block_id`` as an eviction victim of the pool behind ``stats``."""
    try:
        if isinstance(block_id, bool):
            raise TypeError
        block_id = operator.index(block_id)  # any integer (a NumPy one too)
    except TypeError:
        return f"returned {excerpt(block_id)}; expected the id (an int) of a block it holds, or None when it holds none"
    first, num_blocks = getattr(stats, "first_block_id", 0), getattr(stats, "num_blocks", None)
    if num_blocks is not None and not first <= block_id < num_blocks:
        return f"returned block {block_id}; the pool's blocks are {first}..{num_blocks - 1}"
    ref_counts = getattr(stats, "ref_counts", None)
    if ref_counts is not None and ref_counts[block_id]:
        return f"returned block {block_id}, which is in use, not evictable"
    if stats.block_key(block_id) is None:
        return f"returned block {block_id}, which holds no cached content (never added, or popped already)"
    return None


def _check_len(policy, result, args, kwargs) -> str | None:
    if isinstance(result, int) and not isinstance(result, bool) and result >= 0:
        return None
    return f"returned {excerpt(result)}; expected a count (an int >= 0)"


def _check_output(scheduler, result, args, kwargs) -> str | None:
    if isinstance(result, SchedulerOutput):
        return None
    return f"returned {excerpt(result)}; expected a SchedulerOutput (what Scheduler.schedule returns)"


def _check_finished(scheduler, result, args, kwargs) -> str | None:
    return None if isinstance(result, list) else f"returned {excerpt(result)}; expected the list of finished requests"


def _check_offload_victims(policy, result, args, kwargs) -> str | None:
    count = args[0] if args else kwargs["count"]
    protected = args[1] if len(args) > 1 else kwargs["protected"]
    if result is None:
        return None
    if not isinstance(result, list) or len(result) != count:
        return f"returned {excerpt(result)}; expected a list of {count} keys it holds, or None when it cannot"
    if len(set(map(_hashable, result))) != len(result):
        return f"returned a key twice: {excerpt(result)}"
    if any(key in protected for key in result):
        return "returned a key of the blocks being stored (protected)"
    return None  # (the store checks that it holds each victim, ready)


#: kind -> the methods pagesim calls on such a plug-in, each with the check of what it returns
#: (None: any value). A scheduler's are wrapped only where the plug-in defines them.
CHECKS: dict[str, dict[str, Check | None]] = {
    "victim": {"choose": _check_victim},
    "preemption": {"choose": _check_mode},
    "eviction": {"add": None, "remove": None, "pop": _check_popped, "add_many": None, "pop_many": _check_popped_many,
                 "on_leaf": None, "__len__": _check_len, "__contains__": None},
    "kv_offloading_policy": {"insert": None, "set_evictable": None, "set_evictable_many": None,
                             "evict": _check_offload_victims,
                             "store_miss": None, "access": None, "request_finished": None, "__len__": _check_len,
                             "__contains__": None},
    "scheduler": {"schedule": _check_output, "update": _check_finished},
}


def _block_id(result):
    return None if result is None else operator.index(result)


#: kind -> methods whose checked result is passed on as pagesim's own type: a NumPy integer is a
#: block id, handed to the pool as the int it is (compiled, the pool takes ints only).
PASSED_ON: dict[str, dict[str, Callable]] = {
    "eviction": {"pop": _block_id, "pop_many": lambda result: [operator.index(b) for b in result]},
}


# ------------------------------------------------------------------ guarding
_guarded: weakref.WeakSet[type] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class Guard:
    """What a wrapper needs to attribute a failure: the plug-in and where its code lives."""

    spec: str  # as given: how messages name the plug-in
    kind: str
    files: dict[str, str]  # real path of each of the plug-in's source files -> as a message shows it

    def raised(self, method: str, exc: BaseException) -> PluginError:
        where = describe_frames(exc, self.files)
        where = f" ({where})" if where else ""
        why = "; a plug-in cannot end pagesim" if isinstance(exc, SystemExit) else ""
        return PluginError(f"plugin {self.spec!r}: {method}() {describe(exc, verb=True)}{where}{why}")

    def passes_through(self, exc: BaseException) -> bool:
        """A scheduler subclass's exception that pagesim code raised as a report of its own."""
        if self.kind != "scheduler" or innermost_file(exc) in self.files:
            return False
        return isinstance(exc, MemoryError) or type(exc).__module__.startswith(("pagesim.engine.", "pagesim.sim."))


def guard(cls: type, spec: str, kind: str) -> None:
    """Wrap ``cls``'s methods (see the module docstring); a class already guarded is left as it is."""
    if cls in _guarded:
        return
    own = [c for c in cls.__mro__ if _is_users(c)]
    g = Guard(spec, kind, _source_files(own, spec))
    for path in g.files:  # (os._exit from the plug-in's code raises instead: exit_guard)
        watch(path)
    checks = CHECKS[kind]
    # The methods pagesim calls: the checked ones, and any of the user's that overrides one of
    # pagesim's. The user's own helpers are not wrapped: an exception one raises for its caller to
    # catch must stay what it is (one that escapes is attributed by the method pagesim called).
    ours = [c for c in cls.__mro__ if c not in own]
    names = dict.fromkeys(name for c in own for name, value in vars(c).items()
                          if inspect.isfunction(value) and (not name.startswith("__") or name in CALLED_DUNDERS)
                          and any(name in vars(c) for c in ours))
    if kind != "scheduler":
        names.update(dict.fromkeys(checks))
    for name in names:
        function = inspect.getattr_static(cls, name)
        if not inspect.isfunction(function):  # a staticmethod, say: not what pagesim calls
            continue
        function = getattr(function, "__wrapped__", function) if hasattr(function, "_pagesim_guard") else function
        setattr(cls, name, _wrap(function, g, name, checks.get(name), PASSED_ON.get(kind, {}).get(name)))
    _guarded.add(cls)


def _wrap(function: Callable, g: Guard, method: str, check: Check | None,
          passed_on: Callable | None = None) -> Callable:
    @functools.wraps(function)
    def guarded(self, *args, **kwargs):
        try:
            result = function(self, *args, **kwargs)
        except (PluginError, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a plug-in cannot end pagesim
            if g.passes_through(exc):
                raise
            raise g.raised(method, exc) from exc
        if check is not None:
            try:
                problem = check(self, result, args, kwargs)
            except Exception:  # noqa: BLE001 - a value too odd to check (a list in a list, ...) is wrong too
                problem = f"returned {excerpt(result)}, which is not what pagesim expects"
            if problem is not None:
                raise PluginError(f"plugin {g.spec!r}: {method}() {problem}")
        return result if passed_on is None else passed_on(result)

    guarded._pagesim_guard = g
    return guarded


def _is_users(cls: type) -> bool:
    """Whether ``cls`` is the user's code: neither pagesim's (``pagesim.engine.``) nor Python's own or an
    installed package's (``object``, ``abc.ABC``, ``typing.Generic``, ...)."""
    if cls.__module__.startswith("pagesim.engine."):
        return False
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path is None:
        return cls.__module__ not in sys.builtin_module_names and cls.__module__ != "builtins"
    prefixes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return not os.path.realpath(path).startswith(tuple(prefixes))


def _source_files(classes: list[type], spec: str) -> dict[str, str]:
    where = spec.rpartition(":")[0]
    files = {}
    for c in classes:
        path = getattr(sys.modules.get(c.__module__), "__file__", None)
        if path is not None:
            real = os.path.realpath(path)
            files[real] = where if where.endswith(".py") and os.path.realpath(where) == real else shown_path(real)
    return files


# ------------------------------------------------------------------ describing failures
def describe(exc: BaseException, *, verb: bool = False) -> str:
    """``ErrorType: message`` (first line, shortened); with ``verb``, ``raised ...`` / ``called sys.exit(...)``."""
    if isinstance(exc, SystemExit):
        call = f"{'os._exit' if isinstance(exc, PluginExit) else 'sys.exit'}({exc.code!r})"
        return f"called {call}" if verb else f"SystemExit: the file called {call}; a plug-in cannot end pagesim"
    try:
        lines = str(exc).strip().splitlines()
    except Exception:  # noqa: BLE001 - a user's exception class may fail even here
        lines = []
    message = lines[0] if lines else ""
    if len(message) > 2 * EXCERPT_CHARS or len(lines) > 1:
        message = message[:2 * EXCERPT_CHARS] + "..."
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if isinstance(exc, KeyboardInterrupt) and not message:
        what += " (raised by the plug-in's code; a plug-in cannot stop pagesim)"
    return f"raised {what}" if verb else what


def describe_frames(exc: BaseException, files: dict[str, str]) -> str:
    """Where ``exc`` came from: ``FILE line N`` at the deepest line of the plug-in's ``files``,
    and the line that raised it when that is deeper still (pagesim's, say); '' when unknown."""
    frames = _frames(exc)
    own = [f for f in frames if os.path.realpath(f.filename) in files]
    if not own:
        return ""
    at = f"{files[os.path.realpath(own[-1].filename)]} line {own[-1].lineno}"
    if own[-1] is frames[-1]:
        return at
    return f"in {shown_path(frames[-1].filename)} line {frames[-1].lineno}, called from {at}"


def deepest_line(exc: BaseException, files: dict[str, str] | None = None) -> str | None:
    """``FILE line N``: the deepest line of ``exc``'s traceback in one of ``files`` (real path ->
    as shown; ``None``: in any file, shown relative to the working directory)."""
    for frame in reversed(_frames(exc)):
        if files is None:
            return f"{shown_path(frame.filename)} line {frame.lineno}"
        shown = files.get(os.path.realpath(frame.filename))
        if shown is not None:
            return f"{shown} line {frame.lineno}"
    return None


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """``exc``'s traceback, less the import machinery's frozen modules (``<frozen ...>``) and the
    ``os._exit`` stand-in (the plug-in's line called ``os._exit``)."""
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if not f.filename.startswith("<") and f.filename != exit_guard.__file__]


def innermost_file(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.realpath(tb.tb_frame.f_code.co_filename)


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        relative = Path(path).resolve().relative_to(Path.cwd())
    except (ValueError, OSError):
        return path
    return str(relative)


def excerpt(value: object) -> str:
    """``None``, or ``a str ('swap ')``: the type and the start of the repr, for a message."""
    if value is None:
        return "None"
    text = _REPR.repr(value).replace("\n", " ")
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name} ({text})"


_REPR = reprlib.Repr()  # short reprs that never raise (a failing __repr__ shows as <... instance at ...>)
_REPR.maxstring = _REPR.maxother = EXCERPT_CHARS
