"""Builds the class-data-sharing archive of spark_datasource/class_archive.py (`make venv` runs
`main()`): one local session runs a session's typical first work under `-XX:ArchiveClassesAtExit`,
and its JVM writes the classes it loaded when it exits.

A truncated archive would crash every JVM that maps it (SIGBUS, where a stale one is only a
warning), so the JVM writes to a temporary sibling that is renamed in place only once it has
exited cleanly.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from spark_datasource.class_archive import archive_path
from spark_datasource.session import LOCAL_DEFAULTS, local_spark


def build(archive: Path | None = None) -> Path:
    """Run a session's typical first work (a Delta write and read, a Python Arrow task, a streaming
    micro-batch) in a JVM that archives the classes it loaded when it exits."""
    archive = archive or archive_path()
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".spark-classes-", suffix=".jsa", dir=archive.parent)
    os.close(fd)
    staging = Path(name)
    work = Path(tempfile.mkdtemp(prefix="pymq-cds-"))
    try:
        options = f"{LOCAL_DEFAULTS['spark.driver.extraJavaOptions']} -Xlog:cds*=off -XX:ArchiveClassesAtExit={staging}"
        spark = local_spark("pymq-class-archive", **{"spark.driver.extraJavaOptions": options})
        jvm = spark.sparkContext._gateway.proc  # pyspark's Popen of the JVM: it exits at its stdin's EOF
        spark.range(1000).selectExpr("id", "id % 7 AS k").write.format("delta").save(str(work / "table"))
        spark.read.format("delta").load(str(work / "table")).groupBy("k").count().collect()
        spark.range(100).mapInArrow(lambda batches: batches, "id LONG").collect()
        (spark.readStream.format("rate").option("rowsPerSecond", 10).load().writeStream.format("delta")
         .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True)
         .start(str(work / "stream")).awaitTermination(300))
        spark.stop()
        jvm.stdin.close()
        if jvm.wait(300) != 0 or staging.stat().st_size == 0:
            raise RuntimeError(f"the JVM did not write its class archive (exit status {jvm.returncode})")
        os.replace(staging, archive)
    finally:
        staging.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return archive


def main() -> None:
    archive = build()
    print(f"Spark class archive ({archive.stat().st_size / 2**20:.0f} MiB) in {archive}")

