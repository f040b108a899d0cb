"""FileCache: a bounded pool of open segment file descriptors shared by every log of a broker.

A broker with 10,000 partitions and several segments each cannot hold every `.log` open (Kafka
needs ulimits in the hundreds of thousands for that). Segments therefore do not own descriptors:
they ask the cache for one when they read or write and hand it back when done. The cache keeps the
most recently used descriptors open, up to `max_open`, and closes the least recently used one that
nobody is using when it needs room. A descriptor in use ("pinned") is never closed; if every
cached one is pinned the cache grows past `max_open` for as long as that lasts, rather than fail.

One O_RDWR descriptor per file serves pread, pwrite, fsync (on a dup) and sendfile (on a dup owned
by the fetch response, see `FetchSlice`), so the active segment costs one descriptor, not four.

Thread-safe: the event loop, the log writer thread and flush threads all use it.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import KafkaStorageError


class _Entry:
    __slots__ = ("fd", "path", "pins")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path  # the key it is cached under (follows `rename`)
        self.pins = 0


class FileCache:
    """LRU of open descriptors keyed by path. `max_open` bounds the idle ones kept open."""

    def __init__(self, max_open: int = 1024) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._entries: OrderedDict[Path, _Entry] = OrderedDict()
        self.opened = 0  # descriptors opened over the cache's life (a test can count misses)

    def __len__(self) -> int:
        """Descriptors open now."""
        with self._lock:
            return len(self._entries)

    @contextmanager
    def pinned(self, path: Path) -> Iterator[int]:
        """An open O_RDWR descriptor of `path`, valid until the block ends. Do not close it; dup it
        to keep it longer. KafkaStorageError if the file cannot be opened."""
        entry = self._acquire(path)
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.pins -= 1
                if entry.pins == 0:
                    if self._entries.get(entry.path) is not entry:
                        os.close(entry.fd)  # forgotten while pinned: the last user closes it
                    else:
                        self._evict()  # the cache may have grown past max_open while it was pinned

    def dup(self, path: Path) -> int:
        """A new descriptor of `path` owned by the caller (who must close it)."""
        with self.pinned(path) as fd:
            try:
                return os.dup(fd)
            except OSError as err:
                raise KafkaStorageError(f"cannot dup a descriptor of {path}: {err}") from err

    def forget(self, path: Path) -> None:
        """Close the cached descriptor of `path` (before it is renamed, truncated away or unlinked).
        A pinned one closes when its last user is done."""
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is not None and entry.pins == 0:
                os.close(entry.fd)

    def rename(self, old: Path, new: Path) -> None:
        """Keep a cached descriptor across a rename of its file (descriptors follow the inode).
        A descriptor cached under `new` is of the file the rename replaced: it is closed (by its
        last user, if pinned)."""
        with self._lock:
            replaced = self._entries.pop(new, None)
            if replaced is not None and replaced.pins == 0:
                os.close(replaced.fd)
            entry = self._entries.pop(old, None)
            if entry is not None:
                entry.path = new
                self._entries[new] = entry

    def close(self) -> None:
        """Close every idle descriptor; pinned ones close when released."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), OrderedDict()
        for entry in entries:
            if entry.pins == 0:
                os.close(entry.fd)

    def _acquire(self, path: Path) -> _Entry:
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:
                self._entries.move_to_end(path)
                entry.pins += 1
                return entry
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as err:
            raise KafkaStorageError(f"cannot open {path}: {err}") from err
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:  # another thread opened it meanwhile: use theirs
                os.close(fd)
            else:
                entry = self._entries[path] = _Entry(fd, path)
                self.opened += 1
            self._entries.move_to_end(path)
            entry.pins += 1  # before evicting: the entry just opened is in use, never a candidate
            self._evict()
            return entry

    def _evict(self) -> None:
        """Close least recently used idle descriptors while more than max_open are cached."""
        excess = len(self._entries) - self.max_open
        if excess <= 0:
            return
        idle = []
        for path, entry in self._entries.items():  # oldest first
            if entry.pins == 0:
                idle.append(path)
                if len(idle) == excess:
                    break
        for path in idle:
            os.close(self._entries.pop(path).fd)
