"""MetadataListener: keeps this broker's view of the cluster current (Kafka's metadata publisher).

Every broker watches the whole key space of its cluster from the revision it loaded: topics and
partition states go to the topic registry (`apply_event`), `brokers/` keys to the live brokers,
the `controller` key says who controls. What changed is handed, in revision order, to the broker's
`on_changes` (broker/server.py), which creates, leads, follows or drops partitions; the events of
one transaction are applied to the caches together before that runs, so a new topic's partitions
are never seen without their states.

`applied_revision` is the revision up to which the broker has acted on what it read (every
change up to it was handed to `on_changes` and done): what the session fence
(broker/cluster/session_fence.py) waits for after the broker registers again.

A change this broker made itself is in its caches already (the registry recognizes it by
revision) and produces nothing. A watch that fell behind what the store keeps
(CompactedRevisionError) reloads everything and treats every topic as changed.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker.cluster.brokers import BROKERS_PREFIX, LiveBrokers
from broker.cluster.metadata_store import CompactedRevisionError, Get, MetadataStore, WatchEvent
from broker.cluster.topics import MetadataChange, TopicRegistry
from common.errors import PymqError

log = logging.getLogger("pymq.cluster")

CONTROLLER_KEY = "controller"
RETRY_S = 1.0


class MetadataListener:
    def __init__(self, store: MetadataStore, registry: TopicRegistry, brokers: LiveBrokers,
                 on_changes: Callable[[list[MetadataChange]], Awaitable[None]],
                 on_brokers: Callable[[set[int]], None]) -> None:
        self.store = store
        self.registry = registry
        self.brokers = brokers
        self.on_changes = on_changes
        # Which brokers registered, changed or left (an empty set: the controller key moved).
        self.on_brokers = on_brokers
        self.revision = 0  # the last revision applied to the caches
        self.applied_revision = 0  # the last revision whose changes the broker has acted on
        self._pending: list[MetadataChange] = []
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        registry.on_change = self._changed

    async def load(self) -> int:
        """Read topics, partition states, brokers and the controller; returns the revision to
        watch after."""
        self.revision = await self.registry.load()
        result = await self.store.txn([], [Get(BROKERS_PREFIX, prefix=True), Get(CONTROLLER_KEY)])
        registered, controller = result.responses
        self.brokers.brokers.clear()
        for key, record in registered.items():  # type: ignore[union-attr]
            self.brokers.apply(key, record.value, record.create_revision)
        found = controller.get(CONTROLLER_KEY)  # type: ignore[union-attr]
        self.brokers.controller = found.value["broker_id"] if found else -1
        return self.revision

    def start(self) -> None:
        """Follow the store from the loaded revision (the broker acted on the load itself)."""
        self.applied_revision = self.revision
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(), name="metadata-watch"),
                       loop.create_task(self._apply_changes(), name="metadata-apply")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            watch = self.store.watch("", self.revision + 1)
            try:
                async for event in watch:
                    self._apply(event)
            except CompactedRevisionError:
                log.warning("metadata watch fell behind the store's history; reloading everything")
                await self._reload()
            except PymqError as err:
                log.warning("metadata watch failed (%s); resuming from revision %d", err, self.revision + 1)
                await asyncio.sleep(RETRY_S)
            finally:
                watch.cancel()

    async def _reload(self) -> None:
        while True:
            try:
                await self.load()
                break
            except PymqError as err:
                log.warning("cannot reload the metadata: %s", err)
                await asyncio.sleep(RETRY_S)
        self._pending += [MetadataChange("topic", name) for name in self.registry.topics]
        self._dirty.set()
        self.on_brokers(set(self.brokers.brokers))

    def _apply(self, event: WatchEvent) -> None:
        self.revision = max(self.revision, event.revision)
        self._dirty.set()  # applied_revision follows even when no change is for the broker
        if event.key.startswith(BROKERS_PREFIX):
            changed = self.brokers.apply(event.key, event.value, event.create_revision)
            if changed is not None:
                self.on_brokers({changed})
            return
        if event.key == CONTROLLER_KEY:
            self.brokers.controller = event.value["broker_id"] if event.value else -1
            self.on_brokers(set())  # a controller that went: the others campaign now
            return
        change = self.registry.apply_event(event)
        if change is not None:
            self._changed(change)

    def _changed(self, change: MetadataChange) -> None:
        self._pending.append(change)
        self._dirty.set()

    async def _apply_changes(self) -> None:
        """Hand the changes to the broker once the watch has no more events ready (the rest of
        their transaction is in the caches), in order, one batch at a time."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            revision, changes, self._pending = self.revision, self._pending, []
            if changes:
                try:
                    await self.on_changes(changes)
                except Exception:  # a bug or a disk failure must not stop the broker following the cluster
                    log.exception("applying %d metadata changes failed", len(changes))
            self.applied_revision = max(self.applied_revision, revision)
