"""The rows a `pymq` read produces: the Spark Kafka source's columns, built with Arrow kernels.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int [, headers array<struct<key string, value binary>>]   (includeHeaders=true)

`timestampType` is 0 for CreateTime and 1 for LogAppendTime, as in Kafka. A fetched batch becomes
rows without a per-record Python step: key, value and headers are the Arrow body's own columns,
the timestamp column is cast from milliseconds to Spark's microseconds, offsets are counted from
the batch's base offset (or taken from a compacted batch's offset_delta), and topic, partition and
timestamp type are constant columns.
"""
from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from client.decoder import FetchedBatch, to_record_batch

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
COLUMNS = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
COLUMNS_WITH_HEADERS = StructType([*COLUMNS.fields, StructField("headers", ArrayType(HEADER_TYPE))])


def spark_schema(include_headers: bool) -> StructType:
    return COLUMNS_WITH_HEADERS if include_headers else COLUMNS


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark checks each batch a reader yields against (exactly)."""
    return to_arrow_schema(spark_schema(include_headers), timezone="UTC")


# Fetched batches at least this long go to Spark as they are; shorter ones (a per-record producer
# makes batches of a few records) are joined into runs of about this many rows first, since Spark
# pays a fixed cost per Arrow batch. Joining copies the buffers, so large batches are never joined.
MIN_BATCH_ROWS = 16_384


def to_rows(topic: str, partition: int, batches: list[FetchedBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One partition's fetched batches as Arrow batches of `schema` (from `arrow_schema`)."""
    run: list[pa.RecordBatch] = []
    rows = 0
    for fetched in batches:
        records = to_record_batch(topic, partition, fetched)
        if records.num_rows >= MIN_BATCH_ROWS and not run:
            yield _project(records, schema)
            continue
        run.append(records)
        rows += records.num_rows
        if rows >= MIN_BATCH_ROWS:
            yield _project(_join(run), schema)
            run, rows = [], 0
    if run:
        yield _project(_join(run), schema)


def _join(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _project(joined: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """RECORD_SCHEMA rows as the source's columns: Spark's timestamp unit and int type."""
    columns = [
        joined.column("key"),
        joined.column("value"),
        joined.column("topic"),
        joined.column("partition"),
        joined.column("offset"),
        joined.column("timestamp").cast(schema.field("timestamp").type),
        joined.column("timestamp_type").cast(pa.int32()),
    ]
    if len(schema) == len(COLUMNS_WITH_HEADERS):
        columns.append(joined.column("headers").cast(schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
