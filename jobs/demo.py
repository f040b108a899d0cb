"""The main job: one broker on conf/broker.toml, a topic, a demo stream produced and consumed.

Run with `make run` (or `python -m jobs.demo`). It starts `pymq broker start` as a child
process (broker.process.BrokerProcess; broker output in data/broker.out), creates the topic `demo.events` if needed, produces a columnar batch of click events
plus a few single records, reads every partition back from the start as Arrow, checks that
nothing was lost or reordered, prints a summary and stops the broker cleanly.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from broker.client import Admin, Consumer, Producer
from broker.config import BrokerConfig
from broker.process import BrokerProcess
from broker.errors import TopicAlreadyExistsError

CONFIG = Path(__file__).resolve().parent.parent / "conf" / "broker.toml"
TOPIC = "demo.events"
EVENTS = 200_000
console = Console()


def click_events(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    users = pc.binary_join_element_wise(pa.array(np.full(n, "user-")), pc.cast(pa.array(rng.integers(0, 1000, n)), pa.string()), "")
    pages = pa.array(np.array(["/home", "/search", "/cart", "/checkout"])[rng.integers(0, 4, n)])
    values = pc.binary_join_element_wise(pa.array(np.full(n, '{"page": "')), pages, pa.array(np.full(n, '"}')), "")
    return pa.table({"key": users, "value": values})


def main() -> None:
    config = BrokerConfig.load(CONFIG)
    broker = BrokerProcess(Path(config["log.dir"]), {"port": config["port"]}, config_file=CONFIG,
                           output=Path(config["log.dir"]).parent / "broker.out")
    try:
        broker.start()
    except RuntimeError as err:
        raise SystemExit(f"{err}\n(is port {config['port']} free?)") from None
    bootstrap = broker.bootstrap
    try:
        console.print(f"[bold]broker[/] {bootstrap} (log.dir {config['log.dir']})")
        with Admin(bootstrap) as admin:
            try:
                admin.create_topic(TOPIC, partitions=3)
            except TopicAlreadyExistsError:
                pass
            before = admin.list_offsets({(TOPIC, p): -1 for p in range(3)})

        events = click_events(EVENTS)
        started = time.perf_counter()
        with Producer(bootstrap, linger_ms=5, compression="lz4") as producer:
            producer.send_batch(TOPIC, events)
            singles = [producer.send(TOPIC, f"single-{i}".encode(), key=b"user-1") for i in range(1000)]
            producer.flush()
        produce_s = time.perf_counter() - started
        partitions_of_user_1 = {f.result().partition for f in singles}

        consumer = Consumer(bootstrap, auto_offset_reset="earliest")
        consumer.assign([(TOPIC, p) for p in range(3)])
        for tp, offset in before.items():
            consumer.seek(tp, offset[0])
        started = time.perf_counter()
        tables = []
        received = 0
        while received < EVENTS + 1000:
            table = consumer.poll_arrow(timeout_ms=2000)
            if table.num_rows == 0:
                break
            tables.append(table)
            received += table.num_rows
        consume_s = time.perf_counter() - started
        consumer.close()
        table = pa.concat_tables(tables) if tables else None

        summary = Table(title=f"topic {TOPIC}")
        for column in ("partition", "records", "first offset", "last offset"):
            summary.add_column(column, justify="right")
        if table is not None:
            for p in range(3):
                rows = table.filter(pc.equal(table["partition"], p))
                if rows.num_rows:
                    summary.add_row(str(p), f"{rows.num_rows:,}", str(pc.min(rows["offset"])), str(pc.max(rows["offset"])))
        console.print(summary)
        console.print(f"produced {EVENTS + 1000:,} records in {produce_s:.2f}s; consumed {received:,} in {consume_s:.2f}s")
        console.print(f"all 1,000 records keyed user-1 landed on partition(s) {sorted(partitions_of_user_1)}")
        if received != EVENTS + 1000 or len(partitions_of_user_1) != 1:
            raise SystemExit("demo failed: records lost or keyed records split across partitions")
        console.print("[green]demo ok[/]")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
