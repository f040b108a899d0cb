"""`pymq table sync TOPIC --table PATH_OR_URL`: mirror a topic into a Delta Lake table, exactly once.

A Structured Streaming query reads the topic with `format("pymq")` and hands each micro-batch to
`BatchWriter`, which appends it to the table (spark_datasource/table_topic.py for the table's layout):

- **Exactly once.** The append is one Delta commit made idempotent by Delta's own transaction
  ids: `txnAppId` is the query's id (stable across restarts of one checkpoint, new for a new
  checkpoint) and `txnVersion` the batch id, so a batch replayed after a crash (the source is
  replayable: Spark re-reads the same offsets) is skipped by Delta if its commit had landed. The
  commit's `userMetadata` records the offsets the batch ends at, read from the query's offset log
  (written before the batch runs), so the table always says which records it holds.
- **Compacted topics** (`cleanup.policy` with `compact`): after the append, each tombstone
  (a null value with a key) deletes the key's earlier rows in its partition (a Delta MERGE). A
  replay repeats the delete, which then finds nothing: deletes are idempotent by nature. The
  deleted rows' Parquet files stay until `pymq job retention --execute` vacuums them.
- The checkpoint defaults to `_pymq_sync_checkpoint` inside the table (Delta ignores `_` folders).

Run it once to catch up (`--trigger available-now`, the default) or continuously
(`--trigger 30s`). Tables live on a local path or any Hadoop URL (`s3a://bucket/table`, with
`-c spark.hadoop.fs.s3a.endpoint=...` and credentials as Spark settings).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import click
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from rich.table import Table

from client import Admin
from common.cli_options import KeyValue, bootstrap, bootstrap_option
from common.cli_options import console as cli_console
from common.cli_options import spark_conf_option
from spark_datasource.session import local_spark
from spark_datasource.table_log import OFFSETS_KEY
from spark_datasource.table_topic import TableTopic, ValueFormat, sync_metadata, to_table_rows

console = cli_console(stderr=True)


@dataclass(frozen=True)
class SyncOptions:
    topic: str
    table: str
    bootstrap: str
    value_format: ValueFormat = ValueFormat()
    include_headers: bool = False
    checkpoint: str | None = None
    trigger: str = "available-now"  # or a processing interval such as "30 seconds"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    source_options: dict[str, str] = field(default_factory=dict)


def is_compacted(bootstrap: str, topic: str) -> bool:
    with Admin(bootstrap) as admin:
        configs = admin.describe_configs([topic])[topic]
    return "compact" in str(configs.get("cleanup.policy", {}).get("value", ""))


class BatchWriter:
    """The `foreachBatch` function: one idempotent Delta append per micro-batch (plus, for
    compacted topics, the tombstones' deletes)."""

    def __init__(self, table: TableTopic, options: SyncOptions, checkpoint: str, compacted: bool) -> None:
        self.table = table
        self.options = options
        self.checkpoint = checkpoint
        self.compacted = compacted
        self._app_id: str | None = None
        self.batches: list[dict[str, Any]] = []

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        offsets = self.batch_end(batch_id)
        if self.compacted:
            records = records.persist()
        try:
            rows = to_table_rows(records, self.options.value_format, self.options.include_headers)
            (rows.write.format("delta").mode("append")
             .option("txnAppId", self.app_id())
             .option("txnVersion", batch_id)
             .option("userMetadata", sync_metadata(offsets, batch_id))
             .save(self.table.location))
            deleted = self.apply_tombstones(records) if self.compacted else 0
        finally:
            if self.compacted:
                records.unpersist()
        metrics = self.append_metrics(batch_id)
        done = {"batch": batch_id, "rows": metrics.get("numOutputRows", 0), "deleted": deleted,
                "offsets": offsets, "seconds": time.perf_counter() - started}
        self.batches.append(done)
        console.print(f"batch {batch_id}: {int(done['rows']):,} rows"
                      + (f", {deleted:,} deleted by tombstones" if self.compacted else "")
                      + f" -> offsets {json.dumps(offsets)} ({done['seconds']:.1f}s)")

    def apply_tombstones(self, records: DataFrame) -> int:
        """Delete the earlier rows of each key that this batch tombstones (in its partition)."""
        tombstones = (records.where(F.col("value").isNull() & F.col("key").isNotNull())
                      .groupBy("partition", "key").agg(F.max("offset").alias("offset")))
        if tombstones.isEmpty():
            return 0
        (DeltaTable.forPath(self.table.spark, self.table.location).alias("t")
         .merge(tombstones.alias("s"), "t.partition = s.partition AND t.key = s.key AND t.offset < s.offset")
         .whenMatchedDelete().execute())
        merge = self.table.log.commits(1)
        return int((merge[0].get("operationMetrics") or {}).get("numTargetRowsDeleted", 0)) if merge else 0

    def append_metrics(self, batch_id: int) -> dict[str, int]:
        """The operation metrics of this batch's append commit, found by the batch id its
        `userMetadata` records (a replayed batch that Delta skipped reports the commit that had
        landed before the crash); {} if none of the last commits is it."""
        for commit in self.table.log.commits(3):
            marker = json.loads(commit["userMetadata"]) if OFFSETS_KEY in (commit.get("userMetadata") or "") else {}
            if marker.get("pymq.batchId") == batch_id:
                return {k: int(v) for k, v in (commit.get("operationMetrics") or {}).items() if str(v).isdigit()}
        return {}

    def app_id(self) -> str:
        """The query's id, from its checkpoint's metadata file (written before the first batch)."""
        if self._app_id is None:
            self._app_id = "pymq-table-sync-" + json.loads(read_text(self.table.spark, f"{self.checkpoint}/metadata"))["id"]
        return self._app_id

    def batch_end(self, batch_id: int) -> dict[int, int]:
        """Where this batch ends in each partition: the query's offset log entry for it, which
        Spark writes before running the batch (lines: version, metadata, one per source)."""
        lines = read_text(self.table.spark, f"{self.checkpoint}/offsets/{batch_id}").splitlines()
        source = json.loads(lines[2])
        return {int(p): int(o) for p, o in source.get(self.options.topic, {}).items() if p.isdigit()}


def read_text(spark: SparkSession, path: str) -> str:
    """A small file through Hadoop's file systems (the checkpoint may be on s3a:// too)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    stream = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()).open(hadoop_path)  # type: ignore[attr-defined]
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def start(spark: SparkSession, options: SyncOptions) -> tuple[StreamingQuery, BatchWriter]:
    """Create (or check) the table and start the sync query."""
    table = TableTopic(spark, options.table)
    table.create(options.topic, options.value_format, options.include_headers)
    checkpoint = options.checkpoint or table.checkpoint
    writer = BatchWriter(table, options, checkpoint, is_compacted(options.bootstrap, options.topic))
    reader = (spark.readStream.format("pymq")
              .option("kafka.bootstrap.servers", options.bootstrap)
              .option("subscribe", options.topic)
              .option("startingOffsets", options.starting_offsets)
              .option("includeHeaders", str(options.include_headers).lower())
              .options(**options.source_options))
    if options.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", options.max_offsets_per_trigger)
    stream = reader.load().writeStream.foreachBatch(writer).option("checkpointLocation", checkpoint)
    if options.trigger == "available-now":
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=options.trigger)
    return stream.queryName(f"pymq-table-sync-{options.topic}").start(), writer


def sync(spark: SparkSession, options: SyncOptions) -> BatchWriter:
    """Run the sync until it ends (available-now) or is interrupted."""
    query, writer = start(spark, options)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return writer


def summary_table(options: SyncOptions, writer: BatchWriter) -> Table:
    table = Table(title=f"table sync {options.topic} -> {options.table}")
    for column in ("batches", "rows appended", "rows deleted", "seconds"):
        table.add_column(column, justify="right")
    table.add_row(str(len(writer.batches)), f"{sum(int(b['rows']) for b in writer.batches):,}",
                  f"{sum(b['deleted'] for b in writer.batches):,}", f"{sum(b['seconds'] for b in writer.batches):.1f}")
    return table


@click.command("sync")
@click.argument("topic")
@click.option("--table", "table", required=True, help="the Delta table: a path or a Hadoop URL (s3a://bucket/t)")
@bootstrap_option
@click.option("--value-format", type=click.Choice(["binary", "json", "arrow"]), default="binary", show_default=True,
              help="decode values into typed columns at sync (json, arrow) or keep the bytes")
@click.option("--value-schema", default=None, help="the values' Spark DDL schema, e.g. 'page STRING, ms BIGINT'")
@click.option("--include-headers", is_flag=True, help="also keep record headers")
@click.option("--trigger", default="available-now", show_default=True,
              help="'available-now' (catch up, then stop) or a processing interval ('30 seconds')")
@click.option("--checkpoint", default=None, help="the query's checkpoint [TABLE/_pymq_sync_checkpoint]")
@click.option("--starting-offsets", default="earliest", show_default=True,
              help="where a new sync starts: earliest, latest or the source's JSON offsets")
@click.option("--max-offsets-per-trigger", type=int, default=None, help="rows per micro-batch at most")
@click.option("-o", "--source-option", "source_options", multiple=True, type=KeyValue(), metavar="KEY=VALUE",
              help="a further `pymq` source option (remoteStorage.url=..., kafka.request.timeout.ms=...)")
@spark_conf_option
def sync_command(topic: str, table: str, value_format: str, value_schema: str | None, include_headers: bool,
                 trigger: str, checkpoint: str | None, starting_offsets: str, max_offsets_per_trigger: int | None,
                 source_options: tuple[tuple[str, str], ...], spark_conf: tuple[tuple[str, str], ...]) -> None:
    """Mirror TOPIC into a Delta table, exactly once: every record once, in its record date's
    partition, typed when a value format is given; compacted topics' tombstones delete earlier
    rows of their key. Progress per batch, a summary at the end."""
    spark = local_spark(f"pymq-table-sync-{topic}", **dict(spark_conf))
    try:
        # After the session starts: Spark parses the value schema's DDL, and only with a session.
        options = SyncOptions(topic, table, bootstrap(), ValueFormat.parse(value_format, value_schema), include_headers,
                              checkpoint, trigger, starting_offsets, max_offsets_per_trigger, dict(source_options))
        writer = sync(spark, options)
        cli_console().print(summary_table(options, writer))
    finally:
        spark.stop()


main = sync_command

if __name__ == "__main__":
    main()
