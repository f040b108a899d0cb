"""The locking rule of broker/log/unified_log.py: a reader (UnifiedLog.read and a high-watermark
move, what the event loop does) never waits for the disk I/O of a writer. A slow disk is injected
by delaying os.pwrite / os.fsync by DELAY_S; while (a) a large append is written, (b) the cleaner's
swap fsyncs the directory and (c) a flush runs, readers probe the log in a loop and the worst
time one of them waited must stay far below the delay (it waited the whole delay when the log
held one lock across that I/O)."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker.log import UnifiedLog
from tests.broker.log.appends import append
from tests.helpers.logs import build_batch
from tests.helpers.log_cleaning import build, write_cleaned

DELAY_S = 1.0  # each injected pwrite / fsync stalls this long
MAX_READER_WAIT_S = DELAY_S / 2  # a reader waits for no stall: anything near DELAY_S is one
LARGE = 4 << 20  # a produce the log writer hands to its thread


class SlowDisk:
    """os.pwrite calls of at least `pwrite_min_bytes` (None: none) and, with `fsync`, every
    os.fsync stall DELAY_S first; `stalled` is set when the first stall begins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, pwrite_min_bytes: int | None, fsync: bool) -> None:
        self.stalled = threading.Event()
        real_pwrite, real_fsync = os.pwrite, os.fsync

        def pwrite(fd: int, data: bytes, position: int) -> int:
            if pwrite_min_bytes is not None and len(data) >= pwrite_min_bytes:
                self._stall()
            return real_pwrite(fd, data, position)

        def fsync(fd: int) -> None:
            if fsync:
                self._stall()
            real_fsync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fsync", fsync)

    def _stall(self) -> None:
        self.stalled.set()
        time.sleep(DELAY_S)  # not a wait: the injected slow disk


def worst_reader_wait(partition_log: UnifiedLog, disk: SlowDisk, writer: Callable[[], object]) -> float:
    """Run `writer` on a thread; from its first stall until it returns, read the log's first
    batch and move its high watermark, again and again. Returns the longest probe (seconds);
    `writer`'s error, if any, is raised."""
    with ThreadPoolExecutor(max_workers=1) as executor:
        done = executor.submit(writer)
        assert disk.stalled.wait(30), "the writer never reached the slow disk"
        worst = 0.0
        while not done.done():
            start = time.monotonic()
            partition_log.read(0, 1024).close()
            partition_log.update_high_watermark(partition_log.high_watermark)
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.005)  # pacing, not a wait: a probe every 5 ms while the writer stalls
        done.result()
    print(f"worst reader wait {worst * 1000:.1f} ms (injected stall {DELAY_S * 1000:.0f} ms)")
    return worst


def test_a_reader_does_not_wait_for_a_large_append_being_written(unified_log, monkeypatch):
    """A 4 MiB append stalls in its pwrite; reads and high-watermark moves go on meanwhile, and
    see nothing of the append until it returns."""
    partition_log = unified_log(segment_bytes=64 << 20, max_message_bytes=8 << 20)
    append(partition_log, build_batch())
    partition_log.update_high_watermark(partition_log.log_end_offset)
    large = build_batch(value=b"x" * LARGE)
    disk = SlowDisk(monkeypatch, pwrite_min_bytes=LARGE, fsync=False)
    assert worst_reader_wait(partition_log, disk, lambda: append(partition_log, large)) < MAX_READER_WAIT_S
    assert partition_log.log_end_offset == 2


def test_a_reader_does_not_see_an_append_before_it_is_written(unified_log, monkeypatch):
    """While the pwrite stalls, the LEO, the segment's size and a follower's read (to the LEO)
    are those before the append."""
    partition_log = unified_log(segment_bytes=64 << 20, max_message_bytes=8 << 20)
    append(partition_log, build_batch())
    size = partition_log.size_bytes()
    disk = SlowDisk(monkeypatch, pwrite_min_bytes=LARGE, fsync=False)
    with ThreadPoolExecutor(max_workers=1) as executor:
        done = executor.submit(append, partition_log, build_batch(value=b"x" * LARGE))
        assert disk.stalled.wait(30)
        assert (partition_log.log_end_offset, partition_log.size_bytes()) == (1, size)
        assert partition_log.read(1, 1 << 20, max_offset=partition_log.log_end_offset).size == 0
        done.result()
    assert partition_log.read(1, 1 << 20, max_offset=partition_log.log_end_offset).size > LARGE


def test_a_reader_does_not_wait_for_the_cleaners_swap_to_fsync(open_log, logs, monkeypatch):
    """The swap's directory fsyncs (after its commit, and after its renames) stall; readers go on,
    and the swap completes."""
    partition_log, _ = build(open_log, "survivors")
    cleaned, group = write_cleaned(partition_log, logs.manager.cache)
    generation = partition_log.cleanable_segments().generation
    disk = SlowDisk(monkeypatch, pwrite_min_bytes=None, fsync=True)
    swapped: list[bool] = []
    wait = worst_reader_wait(partition_log, disk,
                             lambda: swapped.append(partition_log.replace_segments(cleaned, group, generation)))
    assert wait < MAX_READER_WAIT_S
    assert swapped == [True] and partition_log.segments()[0] is cleaned


@pytest.mark.slow
def test_a_reader_does_not_wait_for_a_flush(unified_log, monkeypatch):
    """A flush writes the active segment's queued index entry and fsyncs the segments and the
    directory, each stalling; readers go on, and the recovery point reaches the LEO."""
    partition_log = unified_log()
    for _ in range(6):  # two batches a segment, the second of each indexed (index.interval.bytes 0)
        append(partition_log, build_batch(records=3, value=b"v" * 300))
    partition_log.update_high_watermark(partition_log.log_end_offset)
    disk = SlowDisk(monkeypatch, pwrite_min_bytes=1, fsync=True)
    assert worst_reader_wait(partition_log, disk, partition_log.flush) < MAX_READER_WAIT_S
    assert partition_log.recovery_point == partition_log.log_end_offset
