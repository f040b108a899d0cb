"""The idempotent producer's client side against the fake cluster: producer ids, sequence numbers
per partition kept through retries, a new id when a sequence is refused or a batch fails for
good, and at most five batches of a partition per request (the leader's window). The broker side
(duplicates answered with their original offsets) is tested against real brokers."""
from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from client import AsyncProducer
from client.idempotence import ProducerSequences, SequenceWindows
from client.producer_batch import ProducerBatch
from common.errors import InvalidRecordError, OutOfOrderSequenceError
from protocol import ApiKey, InitProducerIdRequest, ProduceRequest
from segment_format import record
from tests.client.fake_cluster import FakeCluster, with_fake
from tests.waiting import wait_until_async


def batches(fake: FakeCluster) -> list[list[tuple[int, int, int, int]]]:
    """Each Produce request's batches as (partition, producer id, base sequence, record count)."""
    requests = []
    for request in fake.sent(ProduceRequest):
        rows = []
        for t in request.topics:
            for p in t.partitions:
                for data in p.records:
                    for _, h in record.iter_batches(bytes(data), verify=True):
                        assert h.producer_epoch == 0
                        rows.append((p.partition, h.producer_id, h.base_sequence, h.record_count))
        requests.append(rows)
    return requests


def test_sequences_count_records_per_partition_and_a_retry_repeats_them():
    """Partition 0 gets sequences 0, 1, 3 (batches of 1, 2, 1 records), partition 1 its own 0; the
    request whose connection drops goes again with the same producer id and sequences."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        await (await producer.send("t", b"a", partition=0))
        for result in await producer.send_batch("t", pa.table({"value": [b"b", b"c"]}), partition=0):
            await result.wait_async()
        fake.drop(ApiKey.PRODUCE)
        assert (await (await producer.send("t", b"d", partition=0))).offset == 3
        assert (await (await producer.send("t", b"e", partition=1))).offset == 0
        sent = batches(fake)
        assert sent[:2] == [[(0, 1000, 0, 1)], [(0, 1000, 1, 2)]]
        assert sent[2] == sent[3] == [(0, 1000, 3, 1)]  # dropped, then retried as it was
        assert sent[4:] == [[(1, 1000, 0, 1)]]
        assert len(fake.sent(InitProducerIdRequest)) == 1

    with_fake(test, leaders=(0, 0))


def test_a_refused_sequence_gets_a_new_producer_id_and_the_batch_goes_again_from_zero():
    """OUT_OF_ORDER_SEQUENCE: nothing was written; the batch is delivered under producer id 1001
    with sequence 0, and the next batch follows it."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        await (await producer.send("t", b"a"))
        fake.fail(ApiKey.PRODUCE, OutOfOrderSequenceError, partition=("t", 0))
        await (await producer.send("t", b"b"))
        await (await producer.send("t", b"c"))
        assert batches(fake) == [[(0, 1000, 0, 1)], [(0, 1000, 1, 1)], [(0, 1001, 0, 1)], [(0, 1001, 1, 1)]]
        assert [r.producer_id for r in fake.sent(InitProducerIdRequest)] == [-1, 1000]

    with_fake(test)


def test_a_batch_that_fails_for_good_starts_the_sequences_again_under_a_new_id():
    """A batch refused for good (INVALID_RECORD) fails with its error; its sequence is never given
    to another batch: the next batch goes under a new producer id from sequence 0."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.fail(ApiKey.PRODUCE, InvalidRecordError, partition=("t", 0))
        with pytest.raises(InvalidRecordError):
            await (await producer.send("t", b"a"))
        assert (await (await producer.send("t", b"b"))).offset == 0
        assert batches(fake) == [[(0, 1000, 0, 1)], [(0, 1001, 0, 1)]]

    with_fake(test)


def test_a_partition_has_at_most_five_batches_out_and_a_retry_goes_before_newer_ones():
    """Twelve one-record batches while no answer comes: five go out (the leader's window), the
    rest wait. Once they are answered, the next request's connection drops: its batch goes again
    before any newer one (with those behind it on the dropped connection), and the partition's
    log holds sequences 0..11 in order, each record once."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.hold(ApiKey.PRODUCE)
        futures = [await producer.send("t", str(i).encode()) for i in range(12)]
        await wait_until_async(lambda: sum(map(len, batches(fake))) == 5, 30, "five batches out")
        await asyncio.sleep(0.05)  # the sender had every chance to send more: it must not
        assert sum(map(len, batches(fake))) == 5
        fake.drop(ApiKey.PRODUCE)
        fake.release()
        assert [(await f).offset for f in futures] == list(range(12))
        logged = [record.read_header(data).base_sequence for _, _, data in fake.logs[("t", 0)]]
        assert logged == list(range(12))

    with_fake(test, batch_size=1)


def test_idempotence_is_off_with_acks_zero_and_refused_if_asked_for():
    with pytest.raises(ValueError, match="enable_idempotence needs acks=1 or 'all'"):
        AsyncProducer("127.0.0.1:9", acks=0, enable_idempotence=True)
    assert AsyncProducer("127.0.0.1:9", acks=0).sender.sequences is None
    assert AsyncProducer("127.0.0.1:9", enable_idempotence="false").sender.sequences is None
    assert AsyncProducer("127.0.0.1:9").sender.sequences is not None


def test_the_window_moves_only_past_its_oldest_unacknowledged_batch():
    """Pure SequenceWindows: seven batches, five go out; the third acknowledged first frees no
    room (the first is still out: a retry of it must find it among the leader's last five); each
    of the first two acknowledged lets one more go, with the next sequence."""
    sequences = ProducerSequences()
    sequences.install(7, 0, [])
    windows = SequenceWindows(sequences)
    batches = []
    for i in range(7):
        batch = ProducerBatch("t", 0)
        batch.record_count = 1
        batches.append(batch)
    out = windows.hand_out(batches)
    assert out == batches[:5] and windows.muted[("t", 0)] == batches[5:]
    batches[2].result.complete(2)
    assert windows.completed(batches[2]) == []  # the first is out: no room
    batches[0].result.complete(0)
    released = windows.completed(batches[0])  # the window starts at the second now: room for one
    assert released == batches[5:]
    assert windows.hand_out(released) == batches[5:6] and windows.muted[("t", 0)] == batches[6:]
    batches[1].result.complete(1)
    released = windows.completed(batches[1])
    assert windows.hand_out(released) == batches[6:]
    assert [b.producer for b in batches] == [(7, 0, i) for i in range(7)]
