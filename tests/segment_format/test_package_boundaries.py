"""The segment format stands alone: Spark executors and tiered storage use it without the broker,
and the broker's log layer does not reach into the remote store (docs/architecture.md, "Layers")."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import segment_format

PACKAGE_DIR = Path(segment_format.__file__).parent
FORMAT_MODULES = sorted(f"segment_format.{p.stem}" for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__")


def _modules_loaded_by(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def _ours(modules: set[str]) -> set[str]:
    """The modules of pymq's packages, packages of the format and the store counted by name only."""
    layers = ("common", "segment_format", "protocol", "tiered_storage", "client", "broker", "spark_datasource",
              "pymq", "pyspark_pymq", "jobs", "cli")
    found = {m for m in modules if m.split(".")[0] in layers}
    return {m if not m.startswith(("segment_format.", "tiered_storage.")) else m.split(".")[0] for m in found}


@pytest.mark.parametrize("imports", [
    "import segment_format.record, segment_format.batch_body, segment_format.segment_reader, segment_format.manifest, "
    "segment_format.compaction, segment_format.segment_metadata, segment_format.layout",
    "import tiered_storage, tiered_storage.remote_store, tiered_storage.read_ahead",
], ids=["segment_format", "tiered_storage"])
def test_format_and_remote_store_load_no_module_of_a_higher_layer(imports: str) -> None:
    """Importing the format or the remote store loads nothing of pymq's but the bottom layer and
    the format: no broker, protocol or client module."""
    assert _ours(_modules_loaded_by(imports)) <= {"common", "common.errors", "segment_format", "tiered_storage"}


def test_writing_a_segment_loads_no_module_of_a_higher_layer() -> None:
    """A Spark job writes a whole segment (batches, both indexes, metadata) without the broker."""
    loaded = _modules_loaded_by(
        "import io\n"
        "from segment_format import batch_body, record\n"
        "from segment_format.segment_writer import SegmentWriter\n"
        "files = [io.BytesIO() for _ in range(3)]\n"
        "writer = SegmentWriter(*files, 0, index_interval_bytes=0)\n"
        "for offset in range(0, 30, 3):\n"
        "    batch = record.encode_batch(batch_body.make_body([b'v'] * 3), base_offset=offset)\n"
        "    writer.append(batch)\n"
        "assert writer.close().next_offset == 30 and len(files[1].getvalue()) == 16 + 8 * 9\n"  # each batch but the first (at byte 0)
    )
    assert _ours(loaded) <= {"common", "common.errors", "segment_format"}


def test_log_layer_does_not_load_the_remote_store() -> None:
    """broker.log (segments, local and unified log, cleaner) is independent of tiered storage."""
    loaded = _modules_loaded_by("import broker.log")
    assert not {m for m in loaded if m.startswith(("tiered_storage", "fsspec", "s3fs", "broker.remote_log"))}


@pytest.mark.parametrize("module", FORMAT_MODULES)
def test_each_format_module_imports_alone(module: str) -> None:
    """Imported first, in a fresh interpreter, every module of the format loads: none of them
    needs another to have been imported before it (what an import cycle breaks)."""
    assert module in _modules_loaded_by(f"import {module}")


def _imports_inside_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    module_level = {id(node) for node in tree.body}
    return [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in module_level]


def test_no_format_module_imports_inside_a_function() -> None:
    """Every import of the format is at module top, so the import graph read from module level is
    the whole graph: an import deferred into a function (record once imported body_template so,
    to dodge a cycle) would hide an edge from it."""
    found = [hit for path in sorted(PACKAGE_DIR.glob("*.py")) for hit in _imports_inside_functions(path)]
    assert found == []


_IO_MODULES = {"os", "shutil", "tempfile", "mmap", "socket", "selectors", "asyncio", "subprocess", "fsspec"}
_FILE_CALLS = {"open", "read_bytes", "read_text", "write_bytes", "write_text", "unlink", "rename", "mkdir", "touch",
               "exists", "stat", "iterdir", "glob", "rglob", "rmdir"}


def _io_in(path: Path) -> list[str]:
    """Imports of I/O modules and calls that open or touch files (`open(...)`, `Path.read_bytes()`, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{path.name}:{node.lineno}: import {name}" for name in names if name.split(".")[0] in _IO_MODULES]
        if isinstance(node, ast.Call) and (isinstance(node.func, ast.Name) and node.func.id == "open"
                                           or isinstance(node.func, ast.Attribute) and node.func.attr in _FILE_CALLS):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_format_module_opens_or_touches_a_file() -> None:
    """Pure, as the package says: bytes in, values out. Opening, writing, truncating, fsyncing and
    renaming files is the callers' (broker.log's IndexFile keeps a local segment's indexes in their
    files); the format reads and writes only file objects it is handed."""
    found = [hit for path in sorted(PACKAGE_DIR.glob("*.py")) for hit in _io_in(path)]
    assert found == []
