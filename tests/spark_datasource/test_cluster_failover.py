"""A Spark batch read over a 3-broker cluster (a real etcd) whose partition leader is killed by one
of the job's own tasks: the tasks that run after it meet a dead leader and follow the new one
inside the task. Spark's local mode runs a task once (spark.task.maxFailures does not apply), so a
task that failed would fail the job: the job's success, with every record once, is the proof."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pyarrow as pa

from broker.client import Admin, Producer
from tests.e2e.conftest import wait_for_full_isr

TOPIC = "failover"
RECORDS = 4_000
PER_TASK = 500
KILL_AT = 1_000  # the task that reads this offset kills the leader; the tasks after it meet the failover


def test_read_tasks_follow_a_leader_killed_mid_job(spark, cluster):
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

    def kill_the_leader_once(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if KILL_AT in batch.column("offset").to_pylist():
                os.kill(leader_pid, signal.SIGKILL)
            yield batch

    df = (spark.read.format("pymq").option("kafka.bootstrap.servers", local.bootstrap).option("subscribe", TOPIC)
          .option("maxRecordsPerPartition", PER_TASK).load())
    rows = df.select("offset", "value").mapInArrow(kill_the_leader_once, "offset long, value binary").collect()

    assert local.brokers[first.leader].proc.poll() is not None, "the leader was not killed"
    assert sorted(row.offset for row in rows) == list(range(RECORDS))
    assert all(row.value == b"%06d" % row.offset for row in rows)
    with Admin(local.bootstrap) as admin:
        assert admin.describe_topics([TOPIC])[0].partitions[0].leader not in (-1, first.leader)
