"""Streaming reads with `spark.readStream.format("pymq")` against real brokers: admission control
(maxOffsetsPerTrigger, minOffsetsPerTrigger with maxTriggerDelay, reportLatestOffset), starting
offsets, Trigger.AvailableNow, restarts from a checkpoint, partitions and topics that appear
mid-query, and failOnDataLoss when retention deletes offsets a query has not read yet.

Every query writes to a sink (Parquet when it restarts from a checkpoint, memory otherwise) and
the sink's (topic, partition, offset) triples are checked against what was produced: each record
exactly once, no gaps.
"""
from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from client import EARLIEST, Admin, Producer
from spark_datasource.stream_reader import from_json, rate_limit, to_json
from tests.waiting import wait_until

_queries = itertools.count()


# -- helpers ----------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, counts: dict[int, int], value_bytes: int = 0, one_per_batch: bool = False) -> None:
    """`counts[p]` records into partition p (values `<topic>-<p>-<i>`, padded to `value_bytes`),
    acknowledged before it returns."""
    results = []
    with Producer(bootstrap, linger_ms=0, acks="all") as producer:
        for partition, n in counts.items():
            values = [f"{topic}-{partition}-{i}".encode().ljust(value_bytes, b".") for i in range(n)]
            chunks = [[v] for v in values] if one_per_batch else [values]
            for chunk in chunks:
                results += producer.send_batch(topic, pa.table({"value": chunk}), partition=partition)
                if one_per_batch:
                    producer.flush()
        producer.flush()
    assert all(r.completed and r.error is None for r in results)


def stream(spark, bootstrap: str, **options: object):
    reader = spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def to_memory(df, trigger: dict[str, object] | None = None):
    """Start `df` into a memory sink; returns (query, table name)."""
    name = f"pymq_stream_{next(_queries)}"
    writer = df.writeStream.format("memory").queryName(name)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start(), name


def to_parquet(df, out: Path, trigger: dict[str, object] | None = None):
    writer = (df.writeStream.format("parquet").option("path", str(out / "data"))
              .option("checkpointLocation", str(out / "checkpoint")))
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def offsets_by_partition(rows: Iterable) -> dict[tuple[str, int], list[int]]:
    """Sorted offsets the rows hold, per (topic, partition): duplicates and gaps stay visible."""
    out: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        out.setdefault((row["topic"], row["partition"]), []).append(row["offset"])
    return {tp: sorted(offsets) for tp, offsets in out.items()}


def expected(topic: str, ranges: dict[int, Iterable[int]]) -> dict[tuple[str, int], list[int]]:
    return {(topic, p): list(r) for p, r in ranges.items() if list(r)}


def parquet_rows(spark, out: Path) -> list:
    return spark.read.parquet(str(out / "data")).select("topic", "partition", "offset").collect()


def memory_rows(spark, name: str) -> list:
    return spark.table(name).select("topic", "partition", "offset", "value").collect()


def positions(offsets: str) -> dict[str, dict[str, int]]:
    """A reported offset JSON's positions, in Kafka's form."""
    return to_json(from_json(json.loads(offsets)))


def batches(query) -> list[int]:
    """numInputRows of every micro-batch that read something."""
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def batch_starts(query) -> list[float]:
    """When (epoch seconds) each micro-batch that read something was triggered: its offsets
    were decided right then, so admission control shows in the gaps between these."""
    return [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            for p in query.recentProgress if p["numInputRows"]]


def while_running(query, condition):  # type: ignore[no-untyped-def]
    """`condition` for wait_until, failing at once if the streaming query has failed (it would
    never hold then)."""
    def check():  # type: ignore[no-untyped-def]
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        return condition()
    return check


def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, object] | None = None) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, configs=configs)


@pytest.fixture
def bootstrap(source_broker) -> str:
    return source_broker.bootstrap


# -- rate_limit ---------------------------------------------------------------------------------


def test_rate_limit_splits_by_backlog():
    """rate_limit shares maxOffsetsPerTrigger across partitions in proportion to their backlog."""
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 10}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 10}
    assert rate_limit(start, latest, 40) == {("t", 0): 30, ("t", 1): 110, ("t", 2): 10}


