"""Defects found by an adversarial review of the storage layer, each pinned by the scenario that
exposed it: stale checkpoints of a deleted topic, a closed log asking for flushes forever, a
segment creation that fails half way, a retention pass that fails half way, and a failed append
that undid more than it did."""
from __future__ import annotations

import asyncio
import errno
import logging
import os

import pytest

from broker.cluster.partition import LeaderAndIsr
from broker.config import LogConfig
from common.errors import KafkaStorageError
from broker.log import LogManager, TopicLogSpec, leader_epoch
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperationPurgatory
from broker.replica_manager import ReplicaManager
from segment_format.layout import SegmentFiles
from broker.log.index_file import IndexFile
from segment_format.index_file import HEADER_SIZE, OFFSET_INDEX, TIME_INDEX

from tests.broker.log.appends import append
from tests.helpers.logs import crash
from tests.waiting import wait_until_async

R = 3  # records per test batch; three batches fill a 4 KiB segment
OLD_ID, NEW_ID = "a" * 32, "b" * 32


def config(**overrides) -> LogConfig:
    values = dict(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)
    values.update(overrides)
    return LogConfig(**values)


# --- checkpoints of a deleted topic ----------------------------------------------------------


def test_a_recreated_topic_does_not_inherit_the_checkpointed_offsets_of_the_deleted_one(tmp_path, clock, batch):
    """Topic t had log start 18 and recovery point 21 checkpointed. It is deleted, created again
    (a new id), gets two batches and a torn third, and the broker crashes before the periodic
    checkpoint. The restart must neither hide the new records below the old log start nor take
    the unflushed torn tail for durable data (the old recovery point)."""
    data = tmp_path / "data"
    manager = LogManager(data, clock)
    old = manager.create_logs("t", TopicLogSpec(OLD_ID, config(retention_ms=1_000), 1), [0])[0]
    for timestamp in [1_000] * 6 + [9_000]:
        append(old, batch(R, timestamp))
    manager.run_retention(6_500)
    old.flush()
    manager.checkpoint()
    assert (old.log_start_offset, old.recovery_point) == (18, 21)
    manager.delete_topic("t")
    new_spec = TopicLogSpec(NEW_ID, config(), 1)
    new = manager.create_logs("t", new_spec, [0])[0]
    for _ in range(2):
        append(new, batch(R))
    crash(manager)
    with open(data / "t-0" / f"{0:020d}.log", "ab") as f:
        f.write(bytes(batch(R))[:100])  # a torn write the crash left behind

    restarted = LogManager(data, clock)
    try:
        reopened = restarted.load({"t": new_spec})[("t", 0)]
        assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 2 * R)
        assert reopened.last_recovery_truncated_bytes == 100 and reopened.damaged_segments == 0
        assert reopened.read(0, 1).first_offset == 0
        assert restarted.run_retention(10**12) == 0
    finally:
        restarted.close()


def test_a_load_forgets_the_checkpointed_offsets_of_topics_deleted_before_a_crash(tmp_path, clock, batch, monkeypatch):
    """The crash hit between the deletion of t's directory and the checkpoint that forgets it: the
    next start no longer knows t, and a t created again then must start from nothing."""
    data = tmp_path / "data"
    manager = LogManager(data, clock)
    old = manager.create_logs("t", TopicLogSpec(OLD_ID, config(), 1), [0])[0]
    for _ in range(7):
        append(old, batch(R))
    old.flush()
    manager.checkpoint()
    monkeypatch.setattr(manager, "checkpoint", lambda: None)  # the crash comes first
    manager.delete_topic("t")
    crash(manager)

    restarted = LogManager(data, clock)
    assert restarted.load({}) == {}
    new_spec = TopicLogSpec(NEW_ID, config(), 1)
    new = restarted.create_logs("t", new_spec, [0])[0]
    append(new, batch(R))
    crash(restarted)
    with open(data / "t-0" / f"{0:020d}.log", "ab") as f:
        f.write(bytes(batch(R))[:100])

    again = LogManager(data, clock)
    try:
        reopened = again.load({"t": new_spec})[("t", 0)]
        assert (reopened.log_start_offset, reopened.log_end_offset, reopened.damaged_segments) == (0, R, 0)
    finally:
        again.close()


