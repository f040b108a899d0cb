"""Cluster: bootstrap, the metadata cache (topics, partitions, leaders) and one connection per broker.

Clients ask the cluster for a partition's leader and for the connection to it; after a retriable
error (NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, a lost connection) they call `refresh` and retry.
After a request to a broker timed out (a hung broker: SIGSTOPped, or cut off), they send it nothing
more until it answers a probe or metadata moves their partitions elsewhere (`await_answer_or_move`):
the cluster needs a session timeout to move a hung leader's partitions, and a retry sent to it
before then would wait out a second request timeout. Loop-local.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from client.connection import BrokerConnection
from common.errors import (
    BrokerNotAvailableError,
    NetworkError,
    PymqError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from protocol import ApiVersionsRequest, Message, MetadataRequest, MetadataResponse, RequestMessage, TopicMetadata

log = logging.getLogger("pymq.client")
R = TypeVar("R", bound=Message)


def parse_bootstrap(servers: str | list[str]) -> list[tuple[str, int]]:
    """'host:port,host:port' (or a list of them) -> [(host, port)]."""
    items = servers.split(",") if isinstance(servers, str) else servers
    out = []
    for item in items:
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap server {item!r} must look like host:port")
        out.append((host or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("no bootstrap servers given")
    return out


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    target_replicas: tuple[int, ...] = ()  # where a reassignment in progress moves it


def partition_infos(topic: TopicMetadata) -> list[PartitionInfo]:
    """A topic's partitions from a Metadata response, in partition order."""
    return [PartitionInfo(topic.name, p.partition, p.leader, p.leader_epoch, p.replicas, p.isr, p.target_replicas)
            for p in sorted(topic.partitions, key=lambda p: p.partition)]


