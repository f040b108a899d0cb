"""Cluster: bootstrap, the metadata cache (topics, partitions, leaders) and one connection per broker.

Clients ask the cluster for a partition's leader and for the connection to it; after a retriable
error (NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, a lost connection) they call `refresh` and retry.
Loop-local.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.client.connection import BrokerConnection
from broker.errors import BrokerNotAvailableError, NetworkError, PymqError, UnknownTopicOrPartitionError
from broker.protocol import Message, MetadataRequest, RequestMessage, TopicMetadata

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
                 max_in_flight: int = 64) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
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
        if node not in self.brokers:
            await self.refresh()
        if node not in self.brokers:
            raise BrokerNotAvailableError(f"broker {node} is not in the cluster metadata")
        host, port = self.brokers[node]
        conn = await BrokerConnection.open(host, port, self.request_timeout_s, max_in_flight=self.max_in_flight)
        self._connections[node] = conn
        return conn

    async def any_connection(self) -> BrokerConnection:
        """A connection to any broker: the broker whose connection failed longest ago (refused,
        lost, or closed after a request timed out: a hung broker), or never, first; its open
        connection if it has one, else a new one. So a dead broker in the bootstrap list costs one
        attempt, not one per request, and a hung broker's other connections (a metadata request
        on the bootstrap connection to a leader whose produce just timed out) are not used while
        another broker answers."""
        now = time.monotonic()
        open_at: dict[tuple[str, int], BrokerConnection] = {}
        for key, conn in list(self._connections.items()):
            if conn.closed:
                self._failed[(conn.host, conn.port)] = now
                del self._connections[key]
            else:
                open_at.setdefault((conn.host, conn.port), conn)
        errors = []
        addresses = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap, *open_at]))
        for address in sorted(addresses, key=lambda a: self._failed.get(a, 0.0)):
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

    async def refresh(self, topics: list[str] | None = None) -> None:
        """Reload broker addresses and partition leaders (all topics, or just `topics`)."""
        async with self._lock:
            reply = await self.send(None, MetadataRequest(None if topics is None else tuple(topics)))
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
