"""Admin against a real broker process: topic lifecycle, configs and their sources, partition growth,
validate_only, list_offsets, persistence of topic metadata across restarts, api_versions."""
from __future__ import annotations

import re
import time

import pytest

from client import EARLIEST, LATEST, Admin, Consumer, Producer
from broker.config import TOPIC_CONFIGS
from common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    MessageTooLargeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from protocol import ApiKey

# Broker-level topic defaults set on the command line, so "broker_default" values are known.
BROKER_RETENTION_BYTES = 987_654_321
BROKER_SEGMENT_BYTES = 1 << 20
BROKER_OVERRIDES = {"log.retention.bytes": BROKER_RETENTION_BYTES}  # read by the shared_broker fixture


@pytest.fixture
def admin(shared_broker):
    """An Admin on the shared broker, closed at teardown."""
    with Admin(shared_broker.bootstrap) as client:
        yield client


def restart(broker, how: str) -> None:
    """Clean stop (exit code 0) or SIGKILL, then start again on the same port."""
    if how == "stop":
        assert broker.stop() == 0
    else:
        broker.kill()
    broker.start()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    with Admin(bootstrap) as admin:
        return {tp: offset for tp, (offset, _) in admin.list_offsets({(topic, p): LATEST for p in range(partitions)}).items()}


# -- topic lifecycle ---------------------------------------------------------------------------


def test_create_list_describe_delete_topics(shared_broker, admin, topic_name):
    """Created topics are listed and described (partitions led by broker 0, a topic id); deleted ones are gone."""
    first, second = topic_name + "-a", topic_name + "-b"
    admin.create_topic(first, partitions=3)
    admin.create_topics([{"name": second, "num_partitions": 1, "replication_factor": 1, "configs": {}}])
    assert {first, second} <= set(admin.list_topics())
    by_name = {d.name: d for d in admin.describe_topics([first, second])}
    assert [p.partition for p in by_name[first].partitions] == [0, 1, 2]
    assert all((p.leader, p.replicas, p.isr) == (0, (0,), (0,)) for p in by_name[first].partitions)
    assert len(by_name[second].partitions) == 1
    ids = {d.topic_id for d in by_name.values()}
    assert len(ids) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)

    admin.delete_topics([first])
    with Admin(shared_broker.bootstrap) as fresh:
        listed = fresh.list_topics()
    assert first not in listed and second in listed
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topics([first])
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics([first])


def test_list_topics_forgets_a_topic_deleted_through_the_same_admin(admin, topic_name):
    """list_topics after delete_topics on one Admin no longer lists the deleted topic."""
    admin.create_topic(topic_name, partitions=1)
    assert topic_name in admin.list_topics()
    admin.delete_topics([topic_name])
    assert topic_name not in admin.list_topics()


@pytest.mark.parametrize(
    "name, partitions, replication, configs, error",
    [
        ("bad name!", 1, -1, {}, InvalidTopicError),
        ("x" * 250, 1, -1, {}, InvalidTopicError),
        ("..", 1, -1, {}, InvalidTopicError),
        ("ok-name", 0, -1, {}, InvalidPartitionsError),
        ("ok-name", 10_001, -1, {}, InvalidPartitionsError),
        ("ok-name", 1, 3, {}, InvalidReplicationFactorError),
        ("ok-name", 1, -1, {"no.such.config": "1"}, InvalidConfigError),
        ("ok-name", 1, -1, {"retention.ms": "soon"}, InvalidConfigError),
        ("ok-name", 1, -1, {"segment.bytes": "100"}, InvalidConfigError),
    ],
    ids=["illegal-char", "too-long", "dot-dot", "zero-partitions", "too-many-partitions", "replication-3",
         "unknown-config", "non-int-config", "config-below-min"],
)
@pytest.mark.parametrize("validate_only", [False, True], ids=["create", "validate-only"])
def test_create_topic_rejects_bad_requests(shared_broker, admin, topic_name, name, partitions, replication, configs,
                                           error, validate_only):
    """Each bad name, count, replication factor or config raises its named error and creates nothing."""
    name = topic_name if name == "ok-name" else name
    with pytest.raises(error):
        admin.create_topic(name, partitions=partitions, replication_factor=replication, configs=configs,
                           validate_only=validate_only)
    with Admin(shared_broker.bootstrap) as fresh:
        assert name not in fresh.list_topics()


def test_create_existing_topic_raises_and_leaves_it_alone(admin, topic_name):
    """Creating a topic twice raises TopicAlreadyExistsError; the original keeps its id and partitions."""
    admin.create_topic(topic_name, partitions=2)
    [before] = admin.describe_topics([topic_name])
    for validate_only in (False, True):
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topic(topic_name, partitions=5, validate_only=validate_only)
    [after] = admin.describe_topics([topic_name])
    assert (after.topic_id, len(after.partitions)) == (before.topic_id, 2)


