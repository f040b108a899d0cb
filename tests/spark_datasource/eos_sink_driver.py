"""A Spark driver with two streaming queries into the exactly-once `pymq` sink, for
test_exactly_once_sink_kill.py to SIGKILL and restart from the same checkpoints (a process of its
own: its own local[2] JVM, which dies with it).

    python eos_sink_driver.py BOOTSTRAP SOURCE FOLDER PER_TRIGGER MODE

- copy:  SOURCE -> `{SOURCE}-copy` (key, value), transactions named from its checkpointLocation;
- count: SOURCE counted per key and 1-second event-time window (watermark 5 s) -> `{SOURCE}-count`
         in append mode (key, value `{window start ms}:{count}`: each closed window's count once),
         transactions named by the `transactionalIdPrefix` option `{SOURCE}-count`. Append, not
         update: Spark 4.2 refuses Update mode for every Python data source sink (its
         PythonWriteBuilder is no SupportsStreamingUpdateAsAppend: "pymq does not support Update
         mode"), so a stateful aggregation reaches a topic in append mode, through a watermark.

Checkpoints are FOLDER/copy and FOLDER/count. MODE `run` triggers every 200 ms until killed;
`catch-up` runs each query to the source's end (Trigger.AvailableNow) and exits 0.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_datasource import local_spark


def main(bootstrap: str, source: str, folder: Path, per_trigger: int, mode: str) -> None:
    spark = local_spark("eos-sink-driver", **{"spark.sql.shuffle.partitions": "2"})
    rows = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_trigger).load())
    counts = (rows.withWatermark("timestamp", "5 seconds").groupBy(F.window("timestamp", "1 second"), "key").count()
              .select("key", F.format_string("%d:%d", F.unix_millis(F.col("window.start")), "count").alias("value")))
    queries = [
        start(rows.select("key", "value"), bootstrap, f"{source}-copy", folder / "copy", "append", mode),
        start(counts, bootstrap, f"{source}-count", folder / "count", "append", mode,
              transactionalIdPrefix=f"{source}-count"),
    ]
    for query in queries:
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"query {query.name} failed: {query.exception()}")


def start(df: DataFrame, bootstrap: str, topic: str, checkpoint: Path, output_mode: str, mode: str, **options: str):
    writer = (df.writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
              .option("checkpointLocation", str(checkpoint)).outputMode(output_mode).queryName(topic.replace("-", "_")))
    for name, value in options.items():
        writer = writer.option(name, value)
    writer = writer.trigger(availableNow=True) if mode == "catch-up" else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
