"""The pipeline's Python definitions: the topic as the streaming table `page_views`, and the
materialized view `views_per_page`.

`spark-pipelines` imports this file with `spark` (the pipeline's Spark Connect session) already in
its globals, and evaluates each decorated function once to learn its query.
"""
from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.pipelines import event_stream

spark: SparkSession = globals()["spark"]  # put here by spark-pipelines before it runs this module

event_stream.tolerate_metrics(spark)  # or pyspark 4.2.0's CLI fails the finished run (SPARK-59135)


@dp.table(comment="Every event of the topic, each once: its position, time, user (the key) and page (from the JSON value)")
def page_views() -> DataFrame:
    events = (spark.readStream.format("pymq")
              .option("kafka.bootstrap.servers", spark.conf.get("spark.pymq.bootstrap.servers"))
              .option("subscribe", spark.conf.get("spark.pymq.topic"))
              .option("startingOffsets", "earliest")
              .load())
    return events.select("topic", "partition", "offset", "timestamp",
                         F.col("key").cast("string").alias("user"),
                         F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"))


@dp.materialized_view(comment="Page views per page, recomputed from page_views on every run")
def views_per_page() -> DataFrame:
    return spark.read.table("page_views").groupBy("page").agg(F.count("*").alias("views"))
