"""Spark's static registration of the `pymq` data source: installing pymq is enough.

Spark 4 looks for installed top-level packages named `pyspark_<anything>` that define a
`DefaultSource` subclassing `pyspark.sql.datasource.DataSource` (SPARK-45917,
`pyspark/sql/worker/lookup_data_sources.py`), once per JVM, when a query first names a Python data
source, and registers each under its `name()` for every session of that JVM: `spark-submit` jobs,
notebooks, Spark SQL's `CREATE TEMPORARY VIEW ... USING pymq`, threads with no active session.
(A catalog table, `CREATE TABLE ... USING pymq`, is not readable in Spark 4.2: docs/spark.md.)
`spark.sql.pyspark.dataSource.staticImport.enabled` (on by default) switches it off; sessions
that do so call `spark_datasource.register(spark)` instead.

Spark imports every `pyspark_*` package it finds, so this one stays an alias: the source's
modules import lazily from `spark_datasource`.
"""
from spark_datasource.source import PymqDataSource as DefaultSource

__all__ = ["DefaultSource"]
