"""A table topic: a topic mirrored into a Delta Lake table (docs/table-topics.md).

The table has the `pymq` source's columns, one row per record, plus `date`, the record's UTC date,
a generated column (`CAST(timestamp AS DATE)`) that partitions the table, so that a filter on
`timestamp` prunes whole dates without naming `date`:

    key binary, value <binary | struct>, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers ...] [, malformedValue binary], date date

With a value format other than `binary` the values are decoded once, at sync: `value` becomes a
struct of typed columns (`json` with a Spark DDL schema, or `arrow`: each value one Arrow IPC
stream of one row), and a value that does not decode keeps its bytes in `malformedValue` (null
otherwise), so nothing the topic holds is lost to a bad record.

What the table covers is in its own log: every append of the sync job is one Delta commit whose
`userMetadata` records the source offsets it reached (`{"pymq.offsets": {"partition": next}}`).
The latest such commit is the table's position; its rows are exactly the topic's records below
those offsets (compaction deletes and retention aside), which is what lets `history()` join the
table and the log's tail with no duplicate and no gap.

Table properties name the topic and the value format (`pymq.topic`, `pymq.valueFormat`,
`pymq.valueSchema`, `pymq.includeHeaders`), so readers of the table decode the tail the same way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, DataType, StringType, StructField, StructType

from spark_datasource.schema import spark_schema
from spark_datasource.table_log import OFFSETS_KEY, SnapshotFiles, TableLog, TablePosition, TableTopicError

VALUE_FORMATS = ("binary", "json", "arrow")
SNAPSHOT_READERS = ("auto", "delta", "parquet")
TOPIC_PROPERTY = "pymq.topic"
FORMAT_PROPERTY = "pymq.valueFormat"
SCHEMA_PROPERTY = "pymq.valueSchema"
HEADERS_PROPERTY = "pymq.includeHeaders"
DATE_COLUMN = "date"
MALFORMED_COLUMN = "malformedValue"
_CORRUPT_FIELD = "_pymq_corrupt"


@dataclass(frozen=True)
class ValueFormat:
    """How a topic's values become the table's `value` column."""

    kind: str = "binary"
    schema: StructType | None = None

    @classmethod
    def parse(cls, kind: str, ddl: str | None) -> "ValueFormat":
        """The format `kind` with the values' schema `ddl`. Spark parses the DDL: a session must
        be active (SparkSession.getActiveSession())."""
        if kind not in VALUE_FORMATS:
            raise TableTopicError(f"value format {kind!r} is not one of {', '.join(VALUE_FORMATS)}")
        if kind == "binary":
            if ddl:
                raise TableTopicError("a value schema needs a value format (json or arrow), not binary")
            return cls()
        if not ddl:
            raise TableTopicError(f"value format {kind} needs a value schema (a Spark DDL string such as "
                                  "'page STRING, user STRING, ms BIGINT')")
        try:
            schema = StructType.fromDDL(ddl)
        except Exception as err:  # Spark's parse errors have no common base class in PySpark
            raise TableTopicError(f"value schema {ddl!r} is not a Spark DDL struct: {err}") from None
        if kind == "arrow":
            to_arrow_schema(schema, timezone="UTC")  # fails early for types Arrow cannot carry
        return cls(kind, schema)

    @property
    def typed(self) -> bool:
        return self.kind != "binary"

    def ddl(self) -> str:
        return self.schema.simpleString()[len("struct<"):-1] if self.schema is not None else ""

    def value_type(self) -> DataType:
        return self.schema if self.schema is not None else BinaryType()


def table_schema(value_format: ValueFormat, include_headers: bool) -> StructType:
    """The table's columns before the generated `date`."""
    fields = [StructField(f.name, value_format.value_type() if f.name == "value" else f.dataType, f.nullable)
              for f in spark_schema(include_headers).fields]
    if value_format.typed:
        fields.append(StructField(MALFORMED_COLUMN, BinaryType()))
    return StructType(fields)


