"""Admin handlers: create and delete topics, add partitions, describe and alter configs.

Each answers per topic in request order; a topic whose entry was malformed (see the messages'
`error` fields) or whose change the registry refuses gets its own error and the others go on.
Metadata changes go through the topic registry (compare-and-set in the metadata store); logs are
created and removed through the ReplicaManager, off the event loop. Creating topics and adding
partitions, and reassignments that move replicas onto a broker, stop at `max.partitions`
partition replicas on any broker (POLICY_VIOLATION), besides
the per-topic MAX_PARTITIONS (INVALID_PARTITIONS): every partition costs files, memory, and time
at each restart and clean stop (benchmarks/many_partitions.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from broker.cluster.partition import LeaderAndIsr
from broker.cluster.topics import INTERNAL_TOPICS, TopicInfo, TopicRegistry
from broker.config import BrokerConfig
from broker.log import TopicLogSpec
from broker.replica_manager import ReplicaManager
from common.errors import CoordinatorNotAvailableError, InvalidTopicError, KafkaStorageError, PymqError
from protocol import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ConfigChange,
    ConfigEntry,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    NewTopic,
    PartitionCount,
    PartitionResponse,
    TopicConfigs,
    TopicRef,
    TopicResponse,
    TopicResult,
    code_and_message,
)

log = logging.getLogger("pymq.handlers")

E = TypeVar("E", NewTopic, TopicRef, PartitionCount, ConfigChange)


async def _per_topic(entries: tuple[E, ...], change: Callable[[E], Awaitable[None]],
                     lock: asyncio.Lock) -> tuple[TopicResult, ...]:
    """Apply `change` to each entry in order under `lock`; each gets its own outcome."""
    results = []
    async with lock:
        for entry in entries:
            try:
                if entry.error is not None:
                    raise entry.error
                await change(entry)
            except PymqError as err:
                results.append(TopicResult(entry.name, *code_and_message(err)))
            else:
                results.append(TopicResult(entry.name))
    return tuple(results)


def _refuse_internal(name: str, verb: str) -> None:
    if name in INTERNAL_TOPICS:
        raise InvalidTopicError(f"{name} is internal: the broker manages it; it cannot be {verb} by a client")


class AdminHandler:
    """Loop-local. The handlers are coroutines: they wait for the metadata store and the disk.

    Changes run one request at a time (as Kafka's controller applies them in order): a deletion
    pipelined behind a creation of the same topic must not remove its logs while a worker thread
    is still creating them."""

    def __init__(self, config: BrokerConfig, registry: TopicRegistry, replicas: ReplicaManager) -> None:
        self.config = config
        self.registry = registry
        self.registry.max_partitions = config["max.partitions"]
        self.replicas = replicas
        self._changes = asyncio.Lock()

    @property
    def changes(self) -> asyncio.Lock:
        """Held while a metadata change is applied here: admin requests and the changes other
        brokers made (broker/server.py) apply one at a time."""
        return self._changes

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        async def create(topic: NewTopic) -> None:
            partitions = self.config["num.partitions"] if topic.num_partitions == -1 else topic.num_partitions
            replication = self.config["default.replication.factor"] if topic.replication_factor == -1 else topic.replication_factor
            _refuse_internal(topic.name, "created")
            if request.validate_only:
                self.registry.validate_new_topic(topic.name, partitions, replication, topic.configs)
                self.registry.validate_partition_limit(range(partitions), replication, f"creating topic {topic.name!r}")
                return
            await self._create_topic(topic.name, partitions, replication, topic.configs)

        return CreateTopicsResponse(await _per_topic(request.topics, create, self._changes))

    async def create_internal_topic(self, name: str, partitions: int, configs: dict[str, Any],
                                    replication_config: str = "offsets.topic.replication.factor") -> None:
        """Create a topic the broker needs (`__consumer_offsets`, `__transaction_state`), in turn
        with admin changes, with `replication_config` replicas. A cluster with fewer live brokers
        refuses (COORDINATOR_NOT_AVAILABLE, retriable: clients retry until the brokers are up, as
        Kafka's do) rather than create it less replicated for good; a single broker creates it with one."""
        wanted = self.config[replication_config]
        live = len(self.registry.live_brokers())
        if self.config["metadata.store"] == "local":
            wanted = min(wanted, max(live, 1))
        elif live < wanted:
            raise CoordinatorNotAvailableError(
                f"{name} needs {replication_config}={wanted} live brokers; the cluster has {live}")
        async with self._changes:
            # Exempt from max.partitions (its size is a config of its own): coordinators must work
            # on a broker that reached the limit.
            await self._create_topic(name, partitions, wanted, configs, limited=False)

    async def _create_topic(self, name: str, partitions: int, replication: int, configs: dict[str, Any],
                            limited: bool = True) -> None:
        info = await self.registry.create(name, partitions, replication, configs, limited)
        await self._create_logs(info, list(range(partitions)), undo_topic=True)
        log.info("created topic %s with %d partitions", name, partitions)

    async def delete_topics(self, request: DeleteTopicsRequest) -> DeleteTopicsResponse:
        async def delete(topic: TopicRef) -> None:
            _refuse_internal(topic.name, "deleted")
            await self.registry.delete(topic.name)
            await self.replicas.delete_topic(topic.name)
            log.info("deleted topic %s", topic.name)

        return DeleteTopicsResponse(await _per_topic(request.topics, delete, self._changes))

    async def create_partitions(self, request: CreatePartitionsRequest) -> CreatePartitionsResponse:
        async def grow(topic: PartitionCount) -> None:
            if request.validate_only:
                info = self.registry.validate_partition_count(topic.name, topic.count)
                self.registry.validate_partition_limit(range(info.partition_count, topic.count), info.replication_factor,
                                                       f"adding partitions to {topic.name!r}")
                return
            added = await self.registry.add_partitions(topic.name, topic.count)
            await self._create_logs(self.registry.get(topic.name), added, undo_topic=False)
            log.info("topic %s now has %d partitions", topic.name, topic.count)

        return CreatePartitionsResponse(await _per_topic(request.topics, grow, self._changes))

    async def alter_configs(self, request: AlterConfigsRequest) -> AlterConfigsResponse:
        """Incremental: each topic names configs to set and configs to reset to the default."""
        async def alter(change: ConfigChange) -> None:
            if request.validate_only:
                self.registry.validate_config_change(change.name, change.set_configs, list(change.delete))
                return
            config = await self.registry.alter_configs(change.name, change.set_configs, list(change.delete))
            self.replicas.update_config(change.name, config)
            log.info("altered configs of %s: set %s, reset %s", change.name, change.set_configs, list(change.delete))

        return AlterConfigsResponse(await _per_topic(request.topics, alter, self._changes))

    async def alter_partition_reassignments(
            self, request: AlterPartitionReassignmentsRequest) -> AlterPartitionReassignmentsResponse:
        """Record each partition's target replicas (or cancel its move); per partition outcomes."""
        topics = []
        async with self._changes:
            hosted = self.registry.replica_counts()  # once: max.partitions is checked for every move
            for topic in request.topics:
                outcomes = []
                for p in topic.partitions:
                    try:
                        if topic.error or p.error:
                            raise topic.error or p.error  # type: ignore[misc]
                        await self.registry.reassign(topic.name, p.partition, p.replicas, hosted)
                    except PymqError as err:
                        outcomes.append(PartitionResponse(p.partition, *code_and_message(err)))
                    else:
                        outcomes.append(PartitionResponse(p.partition))
                        log.info("reassigning %s-%d to %s", topic.name, p.partition,
                                 "its original replicas" if p.replicas is None else list(p.replicas))
                topics.append(TopicResponse(topic.name, tuple(outcomes)))
        return AlterPartitionReassignmentsResponse(tuple(topics))

    def describe_configs(self, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
        return DescribeConfigsResponse(tuple(self._configs_of(topic) for topic in request.topics))

    def _configs_of(self, topic: TopicRef) -> TopicConfigs:
        try:
            if topic.error is not None:
                raise topic.error
            info = self.registry.get(topic.name)
        except PymqError as err:
            return TopicConfigs(topic.name, *code_and_message(err))
        effective = info.log_config(self.registry.log_defaults).to_dotted()
        return TopicConfigs(topic.name, configs=tuple(
            ConfigEntry(key, value, "topic" if key in info.configs else "broker_default")
            for key, value in sorted(effective.items())))

    async def _create_logs(self, info: TopicInfo, partitions: list[int], undo_topic: bool) -> None:
        """Create the logs of new partitions with a replica here, and lead or follow them (all or
        nothing, off the event loop); the other brokers create theirs as they see the change. If
        the disk refuses a new topic, its metadata goes too, so that the topic either exists whole
        or not at all; partitions added to an existing topic stay in the metadata and their logs
        are created when the broker next loads them."""
        spec = TopicLogSpec(info.topic_id, info.log_config(self.registry.log_defaults), info.partition_count)
        partitions = [p for p in partitions if self.replicas.broker_id in info.partitions[p].replicas]
        states = {(info.name, p): LeaderAndIsr.of(info.partitions[p]) for p in partitions}
        try:
            await self.replicas.create_partitions(info.name, spec, partitions, states)
        except KafkaStorageError:
            if undo_topic:
                await self.registry.delete(info.name)
            raise