# --- flushes of a log that is gone --------------------------------------------------------------


def test_a_log_deleted_with_a_flush_due_is_not_flushed_again_and_again(tmp_path, clock, batch):
    """flush.messages=1 and an append whose flush is still due when the topic is deleted (the
    flush in flight then finds the log closed): the replica manager's group commit asks again
    while the log needs a flush, so a closed log must stop needing one, or the flushes never end
    (a thread hop each, and a clean stop waits for them forever)."""
    async def scenario() -> None:
        manager = LogManager(tmp_path / "data", clock)
        writer = LogWriter(1 << 30, 1 << 30)
        replicas = ReplicaManager(0, manager, writer, DelayedOperationPurgatory())
        try:
            await replicas.create_partitions("t", TopicLogSpec(OLD_ID, config(flush_messages=1), 1), [0],
                                             {("t", 0): LeaderAndIsr(0, 0, (0,), (0,))})
            partition_log = manager.get("t", 0)
            partition_log.append_as_leader(batch(R), 0)
            assert partition_log.needs_flush(clock())
            await replicas.delete_topic("t")
            replicas._flush(partition_log)  # as the done callback of a flush in flight asks again
            await wait_until_async(lambda: not replicas.flushes_in_flight, 10, "no flush in flight")
            assert replicas.flushes_in_flight == 0
            assert not partition_log.needs_flush(clock())
        finally:
            await writer.close()
            manager.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


# --- a segment creation that fails half way --------------------------------------------------


def test_a_new_segment_creates_its_index_files_at_their_first_write(unified_log, batch):
    """A roll creates only the new `.log` (creating a 10,000-partition topic would otherwise pay
    for 20,000 index files up front); the indexes appear, header first, when the segment is
    flushed, and load back as an empty, valid pair."""
    partition_log = unified_log()
    for _ in range(4):
        append(partition_log, batch(R))
    active = partition_log.segments()[-1]
    assert active.base_offset == 3 * R
    assert not active.files.index.exists() and not active.files.time_index.exists()
    partition_log.flush()
    for kind, path in ((OFFSET_INDEX, active.files.index), (TIME_INDEX, active.files.time_index)):
        assert path.read_bytes()[:HEADER_SIZE] == kind.header(3 * R)
        IndexFile.load(kind, path, 3 * R).sanity_check(active.size)


def test_a_crash_before_the_first_flush_recovers_the_log_quietly(logs, batch, caplog):
    """Killed before anything was flushed, a new log has a `.log` and no index files: the restart
    rebuilds them without a warning (10,000 new partitions would log 10,000) and takes appends."""
    logs.open()
    logs.crash()
    with caplog.at_level(logging.WARNING, logger="broker.log"):
        partition_log = logs.open()
    assert [r.getMessage() for r in caplog.records] == []
    assert append(partition_log, batch(R)).first_offset == 0
    logs.close()
    assert len(IndexFile.load(OFFSET_INDEX, SegmentFiles(logs.directory / "topic-0", 0).index, 0)) == 0


def fail_nth_creation_of(monkeypatch, suffix: str, n: int) -> None:
    """The `n`th os.open that may create a file ending in `suffix` fails with EMFILE."""
    real_open, seen = os.open, []

    def open_file(path, flags, mode=0o777, *, dir_fd=None):
        if flags & os.O_CREAT and str(path).endswith(suffix):
            seen.append(path)
            if len(seen) == n:
                raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_file)


