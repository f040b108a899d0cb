"""ListOffsets (API key 2): a partition's earliest or latest offset, or the first offset at or
after a time.

    request  control = {topics: [{name, partitions: [{partition, timestamp, current_leader_epoch}]}]}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, offset, timestamp}]}]}

`timestamp` is LATEST_TIMESTAMP (-1: the high watermark), EARLIEST_TIMESTAMP (-2: the log start)
or a time in ms; anything else, or a timestamp that is not an int, is that partition's
INVALID_REQUEST. No offset at or after the time: offset and timestamp are -1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from broker.errors import InvalidRequestError, PymqError
from broker.protocol.fields import entries, entry_field, field
from broker.protocol.framing import ApiKey
from broker.protocol.messages.base import (
    decode_topics,
    topics_control,
    NO_LEADER_EPOCH,
    Message,
    Outcome,
    RequestMessage,
    decode_error,
    entry_error,
    put_error,
)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse(Outcome):
    partition: int
    error_code: int = 0
    error_message: str | None = None
    offset: int = -1
    timestamp: int = -1

    def to_control(self) -> dict[str, Any]:
        out = put_error({"partition": self.partition}, self.error_code, self.error_message)
        out["offset"], out["timestamp"] = self.offset, self.timestamp
        return out

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "ListOffsetsPartitionResponse":
        return cls(field(control, "partition", int), *decode_error(control), field(control, "offset", int, -1),
                   field(control, "timestamp", int, -1))


@dataclass(frozen=True, slots=True)
class ListOffsetsTopicResponse:
    name: str
    partitions: tuple[ListOffsetsPartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    topics: tuple[ListOffsetsTopicResponse, ...]

    def to_control(self) -> dict[str, Any]:
        return topics_control(self.topics)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ListOffsetsResponse":
        return cls(decode_topics(control, ListOffsetsTopicResponse, ListOffsetsPartitionResponse.from_control))


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition:
    """`error` is set when the entry is malformed (partition or timestamp)."""

    partition: int
    timestamp: int
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic:
    name: str
    partitions: tuple[ListOffsetsPartition, ...]
    error: PymqError | None = entry_error()


def _timestamp(control: dict[str, Any]) -> tuple[int, InvalidRequestError | None]:
    timestamp, error = entry_field(control, "timestamp", int, LATEST_TIMESTAMP)
    if error is None and timestamp < EARLIEST_TIMESTAMP:
        return LATEST_TIMESTAMP, InvalidRequestError(f"timestamp {timestamp} is neither -1 (latest), -2 (earliest) nor a time")
    return timestamp, error


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(RequestMessage[ListOffsetsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    response_type: ClassVar[type[ListOffsetsResponse]] = ListOffsetsResponse
    topics: tuple[ListOffsetsTopic, ...]

    def to_control(self) -> dict[str, Any]:
        return {"topics": [
            {"name": t.name, "partitions": [
                {"partition": p.partition, "timestamp": p.timestamp, "current_leader_epoch": p.current_leader_epoch}
                for p in t.partitions]}
            for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ListOffsetsRequest":
        topics = []
        for item in entries(control, "topics"):
            name, name_error = entry_field(item, "name", str, "")
            partitions = []
            for p in entries(item, "partitions"):
                partition, partition_error = entry_field(p, "partition", int, -1)
                timestamp, timestamp_error = _timestamp(p)
                epoch = field(p, "current_leader_epoch", int, NO_LEADER_EPOCH)
                partitions.append(ListOffsetsPartition(partition, timestamp, epoch, partition_error or timestamp_error))
            topics.append(ListOffsetsTopic(name, tuple(partitions), name_error))
        return cls(tuple(topics))
