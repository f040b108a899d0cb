"""MetadataStore: versioned key/value with compare-and-set, holding cluster metadata (DESIGN.md section 5).

Keys are slash-separated paths (`topics/orders`, `partitions/orders/0`); values are JSON-able dicts.
Every key carries a version that grows by one on each write, so callers update with
compare-and-set (`expected_version`) and two writers can never silently overwrite each other.
Two implementations pass one conformance suite: `LocalMetadataStore` (embedded, a single JSON file
replaced atomically; the single-broker default, no external service) and an etcd store for
clusters. The interface is async because the etcd one is.
"""
from __future__ import annotations

import abc
import asyncio
import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import VersionConflictError

__all__ = ["LocalMetadataStore", "MetadataStore", "VersionConflictError", "Versioned"]


@dataclass(frozen=True, slots=True)
class Versioned:
    value: dict[str, Any]
    version: int


class MetadataStore(abc.ABC):
    """The contract both stores satisfy. `expected_version=0` means "must not exist yet"."""

    @abc.abstractmethod
    async def get(self, key: str) -> Versioned | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: dict[str, Any], expected_version: int | None = None) -> int:
        """Write `value`; returns the new version. Raises VersionConflictError on a failed CAS."""

    @abc.abstractmethod
    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Remove `key`; False if it did not exist. Raises VersionConflictError on a failed CAS."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> dict[str, Versioned]:
        """Every key starting with `prefix`, with its value and version."""

    async def close(self) -> None:
        return None


class LocalMetadataStore(MetadataStore):
    """Embedded store: the whole map in memory, persisted to one JSON file on every write.

    Writes go to a temp file that is fsynced and renamed over the old one, so a crash leaves
    either the old or the new map, never a torn one. Metadata writes are rare (topic admin), so
    rewriting the file each time is cheaper than any log structure would be to maintain.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = asyncio.Lock()  # serializes writers; readers see the last committed map
        self._data: dict[str, Versioned] = {}
        if self.path.exists():
            raw = json.loads(self.path.read_text())
            self._data = {k: Versioned(v["value"], v["version"]) for k, v in raw.items()}

    async def get(self, key: str) -> Versioned | None:
        found = self._data.get(key)
        return None if found is None else _copy(found)

    async def put(self, key: str, value: dict[str, Any], expected_version: int | None = None) -> int:
        async with self._lock:
            current = self._data.get(key)
            self._check(key, current, expected_version)
            version = (current.version if current else 0) + 1
            updated = dict(self._data)
            updated[key] = Versioned(json.loads(json.dumps(value)), version)
            await asyncio.to_thread(self._persist, updated)
            self._data = updated
            return version

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        async with self._lock:
            current = self._data.get(key)
            if current is None:
                if expected_version not in (None, 0):
                    raise VersionConflictError(f"{key}: expected version {expected_version}, key is absent")
                return False
            self._check(key, current, expected_version)
            updated = {k: v for k, v in self._data.items() if k != key}
            await asyncio.to_thread(self._persist, updated)
            self._data = updated
            return True

    async def list(self, prefix: str) -> dict[str, Versioned]:
        return {k: _copy(v) for k, v in self._data.items() if k.startswith(prefix)}

    @staticmethod
    def _check(key: str, current: Versioned | None, expected_version: int | None) -> None:
        if expected_version is None:
            return
        actual = current.version if current else 0
        if actual != expected_version:
            raise VersionConflictError(f"{key}: expected version {expected_version}, found {actual}")

    def _persist(self, data: dict[str, Versioned]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({k: {"value": v.value, "version": v.version} for k, v in data.items()}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _copy(versioned: Versioned) -> Versioned:
    """Callers get their own copy: changing it must not change the store."""
    return Versioned(copy.deepcopy(versioned.value), versioned.version)