def test_rate_limit_everything_when_under_the_limit():
    """rate_limit admits the whole backlog when it is within the limit."""
    start = {("t", 0): 5, ("t", 1): 7}
    latest = {("t", 0): 8, ("t", 1): 9}
    assert rate_limit(start, latest, 5) == latest
    assert rate_limit(start, latest, 1000) == latest


def test_rate_limit_small_backlog_still_moves():
    """rate_limit rounds a share under one row up, so a partition with a tiny backlog is not starved."""
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 1000, ("t", 1): 1}
    ends = rate_limit(start, latest, 10)
    assert ends[("t", 1)] == 1  # 10 * 1/1001 rows: rounded up to one
    assert ends[("t", 0)] == 9  # 10 * 1000/1001: rounded down
    assert sum(ends[tp] - start[tp] for tp in start) <= 10


def test_rate_limit_never_beyond_latest():
    """rate_limit never returns an end past a partition's latest offset, and new partitions start where latest says."""
    start = {("t", 0): 0}
    latest = {("t", 0): 3, ("t", 1): 2}  # partition 1 not in start: no backlog counted, kept at latest
    ends = rate_limit(start, latest, 2)
    assert all(ends[tp] <= latest[tp] for tp in latest)
    assert ends == {("t", 0): 2, ("t", 1): 2}
    for limit in (1, 2, 3, 7, 100):
        ends = rate_limit({("t", 0): 0, ("t", 1): 0, ("t", 2): 0}, {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}, limit)
        assert all(0 <= ends[("t", p)] <= 1 for p in range(3))


# -- admission control, checkpoints -----------------------------------------------------------------


def test_max_offsets_per_trigger_and_restart_exactly_once(spark, bootstrap, topic_name, tmp_path):
    """maxOffsetsPerTrigger caps every micro-batch, latestOffset is reported, and a restart from the checkpoint reads each record exactly once."""
    create_topic(bootstrap, topic_name, 3)
    produce(bootstrap, topic_name, {0: 8, 1: 8, 2: 8})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger=10)

    query = to_parquet(df, tmp_path)
    try:
        query.processAllAvailable()
        first = batches(query)
        latest_reported = [positions(p["sources"][0]["latestOffset"]) for p in query.recentProgress
                           if p["numInputRows"]]
    finally:
        query.stop()
    assert len(first) > 1 and all(n <= 10 for n in first), first
    assert sum(first) == 24
    # reportLatestOffset: the partitions' ends, not the rate-limited end of the batch
    assert latest_reported[0] == {topic_name: {"0": 8, "1": 8, "2": 8}}

    produce(bootstrap, topic_name, {0: 4, 1: 4, 2: 5})
    query = to_parquet(df, tmp_path)
    try:
        query.processAllAvailable()
        second = batches(query)
        last = query.recentProgress[-1]["sources"][0]
    finally:
        query.stop()
    assert len(second) > 1 and all(n <= 10 for n in second), second
    assert sum(second) == 13
    assert positions(last["latestOffset"]) == {topic_name: {"0": 12, "1": 12, "2": 13}}
    assert offsets_by_partition(parquet_rows(spark, tmp_path)) == expected(
        topic_name, {0: range(12), 1: range(12), 2: range(13)})


def test_starting_offsets_latest_is_the_stream_default(spark, bootstrap, topic_name):
    """With no startingOffsets a stream reads only records produced after it started."""
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, {0: 3, 1: 2})
    query, table = to_memory(stream(spark, bootstrap, subscribe=topic_name))
    try:
        query.processAllAvailable()  # the query has resolved its starting offsets
        assert memory_rows(spark, table) == []
        produce(bootstrap, topic_name, {0: 2, 1: 4})
        query.processAllAvailable()
        rows = memory_rows(spark, table)
    finally:
        query.stop()
    assert offsets_by_partition(rows) == expected(topic_name, {0: range(3, 5), 1: range(2, 6)})
    assert sorted(r["value"] for r in rows) == sorted(
        [f"{topic_name}-0-{i}".encode() for i in range(2)] + [f"{topic_name}-1-{i}".encode() for i in range(4)])


