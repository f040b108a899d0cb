"""A Spark batch read over a 3-broker cluster (a real etcd) whose partition leader is killed by the
first of the job's tasks to get records: the tasks that start after it (local[2] runs two at a
time, so most of the job's eight) meet a dead leader and follow the new one inside the task.
Spark's local mode runs a task once (spark.task.maxFailures does not apply), so a task that failed
would fail the job: the job's success, with every record once, is the proof."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pyarrow as pa

from broker.client import Admin, Producer
from tests.e2e.conftest import wait_for, wait_for_full_isr

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
    leader_pid = local.brokers[first.leader].pid
    killed = str(tmp_path / "killed")

    def kill_the_leader_once(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            try:  # the first task here, whichever it is, kills (an exclusive create decides)
                os.close(os.open(killed, os.O_CREAT | os.O_EXCL))
                os.kill(leader_pid, signal.SIGKILL)
            except FileExistsError:
                pass
            yield batch

    df = (spark.read.format("pymq").option("kafka.bootstrap.servers", local.bootstrap).option("subscribe", TOPIC)
          .option("maxRecordsPerPartition", PER_TASK).load())
    rows = df.select("offset", "value").mapInArrow(kill_the_leader_once, "offset long, value binary").collect()

    assert local.brokers[first.leader].proc.poll() is not None, "the leader was not killed"
    assert sorted(row.offset for row in rows) == list(range(RECORDS))
    assert all(row.value == b"%06d" % row.offset for row in rows)
    with Admin(local.bootstrap) as admin:  # the tasks after the kill read from a new leader: it is known
        wait_for(lambda: admin.describe_topics([TOPIC])[0].partitions[0].leader not in (-1, first.leader), 10,
                 "the new leader in the metadata")
