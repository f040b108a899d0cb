"""Writes with `df.write.format("pymq")` and `df.writeStream.format("pymq")` against a real broker:
every row lands once, on the partition a `partition` column or the producer's key partitioner
picks, in the topic the `topic` option (or else the `topic` column) names; keys, values and
headers read back equal to what was written; bad input fails with a message naming the problem.
"""
from __future__ import annotations

import re

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from client import Admin
from client.partitioner import partition_for_key
from tests.helpers.streaming import batches_with_rows, run_to_end

HEADERS = "array<struct<key:string,value:binary>>"


@pytest.fixture
def bootstrap(source_broker) -> str:
    return source_broker.bootstrap


def create_topics(bootstrap: str, partitions: int, *names: str) -> None:
    with Admin(bootstrap) as admin:
        for name in names:
            admin.create_topic(name, partitions=partitions)


def write(df, bootstrap: str, **options: object):
    writer = df.write.format("pymq").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        writer = writer.option(name, str(value))
    return writer


def read(spark, bootstrap: str, topic: str, include_headers: bool = False):
    return (spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("includeHeaders", str(include_headers).lower()).load())


def as_text(df):
    """key and value as strings (what the tests wrote), plus where each row landed."""
    return df.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                     "topic", "partition")


def keyed_rows(spark, n: int):
    return spark.createDataFrame([(f"user-{i % 7}", f"event-{i}") for i in range(n)], "key string, value string")


# -- batch writes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "binary"])
def test_batch_write_keyed_rows_round_trip(spark, bootstrap, topic_name, kind):
    """A batch write of string or binary key/value rows lands every row once, keyed rows on the producer partitioner's partition, and reads back equal."""
    create_topics(bootstrap, 3, topic_name)
    rows = keyed_rows(spark, 40)
    df = rows.select(F.col("key").cast(kind).alias("key"), F.col("value").cast(kind).alias("value"))
    write(df, bootstrap, topic=topic_name).save()

    back = read(spark, bootstrap, topic_name)
    assert_df_equality(back.select("key", "value"), df.select(F.col("key").cast("binary"), F.col("value").cast("binary")),
                       ignore_row_order=True, ignore_nullable=True)
    for row in as_text(back).collect():
        assert row["topic"] == topic_name
        assert row["partition"] == partition_for_key(row["key"].encode(), 3, "murmur2"), row  # Kafka's placement


def test_batch_write_partition_column(spark, bootstrap, topic_name):
    """Rows with a partition column land on that partition; rows whose partition is null go by key."""
    create_topics(bootstrap, 3, topic_name)
    df = spark.createDataFrame(
        [(f"k{i}", f"v{i}", None if i % 4 == 3 else i % 3) for i in range(24)], "key string, value string, partition int")
    write(df, bootstrap, topic=topic_name).save()

    landed = {r["value"]: r["partition"] for r in as_text(read(spark, bootstrap, topic_name)).collect()}
    wanted = {r["value"]: r["partition"] if r["partition"] is not None else partition_for_key(r["key"].encode(), 3, "murmur2")
              for r in df.collect()}
    assert landed == wanted


def test_topic_column_and_topic_option(spark, bootstrap, topic_name):
    """The topic column routes each row to its topic; a topic option wins over the column."""
    first, second, override = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-c"
    create_topics(bootstrap, 2, first, second, override)
    df = spark.createDataFrame([(f"v{i}", first if i % 3 else second) for i in range(15)], "value string, topic string")

    write(df, bootstrap).save()
    for topic in (first, second):
        got = read(spark, bootstrap, topic).select(F.col("value").cast("string").alias("value"))
        assert_df_equality(got, df.filter(F.col("topic") == topic).select("value"), ignore_row_order=True,
                           ignore_nullable=True)

    write(df, bootstrap, topic=override).save()
    got = read(spark, bootstrap, override).select(F.col("value").cast("string").alias("value"))
    assert_df_equality(got, df.select("value"), ignore_row_order=True, ignore_nullable=True)
    assert read(spark, bootstrap, first).count() == 10 and read(spark, bootstrap, second).count() == 5


