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

from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import InvalidRequestError, PymqError
from protocol.fields import entry_field
from protocol.framing import ApiKey
from protocol.messages.base import (
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    decode_topics,
    encode_topics,
    entry_error,
)


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    partition_type: ClassVar[type[PartitionResponse]] = PartitionResponse
    topics: tuple[TopicResponse[PartitionResponse], ...]


@dataclass(frozen=True, slots=True)
class ReassignedPartition:
    partition: int
    replicas: tuple[int, ...] | None  # None: cancel
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"partition": self.partition, "replicas": None if self.replicas is None else list(self.replicas)}

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "ReassignedPartition":
        partition, error = entry_field(control, "partition", int, -1)
        replicas = control.get("replicas")
        if replicas is not None:
            if not isinstance(replicas, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas):
                return cls(partition, None, error or InvalidRequestError("replicas must be a list of broker ids or null"))
            replicas = tuple(replicas)
        return cls(partition, replicas, error)


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsRequest(RequestMessage[AlterPartitionReassignmentsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    response_type: ClassVar[type[AlterPartitionReassignmentsResponse]] = AlterPartitionReassignmentsResponse
    topics: tuple[TopicRequest[ReassignedPartition], ...]

    def to_control(self) -> dict[str, Any]:
        return {"topics": encode_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "AlterPartitionReassignmentsRequest":
        return cls(decode_topics(control, TopicRequest, ReassignedPartition.from_control))
