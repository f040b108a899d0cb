"""The `pymq` Spark data source: `register(spark)`, then `spark.read.format("pymq")`."""
from spark_datasource.session import local_spark
from spark_datasource.source import PymqDataSource, register

__all__ = ["PymqDataSource", "local_spark", "register"]
