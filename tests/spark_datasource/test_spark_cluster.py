"""`format("pymq")` off local[2]: on a Spark standalone cluster (a Master, a Worker and its
executor JVMs from pyspark's own `bin/spark-class`, a driver started by `spark-submit`) and over
Spark Connect (a server started by `spark-submit --class SparkConnectServer`, a remote session in
a Python process of its own). Each deployment runs cluster_driver.py once (a batch read, a
streaming query to Parquet, a batch write) and the tests check its results against what the broker
holds. On the standalone cluster the executor JVM is SIGKILLed while the stream still has
micro-batches to run: the query must end with exactly the topic's rows.

Each deployment's JVMs start once for the module (a module-scoped, parametrized fixture); none of
them is the suite's shared `spark` session (one classic session per JVM, and a Connect session
switches its whole Python process to Connect mode).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from client import Admin, Producer
from common.child_process import die_with_parent
from spark_datasource.spark_daemons import LOG4J, ConnectServer, StandaloneCluster, spark_env
from tests.waiting import wait_until

DRIVER = Path(__file__).resolve().parent / "cluster_driver.py"
PARTITIONS = 2
RECORDS = 600
PER_TRIGGER = 100  # six micro-batches: the executor dies after the first, with five still to run
SINK_ROWS = 300
DRIVER_TIMEOUT_S = 420.0
# Each deployment's first test also sets up its JVMs and runs the driver (1.5-3 min at a load
# average of 5-14 on 2 cores): more than the suite's 300 s per test would allow on a worse day.
pytestmark = pytest.mark.timeout(900)


@dataclass
class Run:
    """One run of cluster_driver.py: its results, the source topic as the broker holds it, what
    the sink topic holds afterwards, and (standalone only) the executor kill."""

    deployment: str
    results: dict[str, Any]
    source: list[tuple[int, int, str]]
    sink: list[str]
    killed_after_commits: int | None = None


def produce(bootstrap: str, source: str, sink: str) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(source, partitions=PARTITIONS)
        admin.create_topic(sink, partitions=PARTITIONS)
    with Producer(bootstrap, linger_ms=5, acks="all") as producer:
        for i in range(RECORDS):
            producer.send(source, f"v-{i:04d}".encode(), partition=i % PARTITIONS)
        producer.flush()


def commits(out: Path) -> int:
    """Micro-batches the streaming query has committed (files in its checkpoint's commits/)."""
    folder = out / "checkpoint" / "commits"
    return sum(1 for path in folder.iterdir() if path.name.isdigit()) if folder.exists() else 0


def start_driver(args: list[str], work: Path) -> subprocess.Popen[bytes]:
    with open(work / "driver.log", "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=spark_env(), preexec_fn=die_with_parent)


def finish(driver: subprocess.Popen[bytes], work: Path) -> dict[str, Any]:
    """The driver's results once it exits; its log in the failure if it fails."""
    try:
        code = driver.wait(DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait()
        code = None
    log = (work / "driver.log").read_text(errors="replace")
    assert code == 0, f"driver exited with {code}; log:\n{log[-6000:]}"
    return json.loads((work / "out" / "results.json").read_text())


def kill_executor_mid_stream(cluster: StandaloneCluster, driver: subprocess.Popen[bytes], out: Path) -> int:
    """SIGKILL the executor JVM once the stream has committed its first micro-batch; the number of
    micro-batches committed at that moment."""
    wait_until(lambda: commits(out) > 0 or driver.poll() is not None, DRIVER_TIMEOUT_S, "the stream's first commit")
    assert driver.poll() is None, f"the driver exited before its stream committed a micro-batch; log {out.parent / 'driver.log'}"
    executor = wait_until(cluster.executor_pids, 60, "an executor JVM under the worker")[0]
    committed = commits(out)
    os.kill(executor, signal.SIGKILL)
    return committed


def run_standalone(work: Path, spec: Path) -> tuple[dict[str, Any], int]:
    cluster = StandaloneCluster(work / "cluster").start()
    try:
        conf = {"spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={LOG4J.as_uri()}",
                "spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "2"}
        driver = start_driver([*cluster.submit_args(conf), str(DRIVER), str(spec)], work)
        try:
            killed_after = kill_executor_mid_stream(cluster, driver, work / "out")
            return finish(driver, work), killed_after
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    finally:
        cluster.stop()


def run_connect(work: Path, spec: Path) -> dict[str, Any]:
    server = ConnectServer(work / "server", conf={"spark.sql.shuffle.partitions": "2"}).start_server()
    try:
        spec.write_text(json.dumps({**json.loads(spec.read_text()), "remote": server.url}))
        return finish(start_driver([sys.executable, str(DRIVER), str(spec)], work), work)
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["standalone", "connect"])
def run(request: pytest.FixtureRequest, source_broker, consume_all,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    deployment = request.param
    work = tmp_path_factory.mktemp(f"spark-{deployment}")
    (work / "out").mkdir()
    bootstrap = source_broker.bootstrap
    source, sink = f"{deployment}-source", f"{deployment}-sink"
    produce(bootstrap, source, sink)
    stored = consume_all(bootstrap, source, PARTITIONS, RECORDS)
    spec = work / "spec.json"
    spec.write_text(json.dumps({"bootstrap": bootstrap, "source": source, "sink": sink, "rows": SINK_ROWS,
                                "per_trigger": PER_TRIGGER, "out": str(work / "out"), "remote": None}))
    killed_after = None
    if deployment == "standalone":
        results, killed_after = run_standalone(work, spec)
    else:
        results = run_connect(work, spec)
    written = consume_all(bootstrap, sink, PARTITIONS, SINK_ROWS)["value"].to_pylist()
    yield Run(deployment, results,
              sorted(zip(stored["partition"].to_pylist(), stored["offset"].to_pylist(),
                         [value.decode() for value in stored["value"].to_pylist()])),
              sorted(value.decode() for value in written), killed_after)


def test_batch_read_returns_the_topic(run: Run) -> None:
    """A batch read on the cluster / over Spark Connect returns every record once, at its partition and offset."""
    assert sorted(tuple(row) for row in run.results["batch"]) == run.source


def test_stream_to_parquet_is_exactly_once(run: Run) -> None:
    """A streaming query (AvailableNow, small micro-batches) to Parquet ends with exactly the topic's values; on the standalone cluster through a SIGKILLed executor."""
    values = run.results["stream"]["values"]
    assert sorted(values) == sorted(value for _, _, value in run.source)
    if run.deployment == "standalone":
        assert run.killed_after_commits is not None
        assert run.killed_after_commits < run.results["stream"]["batches"], \
            "the executor died after the stream's last micro-batch: the kill proved nothing"


def test_sink_writes_every_row_once(run: Run) -> None:
    """`df.write.format("pymq")` on the cluster / over Spark Connect stores each row exactly once."""
    assert run.results["write"] == SINK_ROWS
    assert run.sink == sorted(f"w-{i}" for i in range(SINK_ROWS))
