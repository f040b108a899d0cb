"""Batch reads through `spark.read.format("pymq")` against a real broker process: every column,
every starting/ending option form, filters (evaluated by Spark, each query on a DataFrame its
own), range splitting, and failOnDataLoss.

Most tests read one module-wide topic, `events`: 3 partitions of 1000 records each, record `i`
in partition `i % 3` at offset `i // 3` with create time `BASE_MS + 10 * i`, so every expected
row set is a predicate over `RECORDS`.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from chispa import assert_basic_rows_equality, assert_df_equality
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from client import EARLIEST, LATEST, Admin, Producer
from client.range_reader import RangeStats
from broker.process import BrokerProcess
from spark_datasource.batch_reader import PymqBatchReader
from spark_datasource.options import SourceOptions
from spark_datasource.ranges import OffsetRange, split_ranges
from spark_datasource.schema import COLUMNS, spark_schema
from spark_datasource.task import read_offset_range
from tests.waiting import wait_until

BASE_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
STEP_MS = 10
EVENTS = "events"
PARTITIONS = 3
PER_PARTITION = 1000
N = PARTITIONS * PER_PARTITION

# Records carry 2023 create times: time retention (7 days) must not delete them under a test.
KEEP = {"retention.ms": -1}


@dataclass(frozen=True)
class Rec:
    i: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    ts: int
    headers: list[tuple[str, bytes]] | None


def _event(i: int) -> Rec:
    headers = [("seq", str(i).encode()), ("empty", b"")] if i % 5 == 0 else ([] if i % 5 == 1 else None)
    key = None if i % 50 == 0 else f"k{i % 97}".encode()
    value = None if i % 101 == 7 else f"value-{i}|".encode() * (1 + i % 4)
    return Rec(i, i % PARTITIONS, i // PARTITIONS, key, value, BASE_MS + i * STEP_MS, headers)


RECORDS = [_event(i) for i in range(N)]


def ts_of(i: int) -> int:
    return BASE_MS + i * STEP_MS


def utc(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=ms)


def positions(where: Callable[[Rec], bool] = lambda r: True) -> list[tuple[str, int, int]]:
    return [(EVENTS, r.partition, r.offset) for r in RECORDS if where(r)]


def read(spark: SparkSession, bootstrap: str, bootstrap_option: str = "kafka.bootstrap.servers",
         **options: str) -> DataFrame:
    if not any(k in options for k in ("subscribe", "subscribePattern", "assign")):
        options["subscribe"] = EVENTS
    return spark.read.format("pymq").option(bootstrap_option, bootstrap).options(**options).load()


def assert_positions(df: DataFrame, expected: Iterable[tuple[str, int, int]]) -> None:
    """`df` holds exactly the (topic, partition, offset) rows `expected`, each once. The rows are
    compared with chispa's row comparer after one collect: a Spark-side sort of both sides
    (assert_df_equality with ignore_row_order) costs three times as long, and dozens of tests
    compare positions."""
    assert_basic_rows_equality(sorted(df.select("topic", "partition", "offset").collect()),
                               [Row(topic=t, partition=p, offset=o) for t, p, o in sorted(expected)])


def produce_batches(bootstrap: str, topic: str, batches: int, per_batch: int, value_bytes: int,
                    timestamp: Callable[[int], int] = ts_of) -> None:
    """`batches` record batches of `per_batch` records each into partition 0 (one batch per
    flush), record n's create time `timestamp(n)`."""
    with Producer(bootstrap, linger_ms=0) as producer:
        for b in range(batches):
            first = b * per_batch
            producer.send_batch(topic, pa.table({
                "value": [f"{n:08d}".encode().ljust(value_bytes, b".") for n in range(first, first + per_batch)],
                "timestamp": pa.array([timestamp(n) for n in range(first, first + per_batch)], pa.int64()),
            }), partition=0)
            producer.flush()


