"""The layers of pagesim and the absence of import circles, read from the source (issue 59).

An edge ``a -> b`` is an import statement of module ``a`` that names module ``b`` (or a name
inside it) and executes: at module level or inside a function. Imports under ``if
TYPE_CHECKING:`` are annotations only and are not edges (a compiled step order names the
scheduler's type so mypyc can compile its attribute reads; at run time the scheduler imports the
step orders, never the other way). Rules where the layers need more than "no circle" say so.

``python tests/test_layers.py`` prints the circles and the broken rules.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Utilities any layer may use (guarded file reading, staged writes): they import nothing of pagesim.
BASE = ("pagesim.engine.files", "pagesim.engine.outputs")


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "pagesim").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, type_checking: bool):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
            for other in child.orelse:
                yield other
                yield from _import_nodes(other, type_checking)
            continue
        yield child
        yield from _import_nodes(child, type_checking)


@cache
def imported(name: str, type_checking: bool = False) -> frozenset[str]:
    """Everything module ``name`` imports (third-party top-level names too), resolved to pagesim's
    modules where it names one; with ``type_checking``, ``if TYPE_CHECKING:`` imports too."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules() else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return frozenset(out - {name})


def graph() -> dict[str, set[str]]:
    return {name: {m for m in imported(name) if m in modules()} for name in modules()}


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def broken_rules() -> list[str]:
    """Every import that breaks a layer, as ``module -> imported (rule)``."""
    broken = []
    for name in modules():
        edges = imported(name)
        every = imported(name, type_checking=True)
        for other in sorted(edges):
            top = other.split(".")[0]
            if _under(name, "pagesim.kernels") and top == "pagesim" and not _under(other, "pagesim.kernels"):
                broken.append(f"{name} -> {other} (the kernels import nothing else of pagesim)")
            if _under(name, "pagesim.engine.policy"):
                if top in ("torch", "triton", "simpy", "numpy"):
                    broken.append(f"{name} -> {other} (the policy is pure Python)")
                elif top == "pagesim" and not _under(other, "pagesim.engine.policy", *BASE):
                    broken.append(f"{name} -> {other} (the policy imports nothing above it)")
            if _under(name, "pagesim.sim") and _under(other, "pagesim.reports"):
                broken.append(f"{name} -> {other} (the simulator imports no reports)")
            if _under(name, "pagesim.traces") and _under(other, "pagesim.sim", "pagesim.reports", "pagesim.engine.runtime",
                                                           "pagesim.kernels"):
                broken.append(f"{name} -> {other} (traces import no simulator, report or engine)")
            if _under(other, "pagesim.engine.commands") and not _under(name, "pagesim.engine.commands", "pagesim.engine.cli",
                                                                       "pagesim.sim.cli", "pagesim.engine.runtime.cli",
                                                                       "pagesim.reports.validation.cli", "pagesim.sim.replay_cli"):
                broken.append(f"{name} -> {other} (the command layer is imported only by commands)")
        # the scheduler and the KV memory know neither the fast path nor the baselines, even by type
        if _under(name, "pagesim.engine.policy.scheduling", "pagesim.engine.policy.memory"):
            for other in sorted(every):
                if _under(other, "pagesim.engine.policy.fast_path", "pagesim.engine.policy.baselines"):
                    broken.append(f"{name} -> {other} (the fast path depends on the scheduler, not the other way)")
    return broken


def test_the_graph_is_read_from_every_module():
    names = modules()
    assert "pagesim.engine.policy.scheduling.scheduler" in names and "pagesim.sim.replica" in names
    assert "pagesim.engine.policy.memory.block_pool" in imported("pagesim.engine.policy.scheduling.scheduler")
    # the check has teeth: a lazy import and a TYPE_CHECKING one are read as what they are
    assert "pagesim.engine.policy.scheduling.scheduler" in imported("pagesim.engine.policy.fast_path.fast_forward")
    assert "pagesim.engine.policy.scheduling.scheduler" not in imported("pagesim.engine.policy.scheduling.steps.base")
    assert "pagesim.engine.policy.scheduling.scheduler" in imported("pagesim.engine.policy.scheduling.steps.base",
                                                                    type_checking=True)


def test_no_import_circle():
    assert circles() == []


def test_every_layer_imports_only_downward():
    assert broken_rules() == []


def test_a_circle_and_an_upward_import_are_found(tmp_path, monkeypatch):
    package = tmp_path / "pagesim"
    (package / "engine" / "policy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "policy" / "__init__.py").write_text("")
    (package / "engine" / "policy" / "a.py").write_text("def f():\n    from pagesim.engine.policy import b\n")
    (package / "engine" / "policy" / "b.py").write_text("from pagesim.engine.policy.a import f\nimport torch\n")
    (package / "engine" / "policy" / "c.py").write_text("from pagesim.engine.runtime import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for fn in (modules, imported):
        fn.cache_clear()
    try:
        assert circles() == [["pagesim.engine.policy.a", "pagesim.engine.policy.b"]]
        assert sorted(broken_rules()) == [
            "pagesim.engine.policy.b -> torch (the policy is pure Python)",
            "pagesim.engine.policy.c -> pagesim.engine.runtime (the policy imports nothing above it)",
        ]
    finally:
        monkeypatch.undo()
        for fn in (modules, imported):
            fn.cache_clear()


if __name__ == "__main__":
    for circle in circles():
        print(f"circle of {len(circle)}: {', '.join(circle)}")
        for name in circle:
            for other in sorted(graph()[name] & set(circle)):
                print(f"    {name} -> {other}")
    for line in broken_rules():
        print("upward:", line)
    print(f"{len(modules())} modules, {len(circles())} circles, {len(broken_rules())} broken rules")