def test_headers_round_trip(spark, bootstrap, topic_name):
    """A headers column (array of key/value structs, nulls and empty arrays included) reads back unchanged with includeHeaders."""
    create_topics(bootstrap, 1, topic_name)
    data = [
        ("a", [("trace", b"t-1"), ("source", b"web")]),
        ("b", []),
        ("c", None),
        ("d", [("empty", None), ("dup", b"1"), ("dup", b"2")]),
    ]
    df = spark.createDataFrame(data, f"value string, headers {HEADERS}")
    write(df, bootstrap, topic=topic_name).save()

    back = read(spark, bootstrap, topic_name, include_headers=True)
    assert_df_equality(back.select(F.col("value").cast("string").alias("value"), "headers"), df,
                       ignore_row_order=True, ignore_nullable=True)


def test_a_save_without_append_mode_names_the_fix(spark, bootstrap, topic_name):
    """Spark refuses its default mode (ErrorIfExists) for Python data sources before the sink is
    asked: its error names Append; the sink itself refuses Overwrite, saying why."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match='"Append"'):
        df.write.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).save()
    with pytest.raises(Exception, match="appends to topics: use mode 'append'"):
        (df.write.format("pymq").mode("overwrite").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic_name).save())
    assert read(spark, bootstrap, topic_name).count() == 0


def test_include_headers_false_leaves_the_headers_column_out(spark, bootstrap, topic_name):
    """`includeHeaders` is one of Spark's Kafka sink options: true (the default) writes a headers
    column, false does not; anything else is refused by name."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.createDataFrame([("a", [("trace", b"t-1")])], f"value string, headers {HEADERS}")
    write(df, bootstrap, topic=topic_name, includeHeaders="false").save()
    write(df, bootstrap, topic=topic_name, includeHeaders="TRUE").save()
    got = sorted((r["offset"], r["headers"]) for r in read(spark, bootstrap, topic_name, include_headers=True).collect())
    # In offset order (each write's transaction leaves a commit marker's offset between them).
    assert [[tuple(h) for h in hs or []] for _, hs in got] == [[], [("trace", b"t-1")]]
    with pytest.raises(Exception, match="includeHeaders.*must be 'true' or 'false'"):
        write(df, bootstrap, topic=topic_name, includeHeaders="yes").save()


