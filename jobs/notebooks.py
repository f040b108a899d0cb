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
The sample data is made in that kernel too (`make_sample`, before the first notebook), with the
Spark session the notebooks then use: one JVM for the whole run.
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

from broker.process import BrokerProcess
from client import Admin, Producer
from jobs.topic_table import SyncOptions, sync
from spark_datasource.table_topic import ValueFormat

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


def shop_env(bootstrap: str, table: str) -> dict[str, str]:
    """The environment the notebooks read, for the sample data at `bootstrap` and `table`."""
    return {"PYMQ_BOOTSTRAP": bootstrap, "PYMQ_TOPIC": TOPIC, "PYMQ_TABLE": table, "PYMQ_GROUP": GROUP}


def make_sample(events: int = 6_000) -> None:
    """`sample_shop` in this process, at the broker and table its environment names (shop_env):
    what the notebooks' kernel runs before the first notebook."""
    from spark_datasource import local_spark

    sample_shop(local_spark("pymq-notebooks"), os.environ["PYMQ_BOOTSTRAP"], os.environ["PYMQ_TABLE"], events)


def sample_clicks(events: int, now_ms: int) -> list[pa.Table]:
    """The sample's click events in the order they are produced: two days (the table's first
    version), the half hour before the last one (its second), the last half hour (only on the
    broker and in the tier). Which page each event is on does not depend on `now_ms`."""
    quarter = events // 4
    return [clicks(2 * quarter, now_ms - 2 * 86_400_000, 2 * 86_400_000 - 3_600_000, seed=2 * quarter),
            clicks(quarter, now_ms - 3_600_000, 1_800_000, seed=quarter),
            clicks(events - 3 * quarter, now_ms - 1_800_000, 1_800_000, seed=3)]


def sample_shop(spark: SparkSession, bootstrap: str, table: str, events: int = 6_000) -> None:
    """Create and fill the sample topic, table and group."""
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, configs={
            "segment.bytes": 64 << 10, "remote.storage.enable": "true", "local.retention.bytes": 128 << 10,
            "retention.ms": -1})
    options = SyncOptions(TOPIC, table, bootstrap, ValueFormat.parse("json", VALUE_SCHEMA))
    *synced, tail = sample_clicks(events, int(time.time() * 1000))
    for batch in synced:
        with Producer(bootstrap, linger_ms=5) as producer:
            producer.send_batch(TOPIC, batch)
            producer.flush()
        sync(spark, options)  # one table version each
    with Producer(bootstrap, linger_ms=5) as producer:
        producer.send_batch(TOPIC, tail)
        producer.flush()
    with Admin(bootstrap) as admin:  # a dashboard that read most of each partition
        ends = admin.list_offsets({(TOPIC, p): -1 for p in range(PARTITIONS)})
        admin.alter_group_offsets(GROUP, {tp: dashboard_committed(tp[1], end) for tp, (end, _) in ends.items()})


def dashboard_committed(partition: int, log_end: int) -> int:
    """The sample group's committed offset in `partition`: 60% of it read, 15% more per partition."""
    return int(log_end * (0.6 + 0.15 * partition))


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def execute(paths: list[Path], env: dict[str, str], write: bool = False, timeout_s: int = 600,
            prepare: str = "") -> dict[Path, nbformat.NotebookNode | CellExecutionError]:
    """Run every cell of each notebook at `paths`, in order, in one kernel started with `env` in
    its environment, after the code `prepare` (a RuntimeError with its traceback if it fails);
    per notebook the executed notebook, or the CellExecutionError naming the cell that failed
    (the next notebook still runs). With `write`, save each executed notebook."""
    return asyncio.run(_execute(paths, {**os.environ, **env}, write, timeout_s, prepare))


async def _execute(paths: list[Path], env: dict[str, str], write: bool, timeout_s: int,
                   prepare: str) -> dict[Path, nbformat.NotebookNode | CellExecutionError]:
    kernel = AsyncKernelManager(kernel_name="python3")
    await kernel.start_kernel(env=env, cwd=str(NOTEBOOKS))
    client = kernel.client()
    client.start_channels()
    results: dict[Path, nbformat.NotebookNode | CellExecutionError] = {}
    try:
        await client.wait_for_ready(timeout=timeout_s)
        if prepare:
            await _run(client, prepare, timeout_s)
        for path in paths:
            await _run(client, "%reset -f", timeout_s)  # an empty namespace for each notebook
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


async def _run(client: AsyncKernelClient, code: str, timeout_s: int) -> None:
    """Run `code` in the kernel, outside any notebook, and wait for the reply."""
    msg_id = client.execute(code, silent=True, store_history=False)
    while True:
        reply = await client.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            content = reply["content"]
            if content["status"] != "ok":
                trace = "\n".join(content.get("traceback", []))
                raise RuntimeError(f"{code!r} failed in the notebook kernel: {content.get('ename')}: "
                                   f"{content.get('evalue')}\n{trace}")
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="execute without saving the outputs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pymq-notebooks-") as tmp:
        broker = BrokerProcess(Path(tmp) / "broker", TIERING_BROKER).start()
        try:
            started = time.perf_counter()
            results = execute(notebooks(), shop_env(broker.bootstrap, str(Path(tmp) / "tables" / "shop_clicks")),
                              write=not args.check, prepare="from jobs.notebooks import make_sample; make_sample()")
            for path, result in results.items():
                print(f"{path.name}: {'ok' if isinstance(result, nbformat.NotebookNode) else result}", flush=True)
            print(f"{len(results)} notebooks in {time.perf_counter() - started:.0f}s", flush=True)
            if not all(isinstance(result, nbformat.NotebookNode) for result in results.values()):
                raise SystemExit(1)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
