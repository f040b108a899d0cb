"""Which broker a client asks for metadata: not a hung one. A hung broker (here a socket that the
kernel accepts connections on but nobody reads: what a SIGSTOPped broker looks like) costs one
request timeout, not one per connection the client happens to hold to it."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from broker.client.cluster import Cluster
from broker.errors import RequestTimedOutError
from broker.protocol import MetadataRequest


@pytest.fixture
def hung_broker() -> Iterator[str]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield "%s:%d" % listener.getsockname()


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