def test_deleting_a_topic_removes_its_directories_and_a_new_one_starts_empty(shared_broker, admin, topic_name):
    """Delete removes every {topic}-{p} directory; re-creating the name gives a new, empty topic."""
    admin.create_topic(topic_name, partitions=2)
    [old] = admin.describe_topics([topic_name])
    with Producer(shared_broker.bootstrap) as producer:
        for p in range(2):
            producer.send(topic_name, b"old", partition=p).result(10)
    assert all((shared_broker.log_dir / f"{topic_name}-{p}").is_dir() for p in range(2))
    admin.delete_topics([topic_name])
    assert not any((shared_broker.log_dir / f"{topic_name}-{p}").exists() for p in range(2))

    admin.create_topic(topic_name, partitions=2)
    [new] = admin.describe_topics([topic_name])
    assert new.topic_id != old.topic_id
    assert end_offsets(shared_broker.bootstrap, topic_name, 2) == {(topic_name, 0): 0, (topic_name, 1): 0}
    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic_name, 0), (topic_name, 1)])
        assert consumer.poll(timeout_ms=300) == []


# -- configs -----------------------------------------------------------------------------------


def test_describe_shows_topic_overrides_and_broker_defaults(admin, topic_name):
    """Every topic config is described: overrides with source 'topic', the rest 'broker_default' carrying the
    broker's configured default (log.retention.bytes was set on the broker's command line)."""
    admin.create_topic(topic_name, partitions=1, configs={"retention.ms": 1000, "message.timestamp.type": "LogAppendTime"})
    [description] = admin.describe_topics([topic_name])
    configs = description.configs
    assert set(configs) == set(TOPIC_CONFIGS)
    assert configs["retention.ms"] == {"value": 1000, "source": "topic"}
    assert configs["message.timestamp.type"] == {"value": "LogAppendTime", "source": "topic"}
    assert configs["retention.bytes"] == {"value": BROKER_RETENTION_BYTES, "source": "broker_default"}
    overridden = {"retention.ms", "message.timestamp.type", "key.partitioner"}  # the last stored with every topic
    assert configs["key.partitioner"] == {"value": "murmur2", "source": "topic"}
    assert {name for name, c in configs.items() if c["source"] == "broker_default"} == set(TOPIC_CONFIGS) - overridden
    assert admin.describe_configs([topic_name]) == {topic_name: configs}


def test_describe_configs_of_unknown_topic_raises(admin):
    """describe_configs names the missing topic's error."""
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_configs(["no-such-topic"])


@pytest.mark.parametrize("how", ["stop", "kill"], ids=["clean-stop", "sigkill"])
def test_altered_configs_apply_and_survive_a_restart(broker_factory, how):
    """alter_configs sets one key and resets another; after a clean stop or SIGKILL the broker still
    describes and enforces the change (a batch over the new max.message.bytes is refused)."""
    broker = broker_factory(**{"log.segment.bytes": BROKER_SEGMENT_BYTES}).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("conf", partitions=1, configs={"retention.ms": 1000, "segment.bytes": 8192})
        admin.alter_configs("conf", {"retention.ms": 5000, "max.message.bytes": 2048}, delete=["segment.bytes"])
        altered = admin.describe_configs(["conf"])["conf"]
    assert altered["retention.ms"] == {"value": 5000, "source": "topic"}
    assert altered["max.message.bytes"] == {"value": 2048, "source": "topic"}
    assert altered["segment.bytes"] == {"value": BROKER_SEGMENT_BYTES, "source": "broker_default"}
    restart(broker, how)
    with Admin(broker.bootstrap) as admin:
        assert admin.describe_configs(["conf"])["conf"] == altered
    with Producer(broker.bootstrap) as producer:
        with pytest.raises(MessageTooLargeError):
            producer.send("conf", b"x" * 4096).result(10)
        assert producer.send("conf", b"small").result(10).offset == 0


def test_alter_configs_rejects_bad_changes(admin, topic_name):
    """Unknown keys (to set or reset), bad values and unknown topics raise; the configs stay as they were."""
    admin.create_topic(topic_name, partitions=1, configs={"retention.ms": 1000})
    before = admin.describe_configs([topic_name])
    with pytest.raises(InvalidConfigError):
        admin.alter_configs(topic_name, {"no.such.config": 1})
    with pytest.raises(InvalidConfigError):
        admin.alter_configs(topic_name, delete=["no.such.config"])
    with pytest.raises(InvalidConfigError):
        admin.alter_configs(topic_name, {"retention.ms": "later", "segment.bytes": 8192})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.alter_configs("no-such-topic", {"retention.ms": 1})
    assert admin.describe_configs([topic_name]) == before


# -- partitions --------------------------------------------------------------------------------


