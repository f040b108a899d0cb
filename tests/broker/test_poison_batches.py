"""Poison batches against a real broker process (issue 34, items 2 and 4): bodies whose CRC and Arrow
IPC metadata are sound but whose buffers no reader can decode, or whose record timestamps are not
what the header claims. The leader decodes and validates a producer's body before the append, so
each is refused with a named error, nothing is stored, and consumers read on as if it never came.

One broker serves the module (each case on its own topic), with time-based flushing off so that
partition files change only when something is appended (tests/broker/test_bad_input.py's helpers
fingerprint them), and a log cleaner that looks for work every 20 ms.
"""
from __future__ import annotations

import itertools
import time

import pytest

from client import Consumer
from common.errors import NONE, CorruptMessageError, InvalidTimestampError, MessageTooLargeError
from segment_format import batch_body, record
from tests.broker.forged_batches import BODY_TIMESTAMP_BATCHES, POISON_BATCHES, TS, with_int32, VALUE_OFFSETS
from tests.waiting import wait_until
from tests.helpers.raw_produce import (
    INT64_MAX,
    SEED_VALUES,
    assert_serving,
    create_topic,
    fetch_records,
    make_batch,
    produce,
    stored_files,
)

_names = itertools.count()


@pytest.fixture(scope="module")
def server(module_broker_factory):
    return module_broker_factory("poison", **{"log.flush.interval.ms": INT64_MAX, "log.cleaner.backoff.ms": 20}).start()


@pytest.fixture
def client(server, raw_client):
    return raw_client(server.port)


def seeded_topic(client, **configs: object) -> str:
    """A fresh one-partition topic holding SEED_VALUES at offsets 0-2."""
    name = f"poison{next(_names)}"
    create_topic(client, name, configs={k: str(v) for k, v in configs.items()})
    assert produce(client, name, 0, make_batch(SEED_VALUES))["error_code"] == NONE
    return name


def refused(server, raw_client, client, topic: str, payload: bytes, error: type) -> str:
    """Produce `payload`, check it is refused with `error`'s code and stores nothing; its message."""
    before = stored_files(server.log_dir, topic)
    result = produce(client, topic, 0, payload)
    assert result["error_code"] == error.code and result["base_offset"] == -1, result
    assert_serving(server, raw_client, same=client)
    assert stored_files(server.log_dir, topic) == before, "stored partition files changed"
    assert fetch_records(client, topic) == list(enumerate(SEED_VALUES))
    return result["error_message"]


@pytest.mark.parametrize("make, words", [c[1:] for c in POISON_BATCHES], ids=[c[0] for c in POISON_BATCHES])
def test_a_poison_body_is_refused_as_corrupt_and_nothing_is_stored(server, raw_client, client, make, words):
    """A body every consumer would fail to decode gets CORRUPT_MESSAGE naming Arrow's finding."""
    topic = seeded_topic(client)
    message = refused(server, raw_client, client, topic, bytes(make()), CorruptMessageError)
    assert "bad Arrow body" in message and words in message


@pytest.mark.parametrize("log_append_time", [False, True], ids=["CreateTime", "LogAppendTime"])
@pytest.mark.parametrize("make", [c[1] for c in BODY_TIMESTAMP_BATCHES], ids=[c[0] for c in BODY_TIMESTAMP_BATCHES])
def test_body_timestamps_the_header_does_not_claim_are_refused(server, raw_client, client, make, log_append_time):
    """Record timestamps of year 3000, int64 max or -1 under a header whose timestamps pass the
    topic's bounds get INVALID_TIMESTAMP, on either timestamp type."""
    topic = seeded_topic(client, **({"message.timestamp.type": "LogAppendTime"} if log_append_time else {}))
    message = refused(server, raw_client, client, topic, bytes(make()), InvalidTimestampError)
    assert "record timestamps run from" in message


