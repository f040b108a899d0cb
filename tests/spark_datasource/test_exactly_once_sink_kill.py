"""Exactly once through driver crashes: Spark drivers (each its own process and local[2] JVM,
eos_sink_driver.py) run two streaming queries writing exactly once to `pymq`: a copy
(pymq -> pymq) into the streaming sink, and a stateful aggregation (pymq -> count per key ->
pymq) in Update mode (which Spark 4.2 refuses for Python data source sinks) through foreachBatch
and versioned batch writes (`txnAppId`, `txnVersion`). They are SIGKILLed while a micro-batch's
transactions are prepared but not committed, restarted from their checkpoints, SIGKILLed so again,
and restarted to catch up. A read_committed consumer then sees every input record once in the
copy, and each key's running count once per value, ending at its true count, in the updates."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.process import BrokerProcess
from client import Admin, Producer
from common.errors import PymqError
from spark_datasource.sink_transactions import TransactionNaming
from tests.helpers.isolated_reads import read_isolated
from tests.spark_datasource.eos_sink_driver import SHUFFLE_PARTITIONS
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

SOURCE = "eos-in"
SOURCE_PARTITIONS = 4  # two waves of tasks on local[2]: the first wave's transactions wait prepared
OUTPUT_PARTITIONS = 2
KEYS = 12
RECORDS = 1_800  # six micro-batches: room for a third kill when one lands after its batch's commit
PER_TRIGGER = 300
DRIVER = Path(__file__).with_name("eos_sink_driver.py")
QUERIES = ("copy", "update")  # eos_sink_driver.py's, each writing `{SOURCE}-{name}`


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "broker", {"transaction.state.log.num.partitions": 3}).start()
    yield process
    process.kill()


def batch_files(folder: Path) -> set[int]:
    return {int(f.name) for f in folder.glob("[0-9]*")} if folder.exists() else set()


class Driver:
    """eos_sink_driver.py once per query, each in its own session (SIGKILL reaches its JVM and
    Python workers too)."""

    def __init__(self, bootstrap: str, folder: Path, mode: str, run: int) -> None:
        self.logs = [folder / f"driver-{run}-{name}.err" for name in QUERIES]
        self.processes = [
            subprocess.Popen([sys.executable, str(DRIVER), bootstrap, SOURCE, str(folder), str(PER_TRIGGER), mode, name],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
            for name, log in zip(QUERIES, self.logs)]

    def alive(self) -> None:
        assert all(process.poll() is None for process in self.processes), self.errors()

    def wait(self, timeout_s: float) -> None:
        """Until every driver exits; each must exit 0."""
        for process in self.processes:
            process.wait(timeout_s)
        assert all(process.returncode == 0 for process in self.processes), self.errors()

    def errors(self) -> str:
        """The drivers' stderr without Java stack frames: what they said before they died."""
        lines = [line for log in self.logs for line in log.read_text().splitlines()
                 if not line.lstrip().startswith("at ")]
        return "\n".join(lines[-80:])

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(60)


def transactional_ids(folder: Path) -> list[str]:
    copy = TransactionNaming.for_stream(None, str(folder / "copy")).prefix
    return ([f"{copy}-{p}" for p in range(SOURCE_PARTITIONS)] +
            [f"{SOURCE}-update-{p}" for p in range(SHUFFLE_PARTITIONS)])


def prepared(admin: Admin, ids: list[str]) -> list[str]:
    """The ids whose transaction is prepared (unknown ids: none yet)."""
    found = []
    for transactional_id in ids:
        try:
            state = admin.describe_transactions([transactional_id])[0].state
        except PymqError:
            continue
        if state == "Prepared":
            found.append(transactional_id)
    return found


def finished(checkpoint: Path) -> bool:
    """Whether the query's last committed batch ends at the source's end: it has nothing left to
    run (the copy is faster than the count: on a busy machine it can finish in the first run)."""
    done = batch_files(checkpoint / "commits")
    if not done:
        return False
    ends = json.loads((checkpoint / "offsets" / str(max(done))).read_text().splitlines()[2])[SOURCE]
    return all(end == RECORDS // SOURCE_PARTITIONS for end in ends.values())


def run_and_kill(bootstrap: str, folder: Path, run: int) -> list[str]:
    """Start the driver; once each query committed a batch in this run (so the earlier run's
    prepared leftovers are resolved) or has finished, and a batch's transactions are seen
    prepared, SIGKILL it. Returns the ids still prepared after the kill: a commit already on its
    way when the kill lands completes (the broker has the requests), so the ones seen prepared
    can be committed by then."""
    commits = {name: batch_files(folder / name / "commits") for name in QUERIES}
    driver = Driver(bootstrap, folder, "run", run)
    ids = transactional_ids(folder)
    try:
        with Admin(bootstrap) as admin:
            def progressed() -> bool:
                driver.alive()
                return all(batch_files(folder / name / "commits") - done or finished(folder / name)
                           for name, done in commits.items())

            wait_until(progressed, 300, f"run {run}: a batch committed by each query", interval_s=0.1)
            wait_until(lambda: driver.alive() or prepared(admin, ids), 300, f"run {run}: a prepared transaction",
                       interval_s=0.01)
    finally:
        driver.kill()
    with Admin(bootstrap) as admin:  # the driver is dead: nobody commits them
        return prepared(admin, ids)


def test_driver_sigkilled_twice_mid_batch_then_restarted_writes_each_record_once(broker: BrokerProcess,
                                                                                tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(SOURCE, partitions=SOURCE_PARTITIONS)
        for name in QUERIES:
            admin.create_topic(f"{SOURCE}-{name}", partitions=OUTPUT_PARTITIONS)
    records = [(b"k%02d" % (i % KEYS), b"v%05d" % i) for i in range(RECORDS)]
    with Producer(bootstrap, linger_ms=5) as producer:
        futures = [producer.send(SOURCE, v, key=k, partition=i % SOURCE_PARTITIONS) for i, (k, v) in enumerate(records)]
        producer.flush()
        for future in futures:
            future.result(30)

    kills = [run_and_kill(bootstrap, tmp_path, 1)]
    while sum(1 for left in kills if left) < 2:  # two kills that left prepared transactions behind
        assert len(kills) < 4, f"the kills left these transactions prepared: {kills}"
        kills.append(run_and_kill(bootstrap, tmp_path, len(kills) + 1))

    final = Driver(bootstrap, tmp_path, "catch-up", len(kills) + 1)
    final.wait(600)

    copy = read_isolated(bootstrap, f"{SOURCE}-copy", OUTPUT_PARTITIONS, "read_committed")
    assert Counter((k, v) for _, _, k, v in copy) == Counter(records)
    updates = read_isolated(bootstrap, f"{SOURCE}-update", OUTPUT_PARTITIONS, "read_committed")
    running: dict[bytes, list[int]] = {}
    for _, _, k, v in updates:  # in offset order per partition, and a key stays in one partition
        running.setdefault(k, []).append(int(v))
    # A replayed micro-batch written twice would repeat a count; a lost one, end short of the truth.
    assert {k: sorted(set(c)) for k, c in running.items()} == running
    assert {k: c[-1] for k, c in running.items()} == Counter(k for k, _ in records)
    # The kills left prepared transactions with rows: the restarts aborted them, and their rows
    # are in the log for read_uncommitted readers only.
    written = sum(len(read_isolated(bootstrap, f"{SOURCE}-{name}", OUTPUT_PARTITIONS, "read_uncommitted"))
                  for name in QUERIES)
    assert written > len(copy) + len(updates)

