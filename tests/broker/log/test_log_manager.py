"""LogManager: partition directories, load with orphans, all-or-nothing creation, topic ids and
`-delete` directories, retention, flush, the directory's offset checkpoints, close."""
from __future__ import annotations

import logging

import pytest

from segment_format import record
from broker.config import LogConfig
from common.errors import KafkaStorageError, OffsetOutOfRangeError
from broker.log import LogManager, Segment, TopicLogSpec, UnifiedLog
from broker.log.checkpoint import PARTITION_METADATA_FILE, read_offsets, read_partition_metadata, write_offsets
from broker.log import log_manager
from broker.log.log_manager import (
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    NAME_MAX,
    RECOVERY_POINT_CHECKPOINT,
    delete_dir_name,
    parse_partition_dir,
)
from broker.cluster.topics import MAX_PARTITIONS
from segment_format.layout import TOPIC_NAME_MAX
from broker.log.unified_log import LEADER_EPOCH_FILE
from tests.broker.log.appends import append
from tests.helpers.logs import TOPIC_ID, crash

SMALL = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)


def create(manager: LogManager, topic: str, partition: int, config: LogConfig) -> UnifiedLog:
    """Get or create one partition's log (all-or-nothing `create_logs` of a single partition)."""
    return manager.create_logs(topic, TopicLogSpec(None, config, partition + 1), [partition])[0]


@pytest.fixture
def manager(tmp_path, clock):
    manager = LogManager(tmp_path / "data", clock)
    yield manager
    manager.close()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("orders-0", ("orders", 0)),
        ("my-topic-12", ("my-topic", 12)),
        ("a.b-c_d-3", ("a.b-c_d", 3)),
        ("orders", None),
        ("orders-x", None),
        ("orders-", None),
        ("-1", None),
        ("bad topic-1", None),
        ("orders-1-", None),
    ],
    ids=["plain", "dash-in-topic", "dots-dashes-underscores", "no-partition", "non-numeric", "empty-partition",
         "empty-topic", "illegal-topic", "trailing-dash"],
)
def test_parse_partition_dir_splits_on_the_last_dash(tmp_path, name, expected):
    (tmp_path / name).mkdir()
    assert parse_partition_dir(tmp_path / name) == expected


def test_parse_partition_dir_ignores_files(tmp_path):
    (tmp_path / "orders-0").write_text("not a directory")
    assert parse_partition_dir(tmp_path / "orders-0") is None


def test_create_get_and_partitions(manager, batch):
    logs = [create(manager, "my-topic", p, SMALL) for p in (1, 0, 2)]
    create(manager, "other", 0, SMALL)
    assert create(manager, "my-topic", 1, SMALL) is logs[0]  # get-or-create
    assert manager.get("my-topic", 2) is logs[2]
    assert manager.get("my-topic", 3) is None
    assert [p.partition for p in manager.partitions("my-topic")] == [0, 1, 2]
    assert (manager.log_dir / "my-topic-2").is_dir()


def test_load_opens_known_topics_and_leaves_orphans_and_files_alone(tmp_path, clock, batch, caplog):
    data = tmp_path / "data"
    first = LogManager(data, clock)
    append(create(first, "my.topic-x", 0, SMALL), batch(3), leader_epoch=0)
    create(first, "my.topic-x", 1, SMALL)
    append(create(first, "gone", 0, SMALL), batch(3), leader_epoch=0)
    first.close()
    (data / "meta.properties").write_text("broker.id=0\n")
    (data / "not-a-partition").mkdir()

    second = LogManager(data, clock)
    with caplog.at_level(logging.WARNING):
        loaded = second.load({"my.topic-x": TopicLogSpec(None, SMALL, 2)})
    assert sorted(loaded) == [("my.topic-x", 0), ("my.topic-x", 1)]
    assert loaded[("my.topic-x", 0)].log_end_offset == 3
    assert "orphan" in caplog.text and "gone-0" in caplog.text
    assert (data / "gone-0").is_dir() and (data / "meta.properties").exists()
    second.close()


