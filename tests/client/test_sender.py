"""Sender against a real broker process: batches of a partition keep their order while a slow
path (connection opening, leader lookup) waits and while a retried batch backs off; and against
the fake cluster: in-flight limits, batching per leader, retries, give-up."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from client import AsyncProducer
from common.errors import (
    CorruptMessageError,
    DeliveryTimeoutError,
    NetworkError,
    NotLeaderError,
    UnknownTopicOrPartitionError,
)
from protocol import ApiKey, MetadataRequest, ProducePartitionResponse, ProduceRequest, ProduceResponse, TopicResponse
from segment_format import record
from tests.client.fake_cluster import FakeCluster, with_fake
from tests.helpers.client_records import consume


@pytest.mark.parametrize("slow_path", ["_open", "refresh"], ids=["connection-opening", "leader-lookup"])
@pytest.mark.slow
def test_batches_drained_while_a_slow_path_waits_keep_their_order(shared_broker, new_topic, slow_path):
    """Three one-record batches drained one by one while the leader's connection opens (or its
    partition is looked up), and a fourth drained the moment that is done, land at offsets 0..3
    in send order: no later batch overtakes the ones waiting."""
    topic = new_topic(1)

    async def produce() -> list[bytes]:
        async with AsyncProducer(shared_broker.bootstrap, linger_ms=0) as producer:
            cluster, let_go, late = producer.cluster, asyncio.Event(), []
            leader = (await cluster.partitions(topic))[0].leader
            if slow_path == "_open":
                assert cluster.open_connection(leader) is None  # start() used the bootstrap connection
            else:
                await cluster.connection(leader)
                del cluster.topics[topic]  # the sender must look the partition up
            done_now = getattr(cluster, slow_path)

            async def done_when_let_go(*args):
                await let_go.wait()
                result = await done_now(*args)
                if not late:  # done, but the sender's task has not resumed: a batch drained now
                    late.append(await producer.send(topic, b"d", partition=0))
                    await asyncio.sleep(0)  # the sender runs
                return result

            setattr(cluster, slow_path, done_when_let_go)
            futures = []
            for value in (b"a", b"b", b"c"):
                futures.append(await producer.send(topic, value, partition=0))
                await asyncio.sleep(0)  # the sender drains this one batch, which must wait
            let_go.set()
            await producer.flush()
            assert [(await f).offset for f in futures + late] == [0, 1, 2, 3]
        return [r.value for r in sorted(consume(shared_broker.bootstrap, topic, 1, 4), key=lambda r: r.offset)]

    assert asyncio.run(asyncio.wait_for(produce(), 30)) == [b"a", b"b", b"c", b"d"]


def not_leader_reply(topic: str) -> tuple[dict, memoryview]:
    response = ProduceResponse((TopicResponse(topic, (ProducePartitionResponse(0, NotLeaderError.code),)),))
    return response.to_control(), memoryview(b"")


@pytest.mark.parametrize("failure", ["lost-connection", "not-leader", "connect-fails"])
def test_max_in_flight_one_sends_a_retried_batch_before_newer_batches_of_its_partition(shared_broker, new_topic, failure):
    """max_in_flight=1, one record per batch: batch a fails with a retriable error (its request's
    connection is lost, the partition answers NOT_LEADER, or the leader's connection cannot be
    opened) while b, c, d of its partition are sealed. They wait while a backs off, and a goes
    first: offsets 0..3 in send order (b, c, d used to be sent during a's back-off)."""
    topic = new_topic(1)

    async def produce() -> list[bytes]:
        async with AsyncProducer(shared_broker.bootstrap, linger_ms=0, batch_size=1, max_in_flight=1,
                                 retry_backoff_ms=10) as producer:
            cluster, retry_may_go = producer.cluster, asyncio.Event()
            leader = (await cluster.partitions(topic))[0].leader
            refresh = producer.sender.refresh_metadata

            async def refresh_when_let_go():  # the back-off's end: a's retry waits for the test
                await retry_may_go.wait()
                await refresh()

            producer.sender.refresh_metadata = refresh_when_let_go
            first_reply = asyncio.get_running_loop().create_future()
            if failure == "connect-fails":
                assert cluster.open_connection(leader) is None  # start() used the bootstrap connection
                connect = cluster.connection
                attempts = []

                async def first_attempt_fails(node):
                    attempts.append(node)
                    if len(attempts) == 1:
                        raise NetworkError("injected: connection refused")
                    return await connect(node)

                cluster.connection = first_attempt_fails
            else:
                conn = await cluster.connection(leader)
                request = conn.request

                def first_request_answered_by_the_test(message, timeout_s):
                    conn.request = request
                    return first_reply  # nothing written: a is not stored

                conn.request = first_request_answered_by_the_test
            futures = [await producer.send(topic, b"a", partition=0)]
            await asyncio.sleep(0)  # the sender hands a out
            for value in (b"b", b"c", b"d"):
                futures.append(await producer.send(topic, value, partition=0))
                await asyncio.sleep(0)  # the sender drains it: no free in-flight slot
            if failure == "lost-connection":
                first_reply.set_exception(NetworkError("injected: connection lost"))
            elif failure == "not-leader":
                first_reply.set_result(not_leader_reply(topic))
            # What must not happen cannot be waited for: a backs off; were b, c, d let go, they would be written now.
            await asyncio.sleep(0.3)
            retry_may_go.set()
            await producer.flush()
            assert [(await f).offset for f in futures] == [0, 1, 2, 3]
        return [r.value for r in sorted(consume(shared_broker.bootstrap, topic, 1, 4), key=lambda r: r.offset)]

    assert asyncio.run(asyncio.wait_for(produce(), 30)) == [b"a", b"b", b"c", b"d"]


# -- against the fake cluster (tests/client/fake_cluster.py): in-flight limits, batching, errors --


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait on the loop until `condition()` holds (a generous 30 s, then fail naming `what`)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def produced(fake: FakeCluster) -> list[tuple[str, int, list[int]]]:
    """Each Produce request as (node, partitions, record count of each batch) tuples, in order."""
    rows = []
    for node, request in fake.requests:
        if isinstance(request, ProduceRequest):
            for t in request.topics:
                for p in t.partitions:
                    counts = [h.record_count for data in p.records for _, h in record.iter_batches(bytes(data), verify=False)]
                    rows.append((node, p.partition, counts))
    return rows


def test_no_more_than_max_in_flight_produce_requests_wait_for_a_broker():
    """Without idempotence (a partition may have several requests out), max_in_flight=2, answers
    held back: a and b go out in a request each; c and d, sent while
    both slots are taken, wait (e, sent after them to another leader, goes out meanwhile) and go
    out together in one request once an answer frees a slot. Every record lands in send order."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.hold(ApiKey.PRODUCE)
        futures = []
        for value in (b"a", b"b"):
            futures.append(await producer.send("t", value, partition=0))
            await until(lambda: len(fake.held) == len(futures), f"the request of {value!r}")
        futures += [await producer.send("t", value, partition=0) for value in (b"c", b"d")]
        other = await producer.send("t", b"e", partition=1)
        await until(lambda: fake.sent(ProduceRequest, node=1), "the request of e")  # the sender drained c and d too
        assert len(fake.sent(ProduceRequest, node=0)) == 2
        fake.release(1)
        await until(lambda: len(fake.sent(ProduceRequest, node=0)) == 3, "the request of c and d")
        fake.release()
        assert [(await f).offset for f in futures] == [0, 1, 2, 3] and (await other).offset == 0
        assert [row for row in produced(fake) if row[1] == 0] == [(0, 0, [1]), (0, 0, [1]), (0, 0, [1, 1])]

    with_fake(test, leaders=(0, 1), max_in_flight=2, batch_size=1, enable_idempotence=False)


def test_records_that_wait_for_a_slot_go_out_batched_in_one_request_per_leader():
    """While the only in-flight slot is taken, records for two partitions of the same leader
    accumulate: the next request carries both partitions, partition 0's three records as one batch."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.hold(ApiKey.PRODUCE)
        first = await producer.send("t", b"a", partition=0)
        await until(lambda: fake.held, "the first produce request")
        later = [await producer.send("t", value, partition=p) for value, p in ((b"b", 0), (b"c", 0), (b"d", 0), (b"e", 1))]
        fake.release()
        await producer.flush()
        assert (await first).offset == 0
        assert [(await f).offset for f in later] == [1, 2, 3, 0]
        assert produced(fake) == [(0, 0, [1]), (0, 0, [3]), (0, 1, [1])]
        assert len(fake.sent(ProduceRequest)) == 2

    with_fake(test, leaders=(0, 0), max_in_flight=1)


def test_not_leader_is_retried_on_the_new_leader_after_a_metadata_refresh():
    """The leader moved to node 1: node 0 answers NOT_LEADER, the producer refreshes metadata
    and the batch lands on node 1."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        await producer.send("t", b"warm-up", partition=0)
        await producer.flush()
        metadata_before = len(fake.sent(MetadataRequest))
        fake.move_leader("t", 0, 1)
        future = await producer.send("t", b"a", partition=0)
        assert (await future).offset == 1
        assert [node for node, _, _ in produced(fake)] == [0, 0, 1]
        assert len(fake.sent(MetadataRequest)) > metadata_before

    with_fake(test)


@pytest.mark.parametrize("error, raised, settings", [
    (CorruptMessageError, CorruptMessageError, {}),
    (NotLeaderError, DeliveryTimeoutError, {"delivery_timeout_ms": 1000, "request_timeout_ms": 500}),
], ids=["non-retriable-at-once", "retriable-until-the-delivery-timeout"])
def test_an_error_for_ever_fails_the_batch_with_its_named_error(error, raised, settings):
    """CORRUPT_MESSAGE is not retried: one request, and the record's future raises it. NOT_LEADER
    is retried with back-off, then DeliveryTimeoutError at delivery_timeout_ms."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.fail(ApiKey.PRODUCE, error, times=None)
        future = await producer.send("t", b"a", partition=0)
        with pytest.raises(raised):
            await future
        assert (len(fake.sent(ProduceRequest)) > 1) == error.retriable

    with_fake(test, **settings)


def test_a_metadata_lookup_whose_connection_drops_is_tried_again():
    """The first record of a topic needs its metadata; the broker drops the connection the lookup
    went out on, twice (a leader killed as a Spark task starts): the producer looks again after a
    back-off, and the record lands. An unknown topic still fails at once."""

    async def test(fake: FakeCluster, producer: AsyncProducer) -> None:
        fake.add_topic("u")
        fake.drop(ApiKey.METADATA, times=2)
        lookups_before = len(fake.sent(MetadataRequest))
        future = await producer.send("u", b"a", partition=0)
        assert (await future).offset == 0
        assert len(fake.sent(MetadataRequest)) - lookups_before >= 3
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send("missing", b"b")

    with_fake(test, max_block_ms=30_000)


def test_a_metadata_request_whose_broker_goes_away_is_asked_of_another():
    """The producer's first metadata request reaches broker 0, which goes away without answering
    (a leader killed as a Spark task starts its producer): the request goes to broker 1 at once,
    the producer starts, and the record lands."""

    async def run() -> list[int]:
        fake = await FakeCluster(nodes=2).start()
        fake.add_topic("t")
        fake.drop(ApiKey.METADATA, node=0)
        try:
            async with AsyncProducer(f"{fake.bootstrap},127.0.0.1:{fake.ports[1]}", linger_ms=0) as producer:
                assert (await (await producer.send("t", b"a", partition=0))).offset == 0
        finally:
            await fake.close()
        return [node for node, request in fake.requests if isinstance(request, MetadataRequest)]

    assert asyncio.run(run())[:2] == [0, 1]
