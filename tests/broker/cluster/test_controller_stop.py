"""Controller.stop returns even when the controller is poked as it is stopped (a broker leaving
the cluster as the controller key moves): on Python 3.11 `asyncio.wait_for` swallowed that
cancel, the controller's task went on, and the broker never finished stopping."""
from __future__ import annotations

import asyncio
from pathlib import Path

from broker.cluster.brokers import BrokerInfo, BrokerRegistration, LiveBrokers
from broker.cluster.controller import Controller
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig

TIMEOUT_S = 20
ROUNDS = 20


def test_a_controller_poked_as_it_stops_stops(tmp_path: Path):
    async def main() -> None:
        store = LocalMetadataStore(tmp_path / "meta.json")
        registry = TopicRegistry(store, 0, BrokerConfig.load().log_defaults)
        await registry.load()
        registration = BrokerRegistration(store, BrokerInfo(0, "127.0.0.1", 9092), 3000)
        await registration.register()
        try:
            for _ in range(ROUNDS):
                controller = Controller(store, registry, LiveBrokers(), registration)
                controller.start()
                while not controller.active:  # elected, then it waits for a poke
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.01)
                controller.poke()
                await asyncio.wait_for(controller.stop(), 5)
                assert not controller.active
        finally:
            await registration.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))
