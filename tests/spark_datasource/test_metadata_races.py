"""Metadata races in the source: a topic deleted, re-created or changing leader between the
lookups of one call (latestOffset, planning, reading), against a real broker.

The readers' methods are driven directly (no Spark session), and the race is made to happen at
one exact point by hooking the Admin the source's OffsetReader uses: the hook deletes the topic
(and creates it again) around the lookup, or answers NOT_LEADER, so no test depends on timing.
What each race must give: failOnDataLoss=true a DataLossError naming the partition when its data
is gone, false the other partitions read and the lost ones skipped; never the race's own error.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from client import Admin, Producer
from common.errors import DataLossError, NotLeaderError, TopicAlreadyExistsError
from spark_datasource.batch_reader import PymqBatchReader
from spark_datasource.offsets import OffsetReader
from spark_datasource.options import SourceOptions
from spark_datasource.ranges import OffsetRange
from spark_datasource.stream_reader import LEGACY_TOPIC_ID, Offsets, PymqStreamReader
from spark_datasource.task import read_offset_range


@pytest.fixture
def bootstrap(source_broker) -> str:
    return source_broker.bootstrap


@pytest.fixture
def topics(bootstrap: str, topic_name: str) -> tuple[str, str]:
    """Two topics of one partition: `a` with 3 records, `b` (the one the races hit) with 2."""
    a, b = f"{topic_name}-a", f"{topic_name}-b"
    with Admin(bootstrap) as admin:
        admin.create_topic(a, partitions=1)
        admin.create_topic(b, partitions=1)
    produce(bootstrap, a, 3)
    produce(bootstrap, b, 2)
    return a, b


def produce(bootstrap: str, topic: str, n: int, prefix: str = "") -> None:
    """`n` records, each a batch of its own (so a fetch of one batch is one record)."""
    with Producer(bootstrap, linger_ms=0, acks="all") as producer:
        for i in range(n):
            producer.send(topic, f"{prefix}{topic}-{i}".encode(), partition=0)
            producer.flush()


def recreate(bootstrap: str, topic: str, records: int) -> str:
    """Delete `topic`, create it again with `records` records of its own; the new topic id."""
    with Admin(bootstrap) as admin:
        admin.delete_topics([topic])
        admin.create_topic(topic, partitions=1)
        produce(bootstrap, topic, records, prefix="new-")
        return admin.describe_topics([topic])[0].topic_id


@contextmanager
def hooked(offsets: OffsetReader, method: str, around: Callable[..., Any]) -> Iterator[None]:
    """While inside, each call `Admin.<method>(*args)` of the reader runs as `around(call, *args)`."""
    admin = offsets.admin
    real = getattr(admin, method)
    setattr(admin, method, lambda *args: around(lambda: real(*args), *args))
    try:
        yield
    finally:
        delattr(admin, method)  # the class's method again


def offsets_race(bootstrap: str, topic: str, kind: str) -> Callable[..., Any]:
    """A list_offsets hook that hits `topic` whenever a call asks about it: deleted before the
    request and created again after it ("deleted"), or its leader moved ("leader moved")."""
    def around(call: Callable[[], Any], positions: dict, *isolation: int) -> Any:
        if not any(t == topic for t, _ in positions):
            return call()
        if kind == "leader moved":
            raise NotLeaderError(f"broker 0 is not the leader of {topic}-0")
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic])
            try:
                return call()
            finally:
                admin.create_topic(topic, partitions=1)
    return around


def positions(offsets: Offsets) -> Offsets:
    """`offsets`, checked to be in Spark Kafka's form (every inner key a partition number, every
    value an int: what code written for Kafka's offsets parses)."""
    for parts in offsets.values():
        assert all(p.isdigit() and type(o) is int for p, o in parts.items()), offsets
    return offsets


def topic_id(bootstrap: str, topic: str) -> str:
    with Admin(bootstrap) as admin:
        return admin.describe_topics([topic])[0].topic_id


