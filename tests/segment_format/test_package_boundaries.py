"""The segment format stands alone: Spark executors and tiered storage use it without the broker,
and the broker's log layer does not reach into the remote store (docs/architecture.md, "Layers")."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_loaded_by(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


@pytest.mark.parametrize("imports", [
    "import segment_format.record, segment_format.segment_reader, segment_format.manifest, "
    "segment_format.compaction, segment_format.segment_metadata, segment_format.layout",
    "import tiered_storage, tiered_storage.remote_store, tiered_storage.read_ahead",
], ids=["segment_format", "tiered_storage"])
def test_format_and_remote_store_load_no_broker_module_but_the_error_taxonomy(imports: str) -> None:
    """Importing the format or the remote store loads broker.errors and nothing else of broker."""
    broker_modules = {m for m in _modules_loaded_by(imports) if m == "broker" or m.startswith("broker.")}
    assert broker_modules == {"broker", "broker.errors"}


def test_log_layer_does_not_load_the_remote_store() -> None:
    """broker.log (segments, local and unified log, cleaner) is independent of tiered storage."""
    loaded = _modules_loaded_by("import broker.log")
    assert not {m for m in loaded if m.startswith(("tiered_storage", "fsspec", "s3fs", "broker.remote_log"))}
