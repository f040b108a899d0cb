"""Exactly once through a crash, with typed values: `pymq table sync --value-format json
--value-schema DDL` (its own driver process and JVM, run as a user runs it) is SIGKILLed while a
micro-batch is in flight and a producer keeps writing; the same command, run again from the same
checkpoint, catches up, and the table then holds every record of the topic exactly once, each
value decoded into the schema's typed columns.

The table is checked without Spark: its rows and schema read with delta-rs, its position from its
log (TableLog), the topic read back with the client. So the test does not wait on the suite's
Spark session's worker (the one worker that runs every test using the session): its two JVMs run
beside that worker's tests, not in its queue.
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

from deltalake import DeltaTable

from broker.process import BrokerProcess
from client import Admin, Producer
from spark_datasource.table_log import TableLog
from tests.helpers.isolated_reads import read_isolated
from tests.waiting import wait_until

TOPIC = "table-kill"
PARTITIONS = 3
PER_ROUND = 150
AFTER_KILL_ROUNDS = 20
VALUE_SCHEMA = "round INT, i INT, tag STRING"
RESTART_TIMEOUT_S = 300


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


def sync_command(bootstrap: str, table: Path, *trigger: str) -> list[str]:
    """`pymq table sync` of TOPIC into `table`, values decoded as VALUE_SCHEMA's JSON."""
    return [sys.executable, "-m", "cli", "table", "sync", TOPIC, "--table", str(table), "-b", bootstrap,
            "--value-format", "json", "--value-schema", VALUE_SCHEMA, *trigger]


def test_sigkill_mid_batch_of_the_sync_command_then_restart_holds_every_record_once_typed(
        broker: BrokerProcess, tmp_path: Path) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS)
    table = tmp_path / "table"
    checkpoint = table / "_pymq_sync_checkpoint"
    started, killed, rounds, failed = threading.Event(), threading.Event(), [], []
    producer = threading.Thread(target=produce_slowly, args=(broker.bootstrap, started, killed, rounds, failed))
    producer.start()
    driver = subprocess.Popen(
        sync_command(broker.bootstrap, table, "--trigger", "500 milliseconds", "--max-offsets-per-trigger", "1500"),
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

    # The restart, from the same checkpoint (available-now: it catches up, then ends): the table the
    # killed command made must mirror this topic with this format and schema, or the sync refuses it.
    restart = subprocess.run(sync_command(broker.bootstrap, table), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, timeout=RESTART_TIMEOUT_S)
    assert restart.returncode == 0, restart.stderr.decode(errors="replace")[-3000:]

    delta = DeltaTable(str(table))
    fields = {f["name"]: f["type"] for f in json.loads(delta.schema().to_json())["fields"]}
    assert [(f["name"], f["type"]) for f in fields["value"]["fields"]] == [
        ("round", "integer"), ("i", "integer"), ("tag", "string")]
    rows = delta.to_pyarrow_table(columns=["partition", "offset", "value", "malformedValue"]).to_pylist()
    got = sorted((r["partition"], r["offset"], r["value"]["round"], r["value"]["i"], r["value"]["tag"],
                  r["malformedValue"]) for r in rows)
    # The topic read back, each value decoded here with Python's json: what the table must hold,
    # once per record (a duplicate or a missing record, or a value left undecoded, differs).
    want = sorted((p, o, *json.loads(v).values(), None)
                  for p, o, _, v in read_isolated(broker.bootstrap, TOPIC, PARTITIONS, "read_committed"))
    assert len(want) == len(rounds) * PER_ROUND
    assert got == want
    assert sum(TableLog(str(table)).position().offsets.values()) == len(rounds) * PER_ROUND
