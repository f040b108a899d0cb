"""PeerWatch: a broker whose process died is declared dead at once, not after its session timeout.

A registration lease (broker/cluster/brokers.py) ends `broker.session.timeout.ms` after the last
renewal: that is how the cluster learns that a broker hung, lost its network or its machine. When
only the process died (a crash, an OOM kill, SIGKILL) the kernel says so at once: it closes the
process's connections and refuses new ones on its port (nobody listens there any more). Waiting
out the lease then costs every partition the dead broker led seconds without a leader.

So every broker keeps one idle TCP connection to the listener of every other registered broker
(it sends nothing; the peer counts it as one more client connection). When that connection
drops, the watcher connects again at once: connected, the peer is alive (it closed the
connection itself, or a proxy did); refused `REFUSALS` times in a row, `REFUSAL_INTERVAL_S`
apart, the process is gone. The watcher then ends the registration it watched by revoking its
lease (compared on the registration's epoch, so a successor that registered meanwhile is left
alone), which deletes `brokers/{id}` and the controller key if the dead broker held it: the
controller, or the brokers campaigning to succeed it, move leadership as for an expired lease.

What it cannot tell, and leaves to the session timeout: a hung process (SIGSTOP, a stalled disk:
the kernel still accepts connections for it), a machine or network that is down (no refusal
comes back, connects time out), a broker that never accepted one of our connections (still
starting: its port is bound before it listens), and a broker behind a proxy that accepts for it.
Every broker watches every other: the first to revoke wins, the others find the lease gone.
Loop-local.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.cluster.brokers import BrokerInfo, LiveBrokers, broker_key
from broker.cluster.metadata_store import LeaseNotFoundError, MetadataStore
from common.errors import PymqError

log = logging.getLogger("pymq.cluster")

REFUSALS = 2  # connection refusals in a row, after the watch connection dropped, that mean the process is gone
REFUSAL_INTERVAL_S = 0.05
CONNECT_TIMEOUT_S = 5.0
RECONNECT_MIN_S = 0.1  # after a failed or short-lived connection, the next attempt waits this long, doubling
RECONNECT_MAX_S = 5.0
STABLE_S = 1.0  # a watch connection that lived this long dropped for a reason worth probing at once


class _Watched(asyncio.Protocol):
    """The idle connection: all it reports is that it dropped."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:  # a broker says nothing unasked
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class PeerWatch:
    """Watches the processes of the other registered brokers (see the module docstring)."""

    def __init__(self, store: MetadataStore, brokers: LiveBrokers, me: Callable[[], int],
                 local_host: str | None = None) -> None:
        self.store = store
        self.brokers = brokers
        self._me = me
        self.local_host = local_host
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}  # (broker id, epoch) -> its watcher

    def sync(self) -> None:
        """Watch exactly the registrations the live brokers name now (call on every change)."""
        wanted = {(b, info.epoch): info for b, info in self.brokers.brokers.items() if b != self._me()}
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
        loop = asyncio.get_running_loop()
        for key, info in wanted.items():
            if key not in self._tasks:
                self._tasks[key] = loop.create_task(self._watch(info), name=f"peer-watch-{info.broker_id}")

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, info: BrokerInfo) -> None:
        loop = asyncio.get_running_loop()
        local = None if self.local_host is None else (self.local_host, 0)
        connected_once = False
        refusals = 0
        wait = 0.0
        while True:
            if wait:
                await asyncio.sleep(wait)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    transport, watched = await loop.create_connection(_Watched, info.host, info.port, local_addr=local)
            except ConnectionRefusedError:
                if not connected_once:  # not listening yet: a broker binds its port, registers, then serves
                    wait = min(max(wait * 2, RECONNECT_MIN_S), RECONNECT_MAX_S)
                    continue
                refusals += 1
                if refusals >= REFUSALS:
                    await self._declare_dead(info)
                    return
                wait = REFUSAL_INTERVAL_S
                continue
            except (OSError, TimeoutError):  # unreachable: the session timeout decides
                refusals = 0
                wait = min(max(wait * 2, RECONNECT_MIN_S), RECONNECT_MAX_S)
                continue
            connected_once, refusals = True, 0
            opened = loop.time()
            try:
                await watched.lost
            finally:
                transport.close()
            # Dropped: probe at once if it had been up a while (a crash drops it then); a
            # connection closed as soon as it opens (a proxy refusing us) backs off instead.
            wait = 0.0 if loop.time() - opened >= STABLE_S else min(max(wait * 2, RECONNECT_MIN_S), RECONNECT_MAX_S)

    async def _declare_dead(self, info: BrokerInfo) -> None:
        """End the registration `info` names if it is still the one in the store."""
        self._tasks.pop((info.broker_id, info.epoch), None)
        try:
            found = await self.store.get(broker_key(info.broker_id))
            if found is None or found.create_revision != info.epoch:
                return  # gone already, or a successor registered
            log.warning("broker %d (%s:%d, epoch %d): its process is gone (the connection dropped and its port "
                        "refuses connections); ending its registration now instead of after the session timeout",
                        info.broker_id, info.host, info.port, info.epoch)
            await self.store.revoke_lease(found.lease)
        except LeaseNotFoundError:
            pass  # another broker, or the lease's expiry, got there first
        except PymqError as err:
            log.warning("broker %d: cannot end its registration (%s); its session timeout will", info.broker_id, err)