@pytest.fixture(scope="module")
def events(source_broker: BrokerProcess) -> str:
    """`events` produced once per module; its bootstrap address."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(EVENTS, partitions=PARTITIONS, configs=KEEP)
    with Producer(bootstrap, linger_ms=20) as producer:
        futures = [producer.send(EVENTS, r.value, key=r.key, partition=r.partition, timestamp_ms=r.ts,
                                 headers=r.headers) for r in RECORDS]
        producer.flush()
        landed = [f.result(10) for f in futures]
    assert [(m.partition, m.offset) for m in landed] == [(r.partition, r.offset) for r in RECORDS]
    return bootstrap


@pytest.fixture(scope="module")
def small_topics(events: str) -> str:
    """`pat-a` (2 partitions), `pat-b` and `other` (1 each) with a few records, next to `events`."""
    sizes = {"pat-a": 2, "pat-b": 1, "other": 1}
    with Admin(events) as admin:
        for topic, count in sizes.items():
            admin.create_topic(topic, partitions=count)
    with Producer(events, linger_ms=0) as producer:
        for topic, count in sizes.items():
            for n in range(4 * count):
                producer.send(topic, f"{topic}/{n}".encode(), partition=n % count)
        producer.flush()
    return events


def small_positions(*topics: str) -> list[tuple[str, int, int]]:
    counts = {"pat-a": 2, "pat-b": 1, "other": 1}
    return [(t, p, o) for t in topics for p in range(counts[t]) for o in range(4)]


# -- columns ---------------------------------------------------------------------------------------


def test_every_column_of_every_record_is_read_back_exactly_once(spark, events):
    """Keys, values, topic, partition, offset, UTC timestamps, timestampType 0 and headers are the produced ones."""
    df = read(spark, events, includeHeaders="true")
    assert df.schema == spark_schema(True)
    expected = spark.createDataFrame(
        [(r.key, r.value, EVENTS, r.partition, r.offset, utc(r.ts), 0, r.headers) for r in RECORDS],
        spark_schema(True))
    assert_df_equality(df.orderBy("partition", "offset"), expected.orderBy("partition", "offset"))
    # The instants themselves, independent of any time zone a collect() converts to.
    millis = df.select("partition", "offset", F.unix_millis("timestamp").alias("ms"),
                       F.date_format("timestamp", "yyyy-MM-dd HH:mm:ss.SSS").alias("text"))
    assert_df_equality(millis, spark.createDataFrame(
        [(r.partition, r.offset, r.ts, utc(r.ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]) for r in RECORDS],
        "partition int, offset long, ms long, text string"), ignore_row_order=True, ignore_nullable=True)


def test_records_arrive_in_offset_order_within_each_partition(spark, events):
    """Without any ORDER BY, each partition's rows come in offset order, one Spark partition per topic partition."""
    df = read(spark, events)
    assert df.rdd.getNumPartitions() == PARTITIONS
    seen: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        seen.setdefault(row.partition, []).append(row.offset)
    assert seen == {p: list(range(PER_PARTITION)) for p in range(PARTITIONS)}


def test_headers_column_only_with_include_headers(spark, events):
    """The schema is the Kafka source's seven columns unless includeHeaders=true adds `headers`."""
    assert read(spark, events).schema == COLUMNS
    assert read(spark, events, includeHeaders="false").columns == COLUMNS.names
    assert read(spark, events, includeHeaders="TRUE").columns == [*COLUMNS.names, "headers"]


def test_log_append_time_topic_has_timestamp_type_1_and_the_brokers_time(spark, source_broker, topic_name):
    """On a LogAppendTime topic every row has timestampType 1 and the broker's append time, not the producer's."""
    with Admin(source_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, configs={"message.timestamp.type": "LogAppendTime"})
    before = time.time_ns() // 1_000_000
    with Producer(source_broker.bootstrap, linger_ms=5) as producer:
        for n in range(200):
            producer.send(topic_name, f"v{n}".encode(), partition=n % 2, timestamp_ms=BASE_MS)
        producer.flush()
    after = time.time_ns() // 1_000_000
    df = read(spark, source_broker.bootstrap, subscribe=topic_name)
    rows = df.select("partition", "offset", "timestampType", F.unix_millis("timestamp").alias("ms")).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in range(2) for o in range(100)]
    assert {r.timestampType for r in rows} == {1}
    assert all(before <= r.ms <= after for r in rows), (before, after, sorted({r.ms for r in rows}))


# -- starting and ending offsets -----------------------------------------------------------------


def test_starting_offsets_earliest_reads_everything(spark, events):
    """startingOffsets=earliest (and the default) read every record."""
    assert_positions(read(spark, events, startingOffsets="earliest"), positions())
    assert_positions(read(spark, events), positions())


