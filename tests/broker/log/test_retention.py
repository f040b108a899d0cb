"""Retention when the disk misbehaves: a segment leaves its log only once its files are renamed
`.deleted`, a rename failing part way keeps the log consistent, and one log's failure does not
stop the manager's retention pass over the others."""
from __future__ import annotations

import errno
import os
from collections.abc import Callable

import pytest

from broker.config import LogConfig
from common.errors import KafkaStorageError, OffsetOutOfRangeError
from broker.log import LogManager, TopicLogSpec
from broker.log.checkpoint import write_offsets
from broker.log.log_manager import LOG_START_OFFSET_CHECKPOINT

from tests.broker.log.appends import append

R = 3  # records per test batch; three batches fill a 4 KiB segment
EXPIRING = {"retention_ms": 1_000}
TIMESTAMPS = [1_000] * 6 + [9_000]  # segments 0 and 9 expire at 6_500, segment 18 does not


def fill(partition_log, batch) -> None:
    for timestamp in TIMESTAMPS:
        append(partition_log, batch(R, timestamp))


def fail_renames(monkeypatch, failing: Callable[[str], bool]) -> None:
    """os.rename raises EIO for every source path `failing` picks."""
    real_rename = os.rename

    def rename(src, dst) -> None:
        if failing(str(src)):
            raise OSError(errno.EIO, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)


def fail_rename_of(monkeypatch, name: str) -> None:
    fail_renames(monkeypatch, lambda src: os.path.basename(src) == name)


def names(directory) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_a_failing_rename_of_the_second_segment_removes_only_the_first(open_log, batch, monkeypatch):
    """Segment 0 is renamed and leaves the log (log start 9); segment 9 could not be renamed and
    stays, whole and readable; a later pass finishes the job."""
    partition_log = open_log(**EXPIRING)
    fill(partition_log, batch)
    fail_rename_of(monkeypatch, f"{9:020d}.log")
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        partition_log.delete_old_segments(6_500)
    monkeypatch.undo()
    files = names(partition_log.directory)
    assert {f"{0:020d}{s}.deleted" for s in (".log", ".index", ".timeindex")} <= files
    assert {f"{0:020d}{s}" for s in (".log", ".index", ".timeindex")}.isdisjoint(files)
    assert {f"{b:020d}.log" for b in (9, 18)} <= files and not any(n.startswith(f"{9:020d}") and n.endswith(".deleted") for n in files)
    assert [s.base_offset for s in partition_log.segments()] == [9, 18]
    assert partition_log.log_start_offset == 9
    assert partition_log.leader_epoch_entries == [(0, 9)]
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(0, 1)
    assert [partition_log.read(o, 1).first_offset for o in (9, 12, 18)] == [9, 12, 18]
    removed = partition_log.delete_old_segments(6_500)
    assert [s.base_offset for s in removed] == [9]
    assert partition_log.log_start_offset == 18


def test_a_failing_rename_of_the_first_segment_changes_nothing(open_log, batch, monkeypatch):
    partition_log = open_log(**EXPIRING)
    fill(partition_log, batch)
    before = names(partition_log.directory)
    fail_rename_of(monkeypatch, f"{0:020d}.log")
    with pytest.raises(KafkaStorageError):
        partition_log.delete_old_segments(6_500)
    monkeypatch.undo()
    assert names(partition_log.directory) == before
    assert [s.base_offset for s in partition_log.segments()] == [0, 9, 18]
    assert partition_log.log_start_offset == 0
    assert partition_log.read(0, 1).first_offset == 0


def test_manager_retention_runs_every_log_even_when_one_fails(tmp_path, clock, batch, monkeypatch):
    manager = LogManager(tmp_path / "data", clock)
    try:
        config = LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000)
        logs = manager.load({"a": TopicLogSpec(None, config, 1), "b": TopicLogSpec(None, config, 1),
                             "c": TopicLogSpec(None, config, 1)})
        for partition_log in logs.values():
            fill(partition_log, batch)
        broken = str(logs[("b", 0)].directory)
        fail_renames(monkeypatch, lambda src: src.startswith(broken))
        assert manager.run_retention(6_500) == 4
        assert manager.retention_failures == 1
        assert [logs[(t, 0)].log_start_offset for t in "abc"] == [18, 0, 18]
        assert manager.run_retention(6_500) == 0
        assert manager.retention_failures == 2
        monkeypatch.undo()
        assert manager.run_retention(6_500) == 2
        assert manager.retention_failures == 2
    finally:
        manager.close()


def test_a_bug_in_one_logs_retention_does_not_stop_the_pass(tmp_path, clock, batch, monkeypatch):
    """Not a storage error but a plain bug (RuntimeError) in log b: a and c are still cleaned up,
    and the failure is counted."""
    manager = LogManager(tmp_path / "data", clock)
    try:
        config = LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000)
        logs = manager.load({"a": TopicLogSpec(None, config, 1), "b": TopicLogSpec(None, config, 1),
                             "c": TopicLogSpec(None, config, 1)})
        for partition_log in logs.values():
            fill(partition_log, batch)

        def bug(now_ms: int) -> list:
            raise RuntimeError("a bug in retention")

        monkeypatch.setattr(logs[("b", 0)], "delete_old_segments", bug)
        assert manager.run_retention(6_500) == 4
        assert manager.retention_failures == 1
        assert [logs[(t, 0)].log_start_offset for t in "abc"] == [18, 0, 18]
    finally:
        manager.close()


def test_segments_wholly_below_a_checkpointed_log_start_are_deleted_whatever_the_retention(tmp_path, clock, batch):
    """A crash between moving the log start and deleting segments (or records deleted below it)
    leaves segments no reader can reach: retention removes them even with retention disabled
    (Kafka's log-start-offset breach)."""
    config = LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=-1, retention_bytes=-1)
    manager = LogManager(tmp_path / "data", clock)
    partition_log = manager.load({"t": TopicLogSpec(None, config, 1)})[("t", 0)]
    for _ in range(7):
        append(partition_log, batch(R))
    manager.close()
    write_offsets(tmp_path / "data" / LOG_START_OFFSET_CHECKPOINT, {("t", 0): 10})
    restarted = LogManager(tmp_path / "data", clock)
    try:
        reopened = restarted.load({"t": TopicLogSpec(None, config, 1)})[("t", 0)]
        assert (reopened.log_start_offset, reopened.local_log_start_offset) == (10, 0)
        assert restarted.run_retention(0) == 1
        assert [s.base_offset for s in reopened.segments()] == [9, 18]
        assert reopened.log_start_offset == 10  # inside segment 9, which stays
        assert restarted.run_retention(0) == 0
    finally:
        restarted.close()
