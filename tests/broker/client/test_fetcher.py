"""Fetcher against a real broker process: prefetching between polls, the next fetch going out
before a reply is decoded, and small polls taking from every buffered partition in turn."""
from __future__ import annotations

import time

import pytest

from broker.client import Consumer, ConsumerRecord
from tests.helpers.client_records import poll_until, produce, values
from tests.waiting import wait_until


def test_buffer_fills_in_the_background_between_polls(shared_broker, new_topic, consumers):
    """After a poll, records produced later are prefetched: poll(timeout_ms=0), which never waits, returns them."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    poll_until(consumer, 3)
    produce(shared_broker.bootstrap, topic, values(4, b"later"))
    records: list[ConsumerRecord] = []

    def prefetched() -> bool:
        records.extend(consumer.poll(timeout_ms=0))
        return len(records) >= 4

    wait_until(prefetched, 10, "the later records, prefetched", 0.05)
    assert [r.value for r in records] == values(4, b"later")


def test_a_tailing_consumer_sends_its_next_fetch_before_decoding_a_reply(shared_broker, new_topic, consumers):
    """Each reply's records are decoded while the next fetch is already out (the broker holds it):
    the I/O thread is idle right after handing records to poll(). Records still arrive once each,
    in order, also across a seek made while such a fetch is out."""
    topic = new_topic(1)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    fetcher = consumer._core._fetcher
    out_while_decoding: list[int] = []
    absorb = fetcher._absorb

    def watched(tp, data):
        out_while_decoding.append(len(fetcher.cluster.open_connection(fetcher._leader(tp))._pending))
        absorb(tp, data)

    fetcher._absorb = watched
    consumer.assign([(topic, 0)])
    received: list[ConsumerRecord] = []
    for i in range(5):
        produce(shared_broker.bootstrap, topic, [b"v%d" % i])
        received += poll_until(consumer, 1)
    assert [r.value for r in received] == [b"v%d" % i for i in range(5)]
    assert out_while_decoding and all(n >= 1 for n in out_while_decoding), out_while_decoding
    consumer.seek((topic, 0), 2)
    assert [r.offset for r in poll_until(consumer, 3)] == [2, 3, 4]
    assert consumer.poll(timeout_ms=300) == []


def buffered_partitions(consumer: Consumer) -> set[tuple[str, int]]:
    fetcher = consumer._core._fetcher
    with fetcher._subs.lock:
        return fetcher._buffer.partitions()


def polled(consumer: Consumer, method: str) -> list[tuple[int, int, bytes]]:
    """One poll (`poll` or `poll_arrow`) as (partition, offset, value) rows."""
    if method == "poll":
        return [(r.partition, r.offset, r.value) for r in consumer.poll(timeout_ms=200)]
    table = consumer.poll_arrow(timeout_ms=200)
    return list(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "value"))))


@pytest.mark.parametrize("method", ["poll", "poll_arrow"])
def test_small_polls_take_from_every_buffered_partition_in_turn(shared_broker, new_topic, consumers, method):
    """Issue 38 item 5: 4 partitions with 100 records each, all buffered, max_poll_records=20: the
    first 4 polls return all 4 partitions (not partition 0 drained first), and all polls together
    return every record once, each partition in offset order."""
    topic = new_topic(4)
    produced = {p: [b"p%d-%d" % (p, i) for i in range(100)] for p in range(4)}
    for partition, vals in produced.items():
        produce(shared_broker.bootstrap, topic, vals, partition=partition)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest", max_poll_records=20)
    consumer.assign([(topic, p) for p in produced])
    wait_until(lambda: buffered_partitions(consumer) == {(topic, p) for p in produced}, 20, "all partitions buffered")
    polls: list[list[tuple[int, int, bytes]]] = []
    deadline = time.monotonic() + 20
    while sum(map(len, polls)) < 400 and time.monotonic() < deadline:
        rows = polled(consumer, method)
        if rows:
            polls.append(rows)
    assert all(len(rows) <= 20 for rows in polls)
    assert {partition for rows in polls[:4] for partition, _, _ in rows} == set(produced), polls[:4]
    for partition, vals in produced.items():
        got = [(offset, value) for rows in polls for p, offset, value in rows if p == partition]
        assert got == list(enumerate(vals)), partition
    assert polled(consumer, method) == []
