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

from typing import ClassVar

from common.errors import PymqError
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Message,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    entry_error,
)
from protocol.schema import INT, STR, Check, Topics, message, wire

UNDEFINED_EPOCH_OFFSET = -1


@message
class EpochEndOffset(PartitionResponse):
    leader_epoch: int = wire(INT, UNDEFINED_EPOCH_OFFSET)
    end_offset: int = wire(INT, UNDEFINED_EPOCH_OFFSET)


@message
class OffsetForLeaderEpochResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FOR_LEADER_EPOCH
    topics: tuple[TopicResponse[EpochEndOffset], ...] = wire(Topics(TopicResponse, EpochEndOffset))


@message
class OffsetForLeaderPartition:
    wire_order: ClassVar[tuple[str, ...]] = ("partition", "current_leader_epoch", "leader_epoch")
    partition: int = wire(INT, entry=True, placeholder=-1)
    leader_epoch: int = wire(INT, entry=True, placeholder=NO_LEADER_EPOCH)
    current_leader_epoch: int = wire(INT, NO_LEADER_EPOCH)
    error: PymqError | None = entry_error()


@message
class OffsetForLeaderEpochRequest(RequestMessage[OffsetForLeaderEpochResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FOR_LEADER_EPOCH
    response_type: ClassVar[type[OffsetForLeaderEpochResponse]] = OffsetForLeaderEpochResponse
    wire_order: ClassVar[tuple[str, ...]] = ("replica_id", "topics")
    topics: tuple[TopicRequest[OffsetForLeaderPartition], ...] = wire(Topics(TopicRequest, OffsetForLeaderPartition))
    replica_id: int = wire(INT, -1, check=Check(
        lambda v: v >= -1, "replica_id is a broker id (>= 0) or -1, got {value}"))


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
_HANDSHAKE_FIELDS = (f"a handshake names a broker id (>= 0) and an incarnation of at most {INCARNATION_MAX_CHARS} "
                     f"characters")


@message
class BrokerHandshakeResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.BROKER_HANDSHAKE


@message
class BrokerHandshakeRequest(RequestMessage[BrokerHandshakeResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.BROKER_HANDSHAKE
    response_type: ClassVar[type[BrokerHandshakeResponse]] = BrokerHandshakeResponse
    broker_id: int = wire(INT, check=Check(lambda v: v >= 0, _HANDSHAKE_FIELDS))
    incarnation: str = wire(STR, check=Check(lambda v: len(v) <= INCARNATION_MAX_CHARS, _HANDSHAKE_FIELDS))