def stream_reader(bootstrap: str, fail_on_data_loss: bool, **options: str) -> PymqStreamReader:
    return PymqStreamReader(SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "startingOffsets": "earliest",
         "failOnDataLoss": str(fail_on_data_loss).lower(), **options}, streaming=True))


def rows(reader: PymqStreamReader | PymqBatchReader, partitions) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for partition in partitions:
        r = partition.range
        out[(r.topic, r.partition)] = out.get((r.topic, r.partition), 0) + sum(b.num_rows for b in reader.read(partition))
    return out


@pytest.mark.parametrize("kind", ["deleted", "leader moved"])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_latest_offset_holds_a_partition_whose_offsets_lookup_races(bootstrap, topics, kind, fail_on_data_loss):
    """latestOffset keeps a listed partition whose latest offset got UNKNOWN_TOPIC_OR_PARTITION or NOT_LEADER at its start (no new data this trigger) and moves the others; a re-created topic's lower offsets are then data loss per failOnDataLoss."""
    a, b = topics
    reader = stream_reader(bootstrap, fail_on_data_loss, subscribe=f"{a},{b}")
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        assert positions(first) == {a: {"0": 3}, b: {"0": 2}}
        assert rows(reader, reader.partitions(start, first)) == {(a, 0): 3, (b, 0): 2}
        produce(bootstrap, a, 1)
        produce(bootstrap, b, 1)
        with hooked(reader._offsets, "list_offsets", offsets_race(bootstrap, b, kind)):
            end = reader.latestOffset(first, ReadAllAvailable())
        assert positions(end) == {a: {"0": 4}, b: {"0": 2}}
        assert rows(reader, reader.partitions(first, end)) == {(a, 0): 1}

        later = reader.latestOffset(end, ReadAllAvailable())  # no race: b as the brokers have it now
        if kind == "leader moved":
            assert positions(later) == {a: {"0": 4}, b: {"0": 3}}
            assert rows(reader, reader.partitions(end, later)) == {(b, 0): 1}
            return
        assert positions(later) == {a: {"0": 4}}  # re-created: out for a trigger, as if deleted
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=f"{b}-0: the topic was deleted and re-created after offset 2"):
                reader.partitions(end, later)
            return
        assert rows(reader, reader.partitions(end, later)) == {}
        produce(bootstrap, b, 1)
        moved = reader.latestOffset(later, ReadAllAvailable())
        assert positions(moved) == {a: {"0": 4}, b: {"0": 1}}
        assert rows(reader, reader.partitions(later, moved)) == {(b, 0): 1}
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_topic_deleted_between_listing_and_describing_is_gone(bootstrap, topics, fail_on_data_loss):
    """A subscribePattern topic deleted between the topic listing and its description is left out of latestOffset (the others keep moving), and planning reports its offsets lost per failOnDataLoss."""
    a, b = topics
    reader = stream_reader(bootstrap, fail_on_data_loss, subscribePattern=f"{a[:-2]}-.*")
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        assert positions(first) == {a: {"0": 3}, b: {"0": 2}}
        reader.partitions(start, first)
        produce(bootstrap, a, 1)

        def listed_then_deleted(call: Callable[[], Any]) -> Any:
            """Every listing names b, deleted before it is described (created again, if need be,
            before the listing: a lookup asked twice meets the race twice)."""
            with Admin(bootstrap) as admin:
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topic(b, partitions=1)
                listed = call()
                admin.delete_topics([b])
            return listed

        with hooked(reader._offsets, "list_topics", listed_then_deleted):
            end = reader.latestOffset(first, ReadAllAvailable())
        assert positions(end) == {a: {"0": 4}}
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=f"{b}-0 no longer exists"):
                reader.partitions(first, end)
        else:
            assert rows(reader, reader.partitions(first, end)) == {(a, 0): 1}
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_batch_planning_with_a_topic_deleted_between_lookups(bootstrap, topics, fail_on_data_loss):
    """A batch read whose offset lookups hit a topic being deleted and re-created fails with DataLossError naming it (failOnDataLoss=true) or reads the other topics (false)."""
    a, b = topics
    reader = PymqBatchReader(SourceOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": f"{a},{b}",
         "failOnDataLoss": str(fail_on_data_loss).lower()}, streaming=False))
    offsets = OffsetReader(reader.options)
    with hooked(offsets, "list_offsets", offsets_race(bootstrap, b, "deleted")):
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=f"{b}-0: no offsets while the read was planned"):
                reader.offset_ranges(offsets)
        else:
            assert reader.offset_ranges(offsets) == [OffsetRange(a, 0, 0, 3)]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_reading_a_range_of_a_topic_deleted_since_planning(bootstrap, topics, fail_on_data_loss):
    """A task whose topic was deleted after its range was planned fails with DataLossError naming the range (failOnDataLoss=true) or reads nothing (false), instead of UNKNOWN_TOPIC_OR_PARTITION."""
    a, _ = topics
    options = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": a, "kafkaConsumer.pollTimeoutMs": "1000",
                                   "failOnDataLoss": str(fail_on_data_loss).lower()}, streaming=False)
    with Admin(bootstrap) as admin:
        admin.delete_topics([a])
    batches = read_offset_range(options, OffsetRange(a, 0, 0, 3))
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=f"{a}-0 no longer exists .* offsets 0..2 were read"):
            list(batches)
    else:
        assert list(batches) == []


