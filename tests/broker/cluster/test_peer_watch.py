"""PeerWatch over the local store and loopback sockets: a peer registration ends when its watch
connection drops and its port refuses, and only then (the end-to-end case, a SIGKILLed leader and
controller replaced long before the session timeout, is tests/e2e/test_crashed_broker.py)."""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from broker.cluster.brokers import BrokerInfo, BrokerRegistration, LiveBrokers, broker_key
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.peer_watch import PeerWatch
from tests.waiting import wait_until_async

TIMEOUT_S = 30
ME, PEER = 0, 1
SESSION_MS = 600_000  # the lease never runs out here: only the watch can end it


class Peer:
    """A broker's listener, as the watch sees it: accepts, keeps connections, can drop them or stop listening."""

    def __init__(self) -> None:
        self.connections: list[asyncio.Transport] = []
        self.accepted = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def listen(self, port: int = 0) -> None:
        peer = self

        class Accept(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                peer.connections.append(transport)  # type: ignore[arg-type]
                peer.accepted.set()

        self.server = await asyncio.get_running_loop().create_server(Accept, "127.0.0.1", port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    def drop_connections(self) -> None:
        for transport in self.connections:
            transport.abort()
        self.connections.clear()
        self.accepted.clear()

    async def stop_listening(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def _watched(tmp_path: Path, port: int) -> AsyncIterator[tuple[LocalMetadataStore, BrokerRegistration]]:
    """Broker PEER registered at 127.0.0.1:`port`, watched by broker ME."""
    store = LocalMetadataStore(tmp_path / "meta.json")
    registration = BrokerRegistration(store, BrokerInfo(PEER, "127.0.0.1", port), SESSION_MS)
    await registration.register()
    brokers = LiveBrokers()
    brokers.brokers = {ME: BrokerInfo(ME, "127.0.0.1", 1), PEER: registration.info}
    watch = PeerWatch(store, brokers, lambda: ME, "127.0.0.1")
    watch.sync()
    try:
        yield store, registration
    finally:
        await watch.stop()
        await store.close()


async def _registered(store: LocalMetadataStore, epoch: int) -> bool:
    found = await store.get(broker_key(PEER))
    return found is not None and found.create_revision == epoch


async def _until_gone(store: LocalMetadataStore) -> None:
    async def gone() -> bool:
        return await store.get(broker_key(PEER)) is None

    await wait_until_async(gone, 30, "the peer's registration gone", 0.02)


async def _die(peer: Peer) -> None:
    """What the kernel does when the peer's process dies: its port refuses, its connections drop."""
    await peer.stop_listening()
    peer.drop_connections()


def test_a_peer_whose_connection_drops_and_whose_port_refuses_is_deregistered(tmp_path: Path):
    async def main() -> None:
        peer = Peer()
        await peer.listen()
        async with _watched(tmp_path, peer.port) as (store, registration):
            await peer.accepted.wait()
            await _die(peer)
            await _until_gone(store)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


def test_a_dropped_connection_to_a_port_that_still_listens_ends_nothing(tmp_path: Path):
    """The peer (or a proxy, or its idle-connection reaper) closed the connection but still
    listens: the watch connects again and keeps watching; nothing ends until its port refuses."""

    async def main() -> None:
        peer = Peer()
        await peer.listen()
        async with _watched(tmp_path, peer.port) as (store, registration):
            for _ in range(3):
                await peer.accepted.wait()
                peer.drop_connections()
            await peer.accepted.wait()  # connected again after the third drop
            assert await _registered(store, registration.epoch)
            await _die(peer)
            await _until_gone(store)  # still watching: the real death is seen

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


def test_a_peer_never_reached_is_left_to_its_session_timeout(tmp_path: Path):
    """A registered broker that does not listen yet (it binds its port, registers, loads its
    logs, then serves) refuses connections without ever having accepted one: not dead."""

    async def main() -> None:
        with socket.socket() as bound:  # a port bound but not listening: connections are refused
            bound.bind(("127.0.0.1", 0))
            async with _watched(tmp_path, bound.getsockname()[1]) as (store, registration):
                await asyncio.sleep(1.0)  # many refused attempts' worth
                assert await _registered(store, registration.epoch)
                peer = Peer()
                bound.close()
                await peer.listen(registration.info.port)  # it starts serving: watched from now on
                await peer.accepted.wait()
                await _die(peer)
                await _until_gone(store)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


def test_a_successor_registered_meanwhile_keeps_its_registration(tmp_path: Path):
    """The watched process died and a new one registered the id before the watch acted (its own
    lease): the watch ends only the registration it watched, compared on its epoch."""

    async def main() -> None:
        peer = Peer()
        await peer.listen()
        async with _watched(tmp_path, peer.port) as (store, registration):
            await peer.accepted.wait()
            await registration.stop()  # the old registration ends, a successor takes the id
            successor = BrokerRegistration(store, BrokerInfo(PEER, "127.0.0.1", peer.port), SESSION_MS)
            await successor.register()
            await _die(peer)
            await asyncio.sleep(1.0)  # the watch saw refusals and found another epoch registered
            assert await _registered(store, successor.epoch)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))
