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

from typing import ClassVar

from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, RequestMessage
from protocol.schema import (
    BOOL,
    INT,
    REQUIRED,
    STR,
    Entries,
    Seq,
    error_code_field,
    error_message_field,
    message,
    one_of,
    wire,
)

# How producers place keyed records (client/partitioner.py), named in a topic's metadata and its
# `key.partitioner` config: Kafka's murmur2 placement, or murmur3, that of topics created before
# that config, which they keep (and what a broker that sends no name has).
KEY_PARTITIONERS = ("murmur2", "murmur3")
LEGACY_KEY_PARTITIONER = "murmur3"

_IDS = Seq(int, "field {name!r} must be a list of ints")


@message
class BrokerAddress:
    node_id: int = wire(INT)
    host: str = wire(STR)
    port: int = wire(INT)


@message
class PartitionMetadata(Outcome):
    errors_last: ClassVar[bool] = True
    partition: int = wire(INT)
    leader: int = wire(INT)
    leader_epoch: int = wire(INT)
    replicas: tuple[int, ...] = wire(_IDS)
    isr: tuple[int, ...] = wire(_IDS)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    # a reassignment in progress moves the replicas to these; on the wire only during one
    target_replicas: tuple[int, ...] = wire(_IDS, (), omit=())


@message
class TopicMetadata(Outcome):
    wire_order: ClassVar[tuple[str, ...]] = ("name", "topic_id", "key_partitioner", "partitions", "error_code",
                                             "error_message")
    name: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    topic_id: str = wire(STR, "")
    partitions: tuple[PartitionMetadata, ...] = wire(Entries(PartitionMetadata), (), absent=REQUIRED)
    # a broker that does not send it has only murmur3
    key_partitioner: str = wire(STR, LEGACY_KEY_PARTITIONER, check=one_of(
        KEY_PARTITIONERS, f"key_partitioner {{value!r}} is not one of {', '.join(KEY_PARTITIONERS)}"))


@message
class MetadataResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.METADATA
    brokers: tuple[BrokerAddress, ...] = wire(Entries(BrokerAddress))
    controller_id: int = wire(INT)
    topics: tuple[TopicMetadata, ...] = wire(Entries(TopicMetadata))


@message
class MetadataRequest(RequestMessage[MetadataResponse]):
    """`topics` None: every topic. `allow_auto_topic_creation`: create the named topics the broker
    does not know (a producer's lookups ask for it, as Kafka's do); on the wire only when set."""

    api_key: ClassVar[ApiKey] = ApiKey.METADATA
    response_type: ClassVar[type[MetadataResponse]] = MetadataResponse
    topics: tuple[str, ...] | None = wire(Seq(str, "topic names must be strings, got {type}"), None)
    allow_auto_topic_creation: bool = wire(BOOL, False, omit=False)


@message
class ApiVersionRange:
    api_key: int = wire(INT)
    name: str = wire(STR)
    min_version: int = wire(INT)
    max_version: int = wire(INT)


@message
class ApiVersionsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    api_keys: tuple[ApiVersionRange, ...] = wire(Entries(ApiVersionRange))


@message
class ApiVersionsRequest(RequestMessage[ApiVersionsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    response_type: ClassVar[type[ApiVersionsResponse]] = ApiVersionsResponse