def batch_options(bootstrap: str, topic: str, fail_on_data_loss: bool, **options: str) -> SourceOptions:
    return SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                "failOnDataLoss": str(fail_on_data_loss).lower(), **options}, streaming=False)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_task_never_reads_a_topic_recreated_while_it_reads(bootstrap, topics, fail_on_data_loss):
    """A topic deleted and re-created (with records at the same offsets) between two fetches of a
    task: the rest of the range is data loss naming the range and both topic ids (failOnDataLoss=true)
    or skipped (false), never the new topic's records, however fast the re-creation was."""
    a, _ = topics
    reader = PymqBatchReader(batch_options(bootstrap, a, fail_on_data_loss))
    [planned] = reader.plan()
    assert (planned.start, planned.end) == (0, 3) and planned.topic_id
    batches = read_offset_range(reader.options, planned)
    assert next(batches).column("value").to_pylist() == [f"{a}-0".encode()]  # one fetch: one batch
    new_id = recreate(bootstrap, a, 3)
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=f"{a}-0 was re-created: offsets 0..2 were planned on topic id "
                                                f"{planned.topic_id} .*is topic id {new_id}"):
            next(batches)
    else:
        assert list(batches) == []


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_stream_range_planned_before_its_topic_was_recreated_is_not_read(bootstrap, topics, fail_on_data_loss):
    """A micro-batch planned, then its topic deleted and re-created with more records, then read:
    the task does not read the new topic at the planned offsets (loss per failOnDataLoss)."""
    a, _ = topics
    reader = stream_reader(bootstrap, fail_on_data_loss, subscribe=a)
    try:
        start = reader.initialOffset()
        [planned] = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
        recreate(bootstrap, a, 4)
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=f"{a}-0 was re-created"):
                list(reader.read(planned))
        else:
            assert list(reader.read(planned)) == []
    finally:
        reader.stop()


