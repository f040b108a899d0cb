"""Admin: create, delete and describe topics, add partitions, list offsets, read and alter configs.

Per-topic failures are raised as the PymqError their code names, after every topic in the call
was attempted; `AdminError` carries them all when more than one topic failed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Iterable

from broker import protocol
from broker.client.cluster import Cluster, PartitionInfo, partition_infos
from broker.client.config import BootstrapServers, client_settings
from broker.client.consumer import TopicPartition, list_offsets
from broker.client.loop_thread import LoopThread
from broker.errors import PymqError
from broker.protocol import (
    AlterConfigsRequest,
    ApiVersionsRequest,
    ConfigChange,
    ConfigValue,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    MetadataRequest,
    NewTopic,
    PartitionCount,
    TopicConfigs,
    TopicMetadata,
    TopicRef,
    TopicResult,
)


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: list[PartitionInfo]
    configs: dict[str, dict[str, Any]]  # name -> {"value": ..., "source": "topic" | "broker_default"}


class AdminError(PymqError):
    """Several topics of one admin call failed; `errors` maps topic name to its error."""

    def __init__(self, errors: dict[str, PymqError]) -> None:
        super().__init__("; ".join(f"{name}: {err.name()}: {err}" for name, err in errors.items()))
        self.errors = errors


def _raise_topic_errors(topics: Iterable[TopicResult | TopicMetadata | TopicConfigs]) -> None:
    errors = {t.name: err for t in topics if (err := t.error()) is not None}
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        raise AdminError(errors)


def _config_strings(configs: dict[str, Any] | None) -> dict[str, ConfigValue]:
    return {k: str(v) for k, v in (configs or {}).items()}


class AsyncAdmin:
    def __init__(self, bootstrap_servers: str | list[str], *, request_timeout_ms: int = 30_000) -> None:
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: dict[str, Any] | None = None, validate_only: bool = False) -> None:
        await self.create_topics([NewTopic(name, partitions, replication_factor, _config_strings(configs))], validate_only)

    async def create_topics(self, topics: list[NewTopic | dict[str, Any]], validate_only: bool = False) -> None:
        """Create several topics; each is a NewTopic or a dict of its fields (name,
        num_partitions, replication_factor, configs)."""
        new = tuple(t if isinstance(t, NewTopic) else NewTopic(**t) for t in topics)
        reply = await self.cluster.send(None, CreateTopicsRequest(new, validate_only))
        _raise_topic_errors(reply.topics)

    async def delete_topics(self, names: Iterable[str]) -> None:
        reply = await self.cluster.send(None, DeleteTopicsRequest(tuple(TopicRef(name) for name in names)))
        _raise_topic_errors(reply.topics)

    async def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        reply = await self.cluster.send(None, CreatePartitionsRequest((PartitionCount(name, count),), validate_only))
        _raise_topic_errors(reply.topics)

    async def list_topics(self) -> list[str]:
        await self.cluster.refresh()
        return sorted(self.cluster.topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        wanted = list(names) if names is not None else await self.list_topics()
        reply = await self.cluster.send(None, MetadataRequest(tuple(wanted)))
        _raise_topic_errors(reply.topics)
        configs = await self.describe_configs(wanted)
        return [TopicDescription(t.name, t.topic_id, partition_infos(t), configs[t.name]) for t in reply.topics]

    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        reply = await self.cluster.send(None, DescribeConfigsRequest(tuple(TopicRef(name) for name in names)))
        _raise_topic_errors(reply.topics)
        return {t.name: {c.name: {"value": c.value, "source": c.source} for c in t.configs} for t in reply.topics}

    async def alter_configs(self, name: str, set_configs: dict[str, Any] | None = None, delete: Iterable[str] = (),
                            validate_only: bool = False) -> None:
        """Set some configs and reset others to the broker default (incremental, like Kafka's
        IncrementalAlterConfigs)."""
        change = ConfigChange(name, _config_strings(set_configs), tuple(delete))
        reply = await self.cluster.send(None, AlterConfigsRequest((change,), validate_only))
        _raise_topic_errors(reply.topics)

    async def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition; timestamps may be EARLIEST (-2), LATEST (-1) or a time in ms."""
        await self.cluster.refresh()
        return await list_offsets(self.cluster, timestamps)

    async def api_versions(self) -> list[dict[str, Any]]:
        reply = await self.cluster.send(None, ApiVersionsRequest())
        return [dataclasses.asdict(k) for k in reply.api_keys]

    async def close(self) -> None:
        await self.cluster.close()


EARLIEST = protocol.EARLIEST_TIMESTAMP
LATEST = protocol.LATEST_TIMESTAMP


class Admin:
    """Synchronous admin client: the AsyncAdmin methods, blocking (each is spelled out, so that a
    misspelt call fails where it is written and every method has its signature and help)."""

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncAdmin.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread("pymq-admin")
        self._core = AsyncAdmin(bootstrap, **kwargs)

    def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     configs: dict[str, Any] | None = None, validate_only: bool = False) -> None:
        """Create one topic (-1: the broker's default partitions / replication factor)."""
        self._thread.run(self._core.create_topic(name, partitions, replication_factor, configs, validate_only))

    def create_topics(self, topics: list[NewTopic | dict[str, Any]], validate_only: bool = False) -> None:
        """Create several topics (NewTopic or dicts of its fields); AdminError if several fail."""
        self._thread.run(self._core.create_topics(topics, validate_only))

    def delete_topics(self, names: Iterable[str]) -> None:
        self._thread.run(self._core.delete_topics(names))

    def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        """Grow `name` to `count` partitions."""
        self._thread.run(self._core.create_partitions(name, count, validate_only))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._core.list_topics())

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Partitions (leader, replicas, ISR) and effective configs of `names` (default: all)."""
        return self._thread.run(self._core.describe_topics(names))

    def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        return self._thread.run(self._core.describe_configs(names))

    def alter_configs(self, name: str, set_configs: dict[str, Any] | None = None, delete: Iterable[str] = (),
                      validate_only: bool = False) -> None:
        """Set some configs and reset others to the broker default (incremental)."""
        self._thread.run(self._core.alter_configs(name, set_configs, delete, validate_only))

    def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition for EARLIEST (-2), LATEST (-1) or a time in ms."""
        return self._thread.run(self._core.list_offsets(timestamps))

    def api_versions(self) -> list[dict[str, Any]]:
        return self._thread.run(self._core.api_versions())

    def close(self) -> None:
        """Release connections; calling it again does nothing."""
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._core.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
