"""A real broker process with fault points, for durability tests: `python -m tests.faults.broker`
takes the same arguments as `python -m cli` and runs it after installing hooks that a
test drives through files in the directory named by PYMQ_FAULT_DIR:

    fsync.block     while it exists, every fsync (and syncfs) waits
    fsync.fail      while it exists, every fsync fails with EIO (as a dying disk's would)
    fsync.count     the hooks append one line per fsync, so a test can see that one happened
    create.budget   holds a number N: the next N file creations (os.open with O_CREAT) succeed,
                    every later one fails with EMFILE (as when the process runs out of descriptors)
    rename.fail     holds a path fragment: every os.rename of a path containing it fails with EIO

The broker code is unchanged: only `os.fsync`, `os.open`, `os.rename` and the filesystem sync are
wrapped, at the process's edge, which is where a real disk would misbehave.
"""
from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path
from typing import Any

from broker.log import checkpoint, log_manager

FAULT_DIR = Path(os.environ["PYMQ_FAULT_DIR"])
_real_fsync = os.fsync
_real_open = os.open
_real_rename = os.rename
_real_sync_filesystem = checkpoint.sync_filesystem


def _fault_point() -> None:
    while (FAULT_DIR / "fsync.block").exists():  # the injected hang (in the broker), until the test lifts it
        time.sleep(0.005)
    if (FAULT_DIR / "fsync.fail").exists():
        raise OSError(errno.EIO, "injected fsync failure")


def fsync(fd: int) -> None:
    _fault_point()
    _real_fsync(fd)
    with open(FAULT_DIR / "fsync.count", "a") as f:
        f.write("1\n")


def open_file(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    budget = FAULT_DIR / "create.budget"
    if flags & os.O_CREAT and budget.exists():
        left = int(budget.read_text() or 0)
        if left <= 0:
            raise OSError(errno.EMFILE, "injected: too many open files")
        budget.write_text(str(left - 1))
    return _real_open(path, flags, mode, dir_fd=dir_fd)


def rename(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
    failing = FAULT_DIR / "rename.fail"
    if failing.exists() and failing.read_text().strip() in str(src):
        raise OSError(errno.EIO, "injected rename failure")
    _real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def sync_filesystem(directory: Path) -> None:
    _fault_point()
    _real_sync_filesystem(directory)


os.fsync = fsync
os.open = open_file
os.rename = rename
checkpoint.sync_filesystem = log_manager.sync_filesystem = sync_filesystem

if __name__ == "__main__":
    from cli import main

    sys.argv[0] = "pymq"
    main()