def test_headers_built_with_functions(spark, bootstrap, topic_name):
    """Headers built with F.array/F.struct of literals (non-nullable fields) are accepted and round-trip."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.range(3).select(
        F.col("id").cast("string").alias("value"),
        F.array(F.struct(F.lit("id").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))).alias("headers"))
    write(df, bootstrap, topic=topic_name).save()
    got = {r["value"].decode(): [tuple(h) for h in r["headers"]]
           for r in read(spark, bootstrap, topic_name, include_headers=True).collect()}
    assert got == {str(i): [("id", str(i).encode())] for i in range(3)}


# -- streaming writes -------------------------------------------------------------------------------


def test_stream_write_from_a_pymq_topic(spark, bootstrap, topic_name, tmp_path):
    """A streaming write (pymq topic to pymq topic, several micro-batches, named query) lands every row once and keeps each key's partition."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, 3, source, sink)
    rows = keyed_rows(spark, 30)
    write(rows, bootstrap, topic=source).save()

    stream = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 12).load()
              .select("key", "value"))
    query = (stream.writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).queryName(f"copy_{sink.replace('-', '_')}")
             .trigger(availableNow=True).start())
    assert batches_with_rows(run_to_end(query)) > 1

    written = as_text(read(spark, bootstrap, sink))
    assert_df_equality(written.select("key", "value"), rows, ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(written.select("key", "partition"), as_text(read(spark, bootstrap, source)).select("key", "partition"),
                       ignore_row_order=True, ignore_nullable=True)


def test_stream_write_with_topic_column(spark, bootstrap, topic_name, tmp_path):
    """A streaming write from a file stream routes rows by their topic and partition columns."""
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    create_topics(bootstrap, 2, first, second)
    source = tmp_path / "in"
    spark.createDataFrame([(f"v{i}", first if i % 2 else second, i % 2) for i in range(10)],
                          "value string, topic string, partition int").write.json(str(source))
    stream = spark.readStream.schema("value string, topic string, partition int").json(str(source))
    query = (stream.writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    landed = sorted((r["value"], r["topic"], r["partition"]) for r in as_text(
        read(spark, bootstrap, f"{first},{second}")).collect())
    assert landed == sorted((f"v{i}", first if i % 2 else second, i % 2) for i in range(10))


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("columns, options, message", [
    ("key string", {}, "the pymq sink needs a 'value' column (binary or string); the DataFrame has key"),
    ("value int", {}, "the pymq sink's column 'value' must be binary or string, not int"),
    ("value string, key int", {}, "the pymq sink's column 'key' must be binary or string, not int"),
    ("value string, partition bigint", {}, "the pymq sink's column 'partition' must be int, not bigint"),
    ("value string, topic binary", {"topic": None}, "the pymq sink's column 'topic' must be string, not binary"),
    ("value string, headers map<string,string>", {}, "the pymq sink's column 'headers' must be"),
    ("value string", {"topic": None}, "the pymq sink needs the 'topic' option or a 'topic' column (string)"),
    ("value string", {"retries": "3"}, "unknown option 'retries' for the pymq sink"),
    ("value string", {"kafka.no.such.setting": "1"}, "no.such.setting"),
])
@pytest.mark.slow
def test_write_refuses_bad_input(spark, bootstrap, topic_name, columns, options, message):
    """A write with a missing or mistyped column, no topic, or an unknown option fails naming the problem."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.createDataFrame([], columns)
    given = {"topic": topic_name, **options}
    with pytest.raises(Exception, match=re.escape(message)):
        write(df, bootstrap, **{k: v for k, v in given.items() if v is not None}).save()


def test_write_refuses_overwrite(spark, bootstrap, topic_name):
    """mode('overwrite') fails: a topic is only appended to."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=re.escape("the pymq sink appends to topics: use mode 'append'")):
        write(df, bootstrap, topic=topic_name).mode("overwrite").save()
    assert read(spark, bootstrap, topic_name).count() == 0


def test_write_refuses_missing_bootstrap(spark, topic_name):
    """A write without kafka.bootstrap.servers fails naming the option."""
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=re.escape("option 'kafka.bootstrap.servers' (or 'bootstrap.servers') is required")):
        df.write.format("pymq").mode("append").option("topic", topic_name).save()


def test_write_to_a_partition_that_does_not_exist_fails(spark, bootstrap, topic_name):
    """A row whose partition does not exist fails the task (rows are not dropped)."""
    create_topics(bootstrap, 2, topic_name)
    df = spark.createDataFrame([("ok", 1), ("lost?", 5)], "value string, partition int").coalesce(1)
    with pytest.raises(Exception, match=re.escape(f"partition 5 outside 0..1 of topic '{topic_name}'")):
        write(df, bootstrap, topic=topic_name).save()


def test_write_to_a_topic_that_does_not_exist_fails(spark, bootstrap, topic_name):
    """A write to a topic that does not exist fails the task naming the topic (topics are not created on write)."""
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=re.escape(f"unknown topic '{topic_name}'")):
        write(df, bootstrap, topic=topic_name).save()


def test_write_with_a_null_topic_fails(spark, bootstrap, topic_name):
    """A row whose topic column is null (and no topic option) fails the task naming the column."""
    create_topics(bootstrap, 1, topic_name)
    df = spark.createDataFrame([("a", topic_name), ("b", None)], "value string, topic string").coalesce(1)
    with pytest.raises(Exception, match=re.escape("a row has a null 'topic'")):
        write(df, bootstrap).save()


def test_stream_write_refuses_bad_input(spark, bootstrap, topic_name, tmp_path):
    """A streaming write without a value column fails naming the problem."""
    stream = spark.readStream.format("rate").option("rowsPerSecond", 1).load().select("timestamp")
    with pytest.raises(Exception, match=re.escape("the pymq sink needs a 'value' column")):
        query = (stream.writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", topic_name).option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