def test_starting_offsets_json_with_explicit_offsets_and_minus_2(spark, events):
    """startingOffsets JSON starts each partition at its offset; -2 is the earliest."""
    starting = json.dumps({EVENTS: {"0": 10, "1": -2, "2": 995}})
    assert_positions(read(spark, events, startingOffsets=starting),
                     positions(lambda r: r.offset >= {0: 10, 1: 0, 2: 995}[r.partition]))


def test_ending_offsets_latest_reads_to_the_end(spark, events):
    """endingOffsets=latest ends at each partition's latest offset."""
    assert_positions(read(spark, events, endingOffsets="latest"), positions())


def test_ending_offsets_json_with_minus_1_and_explicit_offsets(spark, events):
    """endingOffsets JSON ends each partition before its offset; -1 is the latest."""
    ending = json.dumps({EVENTS: {"0": -1, "1": 20, "2": 0}})
    assert_positions(read(spark, events, endingOffsets=ending),
                     positions(lambda r: r.offset < {0: PER_PARTITION, 1: 20, 2: 0}[r.partition]))


def test_starting_and_ending_offsets_json_together(spark, events):
    """Both JSON forms together bound each partition on both sides."""
    starting = json.dumps({EVENTS: {"0": 5, "1": 0, "2": 999}})
    ending = json.dumps({EVENTS: {"0": 8, "1": -1, "2": 1000}})
    bounds = {0: (5, 8), 1: (0, PER_PARTITION), 2: (999, 1000)}
    assert_positions(read(spark, events, startingOffsets=starting, endingOffsets=ending),
                     positions(lambda r: bounds[r.partition][0] <= r.offset < bounds[r.partition][1]))


def test_starting_timestamp(spark, events):
    """startingTimestamp starts every partition at its first record at or after the time."""
    at = ts_of(1500) - 5  # between record 1499 and 1500
    assert_positions(read(spark, events, startingTimestamp=str(at)), positions(lambda r: r.ts >= at))


def test_starting_offsets_by_timestamp(spark, events):
    """startingOffsetsByTimestamp starts each partition at its own time."""
    times = {0: ts_of(300), 1: ts_of(0), 2: ts_of(2998)}
    spec = json.dumps({EVENTS: {str(p): t for p, t in times.items()}})
    assert_positions(read(spark, events, startingOffsetsByTimestamp=spec),
                     positions(lambda r: r.ts >= times[r.partition]))


def test_ending_timestamp(spark, events):
    """endingTimestamp ends every partition before its first record at or after the time."""
    at = ts_of(600)
    assert_positions(read(spark, events, endingTimestamp=str(at)), positions(lambda r: r.ts < at))


def test_ending_offsets_by_timestamp_goes_to_latest_without_a_later_record(spark, events):
    """endingOffsetsByTimestamp ends each partition at its own time; a time after every record reads to the end."""
    times = {0: ts_of(30), 1: ts_of(N + 100), 2: ts_of(2)}
    spec = json.dumps({EVENTS: {str(p): t for p, t in times.items()}})
    assert_positions(read(spark, events, endingOffsetsByTimestamp=spec),
                     positions(lambda r: r.ts < times[r.partition]))


def test_by_timestamp_strategy_error_names_the_partition(spark, events):
    """Strategy error (the default): a partition without a record at or after its time fails the query, named."""
    spec = json.dumps({EVENTS: {"0": ts_of(0), "1": ts_of(0), "2": ts_of(N + 100)}})
    with pytest.raises(Exception, match=f"{EVENTS}-2") as raised:
        read(spark, events, startingOffsetsByTimestamp=spec).collect()
    assert "startingOffsetsByTimestamp" in str(raised.value)
    with pytest.raises(Exception, match=f"{EVENTS}-2"):
        read(spark, events, startingOffsetsByTimestamp=spec, startingOffsetsByTimestampStrategy="error").collect()


def test_by_timestamp_strategy_latest_starts_such_a_partition_at_its_end(spark, events):
    """startingOffsetsByTimestampStrategy=latest starts a partition without a later record at its latest offset."""
    spec = json.dumps({EVENTS: {"0": ts_of(2997), "1": ts_of(0), "2": ts_of(N + 100)}})
    assert_positions(read(spark, events, startingOffsetsByTimestamp=spec,
                                 startingOffsetsByTimestampStrategy="latest"),
                     positions(lambda r: r.partition == 1 or (r.partition == 0 and r.i >= 2997)))
    assert_positions(read(spark, events, startingTimestamp=str(ts_of(N + 100)),
                                 startingOffsetsByTimestampStrategy="latest"), [])


