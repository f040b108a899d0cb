"""Spark Declarative Pipelines over a pymq topic: this folder is a pipeline project for pyspark
4.2's `spark-pipelines`.

    spark-pipeline.yml                  the spec: name, storage (checkpoints), settings (the broker
                                        and topic), and the definition files (transformations/**)
    transformations/page_views.py       streaming table `page_views`: the topic read with
                                        `spark.readStream.format("pymq")`, each event once, its page
                                        parsed from the JSON value; materialized view `views_per_page`
    transformations/views_per_user.sql  materialized view `views_per_user`: views per key
    event_stream.py                     a workaround for pyspark 4.2.0's CLI (SPARK-59135)

Against the demo broker, from the repository root, once `make run` has produced `demo.events`:

    .venv/bin/pymq broker start --config conf/broker.toml &
    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-pipelines run \\
        --spec jobs/pipelines/spark-pipeline.yml --conf spark.sql.warehouse.dir=/tmp/pymq-pipelines/warehouse

`spark-pipelines` is spark-submit for a pipeline: it starts a Spark Connect server (`local[*]`
unless `--remote local[2]` or a server's `sc://` URL says otherwise) and runs pyspark's CLI as its
client, which imports the definition files and starts a run. A run is triggered, not continuous:
the streaming table reads what the topic holds when it starts (Trigger.AvailableNow) and stops;
the next run goes on from the checkpoint under `storage`; the materialized views are recomputed
each run. `PYSPARK_PYTHON` must be an interpreter with pymq installed (the script's default is
`python3`): the CLI and the server's Python workers import `spark_datasource`.

The tables are parquet files under the warehouse (one folder each); Spark's default catalog is in
memory, so a later session reads them by path, e.g.
`spark.read.parquet("/tmp/pymq-pipelines/warehouse/views_per_page")`.
"""
