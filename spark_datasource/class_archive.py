"""A class-data-sharing (CDS) archive for the driver JVM of `local_spark`: the classes a pymq
session loads (Spark's, Scala's, Hadoop's, Delta's) mapped from one file at start instead of read,
parsed and verified from the jars every time. On 2 cores (load average 3) a session and its first
query took 6-8 s and 9-10 JVM CPU-s with it against 11-15 s and 15-17 CPU-s without; the suite and
the jobs it runs in subprocesses start about ten such JVMs.

`make venv` builds it (spark_datasource/archive_classes.py); `local_spark` passes
`-XX:SharedArchiveFile` whenever the file exists. An archive that no longer fits (another JDK or
JDK base archive, another pyspark, changed jars) costs only the time: the JVM starts without it,
at most with a warning on its stderr. A missing one is no option at all.

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


def with_archive(options: str) -> str:
    """A JVM's Java `options` followed by those that use the archive (just `options` without one)."""
    return f"{options} {java_options()}".strip()
