"""Which broker a client asks for metadata: not a hung one, and an idle connection before a busy
one. A hung broker (here a socket that the kernel accepts connections on but nobody reads: what a
SIGSTOPped broker looks like) costs one request timeout, not one per connection the client happens
to hold to it."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from client.cluster import Cluster
from client.connection import BrokerConnection
from common.errors import RequestTimedOutError
from protocol import MetadataRequest


@pytest.fixture
def hung_broker() -> Iterator[str]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield "%s:%d" % listener.getsockname()


@pytest.mark.slow
def test_after_a_request_to_a_broker_times_out_metadata_comes_from_another_one(shared_broker, hung_broker):
    async def scenario() -> dict[int, tuple[str, int]]:
        cluster = Cluster(f"{hung_broker},{shared_broker.bootstrap}", request_timeout_ms=1_000)
        try:
            first = await cluster.any_connection()  # the bootstrap list's first address: still open below
            assert f"{first.host}:{first.port}" == hung_broker
            host, port = hung_broker.split(":")
            cluster.brokers[7] = (host, int(port))  # as if the metadata named it broker 7, a partition's leader
            with pytest.raises(RequestTimedOutError):
                await cluster.send(7, MetadataRequest(None))
            assert not first.closed
            await cluster.refresh()  # from the live broker, not over the other connection to the hung one
            return cluster.brokers
        finally:
            await cluster.close()

    host, port = shared_broker.bootstrap.rsplit(":", 1)
    assert list(asyncio.run(scenario()).values()) == [(host, int(port))]


def test_a_broker_reconnected_to_after_a_timeout_is_still_asked_last(shared_broker, hung_broker):
    """The request timeout closed the hung broker's connection, and a new one was opened to it
    (as the producer's probe does) before metadata was next asked for: the broker still counts
    as failed, and metadata comes from the live one."""
    async def scenario() -> BrokerConnection:
        cluster = Cluster(f"{hung_broker},{shared_broker.bootstrap}", request_timeout_ms=1_000)
        try:
            host, port = hung_broker.split(":")
            cluster.brokers[7] = (host, int(port))
            with pytest.raises(RequestTimedOutError):
                await cluster.send(7, MetadataRequest(None))
            reopened = await cluster.connection(7)
            assert not reopened.closed
            return await cluster.any_connection()
        finally:
            await cluster.close()

    conn = asyncio.run(scenario())
    assert f"{conn.host}:{conn.port}" == shared_broker.bootstrap


def test_metadata_goes_over_an_idle_connection_rather_than_one_with_requests_outstanding(shared_broker, hung_broker):
    """Neither broker failed yet: the one with a request outstanding (hung, but its request has
    not timed out) is not asked while an idle connection to another is open (Kafka's least
    loaded node)."""
    async def scenario() -> tuple[BrokerConnection, BrokerConnection]:
        cluster = Cluster(f"{hung_broker},{shared_broker.bootstrap}", request_timeout_ms=60_000)
        try:
            busy = await cluster.any_connection()  # the bootstrap list's first address
            assert f"{busy.host}:{busy.port}" == hung_broker
            waiting = busy.request(MetadataRequest(None), None)
            for node, address in enumerate((hung_broker, shared_broker.bootstrap)):  # as metadata would list them
                host, port = address.rsplit(":", 1)
                cluster.brokers[node] = (host, int(port))
            idle = await cluster.connection(1)
            chosen = await cluster.any_connection()
            waiting.cancel()
            return chosen, idle
        finally:
            await cluster.close()

    chosen, idle = asyncio.run(scenario())
    assert chosen is idle
