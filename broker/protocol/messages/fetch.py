"""Fetch (API key 1): read record batches from partitions, waiting up to `max_wait_ms` for
`min_bytes` of them.

    request  control = {max_wait_ms, min_bytes, max_bytes, topics: [{name, topic_id?, partitions:
                        [{partition, fetch_offset, max_bytes, current_leader_epoch}]}]}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, high_watermark, log_start_offset, size}]}]}
             payload = each partition's record bytes, back to back in the order of the entries

Response entries mirror the request's. On the broker a partition's records are a segment range
(`broker.log.FetchSlice`, sent with sendfile); decoded by a client they are a view of its slice of
the payload, split here, so handlers and clients never count bytes themselves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from broker.errors import InvalidRequestError, PymqError
from broker.protocol.fields import entries, entry_field, field, non_negative
from broker.protocol.framing import ApiKey
from broker.protocol.messages.base import (
    topics_control,
    NO_LEADER_EPOCH,
    Message,
    Outcome,
    Part,
    RequestMessage,
    decode_error,
    entry_error,
    part_size,
    put_error,
)


@dataclass(frozen=True, slots=True)
class FetchPartitionResponse(Outcome):
    partition: int
    error_code: int = 0
    error_message: str | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    records: Part = b""

    def to_control(self) -> dict[str, Any]:
        return put_error({"partition": self.partition, "high_watermark": self.high_watermark,
                          "log_start_offset": self.log_start_offset, "size": part_size(self.records)},
                         self.error_code, self.error_message)


@dataclass(frozen=True, slots=True)
class FetchTopicResponse:
    name: str
    partitions: tuple[FetchPartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    topics: tuple[FetchTopicResponse, ...]

    def to_control(self) -> dict[str, Any]:
        return topics_control(self.topics)

    def payload(self) -> list[Part]:
        return [p.records for t in self.topics for p in t.partitions if part_size(p.records)]

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FetchResponse":
        topics = []
        pos, end = 0, len(payload)
        for t in entries(control, "topics"):
            partitions = []
            for p in entries(t, "partitions"):
                size = non_negative(p, "size", 0)
                if pos + size > end:
                    raise InvalidRequestError(f"partition sizes claim more than the payload's {end} bytes")
                partitions.append(FetchPartitionResponse(
                    field(p, "partition", int), *decode_error(p), field(p, "high_watermark", int, -1),
                    field(p, "log_start_offset", int, -1), payload[pos:pos + size]))
                pos += size
            topics.append(FetchTopicResponse(field(t, "name", str), tuple(partitions)))
        if pos != end:
            raise InvalidRequestError(f"payload has {end - pos} bytes not claimed by any partition")
        return cls(tuple(topics))


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """`max_bytes` None: the request's. `error` is set when the entry itself is malformed."""

    partition: int
    fetch_offset: int
    max_bytes: int | None = None
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()


@dataclass(frozen=True, slots=True)
class FetchTopic:
    """`topic_id` (optional; Kafka's Fetch v13, KIP-516): the incarnation of the topic the reader
    means. A broker whose log of the name is another incarnation (the topic was deleted and
    re-created) answers INCONSISTENT_TOPIC_ID instead of the new topic's records at the old
    offsets. `error` is set when the name or the id is not a string: every partition is
    answered with it."""

    name: str
    partitions: tuple[FetchPartition, ...]
    topic_id: str | None = None
    error: PymqError | None = entry_error()


@dataclass(frozen=True, slots=True)
class FetchRequest(RequestMessage[FetchResponse]):
    """`max_bytes` None: the broker's fetch.max.bytes. The broker bounds the wait and the sizes
    (they are its policy, not the request's validity): negative waits count as 0."""

    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    response_type: ClassVar[type[FetchResponse]] = FetchResponse
    topics: tuple[FetchTopic, ...]
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int | None = None

    def to_control(self) -> dict[str, Any]:
        return {"max_wait_ms": self.max_wait_ms, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "topics": [
            {"name": t.name, **({} if t.topic_id is None else {"topic_id": t.topic_id}), "partitions": [
                {"partition": p.partition, "fetch_offset": p.fetch_offset, "max_bytes": p.max_bytes,
                 "current_leader_epoch": p.current_leader_epoch}
                for p in t.partitions]}
            for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FetchRequest":
        max_wait_ms = field(control, "max_wait_ms", int, 0)
        min_bytes = field(control, "min_bytes", int, 1)
        max_bytes = field(control, "max_bytes", int, None)
        topics = []
        for item in entries(control, "topics"):
            name, name_error = entry_field(item, "name", str, "")
            topic_id, id_error = entry_field(item, "topic_id", str, None, None)
            partitions = []
            for p in entries(item, "partitions"):
                partition, partition_error = entry_field(p, "partition", int, -1)
                partitions.append(FetchPartition(partition, field(p, "fetch_offset", int), field(p, "max_bytes", int, None),
                                                 field(p, "current_leader_epoch", int, NO_LEADER_EPOCH), partition_error))
            topics.append(FetchTopic(name, tuple(partitions), topic_id, name_error or id_error))
        return cls(tuple(topics), max_wait_ms, min_bytes, max_bytes)
