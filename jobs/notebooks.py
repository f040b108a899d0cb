"""Run the notebooks in notebooks/ against a real broker holding sample data.

    python -m jobs.notebooks            # execute every notebook and save it with its outputs
    python -m jobs.notebooks --check    # execute them, write nothing (what the tests do)

The notebooks take their broker, topic, table and group from the environment (`PYMQ_BOOTSTRAP`,
`PYMQ_TOPIC`, `PYMQ_TABLE`, `PYMQ_GROUP`), with defaults for the demo broker, so they run as they
are against any broker. `sample_shop(...)` builds what they are shown with here: a tiered topic of
click events over two days (three dates), a Delta table synced up to the last half hour (the rest on the broker
and in the tier), and a consumer group that is behind. Each notebook runs in its own kernel
(nbclient, the `python3` kernel of this interpreter); a cell that raises fails the run.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import nbformat
import numpy as np
import pyarrow as pa
from nbclient import NotebookClient
from pyspark.sql import SparkSession

from broker.client import Admin, Producer
from broker.process import BrokerProcess
from jobs.table_topic import ValueFormat
from jobs.topic_table import SyncOptions, sync

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TOPIC = "shop.clicks"
GROUP = "shop.dashboard"
PARTITIONS = 3
PAGES = ["/home", "/search", "/product", "/cart", "/checkout"]
VALUE_SCHEMA = "page STRING, user STRING, ms BIGINT"
TIERING_BROKER = {"remote.log.storage.system.enable": True, "remote.log.manager.task.interval.ms": 100,
                  "log.retention.check.interval.ms": 100, "file.delete.delay.ms": 0}


def clicks(n: int, start_ms: int, span_ms: int, seed: int) -> pa.Table:
    """`n` click events spread over [start_ms, start_ms + span_ms), keyed by user."""
    rng = np.random.default_rng(seed)
    times = np.sort(start_ms + rng.integers(0, span_ms, n))
    users = rng.integers(0, 200, n)
    pages = rng.choice(len(PAGES), n, p=[0.35, 0.25, 0.2, 0.12, 0.08])
    values = [json.dumps({"page": PAGES[p], "user": f"u{u}", "ms": int(rng.integers(5, 400))}).encode()
              for p, u in zip(pages, users)]
    return pa.table({"key": [f"u{u}".encode() for u in users], "value": values,
                     "timestamp": pa.array(times, pa.timestamp("ms", tz="UTC"))})


def sample_shop(spark: SparkSession, bootstrap: str, table: str, events: int = 6_000) -> dict[str, str]:
    """Create and fill the sample topic, table and group; the environment the notebooks read."""
    now_ms = int(time.time() * 1000)
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, configs={
            "segment.bytes": 64 << 10, "remote.storage.enable": "true", "local.retention.bytes": 128 << 10,
            "retention.ms": -1})
    quarter = events // 4
    options = SyncOptions(TOPIC, table, bootstrap, ValueFormat.parse("json", VALUE_SCHEMA))
    for n, start_ms, span_ms in ((2 * quarter, now_ms - 2 * 86_400_000, 2 * 86_400_000 - 3_600_000),  # two days
                                 (quarter, now_ms - 3_600_000, 1_800_000)):  # the half hour before the last one
        with Producer(bootstrap, linger_ms=5) as producer:
            producer.send_batch(TOPIC, clicks(n, start_ms, span_ms, seed=n))
            producer.flush()
        sync(spark, options)  # one table version each
    with Producer(bootstrap, linger_ms=5) as producer:  # the last half hour: only on the broker and in the tier
        producer.send_batch(TOPIC, clicks(events - 3 * quarter, now_ms - 1_800_000, 1_800_000, seed=3))
        producer.flush()
    with Admin(bootstrap) as admin:  # a dashboard that read most of each partition
        ends = admin.list_offsets({(TOPIC, p): -1 for p in range(PARTITIONS)})
        admin.alter_group_offsets(GROUP, {tp: int(end * (0.6 + 0.15 * tp[1])) for tp, (end, _) in ends.items()})
    return {"PYMQ_BOOTSTRAP": bootstrap, "PYMQ_TOPIC": TOPIC, "PYMQ_TABLE": table, "PYMQ_GROUP": GROUP}


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def execute(path: Path, env: dict[str, str], write: bool = False, timeout_s: int = 600) -> nbformat.NotebookNode:
    """Run every cell of the notebook at `path` in a fresh kernel with `env` set; raises
    nbclient's CellExecutionError naming the cell that failed. With `write`, save the outputs."""
    notebook = nbformat.read(path, as_version=4)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if write:
        nbformat.write(notebook, path)
    return notebook


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="execute without saving the outputs")
    args = parser.parse_args(argv)
    from spark_datasource import local_spark

    with tempfile.TemporaryDirectory(prefix="pymq-notebooks-") as tmp:
        broker = BrokerProcess(Path(tmp) / "broker", TIERING_BROKER).start()
        try:
            spark = local_spark("pymq-notebook-data")
            env = sample_shop(spark, broker.bootstrap, str(Path(tmp) / "tables" / "shop_clicks"))
            spark.stop()
            for path in notebooks():
                started = time.perf_counter()
                execute(path, env, write=not args.check)
                print(f"{path.name}: ok in {time.perf_counter() - started:.0f}s", flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
