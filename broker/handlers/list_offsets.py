"""ListOffsets handler: a partition's earliest or latest offset, or the first at or after a time."""
from __future__ import annotations

from broker.errors import PymqError
from broker.handlers.fetch import LeaderLog
from broker.log import UnifiedLog
from broker.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    ListOffsetsTopicResponse,
    code_and_message,
)


class ListOffsetsHandler:
    """Loop-local, synchronous. Latest is the high watermark: what a consumer can read."""

    def __init__(self, leader_log: LeaderLog) -> None:
        self.leader_log = leader_log

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        return ListOffsetsResponse(tuple(
            ListOffsetsTopicResponse(topic.name, tuple(self._partition(topic, p) for p in topic.partitions))
            for topic in request.topics))

    def _partition(self, topic: ListOffsetsTopic, p: ListOffsetsPartition) -> ListOffsetsPartitionResponse:
        malformed = topic.error or p.error
        if malformed is not None:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(malformed))
        try:
            offset, timestamp = _offset_for(self.leader_log(topic.name, p.partition, p.current_leader_epoch), p.timestamp)
        except PymqError as err:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(err))
        return ListOffsetsPartitionResponse(p.partition, offset=offset, timestamp=timestamp)


def _offset_for(partition_log: UnifiedLog, timestamp: int) -> tuple[int, int]:
    if timestamp == LATEST_TIMESTAMP:
        return partition_log.high_watermark, -1
    if timestamp == EARLIEST_TIMESTAMP:
        return partition_log.log_start_offset, -1
    assert timestamp >= 0, "ListOffsetsRequest.from_control refuses other timestamps"
    found = partition_log.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)
