"""Whether a log directory is full: appends refused for lack of space, logged once per change.

A full disk makes an append's write fail (ENOSPC, or EDQUOT past a quota); the log cuts the torn
bytes back and the produce is answered KAFKA_STORAGE_ERROR, a retriable error, so producers retry
until space is freed and nothing is lost (the directory stays online: unlike a failed fsync, a
refused write leaves nothing in doubt). Refusing is quiet on the wire, so the broker says it in
its log: once when the directory becomes full and once when an append succeeds there again, each
time with the directory and its free bytes, and `broker/metrics.py` exports the state
(pymq_log_dir_disk_full) and the free bytes (pymq_log_dir_free_bytes).

Thread-safe: appends run on the event loop and on the log writer's threads.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `directory` (-1 if unknown)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return -1
    return stat.f_bavail * stat.f_frsize


def is_no_space(err: BaseException) -> bool:
    """Whether `err`, or an OSError it was raised from or while handling, says the filesystem is full."""
    seen = 0
    while err is not None and seen < 8:  # a short chain: KafkaStorageError from an OSError
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1  # type: ignore[assignment]
    return False


class LogDirSpace:
    """The full / not full state of one log directory, shared by all its logs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.full = False  # read without the lock: a stale read only delays a log line by one append
        self._lock = threading.Lock()

    def write_failed(self, err: BaseException) -> None:
        """An append's write failed with `err`; if for lack of space, the directory is full."""
        if not is_no_space(err):
            return
        with self._lock:
            if self.full:
                return
            self.full = True
        log.error("log directory %s is full (%d bytes free): appends are refused with KAFKA_STORAGE_ERROR until "
                  "space is freed: %s", self.directory, free_bytes(self.directory), err)

    def write_succeeded(self) -> None:
        """An append was written: a full directory has space again. One attribute read when not full."""
        if not self.full:
            return
        with self._lock:
            if not self.full:
                return
            self.full = False
        log.warning("log directory %s has space again (%d bytes free): appends are accepted", self.directory,
                    free_bytes(self.directory))
