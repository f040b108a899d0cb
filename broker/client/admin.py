"""Admin: create, delete and describe topics, add partitions, list offsets, read and alter configs.

Per-topic failures are raised as the PymqError their code names, after every topic in the call
was attempted; `AdminError` carries them all when more than one topic failed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from broker import protocol
from broker.client.cluster import Cluster, PartitionInfo
from broker.client.consumer import TopicPartition, list_offsets
from broker.client.loop_thread import LoopThread
from broker.errors import PymqError, error_for_code
from broker.protocol import ApiKey


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


def _raise_topic_errors(reply: dict[str, Any]) -> None:
    errors = {t["name"]: error_for_code(t["error_code"], t.get("error_message")) for t in reply["topics"] if t["error_code"]}
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        raise AdminError(errors)


class AsyncAdmin:
    def __init__(self, bootstrap_servers: str | list[str], *, request_timeout_ms: int = 30_000) -> None:
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: dict[str, Any] | None = None, validate_only: bool = False) -> None:
        await self.create_topics([{"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
                                   "configs": {k: str(v) for k, v in (configs or {}).items()}}], validate_only)

    async def create_topics(self, topics: list[dict[str, Any]], validate_only: bool = False) -> None:
        reply, _ = await self.cluster.request(None, ApiKey.CREATE_TOPICS, {"topics": topics, "validate_only": validate_only})
        _raise_topic_errors(reply)

    async def delete_topics(self, names: Iterable[str]) -> None:
        reply, _ = await self.cluster.request(None, ApiKey.DELETE_TOPICS, {"topics": list(names)})
        _raise_topic_errors(reply)

    async def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        reply, _ = await self.cluster.request(None, ApiKey.CREATE_PARTITIONS,
                                              {"topics": [{"name": name, "count": count}], "validate_only": validate_only})
        _raise_topic_errors(reply)

    async def list_topics(self) -> list[str]:
        await self.cluster.refresh()
        return sorted(self.cluster.topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        wanted = list(names) if names is not None else await self.list_topics()
        reply, _ = await self.cluster.request(None, ApiKey.METADATA, {"topics": wanted})
        _raise_topic_errors(reply)
        configs = await self.describe_configs(wanted)
        return [
            TopicDescription(t["name"], t.get("topic_id", ""),
                             [PartitionInfo(t["name"], p["partition"], p["leader"], p["leader_epoch"], tuple(p["replicas"]), tuple(p["isr"]))
                              for p in t["partitions"]],
                             configs[t["name"]])
            for t in reply["topics"]
        ]

    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        reply, _ = await self.cluster.request(None, ApiKey.DESCRIBE_CONFIGS, {"topics": list(names)})
        _raise_topic_errors(reply)
        return {t["name"]: {c["name"]: {"value": c["value"], "source": c["source"]} for c in t["configs"]} for t in reply["topics"]}

    async def alter_configs(self, name: str, set_configs: dict[str, Any] | None = None, delete: Iterable[str] = (),
                            validate_only: bool = False) -> None:
        """Set some configs and reset others to the broker default (incremental, like Kafka's
        IncrementalAlterConfigs)."""
        topic = {"name": name, "set": {k: str(v) for k, v in (set_configs or {}).items()}, "delete": list(delete)}
        reply, _ = await self.cluster.request(None, ApiKey.ALTER_CONFIGS, {"topics": [topic], "validate_only": validate_only})
        _raise_topic_errors(reply)

    async def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition; timestamps may be EARLIEST (-2), LATEST (-1) or a time in ms."""
        await self.cluster.refresh()
        return await list_offsets(self.cluster, timestamps)

    async def api_versions(self) -> list[dict[str, Any]]:
        reply, _ = await self.cluster.request(None, ApiKey.API_VERSIONS, {})
        return reply["api_keys"]

    async def close(self) -> None:
        await self.cluster.close()


EARLIEST = protocol.EARLIEST_TIMESTAMP
LATEST = protocol.LATEST_TIMESTAMP


class Admin:
    """Synchronous admin client: every AsyncAdmin method, blocking."""

    def __init__(self, bootstrap_servers: str | list[str], **config: Any) -> None:
        self._thread = LoopThread("pymq-admin")
        self._core = AsyncAdmin(bootstrap_servers, **config)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._core, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._thread.run(method(*args, **kwargs))

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