def test_delete_topic_removes_its_directories_only(manager, batch):
    append(create(manager, "doomed", 0, SMALL), batch(3), leader_epoch=0)
    create(manager, "doomed", 1, SMALL)
    create(manager, "doomed-2", 0, SMALL)  # another topic whose name extends the first one
    manager.delete_topic("doomed")
    assert manager.get("doomed", 0) is None and manager.partitions("doomed") == []
    assert sorted(p.name for p in manager.log_dir.iterdir() if p.is_dir()) == ["doomed-2-0"]


def test_update_config_reaches_every_partition(manager):
    for p in range(2):
        create(manager, "t", p, SMALL)
    new = LogConfig(segment_bytes=8192, max_message_bytes=4096, retention_ms=5)
    manager.update_config("t", new)
    assert [p.config for p in manager.partitions("t")] == [new, new]


def test_retention_queues_segments_and_purge_unlinks_them_after_the_delay(manager, batch):
    partition_log = create(manager, "t", 0, LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000))
    for timestamp in [1_000] * 6 + [9_000]:
        append(partition_log, batch(3, timestamp), leader_epoch=0)
    assert manager.run_retention(now_ms=6_500) == 2
    deleted = sorted(p.name for p in partition_log.directory.glob("*.deleted"))
    assert len(deleted) == 6  # .log, .index, .timeindex of two segments
    assert manager.purge_deleted(now_ms=7_000, delay_ms=60_000) == 0
    assert manager.purge_deleted(now_ms=66_500, delay_ms=60_000) == 2
    assert list(partition_log.directory.glob("*.deleted")) == []
    assert partition_log.log_start_offset == 18


def test_logs_needing_flush(manager, batch):
    eager = create(manager, "eager", 0, LogConfig(segment_bytes=4096, max_message_bytes=4096, flush_messages=1))
    lazy = create(manager, "lazy", 0, SMALL)
    for partition_log in (eager, lazy):
        append(partition_log, batch(3), leader_epoch=0)
    assert manager.logs_needing_flush(0) == [eager]
    eager.flush()
    assert manager.logs_needing_flush(0) == []


def test_close_is_a_clean_shutdown(tmp_path, clock, batch):
    """After close, a reload needs no recovery and every segment queued for deletion is gone."""
    data = tmp_path / "data"
    manager = LogManager(data, clock)
    partition_log = create(manager, "t", 0, LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000))
    for timestamp in [1_000] * 3 + [9_000] * 2:
        append(partition_log, batch(3, timestamp), leader_epoch=0)
    manager.run_retention(now_ms=6_500)
    manager.close()
    assert list((data / "t-0").glob("*.deleted")) == []
    reloaded = LogManager(data, clock)
    (reopened,) = reloaded.load({"t": TopicLogSpec(None, SMALL, 1)}).values()
    assert (reopened.log_start_offset, reopened.log_end_offset, reopened.recovery_point) == (9, 15, 15)
    assert reopened.last_recovery_truncated_bytes == 0
    reloaded.close()


# --- creation is all or nothing ----------------------------------------------------------


def fail_third_segment_creation(monkeypatch) -> None:
    real_create, created = Segment.create, []

    def create(directory, base_offset, cache):
        created.append(directory.name)
        if len(created) == 3:
            raise KafkaStorageError(f"cannot create {directory}: [Errno 24] Too many open files")
        return real_create(directory, base_offset, cache)

    monkeypatch.setattr(Segment, "create", create)


