"""Exactly once through a crash: `pymq table sync` (its own driver process and JVM) is SIGKILLed
while a micro-batch is in flight and a producer keeps writing; a restart from the same checkpoint
catches up, and the table then holds every record of the topic exactly once, values included."""
from __future__ import annotations

import os
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from client import Admin, Producer
from broker.process import BrokerProcess
from jobs.topic_table import SyncOptions, sync
from spark_datasource.table_topic import TableTopic
from tests.waiting import wait_until

TOPIC = "table-kill"
PARTITIONS = 3
PER_ROUND = 150
AFTER_KILL_ROUNDS = 20


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", {}).start()
    yield process
    process.kill()


def produce_slowly(bootstrap: str, killed: threading.Event, rounds: list[int], failed: list[BaseException]) -> None:
    """Sends of PER_ROUND records each, round robin over the partitions, 50 ms apart, until
    AFTER_KILL_ROUNDS rounds after the kill."""
    try:
        with Producer(bootstrap, linger_ms=5) as producer:
            after = 0
            for n in itertools.count():
                if killed.is_set():
                    after += 1
                    if after > AFTER_KILL_ROUNDS:
                        break
                rounds.append(n)
                values = [b"r%04d-%04d" % (n, i) for i in range(PER_ROUND)]
                producer.send_batch(TOPIC, pa.table({"key": [None] * PER_ROUND, "value": values},
                                                    schema=pa.schema([("key", pa.binary()), ("value", pa.binary())])),
                                    partition=n % PARTITIONS)
                time.sleep(0.05)  # pacing, not waiting: the job must see records arrive across its batches
            producer.flush()
    except BaseException as err:  # reported by the test
        failed.append(err)


def batch_files(folder: Path) -> set[int]:
    return {int(f.name) for f in folder.glob("[0-9]*")} if folder.exists() else set()


def test_sigkill_mid_batch_then_restart_holds_every_record_once(spark, broker: BrokerProcess, tmp_path: Path) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS)
    table = tmp_path / "table"
    checkpoint = table / "_pymq_sync_checkpoint"
    killed, rounds, failed = threading.Event(), [], []
    producer = threading.Thread(target=produce_slowly, args=(broker.bootstrap, killed, rounds, failed))
    producer.start()
    driver = subprocess.Popen(
        [sys.executable, "-m", "jobs.topic_table", TOPIC, "--table", str(table), "-b", broker.bootstrap,
         "--trigger", "500 milliseconds", "--max-offsets-per-trigger", "1500"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sync.err", "wb"))
    try:
        def batch_in_flight() -> bool:  # planned (offset log) but not committed, after one that was
            planned, committed = batch_files(checkpoint / "offsets"), batch_files(checkpoint / "commits")
            assert driver.poll() is None, (tmp_path / "sync.err").read_text()[-3000:]
            return bool(committed and planned and max(planned) > max(committed))

        wait_until(batch_in_flight, 240, "a batch planned but not committed, after a committed one", interval_s=0.01)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        killed.set()
        planned = batch_files(checkpoint / "offsets")  # final: the driver is dead
    finally:
        killed.set()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    producer.join(120)
    assert not failed, failed
    assert planned and max(planned) not in batch_files(checkpoint / "commits")  # killed mid-batch indeed

    sync(spark, SyncOptions(TOPIC, str(table), broker.bootstrap))  # the restart, from the same checkpoint

    rows = spark.read.format("delta").load(str(table))
    topic = (spark.read.format("pymq").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", TOPIC).load())
    assert rows.count() == len(rounds) * PER_ROUND
    assert rows.groupBy("partition", "offset").count().where("count > 1").count() == 0
    columns = ["partition", "offset", "value"]
    assert rows.select(*columns).exceptAll(topic.select(*columns)).count() == 0
    assert topic.select(*columns).exceptAll(rows.select(*columns)).count() == 0
    ends = {p: o for p, o in TableTopic(spark, str(table)).position().offsets.items()}
    assert sum(ends.values()) == len(rounds) * PER_ROUND
