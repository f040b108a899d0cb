"""Retention renames a segment's files `.deleted` before it leaves the log, and the `.log` last:
a rename failing part way must leave the segment whole where a restart will find it."""
from __future__ import annotations

import errno
import os

from broker.errors import KafkaStorageError
from tests.broker.log.appends import append

R = 3


def test_a_failing_index_rename_keeps_the_segment_whole_in_its_log(open_log, crash_log, batch, monkeypatch):
    partition_log = open_log(retention_ms=1_000)
    for timestamp in [1_000] * 6 + [9_000]:
        append(partition_log, batch(R, timestamp))
    first = partition_log.segments()[0]
    real_rename = os.rename

    def rename(src, dst) -> None:
        if str(src).endswith(f"{0:020d}.timeindex"):
            raise OSError(errno.EIO, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    try:
        partition_log.delete_old_segments(6_500)
    except KafkaStorageError:
        pass
    monkeypatch.undo()
    assert partition_log.segments()[0] is first and partition_log.log_start_offset == 0
    assert first.log_path.name == f"{0:020d}.log" and first.log_path.exists()
    assert not list(partition_log.directory.glob(f"{0:020d}.*.deleted"))
    crash_log(partition_log)
    reopened = open_log(retention_ms=1_000)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 7 * R)
    assert reopened.read(0, 1 << 20, max_offset=reopened.log_end_offset).size > 0  # the high watermark is the partition's to raise
