"""Table topics (jobs/topic_table.py, jobs/table_status.py, pymq/topic_history.py) against a real broker
that tiers to a file:// store, with the run's Spark session and real Delta tables.

- Delta itself: a write, a read, a DELETE and time travel work in the session `local_spark` makes.
- `sync` of JSON values: typed columns, a malformed value kept whole in `malformedValue`, the
  table's position equal to the log end, a second sync adds nothing.
- `history()` across the seam: the table synced to the middle of a segment in each partition,
  the rest on the broker and (older segments, trimmed locally) only in the tier: every produced
  record exactly once, with the table read as its Parquet files and by Delta; filters on
  partition, offset and timestamp prune the table's side, and the same DataFrame answers each
  query with its own filters.
- A compacted topic's tombstones delete the key's earlier rows (in deletion vectors, which only
  Delta's reader reads).
- `pymq table status` and a table of another topic refused by name.

The `pymq table sync` command itself (its own process, `--value-format json --value-schema`) is
tested in tests/jobs/test_table_sync_kill.py, whose one subprocess JVM it is SIGKILLed in.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from client import Admin, Producer
from broker.process import BrokerProcess
from jobs.table_status import table_status
from jobs.topic_table import SyncOptions, sync
from pymq import history
from spark_datasource.table_topic import TableTopic, TableTopicError, ValueFormat
from tests.waiting import wait_until

PARTITIONS = 2


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker tiering to a file:// store, quickly: segments move to the tier as soon as they
    are sealed, and local copies go past 64 KiB per partition."""
    root = tmp_path_factory.mktemp("table-broker")
    process = BrokerProcess(root / "broker", {
        "remote.log.storage.system.enable": True, "remote.storage.url": f"file://{root / 'remote'}",
        "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50,
        "file.delete.delay.ms": 0}).start()
    yield process
    process.kill()


def event(p: int, n: int) -> bytes:
    return json.dumps({"p": p, "n": n, "page": f"/page/{n % 7}", "pad": "x" * 60}).encode()


def produce(bootstrap: str, topic: str, start: int, count: int, timestamp_ms: int | None = None,
            batch: int | None = None) -> None:
    """`count` JSON events per partition, numbered from `start`, sent in batches of `batch` (all
    `count` in one by default) by one producer."""
    with Producer(bootstrap, linger_ms=5) as producer:
        for first in range(start, start + count, batch or count):
            for p in range(PARTITIONS):
                ns = range(first, min(first + (batch or count), start + count))
                columns = {"key": [b"k%d" % (n % 50) for n in ns], "value": [event(p, n) for n in ns]}
                if timestamp_ms is not None:
                    columns["timestamp"] = pa.array([timestamp_ms + n for n in ns], pa.timestamp("ms", tz="UTC"))
                producer.send_batch(topic, pa.table(columns), partition=p)
        producer.flush()


def test_delta_write_read_delete_and_time_travel(spark, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "plain")
    spark.range(100).write.format("delta").save(path)
    DeltaTable.forPath(spark, path).delete("id < 10")
    assert spark.read.format("delta").load(path).count() == 90
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 100


def test_sync_decodes_json_values_and_keeps_malformed_ones(spark, broker: BrokerProcess, tmp_path: Path) -> None:
    topic = "table-json"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    with Producer(broker.bootstrap) as producer:
        # Values from_json gives no struct for: malformed, empty, blank, JSON's null.
        undecodable = [b"{not json", b"", b"  \n", b"null"]
        values = [json.dumps({"page": f"/p{n}", "ms": n}).encode() for n in range(20)] + undecodable + [None]
        producer.send_batch(topic, pa.table({"key": [b"k"] * 25, "value": pa.array(values, pa.binary())}))
        producer.flush()
    options = SyncOptions(topic, str(tmp_path / "t"), broker.bootstrap, ValueFormat.parse("json", "page STRING, ms BIGINT"))
    writer = sync(spark, options)
    assert [b["rows"] for b in writer.batches] == [25]
    table = spark.read.format("delta").load(options.table)
    assert table.schema["value"].dataType.simpleString() == "struct<page:string,ms:bigint>"
    rows = {r["offset"]: r for r in table.collect()}
    assert rows[3]["value"]["page"] == "/p3" and rows[3]["value"]["ms"] == 3 and rows[3]["malformedValue"] is None
    for offset, raw in enumerate(undecodable, start=20):  # each keeps its bytes, none reads as a null value
        assert rows[offset]["value"] is None and bytes(rows[offset]["malformedValue"]) == raw, raw
    assert rows[24]["value"] is None and rows[24]["malformedValue"] is None  # a null value is no malformed one
    assert TableTopic(spark, options.table).position().offsets == {0: 25}
    assert sync(spark, options).batches == []  # caught up: nothing appended twice
    assert table.count() == 25
    caught_up = history(spark, topic, table=options.table, bootstrap=broker.bootstrap)
    assert caught_up.count() == 25 and "pymq" not in caught_up._jdf.queryExecution().analyzed().toString().lower()
    # history()'s tail, read from the broker, decodes them the same way.
    with Producer(broker.bootstrap) as producer:
        producer.send_batch(topic, pa.table({"key": [b"k"] * 5, "value": pa.array([*undecodable, None], pa.binary())}))
        producer.flush()
    tail = history(spark, topic, table=options.table, bootstrap=broker.bootstrap).where("offset >= 25").collect()
    assert sorted((r["offset"], r["value"], r["malformedValue"]) for r in tail) == [
        *((25 + i, None, raw) for i, raw in enumerate(undecodable)), (29, None, None)]