def test_create_logs_is_all_or_nothing(tmp_path, clock, monkeypatch):
    """The third partition's log cannot be created: the first two are removed again, nothing is
    left on disk or in the manager, the directory stays online and a new manager loads cleanly."""
    data = tmp_path / "data"
    manager = LogManager(data, clock)
    spec = TopicLogSpec(TOPIC_ID, SMALL, 4)
    fail_third_segment_creation(monkeypatch)
    with pytest.raises(KafkaStorageError, match="Too many open files"):
        manager.create_logs("t", spec, [0, 1, 2, 3])
    monkeypatch.undo()
    assert manager.partitions("t") == [] and not manager.failure.failed
    assert sorted(p.name for p in data.iterdir()) == []
    assert [p.partition for p in manager.create_logs("t", spec, [0, 1, 2, 3])] == [0, 1, 2, 3]
    manager.close()
    reloaded = LogManager(data, clock)
    logs = reloaded.load({"t": spec})
    assert sorted(logs) == [("t", p) for p in range(4)]
    assert all(l.log_end_offset == 0 and l.recovered_bytes == 0 for l in logs.values())
    reloaded.close()


def test_create_logs_failing_keeps_logs_that_existed_before(manager, batch, monkeypatch):
    existing = create(manager, "t", 0, SMALL)
    append(existing, batch(3))
    fail_third_segment_creation(monkeypatch)
    with pytest.raises(KafkaStorageError):
        manager.create_logs("t", TopicLogSpec(None, SMALL, 4), [0, 1, 2, 3])
    monkeypatch.undo()
    assert manager.partitions("t") == [existing] and existing.log_end_offset == 3
    assert sorted(p.name for p in manager.log_dir.iterdir()) == ["t-0"]


# --- topic ids and -delete directories ---------------------------------------------------


def test_a_directory_of_another_topic_incarnation_is_moved_aside_and_the_new_log_is_empty(tmp_path, clock, batch):
    data = tmp_path / "data"
    old = LogManager(data, clock)
    old_log = old.load({"t": TopicLogSpec("a" * 32, SMALL, 1)})[("t", 0)]
    append(old_log, batch(3))
    old.close()
    assert read_partition_metadata(data / "t-0") == "a" * 32

    new = LogManager(data, clock)
    new_log = new.load({"t": TopicLogSpec("b" * 32, SMALL, 1)})[("t", 0)]
    assert new_log.log_end_offset == 0 and new_log.topic_id == "b" * 32
    assert read_partition_metadata(data / "t-0") == "b" * 32
    aside = [p for p in data.iterdir() if p.name.endswith("-delete")]
    assert len(aside) == 1 and aside[0].name.startswith("t-0.")
    assert read_partition_metadata(aside[0]) == "a" * 32
    assert new.purge_deleted_directories() == 1
    assert not aside[0].exists()
    new.close()


def test_purge_deleted_directories_removes_only_delete_directories(manager, batch):
    append(create(manager, "t", 0, SMALL), batch(3))
    for name in ["t-0.0123abcd-delete", "gone-3.ffff-delete"]:
        (manager.log_dir / name).mkdir()
        (manager.log_dir / name / f"{0:020d}.log").write_bytes(b"x")
    (manager.log_dir / "notes-delete").write_text("a file, not a log directory")
    assert manager.purge_deleted_directories() == 2
    assert sorted(p.name for p in manager.log_dir.iterdir()) == ["notes-delete", "t-0"]
    assert manager.purge_deleted_directories() == 0


def test_delete_topic_leaves_no_delete_directory_behind(manager, batch):
    append(create(manager, "t", 0, SMALL), batch(3))
    manager.delete_topic("t")
    assert [p for p in manager.log_dir.iterdir() if p.is_dir()] == []


LONGEST = "t" * TOPIC_NAME_MAX
LAST_PARTITION = MAX_PARTITIONS - 1  # the most digits a partition number has


