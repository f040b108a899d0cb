"""The producer's and consumer's own metrics (Producer.metrics(), Consumer.metrics()), with Kafka's
names, after real traffic against a real broker: counts exact, times and sizes plausible."""
from __future__ import annotations

import pyarrow as pa
import pytest

from client import Consumer, Producer


@pytest.mark.slow
def test_producer_metrics_count_what_was_sent(shared_broker, new_topic):
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, linger_ms=0) as producer:
        for _ in range(3):  # one batch, one request each
            producer.send_batch(topic, pa.table({"value": [b"x" * 100] * 100}))
            producer.flush()
        metrics = producer.metrics()
        assert metrics["record-send-total"] == 300 and metrics["record-error-total"] == 0
        assert metrics["request-total"] == 3 and metrics["records-per-request-avg"] == 100
        assert 100 * 100 < metrics["batch-size-avg"] <= metrics["batch-size-max"] < 100 * 100 * 2
        assert 0 <= metrics["record-queue-time-avg"] <= metrics["record-queue-time-max"] < 60_000
        assert 0 < metrics["request-latency-avg"] <= metrics["request-latency-max"] < 60_000
        assert metrics["buffer-available-bytes"] == 64 << 20  # everything acknowledged: all free
        assert metrics["record-send-rate"] > 0


def test_consumer_metrics_count_what_was_polled_and_the_lag_left(shared_broker, new_topic):
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap) as producer:
        producer.send_batch(topic, pa.table({"value": [b"v" * 10] * 300}))
        producer.flush()
    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest", max_poll_records=100) as consumer:
        consumer.assign([(topic, 0)])
        taken = 0
        while taken < 100:
            taken += len(consumer.poll(2000))
        metrics = consumer.metrics()
        assert metrics["records-consumed-total"] == 100 and metrics["bytes-consumed-total"] > 100 * 10
        assert metrics["fetch-total"] >= 1 and metrics["fetch-latency-max"] >= metrics["fetch-latency-avg"] > 0
        assert metrics["records-lag"] == {(topic, 0): 200} and metrics["records-lag-max"] == 200
        while taken < 300:
            taken += len(consumer.poll(2000))
        assert consumer.metrics()["records-lag"] == {(topic, 0): 0}
        assert consumer.metrics()["records-consumed-total"] == 300
