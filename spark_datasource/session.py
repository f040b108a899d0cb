"""A local Spark session with the `pymq` source and Delta Lake enabled: what the main job, the jobs,
the tests, the benchmarks and notebooks start from.

`format("pymq")` comes from Spark's static registration of the installed `pyspark_pymq` package
(see its docstring), as in any session a user starts; `register()` runs only when the caller
switches that off or the package is missing (an install older than it). Spark lists `sys.path`
directories to find the package, and an editable install's import hook is invisible to that
listing, so the package's directory is handed to the JVM's Python workers on `PYTHONPATH` when it
is not installed in site-packages.

Settings come in three layers, later ones winning: `conf/spark-defaults.conf` (Delta's session
extension and catalog, s3a), the local defaults below (with `conf/log4j2.properties` for the JVM's
log and, when `make venv` built it, the class archive of `spark_datasource.class_archive` for a
faster JVM start), and the caller's. The Delta Lake and
hadoop-aws jars are added by `spark_datasource.jars` (installed by `make venv`).

Spark's Python workers (query planning and tasks) must run the interpreter that has pymq
installed; `PYSPARK_PYTHON` tells Spark which, and is set here before the JVM starts.
"""
from __future__ import annotations

import importlib.util
import os
import site
import sys
import warnings
from pathlib import Path

from pyspark.sql import SparkSession

from spark_datasource import class_archive, jars
from spark_datasource.source import register

CONF = Path(__file__).resolve().parent.parent / "conf"
SPARK_DEFAULTS = CONF / "spark-defaults.conf"
LOG4J = CONF / "log4j2.properties"
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    # Delta's defaults are sized for clusters: 50 tasks to rebuild a table's snapshot from its log
    # (every read, commit and sync batch) and 10,000 to list files for VACUUM. On local[2] those
    # tiny tasks were the whole cost: a VACUUM of a 2,000-row table took 51 s warm, 4.4 s with these.
    # (The snapshot's partitions, one per core, are set in local_spark: every Delta read plans its
    # files with one task per partition, 0.1 s less per query with 2 than with 4 on local[2].)
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={LOG4J.as_uri()}",
}


def spark_defaults(path: Path = SPARK_DEFAULTS) -> dict[str, str]:
    """A spark-defaults.conf file as a dict: `key value` lines, `#` comments."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            settings[key] = value.strip()
    return settings


def local_spark(app_name: str, cores: int = 2, **conf: str) -> SparkSession:
    """`local[cores]` with this interpreter for Python workers, Delta Lake, and `format("pymq")`."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no "hostname resolves to loopback" warning
    # pymq never converts through pandas; PySpark's warning about the pinned pandas 3 is noise here.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    java_options = class_archive.with_archive(LOCAL_DEFAULTS["spark.driver.extraJavaOptions"])
    local = {**LOCAL_DEFAULTS, "spark.databricks.delta.snapshotPartitions": str(cores),
             "spark.driver.extraJavaOptions": java_options}
    settings = {**spark_defaults(), **jars.spark_conf(), **local, **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    static = static_import_enabled(settings) and _expose_to_static_lookup()
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if not static:
        register(session)
    return session


STATIC_IMPORT = "spark.sql.pyspark.dataSource.staticImport.enabled"


def static_import_enabled(settings: dict[str, str]) -> bool:
    """Whether Spark registers installed `pyspark_*` data sources itself (on unless set to false)."""
    return settings.get(STATIC_IMPORT, "true").strip().lower() != "false"


def _expose_to_static_lookup() -> bool:
    """Whether Spark's lookup will find `pyspark_pymq`: False if it is not installed. Puts the
    directory holding it on the PYTHONPATH the JVM (started after this) gives its Python workers,
    unless pymq is installed in site-packages, where the lookup (`pkgutil.iter_modules()` over
    `sys.path`) finds it anyway. An editable install maps packages with an import hook that listing
    cannot see: without this, a session started outside the source tree (a notebook's kernel, whose
    working directory is `notebooks/`) would not find `format("pymq")`."""
    spec = importlib.util.find_spec("pyspark_pymq")
    if spec is None or spec.origin is None:
        return False
    root = str(Path(spec.origin).resolve().parent.parent)
    if root in {str(Path(path).resolve()) for path in site.getsitepackages()}:
        return True
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, root])
    return True
