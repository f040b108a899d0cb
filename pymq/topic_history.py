"""`history(spark, topic, table=...)`: one DataFrame over a topic's whole history.

A table topic (`pymq table sync`) holds the history people query often as a Delta table that
Spark reads natively, at Parquet speed; the records the table has not caught up with yet are on
the brokers (and in the tier). `history` joins the two at the table's position, the offsets its
newest sync commit reached in each partition (spark_datasource/table_topic.py):

    table snapshot (version V)        offsets [log start, position)   read by Spark (Delta or Parquet)
    UNION ALL format("pymq") tail     offsets [position, latest)       read from brokers (and the tier)

so every record is in exactly one side: no duplicate and no gap at the seam, whatever each
partition's position is. The snapshot is read at the version the position was taken from, and the
tail ends at the log end offsets asked for at the same moment, so the result is one consistent
view: a sync committing or a producer writing meanwhile changes neither side. When the table has
caught up with every partition, the result is the snapshot alone (no tail is planned). The tail is decoded like the table (typed values,
`date`), and both sides have the table's columns.

Filters on the result prune the table's side, as Spark pushes them through the union: on
`timestamp` (read by Delta: the table's `date` partitions, generated from it, and its per-file
statistics; read as Parquet: each file's row-group statistics), on `date` (the table's
partitions), on `partition` and on `offset` (file or row-group statistics). The tail's offset
ranges are read whole and Spark filters its rows: the `pymq` source takes no pushed filter, since
Spark 4.2 serves one planned read to every query of a DataFrame (spark_datasource/batch_reader.py),
so the DataFrame `history` returns answers each query with its own filters however often it is
reused.
"""
from __future__ import annotations

import json
import os

from pyspark.sql import DataFrame, SparkSession

from client import Admin
from protocol import ISOLATION_LEVELS, READ_COMMITTED
from spark_datasource.options import EARLIEST
from spark_datasource.table_topic import TableTopic, TableTopicError, ValueFormat, to_table_rows, with_date

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def history(spark: SparkSession, topic: str | None = None, *, table: str | None = None, bootstrap: str | None = None,
            fail_on_data_loss: bool = True, include_headers: bool = False, table_reader: str = "auto",
            **source_options: str) -> DataFrame:
    """Every record of `topic`: from `table` (a table topic's path or URL) up to its position,
    from the brokers after it. Without a table, the whole topic from the brokers.

    `table_reader` reads the table's snapshot with Delta Lake (`delta`), as the snapshot's Parquet
    files (`parquet`), or picks (`auto`: Parquet for a local table of few files, where Delta's
    planning of each query would cost more than it saves; see TableTopic.snapshot).
    `source_options` are further `pymq` source options for the tail (`remoteStorage.url` to read
    its tiered part straight from the store, `kafka.request.timeout.ms`, ...)."""
    bootstrap = bootstrap or os.environ.get("PYMQ_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    if table is None:
        if topic is None:
            raise TableTopicError("history() needs a topic, a table, or both")
        return with_date(to_table_rows(_tail(spark, bootstrap, topic, "earliest", fail_on_data_loss, include_headers,
                                             source_options), ValueFormat(), include_headers))
    mirrored = TableTopic(spark, table)
    table_topic = mirrored.check_topic(topic)
    value_format, headers = mirrored.value_format()
    position = mirrored.position()
    with Admin(bootstrap) as admin:
        partitions = len(admin.describe_topics([table_topic])[0].partitions)
        # The tail's end as the tail reads (read_committed unless asked otherwise: its last stable offset).
        isolation = ISOLATION_LEVELS.get(source_options.get("kafka.isolation.level", "read_committed").lower(),
                                         READ_COMMITTED)
        ends = admin.list_offsets({(table_topic, p): -1 for p in range(partitions)}, isolation)
    starting = {p: position.offsets.get(p, EARLIEST) for p in range(partitions)}
    ending = {p: ends[(table_topic, p)][0] for p in range(partitions)}
    snapshot = mirrored.snapshot(position.version, table_reader)
    if all(ending[p] == starting[p] or (starting[p] == EARLIEST and ending[p] == 0) for p in range(partitions)):
        return snapshot  # the table holds everything: no tail to plan
    tail = _tail(spark, bootstrap, table_topic, _offsets_json(table_topic, starting), fail_on_data_loss, headers,
                 {"endingOffsets": _offsets_json(table_topic, ending), **source_options})
    return snapshot.unionByName(with_date(to_table_rows(tail, value_format, headers)).select(*snapshot.columns))


def _offsets_json(topic: str, offsets: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in offsets.items()}})


def _tail(spark: SparkSession, bootstrap: str, topic: str, starting: str, fail_on_data_loss: bool,
          include_headers: bool, source_options: dict[str, str]) -> DataFrame:
    return (spark.read.format("pymq")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", starting)
            .option("failOnDataLoss", str(fail_on_data_loss).lower())
            .option("includeHeaders", str(include_headers).lower())
            .options(**source_options)
            .load())
