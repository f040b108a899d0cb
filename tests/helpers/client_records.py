"""Client-side helpers the client tests share: produce values and wait for their acknowledgements,
poll or consume until an expected count arrived."""
from __future__ import annotations

import time

import pyarrow as pa

from client import Consumer, ConsumerRecord, Producer


def produce(bootstrap: str, topic: str, values: list[bytes], *, partition: int | None = None,
            timestamps: list[int] | None = None, one_batch: bool = False) -> None:
    """Send `values` and wait for every acknowledgement; `one_batch` sends them as one record batch."""
    with Producer(bootstrap, linger_ms=1) as producer:
        if one_batch:
            columns = {"value": pa.array(values, pa.binary())}
            if timestamps is not None:
                columns["timestamp"] = pa.array(timestamps, pa.int64())
            results = producer.send_batch(topic, pa.table(columns), partition=0 if partition is None else partition)
            producer.flush()
            assert all(r.error is None for r in results)
            return
        futures = [producer.send(topic, v, key=b"k%d" % i, partition=partition,
                                 timestamp_ms=None if timestamps is None else timestamps[i])
                   for i, v in enumerate(values)]
        producer.flush()
        for future in futures:
            future.result(10)


def poll_until(consumer: Consumer, expected: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """Poll until `expected` records arrived (fails on timeout)."""
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200)
    assert len(records) == expected, f"received {len(records)} of {expected}"
    return records


def values(n: int, prefix: bytes = b"v") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(n)]


def consume(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """Every record of the topic from the beginning; fails unless exactly `expected` arrive."""
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
        assert len(records) == expected, f"received {len(records)} of {expected} records"
        assert consumer.poll(timeout_ms=100) == [], "more records than produced"
    return records
