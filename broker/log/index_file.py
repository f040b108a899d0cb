"""Fixed-size-entry index files: the mechanics shared by `.index` and `.timeindex` (Kafka's AbstractIndex).

An index file is a flat array of little-endian entries, no header. Entries live in memory (the
subclass keeps them in arrays for bisect) and reach the file lazily: `append` only queues packed
bytes, `write_pending` writes them with one pwrite, `prepare_sync` / `flush` make them durable.
Keeping index writes off the append path leaves one write syscall per append; a crash that loses
queued entries is harmless because recovery rebuilds the indexes of every segment it scans, and
a sparser index is still a correct one.

The write fd is opened on first need, so loading a sealed segment's index costs no descriptor.
"""
from __future__ import annotations

import os
import struct
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Self

from broker.errors import KafkaStorageError


class CorruptIndexError(KafkaStorageError):
    """An index file is missing, torn or inconsistent with its segment; the caller rebuilds it."""


class IndexFile(ABC):
    """Base of OffsetIndex and TimeIndex: file I/O for an append-only array of `ENTRY` records.

    Not thread-safe on its own: the owning PartitionLog serializes calls under its lock.
    """

    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd: int | None = None
        self._written = 0  # entries already in the file
        self._pending = bytearray()  # packed entries queued for the file

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _load_entries(self, data: bytes) -> None:
        """Fill the in-memory arrays from the file's bytes (whole entries)."""

    @abstractmethod
    def _keep_entries(self, count: int) -> None:
        """Shrink the in-memory arrays to their first `count` entries."""

    @classmethod
    def create(cls, path: Path, base_offset: int) -> Self:
        """A new empty index; an existing file at `path` is emptied (it described old data)."""
        index = cls(path, base_offset)
        index._ftruncate(0)
        return index

    @classmethod
    def load(cls, path: Path, base_offset: int) -> Self:
        """Read the entries of an existing file. Raises CorruptIndexError if it is missing or torn;
        the caller must still call `sanity_check` against the segment."""
        index = cls(path, base_offset)
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise CorruptIndexError(f"{path.name} is missing") from err
        except OSError as err:
            raise KafkaStorageError(f"cannot read {path}: {err}") from err
        if len(data) % cls.ENTRY.size:
            raise CorruptIndexError(f"{path.name}: {len(data)} bytes is not a whole number of entries")
        index._load_entries(data)
        index._written = len(index)
        return index

    def _queue(self, *fields: int) -> None:
        self._pending += self.ENTRY.pack(*fields)

    def _writer(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise KafkaStorageError(f"cannot open {self.path}: {err}") from err
        return self._fd

    def _ftruncate(self, size: int) -> None:
        try:
            os.ftruncate(self._writer(), size)
        except OSError as err:
            raise KafkaStorageError(f"cannot truncate {self.path}: {err}") from err

    def write_pending(self) -> None:
        """Write queued entries to the file (no fsync)."""
        if not self._pending:
            return
        data, position = bytes(self._pending), self._written * self.ENTRY.size
        try:
            written = os.pwrite(self._writer(), data, position)
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], position + written)
        except OSError as err:
            raise KafkaStorageError(f"cannot write {self.path}: {err}") from err
        self._written += len(data) // self.ENTRY.size
        self._pending.clear()

    def prepare_sync(self) -> int:
        """Write queued entries and return a new fd (owned by the caller) whose fsync makes them
        durable. Lets a flush thread fsync without holding the log lock or sharing our fd; a
        sealed index gets a read-only fd, which Linux fsyncs just as well."""
        self.write_pending()
        try:
            return os.dup(self._fd) if self._fd is not None else os.open(self.path, os.O_RDONLY)
        except OSError as err:
            raise KafkaStorageError(f"cannot open {self.path}: {err}") from err

    def flush(self) -> None:
        """Write queued entries and fsync the file."""
        fd = self.prepare_sync()
        try:
            os.fsync(fd)
        except OSError as err:
            raise KafkaStorageError(f"cannot fsync {self.path}: {err}") from err
        finally:
            os.close(fd)

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries, in memory and on file."""
        assert 0 <= count <= len(self), (count, len(self))
        self._keep_entries(count)
        if count < self._written:
            self._ftruncate(count * self.ENTRY.size)
            self._written = count
            self._pending.clear()
        else:
            del self._pending[(count - self._written) * self.ENTRY.size :]

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._keep_entries(0)
        self._pending.clear()
        self._written = 0
        self._ftruncate(0)

    def close(self) -> None:
        """Close the write fd; queued entries not yet written are dropped (call write_pending first)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def rename(self, path: Path) -> None:
        try:
            os.rename(self.path, path)
        except FileNotFoundError:
            pass  # never written: nothing to rename
        except OSError as err:
            raise KafkaStorageError(f"cannot rename {self.path}: {err}") from err
        self.path = path

    def delete(self) -> None:
        self.close()
        try:
            self.path.unlink(missing_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot delete {self.path}: {err}") from err
