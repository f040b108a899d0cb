"""Load generation for `pymq perf`: payloads, pacing, acknowledgement timing, latency summaries.

Payload generation must not dominate the measurement: one buffer of random uppercase letters
(as kafka-producer-perf-test uses) is made once and every record value is a slice of it;
Arrow tables for the columnar path reference it zero-copy.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Awaitable

import numpy as np
import pyarrow as pa

from client.loop_thread import LoopThread
from common.errors import PymqError
from segment_format import batch_body

SPREAD = 4096            # distinct start positions in the pool, so values are not all identical
DISTINCT_VALUES = 1024   # bytes objects cycled through by the per-record path
CHUNK_BYTES = 4 << 20    # rows per send_batch call aim at this many value bytes
CHUNK_ROWS_MAX = 65_536
MIN_LATENCY_SAMPLES = 10_000


def warm_up() -> None:
    """Pay one-off process costs before the clock starts: Arrow loads its time-zone database on
    the first cast to a UTC timestamp (about 200 ms), which the first batch would otherwise carry."""
    pa.array([0], pa.int64()).cast(batch_body.TIMESTAMP_TYPE)


class PayloadPool:
    """Random uppercase-letter bytes, sliced into values of `record_size` bytes."""

    def __init__(self, record_size: int, max_rows: int, seed: int | None = None) -> None:
        self.record_size = record_size
        letters = np.random.default_rng(seed).integers(ord("A"), ord("Z") + 1, record_size * max_rows + SPREAD,
                                                       dtype=np.uint8)
        self.buffer = pa.py_buffer(letters)

    def values(self, count: int = DISTINCT_VALUES) -> list[bytes]:
        """`count` values (bytes objects), each starting at a different position of the pool."""
        data = memoryview(self.buffer)
        size = self.record_size
        return [bytes(data[start : start + size]) for start in (i * 7 % SPREAD for i in range(count))]

    def table(self, rows: int, chunk_number: int = 0) -> pa.Table:
        """A one-column (`value`) table of `rows` values sharing the pool's memory."""
        start = chunk_number * 7 % SPREAD
        offsets = np.arange(rows + 1, dtype=np.int32) * self.record_size + start
        values = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), self.buffer])
        return pa.table({"value": values})


def chunk_rows(record_size: int, num_records: int, throughput: int) -> int:
    """Rows per send_batch call: about CHUNK_BYTES, smaller when paced (a chunk per ~10 ms)."""
    rows = min(num_records, CHUNK_ROWS_MAX, max(1, CHUNK_BYTES // max(record_size, 1)))
    if throughput > 0:
        rows = min(rows, max(1, throughput // 100))
    return rows


def sample_every(num_records: int) -> int:
    """Watch every k-th record so that at least MIN_LATENCY_SAMPLES acks are timed."""
    return max(1, num_records // (2 * MIN_LATENCY_SAMPLES))


class Throttle:
    """Keeps the send rate at or below `per_second` (<= 0: unlimited), like Kafka's ThroughputThrottler."""

    def __init__(self, per_second: int, started: float) -> None:
        self.per_second = per_second
        self.started = started

    def pace(self, sent: int) -> None:
        if self.per_second <= 0:
            return
        ahead_s = sent / self.per_second - (time.perf_counter() - self.started)
        if ahead_s > 0:
            time.sleep(ahead_s)


class AckTimer:
    """Times send -> acknowledgement for watched futures on a private event loop.

    `watch` is thread-safe and cheap (one cross-thread call); each watched awaitable is awaited on
    the timer's loop, so its completion is seen when it happens, whatever the order. A failed
    send is kept in `errors` instead of a latency.
    """

    def __init__(self) -> None:
        self._thread = LoopThread("pymq-perf-acks")
        self._tasks: set[asyncio.Task[None]] = set()
        self.latencies_ms: list[float] = []
        self.errors: list[BaseException] = []

    def watch(self, awaitable: Awaitable[Any], sent_at: float) -> None:
        self._thread.call_soon(self._start, awaitable, sent_at)

    def _start(self, awaitable: Awaitable[Any], sent_at: float) -> None:
        task = self._thread.loop.create_task(self._time(awaitable, sent_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _time(self, awaitable: Awaitable[Any], sent_at: float) -> None:
        try:
            await awaitable
        except PymqError as err:
            self.errors.append(err)
            return
        self.latencies_ms.append((time.perf_counter() - sent_at) * 1000)

    def wait(self) -> None:
        """Block until every watched send completed."""
        self._thread.run(self._drain())

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let _start calls queued before this one run first
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        self._thread.stop()

    def __enter__(self) -> "AckTimer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def batch_acknowledged(batch: Any) -> None:
    """Await a producer BatchResult, raising its error like a RecordFuture does."""
    await batch.wait_async()
    if batch.error is not None:
        raise batch.error


class Outstanding:
    """Bounds the bytes handed to send_batch but not yet acknowledged (it does not block by itself)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._queue: deque[tuple[Any, int]] = deque()

    def add(self, batches: list[Any], size: int) -> None:
        self._queue.append((batches, size))
        self.bytes += size
        while self.bytes > self.limit_bytes and self._queue:
            oldest, oldest_size = self._queue.popleft()
            for batch in oldest:
                batch.wait(None)
            self.bytes -= oldest_size


def latency_summary(latencies_ms: list[float]) -> dict[str, float]:
    """avg, p50, p95, p99, p99.9 and max in milliseconds (zeros without samples)."""
    keys = ("avg", "p50", "p95", "p99", "p99_9", "max")
    if not latencies_ms:
        return dict.fromkeys(keys, 0.0)
    values = np.asarray(latencies_ms)
    p50, p95, p99, p999 = np.percentile(values, [50, 95, 99, 99.9])
    stats = (values.mean(), p50, p95, p99, p999, values.max())
    return {key: round(float(v), 3) for key, v in zip(keys, stats)}
