"""Spark Declarative Pipelines over a pymq topic: this folder is a pipeline project for pyspark
4.2's `spark-pipelines` (docs/spark.md has the details).

    spark-pipeline.yml                  the spec: name, storage (checkpoints), settings (the broker
                                        and topic), and the definition files (transformations/**)
    transformations/page_views.py       streaming table `page_views`: the topic read with
                                        `spark.readStream.format("pymq")`, each event once, its page
                                        parsed from the JSON value; materialized view `views_per_page`
    transformations/views_per_user.sql  materialized view `views_per_user`: views per key
    conf/spark-defaults.conf            the settings the server fixes at start (SPARK_CONF_DIR): a
                                        catalog that outlives a run, the warehouse
    event_stream.py                     a workaround for pyspark 4.2.0's CLI (SPARK-59135)

Against the demo broker, from the repository root, once `make run` has produced `demo.events`:

    .venv/bin/pymq broker start --config conf/broker.toml &
    SPARK_CONF_DIR=$PWD/jobs/pipelines/conf PYSPARK_PYTHON=$PWD/.venv/bin/python \\
        .venv/bin/spark-pipelines run --spec jobs/pipelines/spark-pipeline.yml

`spark-pipelines` is spark-submit for a pipeline: it starts a Spark Connect server and runs
pyspark's CLI as its client, which imports the definition files and starts a run. A run is
triggered: the streaming table reads what the topic holds when the run starts
(Trigger.AvailableNow) and the run ends; the next run goes on from the checkpoint under
`storage`, and recomputes the materialized views. Everything it keeps is under
/tmp/pymq-pipelines; the tables are parquet folders in its warehouse.
"""