def test_starting_timestamp_beats_by_timestamp_beats_offsets(spark, events):
    """Precedence: startingTimestamp over startingOffsetsByTimestamp over startingOffsets."""
    by_timestamp = json.dumps({EVENTS: {"0": ts_of(2400), "1": ts_of(2400), "2": ts_of(2400)}})
    offsets = json.dumps({EVENTS: {"0": 900, "1": 900, "2": 900}})
    assert_positions(read(spark, events, startingTimestamp=str(ts_of(2700)),
                                 startingOffsetsByTimestamp=by_timestamp, startingOffsets=offsets),
                     positions(lambda r: r.i >= 2700))
    assert_positions(read(spark, events, startingOffsetsByTimestamp=by_timestamp, startingOffsets=offsets),
                     positions(lambda r: r.i >= 2400))


def test_ending_timestamp_beats_by_timestamp_beats_offsets(spark, events):
    """Precedence on the ending side: endingTimestamp over endingOffsetsByTimestamp over endingOffsets."""
    by_timestamp = json.dumps({EVENTS: {"0": ts_of(30), "1": ts_of(30), "2": ts_of(30)}})
    offsets = json.dumps({EVENTS: {"0": 3, "1": 3, "2": 3}})
    assert_positions(read(spark, events, endingTimestamp=str(ts_of(60)),
                                 endingOffsetsByTimestamp=by_timestamp, endingOffsets=offsets),
                     positions(lambda r: r.i < 60))
    assert_positions(read(spark, events, endingOffsetsByTimestamp=by_timestamp, endingOffsets=offsets),
                     positions(lambda r: r.i < 30))


def test_ending_offsets_past_the_end_fail_at_planning(spark, events):
    """An explicit ending offset past a partition's latest offset fails the query naming it and endingOffsets."""
    ending = json.dumps({EVENTS: {"0": -1, "1": PER_PARTITION + 5, "2": -1}})
    with pytest.raises(Exception, match=f"{EVENTS}-1") as raised:
        read(spark, events, endingOffsets=ending).collect()
    assert "endingOffsets" in str(raised.value)


def test_assign_reads_only_the_assigned_partitions(spark, events):
    """assign JSON reads exactly the partitions it names, with per-partition JSON offsets."""
    assert_positions(read(spark, events, assign=json.dumps({EVENTS: [0, 2]})),
                     positions(lambda r: r.partition in (0, 2)))
    assert_positions(read(spark, events, assign=json.dumps({EVENTS: [1]}),
                                 startingOffsets=json.dumps({EVENTS: {"1": 990}})),
                     positions(lambda r: r.partition == 1 and r.offset >= 990))


def test_subscribe_pattern_reads_the_matching_topics(spark, small_topics):
    """subscribePattern reads every partition of every topic whose whole name matches, and no other."""
    df = read(spark, small_topics, subscribePattern="pat-.*")
    assert_positions(df, small_positions("pat-a", "pat-b"))
    values = sorted(bytes(r.value).decode() for r in df.select("value").collect())
    assert values == sorted(f"{t}/{n}" for t, c in (("pat-a", 2), ("pat-b", 1)) for n in range(4 * c))


def test_subscribe_to_several_topics(spark, small_topics):
    """subscribe with a comma list reads every listed topic, once even if listed twice."""
    assert_positions(read(spark, small_topics, subscribe="pat-a, other"), small_positions("pat-a", "other"))
    assert_positions(read(spark, small_topics, subscribe="other,pat-b,other"), small_positions("other", "pat-b"))


@pytest.mark.parametrize("bootstrap_option", ["kafka.bootstrap.servers", "bootstrap.servers"])
def test_both_bootstrap_option_spellings(spark, events, bootstrap_option):
    """kafka.bootstrap.servers and bootstrap.servers both name the brokers."""
    ending = json.dumps({EVENTS: {"0": 3, "1": 3, "2": 3}})
    df = read(spark, events, bootstrap_option=bootstrap_option, endingOffsets=ending)
    assert_positions(df, positions(lambda r: r.offset < 3))


# -- filter pushdown -------------------------------------------------------------------------------


def batch_reader(bootstrap: str, **options: str) -> PymqBatchReader:
    return PymqBatchReader(SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": EVENTS, **options},
                                               streaming=False))