def test_a_roll_that_cannot_seal_the_old_segment_removes_the_new_one(unified_log, batch, monkeypatch):
    """The new segment was created, then sealing the old one failed (its index's write fd could
    not be opened): the append fails whole, the new segment's files go, the old segment stays
    active, and the next append rolls normally."""
    partition_log = unified_log()
    for _ in range(3):
        append(partition_log, batch(R))
    before = sorted(p.name for p in partition_log.directory.iterdir())
    fail_nth_creation_of(monkeypatch, ".index", 1)  # the old segment's, at its seal (the new one's waits)
    with pytest.raises(KafkaStorageError, match="Too many open files"):
        append(partition_log, batch(R))
    monkeypatch.undo()
    assert sorted(p.name for p in partition_log.directory.iterdir()) == before
    assert [(s.base_offset, s.sealed) for s in partition_log.segments()] == [(0, False)]
    info = append(partition_log, batch(R))
    assert info.first_offset == 3 * R
    assert [(s.base_offset, s.sealed) for s in partition_log.segments()] == [(0, True), (3 * R, False)]
    assert [partition_log.read(o, 1).first_offset for o in (0, R, 2 * R, 3 * R)] == [0, R, 2 * R, 3 * R]


# --- a retention pass that fails half way ------------------------------------------------------


def fail_rename_of_segment_9(monkeypatch) -> None:
    real_rename = os.rename

    def rename(src, dst) -> None:
        if os.path.basename(src) == f"{9:020d}.log":
            raise OSError(errno.EIO, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)


def fail_epoch_checkpoint(monkeypatch) -> None:
    def write_atomically(path, text, *, durable=True) -> None:
        raise KafkaStorageError(f"cannot write {path}: [Errno 28] No space left on device")

    monkeypatch.setattr(leader_epoch, "write_atomically", write_atomically)


@pytest.mark.parametrize("inject, removed", [(fail_rename_of_segment_9, 1), (fail_epoch_checkpoint, 2)],
                         ids=["second-rename-fails", "epoch-checkpoint-fails-after-the-renames"])
def test_segments_a_failing_retention_pass_did_remove_are_still_purged(tmp_path, clock, batch, monkeypatch, inject,
                                                                        removed):
    """Segments 0 (and 9) are renamed `.deleted` and leave the log, then the pass fails (the rename
    of segment 9, or the leader-epoch checkpoint after it): the segments that left must still be
    queued for deletion (closed and unlinked after the delay), not left open and on disk until the
    next restart."""
    manager = LogManager(tmp_path / "data", clock)
    try:
        partition_log = manager.load({"t": TopicLogSpec(OLD_ID, config(retention_ms=1_000), 1)})[("t", 0)]
        for timestamp in [1_000] * 6 + [9_000]:
            append(partition_log, batch(R, timestamp))
        inject(monkeypatch)
        assert manager.run_retention(6_500) == removed
        monkeypatch.undo()
        assert manager.retention_failures == 1
        assert partition_log.log_start_offset == removed * 9
        assert manager.purge_deleted(6_500, 0) == removed
        assert not [p.name for p in partition_log.directory.iterdir() if p.name.endswith(".deleted")]
    finally:
        manager.close()


# --- a failed append undoes only what it did ---------------------------------------------------


def fail_next_log_write(monkeypatch) -> None:
    real_pwrite, failed = os.pwrite, []

    def pwrite(fd: int, data, position: int) -> int:
        if not failed and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            failed.append(position)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_failed_append_keeps_the_epoch_its_leader_started_at_the_log_end(unified_log, batch, monkeypatch):
    """A new leader recorded that epoch 2 starts at the LEO (6); its first append then fails on a
    full disk. Undoing the append must not drop epoch 2's entry, which the append did not write
    (and which a follower asking where epoch 2 starts would miss), nor rewrite the checkpoint."""
    partition_log = unified_log()
    for _ in range(2):
        append(partition_log, batch(R), leader_epoch=0)
    partition_log.assign_epoch_start_offset(2)
    epoch_file = partition_log.directory / "leader-epoch-checkpoint"
    before = (partition_log.leader_epoch_entries, epoch_file.read_text(), epoch_file.stat().st_ino)
    assert before[0] == [(0, 0), (2, 2 * R)]
    fail_next_log_write(monkeypatch)
    with pytest.raises(KafkaStorageError, match="No space left"):
        partition_log.append_as_leader(batch(R), 2)
    monkeypatch.undo()
    assert (partition_log.leader_epoch_entries, epoch_file.read_text(), epoch_file.stat().st_ino) == before
    assert partition_log.log_end_offset == 2 * R and not partition_log.offline