@pytest.mark.parametrize("records", [2, 4], ids=["at", "above"])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_stream_notices_a_topic_recreated_at_or_above_its_position(bootstrap, topics, fail_on_data_loss, records):
    """A topic re-created between two triggers with as many or more records than the query had
    read (offsets at or above its position, which offsets alone cannot tell from no or new data)
    leaves the offsets for a trigger: data loss naming both ids (failOnDataLoss=true), or read
    from the new topic's start at the next trigger (false)."""
    a, b = topics
    reader = stream_reader(bootstrap, fail_on_data_loss, subscribe=f"{a},{b}")
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        assert rows(reader, reader.partitions(start, first)) == {(a, 0): 3, (b, 0): 2}
        old_id = topic_id(bootstrap, b)
        new_id = recreate(bootstrap, b, records)
        end = reader.latestOffset(first, ReadAllAvailable())
        assert positions(end) == {a: {"0": 3}}
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=f"{b}-0: the topic was deleted and re-created after offset 2 "
                                                    f"\\(topic id {old_id}, now {new_id}\\)"):
                reader.partitions(first, end)
            return
        assert rows(reader, reader.partitions(first, end)) == {}
        again = reader.latestOffset(end, ReadAllAvailable())
        assert positions(again) == {a: {"0": 3}, b: {"0": records}}
        [planned] = reader.partitions(end, again)
        assert (planned.range.start, planned.range.end, planned.range.topic_id) == (0, records, new_id)
        assert rows(reader, [planned]) == {(b, 0): records}
    finally:
        reader.stop()


@pytest.mark.parametrize("form", ["kafka", "legacy"])
def test_stream_resumes_from_offsets_it_did_not_hand_out(bootstrap, topics, form):
    """Offsets a restarted query gives back from its checkpoint, in Kafka's form or the legacy one
    with inline topic ids, plan and read as before; the next offsets are in Kafka's form and
    each planned range names the topic id its planning saw."""
    a, b = topics
    checkpointed = {a: {"0": 1}, b: {"0": 0}}
    if form == "legacy":
        checkpointed = {t: {**parts, LEGACY_TOPIC_ID: topic_id(bootstrap, t)} for t, parts in checkpointed.items()}
    reader = stream_reader(bootstrap, True, subscribe=f"{a},{b}")
    try:
        end = reader.latestOffset(checkpointed, ReadAllAvailable())
        assert positions(end) == {a: {"0": 3}, b: {"0": 2}}
        planned = reader.partitions(checkpointed, end)
        assert {p.range.topic: p.range.topic_id for p in planned} == {t: topic_id(bootstrap, t) for t in (a, b)}
        assert rows(reader, planned) == {(a, 0): 2, (b, 0): 2}
    finally:
        reader.stop()


def test_legacy_checkpoint_ids_tell_a_topic_recreated_while_the_query_was_stopped(bootstrap, topics):
    """Offsets checkpointed with inline topic ids keep telling a topic deleted and re-created while
    the query was stopped (with more records than its position) from new records."""
    _, b = topics
    checkpointed = {b: {"0": 2, LEGACY_TOPIC_ID: topic_id(bootstrap, b)}}
    new_id = recreate(bootstrap, b, 4)
    reader = stream_reader(bootstrap, True, subscribe=b)
    try:
        end = reader.latestOffset(checkpointed, ReadAllAvailable())
        assert positions(end) == {}
        with pytest.raises(DataLossError, match=f"{b}-0: the topic was deleted and re-created after offset 2 "
                                                f"\\(topic id {checkpointed[b][LEGACY_TOPIC_ID]}, now {new_id}\\)"):
            reader.partitions(checkpointed, end)
    finally:
        reader.stop()


def test_a_task_retries_a_missing_topic_for_the_poll_timeout_not_a_count(bootstrap, topics):
    """A task whose topic is gone retries (metadata refresh, backoff) until kafkaConsumer.pollTimeoutMs
    has passed, however short the backoff, then reports the loss."""
    a, _ = topics
    options = batch_options(bootstrap, a, True, **{"kafkaConsumer.pollTimeoutMs": "1500", "kafka.retry.backoff.ms": "10"})
    with Admin(bootstrap) as admin:
        admin.delete_topics([a])
    began = time.monotonic()
    with pytest.raises(DataLossError, match=f"{a}-0 no longer exists"):
        list(read_offset_range(options, OffsetRange(a, 0, 0, 3)))
    assert time.monotonic() - began >= 1.5