@pytest.fixture(scope="module")
def small_batches(source_broker: BrokerProcess) -> str:
    """Topic `small-batches`: one partition of 2000 records in 100 batches of 20, record n at BASE_MS + 10 n."""
    with Admin(source_broker.bootstrap) as admin:
        admin.create_topic("small-batches", partitions=1, configs=KEEP)
    produce_batches(source_broker.bootstrap, "small-batches", batches=100, per_batch=20, value_bytes=200)
    return source_broker.bootstrap


def fetched(options: SourceOptions, ranges: list[OffsetRange]) -> tuple[RangeStats, list[int]]:
    """Read `ranges` as a Spark task would: the stats summed and the offsets read."""
    total, offsets = RangeStats(), []
    for r in ranges:
        stats = RangeStats()
        for batch in read_offset_range(options, r, stats):
            offsets.extend(batch.column("offset").to_pylist())
        total.fetches += stats.fetches
        total.bytes_fetched += stats.bytes_fetched
        total.records += stats.records
    return total, offsets


def test_range_read_fetches_no_batch_past_its_end(small_batches):
    """Reading [0, 20) fetches about one batch's bytes, not the partition."""
    options = SourceOptions.parse({"bootstrap.servers": small_batches, "subscribe": "small-batches"}, streaming=False)
    one, offsets = fetched(options, [OffsetRange("small-batches", 0, 0, 20)])
    whole, _ = fetched(options, [OffsetRange("small-batches", 0, 0, 2000)])
    assert offsets == list(range(20))
    assert one.bytes_fetched < 3 * whole.bytes_fetched / 100, (one, whole)


def test_small_fetches_read_every_record_once_in_order(spark, small_batches):
    """kafka.max.partition.fetch.bytes below a batch's size: one batch per fetch, every row once and in order."""
    df = read(spark, small_batches, subscribe="small-batches", **{"kafka.max.partition.fetch.bytes": "1024"})
    assert [r.offset for r in df.select("offset").collect()] == list(range(2000))


SPARK_FILTERS = [
    ("offset >= 10 AND offset < 20 AND partition = 1", lambda r: 10 <= r.offset < 20 and r.partition == 1),
    ("offset > 995", lambda r: r.offset > 995),
    ("offset <= 2 OR offset >= 998", lambda r: r.offset <= 2 or r.offset >= 998),
    ("partition IN (0, 2) AND offset IN (5, 7, 900)", lambda r: r.partition in (0, 2) and r.offset in (5, 7, 900)),
    ("partition != 1 AND offset < 4", lambda r: r.partition != 1 and r.offset < 4),
    (f"timestamp >= timestamp_millis({ts_of(2990)})", lambda r: r.ts >= ts_of(2990)),
    (f"timestamp > timestamp_millis({ts_of(2990)})", lambda r: r.ts > ts_of(2990)),
    (f"timestamp = timestamp_millis({ts_of(1234)})", lambda r: r.ts == ts_of(1234)),
    (f"timestamp < timestamp_millis({ts_of(12)}) AND partition = 2", lambda r: r.ts < ts_of(12) and r.partition == 2),
    ("timestamp >= '2023-11-14 22:13:49.5'", lambda r: r.ts >= BASE_MS + 29_500),
    ("key IS NULL AND offset < 100", lambda r: r.key is None and r.offset < 100),
    # Bounds before the epoch: -1 and -2 are ListOffsets' latest/earliest, other negatives invalid.
    ("timestamp >= timestamp_millis(-1) AND offset < 3", lambda r: r.offset < 3),
    ("timestamp > timestamp_millis(-5000) AND offset < 3", lambda r: r.offset < 3),
]


@pytest.mark.parametrize("condition, where", SPARK_FILTERS, ids=[c for c, _ in SPARK_FILTERS])
def test_spark_filters_return_exactly_the_matching_rows(spark, events, condition, where):
    """A Spark filter on offset, partition or timestamp (pushed down or not) returns exactly the matching rows."""
    assert_positions(read(spark, events).filter(condition), positions(where))


