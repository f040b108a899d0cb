"""The packages import each other in layers, without cycles (docs/architecture.md, "Layers").

The graph is read from the source with `ast`: every module-level import (not those inside functions
or under `if TYPE_CHECKING:`), with an edge from a module to each package whose `__init__` the
import runs. A cycle means two modules that can only be imported in one order, which breaks as
soon as someone imports the other one first; a function-level import that dodges it is the same
defect, hidden.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "segment_format", "tiered_storage", "spark_datasource", "jobs", "pymq")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    targets: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _top_level_imports(ast.parse(path.read_text())):
        base = ""
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for imported in names:
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
                prefix = ".".join(parts[:i])
                # ... except the importer's own packages, which are already being imported
                if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                    targets.add(prefix)
        if isinstance(node, ast.ImportFrom) and base in modules and name.startswith(base + "."):
            # `from my_package import thing` inside the package needs the package's __init__ done
            if any(f"{base}.{alias.name}" not in modules for alias in node.names):
                targets.add(base)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_between_modules() -> None:
    """No group of modules imports itself round, counting package __init__ imports."""
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("lower, upper", [
    ("segment_format", "broker.log"), ("segment_format", "tiered_storage"), ("segment_format", "spark_datasource"),
    ("tiered_storage", "broker.log"), ("broker.log", "tiered_storage"), ("broker.log", "broker.remote_log"),
    ("broker.protocol", "broker.server"), ("broker.client", "broker.server"), ("broker.client", "broker.log"),
], ids=lambda s: s)
def test_a_lower_layer_never_imports_a_higher_one(lower: str, upper: str) -> None:
    """The layers of docs/architecture.md: e.g. the format imports no broker log, the log no remote store."""
    modules = _modules()
    offending = {name: sorted(t for t in _edges(name, path, modules) if t == upper or t.startswith(upper + "."))
                 for name, path in modules.items() if name == lower or name.startswith(lower + ".")}
    assert {k: v for k, v in offending.items() if v} == {}


def _function_level_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    top = {id(node) for node in _top_level_imports(ast.parse(path.read_text()))}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and id(node) not in top:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            if all(s in modules for s in submodules):  # `from package import submodule`
                found.update(submodules)
            elif node.module in modules:
                found.add(node.module)
    return found


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v == goal:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return False


def test_no_import_inside_a_function_hides_a_cycle() -> None:
    """An import deferred into a function (for start-up cost, an optional dependency) is fine; one
    whose target imports the importer back is a cycle in disguise."""
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    hidden = sorted((name, target) for name, path in modules.items()
                    for target in _function_level_imports(path, modules)
                    if target != name and _reaches(graph, target, name))
    assert hidden == []
