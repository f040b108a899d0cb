"""The packages import each other in layers, without cycles (docs/architecture.md, "Layers").

The graph is read from the source with `ast`: every module-level import (not those inside functions
or under `if TYPE_CHECKING:`), with an edge from a module to each package whose `__init__` the
import runs. A cycle means two modules that can only be imported in one order, which breaks as
soon as someone imports the other one first; a function-level import that dodges it is the same
defect, hidden, and so is a module loaded by its name in a string (`import_module("jobs.compact")`,
a `"module:attribute"` reference such as the CLI's lazily loaded commands).

Packages are layers too: one package's modules may import another's, or be imported by them, not
both, even where no single module cycle results (a package that needs its own dependant cannot be
shipped, tested or reasoned about without it).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "segment_format", "protocol", "tiered_storage", "client", "broker", "spark_datasource", "pymq", "pyspark_pymq", "jobs", "cli")


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


# The layers of docs/architecture.md, bottom first. A package imports only packages of lower layers
# (never its own layer's neighbours): the server and the Spark source both stand on the client, and
# neither knows the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("segment_format",),
    ("protocol", "tiered_storage"),
    ("client",),
    ("broker", "spark_datasource"),
    ("pymq",),
    ("pyspark_pymq", "jobs"),
    ("cli",),
)
LAYER_OF = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def test_every_package_has_a_layer() -> None:
    assert sorted(LAYER_OF) == sorted(PACKAGES)
    # ... and every package the repository ships is in the graph (benchmarks/, like tests/, is not shipped)
    shipped = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "benchmarks")
    assert shipped == sorted(PACKAGES)


def test_a_package_imports_only_lower_layers() -> None:
    """Counting every import, deferred or by name too: e.g. the protocol never imports the broker's
    config, the client never the server, the Spark source never the broker."""
    modules = _modules()
    upward = sorted(f"{name} -> {target}" for name, path in modules.items()
                    for target in _edges(name, path, modules) | _deferred_imports(path, modules)
                    if LAYER_OF[target.split(".")[0]] >= LAYER_OF[name.split(".")[0]]
                    and target.split(".")[0] != name.split(".")[0])
    assert upward == []


@pytest.mark.parametrize("lower, upper", [
    ("broker.log", "tiered_storage"), ("broker.log", "broker.remote_log"), ("broker.log", "broker.cluster"),
    ("broker.coordinator.group_coordinator", "broker.coordinator.runtime"),
    ("broker.coordinator.group_coordinator", "broker.replica_manager"),
], ids=lambda s: s)
def test_a_lower_layer_of_the_broker_never_imports_a_higher_one(lower: str, upper: str) -> None:
    """Inside the server: the local log knows neither the remote tier nor the cluster; the group
    coordinator, a pure state machine, neither its runtime nor the replica manager."""
    modules = _modules()
    offending = {name: sorted(t for t in _edges(name, path, modules) if t == upper or t.startswith(upper + "."))
                 for name, path in modules.items() if name == lower or name.startswith(lower + ".")}
    assert {k: v for k, v in offending.items() if v} == {}


# What a request handler may import from the log (broker.log): the value types the replica
# manager's API speaks in (what an append returns, what a topic's logs are created with, the file
# range a fetch sends), never a log or the log manager. (The coordinators' internal topics are
# replayed by their runtime, broker/coordinator/runtime.py, not by a handler.)
HANDLER_LOG_TYPES = {"AppendInfo", "TopicLogSpec", "FetchSlice"}


def test_the_request_handlers_reach_logs_only_through_the_replica_manager() -> None:
    """Every import counted (deferred, under TYPE_CHECKING too): no handler imports the remote tier
    (broker.remote_log) or a module of the log, and from broker.log only HANDLER_LOG_TYPES. The
    replica manager chooses between the local log and the remote tier (docs/architecture.md)."""
    modules = _modules()
    offending: dict[str, list[str]] = {}
    for name, path in modules.items():
        if not (name == "broker.handlers" or name.startswith("broker.handlers.")):
            continue
        allowed = HANDLER_LOG_TYPES
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                module = node.module or ""
                imported = [f"{module}.{alias.name}" for alias in node.names
                            if module != "broker.log" or alias.name not in allowed]
            else:
                continue
            offending.setdefault(name, []).extend(
                i for i in imported if i.startswith(("broker.log.", "broker.remote_log")) or i == "broker.log")
    assert {k: v for k, v in offending.items() if v} == {}


def _string_imports(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The modules `node` loads by name: `import_module("a.b")` (plain or `importlib.`), or a
    `"a.b:attribute"` reference (an entry point, a lazily loaded command) naming one of ours."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if called == "import_module" and isinstance(node.args[0].value, str):
            return {node.args[0].value} & modules.keys()
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count(":") == 1:
        module, _, attribute = node.value.partition(":")
        if module in modules and attribute.isidentifier():
            return {module}
    return set()


def _deferred_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """What the module imports when its code runs rather than when it is imported: imports inside
    functions, and modules loaded by name from a string."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    top = {id(node) for node in _top_level_imports(tree)}
    for node in ast.walk(tree):
        found |= _string_imports(node, modules)
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and id(node) not in top:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            if all(s in modules for s in submodules):  # `from package import submodule`
                found.update(submodules)
            elif node.module in modules:
                found.add(node.module)
        elif isinstance(node, ast.Import) and id(node) not in top:
            found.update(alias.name for alias in node.names if alias.name in modules)
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


def test_no_deferred_import_hides_a_cycle() -> None:
    """An import deferred into a function or a string (for start-up cost, an optional dependency)
    is fine; one whose target imports the importer back is a cycle in disguise."""
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    hidden = sorted((name, target) for name, path in modules.items()
                    for target in _deferred_imports(path, modules)
                    if target != name and _reaches(graph, target, name))
    assert hidden == []


def _package(module: str) -> str:
    return module.split(".")[0]


def test_packages_import_each_other_one_way_only() -> None:
    """The graph of packages, counting every import (deferred or by name too), has no loop: e.g.
    `pymq` reads a table topic that `jobs` syncs, and `jobs`' demo calls `pymq`, so the table's
    layout lives below both (spark_datasource/table_topic.py); the CLI loads the jobs' commands by
    name, so the options they share with it live in `common` (common/cli_options.py)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = _edges(name, path, modules) | _deferred_imports(path, modules)
        graph.setdefault(_package(name), set()).update(
            _package(t) for t in targets if _package(t) != _package(name))
    assert _cycles(graph) == []


def _test_module_imports(tests_dir: Path) -> list[str]:
    """`file: module` for each import, anywhere in a file under `tests_dir`, of a test module
    (`test_*`), or of a conftest.py but by another conftest.py (which shares its fixtures): the
    helpers several modules share live in tests/helpers/, and fixtures in a conftest.py, so a test
    module is never imported twice under two names or run for its helpers."""
    found = []
    for path in sorted(tests_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(tests_dir.parent)}: {name}" for name in names
                      if name.rpartition(".")[2].startswith("test_")
                      or (name.rpartition(".")[2] == "conftest" and path.name != "conftest.py")]
    return found


def test_test_modules_do_not_import_each_other() -> None:
    assert _test_module_imports(ROOT / "tests") == []
