"""Retention renames a segment's files `.deleted` before it leaves the log, and the `.log` last:
a rename failing part way must leave the segment whole where a restart will find it."""
from __future__ import annotations

import errno
import os

from broker.config import LogConfig
from common.errors import KafkaStorageError
from broker.log import LogManager, TopicLogSpec, UnifiedLog
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


def test_segments_queued_for_deletion_go_with_their_deleted_topic(tmp_path, clock, batch):
    """A deleted topic's segments waiting for the delete delay are dropped from the queue with
    their directory: purged later by their old paths, they would unlink the files of a topic
    re-created under the same name (here: its own segment waiting for the delay)."""
    manager = LogManager(tmp_path / "data", clock)
    spec = TopicLogSpec(None, LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000), 1)

    def expire_old_segments() -> tuple[UnifiedLog, int]:
        partition_log = manager.create_logs("t", spec, [0])[0]
        for timestamp in [1_000] * 6 + [9_000]:
            append(partition_log, batch(R, timestamp))
        return partition_log, manager.run_retention(now_ms=6_500)

    try:
        _, expired_before = expire_old_segments()
        manager.delete_topic("t")
        recreated, expired = expire_old_segments()
        waiting = recreated.directory / f"{0:020d}.log.deleted"
        assert expired_before == expired > 0 and waiting.exists()
        assert manager.purge_deleted(now_ms=6_500, delay_ms=0) == expired  # only the new topic's own
        assert not waiting.exists()
    finally:
        manager.close()
