"""Metadata (API key 3) and ApiVersions (API key 18): what the cluster looks like and what it speaks.

    Metadata request     control = {topics: [name] | None (every topic), allow_auto_topic_creation?}
    Metadata response    control = {error_code, brokers: [{node_id, host, port}], controller_id,
                                    topics: [{name, error_code, error_message?, topic_id, key_partitioner,
                                    partitions: [{partition, error_code, leader, leader_epoch,
                                    replicas, isr, target_replicas?}]}]}
    ApiVersions request  control = {}
    ApiVersions response control = {error_code, api_keys: [{api_key, name, min_version, max_version}]}

`key_partitioner` is the topic's `key.partitioner` config (murmur2 or murmur3; murmur3 when
absent), so every producer places a key where the others do.

`allow_auto_topic_creation` (Kafka's field; absent: false) asks the broker to create the named
topics it does not know, where its `auto.create.topics.enable` allows it (broker/handlers/metadata.py).

A Metadata topic name that is not a string fails the whole request (there is nothing to answer
per topic without a name to look up).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import InvalidRequestError
from protocol.fields import entries, field
from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, RequestMessage, decode_error, put_error

# How producers place keyed records (client/partitioner.py), named in a topic's metadata and its
# `key.partitioner` config: Kafka's murmur2 placement, or murmur3, that of topics created before
# that config, which they keep (and what a broker that sends no name has).
KEY_PARTITIONERS = ("murmur2", "murmur3")
LEGACY_KEY_PARTITIONER = "murmur3"


def _ints(control: dict[str, Any], name: str) -> tuple[int, ...]:
    values = field(control, name, list)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidRequestError(f"field {name!r} must be a list of ints")
    return tuple(values)


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class PartitionMetadata(Outcome):
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int = 0
    error_message: str | None = None
    target_replicas: tuple[int, ...] = ()  # a reassignment in progress moves the replicas to these

    def to_control(self) -> dict[str, Any]:
        control = {"partition": self.partition, "leader": self.leader, "leader_epoch": self.leader_epoch,
                   "replicas": list(self.replicas), "isr": list(self.isr)}
        if self.target_replicas:
            control["target_replicas"] = list(self.target_replicas)
        return put_error(control, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "PartitionMetadata":
        target = _ints(control, "target_replicas") if "target_replicas" in control else ()
        return cls(field(control, "partition", int), field(control, "leader", int), field(control, "leader_epoch", int),
                   _ints(control, "replicas"), _ints(control, "isr"), *decode_error(control), target)


@dataclass(frozen=True, slots=True)
class TopicMetadata(Outcome):
    name: str
    error_code: int = 0
    error_message: str | None = None
    topic_id: str = ""
    partitions: tuple[PartitionMetadata, ...] = ()
    key_partitioner: str = LEGACY_KEY_PARTITIONER  # a broker that does not send it has only murmur3

    def to_control(self) -> dict[str, Any]:
        return put_error({"name": self.name, "topic_id": self.topic_id, "key_partitioner": self.key_partitioner,
                          "partitions": [p.to_control() for p in self.partitions]}, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "TopicMetadata":
        partitioner = field(control, "key_partitioner", str, LEGACY_KEY_PARTITIONER)
        if partitioner not in KEY_PARTITIONERS:
            raise InvalidRequestError(f"key_partitioner {partitioner!r} is not one of {', '.join(KEY_PARTITIONERS)}")
        return cls(field(control, "name", str), *decode_error(control), field(control, "topic_id", str, ""),
                   tuple(PartitionMetadata.from_control(p) for p in entries(control, "partitions")), partitioner)


@dataclass(frozen=True, slots=True)
class MetadataResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.METADATA
    brokers: tuple[BrokerAddress, ...]
    controller_id: int
    topics: tuple[TopicMetadata, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": 0, "brokers": [{"node_id": b.node_id, "host": b.host, "port": b.port} for b in self.brokers],
                "controller_id": self.controller_id, "topics": [t.to_control() for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "MetadataResponse":
        brokers = tuple(BrokerAddress(field(b, "node_id", int), field(b, "host", str), field(b, "port", int))
                        for b in entries(control, "brokers"))
        return cls(brokers, field(control, "controller_id", int),
                   tuple(TopicMetadata.from_control(t) for t in entries(control, "topics")))


@dataclass(frozen=True, slots=True)
class MetadataRequest(RequestMessage[MetadataResponse]):
    """`topics` None: every topic. `allow_auto_topic_creation`: create the named topics the broker
    does not know (a producer's lookups ask for it, as Kafka's do)."""

    api_key: ClassVar[ApiKey] = ApiKey.METADATA
    response_type: ClassVar[type[MetadataResponse]] = MetadataResponse
    topics: tuple[str, ...] | None = None
    allow_auto_topic_creation: bool = False

    def to_control(self) -> dict[str, Any]:
        control: dict[str, Any] = {"topics": None if self.topics is None else list(self.topics)}
        if self.allow_auto_topic_creation:
            control["allow_auto_topic_creation"] = True
        return control

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "MetadataRequest":
        names = field(control, "topics", list, None)
        auto_create = field(control, "allow_auto_topic_creation", bool, False)
        if names is None:
            return cls(None, auto_create)
        for name in names:
            if not isinstance(name, str):
                raise InvalidRequestError(f"topic names must be strings, got {type(name).__name__}")
        return cls(tuple(names), auto_create)


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    api_key: int
    name: str
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    api_keys: tuple[ApiVersionRange, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": 0, "api_keys": [
            {"api_key": k.api_key, "name": k.name, "min_version": k.min_version, "max_version": k.max_version}
            for k in self.api_keys]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ApiVersionsResponse":
        return cls(tuple(ApiVersionRange(field(k, "api_key", int), field(k, "name", str), field(k, "min_version", int),
                                         field(k, "max_version", int))
                         for k in entries(control, "api_keys")))


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(RequestMessage[ApiVersionsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    response_type: ClassVar[type[ApiVersionsResponse]] = ApiVersionsResponse

    def to_control(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ApiVersionsRequest":
        return cls()
