"""A Spark driver program that reads, streams and writes a topic with `format("pymq")`: what
test_spark_cluster.py runs on a standalone cluster (`spark-submit --master spark://... cluster_driver.py
SPEC`) and over Spark Connect (`python cluster_driver.py SPEC` with `remote` in SPEC). A process
of its own in both cases: a JVM holds one classic session, and a Spark Connect session switches
the whole Python process to Connect mode.

SPEC is a JSON file: bootstrap, source (a topic holding the test's records), sink (an empty
topic), rows (how many rows to write to it), per_trigger (maxOffsetsPerTrigger of the stream),
out (a folder), remote (an `sc://` URL, or null for the spark-submit session). The driver writes
`out/results.json`:

- batch:  [partition, offset, value] of every row of `spark.read.format("pymq")` of source;
- stream: the values a streaming query (Trigger.AvailableNow, maxOffsetsPerTrigger) wrote from
          source to Parquet in `out/stream` (checkpoint `out/checkpoint`), read back through the
          file sink's log, and its micro-batch count;
- write:  the number of rows `df.write.format("pymq")` wrote to sink (values "w-<i>").

Checks on these are the test's, against what the broker holds.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def session(remote: str | None) -> SparkSession:
    """The spark-submit session, or a Spark Connect one. Nothing registers `format("pymq")`: Spark
    finds the installed `pyspark_pymq` package itself, on the cluster and in the Connect server."""
    return (SparkSession.builder.remote(remote) if remote else SparkSession.builder).getOrCreate()


def batch(spark: SparkSession, spec: dict[str, Any]) -> list[list[Any]]:
    df = spark.read.format("pymq").option("kafka.bootstrap.servers", spec["bootstrap"]).option("subscribe", spec["source"]).load()
    return [[row.partition, row.offset, row.value] for row in
            df.select("partition", "offset", F.col("value").cast("string").alias("value")).collect()]


def stream(spark: SparkSession, spec: dict[str, Any]) -> dict[str, Any]:
    out = Path(spec["out"])
    query = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", spec["bootstrap"])
             .option("subscribe", spec["source"]).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", spec["per_trigger"]).load()
             .select(F.col("value").cast("string").alias("value"))
             .writeStream.format("parquet").option("path", str(out / "stream"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    values = [row.value for row in spark.read.parquet(str(out / "stream")).collect()]
    return {"values": values, "batches": len(query.recentProgress)}


def write(spark: SparkSession, spec: dict[str, Any]) -> int:
    df = spark.range(spec["rows"]).select(F.concat(F.lit("w-"), F.col("id").cast("string")).alias("value"))
    (df.write.format("pymq").mode("append").option("kafka.bootstrap.servers", spec["bootstrap"])
     .option("topic", spec["sink"]).save())
    return spec["rows"]


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    spark = session(spec.get("remote"))
    try:
        results = {"batch": batch(spark, spec), "stream": stream(spark, spec), "write": write(spark, spec)}
    finally:
        spark.stop()
    (Path(spec["out"]) / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
