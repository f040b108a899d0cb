"""AlterPartitionReassignments (API key 45): move a partition's replicas to other brokers.

    request  control = {topics: [{name, partitions: [{partition, replicas: [broker id] | None}]}]}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code, error_message?}]}]}

`replicas` is the partition's new replica list, preferred leader first; None cancels a
reassignment in progress (the partition keeps the replicas it had). The broker that receives the
request records the target in the partition's state; the new replicas catch up as followers (at
`replica.throttle.bytes.per.second` while out of sync), and the controller completes the move once
they are all in the ISR (docs/cluster.md, Reassignment). A malformed entry is that partition's
INVALID_REQUEST; the others go on.
"""
from __future__ import annotations

from typing import ClassVar

from common.errors import PymqError
from protocol.framing import ApiKey
from protocol.messages.base import (
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    entry_error,
)
from protocol.schema import INT, Seq, Topics, message, wire


@message
class AlterPartitionReassignmentsResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse))


_REPLICAS = "replicas must be a list of broker ids or null"


@message
class ReassignedPartition:
    partition: int = wire(INT, entry=True, placeholder=-1)
    replicas: tuple[int, ...] | None = wire(Seq(int, _REPLICAS, _REPLICAS), entry=True, absent=None)  # None: cancel
    error: PymqError | None = entry_error()


@message
class AlterPartitionReassignmentsRequest(RequestMessage[AlterPartitionReassignmentsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    response_type: ClassVar[type[AlterPartitionReassignmentsResponse]] = AlterPartitionReassignmentsResponse
    topics: tuple[TopicRequest[ReassignedPartition], ...] = wire(Topics(TopicRequest, ReassignedPartition))
