"""IndexFile: a local segment's sparse index, kept in its file (Kafka's AbstractIndex).

The layout and the in-memory index are the format's (segment_format/index_file.py: IndexKind,
SparseIndex); this module is the file I/O a broker adds to them. The entries live in memory and
reach the file lazily: `append` only queues packed bytes, `write_pending` writes them with one
pwrite, `prepare_sync` / `flush` make them durable. Keeping index writes off the append path leaves
one write syscall per append; a crash that loses queued entries is harmless because recovery
rebuilds the indexes of every segment it scans, and a sparser index is still a correct one.

The write fd is opened on first need, so loading a sealed segment's index costs no descriptor;
a new index (`IndexFile.create`) writes its file, header and queued entries in one pwrite, at its
first `write_pending`. Until then no file exists, which recovery treats like any missing index: the
segment is past the recovery point (nothing flushed it) and its indexes are rebuilt from the `.log`.
"""
from __future__ import annotations

import os
from pathlib import Path

from common.errors import KafkaStorageError
from segment_format.index_file import HEADER_SIZE, CorruptIndexError, IndexKind, SparseIndex


class IndexFile(SparseIndex):
    """A SparseIndex mirrored to the file at `path`. Build with `create` (a new, empty index) or
    `load` (an existing file).

    Not thread-safe on its own: the owning segment serializes calls; only `prepare_sync`'s
    returned fd may be used from another thread.
    """

    def __init__(self, kind: IndexKind, path: Path, base_offset: int, file_made: bool = True) -> None:
        super().__init__(kind, path, base_offset)
        self._fd: int | None = None
        self._written = 0  # entries already in the file
        self._pending = bytearray()  # packed entries queued for the file
        self._header_written = file_made  # False: a created index whose file is still to be (re)made

    @classmethod
    def create(cls, kind: IndexKind, path: Path, base_offset: int) -> IndexFile:
        """A new empty index whose file is created, or emptied if one exists at `path`, with its
        first write (`write_pending`, `prepare_sync`): creating a segment costs no index I/O,
        which is most of what creating a 10,000-partition topic would otherwise cost."""
        return cls(kind, path, base_offset, file_made=False)

    @classmethod
    def load(cls, kind: IndexKind, path: Path, base_offset: int) -> IndexFile:
        """Read the entries of an existing file. Raises CorruptIndexError if it is missing or
        `IndexKind.entries` rejects it; the caller must still call `sanity_check` against the segment."""
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise CorruptIndexError(f"{path.name} is missing") from err
        except OSError as err:
            raise KafkaStorageError(f"cannot read {path}: {err}") from err
        index = cls(kind, path, base_offset)
        index._load_entries(kind.entries(data, path, base_offset))
        return index

    def _load_entries(self, data: memoryview) -> None:
        super()._load_entries(data)
        self._written = len(self)

    # --- entries, queued for the file ------------------------------------------------------------

    def append(self, key: int, value: int) -> None:
        """SparseIndex.append, queueing the entry added (if any) for the file."""
        count = len(self)
        super().append(key, value)
        if len(self) > count:
            self._pending += self.kind.entry.pack(self._keys[-1], self._values[-1])

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries, in memory and on file."""
        super().truncate_entries(count)
        if count < self._written:
            self._ftruncate(HEADER_SIZE + count * self.kind.entry.size)
            self._written = count
            self._pending.clear()
        else:
            del self._pending[(count - self._written) * self.kind.entry.size :]

    def reset(self) -> None:
        """Drop every entry (before a rebuild); the file keeps (or gets) a valid header."""
        super().reset()
        self._pending.clear()
        self._written = 0
        self._write_header()

    # --- the file ------------------------------------------------------------------------------

    @property
    def file_made(self) -> bool:
        """Whether the file exists with this index's header (False for a created index before its
        first write)."""
        return self._header_written

    def _writer(self) -> int:
        if self._fd is None:
            flags = os.O_RDWR | os.O_CREAT | (0 if self._header_written else os.O_TRUNC)
            try:
                self._fd = os.open(self.path, flags, 0o644)
            except OSError as err:
                raise KafkaStorageError(f"cannot open {self.path}: {err}") from err
        return self._fd

    def _write_header(self) -> None:
        """Make the file hold the header and nothing else."""
        self._ftruncate(0)
        self._pwrite(self.kind.header(self.base_offset), 0)
        self._header_written = True

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
        """Write queued entries to the file (no fsync); a created index's first call creates the
        file with its header."""
        if not self._header_written:
            self._pwrite(self.kind.header(self.base_offset) + self._pending, 0)  # the fd opens with O_TRUNC
            self._header_written = True
        elif self._pending:
            self._pwrite(bytes(self._pending), HEADER_SIZE + self._written * self.kind.entry.size)
        else:
            return
        self._written += len(self._pending) // self.kind.entry.size
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