def test_history_spans_table_broker_and_tier_with_no_duplicate_and_no_gap(spark, broker: BrokerProcess,
                                                                          tmp_path: Path) -> None:
    topic = "table-seam"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, configs={
            "segment.bytes": 32 << 10, "remote.storage.enable": "true", "local.retention.bytes": 64 << 10,
            "retention.ms": -1})
    produce(broker.bootstrap, topic, 0, 1_037)  # the table's part ends inside a segment
    options = SyncOptions(topic, str(tmp_path / "seam"), broker.bootstrap, ValueFormat.parse("json", "p INT, n INT, page STRING"))
    sync(spark, options)
    assert TableTopic(spark, options.table).position().offsets == {0: 1_037, 1: 1_037}
    produce(broker.bootstrap, topic, 1_037, 3_000)  # the rest: on the broker, older segments only in the tier
    wait_for_local_trim(broker, topic, above=1_037)

    # The table's snapshot read as its Parquet files (what `auto` picks for a local table of few
    # files) and by Delta Lake: the same rows either way.
    views = {reader: history(spark, topic, table=options.table, bootstrap=broker.bootstrap, table_reader=reader)
             for reader in ("auto", "delta")}
    produce(broker.bootstrap, topic, 4_037, 10)  # after history() was asked: not in its view
    assert file_indexes(views["auto"]) == {"InMemoryFileIndex"} and file_indexes(views["delta"]) == {"PreparedDeltaFileIndex"}
    for reader, rows in views.items():
        got = rows.select("partition", "offset", "value.p", "value.n").collect()
        assert len(got) == PARTITIONS * 4_037, reader
        assert {(r["partition"], r["offset"]) for r in got} == {(p, o) for p in range(PARTITIONS) for o in range(4_037)}
        assert all(r["p"] == r["partition"] and r["n"] == r["offset"] for r in got)  # values decoded on both sides

        # Filters prune the table's side and give exactly the matching rows; the same DataFrame
        # queried again, unfiltered or filtered otherwise, answers its own query.
        window = rows.where("partition = 1 AND offset >= 1000 AND offset < 1100")
        assert sorted(r["offset"] for r in window.select("offset").collect()) == list(range(1_000, 1_100)), reader
        plan = window._jdf.queryExecution().executedPlan().toString()
        assert "PushedFilters" in plan or "DataFilters" in plan
        assert rows.count() == len(got), reader
        assert rows.where("partition = 0 AND offset >= 4000").count() == 37, reader
        assert rows.where("date = current_date()").count() == len(got)  # the table's `date`, on both readers


def file_indexes(rows) -> set[str]:  # noqa: ANN001 - a DataFrame
    """The file indexes the plan's table scans read through: Delta's (PreparedDeltaFileIndex) or
    the Parquet reader's list of named files (InMemoryFileIndex)."""
    return set(re.findall(r"Location: (\w+)", rows._jdf.queryExecution().executedPlan().toString()))


def wait_for_local_trim(broker: BrokerProcess, topic: str, above: int, timeout_s: float = 60.0) -> None:
    """Until every partition's oldest local segment starts past `above` (older ones only in the tier)."""
    def starts() -> list[int]:
        bases = [sorted(int(f.name[:20]) for f in (broker.log_dir / f"{topic}-{p}").glob("*.log"))
                 for p in range(PARTITIONS)]
        return [b[0] if b else 0 for b in bases]

    wait_until(lambda: all(start > above for start in starts()), timeout_s,
               f"local logs of {topic} start past {above}", 0.1)


