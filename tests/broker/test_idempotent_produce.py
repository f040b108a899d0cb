"""Idempotent produce against a real broker process over the raw protocol: a retry is answered
with its original offsets, also after a SIGKILL and a restart (the producer state comes back from
the roll's snapshot plus the replayed tail); gaps and fenced epochs get their named errors."""
from __future__ import annotations

import threading

import pytest

from common.errors import NONE, InvalidProducerEpochError, InvalidRecordError, OutOfOrderSequenceError
from protocol import ApiKey
from segment_format import batch_body, record
from tests.helpers.raw_produce import values_of
from tests.waiting import wait_until

TOPIC = "idempotent"
PRODUCER = 4242
RECORDS = 4  # per batch
VALUE_BYTES = 300  # with 4 KiB segments: three batches a segment, so the stream rolls many times


def idempotent(sequence: int, epoch: int = 0) -> bytes:
    values = [f"s{sequence + i}".encode().ljust(VALUE_BYTES, b".") for i in range(RECORDS)]
    return bytes(record.encode_batch(batch_body.make_body(values, timestamps_ms=batch_body.now_ms()),
                                     producer_id=PRODUCER, producer_epoch=epoch, base_sequence=sequence))


def produce(client, payload: bytes) -> dict:
    reply, _ = client.request(ApiKey.PRODUCE, {"acks": -1, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
    return reply["topics"][0]["partitions"][0]


def create(client) -> None:
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "configs": {"segment.bytes": 4096}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply


def test_a_retry_after_a_sigkill_is_answered_with_its_original_offsets(broker_factory, raw_client):
    """Batches stream in until the broker is SIGKILLed (no clean close, no snapshot at the end);
    after the restart a retry of the last acknowledged batch gets its offsets back and is not
    written again, and the stream continues with the next sequence."""
    broker = broker_factory().start()
    client = raw_client(broker.port)
    create(client)
    acknowledged: dict[int, int] = {}  # sequence -> base offset
    stop = threading.Event()

    def stream() -> None:
        sequence = 0
        while not stop.is_set():
            try:
                answer = produce(client, idempotent(sequence))
            except (OSError, ConnectionError, EOFError):
                return  # the broker died under the request
            assert answer["error_code"] == NONE, answer
            acknowledged[sequence] = answer["base_offset"]
            sequence += RECORDS

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 20, timeout_s=60, what="20 acknowledged batches")
        broker.kill()
    finally:
        stop.set()
        thread.join(timeout=30)
    broker.start()
    client = raw_client(broker.port)
    last = max(acknowledged)
    retry = produce(client, idempotent(last))
    assert retry["error_code"] == NONE and retry["base_offset"] == acknowledged[last], (retry, acknowledged[last])
    values = values_of(client, TOPIC, 0)
    stored = len(values) // RECORDS  # a batch sent as the broker died may have been written, unacknowledged
    assert stored in (len(acknowledged), len(acknowledged) + 1)
    assert values == [f"s{i}" for i in range(stored * RECORDS)]  # each once, in order
    following = produce(client, idempotent(stored * RECORDS))
    assert following["error_code"] == NONE and following["base_offset"] == stored * RECORDS


def test_gaps_and_fenced_epochs_get_named_errors_and_write_nothing(broker, raw_client):
    """OUT_OF_ORDER_SEQUENCE for a gap, INVALID_PRODUCER_EPOCH for a zombie; the log is unchanged."""
    client = raw_client(broker.port)
    create(client)
    assert produce(client, idempotent(0, epoch=1))["error_code"] == NONE
    assert produce(client, idempotent(3 * RECORDS, epoch=1))["error_code"] == OutOfOrderSequenceError.code
    assert produce(client, idempotent(RECORDS, epoch=0))["error_code"] == InvalidProducerEpochError.code
    assert values_of(client, TOPIC, 0) == [f"s{i}" for i in range(RECORDS)]


@pytest.mark.parametrize("epoch_and_sequence", [(-1, 0), (0, -1)], ids=["no-epoch", "no-sequence"])
def test_a_producer_id_without_epoch_or_sequence_is_an_invalid_record(broker, raw_client, epoch_and_sequence):
    """INVALID_RECORD, nothing written."""
    client = raw_client(broker.port)
    create(client)
    epoch, sequence = epoch_and_sequence
    payload = bytes(record.encode_batch(batch_body.make_body([b"x"], timestamps_ms=batch_body.now_ms()),
                                        producer_id=PRODUCER, producer_epoch=epoch, base_sequence=sequence))
    assert produce(client, payload)["error_code"] == InvalidRecordError.code
    assert values_of(client, TOPIC, 0) == []
