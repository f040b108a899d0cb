"""A fake cluster for client unit tests: in-process brokers on 127.0.0.1 that speak pymq's real
frames (protocol.FrameDecoder, the typed messages, encode_response), so the client under test runs
its own Cluster and connections unchanged, and a test scripts what the brokers answer:

    cluster = FakeCluster(nodes=2)
    await cluster.start()
    cluster.add_topic("t", partitions=2, leader=0)
    cluster.append("t", 0, batch(0, 5))
    cluster.move_leader("t", 0, 1)                       # node 0 now answers NOT_LEADER
    cluster.fail(ApiKey.FETCH, CorruptMessageError, partition=("t", 1), times=None)  # for ever
    ... read with a client bootstrapped on cluster.bootstrap ...
    cluster.requests                                     # (node, request message) as they came

APIs answered: Metadata, ApiVersions, Fetch, ListOffsets (earliest, latest), Produce (appended
at the log's end: the fake keeps no producer state), InitProducerId (a new id per call, from 1000). A partition answers per its leader (NOT_LEADER on any other node) unless a
scripted fault matches first. Each fetched partition gets every batch from the one holding its
offset, up to its max_bytes (the first batch whole, as KIP-74 says). `hold(api)` keeps that API's
answers back until `release()` (in-flight limits; a fault with `error=None` is never answered: a
hung broker); `drop(api)` closes the connection a request of `api` arrives on (a killed broker).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from client import AsyncProducer
from common.errors import NotLeaderError, PymqError
from common.topic_partition import TopicPartition
from protocol import (
    EARLIEST_TIMESTAMP,
    REQUEST_TYPES,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerAddress,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FrameDecoder,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    PartitionMetadata,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    Request,
    TopicMetadata,
    TopicResponse,
    encode_response,
)
from segment_format import record


class UnansweredApi(Exception):
    """A request of an API the fake does not answer (only those the module docstring lists): the
    test fails with it (FakeCluster.close raises it) instead of hanging on a request never answered."""


@dataclass
class Fault:
    """Answer `error` for `api` (for `partition` only, on `node` only, when given), `times` times
    (None: for ever); `error` None: leave the request unanswered."""

    api: ApiKey
    error: type[PymqError] | None
    partition: TopicPartition | None = None
    node: int | None = None
    times: int | None = 1

    def take(self, api: ApiKey, node: int, tp: TopicPartition | None) -> bool:
        """Whether this fault answers `api` at `node` for `tp` (None: the whole request); counts it."""
        if (self.api != api or (self.times is not None and self.times <= 0) or self.partition not in (None, tp)
                or self.node not in (None, node)):
            return False
        if self.times is not None:
            self.times -= 1
        return True


class FakeCluster:
    def __init__(self, nodes: int = 2) -> None:
        self.nodes = nodes
        self.leaders: dict[str, list[int]] = {}  # topic -> leader node of each partition
        self.logs: dict[TopicPartition, list[tuple[int, int, bytes]]] = {}  # (base, next offset, batch bytes)
        self.faults: list[Fault] = []
        self.drops: list[Fault] = []  # requests that close their connection instead of an answer
        self.requests: list[tuple[int, Message]] = []
        self.held: list[tuple[_FakeBroker, int, Message]] = []  # answers kept back (hold), in order
        self.holding: set[ApiKey] = set()
        self.defects: list[Exception] = []  # exceptions the fake raised answering (close() raises the first)
        self._servers: list[asyncio.Server] = []
        self._transports: list[asyncio.BaseTransport] = []  # connections, closed by close()
        self.ports: list[int] = []
        self.producer_ids = 999  # the last id InitProducerId gave

    async def start(self) -> "FakeCluster":
        for node in range(self.nodes):
            server = await asyncio.get_running_loop().create_server(lambda n=node: _FakeBroker(self, n), "127.0.0.1", 0)
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for transport in self._transports:
            transport.close()
        for server in self._servers:
            await server.wait_closed()
        if self.defects:
            raise self.defects[0]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    # -- the script --------------------------------------------------------------------------------

    def add_topic(self, topic: str, partitions: int = 1, leader: int = 0) -> None:
        self.leaders[topic] = [leader] * partitions
        for partition in range(partitions):
            self.logs[(topic, partition)] = []

    def append(self, topic: str, partition: int, batch: bytes) -> None:
        """Add an encoded batch (its base offset already the log's end)."""
        (_, header), = record.iter_batches(batch, verify=False)
        self.logs[(topic, partition)].append((header.base_offset, header.next_offset, batch))

    def move_leader(self, topic: str, partition: int, node: int) -> None:
        self.leaders[topic][partition] = node

    def hold(self, api: ApiKey) -> None:
        """Keep `api`'s answers back (they wait in `held`) until `release`."""
        self.holding.add(api)

    def release(self, count: int | None = None) -> None:
        """Send the first `count` answers held (None: all, and stop holding)."""
        if count is None:
            self.holding.clear()
        released, self.held = self.held[:count], self.held[len(self.held) if count is None else count:]
        for broker, correlation_id, response in released:
            broker.write(correlation_id, response)

    def fail(self, api: ApiKey, error: type[PymqError] | None, *, partition: TopicPartition | None = None,
             node: int | None = None, times: int | None = 1) -> None:
        self.faults.append(Fault(api, error, partition, node, times))

    def drop(self, api: ApiKey, *, node: int | None = None, times: int | None = 1) -> None:
        """Close the connection when `api`'s request arrives (at `node`), `times` times, instead of
        answering: a broker killed as the request reached it."""
        self.drops.append(Fault(api, None, None, node, times))

    def sent(self, request_type: type[Message], node: int | None = None) -> list[Message]:
        """The requests of a type that arrived (at `node`), in order."""
        return [r for n, r in self.requests if isinstance(r, request_type) and node in (None, n)]

    # -- answers -----------------------------------------------------------------------------------

    def answer(self, node: int, request: Message) -> Message | None:
        """The response to `request` at `node`; None: none (a hung broker's)."""
        self.requests.append((node, request))
        if any(fault.error is None and fault.take(request.api_key, node, None) for fault in self.faults):
            return None
        if isinstance(request, ApiVersionsRequest):
            return ApiVersionsResponse(())
        if isinstance(request, ProduceRequest):
            return self._produce(node, request)
        if isinstance(request, MetadataRequest):
            return self._metadata()
        if isinstance(request, FetchRequest):
            return self._fetch(node, request)
        if isinstance(request, ListOffsetsRequest):
            return self._list_offsets(node, request)
        if isinstance(request, InitProducerIdRequest):
            self.producer_ids += 1
            return InitProducerIdResponse(producer_id=self.producer_ids, producer_epoch=0)
        raise UnansweredApi(f"the fake cluster does not answer {type(request).__name__}")

    def _error(self, api: ApiKey, node: int, tp: TopicPartition) -> int:
        """The error code a scripted fault or the partition's leadership gives (0: none)."""
        for fault in self.faults:
            if fault.error is not None and fault.take(api, node, tp):
                return fault.error.code
        return 0 if self.leaders[tp[0]][tp[1]] == node else NotLeaderError.code

    def _metadata(self) -> MetadataResponse:
        brokers = tuple(BrokerAddress(n, "127.0.0.1", port) for n, port in enumerate(self.ports))
        topics = tuple(TopicMetadata(topic, topic_id=f"id-{topic}", partitions=tuple(
            PartitionMetadata(p, leader, 0, (leader,), (leader,)) for p, leader in enumerate(leaders)))
            for topic, leaders in self.leaders.items())
        return MetadataResponse(brokers, 0, topics)

    def _end(self, tp: TopicPartition) -> int:
        log = self.logs[tp]
        return log[-1][1] if log else 0

    def _fetch(self, node: int, request: FetchRequest) -> FetchResponse:
        """Every batch from the one holding the fetch offset, within the partition's and the
        request's max_bytes, the first batch whole."""

        def answer(tp: TopicPartition, p: Any) -> FetchPartitionResponse:
            error = self._error(ApiKey.FETCH, node, tp)
            if error:
                return FetchPartitionResponse(p.partition, error)
            limit = min(p.max_bytes or request.max_bytes or 1 << 30, request.max_bytes or 1 << 30)
            records = b""
            for _, next_offset, data in self.logs[tp]:
                if next_offset > p.fetch_offset and (not records or len(records) + len(data) <= limit):
                    records += data
            return FetchPartitionResponse(p.partition, high_watermark=self._end(tp), log_start_offset=0, records=records)

        return FetchResponse(_per_partition(request, answer))

    def _produce(self, node: int, request: ProduceRequest) -> ProduceResponse:
        """Appends every batch at the log's end (the base offsets in the stored bytes are the producer's)."""

        def answer(tp: TopicPartition, p: Any) -> ProducePartitionResponse:
            error = self._error(ApiKey.PRODUCE, node, tp)
            base = self._end(tp)
            if not error:
                for data in map(bytes, p.records):
                    for position, header in record.iter_batches(data, verify=False):
                        start = self._end(tp)
                        self.logs[tp].append((start, start + header.record_count,
                                              data[position:position + record.LENGTH_PREFIX + header.batch_length]))
            return ProducePartitionResponse(p.partition, error, base_offset=-1 if error else base)

        return ProduceResponse(_per_partition(request, answer))

    def _list_offsets(self, node: int, request: ListOffsetsRequest) -> ListOffsetsResponse:
        def answer(tp: TopicPartition, p: Any) -> ListOffsetsPartitionResponse:
            error = self._error(ApiKey.LIST_OFFSETS, node, tp)
            offset = 0 if p.timestamp == EARLIEST_TIMESTAMP else self._end(tp)
            return ListOffsetsPartitionResponse(p.partition, error, offset=-1 if error else offset)

        return ListOffsetsResponse(_per_partition(request, answer))


def _per_partition(request: Any, answer: Callable[[TopicPartition, Any], Any]) -> tuple[TopicResponse[Any], ...]:
    """A response's topics: `answer(tp, entry)` for each partition entry of the request, in order."""
    return tuple(TopicResponse(t.name, tuple(answer((t.name, p.partition), p) for p in t.partitions))
                 for t in request.topics)


class _FakeBroker(asyncio.Protocol):
    """One connection to fake broker `node`: decodes request frames, writes the cluster's answers."""

    def __init__(self, cluster: FakeCluster, node: int) -> None:
        self.cluster, self.node = cluster, node
        self.decoder = FrameDecoder(64 << 20)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.cluster._transports.append(transport)

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            assert isinstance(frame, Request), frame
            message = REQUEST_TYPES[frame.api_key].from_control(frame.control, frame.payload)
            if any(drop.take(frame.api_key, self.node, None) for drop in self.cluster.drops):
                self.cluster.requests.append((self.node, message))
                assert self.transport is not None
                self.transport.abort()
                return
            try:
                response = self.cluster.answer(self.node, message)
            except Exception as err:  # the fake's own defect: fail the test, not hang it
                self.cluster.defects.append(err)
                assert self.transport is not None
                self.transport.close()
                return
            if response is None:
                continue
            if isinstance(message, FetchRequest) and _empty(response):  # a long poll: answer after max_wait_ms
                asyncio.get_running_loop().call_later(message.max_wait_ms / 1000, self.write, frame.correlation_id,
                                                      response)
                continue
            if message.api_key in self.cluster.holding:
                self.cluster.held.append((self, frame.correlation_id, response))
                continue
            self.write(frame.correlation_id, response)

    def write(self, correlation_id: int, response: Message) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        parts = [bytes(part) for part in response.payload()]  # type: ignore[arg-type]
        self.transport.write(encode_response(correlation_id, response.to_control(), sum(map(len, parts))) + b"".join(parts))


def _empty(response: Message) -> bool:
    """A fetch answer without records or errors (the broker would wait for data up to max_wait_ms)."""
    return all(not p.error_code and not len(p.records) for t in response.topics for p in t.partitions)  # type: ignore[attr-defined]


def with_fake(test: Callable[[FakeCluster, AsyncProducer], Awaitable[None]], leaders: tuple[int, ...] = (0,),
              **settings: Any) -> FakeCluster:
    """Run `test` with a 2-node fake cluster holding topic t (partition i led by node leaders[i])
    and a producer on it."""

    async def run() -> FakeCluster:
        fake = await FakeCluster(nodes=2).start()
        fake.add_topic("t", len(leaders))
        for partition, node in enumerate(leaders):
            fake.move_leader("t", partition, node)
        try:
            async with AsyncProducer(fake.bootstrap, linger_ms=0, retry_backoff_ms=10, **settings) as producer:
                await test(fake, producer)
        finally:
            await fake.close()
        return fake

    return asyncio.run(run())
