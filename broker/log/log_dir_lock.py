"""LogDirLock: `{log.dir}/.lock`, held for a broker's whole life (Kafka's LogManager.lockLogDirs).

Two brokers on one data directory would each append to the same segment files at offsets of their
own and acknowledge records the other overwrites. So a broker takes an exclusive `flock` on the
directory's `.lock` before it reads or writes anything there, and refuses to start when another
process holds it. The kernel drops a flock when its holder exits, even by SIGKILL, so a crashed
broker never leaves a stale lock behind; the file itself stays (it holds the last holder's pid,
for the error message only).

The lock belongs to the open file description: a second `LogDirLock` on the same directory fails
even inside the same process, which is what a test of the guarantee needs.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from common.errors import LogDirInUseError

LOCK_FILE = ".lock"


class LogDirLock:
    def __init__(self, log_dir: Path) -> None:
        """Take the lock or raise LogDirInUseError naming the directory and the holder's pid."""
        self.path = Path(log_dir) / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LogDirInUseError(
                f"log.dir {log_dir} is in use by another broker (pid {holder} holds {self.path}); "
                f"stop that broker or give this one another log.dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock (idempotent). The file stays: deleting it would race a broker locking it anew."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