@pytest.mark.parametrize("starting, ranges", [
    ("earliest", {0: range(0, 5), 1: range(0, 3)}),
    ('{"TOPIC": {"0": 2, "1": -2}}', {0: range(2, 5), 1: range(0, 3)}),
    ('{"TOPIC": {"0": 4, "1": -1}}', {0: range(4, 5)}),
])
def test_starting_offsets_earliest_and_json(spark, bootstrap, topic_name, tmp_path, starting, ranges):
    """startingOffsets earliest reads everything; JSON offsets (with -2 earliest, -1 latest) start each partition where named."""
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, {0: 5, 1: 3})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets=starting.replace("TOPIC", topic_name))
    query = to_parquet(df, tmp_path, {"availableNow": True})
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    assert offsets_by_partition(parquet_rows(spark, tmp_path)) == expected(topic_name, ranges)


def test_min_offsets_per_trigger_waits_for_max_trigger_delay(spark, bootstrap, topic_name):
    """minOffsetsPerTrigger holds a small backlog back until maxTriggerDelay has passed since the last batch, and reads a large one at once (the first trigger does not wait, as in Kafka)."""
    delay_s = 6  # long enough that a loaded machine still tells "held back" from "read at once"
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, {0: 3})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest",
                minOffsetsPerTrigger=50, maxTriggerDelay=f"{delay_s}s")
    query, table = to_memory(df, {"processingTime": "200 milliseconds"})
    try:
        wait_until(while_running(query, lambda: sum(batches(query)) >= 3), 120, "the first backlog")
        assert batches(query) == [3]  # no batch before it: nothing to wait for

        produce(bootstrap, topic_name, {0: 3})
        wait_until(while_running(query, lambda: sum(batches(query)) >= 6), 120, "the small backlog")
        first, second = batch_starts(query)
        # The delay counts from the first batch's trigger (its offsets were decided then); how long
        # that batch ran (seconds, for a session's first streaming query) does not matter.
        assert second - first >= delay_s - 0.5, "a backlog under minOffsetsPerTrigger was read before maxTriggerDelay"
        assert batches(query) == [3, 3]  # held back, then read whole, in one batch

        produced_at = time.time()
        produce(bootstrap, topic_name, {0: 60})
        wait_until(while_running(query, lambda: sum(batches(query)) >= 66), 120, "the large backlog")
        # When its batch was triggered (how long the batch then ran, on a loaded machine, does not matter).
        assert batch_starts(query)[2] - produced_at < delay_s - 1, \
            "a backlog over minOffsetsPerTrigger waited for maxTriggerDelay"
        assert batches(query) == [3, 3, 60]
        rows = memory_rows(spark, table)
    finally:
        query.stop()
    assert offsets_by_partition(rows) == expected(topic_name, {0: range(66)})


def test_available_now_stops_at_the_offsets_present_at_start(spark, bootstrap, topic_name):
    """Trigger.AvailableNow reads up to the latest offsets of its start in several maxOffsetsPerTrigger batches and stops while records keep arriving."""
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, {0: 12, 1: 12})
    stop = threading.Event()
    failed: list[BaseException] = []

    def keep_producing() -> None:
        try:
            with Producer(bootstrap, linger_ms=0) as producer:
                i = 0
                while not stop.is_set():
                    producer.send(topic_name, f"late-{i}".encode(), partition=i % 2)
                    producer.flush()
                    i += 1
                    time.sleep(0.02)  # pacing, not waiting: records keep arriving while the query runs
        except BaseException as err:  # reported below
            failed.append(err)

    feeder = threading.Thread(target=keep_producing, name="late-records")
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger=10)
    feeder.start()
    query, table = to_memory(df, {"availableNow": True})
    try:
        assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
        assert query.exception() is None
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        rows = memory_rows(spark, table)
    finally:
        stop.set()
        feeder.join()
        query.stop()
    assert not failed, failed
    sizes = [p["numInputRows"] for p in progress]
    assert len(sizes) >= 3 and all(n <= 10 for n in sizes), sizes
    targets = {p["sources"][0]["latestOffset"] for p in progress}
    assert len(targets) == 1, f"the AvailableNow target moved: {targets}"
    target = positions(targets.pop())
    assert positions(progress[-1]["sources"][0]["endOffset"]) == target
    assert all(target[topic_name][p] >= 12 for p in ("0", "1"))
    assert offsets_by_partition(rows) == expected(
        topic_name, {int(p): range(end) for p, end in target[topic_name].items()})
    with Admin(bootstrap) as admin:
        now = admin.list_offsets({(topic_name, 0): -1, (topic_name, 1): -1})
    assert sum(o for o, _ in now.values()) > len(rows), "no record arrived after the target: the test proved nothing"