def to_table_rows(records: DataFrame, value_format: ValueFormat, include_headers: bool) -> DataFrame:
    """`format("pymq")` rows as the table's rows (without `date`, which Delta generates)."""
    if value_format.kind == "json":
        with_corrupt = StructType([*value_format.schema.fields, StructField(_CORRUPT_FIELD, StringType())])  # type: ignore[union-attr]
        parsed = F.from_json(F.col("value").cast("string"), with_corrupt,
                             {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT_FIELD})
        # from_json gives no struct at all (null, not a corrupt record) for an empty or blank
        # string and for JSON's `null`: those values did not decode either, and keep their bytes.
        malformed = F.col("value").isNotNull() & (F.col("_parsed").isNull()
                                                  | F.col(f"_parsed.{_CORRUPT_FIELD}").isNotNull())
        records = (records.withColumn("_parsed", parsed)
                   .withColumn(MALFORMED_COLUMN, F.when(malformed, F.col("value")))
                   .withColumn("value", F.when(~malformed, F.col("_parsed").dropFields(_CORRUPT_FIELD)))
                   .drop("_parsed"))
    elif value_format.kind == "arrow":
        schema = table_schema(value_format, include_headers)
        records = records.mapInArrow(_arrow_decoder(value_format.schema, schema), schema)  # type: ignore[arg-type]
    return records.select(*table_schema(value_format, include_headers).fieldNames())


def with_date(rows: DataFrame) -> DataFrame:
    """Table rows with the generated `date`, as the table itself returns them."""
    return rows.withColumn(DATE_COLUMN, _date(F.col("timestamp")))


def _date(timestamp: Column) -> Column:
    return timestamp.cast("date")


def _arrow_decoder(value_schema: StructType, schema: StructType):  # noqa: ANN202 - a mapInArrow function
    """Decodes each value, an Arrow IPC stream of one row, into the `value` struct. Arrow has no
    kernel over many IPC streams, so this is the one per-record step of a sync; a value that is
    not such a stream (or does not cast to the schema) goes to `malformedValue`."""
    value_type = to_arrow_schema(value_schema, timezone="UTC")
    target = to_arrow_schema(schema, timezone="UTC")

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            values = batch.column("value")
            rows, malformed = [], []
            for raw in values.to_pylist():
                row = _one_row(raw, value_type)
                rows.append(row)
                malformed.append(raw if row is None and raw is not None else None)
            struct = pa.array(rows, type=pa.struct(list(value_type)))
            columns = {name: batch.column(name) for name in batch.schema.names}
            columns["value"] = struct
            columns[MALFORMED_COLUMN] = pa.array(malformed, pa.binary())
            yield pa.RecordBatch.from_arrays([columns[f.name] for f in target], schema=target)

    return decode


def _one_row(raw: bytes | None, value_type: pa.Schema) -> dict | None:
    if raw is None:
        return None
    try:
        table = pa.ipc.open_stream(raw).read_all()
        if table.num_rows != 1:
            return None
        return table.select(value_type.names).cast(value_type).to_pylist()[0]
    except (pa.ArrowException, KeyError, ValueError):
        return None


