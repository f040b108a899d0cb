"""The main job: one broker on conf/broker.toml, a demo event stream, and Spark pipelines on it.

Run with `make run` (or `python -m jobs.demo`). It

1. starts `pymq broker start` as a child process (broker.process.BrokerProcess; its output goes
   to data/broker.out) and creates the topic `demo.events` (3 partitions) if needed;
2. feeds it a stream of page-view events from a producer thread: JSON values keyed by user, whose
   event times advance ten simulated minutes over the run;
3. runs a Spark Structured Streaming query reading the topic with `format("pymq")`: page views per
   page per event-time minute, with a one-minute watermark, appended to a Parquet table as each
   minute closes, and reports its progress to the consumer group `demo.views-per-minute`
   (`groupIdForLag`), so `pymq group describe demo.views-per-minute` shows the pipeline's lag;
4. runs a batch query over the same topic and checks it against what was produced (every event
   exactly once, keyed events in one partition per user);
5. mirrors the topic into a Delta table (`pymq table sync`'s job, typed JSON columns), produces a
   few more events that only the broker holds, and answers one `pymq.history()` query spanning
   the table and that tail, checked against what was produced;
6. prints a summary (with the pipeline's lag per partition, which must be 0 once it caught up)
   and stops the broker cleanly.
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from broker.config import BrokerConfig
from broker.process import BrokerProcess
from client import Admin, PartitionLag, Producer
from common.errors import TopicAlreadyExistsError

CONFIG = Path(__file__).resolve().parent.parent / "conf" / "broker.toml"
TOPIC = "demo.events"
PARTITIONS = 3
LAG_GROUP = "demo.views-per-minute"
PAGES = ["/home", "/search", "/cart", "/checkout"]
EVENTS_PER_TICK = 2_000
TAIL_EVENTS_PER_PAGE = 25  # produced after the table sync: history() reads them from the broker
TICKS = 20  # each tick is 30 simulated seconds of events, sent 0.5 s apart: 10 event-time minutes
console = Console()


def page_views(tick: int, start_ms: int, rng: np.random.Generator) -> tuple[pa.Table, pa.Array]:
    """One tick's events (key user-N, value {"page": ..., "user": ...}, event times within the
    tick) and each event's page."""
    n = EVENTS_PER_TICK
    users = pc.binary_join_element_wise(pa.array(np.full(n, "user-")), pc.cast(pa.array(rng.integers(0, 500, n)), pa.string()), "")
    pages = pa.array(np.array(PAGES)[rng.integers(0, len(PAGES), n)])
    values = pc.binary_join_element_wise(pa.array(np.full(n, '{"page": "')), pages, pa.array(np.full(n, '", "user": "')),
                                         users, pa.array(np.full(n, '"}')), "")
    times = start_ms + tick * 30_000 + np.sort(rng.integers(0, 30_000, n))
    return pa.table({"key": users, "value": values, "timestamp": pa.array(times, pa.timestamp("ms", tz="UTC"))}), pages