def test_an_epoch_whose_checkpoint_write_failed_is_written_by_the_next_append(unified_log, batch, monkeypatch):
    """The first append under epoch 3 fails because the epoch checkpoint cannot be written. The
    entry must not stay in memory only: the next append under epoch 3 would take it as recorded,
    and the file (all a restart has below the recovery point) would never learn where epoch 3
    starts."""
    partition_log = unified_log()
    for _ in range(2):
        append(partition_log, batch(R), leader_epoch=0)
    fail_epoch_checkpoint(monkeypatch)
    with pytest.raises(KafkaStorageError, match="No space left"):
        partition_log.append_as_leader(batch(R), 3)
    monkeypatch.undo()
    assert partition_log.leader_epoch_entries == [(0, 0)] and partition_log.log_end_offset == 2 * R
    append(partition_log, batch(R), leader_epoch=3)
    assert partition_log.leader_epoch_entries == [(0, 0), (3, 2 * R)]
    assert (partition_log.directory / "leader-epoch-checkpoint").read_text() == f"0 0\n3 {2 * R}\n"


# --- fsyncs under the log lock ----------------------------------------------------------------


def test_retention_writes_the_epoch_checkpoint_without_holding_the_log_lock(open_log, batch, monkeypatch):
    """Retention moves the log start and rewrites the leader-epoch checkpoint (two fsyncs). An
    append on the event loop takes the same log lock: held across those fsyncs, a slow or hung
    disk would freeze the event loop, every connection with it (Kafka's truncateFromStartAsyncFlush).
    Every fsync that retention does must find the lock free."""
    partition_log = open_log(retention_ms=1_000)
    for timestamp in [1_000] * 6 + [9_000]:
        append(partition_log, batch(R, timestamp))
    real_fsync, lock_free = os.fsync, []

    def fsync(fd: int) -> None:
        free = partition_log._lock.acquire(blocking=False)
        if free:
            partition_log._lock.release()
        lock_free.append(free)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert [s.base_offset for s in partition_log.delete_old_segments(6_500)] == [0, 9]
    monkeypatch.undo()
    assert lock_free and all(lock_free)
    assert partition_log.leader_epoch_entries == [(0, 18)]
    assert (partition_log.directory / "leader-epoch-checkpoint").read_text() == "0 18\n"


# --- the file cache across a rename over a cached path -----------------------------------------


def test_a_rename_onto_a_cached_path_closes_the_descriptor_it_replaces(tmp_path):
    """A segment renamed `.deleted` onto a path the cache still holds (the same base offset of a
    topic deleted and created again, whose old segment waits for its purge): the file there is
    replaced, so its cached descriptor must be closed, not dropped from the cache and leaked."""
    from broker.log import FileCache

    cache = FileCache()
    live, deleted = tmp_path / "0.log", tmp_path / "0.log.deleted"
    live.write_bytes(b"new"), deleted.write_bytes(b"old")
    with cache.pinned(deleted) as stale_fd:
        pass
    with cache.pinned(live):
        pass
    os.rename(live, deleted)
    cache.rename(live, deleted)
    try:
        with pytest.raises(OSError) as raised:
            os.fstat(stale_fd)
        assert raised.value.errno == errno.EBADF
        assert len(cache) == 1
        with cache.pinned(deleted) as fd:
            assert os.pread(fd, 3, 0) == b"new"
    finally:
        cache.close()
