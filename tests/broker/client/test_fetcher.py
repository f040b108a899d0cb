"""Fetcher against a real broker process: prefetching between polls, and the next fetch going out
before a reply is decoded."""
from __future__ import annotations

import time

from broker.client import ConsumerRecord
from tests.broker.client.test_consumer import poll_until, produce, values


def test_buffer_fills_in_the_background_between_polls(shared_broker, new_topic, consumers):
    """After a poll, records produced later are prefetched: poll(timeout_ms=0), which never waits, returns them."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    poll_until(consumer, 3)
    produce(shared_broker.bootstrap, topic, values(4, b"later"))
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + 10
    while len(records) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
        records += consumer.poll(timeout_ms=0)
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
