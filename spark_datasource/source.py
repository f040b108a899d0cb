"""The `pymq` Spark data source.

Name: `pymq`, registered in every session by Spark itself once pymq is installed (`pyspark_pymq`);
`register(spark)` does it for a session that switches Spark's static registration off.

    df = (spark.read.format("pymq")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")   # or "bootstrap.servers"
          .option("subscribe", "orders")
          .load())

Schema: the Spark Kafka source's (`schema.py`). Options: `options.py`. Partitioning: one task
per topic-partition offset range, split by size (`ranges.py`). No filter is pushed down: Spark
4.2 shares one planned read among all the queries of a DataFrame (`batch_reader.py`).
"""
from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from spark_datasource.batch_reader import PymqBatchReader
from spark_datasource.options import InvalidOptionError, SourceOptions, include_headers
from spark_datasource.schema import spark_schema
from spark_datasource.stream_reader import PymqStreamReader
from spark_datasource.writer import PymqArrowWriter, PymqStreamArrowWriter, SinkOptions


class PymqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pymq"

    def schema(self) -> StructType:
        return spark_schema(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = SourceOptions.parse(self.options, streaming=False)
        _fixed_schema(schema, options.include_headers)
        return PymqBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options, streaming=True)
        _fixed_schema(schema, options.include_headers)
        return PymqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _append_only(overwrite)
        return PymqArrowWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _append_only(overwrite)
        return PymqStreamArrowWriter(SinkOptions.parse(self.options, schema))


def _fixed_schema(schema: StructType, headers: bool) -> None:
    """Spark passes a user-specified schema (`.schema(...)`) instead of `schema()`'s: the rows are
    always the source's columns, so another schema would fail every task with a schema mismatch."""
    expected = spark_schema(headers)
    if schema.simpleString() != expected.simpleString():
        raise InvalidOptionError(f"format pymq has a fixed schema and cannot be set with a custom one: "
                                 f"{expected.simpleString()} (includeHeaders={str(headers).lower()}); "
                                 f"given {schema.simpleString()}")


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise InvalidOptionError("the pymq sink appends to topics: use mode 'append' (a topic cannot be overwritten; "
                                 "delete and re-create it to start over)")


def register(spark: SparkSession) -> None:
    """Make `format("pymq")` available in `spark` when Spark's static registration is off
    (`spark.sql.pyspark.dataSource.staticImport.enabled=false`). Idempotent, and harmless where the
    static registration already made it available: the same class under the same name. Spark 4.2
    refused DATA_SOURCE_ALREADY_EXISTS in a `newSession()` of a session that had registered it,
    with the static registration not finding pymq: that registration is this same source, kept."""
    try:
        spark.dataSource.register(PymqDataSource)
    except AnalysisException as err:
        if err.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
