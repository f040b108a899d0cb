"""A real broker process with fault points, for durability tests: `python -m tests.faults.broker`
takes the same arguments as `python -m broker.cli` and runs it after installing hooks that a
test drives through files in the directory named by PYMQ_FAULT_DIR:

    fsync.block     while it exists, every fsync (and syncfs) waits
    fsync.fail      while it exists, every fsync fails with EIO (as a dying disk's would)
    fsync.count     the hooks append one line per fsync, so a test can see that one happened

The broker code is unchanged: only `os.fsync` and the filesystem sync are wrapped, at the
process's edge, which is where a real disk would misbehave.
"""
from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

from broker.log import checkpoint, log_manager

FAULT_DIR = Path(os.environ["PYMQ_FAULT_DIR"])
_real_fsync = os.fsync
_real_sync_filesystem = checkpoint.sync_filesystem


def _fault_point() -> None:
    while (FAULT_DIR / "fsync.block").exists():
        time.sleep(0.005)
    if (FAULT_DIR / "fsync.fail").exists():
        raise OSError(errno.EIO, "injected fsync failure")


def fsync(fd: int) -> None:
    _fault_point()
    _real_fsync(fd)
    with open(FAULT_DIR / "fsync.count", "a") as f:
        f.write("1\n")


def sync_filesystem(directory: Path) -> None:
    _fault_point()
    _real_sync_filesystem(directory)


os.fsync = fsync
checkpoint.sync_filesystem = log_manager.sync_filesystem = sync_filesystem

if __name__ == "__main__":
    from broker.cli import main

    sys.argv[0] = "pymq"
    main()