@pytest.mark.parametrize("topic", [LONGEST, "x" * 210 + "-" + "y" * 38, "t"], ids=["longest", "cut-in-a-dash", "short"])
def test_delete_dir_names_fit_a_file_name_and_are_never_partition_directories(tmp_path, topic):
    name = delete_dir_name(f"{topic}-{LAST_PARTITION}")
    assert len(name.encode()) <= NAME_MAX and name.endswith(f"-{LAST_PARTITION}.{name[-39:-7]}-delete")
    assert name.startswith(topic[:200]) and name != delete_dir_name(f"{topic}-{LAST_PARTITION}")
    (tmp_path / name).mkdir()  # the filesystem takes it
    assert parse_partition_dir(tmp_path / name) is None


def test_the_longest_topic_name_with_the_longest_partition_numbers_is_deleted_and_created_again(manager, batch):
    """249 characters and partition 9999: the partition directory fits NAME_MAX, and so does the
    name it is moved aside to; nothing is left behind and the name can be created again, empty."""
    spec = TopicLogSpec("a" * 32, SMALL, MAX_PARTITIONS)
    logs = manager.create_logs(LONGEST, spec, [0, 10, LAST_PARTITION])
    for partition_log in logs:
        append(partition_log, batch(3))
    manager.delete_topic(LONGEST)
    assert [p for p in manager.log_dir.iterdir() if p.is_dir()] == []
    again = manager.create_logs(LONGEST, TopicLogSpec("b" * 32, SMALL, MAX_PARTITIONS), [LAST_PARTITION])
    assert again[0].log_end_offset == 0


def test_a_half_deleted_directory_of_the_longest_topic_is_removed_on_the_next_start(tmp_path, clock, batch):
    """A crash after the rename, before the removal: the next start removes the `-delete`
    directory (its name cut to fit) and opens the live partitions of the same topic untouched."""
    data = tmp_path / "data"
    first = LogManager(data, clock)
    spec = TopicLogSpec("a" * 32, SMALL, MAX_PARTITIONS)
    doomed, kept = first.create_logs(LONGEST, spec, [LAST_PARTITION, 0])
    append(kept, batch(3))
    doomed.rename_directory(data / delete_dir_name(doomed.directory.name))  # the crash comes before the removal
    crash(first)
    second = LogManager(data, clock)
    logs = second.load({LONGEST: TopicLogSpec("a" * 32, SMALL, MAX_PARTITIONS, hosted=frozenset({0}))})
    assert list(logs) == [(LONGEST, 0)] and logs[(LONGEST, 0)].log_end_offset == 3
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == [f"{LONGEST}-0"]
    second.close()


def test_a_clean_stop_of_empty_logs_makes_no_index_files_and_they_reopen_without_recovery(tmp_path, clock, batch,
                                                                                          monkeypatch, caplog):
    """Closing a log whose only segment is empty writes no index files (a clean stop of 100,000
    new partitions created 200,000 of them); the next start takes the empty segment as it is,
    with no rebuild and no warning, and its index files come with its first records."""
    data = tmp_path / "data"
    first = LogManager(data, clock)
    first.load({"t": TopicLogSpec(TOPIC_ID, SMALL, 3, leader_epoch=0)})
    first.close()
    assert not [p for p in data.rglob("*") if p.suffix in (".index", ".timeindex")]

    def no_recovery(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("an empty segment without index files was recovered")

    monkeypatch.setattr(Segment, "recover", no_recovery)
    second = LogManager(data, clock)
    with caplog.at_level(logging.WARNING):
        logs = second.load({"t": TopicLogSpec(TOPIC_ID, SMALL, 3)})
    assert not caplog.records and [logs[("t", p)].log_end_offset for p in range(3)] == [0, 0, 0]
    append(logs[("t", 1)], batch(3))
    second.close()
    assert sorted(p.name for p in data.rglob("*.index")) == [f"{0:020d}.index"]


# --- checkpoints -------------------------------------------------------------------------


def test_checkpoints_round_trip_recovery_point_log_start_and_high_watermark(tmp_path, clock, batch):
    """Each offset a log directory checkpoints comes back on the next start (after a crash: only
    what follows the recovery point is recovered)."""
    data = tmp_path / "data"
    spec = TopicLogSpec(TOPIC_ID, LogConfig(segment_bytes=4096, max_message_bytes=4096, retention_ms=1_000), 1)
    manager = LogManager(data, clock)
    partition_log = manager.load({"t": spec})[("t", 0)]
    for timestamp in [1_000] * 3 + [9_000] * 4:
        append(partition_log, batch(3, timestamp))
    assert manager.run_retention(6_500) == 1
    partition_log.flush(up_to=18)
    partition_log.update_high_watermark(15)
    manager.checkpoint()
    assert [read_offsets(data / name) for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT,
                                                  HIGH_WATERMARK_CHECKPOINT)] == [{("t", 0): 18}, {("t", 0): 9},
                                                                                  {("t", 0): 15}]
    crash(manager)  # no close, no further checkpoint

    restarted = LogManager(data, clock)
    reopened = restarted.load({"t": spec})[("t", 0)]
    assert (reopened.log_start_offset, reopened.high_watermark, reopened.log_end_offset) == (9, 15, 21)
    assert reopened.recovered_bytes == sum(s.size for s in reopened.segments() if s.base_offset >= 18)
    restarted.close()
    assert read_offsets(data / RECOVERY_POINT_CHECKPOINT) == {("t", 0): 21}