def _random_predicate(rng: random.Random) -> tuple[str, Callable[[Rec], bool]]:
    """One predicate of the kinds Spark hands to the source (partition, offset, timestamp, key)."""
    p, o, i = rng.randrange(PARTITIONS), rng.randrange(PER_PARTITION + 1), rng.randrange(N + 1)
    a, b = sorted(rng.sample(range(PARTITIONS), 2))
    return rng.choice([
        (f"partition = {p}", lambda r: r.partition == p),
        (f"partition IN ({a}, {b})", lambda r: r.partition in (a, b)),
        (f"offset >= {o}", lambda r: r.offset >= o),
        (f"offset < {o}", lambda r: r.offset < o),
        (f"offset = {o}", lambda r: r.offset == o),
        (f"timestamp >= timestamp_millis({ts_of(i)})", lambda r: r.ts >= ts_of(i)),
        (f"timestamp < timestamp_millis({ts_of(i)})", lambda r: r.ts < ts_of(i)),
        ("key IS NULL", lambda r: r.key is None),
    ])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_dataframe_answers_each_query_with_its_own_filters(spark, events, seed):
    """One DataFrame, queried with a random sequence of filters (and unfiltered in between):
    each answer is exactly the full result filtered, whatever the queries before it pushed."""
    df = read(spark, events)
    assert_positions(df, positions())  # the full result is RECORDS: each answer is RECORDS filtered
    rng = random.Random(seed)
    for _ in range(4):
        predicates = [_random_predicate(rng) for _ in range(rng.randint(1, 3))]
        condition = " AND ".join(sql for sql, _ in predicates)
        assert_positions(df.filter(condition), positions(lambda r: all(match(r) for _, match in predicates)))
        assert df.count() == N, f"unfiltered count after {condition!r}"
    assert_positions(df, positions())


def test_two_differently_filtered_views_of_one_dataframe_in_one_query(spark, events):
    """A union of two filters on the same DataFrame: each side reads its own rows."""
    df = read(spark, events)
    both = df.filter("partition = 0 AND offset < 10").unionByName(df.filter("partition = 2 AND offset >= 990"))
    assert_positions(both, positions(lambda r: (r.partition == 0 and r.offset < 10)
                                     or (r.partition == 2 and r.offset >= 990)))


def test_timestamp_filter_with_out_of_order_create_times(spark, source_broker, topic_name):
    """With CreateTime out of order, timestamp >= t still returns every matching row (earlier offsets may match)."""
    with Admin(source_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, configs=KEEP)
    shuffled = {n: BASE_MS + ((n * 37) % 200) * 1000 for n in range(200)}
    produce_batches(source_broker.bootstrap, topic_name, batches=10, per_batch=20, value_bytes=10,
                    timestamp=shuffled.__getitem__)
    at = BASE_MS + 150_000
    df = read(spark, source_broker.bootstrap, subscribe=topic_name).filter(F.col("timestamp") >= utc(at))
    assert_df_equality(df.select("offset"), spark.createDataFrame(
        [(n,) for n, t in shuffled.items() if t >= at], "offset long"), ignore_row_order=True)


# -- splitting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("min_partitions", [2, 4, 7, 10])
def test_min_partitions_splits_ranges_and_reads_every_row_once(spark, events, min_partitions):
    """minPartitions gives at least that many Spark partitions (never fewer than topic partitions), each row once."""
    df = read(spark, events, minPartitions=str(min_partitions))
    assert df.rdd.getNumPartitions() >= max(min_partitions, PARTITIONS)
    assert df.rdd.getNumPartitions() <= max(min_partitions, PARTITIONS) + PARTITIONS
    assert_positions(df, positions())


def test_max_records_per_partition_splits_ranges_and_reads_every_row_once(spark, events):
    """maxRecordsPerPartition cuts every range to at most that many offsets; each row is read once."""
    plan = batch_reader(events, maxRecordsPerPartition="300").plan()
    assert len(plan) == PARTITIONS * math.ceil(PER_PARTITION / 300)
    assert all(r.size <= 300 for r in plan)
    df = read(spark, events, maxRecordsPerPartition="300")
    assert df.rdd.getNumPartitions() == len(plan)
    assert_positions(df, positions())
    seen: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        seen.setdefault(row.partition, []).append(row.offset)
    assert seen == {p: list(range(PER_PARTITION)) for p in range(PARTITIONS)}


