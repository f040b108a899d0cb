"""Produce (API key 0): record batches for partitions, and where each partition's landed.

    request  control = {acks, timeout_ms, topics: [{name, partitions: [{partition, size,
                        current_leader_epoch}]}]}
             payload = each partition's record set, back to back in the order of the entries
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, base_offset, log_append_time, log_start_offset}]}]}

The payload is split here, once: each partition gets a view of its slice (no copy), which the log
patches base offsets into before appending. A partition's `size`s must claim the payload exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from broker.errors import InvalidRequestError, InvalidRequiredAcksError, PymqError
from broker.protocol.fields import entries, entry_field, field, non_negative
from broker.protocol.framing import ApiKey
from broker.protocol.messages.base import (
    decode_topics,
    topics_control,
    NO_LEADER_EPOCH,
    Buffer,
    Message,
    Outcome,
    Part,
    RequestMessage,
    decode_error,
    entry_error,
    put_error,
)

DEFAULT_PRODUCE_TIMEOUT_MS = 30_000
ACKS = (-1, 0, 1)  # all in-sync replicas, none (no response at all), the leader


@dataclass(frozen=True, slots=True)
class ProducePartitionResponse(Outcome):
    partition: int
    error_code: int = 0
    error_message: str | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1

    def to_control(self) -> dict[str, Any]:
        return put_error({"partition": self.partition, "base_offset": self.base_offset,
                          "log_append_time": self.log_append_time, "log_start_offset": self.log_start_offset},
                         self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "ProducePartitionResponse":
        return cls(field(control, "partition", int), *decode_error(control), field(control, "base_offset", int, -1),
                   field(control, "log_append_time", int, -1), field(control, "log_start_offset", int, -1))


@dataclass(frozen=True, slots=True)
class ProduceTopicResponse:
    name: str
    partitions: tuple[ProducePartitionResponse, ...]


@dataclass(frozen=True, slots=True)
class ProduceResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.PRODUCE
    topics: tuple[ProduceTopicResponse, ...]

    def to_control(self) -> dict[str, Any]:
        return topics_control(self.topics)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ProduceResponse":
        return cls(decode_topics(control, ProduceTopicResponse, ProducePartitionResponse.from_control))


@dataclass(frozen=True, slots=True)
class ProducePartition:
    """One partition's record set: the buffers written back to back (one view of the request's
    payload when decoded; the producer passes each batch's header and body without joining them).
    `error` is set when the entry itself is malformed (e.g. the partition is not an int)."""

    partition: int
    records: tuple[Buffer, ...]
    current_leader_epoch: int = NO_LEADER_EPOCH
    error: PymqError | None = entry_error()

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.records)

    def record_set(self) -> memoryview:
        """The records as one writable buffer: the payload slice itself for a decoded request."""
        records = self.records
        if len(records) == 1 and records[0].__class__ is memoryview:
            return records[0]  # type: ignore[return-value]
        return memoryview(bytearray().join(records))


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    """`error` is set when the topic entry is malformed (its name is not a string): every
    partition of it is answered with that error."""

    name: str
    partitions: tuple[ProducePartition, ...]
    error: PymqError | None = entry_error()


@dataclass(frozen=True, slots=True)
class ProduceRequest(RequestMessage[ProduceResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.PRODUCE
    response_type: ClassVar[type[ProduceResponse]] = ProduceResponse
    topics: tuple[ProduceTopic, ...]
    acks: int = 1
    timeout_ms: int = DEFAULT_PRODUCE_TIMEOUT_MS

    def to_control(self) -> dict[str, Any]:
        return {"acks": self.acks, "timeout_ms": self.timeout_ms, "topics": [
            {"name": t.name, "partitions": [
                {"partition": p.partition, "size": p.size, "current_leader_epoch": p.current_leader_epoch}
                for p in t.partitions]}
            for t in self.topics]}

    def payload(self) -> list[Part]:
        return [r for t in self.topics for p in t.partitions for r in p.records]

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ProduceRequest":
        acks = field(control, "acks", int, 1)
        if acks not in ACKS:
            raise InvalidRequiredAcksError(f"acks must be -1, 0 or 1, got {acks}")
        timeout_ms = non_negative(control, "timeout_ms", DEFAULT_PRODUCE_TIMEOUT_MS)
        topics = []
        pos, end = 0, len(payload)
        for item in entries(control, "topics"):
            name, name_error = entry_field(item, "name", str, "")
            partitions = []
            for p in entries(item, "partitions"):
                # The hot path: well-typed fields cost one class comparison; the helpers only
                # run to name what is wrong.
                size, partition, epoch = p.get("size"), p.get("partition"), p.get("current_leader_epoch", NO_LEADER_EPOCH)
                if size.__class__ is not int or size < 0:
                    size = non_negative(p, "size")
                if pos + size > end:
                    raise InvalidRequestError(f"partition sizes claim more than the payload's {end} bytes")
                partition_error = None
                if partition.__class__ is not int:
                    partition, partition_error = entry_field(p, "partition", int, -1)
                if epoch.__class__ is not int:
                    epoch = field(p, "current_leader_epoch", int, NO_LEADER_EPOCH)
                partitions.append(ProducePartition(partition, (payload[pos:pos + size],), epoch, partition_error))
                pos += size
            topics.append(ProduceTopic(name, tuple(partitions), name_error))
        if pos != end:
            raise InvalidRequestError(f"payload has {end - pos} bytes not claimed by any partition")
        return cls(tuple(topics), acks, timeout_ms)
