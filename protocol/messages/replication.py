"""OffsetForLeaderEpoch (API key 23): where a leader epoch ends in the leader's log (KIP-101/279).

    request  control = {replica_id, topics: [{name, partitions: [{partition, current_leader_epoch,
                        leader_epoch}]}]}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, leader_epoch, end_offset}]}]}

A follower that becomes one (after a leader change, or on start) asks its leader, for the latest
epoch in its own log, where that epoch ends in the leader's: the answer is the largest epoch the
leader knows at or below the one asked and the offset where it ended (the start of the next
epoch, or the leader's log end if it is the leader's latest). The follower truncates what it has
past that, so its log never diverges from the leader's (docs/cluster.md, Truncation).
`current_leader_epoch` fences a request made under stale metadata (FENCED_LEADER_EPOCH).
`leader_epoch` -1 and `end_offset` -1 in an answer mean the leader knows no epoch that old.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import InvalidRequestError, PymqError
from protocol.fields import entry_field, field
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Message,
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

UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffset(PartitionResponse):
    leader_epoch: int = own_field(UNDEFINED_EPOCH_OFFSET)
    end_offset: int = own_field(UNDEFINED_EPOCH_OFFSET)


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FOR_LEADER_EPOCH
    partition_type: ClassVar[type[EpochEndOffset]] = EpochEndOffset
    topics: tuple[TopicResponse[EpochEndOffset], ...]


@dataclass(frozen=True, slots=True)
class OffsetForLeaderPartition:
    partition: int
    leader_epoch: int
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"partition": self.partition, "current_leader_epoch": self.current_leader_epoch,
                "leader_epoch": self.leader_epoch}

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "OffsetForLeaderPartition":
        partition, partition_error = entry_field(control, "partition", int, -1)
        epoch, epoch_error = entry_field(control, "leader_epoch", int, NO_LEADER_EPOCH)
        return cls(partition, epoch, field(control, "current_leader_epoch", int, NO_LEADER_EPOCH),
                   partition_error or epoch_error)


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochRequest(RequestMessage[OffsetForLeaderEpochResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FOR_LEADER_EPOCH
    response_type: ClassVar[type[OffsetForLeaderEpochResponse]] = OffsetForLeaderEpochResponse
    topics: tuple[TopicRequest[OffsetForLeaderPartition], ...]
    replica_id: int = -1

    def to_control(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "topics": encode_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetForLeaderEpochRequest":
        replica_id = field(control, "replica_id", int, -1)
        if replica_id < -1:
            raise InvalidRequestError(f"replica_id is a broker id (>= 0) or -1, got {replica_id}")
        return cls(decode_topics(control, TopicRequest, OffsetForLeaderPartition.from_control), replica_id)


# -- BrokerHandshake (API key 1010, pymq's own) ------------------------------------------------
#
#     request  control = {broker_id, incarnation}
#     response control = {error_code}
#
# The first request a replica fetcher sends on a new connection: it names the registered broker
# the connection speaks for and proves it with the incarnation that broker wrote into its
# registration (docs/cluster.md, Inter-broker identity). A refusal is the whole response's
# CLUSTER_AUTHORIZATION_FAILED; accepted, the connection may send replica fetches as that broker.

INCARNATION_MAX_CHARS = 128


@dataclass(frozen=True, slots=True)
class BrokerHandshakeResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.BROKER_HANDSHAKE

    def to_control(self) -> dict[str, Any]:
        return {"error_code": 0}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "BrokerHandshakeResponse":
        return cls()


@dataclass(frozen=True, slots=True)
class BrokerHandshakeRequest(RequestMessage[BrokerHandshakeResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.BROKER_HANDSHAKE
    response_type: ClassVar[type[BrokerHandshakeResponse]] = BrokerHandshakeResponse
    broker_id: int
    incarnation: str

    def to_control(self) -> dict[str, Any]:
        return {"broker_id": self.broker_id, "incarnation": self.incarnation}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "BrokerHandshakeRequest":
        broker_id, incarnation = field(control, "broker_id", int), field(control, "incarnation", str)
        if broker_id < 0 or len(incarnation) > INCARNATION_MAX_CHARS:
            raise InvalidRequestError(f"a handshake names a broker id (>= 0) and an incarnation of at most "
                                      f"{INCARNATION_MAX_CHARS} characters")
        return cls(broker_id, incarnation)
