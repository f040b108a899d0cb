"""A class-data-sharing (CDS) archive for the driver JVM of `local_spark`: the classes a pymq
session loads (Spark's, Scala's, Hadoop's, Delta's) mapped from one file at start instead of read,
parsed and verified from the jars every time. On 2 cores a session's JVM took 26 CPU-s with it
against 35 without (start, a Delta write and read, stop); the suite and its subprocess jobs start
about ten such JVMs.

`make venv` builds it (spark_datasource/archive_classes.py); `local_spark` passes
`-XX:SharedArchiveFile` whenever the file exists. An archive that no longer fits (another
JDK, another pyspark, jars changed) is one warning line on the JVM's stderr and a start at the old
speed; a missing one is no option at all.

The archive belongs to the pyspark and JDK of one venv, so it lives in the venv like the jars
(`PYMQ_SPARK_CDS` names another file).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# CDS's warnings go to the JVM's stderr, not its stdout (the unified log's default): the stdout of
# a driver is its program's (a CLI's JSON, a notebook's cells).
_LOG_TO_STDERR = "-Xlog:cds*=off -Xlog:cds*=warning:stderr"


def archive_path() -> Path:
    """Where the archive is: `PYMQ_SPARK_CDS`, or `spark-classes.jsa` in this interpreter's prefix (the venv)."""
    return Path(os.environ.get("PYMQ_SPARK_CDS") or Path(sys.prefix) / "spark-classes.jsa")


def java_options(archive: Path | None = None) -> str:
    """The driver's JVM options that use the archive; empty when there is none."""
    archive = archive or archive_path()
    return f"{_LOG_TO_STDERR} -XX:SharedArchiveFile={archive}" if archive.is_file() else ""