def test_available_now_ignores_min_offsets_per_trigger(spark, bootstrap, topic_name):
    """Trigger.AvailableNow reads a backlog smaller than minOffsetsPerTrigger and stops instead of waiting for maxTriggerDelay."""
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, {0: 5})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", minOffsetsPerTrigger=1000,
                maxTriggerDelay="15m")
    query, table = to_memory(df, {"availableNow": True})
    try:
        assert query.awaitTermination(60), "Trigger.AvailableNow waited for minOffsetsPerTrigger"
        rows = memory_rows(spark, table)
    finally:
        query.stop()
    assert offsets_by_partition(rows) == expected(topic_name, {0: range(5)})


# -- subscription changes ---------------------------------------------------------------------------


def test_new_partitions_and_pattern_topics_read_from_earliest(spark, bootstrap, topic_name, tmp_path):
    """A partition added while a query is stopped and a topic created meanwhile that matches subscribePattern are read from their earliest offset when it resumes from its checkpoint."""
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(bootstrap, first, 1)
    create_topic(bootstrap, f"other-{topic_name}", 1)  # does not match the pattern
    produce(bootstrap, first, {0: 3})
    produce(bootstrap, f"other-{topic_name}", {0: 2})
    df = stream(spark, bootstrap, subscribePattern=re.escape(topic_name) + r"-.*", startingOffsets="latest")
    query = to_parquet(df, tmp_path)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    # The changes land while no trigger can see them: records are in the new partitions before
    # the query looks at them again (reading them proves it starts at their earliest offset).
    produce(bootstrap, first, {0: 1})
    with Admin(bootstrap) as admin:
        admin.create_partitions(first, 3)
        admin.create_topic(second, partitions=2)
    produce(bootstrap, first, {1: 2, 2: 3})
    produce(bootstrap, second, {0: 2, 1: 1})
    query = to_parquet(df, tmp_path)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert offsets_by_partition(parquet_rows(spark, tmp_path)) == {
        **expected(first, {0: range(3, 4), 1: range(2), 2: range(3)}),
        **expected(second, {0: range(2), 1: range(1)}),
    }


# -- data loss ----------------------------------------------------------------------------------------


@pytest.fixture
def retention_broker(broker_factory):
    """A broker whose retention runs every 200 ms."""
    return broker_factory("retention", **{"log.retention.check.interval.ms": 200}).start()


def test_fail_on_data_loss(spark, retention_broker, topic_name, tmp_path):
    """Offsets deleted by retention before a restarted query read them fail it naming topic, partition and offsets (failOnDataLoss=true) or are skipped (false)."""
    bootstrap = retention_broker.bootstrap
    create_topic(bootstrap, topic_name, 1, {"segment.bytes": 4096})
    produce(bootstrap, topic_name, {0: 4}, value_bytes=500, one_per_batch=True)

    def run(fail_on_data_loss: bool) -> StreamingQueryException | None:
        df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest",
                    failOnDataLoss=str(fail_on_data_loss).lower())
        query = to_parquet(df, tmp_path, {"availableNow": True})
        try:
            assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
        except StreamingQueryException as err:
            return err
        finally:
            query.stop()

    assert run(True) is None  # checkpointed at offset 4
    produce(bootstrap, topic_name, {0: 30}, value_bytes=500, one_per_batch=True)
    with Admin(bootstrap) as admin:
        def log_start() -> int:
            return admin.list_offsets({(topic_name, 0): EARLIEST})[(topic_name, 0)][0]

        # Retention set once every record is in: its first pass deletes every segment it ever
        # will, so the log start it leaves is final (set before, a pass between two produced
        # records left a start the next pass moved on).
        admin.alter_configs(topic_name, {"retention.bytes": 4096})
        wait_until(lambda: log_start() > 4, 120, "retention to delete offset 4")
        start_after = log_start()

    error = run(True)
    assert isinstance(error, StreamingQueryException), error
    message = str(error)
    assert "DataLossError" in message
    assert f"{topic_name}-0: offsets 4..{start_after - 1} were deleted" in message
    assert "failOnDataLoss" in message

    assert run(False) is None
    assert offsets_by_partition(parquet_rows(spark, tmp_path)) == expected(
        topic_name, {0: [*range(4), *range(start_after, 34)]})