def test_a_checkpointed_log_start_inside_a_segment_is_kept(tmp_path, clock, batch):
    """The log start may lie past the first local offset (records deleted below it)."""
    data = tmp_path / "data"
    manager = LogManager(data, clock)
    append(manager.load({"t": TopicLogSpec(TOPIC_ID, SMALL, 1)})[("t", 0)], batch(3) + batch(3))
    manager.close()
    write_offsets(data / LOG_START_OFFSET_CHECKPOINT, {("t", 0): 4})
    restarted = LogManager(data, clock)
    reopened = restarted.load({"t": TopicLogSpec(TOPIC_ID, SMALL, 1)})[("t", 0)]
    assert (reopened.log_start_offset, reopened.local_log_start_offset) == (4, 0)
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(3, 1)
    assert reopened.read(4, 1).first_offset == 3  # the batch holding offset 4
    restarted.close()


MALFORMED = {
    "garbage": b"not a checkpoint\n",
    "binary": b"\xff\xfe\x00\x01" * 8,
    "empty": b"",
    "wrong-count": b"0\n3\nt 0 5\n",
    "wrong-version": b"7\n1\nt 0 5\n",
}


@pytest.mark.parametrize("name", [RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, HIGH_WATERMARK_CHECKPOINT,
                                  f"t-0/{PARTITION_METADATA_FILE}", f"t-0/{LEADER_EPOCH_FILE}"],
                         ids=["recovery-point", "log-start", "high-watermark", "partition-metadata", "leader-epochs"])
