"""The consumer group protocol's payloads: what a consumer puts in JoinGroup's protocol metadata
(its `Subscription`) and what the leader hands each member in SyncGroup (its `Assignment`).

The coordinator treats both as opaque bytes, except for protocol type "consumer", where it decodes
assignments to refuse a commit for a partition the member does not own and to show assignments in
`pymq group describe`. This module is the one definition of those bytes for both sides.

    subscription = {version: 0, topics: [name, ...], owned_partitions: {topic: [partition, ...]},
                    generation_id: int, user_data?: bin}
    assignment   = {version: 0, partitions: {topic: [partition, ...]}, user_data?: bin}

Both are a msgpack map. `topics` is sorted and unique; partitions are grouped per topic (compact
for the thousands of partitions of a big group), each topic's list sorted. `owned_partitions` and
`generation_id` (-1: none yet) are what cooperative rebalancing needs: the partitions the member
holds now and the generation in which it got them. `user_data` is the assignor's own, omitted
when there is none.

Versions: a later version may only add fields, never change or drop a v0 field (a change of
meaning needs a new protocol type). So a reader accepts any version >= 0 as long as the v0 fields
are there and well formed, and ignores fields it does not know; older readers keep working with
newer writers, as Kafka's ConsumerProtocol does with its higher versions.

The payloads come from peers: `decode` refuses anything malformed with InvalidRequestError naming
the fault (not bytes, not msgpack, not a map, a missing or mistyped field, a bool where an int
belongs, a negative partition, a duplicate topic or partition).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack

from common.errors import InvalidRequestError
from common.topic_partition import TopicPartition
from protocol.fields import field, non_negative, string_keys

PROTOCOL_TYPE = "consumer"
VERSION = 0  # the version this module writes; see the module docstring for reading later ones
NO_GENERATION = -1  # the member has not been part of a generation yet (or lost its partitions)


def _canonical(partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
    """Sorted and unique, so that equal contents compare equal and encode to the same bytes."""
    return tuple(sorted(set(partitions)))


def _by_topic(partitions: tuple[TopicPartition, ...]) -> dict[str, list[int]]:
    """{topic: [partition, ...]} of canonical (sorted) partitions, topics in sorted order."""
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return grouped


def _pack(control: dict[str, Any], user_data: bytes | None) -> bytes:
    if user_data is not None:
        control["user_data"] = user_data
    return msgpack.packb(control, use_bin_type=True)


@contextmanager
def _describing(what: str) -> Iterator[None]:
    """Prefix decoding errors with the payload they concern: the coordinator passes them on."""
    try:
        yield
    except InvalidRequestError as err:
        raise InvalidRequestError(f"consumer protocol {what}: {err}") from err


def _unpack(data: object) -> dict[str, Any]:
    """The control map of a payload, with a supported version (any >= 0, see the docstring)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidRequestError(f"payload must be bytes, got {type(data).__name__}")
    try:
        control = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several unrelated types for bad input
        raise InvalidRequestError(f"payload is not valid msgpack: {err}") from err
    if not isinstance(control, dict):
        raise InvalidRequestError(f"payload must be a msgpack map, got {type(control).__name__}")
    non_negative(control, "version")
    return control


def _topics(control: dict[str, Any]) -> tuple[str, ...]:
    topics = field(control, "topics", list)
    for topic in topics:
        if not isinstance(topic, str):
            raise InvalidRequestError(f"entries of 'topics' must be strings, got {type(topic).__name__}")
    if len(set(topics)) != len(topics):
        raise InvalidRequestError("duplicate topic in 'topics'")
    return tuple(topics)


def _partition(value: object, where: str) -> int:
    if value.__class__ is not int:  # bool is an int subclass, and no partition number
        raise InvalidRequestError(f"partition numbers in {where} must be ints, got {type(value).__name__}")
    if value < 0:
        raise InvalidRequestError(f"partition numbers in {where} must be >= 0, got {value}")
    return value


def _partitions(control: dict[str, Any], name: str) -> tuple[TopicPartition, ...]:
    """A {topic: [partition, ...]} field as (topic, partition) pairs."""
    mapping = field(control, name, dict)
    error = string_keys(mapping, name)
    if error is not None:
        raise error
    pairs: list[TopicPartition] = []
    for topic, partitions in mapping.items():
        where = f"{name}[{topic!r}]"
        if not isinstance(partitions, list):
            raise InvalidRequestError(f"{where} must be a list of partitions, got {type(partitions).__name__}")
        numbers = [_partition(value, where) for value in partitions]
        if len(set(numbers)) != len(numbers):
            raise InvalidRequestError(f"duplicate partition in {where}")
        pairs.extend((topic, number) for number in numbers)
    return tuple(pairs)


def _generation(control: dict[str, Any]) -> int:
    generation_id = field(control, "generation_id", int)
    if generation_id < NO_GENERATION:
        raise InvalidRequestError(f"field 'generation_id' must be >= {NO_GENERATION}, got {generation_id}")
    return generation_id


@dataclass(frozen=True, slots=True)
class Subscription:
    """A member's JoinGroup metadata: the topics it wants, the partitions it owns now and the
    generation in which it got them. Topics and partitions are kept sorted and unique whatever
    order the caller gives them in."""

    topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = NO_GENERATION
    user_data: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(sorted(set(self.topics))))
        object.__setattr__(self, "owned_partitions", _canonical(self.owned_partitions))

    def encode(self) -> bytes:
        return _pack({"version": VERSION, "topics": list(self.topics),
                      "owned_partitions": _by_topic(self.owned_partitions),
                      "generation_id": self.generation_id}, self.user_data)

    @classmethod
    def decode(cls, data: bytes) -> Subscription:
        """A peer's subscription; InvalidRequestError names what is malformed."""
        with _describing("subscription"):
            control = _unpack(data)
            return cls(_topics(control), _partitions(control, "owned_partitions"), _generation(control),
                       field(control, "user_data", bytes, None))


@dataclass(frozen=True, slots=True)
class Assignment:
    """The partitions the leader gives one member in SyncGroup (kept sorted and unique)."""

    partitions: tuple[TopicPartition, ...] = ()
    user_data: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", _canonical(self.partitions))

    def partitions_by_topic(self) -> dict[str, list[int]]:
        """{topic: [partition, ...]}, both sorted."""
        return _by_topic(self.partitions)

    def encode(self) -> bytes:
        return _pack({"version": VERSION, "partitions": self.partitions_by_topic()}, self.user_data)

    @classmethod
    def decode(cls, data: bytes) -> Assignment:
        """A leader's assignment; InvalidRequestError names what is malformed."""
        with _describing("assignment"):
            control = _unpack(data)
            return cls(_partitions(control, "partitions"), field(control, "user_data", bytes, None))
