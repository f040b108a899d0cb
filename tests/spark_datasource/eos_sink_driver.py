"""A Spark driver with a streaming query writing exactly once to `pymq`, for
test_exactly_once_sink_kill.py to SIGKILL and restart from the same checkpoint (a process of its
own: its own local[2] JVM, which dies with it). One query per driver: with both in one driver,
the stateful one failed about one run in five with Spark's "Task not serializable: Illegal size
5 of collection, expected 6" (a collection changed by the other query's thread while Spark
serialized a task of this one).

    python eos_sink_driver.py BOOTSTRAP SOURCE FOLDER PER_TRIGGER MODE QUERY

- copy:  SOURCE -> `{SOURCE}-copy` (key, value), transactions named from its checkpointLocation;
- update: SOURCE counted per key, in Update mode, through foreachBatch: each micro-batch a batch
         write with `txnAppId` `{SOURCE}-update` and `txnVersion` the batch id -> `{SOURCE}-update`
         (key, value the key's count so far), transactions named `{SOURCE}-update`. Not the
         streaming sink: Spark 4.2 refuses Update mode for every Python data source sink (its
         PythonWriteBuilder is no SupportsStreamingUpdateAsAppend).

QUERY is `copy` or `update`; its checkpoint is FOLDER/QUERY. MODE `run` triggers every 200 ms until killed;
`catch-up` runs the query to the source's end (Trigger.AvailableNow) and exits 0.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from spark_datasource import local_spark

# The count's tasks per micro-batch: four on local[2] run in two waves, so the first wave's
# transactions wait prepared while the second runs (the test kills the driver then), as the
# copy's do with the source's four partitions.
SHUFFLE_PARTITIONS = 4


def main(bootstrap: str, source: str, folder: Path, per_trigger: int, mode: str, name: str) -> None:
    spark = local_spark("eos-sink-driver", **{"spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS)})
    rows = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_trigger).load())
    if name == "copy":
        query = start(rows.select("key", "value"), folder / name, "append", mode, sink(bootstrap, f"{source}-copy"))
    else:
        updates = rows.groupBy("key").count().select("key", F.col("count").cast("string").alias("value"))
        query = start(updates, folder / name, "update", mode, versioned_sink(bootstrap, f"{source}-update"))
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query {query.name} failed: {query.exception()}")


def sink(bootstrap: str, topic: str) -> Callable[[DataStreamWriter], DataStreamWriter]:
    """The exactly-once streaming `pymq` sink, its transactions named from the checkpoint."""
    return lambda writer: writer.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)


def versioned_sink(bootstrap: str, topic: str) -> Callable[[DataStreamWriter], DataStreamWriter]:
    """foreachBatch writing each micro-batch as version `batch_id` of the application `topic`."""
    def write(batch: DataFrame, batch_id: int) -> None:
        (batch.write.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("transactionalIdPrefix", topic).option("txnAppId", topic).option("txnVersion", batch_id)
         .mode("append").save())
    return lambda writer: writer.foreachBatch(write)


def start(df: DataFrame, checkpoint: Path, output_mode: str, mode: str,
          into: Callable[[DataStreamWriter], DataStreamWriter]) -> StreamingQuery:
    writer = into(df.writeStream).option("checkpointLocation", str(checkpoint)).outputMode(output_mode)
    writer = writer.queryName(checkpoint.name)
    writer = writer.trigger(availableNow=True) if mode == "catch-up" else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
