"""`python -m benchmarks.slow_disk_broker broker start ...`: `python -m cli` on a slow disk.

A test double for the disk, for the loop-lag benchmark (benchmarks/loop_lag.py) and the
backpressure tests: every write of a segment's records (`os.pwrite` of at least
PYMQ_SLOW_DISK_MIN_BYTES, default 4096, so index entries are spared) sleeps PYMQ_SLOW_PWRITE_MS
first, and every fsync of a segment's `.log` sleeps PYMQ_SLOW_FSYNC_MS (metadata and index syncs
are left alone, so topic creation stays quick). The sleeps release the GIL, as a disk that is
slow to answer does. The broker code is unchanged: only the process's `os` functions are wrapped.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

PWRITE_S = float(os.environ.get("PYMQ_SLOW_PWRITE_MS", "0")) / 1000
FSYNC_S = float(os.environ.get("PYMQ_SLOW_FSYNC_MS", "0")) / 1000
MIN_BYTES = int(os.environ.get("PYMQ_SLOW_DISK_MIN_BYTES", "4096"))
_real_pwrite = os.pwrite
_real_fsync = os.fsync


def pwrite(fd: int, data: Any, position: int) -> int:
    if len(data) >= MIN_BYTES:
        time.sleep(PWRITE_S)
    return _real_pwrite(fd, data, position)


def fsync(fd: int) -> None:
    try:
        is_log = os.readlink(f"/proc/self/fd/{fd}").endswith(".log")
    except OSError:
        is_log = False
    if is_log:
        time.sleep(FSYNC_S)
    _real_fsync(fd)


os.pwrite = pwrite
os.fsync = fsync

if __name__ == "__main__":
    from cli import main

    sys.argv[0] = "pymq"
    main()
