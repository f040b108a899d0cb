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

from broker.client.consumer import FetchedBatch, to_record_batch

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


def to_rows(topic: str, partition: int, batches: list[FetchedBatch], schema: pa.Schema) -> pa.RecordBatch:
    """One partition's fetched batches as one Arrow batch of `schema` (from `arrow_schema`)."""
    records = [to_record_batch(topic, partition, fetched) for fetched in batches]
    if len(records) == 1:
        joined = records[0]
    else:
        joined = pa.Table.from_batches(records).combine_chunks().to_batches()[0]
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