@pytest.mark.parametrize("content", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_checkpoint_files_do_not_prevent_opening(tmp_path, clock, batch, name, content):
    """Nothing acknowledged is lost and the log takes appends: a malformed offsets checkpoint
    reads as empty (a recovery point of 0 re-validates everything), a malformed partition.metadata
    is rewritten for the topic opening it, a malformed epoch checkpoint starts with no epochs."""
    data = tmp_path / "data"
    spec = TopicLogSpec(TOPIC_ID, SMALL, 1)
    manager = LogManager(data, clock)
    partition_log = manager.load({"t": spec})[("t", 0)]
    for epoch in (1, 1, 2, 2):
        append(partition_log, batch(3), leader_epoch=epoch)
    manager.close()
    (data / name).write_bytes(content)
    restarted = LogManager(data, clock)
    reopened = restarted.load({"t": spec})[("t", 0)]
    try:
        assert reopened.log_end_offset == 12 and reopened.log_start_offset == 0
        assert [h.base_offset for s in reopened.segments() for _, h in record.iter_batches(s.log_path.read_bytes())] == [0, 3, 6, 9]
        if name == RECOVERY_POINT_CHECKPOINT:
            assert reopened.recovered_bytes == reopened.size_bytes()
        assert append(reopened, batch(3), leader_epoch=3).first_offset == 12
    finally:
        restarted.close()
    assert read_partition_metadata(data / "t-0") == TOPIC_ID


def test_the_manager_shares_one_bounded_file_cache_among_its_logs(tmp_path, clock, batch):
    manager = LogManager(tmp_path / "data", clock, max_open_files=2)
    try:
        logs = manager.load({"t": TopicLogSpec(None, SMALL, 5)})
        for partition_log in logs.values():
            append(partition_log, batch(3))
            partition_log.read(0, 1).close()
        assert manager.cache.opened >= 5
        assert len(manager.cache) <= 2
    finally:
        manager.close()


def test_a_malformed_epoch_checkpoint_gets_the_epochs_of_the_recovered_tail(tmp_path, clock, batch):
    """Torn at creation (written without an fsync), the checkpoint is rebuilt from the batches
    that recovery replays: those after the recovery point."""
    data = tmp_path / "data"
    spec = TopicLogSpec(TOPIC_ID, SMALL, 1)
    manager = LogManager(data, clock)
    partition_log = manager.load({"t": spec})[("t", 0)]
    for epoch in (1, 1, 2, 2):
        append(partition_log, batch(3), leader_epoch=epoch)
    crash(manager)  # a crash before any checkpoint: recovery point 0
    (data / "t-0" / LEADER_EPOCH_FILE).write_bytes(b"\xff\x00torn")
    restarted = LogManager(data, clock)
    reopened = restarted.load({"t": spec})[("t", 0)]
    try:
        assert reopened.leader_epoch_entries == [(1, 0), (2, 6)]
        assert (data / "t-0" / LEADER_EPOCH_FILE).read_text() == "1 0\n2 6\n"
    finally:
        restarted.close()


def test_create_logs_failing_leaves_directories_it_adopted_on_disk(tmp_path, clock, batch, monkeypatch):
    """All or nothing means the disk as it was: a directory that existed before the call (left
    alone by load as an orphan, then adopted by the creation) is closed, not deleted."""
    data = tmp_path / "data"
    first = LogManager(data, clock)
    append(first.create_logs("t", TopicLogSpec(TOPIC_ID, SMALL, 2), [1])[0], batch(3))
    first.close()
    manager = LogManager(data, clock)
    manager.load({})  # t-1 is an orphan now
    fail_third_segment_creation(monkeypatch)
    with pytest.raises(KafkaStorageError):
        manager.create_logs("t", TopicLogSpec(TOPIC_ID, SMALL, 4), [0, 1, 2, 3])
    monkeypatch.undo()
    assert manager.partitions("t") == []
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["t-1"]
    adopted = manager.create_logs("t", TopicLogSpec(TOPIC_ID, SMALL, 4), [1])[0]
    assert adopted.log_end_offset == 3
    manager.close()


def test_create_logs_racing_a_delete_of_the_topic_returns_without_a_key_error(manager, monkeypatch):
    """A delete_topic landing while the creation syncs (the fuzz test's create/delete storm) drops
    the new logs; the creation still answers, with logs that now refuse every operation."""
    real_sync = log_manager.sync_filesystem

    def sync_then_delete(directory):
        real_sync(directory)
        manager.delete_topic("t")

    monkeypatch.setattr(log_manager, "sync_filesystem", sync_then_delete)
    logs = manager.create_logs("t", TopicLogSpec(TOPIC_ID, SMALL, 2), [0, 1])
    assert [l.partition for l in logs] == [0, 1]
    assert manager.partitions("t") == [] and [p for p in manager.log_dir.iterdir() if p.is_dir()] == []
    with pytest.raises(KafkaStorageError, match="closed"):
        logs[0].read(0, 1)
