"""Exactly once through a crash, with typed values: `pymq table sync --value-format json
--value-schema DDL` (its own driver process and JVM, run as a user runs it) is SIGKILLed while a
micro-batch is in flight and a producer keeps writing; a restart from the same checkpoint catches
up, and the table then holds every record of the topic exactly once, each value decoded into the
schema's typed columns.

The one subprocess JVM proves both the command line's value-format path (the schema is parsed once
Spark's session exists, the table records the format, the values land typed) and the kill: a
second JVM for the command alone cost the Spark worker ~30 s.
"""
from __future__ import annotations

import itertools
import json
import os
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
from spark_datasource.table_topic import TableTopic, ValueFormat
from tests.waiting import wait_until

TOPIC = "table-kill"
PARTITIONS = 3
PER_ROUND = 150
AFTER_KILL_ROUNDS = 20
VALUE_SCHEMA = "round INT, i INT, tag STRING"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", {}).start()
    yield process
    process.kill()


def value(n: int, i: int) -> bytes:
    """The JSON value of record `i` of round `n`: VALUE_SCHEMA's fields."""
    return json.dumps({"round": n, "i": i, "tag": f"r{n:04d}-{i:04d}"}).encode()


def produce_slowly(bootstrap: str, started: threading.Event, killed: threading.Event, rounds: list[int],
                   failed: list[BaseException]) -> None:
    """From when the sync's query has started: sends of PER_ROUND records each, round robin over
    the partitions, 50 ms apart, until AFTER_KILL_ROUNDS rounds after the kill. (Records sent while
    the job's JVM starts would only make the restart and the checks read more.)"""
    try:
        started.wait()
        with Producer(bootstrap, linger_ms=5) as producer:
            after = 0
            for n in itertools.count():
                if killed.is_set():
                    after += 1
                    if after > AFTER_KILL_ROUNDS:
                        break
                rounds.append(n)
                values = [value(n, i) for i in range(PER_ROUND)]
                producer.send_batch(TOPIC, pa.table({"key": [None] * PER_ROUND, "value": values},
                                                    schema=pa.schema([("key", pa.binary()), ("value", pa.binary())])),
                                    partition=n % PARTITIONS)
                time.sleep(0.05)  # pacing, not waiting: the job must see records arrive across its batches
            producer.flush()
    except BaseException as err:  # reported by the test
        failed.append(err)


def batch_files(folder: Path) -> set[int]:
    return {int(f.name) for f in folder.glob("[0-9]*")} if folder.exists() else set()


def test_sigkill_mid_batch_of_the_sync_command_then_restart_holds_every_record_once_typed(
        spark, broker: BrokerProcess, tmp_path: Path) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS)
    table = tmp_path / "table"
    checkpoint = table / "_pymq_sync_checkpoint"
    started, killed, rounds, failed = threading.Event(), threading.Event(), [], []
    producer = threading.Thread(target=produce_slowly, args=(broker.bootstrap, started, killed, rounds, failed))
    producer.start()
    driver = subprocess.Popen(
        [sys.executable, "-m", "cli", "table", "sync", TOPIC, "--table", str(table), "-b", broker.bootstrap,
         "--value-format", "json", "--value-schema", VALUE_SCHEMA,
         "--trigger", "500 milliseconds", "--max-offsets-per-trigger", "1500"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sync.err", "wb"))
    try:
        def alive() -> None:
            assert driver.poll() is None, (tmp_path / "sync.err").read_text()[-3000:]

        def query_started() -> bool:  # the query writes its checkpoint's metadata before any batch
            alive()
            return (checkpoint / "metadata").exists()

        def batch_in_flight() -> bool:  # planned (offset log) but not committed, after one that was
            planned, committed = batch_files(checkpoint / "offsets"), batch_files(checkpoint / "commits")
            alive()
            return bool(committed and planned and max(planned) > max(committed))

        wait_until(query_started, 240, "the sync's query started", interval_s=0.1)
        started.set()
        wait_until(batch_in_flight, 240, "a batch planned but not committed, after a committed one", interval_s=0.01)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        killed.set()
        planned = batch_files(checkpoint / "offsets")  # final: the driver is dead
    finally:
        started.set()
        killed.set()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    producer.join(120)
    assert not failed, failed
    assert planned and max(planned) not in batch_files(checkpoint / "commits")  # killed mid-batch indeed

    # The restart, from the same checkpoint: the table the command made must mirror this topic
    # with this format and schema, or the sync refuses it.
    sync(spark, SyncOptions(TOPIC, str(table), broker.bootstrap, ValueFormat.parse("json", VALUE_SCHEMA)))

    rows = spark.read.format("delta").load(str(table))
    assert rows.schema["value"].dataType.simpleString() == "struct<round:int,i:int,tag:string>"
    got = sorted((r["partition"], r["offset"], r["round"], r["i"], r["tag"], r["malformedValue"])
                 for r in rows.select("partition", "offset", "value.round", "value.i", "value.tag",
                                      "malformedValue").collect())
    topic = (spark.read.format("pymq").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", TOPIC).load())
    # The topic read back, each value decoded here with Python's json: what the table must hold,
    # once per record (a duplicate or a missing record, or a value left undecoded, differs).
    want = sorted((r["partition"], r["offset"], *json.loads(r["value"]).values(), None)
                  for r in topic.select("partition", "offset", "value").collect())
    assert len(want) == len(rounds) * PER_ROUND
    assert got == want
    ends = {p: o for p, o in TableTopic(spark, str(table)).position().offsets.items()}
    assert sum(ends.values()) == len(rounds) * PER_ROUND
