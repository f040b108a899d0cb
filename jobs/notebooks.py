"""Run the notebooks in notebooks/ against a real broker holding sample data.

    python -m jobs.notebooks            # execute every notebook and save it with its outputs
    python -m jobs.notebooks --check    # execute them, write nothing (what the tests do)

The notebooks take their broker, topic, table and group from the environment (`PYMQ_BOOTSTRAP`,
`PYMQ_TOPIC`, `PYMQ_TABLE`, `PYMQ_GROUP`), with defaults for the demo broker, so they run as they
are against any broker. `sample_shop(...)` builds what they are shown with here: a tiered topic of
click events over two days (three dates), a Delta table synced up to the last half hour (the rest on the broker
and in the tier), and a consumer group that is behind. The notebooks run one after the other in one
kernel (nbclient, the `python3` kernel of this interpreter), its namespace reset before each
(`%reset -f`: a notebook that forgets an import or a variable still fails), so Python, Spark's JVM
and its first-query costs are paid once, not per notebook; a cell that raises fails its notebook.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import nbformat
import numpy as np
import pyarrow as pa
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
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


def execute(paths: list[Path], env: dict[str, str], write: bool = False,
            timeout_s: int = 600) -> dict[Path, nbformat.NotebookNode | CellExecutionError]:
    """Run every cell of each notebook at `paths`, in order, in one kernel started with `env` in
    its environment; per notebook the executed notebook, or the CellExecutionError naming the cell
    that failed (the next notebook still runs). With `write`, save each executed notebook."""
    return asyncio.run(_execute(paths, {**os.environ, **env}, write, timeout_s))


async def _execute(paths: list[Path], env: dict[str, str], write: bool,
                   timeout_s: int) -> dict[Path, nbformat.NotebookNode | CellExecutionError]:
    kernel = AsyncKernelManager(kernel_name="python3")
    await kernel.start_kernel(env=env, cwd=str(NOTEBOOKS))
    client = kernel.client()
    client.start_channels()
    results: dict[Path, nbformat.NotebookNode | CellExecutionError] = {}
    try:
        await client.wait_for_ready(timeout=timeout_s)
        for path in paths:
            await _reset(client, timeout_s)
            notebook = nbformat.read(path, as_version=4)
            runner = NotebookClient(notebook, km=kernel, timeout=timeout_s, kernel_name="python3",
                                    resources={"metadata": {"path": str(path.parent)}})
            runner.kc = client  # the kernel's one client: nbclient neither starts nor stops another
            try:
                await runner.async_execute()
                results[path] = notebook
            except CellExecutionError as err:
                results[path] = err
                continue
            if write:
                nbformat.write(notebook, path)
    finally:
        client.stop_channels()
        await kernel.shutdown_kernel(now=True)
    return results


async def _reset(client: AsyncKernelClient, timeout_s: int) -> None:
    """Empty the kernel's namespace (`%reset -f`) and wait for the reply."""
    msg_id = client.execute("%reset -f", silent=True, store_history=False)
    while True:
        reply = await client.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"cannot reset the notebook kernel: {reply['content']}")
            return


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
            started = time.perf_counter()
            results = execute(notebooks(), env, write=not args.check)
            for path, result in results.items():
                print(f"{path.name}: {'ok' if isinstance(result, nbformat.NotebookNode) else result}", flush=True)
            print(f"{len(results)} notebooks in {time.perf_counter() - started:.0f}s", flush=True)
            if not all(isinstance(result, nbformat.NotebookNode) for result in results.values()):
                raise SystemExit(1)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
