"""Producer and consumer against a partition leader that hangs (issue 38 item 2).

The "leader" is a TCP proxy to the real broker that can hang as a SIGSTOPped broker does: the
kernel still accepts its connections and the bytes written to it, but nothing is read on to the
broker (or answered) until it resumes. The cluster metadata the client sees is rewritten to name
the proxy (as broker 7) leader of the test's partition, until the test "moves" the partition back
to the real broker. After a request to the hung leader times out, the client must send it nothing
more (a retry would wait out a second request timeout) until it answers a probe or the partition
moves: the proxy counts the requests it was written.
"""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from client import AsyncConsumer, AsyncProducer, Consumer, ConsumerRecord
from client.cluster import Cluster
from protocol.framing import REQUEST_HEADER, ApiKey
from tests.helpers.client_records import consume
from tests.waiting import wait_until, wait_until_async

PROXY_NODE = 7
REQUEST_TIMEOUT_MS = 1_000
WAIT_S = 30.0


class HangingProxy:
    """A TCP proxy to `target` that hangs on `hang()` until `resume()`, and notes the api key of
    every request a client writes to it, and whether it was hung then."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.requests: list[tuple[int, bool]] = []
        self._running = asyncio.Event()
        self._running.set()
        self._pipes: set[asyncio.Future[None]] = set()
        self._connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._closing = False

    async def start(self) -> "HangingProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    def count(self, api_key: ApiKey, *, while_hung: bool = False) -> int:
        return sum(1 for key, hung in self.requests if key == api_key and (hung or not while_hung))

    def hang(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def close(self) -> None:
        assert self._server is not None
        self._closing = True
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._connections)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._connections.add(me)
        broker_reader, broker_writer = await asyncio.open_connection(*self.target)
        if self._closing:
            self._connections.discard(me)
            client_writer.close()
            broker_writer.close()
            return
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        pipes = {asyncio.ensure_future(self._read_requests(client_reader, chunks)),
                 asyncio.ensure_future(self._forward_queue(chunks, broker_writer)),
                 asyncio.ensure_future(self._forward(broker_reader, client_writer))}
        self._pipes |= pipes
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)  # or close() cancelled them all
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes -= pipes
        client_writer.close()
        broker_writer.close()
        self._connections.discard(me)

    async def _read_requests(self, reader: asyncio.StreamReader, chunks: asyncio.Queue[bytes]) -> None:
        """Take what the client writes (as the kernel does for a hung broker), noting each request."""
        pending = b""
        while data := await reader.read(1 << 16):
            pending += data
            while len(pending) >= REQUEST_HEADER.size:
                size, api_key, *_ = REQUEST_HEADER.unpack_from(pending)
                if len(pending) < 4 + size:
                    break
                self.requests.append((api_key, not self._running.is_set()))
                pending = pending[4 + size:]
            await chunks.put(data)
        # The client closed (e.g. on a request timeout): what the broker has not read yet is
        # dropped with the connection (a resumed broker would not answer it to anyone).

    async def _forward_queue(self, chunks: asyncio.Queue[bytes], writer: asyncio.StreamWriter) -> None:
        while True:
            data = await chunks.get()
            await self._running.wait()
            writer.write(data)
            await writer.drain()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            await self._running.wait()
            writer.write(data)
            await writer.drain()


class LeaderOverride:
    """Makes every metadata refresh of `cluster` name the proxy (broker 7) leader of the topic's
    partition 0, until `move()`: refreshes after it name the real leader again (the partition
    moved). Counts the refreshes."""

    def __init__(self, cluster: Cluster, proxy: HangingProxy, topic: str) -> None:
        self.refreshes = 0
        self.moved = False
        real_refresh = cluster.refresh

        async def refresh(topics: list[str] | None = None) -> None:
            await real_refresh(topics)
            self.refreshes += 1
            if not self.moved and topic in cluster.topics:
                cluster.brokers[PROXY_NODE] = proxy.address
                cluster.topics[topic][0] = dataclasses.replace(cluster.topics[topic][0], leader=PROXY_NODE)

        cluster.refresh = refresh  # type: ignore[method-assign]

    def move(self) -> None:
        self.moved = True


def _target(shared_broker) -> tuple[str, int]:
    host, port = shared_broker.bootstrap.rsplit(":", 1)
    return host, int(port)


@pytest.mark.parametrize("max_in_flight", [5, 1], ids=["unordered", "in-order"])
@pytest.mark.parametrize("outcome", ["partition-moves", "leader-answers"])
@pytest.mark.slow
def test_a_produce_that_timed_out_is_resent_only_once_the_leader_answers_or_the_partition_moves(
        shared_broker, new_topic, outcome, max_in_flight):
    """The produce of a to the hung leader times out; the producer refreshes metadata (which
    still names the hung broker) several times meanwhile and sends it no Produce, neither a nor
    b and c sent since. They then go to the new leader once metadata names one, or to the old one
    once it answers a probe: one request timed out, not two. Also with max_in_flight=1
    (partitions muted while a batch is out), where a, b, c keep their order."""
    topic = new_topic(1)

    async def produce() -> tuple[int, int, int, list[int]]:
        proxy = await HangingProxy(_target(shared_broker)).start()
        try:
            # The default retry_backoff_ms: the retry backs off as long as the hold's refresh interval.
            async with AsyncProducer(shared_broker.bootstrap, linger_ms=0, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                     max_in_flight=max_in_flight) as producer:
                cluster = producer.cluster
                leader = LeaderOverride(cluster, proxy, topic)
                await cluster.refresh()
                proxy.hang()
                futures = [await producer.send(topic, b"a", partition=0)]
                await wait_until_async(lambda: producer.sender.metrics.requests_timed_out, WAIT_S, "the produce to time out")
                for value in (b"b", b"c"):
                    futures.append(await producer.send(topic, value, partition=0))
                    await asyncio.sleep(0)  # the sender drains it
                refreshed = leader.refreshes
                await wait_until_async(lambda: leader.refreshes >= refreshed + 3, WAIT_S, "metadata refreshes while it hangs")
                produced_while_hung = proxy.count(ApiKey.PRODUCE, while_hung=True)
                leader.move() if outcome == "partition-moves" else proxy.resume()
                async with asyncio.timeout(WAIT_S):
                    offsets = [(await future).offset for future in futures]
                return (produced_while_hung, proxy.count(ApiKey.PRODUCE), producer.metrics()["request-timeout-total"],
                        offsets)
        finally:
            await proxy.close()

    produced_while_hung, produced, timed_out, offsets = asyncio.run(produce())
    assert produced_while_hung == 1, f"{produced_while_hung} Produce requests were written to the hung leader"
    # The hung leader's; under load a produce to the real broker (1 s timeout) may time out too,
    # which the counts of what reached the proxy tell apart.
    assert timed_out >= 1
    if outcome == "partition-moves":
        assert produced == 1  # the rest went to the new leader
    if timed_out > 1:
        # A produce to the real broker timed out too (a loaded machine) and was sent again: without
        # idempotence that is at least once, so the log may hold a, b, c twice, in their order.
        values = [r.value for r in sorted(consume_at_least(shared_broker.bootstrap, topic, {b"a", b"b", b"c"}),
                                           key=lambda r: r.offset)]
        firsts = list(dict.fromkeys(values))
        assert (firsts if max_in_flight == 1 else sorted(firsts)) == [b"a", b"b", b"c"]
        return
    values = [r.value for r in sorted(consume(shared_broker.bootstrap, topic, 1, 3), key=lambda r: r.offset)]
    if max_in_flight == 1:
        assert (offsets, values) == ([0, 1, 2], [b"a", b"b", b"c"])
    else:
        assert sorted(offsets) == [0, 1, 2] and sorted(values) == [b"a", b"b", b"c"]


def consume_at_least(bootstrap: str, topic: str, values: set[bytes]) -> list[ConsumerRecord]:
    """Partition 0 of `topic` from the beginning until every one of `values` was read."""
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic, 0)])
        records: list[ConsumerRecord] = []
        wait_until(lambda: records.extend(consumer.poll(timeout_ms=200)) or values <= {r.value for r in records},
                   WAIT_S, f"records {sorted(values)}")
        records += consumer.poll(timeout_ms=200)
    return records


def test_a_fetch_that_timed_out_is_not_sent_again_to_the_hung_leader_before_its_partition_moves(shared_broker, new_topic):
    """The fetch from the hung leader times out; the consumer refreshes metadata (which still
    names it) several times and sends it no Fetch; once metadata names another leader, the
    record is fetched from there."""
    topic = new_topic(1)

    async def fetch() -> tuple[int, list[bytes]]:
        proxy = await HangingProxy(_target(shared_broker)).start()
        consumer = AsyncConsumer(shared_broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                 fetch_max_wait_ms=100, retry_backoff_ms=10)
        try:
            await consumer.start()
            cluster = consumer.cluster
            leader = LeaderOverride(cluster, proxy, topic)
            await cluster.refresh()
            await consumer.assign([(topic, 0)])  # from offset 0 (the end): long polls through the proxy
            await wait_until_async(lambda: proxy.count(ApiKey.FETCH), WAIT_S, "a fetch from the proxy")
            proxy.hang()
            refreshed = leader.refreshes
            async with AsyncProducer(shared_broker.bootstrap) as producer:  # to the real leader
                await (await producer.send(topic, b"a", partition=0))
            # None until the fetch in flight times out; without the hold, each would be followed
            # by a fetch to the hung leader, timing out in turn.
            await wait_until_async(lambda: leader.refreshes >= refreshed + 3, WAIT_S, "metadata refreshes while it hangs")
            fetched_while_hung = proxy.count(ApiKey.FETCH, while_hung=True)
            leader.move()
            records: list = []
            async with asyncio.timeout(WAIT_S):
                while not records:
                    records = await consumer.poll(100)
            return fetched_while_hung, [r.value for r in records]
        finally:
            await consumer.close()
            await proxy.close()

    fetched_while_hung, values = asyncio.run(fetch())
    # The fetch in flight at the pause may have been written just after it: at most that one.
    assert fetched_while_hung <= 1, f"{fetched_while_hung} Fetch requests were written to the hung leader"
    assert values == [b"a"]