def test_tombstones_of_a_compacted_topic_delete_earlier_rows(spark, broker: BrokerProcess, tmp_path: Path) -> None:
    topic = "table-compacted"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, configs={"cleanup.policy": "compact"})
    with Producer(broker.bootstrap) as producer:  # then tombstone a, a comes back; tombstone b
        producer.send_batch(topic, pa.table({"key": [b"a", b"b", b"a", b"c"], "value": [b"a1", b"b1", b"a2", b"c1"]}))
        producer.send_batch(topic, pa.table({"key": [b"a", b"a", b"b"], "value": pa.array([None, b"a3", None], pa.binary())}))
        producer.flush()
    # One sync of two micro-batches (4 records each at most): the tombstones' batch deletes rows an
    # earlier commit wrote. (One query, not two syncs: a query's start and end cost ~2 s.)
    options = SyncOptions(topic, str(tmp_path / "compacted"), broker.bootstrap, max_offsets_per_trigger=4)
    TableTopic(spark, options.table).create(topic, options.value_format, options.include_headers)  # what sync does first
    # Deletes mark rows in deletion vectors, files stay: only Delta's reader reads such a table.
    spark.sql(f"ALTER TABLE delta.`{options.table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    writer = sync(spark, options)
    assert [(b["offsets"], b["deleted"]) for b in writer.batches] == [({0: 4}, 0), ({0: 7}, 3)]  # a1, a2, b1
    left = sorted((r["offset"], bytes(r["key"]), None if r["value"] is None else bytes(r["value"]))
                  for r in spark.read.format("delta").load(options.table).collect())
    assert left == [(3, b"c", b"c1"), (4, b"a", None), (5, b"a", b"a3"), (6, b"b", None)]
    rows = history(spark, topic, table=options.table, bootstrap=broker.bootstrap)
    assert file_indexes(rows) == {"PreparedDeltaFileIndex"} and sorted(r["offset"] for r in rows.collect()) == [3, 4, 5, 6]
    with pytest.raises(TableTopicError, match=r"cannot be read as plain Parquet: reader features \['deletionVectors'\]"):
        history(spark, topic, table=options.table, bootstrap=broker.bootstrap, table_reader="parquet")
    with pytest.raises(TableTopicError, match="table reader 'iceberg' is not one of auto, delta, parquet"):
        history(spark, topic, table=options.table, bootstrap=broker.bootstrap, table_reader="iceberg")


def test_status_reports_position_and_lag_and_a_wrong_topic_is_refused(spark, broker: BrokerProcess,
                                                                      tmp_path: Path) -> None:
    topic = "table-status"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    produce(broker.bootstrap, topic, 0, 30)
    options = SyncOptions(topic, str(tmp_path / "status"), broker.bootstrap)
    sync(spark, options)
    produce(broker.bootstrap, topic, 30, 5)
    status = table_status(spark, options.table, broker.bootstrap, topic)
    assert status.rows == PARTITIONS * 30 and status.value_format == "binary"
    assert [(p.table_position, p.log_end, p.lag) for p in status.partitions] == [(30, 35, 5)] * PARTITIONS
    with pytest.raises(TableTopicError, match="mirrors topic 'table-status', not 'other'"):
        table_status(spark, options.table, broker.bootstrap, "other")
    with pytest.raises(TableTopicError, match="mirrors another topic or format"):
        sync(spark, SyncOptions(topic, options.table, broker.bootstrap, ValueFormat.parse("json", "n INT")))


def test_retention_job_reports_then_deletes_what_the_topic_no_longer_holds(spark, broker: BrokerProcess,
                                                                           tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from jobs.retention import retention

    topic = "table-retention"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, configs={"segment.bytes": 16 << 10})
    produce(broker.bootstrap, topic, 0, 1_000, batch=100)  # batches of 100: segments roll between them
    options = SyncOptions(topic, str(tmp_path / "retention"), broker.bootstrap)
    sync(spark, options)
    with Admin(broker.bootstrap) as admin:  # the broker's retention moves each log start forward
        admin.alter_configs(topic, {"retention.bytes": 48 << 10})
        wait_until(lambda: min(start for start, _ in admin.list_offsets(
            {(topic, p): -2 for p in range(PARTITIONS)}).values()) > 0, 60, "retention moved every log start")
        starts = {p: start for (_, p), (start, _) in admin.list_offsets({(topic, p): -2 for p in range(PARTITIONS)}).items()}

    dry = retention(spark, options.table, broker.bootstrap, topic)
    assert {p.partition: p.expired_rows for p in dry.partitions} == starts
    assert spark.read.format("delta").load(options.table).count() == PARTITIONS * 1_000  # a dry run changes nothing

    done = retention(spark, options.table, broker.bootstrap, topic, execute=True, vacuum_horizon_hours=0)
    assert done.deleted_rows == sum(starts.values()) and done.vacuumed
    left = {r["partition"]: (r["rows"], r["first"]) for r in spark.read.format("delta").load(options.table)
            .groupBy("partition").agg(F.count("*").alias("rows"), F.min("offset").alias("first")).collect()}
    assert left == {p: (1_000 - start, start) for p, start in starts.items()}  # each partition's from its log start
    assert retention(spark, options.table, broker.bootstrap, topic).partitions[0].expired_rows == 0


def test_retention_job_expires_rows_by_time_only_under_the_delete_policy(spark, broker: BrokerProcess,
                                                                          tmp_path: Path) -> None:
    """A compact topic with retention.ms set: rows older than retention.ms have not expired (the
    broker keeps each key's latest record whatever its age), so --execute deletes none of them."""
    from jobs.retention import retention

    topic = "table-retention-compact"
    hour_ms = 3_600_000
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, configs={"cleanup.policy": "compact", "retention.ms": hour_ms})
    now_ms = int(time.time() * 1000)
    produce(broker.bootstrap, topic, 0, 50, timestamp_ms=now_ms - 600_000)  # 50 keys, one record each
    options = SyncOptions(topic, str(tmp_path / "compact"), broker.bootstrap)
    sync(spark, options)
    later_ms = now_ms + 2 * hour_ms  # every row is older than retention.ms by then
    dry = retention(spark, options.table, broker.bootstrap, topic, now_ms=later_ms)
    assert dry.cutoff_ms is None and [p.expired_rows for p in dry.partitions] == [0] * PARTITIONS
    done = retention(spark, options.table, broker.bootstrap, topic, execute=True, vacuum_horizon_hours=0, now_ms=later_ms)
    assert done.deleted_rows == 0
    assert spark.read.format("delta").load(options.table).count() == PARTITIONS * 50


