"""`pymq perf produce` and `pymq perf consume`: throughput and latency, like Kafka's perf-test tools.

Both print a summary table, or with `--json` one JSON object on stdout for benchmark scripts:

    perf produce: mode, records, record_size, elapsed_s, records_per_s, mb_per_s, latency_samples,
                  latency_{avg,p50,p95,p99,p99_9,max}_ms, acks, compression
    perf consume: mode, records, bytes, elapsed_s, records_per_s, mb_per_s, first_record_ms, timed_out

MB is 2**20 bytes, counted over record values (produce) or keys plus values (consume).
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable

import click
from rich.table import Table

from cli.common import (
    consumer_client,
    producer_client,
    producer_config,
    producer_options,
    progress_bar,
    topic_partitions,
)
from common.cli_options import KEY_VALUE, bootstrap_option, console

if TYPE_CHECKING:
    from cli.loadgen import AckTimer, PayloadPool, Throttle
    from client import Consumer, Producer

MB = 1 << 20
PROGRESS_STEP = 1000     # records between progress bar updates on the per-record path
CONSUME_POLL_MS = 100
DEFAULT_BUFFER_MEMORY = 64 << 20


@click.group("perf")
def perf_group() -> None:
    """Measure producer throughput and acknowledgement latency, and consumer throughput."""


@perf_group.command("produce")
@click.argument("topic")
@click.option("-n", "--num-records", type=click.IntRange(min=1), required=True, help="records to send")
@click.option("-s", "--record-size", type=click.IntRange(min=0), required=True, help="bytes per record value")
@click.option("--throughput", type=int, default=-1, show_default=True,
              help="cap the send rate at this many records/s; -1 for no cap")
@click.option("--mode", type=click.Choice(["send", "batch"]), default="send", show_default=True,
              help="send: Producer.send per record; batch: Arrow tables through Producer.send_batch")
@producer_options
@click.option("--producer-props", type=KEY_VALUE, multiple=True,
              help="any other Producer setting, e.g. --producer-props max_in_flight=1 (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print the results as one JSON object")
@bootstrap_option
def perf_produce(topic: str, num_records: int, record_size: int, throughput: int, mode: str,
                 producer_props: tuple[tuple[str, str], ...], as_json: bool, **flags: Any) -> None:
    """Send generated records to TOPIC; report records/s, MB/s and send-to-ack latency
    (avg, p50, p95, p99, p99.9, max, timed on a sample of at least 10,000 records or all batches)."""
    config = producer_config(flags, producer_props)
    result = run_produce(topic, num_records, record_size, throughput, mode, config)
    show_results(result, as_json, f"perf produce {topic}")


def run_produce(topic: str, num_records: int, record_size: int, throughput: int, mode: str,
                config: dict[str, Any]) -> dict[str, Any]:
    from cli import loadgen

    loadgen.warm_up()
    with loadgen.AckTimer() as acks:
        elapsed = _produce_timed(topic, num_records, record_size, throughput, mode, config, acks)
    if acks.errors:
        raise acks.errors[0]
    latency = {f"latency_{k}_ms": v for k, v in loadgen.latency_summary(acks.latencies_ms).items()}
    return {"mode": mode, "records": num_records, "record_size": record_size,
            **_rates(num_records, num_records * record_size, elapsed), "latency_samples": len(acks.latencies_ms),
            **latency, "acks": str(config.get("acks", 1)), "compression": config.get("compression", "none")}


def _produce_timed(topic: str, num_records: int, record_size: int, throughput: int, mode: str,
                   config: dict[str, Any], acks: "AckTimer") -> float:
    """Send everything and wait for every acknowledgement; returns the seconds that took."""
    from cli import loadgen

    rows = loadgen.chunk_rows(record_size, num_records, throughput) if mode == "batch" else 1
    pool = loadgen.PayloadPool(record_size, rows)
    with producer_client(config) as producer, progress_bar(num_records, f"producing to {topic}") as advance:
        started = time.perf_counter()
        throttle = loadgen.Throttle(throughput, started)
        if mode == "send":
            _send_records(producer, topic, num_records, pool, throttle, acks, advance)
        else:
            limit = config.get("buffer_memory", DEFAULT_BUFFER_MEMORY)
            _send_tables(producer, topic, num_records, rows, pool, throttle, acks, advance, limit)
        producer.flush()
        acks.wait()
        return time.perf_counter() - started


def _send_records(producer: "Producer", topic: str, num_records: int, pool: "PayloadPool", throttle: "Throttle",
                  acks: "AckTimer", advance: Callable[[int], None]) -> None:
    from cli import loadgen

    values = pool.values()
    every = loadgen.sample_every(num_records)
    send = producer.send
    for i in range(num_records):
        value = values[i % len(values)]
        if i % every == 0:
            sent_at = time.perf_counter()
            acks.watch(send(topic, value), sent_at)
        else:
            send(topic, value)
        throttle.pace(i + 1)
        if i % PROGRESS_STEP == PROGRESS_STEP - 1:
            advance(PROGRESS_STEP)
    advance(num_records % PROGRESS_STEP)


def _send_tables(producer: "Producer", topic: str, num_records: int, rows: int, pool: "PayloadPool",
                 throttle: "Throttle", acks: "AckTimer", advance: Callable[[int], None], limit_bytes: int) -> None:
    from cli import loadgen

    outstanding = loadgen.Outstanding(limit_bytes)
    sent = 0
    while sent < num_records:
        count = min(rows, num_records - sent)
        table = pool.table(count, chunk_number=sent // rows)
        sent_at = time.perf_counter()
        batches = producer.send_batch(topic, table)
        for batch in batches:
            acks.watch(loadgen.batch_acknowledged(batch), sent_at)
        outstanding.add(batches, table.nbytes)
        sent += count
        advance(count)
        throttle.pace(sent)


@perf_group.command("consume")
@click.argument("topic")
@click.option("-n", "--messages", type=click.IntRange(min=1), default=None,
              help="records to read [default: all records in the topic when the test starts]")
@click.option("--mode", type=click.Choice(["arrow", "records"]), default="arrow", show_default=True,
              help="arrow: Consumer.poll_arrow tables; records: Consumer.poll ConsumerRecords")
@click.option("--timeout-ms", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="give up after this long without new records")
@click.option("--json", "as_json", is_flag=True, help="print the results as one JSON object")
@bootstrap_option
def perf_consume(topic: str, messages: int | None, mode: str, timeout_ms: int, as_json: bool) -> None:
    """Read TOPIC from the beginning of every partition; report records/s, MB/s (from the first
    poll to the last record) and the time from start-up to the first record."""
    result = run_consume(topic, messages, mode, timeout_ms)
    show_results(result, as_json, f"perf consume {topic}")


def run_consume(topic: str, messages: int | None, mode: str, timeout_ms: int) -> dict[str, Any]:
    from cli import loadgen

    loadgen.warm_up()
    started = time.perf_counter()
    tps = topic_partitions(topic)
    with consumer_client(auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)  # positions at the log start; no seek, which would wait out a long poll
        if messages is None:
            starts, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            messages = sum(ends[tp] - starts[tp] for tp in tps)
        with progress_bar(messages, f"consuming {topic}") as advance:
            polling = time.perf_counter()
            records, size, first, last = _consume(consumer, POLLERS[mode], messages, timeout_ms, advance)
    elapsed = (last - polling) if last is not None else 0.0
    first_ms = round((first - started) * 1000, 3) if first is not None else None
    return {"mode": mode, "records": records, "bytes": size, **_rates(records, size, elapsed),
            "first_record_ms": first_ms, "timed_out": records < messages}


def _consume(consumer: "Consumer", poll: Callable[["Consumer", int], tuple[int, int]], target: int, timeout_ms: int,
             advance: Callable[[int], None]) -> tuple[int, int, float | None, float | None]:
    """Poll until `target` records or `timeout_ms` idle: (records, bytes, first and last data time)."""
    records = size = 0
    first = last = None
    idle_since = time.perf_counter()
    while records < target:
        got, got_bytes = poll(consumer, target - records)
        now = time.perf_counter()
        if got:
            first = now if first is None else first
            last = idle_since = now
            records += got
            size += got_bytes
            advance(got)
        elif (now - idle_since) * 1000 >= timeout_ms:
            break
    return records, size, first, last


def _poll_arrow(consumer: "Consumer", limit: int) -> tuple[int, int]:
    import pyarrow.compute as pc

    table = consumer.poll_arrow(timeout_ms=CONSUME_POLL_MS, max_records=limit)
    if not table.num_rows:
        return 0, 0
    size = sum(pc.sum(pc.binary_length(table.column(name))).as_py() or 0 for name in ("key", "value"))
    return table.num_rows, size


def _poll_records(consumer: "Consumer", limit: int) -> tuple[int, int]:
    # No smaller per-poll cap: Consumer.poll_arrow loses buffer accounting for every batch it
    # splits, and its fetchers stall once the lost bytes reach max_buffer_bytes.
    records = consumer.poll(timeout_ms=CONSUME_POLL_MS, max_records=limit)
    return len(records), sum(len(r.key or b"") + len(r.value or b"") for r in records)


POLLERS = {"arrow": _poll_arrow, "records": _poll_records}


# -- results -----------------------------------------------------------------------------------


def _rates(records: int, size: int, elapsed_s: float) -> dict[str, float]:
    if elapsed_s <= 0:
        return {"elapsed_s": 0.0, "records_per_s": 0.0, "mb_per_s": 0.0}
    return {"elapsed_s": round(elapsed_s, 3), "records_per_s": round(records / elapsed_s, 1),
            "mb_per_s": round(size / elapsed_s / MB, 3)}


def show_results(result: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        click.echo(json.dumps(result))
        return
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:,}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value))
    console().print(table)
