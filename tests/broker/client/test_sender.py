"""Sender against a real broker process: batches of a partition keep their order while a slow
path (connection opening, leader lookup) waits and while a retried batch backs off."""
from __future__ import annotations

import asyncio

import pytest

from broker.client import AsyncProducer
from broker.errors import NetworkError, NotLeaderError
from broker.protocol import ProducePartitionResponse, ProduceResponse, TopicResponse
from tests.broker.client.test_producer import consume


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
            await asyncio.sleep(0.3)  # a backs off: were b, c, d let go, they would be written now
            retry_may_go.set()
            await producer.flush()
            assert [(await f).offset for f in futures] == [0, 1, 2, 3]
        return [r.value for r in sorted(consume(shared_broker.bootstrap, topic, 1, 4), key=lambda r: r.offset)]

    assert asyncio.run(asyncio.wait_for(produce(), 30)) == [b"a", b"b", b"c", b"d"]
