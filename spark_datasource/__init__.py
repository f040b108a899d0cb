"""The `pymq` Spark data source: `spark.read.format("pymq")` once pymq is installed (`pyspark_pymq`);
`register(spark)` where Spark's static registration is switched off."""
from spark_datasource.session import local_spark
from spark_datasource.source import PymqDataSource, register

__all__ = ["PymqDataSource", "local_spark", "register"]