def test_a_poison_batch_next_to_a_good_one_stores_neither(server, raw_client, client):
    """All or nothing per partition: the good batch in front of a poison one is not appended either."""
    topic = seeded_topic(client)
    payload = make_batch([b"good"]) + with_int32(VALUE_OFFSETS, 3, 1 << 20)
    assert "out of bounds" in refused(server, raw_client, client, topic, bytes(payload), CorruptMessageError)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_body_decompressing_past_the_topic_bound_is_too_large(server, raw_client, client, compression):
    """1 MiB of zeros compresses to a few KiB: on a topic with message.decompressed.max.bytes
    64 KiB it is MESSAGE_TOO_LARGE; the same batch compressed is stored where the bound allows it."""
    zeros = record.encode_batch(batch_body.make_body([bytes(1 << 20)], timestamps_ms=TS), compression=compression)
    topic = seeded_topic(client, **{"message.decompressed.max.bytes": 65536})
    message = refused(server, raw_client, client, topic, bytes(zeros), MessageTooLargeError)
    assert "message.decompressed.max.bytes 65536" in message
    roomy = seeded_topic(client)
    assert produce(client, roomy, 0, bytes(zeros))["base_offset"] == len(SEED_VALUES)


def test_a_consumer_reads_past_where_poison_was_refused(server, raw_client, client):
    """The issue's symptom is gone: after every kind of poison was refused, a consumer reads the
    partition from its start to its end, good batches of each compression included, with no
    CorruptRecordError."""
    topic = seeded_topic(client)
    for _, make, _ in POISON_BATCHES:
        assert produce(client, topic, 0, bytes(make()))["error_code"] == CorruptMessageError.code
    values = [b"after-none", b"after-lz4", b"after-zstd"]
    for value, compression in zip(values, ("none", "lz4", "zstd")):
        body = batch_body.make_body([value * 50], timestamps_ms=TS)
        assert produce(client, topic, 0, bytes(record.encode_batch(body, compression=compression)))["error_code"] == NONE
    expected = SEED_VALUES + [v * 50 for v in values]
    with Consumer(f"127.0.0.1:{server.port}", auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        got: list[bytes] = []
        for _ in range(100):
            got += [r.value for r in consumer.poll(timeout_ms=200)]
            if len(got) >= len(expected):
                break
    assert got == expected


def test_a_compacted_topic_refuses_poison_so_its_cleaner_keeps_cleaning(server, raw_client, client):
    """Poison between keyed updates of a compacted topic is refused, so the log cleaner (which
    decodes every batch it keeps, and gave up on a partition until a restart at the first bad
    one) cleans the partition: each key's latest value stays, and the broker logs no failure."""
    topic = f"poison{next(_names)}"
    create_topic(client, topic, configs={"cleanup.policy": "compact", "segment.bytes": "16384",
                                         "min.cleanable.dirty.ratio": "0.01"})
    latest: dict[bytes, bytes] = {}
    for i in range(60):
        keys = [b"key-%d" % (j % 4) for j in range(10)]
        values = [b"%04d-%d-" % (i, j) + b"v" * 100 for j in range(10)]
        body = batch_body.make_body(values, keys=keys, timestamps_ms=TS)
        assert produce(client, topic, 0, bytes(record.encode_batch(body)))["error_code"] == NONE
        latest.update(zip(keys, values))
        _, make, _ = POISON_BATCHES[i % len(POISON_BATCHES)]
        assert produce(client, topic, 0, bytes(make()))["error_code"] == CorruptMessageError.code
    wait_until(lambda: f"cleaned {topic}-0" in server.log_tail(200_000), 60, "the cleaner cleans the partition")
    assert f"cannot clean {topic}-0" not in server.log_tail(200_000)
    with Consumer(f"127.0.0.1:{server.port}", auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        got: dict[bytes, bytes] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(v == latest[b"key-3"] for v in got.values()):
            got.update((r.key, r.value) for r in consumer.poll(timeout_ms=200))
    assert got == latest
