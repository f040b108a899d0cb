"""Broker membership: each broker registers under a lease; the live brokers are the registered ones.

`brokers/{id}` holds a broker's address and rack, put under a lease of `broker.session.timeout.ms`
that the broker keeps alive. A broker that dies, hangs or loses etcd stops renewing it; etcd then
deletes the key, and the controller (broker/cluster/controller.py) moves its partitions'
leadership. The key's create revision is the broker's epoch (Kafka's broker epoch): a new
registration of the same id has a higher one, so a write fenced on it fails if the process that
made it has since been declared dead.

Two processes configured with one broker id would corrupt each other's partitions: registration
refuses an id held by a live lease (BrokerIdInUseError); a restarted broker whose previous lease
has not expired yet waits for it, up to the session timeout.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from broker.cluster.metadata_store import Compare, Get, LeaseNotFoundError, MetadataStore, Put
from broker.cluster.session_fence import SessionFence
from common.errors import MetadataStoreUnavailableError, PymqError

log = logging.getLogger("pymq.cluster")

BROKERS_PREFIX = "brokers/"


def broker_key(broker_id: int) -> str:
    return f"{BROKERS_PREFIX}{broker_id}"


class BrokerIdInUseError(PymqError):
    """Another live process is registered with this broker id."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str = ""
    epoch: int = 0  # the create revision of its registration
    # A random token the broker process draws at start: what proves a connection speaks for this
    # broker (broker/cluster/broker_identity.py). Only the metadata store holds it; "" for none.
    incarnation: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "rack": self.rack, "incarnation": self.incarnation}

    @classmethod
    def from_json(cls, broker_id: int, raw: dict[str, Any], epoch: int = 0) -> "BrokerInfo":
        return cls(broker_id, raw["host"], raw["port"], raw.get("rack", ""), epoch, raw.get("incarnation", ""))


class BrokerRegistration:
    """This broker's registration: the lease, its keep-alive loop, re-registration after a loss.

    A lease found expired means the cluster has declared this broker dead and moved leadership
    away; it registers again at once with a new epoch. Every grant and acknowledged renewal, and
    every loss, is reported to `fence` (broker/cluster/session_fence.py), which tells whether the
    broker may act on its view of leadership meanwhile."""

    def __init__(self, store: MetadataStore, info: BrokerInfo, session_timeout_ms: int,
                 on_registered: Callable[[BrokerInfo], None] | None = None, fence: SessionFence | None = None) -> None:
        self.store = store
        self.info = info
        self.ttl_s = max(1, session_timeout_ms // 1000)
        self.lease = 0
        self._on_registered = on_registered
        self.fence = fence or SessionFence(info.broker_id, lambda: 0)
        self._task: asyncio.Task[None] | None = None

    @property
    def epoch(self) -> int:
        return self.info.epoch

    async def register(self, wait_s: float | None = None) -> BrokerInfo:
        """Put `brokers/{id}` under a new lease, only if no live registration holds the id (waiting
        up to `wait_s`, default the session timeout, for a previous run's lease to expire)."""
        key = broker_key(self.info.broker_id)
        deadline = asyncio.get_running_loop().time() + (self.ttl_s + 1 if wait_s is None else wait_s)
        while True:
            sent_at = self.fence.clock.monotonic()
            lease = await self.store.grant_lease(self.ttl_s)
            result = await self.store.txn([Compare.version(key, "==", 0)], [Put(key, self.info.to_json(), lease)], [Get(key)])
            if result.succeeded:
                self.lease = lease
                self.info = replace(self.info, epoch=result.responses[0].create_revision)  # type: ignore[union-attr]
                self.fence.registered(sent_at, result.revision, self.ttl_s)
                log.info("broker %d registered (epoch %d, session %d s)", self.info.broker_id, self.epoch, self.ttl_s)
                if self._on_registered is not None:
                    self._on_registered(self.info)
                return self.info
            await self.store.revoke_lease(lease)
            holder = result.responses[0].get(key)  # type: ignore[union-attr]
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerIdInUseError(
                    f"broker id {self.info.broker_id} is registered by another live broker "
                    f"({holder.value if holder else '?'}): give each broker its own broker.id")
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        """Renew the lease three times a TTL; past an etcd outage, renew at once. A lease found
        expired (this broker was declared dead: a long pause, or etcd unreachable too long) is
        replaced by a new registration."""
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            sent_at = self.fence.clock.monotonic()
            try:
                await self.store.keep_alive(self.lease)
                self.fence.renewed(sent_at)
            except LeaseNotFoundError:
                self.fence.expired()
                log.warning("broker %d: registration expired (the cluster declared this broker dead); registering again",
                            self.info.broker_id)
                try:
                    await self.register(wait_s=self.ttl_s + 1)
                except PymqError as err:
                    log.error("broker %d: cannot register again: %s", self.info.broker_id, err)
            except MetadataStoreUnavailableError as err:
                log.warning("broker %d: cannot renew the registration: %s", self.info.broker_id, err)

    async def stop(self) -> None:
        """Deregister at once (a clean stop: the controller moves leadership without waiting for
        the lease to run out)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.lease:
            try:
                await self.store.revoke_lease(self.lease)
            except (LeaseNotFoundError, MetadataStoreUnavailableError) as err:
                log.info("broker %d: deregistering: %s", self.info.broker_id, err)
            self.lease = 0


class LiveBrokers:
    """The registered brokers as this broker last saw them (`brokers/` keys): loaded with the
    metadata and kept current by the metadata listener. Loop-local."""

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerInfo] = {}
        self.controller: int = -1  # the broker id in the `controller` key, -1 while there is none

    def racks(self) -> dict[int, str]:
        """broker id -> rack, what replica assignment spreads over."""
        return {b: info.rack for b, info in self.brokers.items()}

    def address(self, broker_id: int) -> tuple[str, int] | None:
        info = self.brokers.get(broker_id)
        return None if info is None else (info.host, info.port)

    def apply(self, key: str, value: dict[str, Any] | None, create_revision: int) -> int | None:
        """A watched change of a `brokers/{id}` key; returns the broker id it concerns."""
        number = key.removeprefix(BROKERS_PREFIX)
        if not number.isdigit():
            return None
        broker_id = int(number)
        if value is None:
            self.brokers.pop(broker_id, None)
        else:
            self.brokers[broker_id] = BrokerInfo.from_json(broker_id, value, create_revision)
        return broker_id