class Cluster:
    def __init__(self, bootstrap_servers: str | list[str], *, request_timeout_ms: int = 30_000,
                 max_in_flight: int = 64, auto_create_topics: bool = False) -> None:
        """`auto_create_topics`: lookups of named topics ask the broker to create those it does not
        know (Kafka's allow_auto_topic_creation; the broker's auto.create.topics.enable decides)."""
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.auto_create_topics = auto_create_topics
        self.request_timeout_s = request_timeout_ms / 1000
        self.max_in_flight = max_in_flight
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, list[PartitionInfo]] = {}
        self.key_partitioners: dict[str, str] = {}  # topic -> its key.partitioner (murmur2 | murmur3)
        self.topic_ids: dict[str, str] = {}  # topic -> its id (KIP-516): another one means it was re-created
        self.topic_errors: dict[str, PymqError] = {}
        self._connections: dict[int | tuple[str, int], BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Future[BrokerConnection]] = {}
        self._failed: dict[tuple[str, int], float] = {}  # address -> when a connection to it last failed
        self._lock = asyncio.Lock()

    async def send(self, node: int | None, message: RequestMessage[R], *, timeout_s: float | None = None) -> R:
        """Send a request to broker `node` (None: any broker); its typed response, or the
        PymqError the response's top-level error code names."""
        conn = await (self.connection(node) if node is not None else self.any_connection())
        return await conn.send(message, timeout_s=timeout_s or self.request_timeout_s)

    async def send_only(self, node: int, message: RequestMessage[Any]) -> None:
        """Send a request the broker does not answer (produce with acks=0)."""
        await (await self.connection(node)).send_only(message)

    def open_connection(self, node: int) -> BrokerConnection | None:
        """The connection to broker `node` if it is open now, without waiting (else None)."""
        conn = self._connections.get(node)
        return conn if conn is not None and not conn.closed else None

    async def connection(self, node: int) -> BrokerConnection:
        """The one connection to broker `node`, opened on first use.

        Single-flight: callers that arrive while it is being opened wait for the same attempt.
        Two connections to one broker would let a later produce overtake an earlier one.
        """
        conn = self._connections.get(node)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(node)
        if pending is None:
            pending = self._connecting[node] = asyncio.ensure_future(self._open(node))
            pending.add_done_callback(lambda _: self._connecting.pop(node, None))
        return await asyncio.shield(pending)

    async def _open(self, node: int) -> BrokerConnection:
        self._forget_closed()  # the one replaced here may have closed on a timeout: any_connection avoids its broker
        if node not in self.brokers:
            await self.refresh()
        if node not in self.brokers:
            raise BrokerNotAvailableError(f"broker {node} is not in the cluster metadata")
        host, port = self.brokers[node]
        conn = await BrokerConnection.open(host, port, self.request_timeout_s, max_in_flight=self.max_in_flight)
        self._connections[node] = conn
        return conn

    async def any_connection(self) -> BrokerConnection:
        """A connection to any broker (Kafka's least loaded node): the broker whose connection
        failed longest ago (refused, lost, or closed after a request timed out: a hung broker),
        or never, first; among those, an open connection with the fewest requests outstanding,
        else a new one. So a dead broker in the bootstrap list costs one attempt, not one per
        request, and a hung broker's other connections (a metadata request on the bootstrap
        connection to a leader whose produce just timed out) are not used while another broker
        answers; a broker still busy with earlier requests (hung, but not timed out yet) is asked
        only when no idle one is open."""
        self._forget_closed()
        open_at: dict[tuple[str, int], BrokerConnection] = {}
        for conn in self._connections.values():
            address = (conn.host, conn.port)
            if address not in open_at or conn.outstanding < open_at[address].outstanding:
                open_at[address] = conn

        def preference(address: tuple[str, int]) -> tuple[float, bool, int]:
            conn = open_at.get(address)
            return self._failed.get(address, 0.0), conn is None, 0 if conn is None else conn.outstanding

        errors = []
        addresses = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap, *open_at]))
        for address in sorted(addresses, key=preference):
            if address in open_at and not open_at[address].closed:
                return open_at[address]
            try:
                conn = await BrokerConnection.open(*address, self.request_timeout_s, max_in_flight=self.max_in_flight)
            except NetworkError as err:
                self._failed[address] = time.monotonic()
                errors.append(str(err))
                continue
            self._connections[address] = conn
            return conn
        raise NetworkError("no broker reachable: " + "; ".join(errors))

    def _forget_closed(self) -> None:
        """Drop closed connections, noting their brokers as failed now (see any_connection)."""
        now = time.monotonic()
        for key, conn in list(self._connections.items()):
            if conn.closed:
                self._failed[(conn.host, conn.port)] = now
                del self._connections[key]

    async def await_answer_or_move(self, node: int, refresh: Callable[[], Awaitable[None]],
                                   settled: Callable[[], bool], interval_s: float) -> bool:
        """Broker `node` let a request go unanswered: wait until it answers a probe (True: it was
        only slow, send to it again), or until `settled()` holds after one of the metadata
        refreshes made every `interval_s` meanwhile (False: typically, the caller's partitions
        have another leader now; `settled` may act on those that moved at each refresh).

        The probe is an ApiVersions request over the node's connection, with the request
        timeout, repeated until answered; the refreshes go to other brokers (any_connection
        puts the node's, which closed on the timeout, last). Cancelling stops both."""
        probe = asyncio.ensure_future(self._probe(node, interval_s))
        try:
            while True:
                await asyncio.wait((probe,), timeout=interval_s)
                if probe.done():
                    probe.result()
                    return True
                try:
                    await refresh()
                except PymqError as err:
                    log.info("metadata refresh while broker %d does not answer failed: %s", node, err)
                if settled():
                    return False
        finally:
            probe.cancel()

    async def _probe(self, node: int, interval_s: float) -> None:
        """Return once broker `node` answers an ApiVersions request (any answer, an error code
        included); a probe that times out, or cannot connect, is repeated `interval_s` later."""
        while True:
            try:
                await self.send(node, ApiVersionsRequest())
                return
            except (NetworkError, RequestTimedOutError, BrokerNotAvailableError) as err:
                log.debug("probe of broker %d: %s", node, err)
            except PymqError:
                return
            await asyncio.sleep(interval_s)

    async def refresh(self, topics: list[str] | None = None) -> None:
        """Reload broker addresses and partition leaders (all topics, or just `topics`, which the
        broker creates if unknown where this cluster's `auto_create_topics` and the broker allow)."""
        request = MetadataRequest(None) if topics is None else MetadataRequest(tuple(topics), self.auto_create_topics)
        async with self._lock:
            reply = await self._ask_metadata(request)
            self.brokers = {b.node_id: (b.host, b.port) for b in reply.brokers}
            if topics is None:  # a full listing: forget topics that are gone
                self.topics, self.topic_errors, self.topic_ids = {}, {}, {}
            for t in reply.topics:
                error = t.error()
                if error is not None:
                    self.topic_errors[t.name] = error
                    self.topics.pop(t.name, None)
                    self.topic_ids.pop(t.name, None)
                    continue
                self.topic_errors.pop(t.name, None)
                self.topics[t.name] = partition_infos(t)
                self.key_partitioners[t.name] = t.key_partitioner
                if t.topic_id:
                    self.topic_ids[t.name] = t.topic_id

    async def _ask_metadata(self, request: MetadataRequest) -> MetadataResponse:
        """`request` answered by any broker. A broker that goes away with the request unanswered
        (killed as it arrived: the connection is lost) is one broker down, not the cluster: the
        request, which changes nothing, goes to the next broker at once (any_connection now puts
        the lost one last), once per broker known."""
        brokers = len(set(self.brokers.values()) | set(self.bootstrap))
        attempts = 1
        while True:
            try:
                return await self.send(None, request)
            except NetworkError as err:
                if not err.retriable or attempts >= brokers:
                    raise
                attempts += 1
                log.info("metadata request unanswered (%s); asking another broker", err)

    async def partitions(self, topic: str) -> list[PartitionInfo]:
        """The topic's partitions, refreshing metadata once if the topic is not cached."""
        if topic not in self.topics:
            await self.refresh([topic])
        if topic not in self.topics:
            raise self.topic_errors.get(topic) or UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return self.topics[topic]

    async def leader(self, topic: str, partition: int) -> int:
        parts = await self.partitions(topic)
        if not 0 <= partition < len(parts):
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
        return parts[partition].leader

    async def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