class TableTopic:
    """One Delta table mirroring one topic, at a path or URL (`/data/t`, `s3a://bucket/t`)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark = spark
        # A local path is made absolute: Delta takes a relative one for a table name.
        self.location = location.rstrip("/") if "://" in location else str(Path(location).resolve())
        hadoop = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self.log = TableLog.of(self.location, hadoop.get)
        self._properties: dict[str, str] | None = None  # read once: they never change after create

    @property
    def checkpoint(self) -> str:
        """The sync query's default checkpoint: inside the table, where Delta never looks
        (folders starting with `_`)."""
        return f"{self.location}/_pymq_sync_checkpoint"

    def exists(self) -> bool:
        return self.log.exists()

    def delta(self) -> DeltaTable:
        """The table for Spark's operations on it (delete, merge, vacuum)."""
        if not self.exists():
            raise TableTopicError(f"{self.location} is not a Delta table (has `pymq table sync` run?)")
        return DeltaTable.forPath(self.spark, self.location)

    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = self.log.properties()
        return self._properties

    def topic(self) -> str:
        topic = self.properties().get(TOPIC_PROPERTY)
        if not topic:
            raise TableTopicError(f"the Delta table at {self.location} is not a table topic (no {TOPIC_PROPERTY})")
        return topic

    def check_topic(self, topic: str | None) -> str:
        """The table's topic, which must be `topic` when one is named."""
        mirrored = self.topic()
        if topic is not None and topic != mirrored:
            raise TableTopicError(f"the table at {self.location} mirrors topic {mirrored!r}, not {topic!r}")
        return mirrored

    def value_format(self) -> tuple[ValueFormat, bool]:
        props = self.properties()
        return (ValueFormat.parse(props.get(FORMAT_PROPERTY, "binary"), props.get(SCHEMA_PROPERTY) or None),
                props.get(HEADERS_PROPERTY, "false") == "true")

    def create(self, topic: str, value_format: ValueFormat, include_headers: bool) -> None:
        """Create the table, or check that the one there mirrors `topic` the same way."""
        if self.exists():
            props = self.properties()
            wanted = {TOPIC_PROPERTY: topic, FORMAT_PROPERTY: value_format.kind, SCHEMA_PROPERTY: value_format.ddl(),
                      HEADERS_PROPERTY: str(include_headers).lower()}
            differs = {k: (props.get(k, ""), v) for k, v in wanted.items() if props.get(k, "") != v}
            if differs:
                raise TableTopicError(f"the table at {self.location} mirrors another topic or format: " + "; ".join(
                    f"{k} is {have!r}, not {want!r}" for k, (have, want) in differs.items()))
            return
        builder = (DeltaTable.createIfNotExists(self.spark).location(self.location)
                   .addColumns(table_schema(value_format, include_headers))
                   .addColumn(DATE_COLUMN, "DATE", generatedAlwaysAs="CAST(timestamp AS DATE)")
                   .partitionedBy(DATE_COLUMN)
                   .property(TOPIC_PROPERTY, topic)
                   .property(FORMAT_PROPERTY, value_format.kind)
                   .property(HEADERS_PROPERTY, str(include_headers).lower()))
        if value_format.typed:
            builder = builder.property(SCHEMA_PROPERTY, value_format.ddl())
        builder.execute()

    def position(self) -> TablePosition:
        """The table's latest version and the offsets of the newest sync commit at or below it
        (offsets {} when nothing was synced yet)."""
        return self.log.position()

    def snapshot(self, version: int, reader: str = "auto") -> DataFrame:
        """The table's rows at `version`, read by `reader`: `delta` (Delta Lake's reader), `parquet`
        (the version's files, listed by the log, read by Spark's Parquet reader) or `auto`.

        Delta plans every query over a snapshot with a Spark job that picks the files to scan
        (~0.2 s on a local session, whatever the rows), which a Parquet read of named files does
        not have. That job pays off when it skips files by their statistics without opening them:
        on object stores, and over many files. So `auto` reads a local table's files as Parquet
        while they are few enough for Spark to list on the driver without a job of its own
        (`spark.sql.sources.parallelPartitionDiscovery.threshold`, 32), and by Delta otherwise.
        Either way the rows are the same: tables whose files Parquet alone would read differently
        (deletion vectors, column mapping) are always read by Delta."""
        if reader not in SNAPSHOT_READERS:
            raise TableTopicError(f"table reader {reader!r} is not one of {', '.join(SNAPSHOT_READERS)}")
        if reader != "delta":
            limit = int(self.spark.conf.get("spark.sql.sources.parallelPartitionDiscovery.threshold") or 32)
            files = self.log.snapshot_files(version, limit if reader == "auto" else None)
            if files.needs_delta is None:
                return self._read_files(files)
            if reader == "parquet":
                raise TableTopicError(f"the table at {self.location} cannot be read as plain Parquet: {files.needs_delta}")
        return self.spark.read.format("delta").option("versionAsOf", version).load(self.location)

    def _read_files(self, files: SnapshotFiles) -> DataFrame:
        # The log's schema without Delta's field metadata (generation expressions), as Delta's reader returns it.
        schema = StructType([StructField(f.name, f.dataType, f.nullable)
                             for f in StructType.fromJson(files.schema).fields])
        if not files.paths:
            return self.spark.createDataFrame([], schema)
        return (self.spark.read.schema(schema).option("basePath", self.location)
                .parquet(*(f"{self.location}/{path}" for path in files.paths)))


def sync_metadata(offsets: dict[int, int], batch_id: int) -> str:
    """The `userMetadata` of a sync commit."""
    return json.dumps({OFFSETS_KEY: {str(p): o for p, o in sorted(offsets.items())}, "pymq.batchId": batch_id})