def feed(bootstrap: str, produced: list[pa.Array], failed: list[BaseException]) -> None:
    """The producer thread: TICKS batches of events, 0.5 s apart."""
    rng = np.random.default_rng(7)
    start_ms = (int(time.time() * 1000) // 60_000 - 10) * 60_000  # ten minutes ago, on a minute
    try:
        with Producer(bootstrap, linger_ms=5, compression="lz4") as producer:
            for tick in range(TICKS):
                events, pages = page_views(tick, start_ms, rng)
                producer.send_batch(TOPIC, events)
                producer.flush()
                produced.append(pages)
                time.sleep(0.5)
    except BaseException as err:  # reported by the main thread
        failed.append(err)


def main() -> None:
    config = BrokerConfig.load(CONFIG)
    data = Path(config["log.dir"]).parent
    broker = BrokerProcess(Path(config["log.dir"]), {"port": config["port"], "metrics.port": config["metrics.port"]},
                           config_file=CONFIG,
                           output=data / "broker.out")
    try:
        broker.start()
    except RuntimeError as err:
        raise SystemExit(f"{err}\n(are ports {config['port']} and {config['metrics.port']} free?)") from None
    try:
        run(broker.bootstrap, data / "demo")
    finally:
        broker.stop()


def run(bootstrap: str, out: Path) -> None:
    console.print(f"[bold]broker[/] {bootstrap}")
    with Admin(bootstrap) as admin:
        try:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        except TopicAlreadyExistsError:
            pass
        before = {tp: offset for tp, (offset, _) in admin.list_offsets({(TOPIC, p): -1 for p in range(PARTITIONS)}).items()}

    console.print("[bold]spark[/] starting local[2] ...")
    from pyspark.sql import functions as F

    from spark_datasource import local_spark

    spark = local_spark("pymq-demo")
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    produced: list[pa.Array] = []  # the page of every acknowledged event
    failed: list[BaseException] = []
    producer = threading.Thread(target=feed, args=(bootstrap, produced, failed), name="demo-producer")
    producer.start()

    # The streaming pipeline: views per page per event-time minute, closed by a watermark.
    start_json = "{%s}" % ", ".join(f'"{p}": {before[(TOPIC, p)]}' for p in range(PARTITIONS))
    events = (spark.readStream.format("pymq")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", TOPIC)
              .option("startingOffsets", f'{{"{TOPIC}": {start_json}}}')
              .option("maxOffsetsPerTrigger", 20_000)
              .option("groupIdForLag", LAG_GROUP)
              .load())
    per_minute = (events
                  .select(F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"), "timestamp")
                  .withWatermark("timestamp", "1 minute")
                  .groupBy(F.window("timestamp", "1 minute").alias("minute"), "page")
                  .count())
    query = (per_minute.writeStream.format("parquet").outputMode("append")
             .option("path", str(out / "views_per_minute"))
             .option("checkpointLocation", str(out / "checkpoint"))
             .trigger(processingTime="1 second")
             .start())
    producer.join()
    if failed:
        query.stop()
        raise SystemExit(f"demo failed: the producer failed: {failed[0]!r}")
    total = sum(len(pages) for pages in produced)
    wait_for(query, total)
    stream_s = time.perf_counter() - started
    lag = pipeline_lag(bootstrap)
    query.stop()

    # A batch query over the same topic: every event exactly once, in its user's one partition.
    batch = (spark.read.format("pymq")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", TOPIC)
             .option("startingOffsets", f'{{"{TOPIC}": {start_json}}}')
             .load()
             .select(F.col("key").cast("string").alias("user"), F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"),
                     "partition"))
    by_page = {r["page"]: r["count"] for r in batch.groupBy("page").count().collect()}
    users_split = batch.groupBy("user").agg(F.countDistinct("partition").alias("n")).filter("n > 1").count()
    minutes = spark.read.parquet(str(out / "views_per_minute"))
    closed = minutes.select("minute").distinct().count()
    streamed = minutes.agg(F.sum("count")).first()[0] or 0

    expected_by_page = dict.fromkeys(PAGES, 0)
    for item in pc.value_counts(pa.chunked_array(produced)).to_pylist():
        expected_by_page[item["values"]] = item["counts"]

    summary = Table(title=f"topic {TOPIC}: page views")
    for column in ("page", "produced", "batch query", "in closed minutes (stream)"):
        summary.add_column(column, justify="right")
    per_page_stream = {r["page"]: r["n"] for r in minutes.groupBy("page").agg(F.sum("count").alias("n")).collect()}
    for page in PAGES:
        summary.add_row(page, f"{expected_by_page[page]:,}", f"{by_page.get(page, 0):,}", f"{per_page_stream.get(page, 0):,}")
    console.print(summary)
    console.print(lag_table(lag))
    console.print(f"produced {total:,} events over {TICKS * 30 // 60} event-time minutes; the streaming query read them "
                  f"in {stream_s:.1f}s and closed {closed} minutes ({streamed:,} events; the last minute stays open until "
                  "the watermark passes it)")
    history_by_page = table_topic_history(spark, bootstrap, out, start_json)
    spark.stop()
    if history_by_page != {page: n + TAIL_EVENTS_PER_PAGE for page, n in expected_by_page.items()}:
        raise SystemExit(f"demo failed: history() counted {history_by_page}, produced {expected_by_page} "
                         f"+ {TAIL_EVENTS_PER_PAGE} per page after the sync")
    if by_page != expected_by_page or users_split:
        raise SystemExit(f"demo failed: batch counts {by_page} != produced {expected_by_page}, "
                         f"or {users_split} users' events split across partitions")
    if any(row.lag != 0 for row in lag):
        raise SystemExit(f"demo failed: the pipeline's group shows lag {[(row.partition, row.lag) for row in lag]}")
    if streamed == 0 or streamed > total:
        raise SystemExit(f"demo failed: the streaming query counted {streamed} of {total} events")
    console.print("[green]demo ok[/]")


def table_topic_history(spark, bootstrap: str, out: Path, start_json: str) -> dict[str, int]:
    """Sync the topic into a Delta table, produce a tail the table does not hold, and count page
    views over both with one history() query."""
    from pyspark.sql import functions as F

    from jobs.topic_table import SyncOptions, sync
    from pymq import history
    from spark_datasource.table_topic import TableTopic, ValueFormat

    options = SyncOptions(TOPIC, str(out / "table"), bootstrap, ValueFormat.parse("json", "page STRING, user STRING"),
                          starting_offsets=f'{{"{TOPIC}": {start_json}}}')
    started = time.perf_counter()
    sync(spark, options)
    synced_s = time.perf_counter() - started
    position = TableTopic(spark, options.table).position()
    with Producer(bootstrap) as producer:  # the tail: on the broker only
        pages = [page for page in PAGES for _ in range(TAIL_EVENTS_PER_PAGE)]
        producer.send_batch(TOPIC, pa.table({"key": [f"user-tail-{i}" for i in range(len(pages))],
                                             "value": [f'{{"page": "{page}", "user": "tail"}}' for page in pages]}))
        producer.flush()
    events = history(spark, TOPIC, table=options.table, bootstrap=bootstrap)
    by_page = {r["page"]: r["n"] for r in events.groupBy(F.col("value.page").alias("page")).agg(F.count("*").alias("n")).collect()}
    console.print(f"table topic: synced to {options.table} in {synced_s:.1f}s (version {position.version}, "
                  f"offsets {position.offsets}); history() over table + broker tail: {sum(by_page.values()):,} events")
    return by_page


def pipeline_lag(bootstrap: str, timeout_s: float = 10.0) -> list[PartitionLag]:
    """The streaming query's lag as its group shows it, once every partition caught up (the
    source reports the end of each finished micro-batch; the last report may trail by a trigger)."""
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while True:
            lag = admin.group_lag(LAG_GROUP)
            if (len(lag) == PARTITIONS and all(row.lag == 0 for row in lag)) or time.monotonic() > deadline:
                return lag
            time.sleep(0.2)


def lag_table(lag: list[PartitionLag]) -> Table:
    table = Table(title=f"group {LAG_GROUP} (the streaming query, via groupIdForLag)")
    for column in ("partition", "committed", "log end", "lag"):
        table.add_column(column, justify="right")
    for row in lag:
        table.add_row(str(row.partition), f"{row.committed:,}" if row.committed is not None else "-",
                      f"{row.log_end_offset:,}" if row.log_end_offset is not None else "-",
                      f"{row.lag:,}" if row.lag is not None else "-")
    return table


def wait_for(query, total: int, timeout_s: float = 60.0) -> None:
    """Until the streaming query has read `total` rows (or fails, or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise SystemExit(f"demo failed: the streaming query failed: {query.exception()}")
        read = sum(p["numInputRows"] for p in query.recentProgress)
        if read >= total and not query.status["isTriggerActive"]:
            return
        time.sleep(0.5)
    raise SystemExit(f"demo failed: the streaming query read {read} of {total} events in {timeout_s:.0f}s")


if __name__ == "__main__":
    main()
