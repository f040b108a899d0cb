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

from common.errors import InvalidRequestError, PymqError
from protocol.fields import entry_field, field
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    decode_topics,
    encode_topics,
    entry_error,
    own_field,
)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse(PartitionResponse):
    error_first: ClassVar[bool] = True
    offset: int = own_field(-1)
    timestamp: int = own_field(-1)


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    partition_type: ClassVar[type[ListOffsetsPartitionResponse]] = ListOffsetsPartitionResponse
    topics: tuple[TopicResponse[ListOffsetsPartitionResponse], ...]


def _timestamp(control: dict[str, Any]) -> tuple[int, InvalidRequestError | None]:
    timestamp, error = entry_field(control, "timestamp", int, LATEST_TIMESTAMP)
    if error is None and timestamp < EARLIEST_TIMESTAMP:
        return LATEST_TIMESTAMP, InvalidRequestError(f"timestamp {timestamp} is neither -1 (latest), -2 (earliest) nor a time")
    return timestamp, error


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition:
    """`error` is set when the entry is malformed (partition or timestamp)."""

    partition: int
    timestamp: int
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"partition": self.partition, "timestamp": self.timestamp, "current_leader_epoch": self.current_leader_epoch}

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "ListOffsetsPartition":
        partition, partition_error = entry_field(control, "partition", int, -1)
        timestamp, timestamp_error = _timestamp(control)
        epoch = field(control, "current_leader_epoch", int, NO_LEADER_EPOCH)
        return cls(partition, timestamp, epoch, partition_error or timestamp_error)


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(RequestMessage[ListOffsetsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    response_type: ClassVar[type[ListOffsetsResponse]] = ListOffsetsResponse
    topics: tuple[TopicRequest[ListOffsetsPartition], ...]

    def to_control(self) -> dict[str, Any]:
        return {"topics": encode_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ListOffsetsRequest":
        return cls(decode_topics(control, TopicRequest, ListOffsetsPartition.from_control))