def test_split_ranges_by_max_records():
    """split_ranges cuts each range into equal pieces of at most max_records, in (topic, partition, offset) order."""
    ranges = [OffsetRange("b", 0, 0, 10), OffsetRange("a", 1, 5, 5), OffsetRange("a", 0, 100, 107)]
    assert split_ranges(ranges, None, 4) == [
        OffsetRange("a", 0, 100, 103), OffsetRange("a", 0, 103, 107),
        OffsetRange("b", 0, 0, 3), OffsetRange("b", 0, 3, 6), OffsetRange("b", 0, 6, 10)]
    assert split_ranges(ranges, None, None) == [OffsetRange("a", 0, 100, 107), OffsetRange("b", 0, 0, 10)]
    assert split_ranges([], 5, 10) == []


@pytest.mark.parametrize("sizes, min_partitions", [
    ((1000, 1000, 1000), 4), ((1000, 1000, 1000), 7), ((10, 990), 5), ((1, 1, 1), 10), ((500, 3), 4), ((7,), 3),
])
def test_split_ranges_reaches_min_partitions(sizes, min_partitions):
    """split_ranges makes at least min_partitions pieces (at most one per offset), covering each range exactly."""
    ranges = [OffsetRange("t", p, 0, size) for p, size in enumerate(sizes)]
    out = split_ranges(ranges, min_partitions, None)
    assert len(out) >= min(min_partitions, sum(sizes))
    assert len(out) <= max(min_partitions, len(sizes)) + len(sizes)
    for p, size in enumerate(sizes):
        pieces = [r for r in out if r.partition == p]
        assert pieces[0].start == 0 and pieces[-1].end == size
        assert all(a.end == b.start and a.size > 0 for a, b in zip(pieces, pieces[1:]))


# -- failOnDataLoss --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retention_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose retention runs every 100 ms and deletes files at once."""
    process = BrokerProcess(tmp_path_factory.mktemp("retention-broker"),
                            {"log.retention.check.interval.ms": 100, "file.delete.delay.ms": 0}).start()
    yield process
    process.kill()


@pytest.fixture(scope="module")
def retained(retention_broker: BrokerProcess) -> tuple[str, str, int, int]:
    """Topic `retained` (1 partition, 4 KiB segments, 8 KiB retention) of 600 records after
    retention deleted its first segments: (bootstrap, topic, log start, end)."""
    bootstrap, topic = retention_broker.bootstrap, "retained"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1, configs={**KEEP, "segment.bytes": 4096})
        produce_batches(bootstrap, topic, batches=60, per_batch=10, value_bytes=100)
        # Retention set once every record is in: its first pass deletes every segment it ever
        # will, so the start it leaves is final (no pass mid-production, none to wait out).
        admin.alter_configs(topic, {"retention.bytes": 8192})
        start = wait_until(lambda: admin.list_offsets({(topic, 0): EARLIEST})[(topic, 0)][0], 120,
                           "retention moved the log start")
        end = admin.list_offsets({(topic, 0): LATEST})[(topic, 0)][0]
    assert 0 < start < end == 600
    return bootstrap, topic, start, end


def test_fail_on_data_loss_true_names_topic_partition_and_offsets(spark, retained):
    """failOnDataLoss=true (the default): reading deleted offsets fails naming topic, partition and the offsets."""
    bootstrap, topic, start, end = retained
    for extra in ({}, {"failOnDataLoss": "true"}):
        df = read(spark, bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0}}), **extra)
        with pytest.raises(Exception) as raised:
            df.collect()
        text = str(raised.value)
        assert f"{topic}-0" in text and f"0..{start - 1}" in text and "failOnDataLoss" in text, text[-2000:]


def test_fail_on_data_loss_false_returns_the_remaining_rows(spark, retained):
    """With failOnDataLoss=false, a read from a deleted offset returns every record still in the log, once."""
    bootstrap, topic, start, end = retained
    df = read(spark, bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0}}), failOnDataLoss="false")
    assert_df_equality(df.select("offset", "value"), spark.createDataFrame(
        [(o, f"{o:08d}".encode().ljust(100, b".")) for o in range(start, end)], "offset long, value binary"),
        ignore_row_order=True)
    # The task-level reader counts what it skipped.
    options = SourceOptions.parse({"bootstrap.servers": bootstrap, "subscribe": topic, "failOnDataLoss": "false"},
                                  streaming=False)
    stats = RangeStats()
    rows = sum(b.num_rows for b in read_offset_range(options, OffsetRange(topic, 0, 0, end), stats))
    assert (rows, stats.lost, stats.records) == (end - start, start, end - start)
