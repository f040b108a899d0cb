"""What a failing disk does to a log: an append that fails part way leaves the log exactly as it
was, and a failed fsync takes the whole log directory offline without ever moving a recovery
point (a later fsync that succeeds would launder pages the kernel dropped)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from common.errors import KafkaStorageError
from broker.log import LogManager, Segment, TopicLogSpec
from broker.log.checkpoint import read_offsets
from broker.log.log_manager import RECOVERY_POINT_CHECKPOINT
from broker.log.unified_log import LEADER_EPOCH_FILE

from tests.helpers.logs import SMALL, TOPIC_ID

R = 3  # records per test batch; three batches fill a 4 KiB segment


def state(partition_log) -> dict:
    """Everything an append may change, as seen from outside."""
    return {
        "leo": partition_log.log_end_offset,
        "hw": partition_log.high_watermark,
        "segments": [(s.base_offset, s.next_offset, s.size, s.sealed) for s in partition_log.segments()],
        "logs": {p.name: p.stat().st_size for p in partition_log.directory.glob("*.log")},
        "files": sorted(p.name for p in partition_log.directory.iterdir() if p.suffix not in (".index", ".timeindex")),
        "epochs": partition_log.leader_epoch_entries,
        "epoch_file": (partition_log.directory / LEADER_EPOCH_FILE).read_text(),
    }


def five_batches(batch) -> bytearray:
    """One append that, after two batches in segment 0, writes in three runs: 1 batch into
    segment 0, 3 into a new segment, 1 into another."""
    return bytearray().join(batch(R) for _ in range(5))


def prepared(unified_log, batch):
    partition_log = unified_log()
    for _ in range(2):
        partition_log.append_as_leader(batch(R), 0)
    return partition_log


def fail_second_log_write(monkeypatch) -> list[int]:
    """os.pwrite fails with ENOSPC on the second write to a `.log` (index writes pass)."""
    real_pwrite, log_writes = os.pwrite, []

    def pwrite(fd: int, data, position: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            log_writes.append(position)
            if len(log_writes) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return log_writes


def fail_second_segment_creation(monkeypatch) -> list[int]:
    real_create, created = Segment.create, []

    def create(directory: Path, base_offset: int, cache) -> Segment:
        created.append(base_offset)
        if len(created) == 2:
            raise KafkaStorageError(f"cannot create segment {base_offset}: Too many open files")
        return real_create(directory, base_offset, cache)

    monkeypatch.setattr(Segment, "create", create)
    return created


@pytest.mark.parametrize(
    "inject, calls",
    [(fail_second_log_write, lambda size: [2 * size, 0]), (fail_second_segment_creation, lambda size: [9, 18])],
    ids=["enospc-on-the-second-run", "roll-fails-on-the-second-roll"],
)
@pytest.mark.parametrize("epoch", [0, 2], ids=["same-epoch", "new-epoch"])
def test_an_append_failing_part_way_leaves_the_log_exactly_as_before(unified_log, batch, monkeypatch, inject, calls, epoch):
    """The first run was written (and a segment rolled) before the failure: all of it is undone,
    including the epoch the append started."""
    partition_log = prepared(unified_log, batch)
    before = state(partition_log)
    recorded = inject(monkeypatch)
    with pytest.raises(KafkaStorageError):
        partition_log.append_as_leader(five_batches(batch), epoch)
    monkeypatch.undo()
    assert recorded == calls(len(batch(R)))  # the failure hit where the test meant it to
    assert state(partition_log) == before
    assert not partition_log.offline
    info = partition_log.append_as_leader(five_batches(batch), epoch)
    assert (info.first_offset, info.last_offset) == (2 * R, 7 * R - 1)
    assert [s.base_offset for s in partition_log.segments()] == [0, 9, 18]
    partition_log.update_high_watermark(partition_log.log_end_offset)
    for offset in range(7 * R):
        assert partition_log.read(offset, 1).first_offset == offset // R * R


def test_a_failed_append_leaves_nothing_for_recovery_to_find(open_log, crash_log, batch, monkeypatch):
    partition_log = open_log()
    for _ in range(2):
        partition_log.append_as_leader(batch(R), 0)
    fail_second_log_write(monkeypatch)
    with pytest.raises(KafkaStorageError):
        partition_log.append_as_leader(five_batches(batch), 0)
    monkeypatch.undo()
    crash_log(partition_log)
    reopened = open_log()
    assert (reopened.log_end_offset, reopened.last_recovery_truncated_bytes) == (2 * R, 0)


# --- fsync failure -------------------------------------------------------------------------


@pytest.fixture
def two_logs(tmp_path, clock, batch):
    """A LogManager with two partitions holding two batches each, none flushed."""
    manager = LogManager(tmp_path / "data", clock)
    logs = manager.load({"topic": TopicLogSpec(TOPIC_ID, SMALL, 2)})
    for partition_log in logs.values():
        for _ in range(2):
            partition_log.append_as_leader(batch(R), 0)
    manager.checkpoint()
    yield manager, logs[("topic", 0)], logs[("topic", 1)]
    manager.close()


def fail_one_fsync(monkeypatch) -> None:
    real_fsync, failures = os.fsync, []

    def fsync(fd: int) -> None:
        if not failures:
            failures.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_failed_flush_takes_the_directory_offline_and_never_moves_the_recovery_point(two_logs, batch, monkeypatch):
    manager, failing, other = two_logs
    fail_one_fsync(monkeypatch)
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        failing.flush()
    assert manager.failure.failed and failing.offline and other.offline
    assert failing.recovery_point == 0
    for partition_log in (failing, other):
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.append_as_leader(batch(R), 0)
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.read(0, 1)
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.flush()  # fsync works again: it must not launder the failed one
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.append_as_follower(batch(R, base_offset=2 * R))
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.truncate_to(0)
        with pytest.raises(KafkaStorageError, match="offline"):
            partition_log.delete_old_segments(10**12)
    assert (failing.recovery_point, other.recovery_point) == (0, 0)
    manager.checkpoint()  # skipped: offsets of an offline directory cannot be trusted
    assert read_offsets(manager.log_dir / RECOVERY_POINT_CHECKPOINT) == {("topic", 0): 0, ("topic", 1): 0}


def test_after_a_failed_flush_the_next_start_recovers_from_the_old_recovery_point(clock, two_logs, monkeypatch):
    manager, failing, _ = two_logs
    fail_one_fsync(monkeypatch)
    with pytest.raises(KafkaStorageError):
        failing.flush()
    monkeypatch.undo()
    manager.close()  # no fsync, no checkpoint on an offline directory
    assert read_offsets(manager.log_dir / RECOVERY_POINT_CHECKPOINT) == {("topic", 0): 0, ("topic", 1): 0}
    restarted = LogManager(manager.log_dir, clock)
    logs = restarted.load({"topic": TopicLogSpec(TOPIC_ID, SMALL, 2)})
    try:
        assert not restarted.failure.failed
        assert [logs[("topic", p)].recovered_bytes > 0 for p in (0, 1)] == [True, True]
        assert [logs[("topic", p)].log_end_offset for p in (0, 1)] == [2 * R, 2 * R]
    finally:
        restarted.close()