def test_create_partitions_grows_the_topic_and_new_partitions_take_writes(shared_broker, admin, topic_name):
    """2 -> 4 partitions: described as 4, partitions 2 and 3 accept records and serve them back."""
    admin.create_topic(topic_name, partitions=2)
    admin.create_partitions(topic_name, 4)
    [description] = admin.describe_topics([topic_name])
    assert [p.partition for p in description.partitions] == [0, 1, 2, 3]
    assert (shared_broker.log_dir / f"{topic_name}-3").is_dir()
    with Producer(shared_broker.bootstrap) as producer:
        futures = [producer.send(topic_name, b"p%d" % p, partition=p) for p in (2, 3)]
        producer.flush()
    assert [(f.result().partition, f.result().offset) for f in futures] == [(2, 0), (3, 0)]
    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic_name, 2), (topic_name, 3)])
        records = []
        deadline = time.monotonic() + 10
        while len(records) < 2 and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
    assert sorted((r.partition, r.value) for r in records) == [(2, b"p2"), (3, b"p3")]


@pytest.mark.parametrize("count", [1, 2], ids=["shrink", "same"])
def test_create_partitions_cannot_shrink_or_keep_the_count(admin, topic_name, count):
    """Asking for fewer or as many partitions as the topic has raises InvalidPartitionsError."""
    admin.create_topic(topic_name, partitions=2)
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions(topic_name, count)
    assert len(admin.describe_topics([topic_name])[0].partitions) == 2


def test_validate_only_changes_nothing(shared_broker, admin, topic_name):
    """validate_only create, alter_configs and create_partitions succeed and leave the cluster unchanged."""
    admin.create_topic(topic_name + "-new", partitions=3, configs={"retention.ms": 1}, validate_only=True)
    with Admin(shared_broker.bootstrap) as fresh:
        assert topic_name + "-new" not in fresh.list_topics()
    assert not (shared_broker.log_dir / f"{topic_name}-new-0").exists()

    admin.create_topic(topic_name, partitions=2, configs={"retention.ms": 1000})
    [before] = admin.describe_topics([topic_name])
    admin.alter_configs(topic_name, {"retention.ms": 5000, "segment.bytes": 8192}, delete=["retention.ms"], validate_only=True)
    admin.create_partitions(topic_name, 6, validate_only=True)
    [after] = admin.describe_topics([topic_name])
    assert after == before
    assert not (shared_broker.log_dir / f"{topic_name}-2").exists()


# -- offsets and persistence -------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, expected",
    [(EARLIEST, (0, -1)), (LATEST, (3, -1)), (1500, (1, 2000)), (0, (0, 1000)), (9999, (-1, -1))],
    ids=["earliest", "latest", "timestamp-between", "timestamp-before-all", "timestamp-after-all"],
)
def test_list_offsets_earliest_latest_and_by_timestamp(shared_broker, admin, topic_name, query, expected):
    """Records stamped 1000/2000/3000: EARLIEST, LATEST and time queries give Kafka's (offset, timestamp)."""
    admin.create_topic(topic_name, partitions=1)
    with Producer(shared_broker.bootstrap) as producer:
        for i, ts in enumerate((1000, 2000, 3000)):
            producer.send(topic_name, b"v%d" % i, timestamp_ms=ts)
        producer.flush()
    assert admin.list_offsets({(topic_name, 0): query}) == {(topic_name, 0): expected}


def test_list_offsets_of_unknown_partition_raises(admin, topic_name):
    """list_offsets for a partition the topic does not have raises UnknownTopicOrPartitionError."""
    admin.create_topic(topic_name, partitions=1)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.list_offsets({(topic_name, 1): LATEST})


@pytest.mark.parametrize("how", ["stop", "kill"], ids=["clean-stop", "sigkill"])
def test_topic_metadata_survives_a_restart(broker_factory, how):
    """Partitions (including added ones), configs, topic ids and stored offsets are the same after a restart."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("kept", partitions=2, configs={"retention.bytes": 1 << 20})
        admin.create_partitions("kept", 3)
        admin.create_topic("plain", partitions=1)
        admin.create_topic("dropped", partitions=1)
        admin.delete_topics(["dropped"])
        before = {d.name: d for d in admin.describe_topics(["kept", "plain"])}
    with Producer(broker.bootstrap) as producer:
        for p in range(3):
            producer.send("kept", b"v", partition=p).result(10)
    restart(broker, how)
    with Admin(broker.bootstrap) as admin:
        assert sorted(admin.list_topics()) == ["kept", "plain"]
        after = {d.name: d for d in admin.describe_topics(["kept", "plain"])}
    assert after == before
    assert after["kept"].configs["retention.bytes"] == {"value": 1 << 20, "source": "topic"}
    assert end_offsets(broker.bootstrap, "kept", 3) == {("kept", p): 1 for p in range(3)}


def test_api_versions_lists_every_api_key(admin):
    """ApiVersions answers one entry per ApiKey with its name and a valid version range."""
    keys = admin.api_versions()
    assert sorted(k["api_key"] for k in keys) == sorted(int(k) for k in ApiKey)
    for entry in keys:
        assert entry["name"] == ApiKey(entry["api_key"]).name
        assert 0 <= entry["min_version"] <= entry["max_version"]
