"""Fetcher against a real broker process: prefetching between polls, the next fetch going out
before a reply is decoded, and small polls taking from every buffered partition in turn; and
against the fake cluster: leader changes, retriable and non-retriable partition errors, timeouts."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from client import AsyncConsumer, Consumer, ConsumerRecord
from common.errors import CorruptMessageError, NotLeaderError, PymqError, UnknownTopicOrPartitionError
from protocol import ApiKey, ApiVersionsRequest, FetchRequest, ListOffsetsRequest, MetadataRequest
from segment_format import batch_body, record
from tests.client.fake_cluster import FakeCluster
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

    def watched(tp, data, aborted):
        out_while_decoding.append(len(fetcher.cluster.open_connection(fetcher._leader(tp))._pending))
        absorb(tp, data, aborted)

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


# -- against the fake cluster (tests/client/fake_cluster.py): leader changes, errors, timeouts --


def batch(base_offset: int, n: int, partition: int = 0) -> bytes:
    body = batch_body.make_body([b"p%d-%d" % (partition, base_offset + i) for i in range(n)],
                                timestamps_ms=1_700_000_000_000)
    return bytes(record.encode_batch(body, base_offset=base_offset))


async def poll_async(consumer: AsyncConsumer, count: int, errors: list[Exception] | None = None) -> list[tuple[int, int]]:
    """(partition, offset) of `count` records polled (within a generous 30 s); a poll's error is
    collected in `errors` when given, raised otherwise."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        try:
            got += [(r.partition, r.offset) for r in await consumer.poll(timeout_ms=100)]
        except PymqError as err:
            if errors is None:
                raise
            errors.append(err)
    assert len(got) == count, got
    return got


def with_fake(test: Callable[[FakeCluster, AsyncConsumer], Awaitable[None]], **settings: Any) -> None:
    """Run `test` with a fake cluster of 2 nodes and a consumer on it (short back-offs)."""

    async def run() -> None:
        fake = await FakeCluster(nodes=2).start()
        consumer = await AsyncConsumer(fake.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=10,
                                       fetch_max_wait_ms=50, **settings).start()
        try:
            await test(fake, consumer)
        finally:
            await consumer.close()
            await fake.close()

    asyncio.run(run())


def test_a_leader_change_is_followed_to_the_new_leader_after_a_metadata_refresh():
    """The partition's leader moves from node 0 to node 1 while the consumer reads: node 0
    answers NOT_LEADER, metadata is refreshed, and the rest is fetched from node 1 in order."""

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 1, leader=0)
        fake.append("t", 0, batch(0, 3))
        await consumer.assign([("t", 0)])
        got = await poll_async(consumer, 3)
        metadata_before = len(fake.sent(MetadataRequest))
        fake.move_leader("t", 0, 1)
        fake.append("t", 0, batch(3, 3))
        got += await poll_async(consumer, 3)
        assert got == [(0, offset) for offset in range(6)]
        assert len(fake.sent(MetadataRequest)) > metadata_before
        assert fake.sent(FetchRequest, node=1)

    with_fake(test)


def test_a_retriable_partition_error_is_retried_and_its_records_then_arrive():
    """NOT_LEADER twice for a partition whose leader did not move (a leader election settling):
    retried after metadata refreshes, no error reaches poll."""

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 1, leader=0)
        fake.append("t", 0, batch(0, 4))
        fake.fail(ApiKey.FETCH, NotLeaderError, partition=("t", 0), times=2)
        await consumer.assign([("t", 0)])
        assert await poll_async(consumer, 4) == [(0, offset) for offset in range(4)]
        assert fake.faults[0].times == 0

    with_fake(test)


def test_one_failing_partition_of_a_fetch_does_not_hold_back_the_others():
    """A fetch of two partitions where the broker answers CORRUPT_MESSAGE (not retriable) for
    one: the other's records are polled, the error is raised by a poll once, naming it, and the
    failed partition is then read from its position."""

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 2, leader=0)
        fake.append("t", 0, batch(0, 3, partition=0))
        fake.append("t", 1, batch(0, 3, partition=1))
        fake.fail(ApiKey.FETCH, CorruptMessageError, partition=("t", 1), times=1)
        await consumer.assign([("t", 0), ("t", 1)])
        errors: list[Exception] = []
        got = await poll_async(consumer, 6, errors)
        assert sorted(got) == [(p, o) for p in (0, 1) for o in range(3)]
        assert [type(err) for err in errors] == [CorruptMessageError]
        assert got.index((1, 0)) > got.index((0, 0))  # partition 0 was not held back behind partition 1's error

    with_fake(test)


def test_a_fetch_the_leader_does_not_answer_times_out_and_is_sent_again_once_it_answers():
    """The first Fetch is never answered (a hung broker): it times out after the request timeout,
    the leader is probed (ApiVersions) and, once it answers, fetched again: every record arrives."""

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 1, leader=0)
        fake.append("t", 0, batch(0, 3))
        fake.fail(ApiKey.FETCH, None, times=1)
        await consumer.assign([("t", 0)])
        assert await poll_async(consumer, 3) == [(0, offset) for offset in range(3)]
        assert len(fake.sent(FetchRequest)) >= 2 and fake.sent(ApiVersionsRequest)

    with_fake(test, request_timeout_ms=1000)


def test_a_defect_in_the_fetch_loop_is_raised_by_poll_not_left_as_a_silent_stall(monkeypatch):
    """An unexpected exception while handling a fetch response (a bug, not a broker error) is
    raised by the next poll; before, it ended the node's fetch loop unseen and every later poll
    returned nothing. A later poll fetches again."""
    from client.fetcher import Fetcher

    absorb, failures = Fetcher._absorb, [RuntimeError("a defect in the fetcher")]

    def failing_once(self: Fetcher, tp: Any, data: Any, aborted: Any) -> None:
        if failures:
            raise failures.pop()
        absorb(self, tp, data, aborted)

    monkeypatch.setattr(Fetcher, "_absorb", failing_once)

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 1, leader=0)
        fake.append("t", 0, batch(0, 3))
        await consumer.assign([("t", 0)])
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="a defect in the fetcher"):
            while time.monotonic() < deadline:
                assert await consumer.poll(timeout_ms=100) == []
        assert await poll_async(consumer, 3) == [(0, offset) for offset in range(3)]

    with_fake(test)


def test_assign_retries_a_leader_that_does_not_know_the_new_topic_yet():
    """Right after a topic's creation its leader may not have applied it yet and answer the start
    position's lookup UNKNOWN_TOPIC_OR_PARTITION (metadata already names it leader): assign()
    retries, as Kafka's consumer does, instead of raising (a tail reader started right after a
    create_topic on a loaded cluster died at assign)."""

    async def test(fake: FakeCluster, consumer: AsyncConsumer) -> None:
        fake.add_topic("t", 1, leader=0)
        fake.append("t", 0, batch(0, 3))
        fake.fail(ApiKey.LIST_OFFSETS, UnknownTopicOrPartitionError, partition=("t", 0), times=2)
        await consumer.assign([("t", 0)])
        assert await poll_async(consumer, 3) == [(0, offset) for offset in range(3)]
        assert len(fake.sent(ListOffsetsRequest)) == 3

    with_fake(test)
