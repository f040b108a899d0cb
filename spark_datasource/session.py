"""A local Spark session with the `pymq` source registered: what the main job, the tests, the
benchmarks and notebooks start from.

Spark's Python workers (query planning and tasks) must run the interpreter that has pymq
installed; `PYSPARK_PYTHON` tells Spark which, and is set here before the JVM starts.
"""
from __future__ import annotations

import os
import sys
import warnings

from pyspark.sql import SparkSession

from spark_datasource.source import register

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
}


def local_spark(app_name: str, cores: int = 2, **conf: str) -> SparkSession:
    """`local[cores]` with this interpreter for Python workers and `format("pymq")` registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no "hostname resolves to loopback" warning
    # pymq never converts through pandas; PySpark's warning about the pinned pandas 3 is noise here.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in {**LOCAL_DEFAULTS, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