def test_deleted_topic_fails_the_query(spark, bootstrap, topic_name):
    """A subscribed topic deleted mid-query fails it with failOnDataLoss=true, naming the topic-partition and offset."""
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, {0: 3})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest")
    query, table = to_memory(df, {"processingTime": "200 milliseconds"})
    try:
        query.processAllAvailable()
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic_name])
        wait_until(lambda: query.exception() is not None, 120, "the query to fail")
        message = str(query.exception())
    finally:
        query.stop()
    assert "DataLossError" in message
    assert f"{topic_name}-0 no longer exists (topic deleted?) after offset 3" in message


def test_deleted_and_recreated_topic_without_fail_on_data_loss(spark, bootstrap, topic_name):
    """With failOnDataLoss=false a deleted topic is dropped from the query's offsets, and re-created it is read from its earliest offset."""
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, {0: 3})
    df = stream(spark, bootstrap, subscribe=topic_name, startingOffsets="earliest", failOnDataLoss="false")
    query, table = to_memory(df, {"processingTime": "200 milliseconds"})
    try:
        query.processAllAvailable()
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic_name])
        wait_until(while_running(query, lambda: json.loads(query.lastProgress["sources"][0]["endOffset"]) == {}), 120,
                   "the query to drop the deleted topic")
        create_topic(bootstrap, topic_name, 1)
        produce(bootstrap, topic_name, {0: 2})
        wait_until(while_running(query, lambda: len(memory_rows(spark, table)) >= 5), 120, "the re-created topic's records")
        query.processAllAvailable()
        rows = memory_rows(spark, table)
    finally:
        query.stop()
    assert sorted((r["offset"], r["value"]) for r in rows) == sorted(
        [(i, f"{topic_name}-0-{i}".encode()) for i in range(3)] + [(i, f"{topic_name}-0-{i}".encode()) for i in range(2)])


def test_a_broker_restart_under_a_running_query_is_survived(spark, broker_factory, topic_name):
    """The broker stops for a few seconds while a streaming query polls it every 200 ms: the
    driver's lookups wait it out (default.api.timeout.ms) instead of failing the query with "no
    broker reachable", and every record, from before and after the restart, is read once."""
    restarting = broker_factory("restarting").start()
    create_topic(restarting.bootstrap, topic_name, 2)
    produce(restarting.bootstrap, topic_name, {0: 50, 1: 50})
    df = stream(spark, restarting.bootstrap, subscribe=topic_name, startingOffsets="earliest")
    query, name = to_memory(df, {"processingTime": "200 milliseconds"})
    try:
        wait_until(while_running(query, lambda: len(memory_rows(spark, name)) == 100), 120, "the first 100 records")
        restarting.stop()
        time.sleep(3)  # several triggers find no broker
        restarting.start()
        produce(restarting.bootstrap, topic_name, {0: 20, 1: 20})
        wait_until(while_running(query, lambda: len(memory_rows(spark, name)) == 140), 120,
                   "the records produced after the restart")
        assert query.exception() is None
        assert offsets_by_partition(memory_rows(spark, name)) == expected(topic_name, {0: range(70), 1: range(70)})
    finally:
        query.stop()
