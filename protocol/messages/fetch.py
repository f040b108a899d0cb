"""Fetch (API key 1): read record batches from partitions, waiting up to `max_wait_ms` for
`min_bytes` of them.

    request  control = {max_wait_ms, min_bytes, max_bytes, topics: [{name, topic_id?, partitions:
                        [{partition, fetch_offset, max_bytes, current_leader_epoch}]}], replica_id?}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, high_watermark, log_start_offset, size}]}]}
             payload = each partition's record bytes, back to back in the order of the entries

`replica_id` is set (>= 0) only by a follower broker fetching from its leader (the replica-fetch
API, as in Kafka's Fetch): it reads up to the leader's log end instead of the high watermark, and
its fetch offset tells the leader how far it has replicated. Consumers leave it out (-1).

Response entries mirror the request's. On the broker a partition's records are a segment range
(`broker.log.FetchSlice`, sent with sendfile); decoded by a client they are a view of its slice of
the payload, split here, so handlers and clients never count bytes themselves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import InvalidRequestError, PymqError
from protocol.fields import entry_field, field, non_negative
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Part,
    PartitionResponse,
    PayloadCursor,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    decode_topics,
    encode_topics,
    entry_error,
    own_field,
    part_size,
)

CONSUMER_REPLICA_ID = -1  # a Fetch from a consumer, not a follower broker


@dataclass(frozen=True, slots=True)
class FetchPartitionResponse(PartitionResponse):
    """`records` travel in the payload; the control map says only their `size`."""

    high_watermark: int = own_field(-1)
    log_start_offset: int = own_field(-1)
    records: Part = b""

    def put_own(self, out: dict[str, Any]) -> None:
        PartitionResponse.put_own(self, out)
        out["size"] = part_size(self.records)


@dataclass(frozen=True, slots=True)
class FetchResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    partition_type: ClassVar[type[FetchPartitionResponse]] = FetchPartitionResponse
    topics: tuple[TopicResponse[FetchPartitionResponse], ...]

    def payload(self) -> list[Part]:
        return [p.records for t in self.topics for p in t.partitions if part_size(p.records)]

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FetchResponse":
        """Each partition's records are a view of its slice of the payload."""
        cursor = PayloadCursor(payload)
        topics = decode_topics(control, TopicResponse, lambda p: FetchPartitionResponse.from_control(
            p, records=cursor.take(non_negative(p, "size", 0))))
        cursor.check_all_claimed()
        return cls(topics)


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """`max_bytes` None: the request's. `error` is set when the entry itself is malformed."""

    partition: int
    fetch_offset: int
    max_bytes: int | None = None
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"partition": self.partition, "fetch_offset": self.fetch_offset, "max_bytes": self.max_bytes,
                "current_leader_epoch": self.current_leader_epoch}

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "FetchPartition":
        partition, partition_error = entry_field(control, "partition", int, -1)
        return cls(partition, field(control, "fetch_offset", int), field(control, "max_bytes", int, None),
                   field(control, "current_leader_epoch", int, NO_LEADER_EPOCH), partition_error)


@dataclass(frozen=True, slots=True)
class FetchRequest(RequestMessage[FetchResponse]):
    """`max_bytes` None: the broker's fetch.max.bytes. The broker bounds the wait and the sizes
    (they are its policy, not the request's validity): negative waits count as 0."""

    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    response_type: ClassVar[type[FetchResponse]] = FetchResponse
    topics: tuple[TopicRequest[FetchPartition], ...]
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int | None = None
    replica_id: int = CONSUMER_REPLICA_ID

    def to_control(self) -> dict[str, Any]:
        control = {"max_wait_ms": self.max_wait_ms, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                   "topics": encode_topics(self.topics)}
        if self.replica_id != CONSUMER_REPLICA_ID:  # consumers send the bytes they always did
            control["replica_id"] = self.replica_id
        return control

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FetchRequest":
        max_wait_ms = field(control, "max_wait_ms", int, 0)
        min_bytes = field(control, "min_bytes", int, 1)
        max_bytes = field(control, "max_bytes", int, None)
        replica_id = field(control, "replica_id", int, CONSUMER_REPLICA_ID)
        if replica_id < CONSUMER_REPLICA_ID:
            raise InvalidRequestError(f"replica_id is a broker id (>= 0) or -1 for a consumer, got {replica_id}")
        return cls(decode_topics(control, TopicRequest, FetchPartition.from_control), max_wait_ms, min_bytes, max_bytes,
                   replica_id)
