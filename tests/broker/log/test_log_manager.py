"""LogManager: partition directories, load with orphans, create/get/delete, retention, flush, close."""
from __future__ import annotations

import logging

import pytest

from broker.config import LogConfig
from broker.log import LogManager, TopicLogSpec, UnifiedLog
from broker.log.log_manager import parse_partition_dir
from tests.broker.log.appends import append

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
    assert sorted(p.name for p in manager.log_dir.iterdir()) == ["doomed-2-0"]


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
