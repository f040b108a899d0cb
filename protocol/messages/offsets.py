"""ListOffsets (API key 2): a partition's earliest or latest offset, or the first offset at or
after a time.

    request  control = {topics: [{name, partitions: [{partition, timestamp, current_leader_epoch}]}],
                        isolation_level?}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, offset, timestamp}]}]}

`timestamp` is LATEST_TIMESTAMP (-1: the high watermark), EARLIEST_TIMESTAMP (-2: the log start)
or a time in ms; anything else, or a timestamp that is not an int, is that partition's
INVALID_REQUEST. No offset at or after the time: offset and timestamp are -1. With
`isolation_level` 1 (read_committed; protocol.messages.fetch) the latest offset is the last stable
offset instead of the high watermark.
"""
from __future__ import annotations

from typing import ClassVar

from common.errors import PymqError
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    entry_error,
)
from protocol.messages.fetch import ISOLATION_LEVEL, READ_UNCOMMITTED
from protocol.schema import INT, Check, Topics, message, wire

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@message
class ListOffsetsPartitionResponse(PartitionResponse):
    errors_last: ClassVar[bool] = False
    offset: int = wire(INT, -1)
    timestamp: int = wire(INT, -1)


@message
class ListOffsetsResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    topics: tuple[TopicResponse[ListOffsetsPartitionResponse], ...] = wire(
        Topics(TopicResponse, ListOffsetsPartitionResponse))


@message
class ListOffsetsPartition:
    """`error` is set when the entry is malformed (partition or timestamp)."""

    partition: int = wire(INT, entry=True, placeholder=-1)
    timestamp: int = wire(INT, entry=True, placeholder=LATEST_TIMESTAMP, check=Check(
        lambda v: v >= EARLIEST_TIMESTAMP, "timestamp {value} is neither -1 (latest), -2 (earliest) nor a time"))
    current_leader_epoch: int = wire(INT, NO_LEADER_EPOCH)
    error: PymqError | None = entry_error()


@message
class ListOffsetsRequest(RequestMessage[ListOffsetsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    response_type: ClassVar[type[ListOffsetsResponse]] = ListOffsetsResponse
    topics: tuple[TopicRequest[ListOffsetsPartition], ...] = wire(Topics(TopicRequest, ListOffsetsPartition))
    isolation_level: int = wire(INT, READ_UNCOMMITTED, omit=READ_UNCOMMITTED, check=ISOLATION_LEVEL)
