"""InternalTopic: a coordinator's internal topic, created on first use (as Kafka creates
`__consumer_offsets` and `__transaction_state`), once, however many requests ask at the same time."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.topics import TopicRegistry
from common.errors import TopicAlreadyExistsError

log = logging.getLogger("pymq.internal_topic")

CreateTopic = Callable[[str, int, dict[str, Any], str], Awaitable[None]]


class InternalTopic:
    """`create(name, partitions, configs, replication_config)` is the admin path
    (AdminHandler.create_internal_topic); `loaded()` waits for the coordinator runtime to replay
    the partitions this broker leads, so the first request after creation is served. Loop-local."""

    def __init__(self, name: str, registry: TopicRegistry, create: CreateTopic, partitions: int,
                 configs: dict[str, Any], replication_config: str, loaded: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.registry = registry
        self._create = create
        self.partitions = partitions
        self.configs = configs
        self.replication_config = replication_config
        self._loaded = loaded
        self._creating: asyncio.Task[None] | None = None

    async def ensure(self) -> None:
        """Return once the topic exists (creating it if nobody has); raises what creation raises."""
        if self.name in self.registry.topics:
            return
        if self._creating is None:
            self._creating = asyncio.get_running_loop().create_task(self._create_it())
        try:
            await asyncio.shield(self._creating)
        finally:
            if self._creating is not None and self._creating.done():
                self._creating = None

    async def _create_it(self) -> None:
        try:
            await self._create(self.name, self.partitions, self.configs, self.replication_config)
        except TopicAlreadyExistsError:
            pass
        await self._loaded()
        log.info("created %s with %d partitions", self.name, self.partitions)
