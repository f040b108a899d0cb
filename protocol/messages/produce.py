"""Produce (API key 0): record batches for partitions, and where each partition's landed.

    request  control = {acks, timeout_ms, topics: [{name, partitions: [{partition, size,
                        current_leader_epoch}]}]}
             payload = each partition's record set, back to back in the order of the entries
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, base_offset, log_append_time, log_start_offset,
                        batch_offsets?}]}]}

The payload is split here, once: each partition gets a view of its slice (no copy), which the log
patches base offsets into before appending. A partition's `size`s must claim the payload exactly.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

from common.errors import InvalidRequiredAcksError, PymqError
from protocol.fields import entry_field, field, non_negative
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Buffer,
    Part,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    entry_error,
)
from protocol.schema import (
    INT,
    NON_NEGATIVE,
    PayloadCursor,
    PayloadSize,
    PayloadTopics,
    Seq,
    Topics,
    message,
    one_of,
    wire,
)

DEFAULT_PRODUCE_TIMEOUT_MS = 30_000
ACKS = (-1, 0, 1)  # all in-sync replicas, none (no response at all), the leader


@message
class ProducePartitionResponse(PartitionResponse):
    base_offset: int = wire(INT, -1)
    log_append_time: int = wire(INT, -1)
    log_start_offset: int = wire(INT, -1)
    # Each batch's base offset when they do not follow from base_offset and the record counts: an
    # idempotent producer's retry whose leading batches were duplicates (broker.log.AppendInfo).
    batch_offsets: tuple[int, ...] | None = wire(Seq(int), None, omit=None)


@message
class ProduceResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.PRODUCE
    topics: tuple[TopicResponse[ProducePartitionResponse], ...] = wire(Topics(TopicResponse, ProducePartitionResponse))


def _records_size(records: tuple[Buffer, ...]) -> int:
    return sum(len(r) for r in records)


@message
class ProducePartition:
    """One partition's record set: the buffers written back to back (one view of the request's
    payload when decoded; the producer passes each batch's header and body without joining them).
    `error` is set when the entry itself is malformed (e.g. the partition is not an int).
    Decoded by `_partition_parser`, which splits the payload."""

    partition: int = wire(INT, entry=True, placeholder=-1)
    records: tuple[Buffer, ...] = wire(PayloadSize(_records_size), key="size", payload=True)
    current_leader_epoch: int = wire(INT, NO_LEADER_EPOCH)
    error: PymqError | None = entry_error()

    @property
    def size(self) -> int:
        return _records_size(self.records)

    def record_set(self) -> memoryview:
        """The records as one writable buffer: the payload slice itself for a decoded request."""
        records = self.records
        if len(records) == 1 and records[0].__class__ is memoryview:
            return records[0]  # type: ignore[return-value]
        return memoryview(bytearray().join(records))


def _partition_parser(cursor: PayloadCursor) -> Callable[[dict[str, Any]], ProducePartition]:
    """Decodes partition entries, each with its slice of the payload. The hot path: well-typed
    fields cost one class comparison; the field helpers only run to name what is wrong."""

    def parse(p: dict[str, Any]) -> ProducePartition:
        size, partition, epoch = p.get("size"), p.get("partition"), p.get("current_leader_epoch", NO_LEADER_EPOCH)
        if size.__class__ is not int or size < 0:
            size = non_negative(p, "size")
        records = cursor.take(size)
        partition_error = None
        if partition.__class__ is not int:
            partition, partition_error = entry_field(p, "partition", int, -1)
        if epoch.__class__ is not int:
            epoch = field(p, "current_leader_epoch", int, NO_LEADER_EPOCH)
        return ProducePartition(partition, (records,), epoch, partition_error)

    return parse


@message
class ProduceRequest(RequestMessage[ProduceResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.PRODUCE
    response_type: ClassVar[type[ProduceResponse]] = ProduceResponse
    wire_order: ClassVar[tuple[str, ...]] = ("acks", "timeout_ms", "topics")
    topics: tuple[TopicRequest[ProducePartition], ...] = wire(
        PayloadTopics(TopicRequest, ProducePartition, _partition_parser))
    acks: int = wire(INT, 1, check=one_of(ACKS, "acks must be -1, 0 or 1, got {value}", InvalidRequiredAcksError))
    timeout_ms: int = wire(INT, DEFAULT_PRODUCE_TIMEOUT_MS, check=NON_NEGATIVE)

    def payload(self) -> list[Part]:
        return [r for t in self.topics for p in t.partitions for r in p.records]
