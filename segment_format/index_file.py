"""Fixed-size-entry index files: the mechanics shared by `.index` and `.timeindex` (Kafka's AbstractIndex).

An index file is a 16-byte header followed by a flat array of fixed-size entries, little-endian:

    offset size field
    0      4    magic (4 ASCII bytes)     the kind of index: b"PMQI" offset index, b"PMQT" time index
    4      2    version (uint16) = 1      the entry layout; any other value is unreadable
    6      2    entry_size (uint16)       bytes per entry: 8 (offset index), 12 (time index)
    8      8    base_offset (int64)       the segment's base offset, as in the file name
    16     ...  entries                   the subclass's ENTRY layout, see its module

Sealed segments and their indexes are uploaded to object storage, where readers other than the
broker parse them (docs/architecture.md, Tiered storage), so the layout is public and versioned. Every header byte
has exactly one valid value for a given kind and segment, so `parse` detects any damage to it. A
file without a valid header (an index written before headers existed, a torn creation) raises
CorruptIndexError, and the log's recovery rebuilds it from the `.log`.

Entries live in memory (the subclass keeps them in arrays for bisect) and reach the file lazily:
`append` only queues packed bytes, `write_pending` writes them with one pwrite, `prepare_sync` /
`flush` make them durable. Keeping index writes off the append path leaves one write syscall per
append; a crash that loses queued entries is harmless because recovery rebuilds the indexes of
every segment it scans, and a sparser index is still a correct one.

The write fd is opened on first need, so loading a sealed segment's index costs no descriptor.
"""
from __future__ import annotations

import os
import struct
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Self

from broker.errors import KafkaStorageError


HEADER = struct.Struct("<4sHHq")  # magic, version, entry_size, base_offset
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 16
VERSION = 1


class CorruptIndexError(KafkaStorageError):
    """An index file is missing, torn, of another kind or version, or inconsistent with its
    segment; the caller rebuilds it (or, reading a remote segment, does without it)."""


class IndexFile(ABC):
    """Base of OffsetIndex and TimeIndex: file I/O for an append-only array of `ENTRY` records.

    Not thread-safe on its own: the owning PartitionLog serializes calls under its lock.
    """

    ENTRY: ClassVar[struct.Struct]
    MAGIC: ClassVar[bytes]

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd: int | None = None
        self._written = 0  # entries already in the file
        self._pending = bytearray()  # packed entries queued for the file

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _load_entries(self, data: memoryview) -> None:
        """Fill the in-memory arrays from the file's entry bytes (whole entries, after the header)."""

    @abstractmethod
    def _keep_entries(self, count: int) -> None:
        """Shrink the in-memory arrays to their first `count` entries."""

    @classmethod
    def header(cls, base_offset: int) -> bytes:
        """The 16 bytes that open an index of this kind for the segment at `base_offset`."""
        return HEADER.pack(cls.MAGIC, VERSION, cls.ENTRY.size, base_offset)

    def image(self) -> bytes:
        """The whole file as bytes, from memory: the header and every entry (for writers that put
        an index built in memory somewhere other than `path`: SegmentWriter)."""
        return self.header(self.base_offset) + self._entry_bytes()

    @abstractmethod
    def _entry_bytes(self) -> bytes:
        """Every entry, packed as in the file."""

    @classmethod
    def create(cls, path: Path, base_offset: int) -> Self:
        """A new empty index (header only); an existing file at `path` is emptied (it described
        old data)."""
        index = cls(path, base_offset)
        index._write_header()
        return index

    @classmethod
    def load(cls, path: Path, base_offset: int) -> Self:
        """Read the entries of an existing file. Raises CorruptIndexError if it is missing or
        `parse` rejects it; the caller must still call `sanity_check` against the segment."""
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise CorruptIndexError(f"{path.name} is missing") from err
        except OSError as err:
            raise KafkaStorageError(f"cannot read {path}: {err}") from err
        return cls.parse(data, path, base_offset)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, path: Path, base_offset: int) -> Self:
        """An index from the bytes of a whole file (read from disk or from object storage; `path`
        names it in errors and is where writes would go). Raises CorruptIndexError unless the
        header is this kind's, of a known version, for `base_offset`, followed by whole entries."""
        data = memoryview(data).cast("B")
        if len(data) < HEADER_SIZE:
            raise CorruptIndexError(f"{path.name}: {len(data)} bytes, too short for the {HEADER_SIZE}-byte header")
        magic, version, entry_size, stored_base = HEADER.unpack_from(data)
        if magic != cls.MAGIC:
            raise CorruptIndexError(f"{path.name}: magic {magic!r}, expected {cls.MAGIC!r} ({cls.__name__})")
        if version != VERSION:
            raise CorruptIndexError(f"{path.name}: format version {version}, this broker reads version {VERSION}")
        if entry_size != cls.ENTRY.size:
            raise CorruptIndexError(f"{path.name}: entry size {entry_size}, expected {cls.ENTRY.size}")
        if stored_base != base_offset:
            raise CorruptIndexError(f"{path.name}: base offset {stored_base}, expected {base_offset}")
        entries = data[HEADER_SIZE:]
        if len(entries) % entry_size:
            raise CorruptIndexError(f"{path.name}: {len(entries)} bytes of entries is not a whole number of entries")
        index = cls(path, base_offset)
        index._load_entries(entries)
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

    def _write_header(self) -> None:
        """Make the file hold the header and nothing else."""
        self._ftruncate(0)
        self._pwrite(self.header(self.base_offset), 0)

    def _pwrite(self, data: bytes, position: int) -> None:
        try:
            written = os.pwrite(self._writer(), data, position)
            while written < len(data):
                written += os.pwrite(self._writer(), data[written:], position + written)
        except OSError as err:
            raise KafkaStorageError(f"cannot write {self.path}: {err}") from err

    def _ftruncate(self, size: int) -> None:
        try:
            os.ftruncate(self._writer(), size)
        except OSError as err:
            raise KafkaStorageError(f"cannot truncate {self.path}: {err}") from err

    def write_pending(self) -> None:
        """Write queued entries to the file (no fsync)."""
        if not self._pending:
            return
        data = bytes(self._pending)
        self._pwrite(data, HEADER_SIZE + self._written * self.ENTRY.size)
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
        if not 0 <= count <= len(self):
            raise CorruptIndexError(f"{self.path.name}: cannot keep {count} of its {len(self)} entries")
        self._keep_entries(count)
        if count < self._written:
            self._ftruncate(HEADER_SIZE + count * self.ENTRY.size)
            self._written = count
            self._pending.clear()
        else:
            del self._pending[(count - self._written) * self.ENTRY.size :]

    def reset(self) -> None:
        """Drop every entry (before a rebuild); the file keeps (or gets) a valid header."""
        self._keep_entries(0)
        self._pending.clear()
        self._written = 0
        self._write_header()

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