@pytest.mark.parametrize("cleanup_policy, retention_ms, by_time", [
    ("delete", 60_000, True), ("compact,delete", 60_000, True), ("compact", 60_000, False), ("delete", -1, False),
], ids=["delete", "compact-delete", "compact", "no-limit"])
def test_time_retention_is_the_delete_policys(cleanup_policy: str, retention_ms: int, by_time: bool) -> None:
    from jobs.retention import TopicPolicy

    assert TopicPolicy(retention_ms, cleanup_policy).by_time is by_time


def ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def arrow_value(**row: object) -> bytes:
    """A value as an Arrow IPC stream of one row."""
    return ipc_stream(pa.table({name: [value] for name, value in row.items()}))


def test_sync_decodes_arrow_ipc_values(spark, broker: BrokerProcess, tmp_path: Path) -> None:
    topic = "table-arrow"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    two_rows = ipc_stream(pa.table({"page": ["/a", "/b"], "ms": [1, 2]}))
    values = [arrow_value(page=f"/p{n}", ms=n, extra="ignored") for n in range(5)] + [b"garbage", two_rows]
    with Producer(broker.bootstrap) as producer:
        producer.send_batch(topic, pa.table({"key": [b"k"] * len(values), "value": values}))
        producer.flush()
    options = SyncOptions(topic, str(tmp_path / "arrow"), broker.bootstrap, ValueFormat.parse("arrow", "page STRING, ms BIGINT"))
    sync(spark, options)
    rows = {r["offset"]: r for r in spark.read.format("delta").load(options.table).collect()}
    assert [(rows[n]["value"]["page"], rows[n]["value"]["ms"]) for n in range(5)] == [(f"/p{n}", n) for n in range(5)]
    assert rows[5]["value"] is None and bytes(rows[5]["malformedValue"]) == b"garbage"
    assert rows[6]["value"] is None and rows[6]["malformedValue"] is not None  # two rows are not one record


def test_a_table_on_s3a(spark, broker: BrokerProcess, s3, tmp_path: Path) -> None:
    """The table (and the sync's checkpoint inside it) on an S3-compatible store through s3a://."""
    url, options = s3
    bucket = url.removeprefix("s3://").split("/")[0]
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in {"endpoint": options["endpoint_url"], "access.key": options["key"], "secret.key": options["secret"],
                       "endpoint.region": options["region"], "connection.ssl.enabled": "false"}.items():
        hadoop.set(f"fs.s3a.bucket.{bucket}.{key}", value)  # this bucket only: other tests see no change
    topic = "table-s3a"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    produce(broker.bootstrap, topic, 0, 200)
    table = f"s3a://{bucket}/tables/{topic}"
    sync(spark, SyncOptions(topic, table, broker.bootstrap, ValueFormat.parse("json", "p INT, n INT, page STRING")))
    produce(broker.bootstrap, topic, 200, 50)
    rows = history(spark, topic, table=table, bootstrap=broker.bootstrap).select("partition", "offset", "value.n").collect()
    assert sorted((r["partition"], r["offset"]) for r in rows) == [(p, o) for p in range(PARTITIONS) for o in range(250)]
    # On a store, Delta's reader: the log's sizes and statistics spare a request per file.
    assert file_indexes(history(spark, topic, table=table, bootstrap=broker.bootstrap)) == {"PreparedDeltaFileIndex"}
    assert TableTopic(spark, table).position().offsets == {p: 200 for p in range(PARTITIONS)}
