"""Spark jobs over a 3-broker cluster (a real etcd) whose partition leader is killed by the first of
the job's tasks to get rows: the tasks that start after it (local[2] runs two at a time, so most
of the job's eight) meet a dead leader and follow the new one inside the task, a read task by
refreshing metadata and fetching again, a write task through its producer's retries. Spark's
local mode runs a task once (spark.task.maxFailures does not apply), so a task that failed would
fail the job: the job's success, with every record there, is the proof."""
from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from client import Admin, Producer
from tests.helpers.cluster_scenarios import wait_for, wait_for_full_isr
from tests.helpers.isolated_reads import read_isolated

TOPIC = "failover"
RECORDS = 4_000
PER_TASK = 500


def test_read_tasks_follow_a_leader_killed_mid_job(spark, cluster, tmp_path):
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
        first = wait_for_full_isr(admin, TOPIC)[0]
    with Producer(local.bootstrap, acks="all") as producer:
        values = [b"%06d" % i for i in range(RECORDS)]
        producer.send_batch(TOPIC, pa.table({"key": [None] * RECORDS, "value": values},
                                            schema=pa.schema([("key", pa.binary()), ("value", pa.binary())])),
                            partition=0)
        producer.flush()
    df = (spark.read.format("pymq").option("kafka.bootstrap.servers", local.bootstrap).option("subscribe", TOPIC)
          .option("maxRecordsPerPartition", PER_TASK).load())
    kill = killer(local.brokers[first.leader].pid, tmp_path / "killed")
    rows = df.select("offset", "value").mapInArrow(kill, "offset long, value binary").collect()

    assert local.brokers[first.leader].proc.poll() is not None, "the leader was not killed"
    assert sorted(row.offset for row in rows) == list(range(RECORDS))
    assert all(row.value == b"%06d" % row.offset for row in rows)
    wait_for_new_leader(local.bootstrap, TOPIC, first.leader)


def test_write_tasks_follow_a_leader_killed_mid_job(spark, cluster, tmp_path):
    """Exactly once, as the sink promises (its transactions' producers are idempotent: a request
    in flight at the kill is not stored twice): a read_committed reader sees every row once."""
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
        first = wait_for_full_isr(admin, TOPIC)[0]
    # A cluster in service has __transaction_state already: made now, with its 3 replicas (made
    # after the kill, it is refused, COORDINATOR_NOT_AVAILABLE, as Kafka refuses it too).
    with Producer(local.bootstrap, transactional_id="failover-setup") as producer:
        producer.init_transactions()
    rows = spark.range(0, RECORDS, numPartitions=RECORDS // PER_TASK).select(
        F.format_string("%06d", "id").cast("binary").alias("value"))
    kill = killer(local.brokers[first.leader].pid, tmp_path / "killed")
    (rows.mapInArrow(kill, "value binary").write.format("pymq").mode("append")
     .option("kafka.bootstrap.servers", local.bootstrap).option("topic", TOPIC).save())

    assert local.brokers[first.leader].proc.poll() is not None, "the leader was not killed"
    wait_for_new_leader(local.bootstrap, TOPIC, first.leader)
    stored = [v for _, _, _, v in read_isolated(local.bootstrap, TOPIC, 1, "read_committed")]
    assert sorted(stored) == [b"%06d" % i for i in range(RECORDS)]


def killer(pid: int, marker: Path) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function that passes rows through; the first task to get a batch, whichever it
    is (an exclusive create of `marker` decides), SIGKILLs `pid` first."""
    path = str(marker)

    def kill_once(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL))
                os.kill(pid, signal.SIGKILL)
            except FileExistsError:
                pass
            yield batch
    return kill_once


def wait_for_new_leader(bootstrap: str, topic: str, old_leader: int) -> None:
    """The tasks after the kill went through a new leader: the metadata names it (soon, if not yet)."""
    with Admin(bootstrap) as admin:
        wait_for(lambda: admin.describe_topics([topic])[0].partitions[0].leader not in (-1, old_leader), 10,
                 "the new leader in the metadata")
