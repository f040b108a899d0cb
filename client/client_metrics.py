"""The producer's and consumer's own metrics, as Kafka's clients name them (`Producer.metrics()`,
`Consumer.metrics()`).

Counters and sums kept by the client's I/O side (the producer's sender, the consumer's fetcher
and polls) at batch, request and poll granularity, never per record; `snapshot` turns them into
Kafka's names: totals, rates since the client started, averages and maxima. Times in ms, sizes
in bytes. Written on the client's event loop (and, for polls, the polling thread), read from any
thread: a read may see one batch's counters half-updated, as Kafka's own sampled metrics may.
"""
from __future__ import annotations

import time
from typing import Any

from common.topic_partition import TopicPartition


def _avg(total: float, count: int) -> float:
    return total / count if count else 0.0


class ProducerMetrics:
    __slots__ = ("started", "records_sent", "records_failed", "records_retried", "batches", "batch_bytes",
                 "batch_bytes_max", "queue_s", "queue_s_max", "requests", "request_s", "request_s_max",
                 "request_records", "requests_timed_out")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.records_sent = self.records_failed = self.records_retried = 0
        self.batches = self.batch_bytes = self.batch_bytes_max = 0
        self.queue_s = self.queue_s_max = 0.0
        self.requests = self.request_records = 0
        self.request_s = self.request_s_max = 0.0
        self.requests_timed_out = 0  # Produce requests the broker did not answer within request_timeout_ms

    def batch_sent(self, size: int, records: int, queued_s: float) -> None:
        """A batch's first attempt: its encoded size and how long its first record waited."""
        self.batches += 1
        self.batch_bytes += size
        self.batch_bytes_max = max(self.batch_bytes_max, size)
        self.queue_s += queued_s
        self.queue_s_max = max(self.queue_s_max, queued_s)
        self.request_records += records

    def request_done(self, latency_s: float) -> None:
        self.requests += 1
        self.request_s += latency_s
        self.request_s_max = max(self.request_s_max, latency_s)

    def snapshot(self, buffer_available_bytes: int) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "record-send-total": self.records_sent,
            "record-send-rate": self.records_sent / elapsed,
            "record-error-total": self.records_failed,
            "record-retry-total": self.records_retried,
            "batch-size-avg": _avg(self.batch_bytes, self.batches),
            "batch-size-max": self.batch_bytes_max,
            "record-queue-time-avg": _avg(self.queue_s, self.batches) * 1000,
            "record-queue-time-max": self.queue_s_max * 1000,
            "request-total": self.requests,
            "request-latency-avg": _avg(self.request_s, self.requests) * 1000,
            "request-latency-max": self.request_s_max * 1000,
            "records-per-request-avg": _avg(self.request_records, self.requests),
            "request-timeout-total": self.requests_timed_out,
            "buffer-available-bytes": buffer_available_bytes,
        }


class ConsumerMetrics:
    __slots__ = ("started", "records", "bytes", "fetches", "fetch_s", "fetch_s_max")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.records = self.bytes = self.fetches = 0
        self.fetch_s = self.fetch_s_max = 0.0

    def fetched(self, latency_s: float) -> None:
        self.fetches += 1
        self.fetch_s += latency_s
        self.fetch_s_max = max(self.fetch_s_max, latency_s)

    def consumed(self, records: int, size: int) -> None:
        self.records += records
        self.bytes += size

    def snapshot(self, lags: dict[TopicPartition, int]) -> dict[str, Any]:
        """`lags`: per assigned partition, the last fetched high watermark less the position."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "records-consumed-total": self.records,
            "records-consumed-rate": self.records / elapsed,
            "bytes-consumed-total": self.bytes,
            "bytes-consumed-rate": self.bytes / elapsed,
            "fetch-total": self.fetches,
            "fetch-latency-avg": _avg(self.fetch_s, self.fetches) * 1000,
            "fetch-latency-max": self.fetch_s_max * 1000,
            "records-lag-max": max(lags.values(), default=0),
            "records-lag": dict(lags),
        }
