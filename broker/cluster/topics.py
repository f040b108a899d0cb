"""TopicRegistry: topics, their partition counts, config overrides and partition state.

The registry is the broker's view of `topics/{name}` and `partitions/{name}/{p}` keys in the
MetadataStore, cached in memory so the produce and fetch paths never touch the store. Every
change is ONE store transaction conditioned on the topic key's version the cache holds: a topic
and all its partition states appear, grow or vanish together (one durable write, one revision,
however many partitions), and a concurrent writer (another broker with the etcd store) makes the
change fail loudly, with nothing written, instead of being lost or half-applied.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from broker.cluster.metadata_store import Compare, Delete, Get, MetadataStore, Put, TxnResult
from broker.coordinator.group_records import OFFSETS_TOPIC
from broker.config import LEGACY_KEY_PARTITIONER, TOPIC_CONFIGS, LogConfig, parse_topic_configs
from segment_format.layout import validate_topic_name
from broker.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidReplicationFactorError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    VersionConflictError,
)

MAX_PARTITIONS = 10_000  # per topic: each partition holds open files
# Topics the broker writes itself; clients may read them, never produce to, create or delete them.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"leader": self.leader, "leader_epoch": self.leader_epoch, "replicas": list(self.replicas), "isr": list(self.isr)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "PartitionState":
        return cls(raw["leader"], raw["leader_epoch"], tuple(raw["replicas"]), tuple(raw["isr"]))


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partition_count: int
    replication_factor: int
    configs: dict[str, Any]  # overrides only; effective values come from `log_config`
    version: int = 0
    partitions: dict[int, PartitionState] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": self.topic_id,
            "partitions": self.partition_count,
            "replication_factor": self.replication_factor,
            "configs": self.configs,
        }

    def log_config(self, defaults: LogConfig) -> LogConfig:
        return LogConfig.from_dotted(self.configs, defaults)


def _topic_key(name: str) -> str:
    return f"topics/{name}"


def _partition_key(name: str, partition: int) -> str:
    return f"{_partitions_prefix(name)}{partition}"


def _partitions_prefix(name: str) -> str:
    return f"partitions/{name}/"


class TopicRegistry:
    """Cached, CAS-updated topic metadata for one broker. Not thread-safe: use from the loop."""

    def __init__(self, store: MetadataStore, broker_id: int, log_defaults: LogConfig) -> None:
        self.store = store
        self.broker_id = broker_id
        self.log_defaults = log_defaults
        self.topics: dict[str, TopicInfo] = {}
        # Changes are checked and written under one lock: two pipelined admin requests on one
        # topic must not both pass the checks and then race on the compare-and-set.
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        """Read every topic and partition state from the store into the cache."""
        topics = await self.store.list("topics/")
        states = await self.store.list("partitions/")
        self.topics = {}
        for key, versioned in topics.items():
            name = key.removeprefix("topics/")
            raw = versioned.value
            configs = {"key.partitioner": LEGACY_KEY_PARTITIONER, **raw["configs"]}  # stored before it existed: murmur3
            info = TopicInfo(name, raw["topic_id"], raw["partitions"], raw["replication_factor"], configs, versioned.version)
            for p in range(info.partition_count):
                state = states.get(_partition_key(name, p))
                info.partitions[p] = PartitionState.from_json(state.value) if state else self._initial_state()
            self.topics[name] = info

    def get(self, name: str) -> TopicInfo:
        if not isinstance(name, str):
            raise InvalidRequestError(f"topic names are strings, got {type(name).__name__}")
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return info

    def log_config(self, name: str) -> LogConfig:
        return self.get(name).log_config(self.log_defaults)

    def validate_new_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, Any]) -> dict[str, Any]:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions}")
        if replication_factor != 1:
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} needs that many brokers; this cluster has 1"
            )
        parsed = parse_topic_configs(configs)
        # Stored with every new topic: a topic stored without it predates it and keeps murmur3.
        parsed.setdefault("key.partitioner", self.log_defaults.key_partitioner)
        LogConfig.from_dotted(parsed, self.log_defaults)  # relations between limits
        return parsed

    async def create(self, name: str, partitions: int, replication_factor: int, configs: dict[str, Any]) -> TopicInfo:
        """Write the topic key and every partition state in one transaction, only if the topic key
        does not exist in the store (TopicAlreadyExistsError otherwise, nothing written)."""
        async with self._lock:
            parsed = self.validate_new_topic(name, partitions, replication_factor, configs)
            info = TopicInfo(name, uuid.uuid4().hex, partitions, replication_factor, parsed)
            info.partitions = {p: self._initial_state() for p in range(partitions)}
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", 0)],
                [Put(_topic_key(name), info.to_json()), *self._partition_puts(info, range(partitions))],
                [Get(_topic_key(name))],
            )
            if not result.succeeded:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists (created by another writer)")
            info.version = result.responses[0].version  # type: ignore[union-attr]
            self.topics[name] = info
            return info

    async def delete(self, name: str) -> TopicInfo:
        """Remove the topic key and every key under its partitions in one transaction, only if the
        topic key still has the cached version (VersionConflictError otherwise, nothing removed)."""
        async with self._lock:
            info = self.get(name)
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", info.version)],
                [Delete(_topic_key(name)), Delete(_partitions_prefix(name), prefix=True)],
                [Get(_topic_key(name))],
            )
            self._raise_if_conflict(name, info, result)
            del self.topics[name]
            return info

    def validate_partition_count(self, name: str, count: int) -> TopicInfo:
        info = self.get(name)
        if count <= info.partition_count:
            raise InvalidPartitionsError(
                f"topic {name!r} has {info.partition_count} partitions; the count can only grow (asked {count})"
            )
        if count > MAX_PARTITIONS:
            raise InvalidPartitionsError(f"partitions must be at most {MAX_PARTITIONS}")
        return info

    async def add_partitions(self, name: str, count: int) -> list[int]:
        """Grow `name` to `count` partitions; returns the new partition numbers. The topic key and
        the new partition states are one transaction on the cached version (VersionConflictError
        otherwise, nothing written)."""
        async with self._lock:
            info = self.validate_partition_count(name, count)
            new = list(range(info.partition_count, count))
            updated = TopicInfo(name, info.topic_id, count, info.replication_factor, info.configs)
            updated.partitions = {p: self._initial_state() for p in new}
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", info.version)],
                [Put(_topic_key(name), updated.to_json()), *self._partition_puts(updated, new)],
                [Get(_topic_key(name))],
            )
            self._raise_if_conflict(name, info, result)
            info.version = result.responses[0].version  # type: ignore[union-attr]
            info.partition_count = count
            info.partitions.update(updated.partitions)
            return new

    def validate_config_change(self, name: str, set_configs: dict[str, Any], delete: list[str]) -> dict[str, Any]:
        """The topic's new overrides after setting `set_configs` and resetting `delete` to defaults."""
        info = self.get(name)
        if not all(isinstance(key, str) for key in delete):
            raise InvalidRequestError("config names to reset must be strings")
        unknown = [key for key in delete if key not in TOPIC_CONFIGS]
        if unknown:
            raise InvalidConfigError(f"unknown topic config {unknown[0]!r}")
        merged = {k: v for k, v in info.configs.items() if k not in delete}
        merged.update(parse_topic_configs(set_configs))
        merged.setdefault("key.partitioner", self.log_defaults.key_partitioner)  # reset: the broker's, stored
        LogConfig.from_dotted(merged, self.log_defaults)
        return merged

    async def alter_configs(self, name: str, set_configs: dict[str, Any], delete: list[str]) -> LogConfig:
        async with self._lock:
            merged = self.validate_config_change(name, set_configs, delete)
            info = self.get(name)
            updated = TopicInfo(name, info.topic_id, info.partition_count, info.replication_factor, merged)
            info.version = await self.store.put(_topic_key(name), updated.to_json(), expected_version=info.version)
            info.configs = merged
            return info.log_config(self.log_defaults)

    def _initial_state(self) -> PartitionState:
        return PartitionState(self.broker_id, 0, (self.broker_id,), (self.broker_id,))

    @staticmethod
    def _partition_puts(info: TopicInfo, partitions: Iterable[int]) -> list[Put]:
        return [Put(_partition_key(info.name, p), info.partitions[p].to_json()) for p in partitions]

    @staticmethod
    def _raise_if_conflict(name: str, info: TopicInfo, result: TxnResult) -> None:
        """A failed compare on the topic key: another writer changed or deleted the topic."""
        if result.succeeded:
            return
        current = result.responses[0].get(_topic_key(name))  # type: ignore[union-attr]
        found = f"version {current.version}" if current else "no topic"
        raise VersionConflictError(f"topic {name!r} changed concurrently: expected version {info.version}, store has {found}")

