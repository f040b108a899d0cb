"""A Spark driver with two streaming queries into the exactly-once `pymq` sink, for
test_exactly_once_sink_kill.py to SIGKILL and restart from the same checkpoints (a process of its
own: its own local[2] JVM, which dies with it).

    python eos_sink_driver.py BOOTSTRAP SOURCE FOLDER PER_TRIGGER MODE

- copy:  SOURCE -> `{SOURCE}-copy` (key, value), transactions named from its checkpointLocation;
- count: SOURCE grouped by key, counted, -> `{SOURCE}-count` in update mode (key, the count as
         text), transactions named by the `transactionalIdPrefix` option `{SOURCE}-count`.

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
    counts = (rows.groupBy("key").count()
              .select("key", F.col("count").cast("string").alias("value")))
    queries = [
        start(rows.select("key", "value"), bootstrap, f"{source}-copy", folder / "copy", "append", mode),
        start(counts, bootstrap, f"{source}-count", folder / "count", "update", mode,
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
