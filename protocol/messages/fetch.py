"""Fetch (API key 1): read record batches from partitions, waiting up to `max_wait_ms` for
`min_bytes` of them.

    request  control = {max_wait_ms, min_bytes, max_bytes, topics: [{name, topic_id?, partitions:
                        [{partition, fetch_offset, max_bytes, current_leader_epoch}]}], replica_id?,
                        isolation_level?}
    response control = {error_code, topics: [{name, partitions: [{partition, error_code,
                        error_message?, high_watermark, log_start_offset, last_stable_offset?,
                        aborted_transactions?: [{producer_id, first_offset}], size}]}]}
             payload = each partition's record bytes, back to back in the order of the entries

`replica_id` is set (>= 0) only by a follower broker fetching from its leader (the replica-fetch
API, as in Kafka's Fetch): it reads up to the leader's log end instead of the high watermark, and
its fetch offset tells the leader how far it has replicated. Consumers leave it out (-1).

`isolation_level` (Kafka's): 0 read_uncommitted (the default, left out on the wire) reads up to
the high watermark; 1 read_committed reads up to the last stable offset (no record of a transaction
still open) and each partition answers `last_stable_offset` and `aborted_transactions`, the (producer id, first offset) of
every aborted transaction its records may hold: the reader drops that producer's batches from the
first offset up to its ABORT marker. Control batches (markers) come with the records; readers skip
them. A follower's fetch ignores the isolation level.

Response entries mirror the request's. On the broker a partition's records are a segment range
(`broker.log.FetchSlice`, sent with sendfile); decoded by a client they are a view of its slice of
the payload, split here, so handlers and clients never count bytes themselves.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

from common.errors import PymqError
from protocol.fields import non_negative
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Part,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    TopicResponses,
    entry_error,
    part_size,
)
from protocol.schema import (
    INT,
    Check,
    Entries,
    PayloadCursor,
    PayloadSize,
    PayloadTopics,
    Topics,
    message,
    one_of,
    wire,
)

CONSUMER_REPLICA_ID = -1  # a Fetch from a consumer, not a follower broker
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}  # Kafka's names
ISOLATION_LEVEL = one_of((READ_UNCOMMITTED, READ_COMMITTED),
                         "isolation_level is 0 (read_uncommitted) or 1 (read_committed), got {value}")


@message
class AbortedTransaction:
    producer_id: int = wire(INT)
    first_offset: int = wire(INT)


@message
class FetchPartitionResponse(PartitionResponse):
    """`records` travel in the payload; the control map says only their `size`."""

    high_watermark: int = wire(INT, -1)
    log_start_offset: int = wire(INT, -1)
    records: Part = wire(PayloadSize(part_size), b"", key="size", payload=True)
    last_stable_offset: int = wire(INT, -1, omit=-1)  # answered to read_committed fetches only
    aborted_transactions: tuple[AbortedTransaction, ...] = wire(Entries(AbortedTransaction), (), omit=())


def _partition_parser(cursor: PayloadCursor) -> Callable[[dict[str, Any]], FetchPartitionResponse]:
    """Each partition's records are a view of its slice of the payload."""
    return lambda p: FetchPartitionResponse.from_control(p, records=cursor.take(non_negative(p, "size", 0)))


@message
class FetchResponse(TopicResponses):
    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    topics: tuple[TopicResponse[FetchPartitionResponse], ...] = wire(
        PayloadTopics(TopicResponse, FetchPartitionResponse, _partition_parser))

    def payload(self) -> list[Part]:
        return [p.records for t in self.topics for p in t.partitions if part_size(p.records)]


@message
class FetchPartition:
    """`max_bytes` None: the request's. `error` is set when the entry itself is malformed."""

    partition: int = wire(INT, entry=True, placeholder=-1)
    fetch_offset: int = wire(INT)
    max_bytes: int | None = wire(INT, None)
    current_leader_epoch: int = wire(INT, NO_LEADER_EPOCH)
    error: PymqError | None = entry_error()


@message
class FetchRequest(RequestMessage[FetchResponse]):
    """`max_bytes` None: the broker's fetch.max.bytes. The broker bounds the wait and the sizes
    (they are its policy, not the request's validity): negative waits count as 0. `replica_id`
    is on the wire only when set, so consumers send the bytes they always did."""

    api_key: ClassVar[ApiKey] = ApiKey.FETCH
    response_type: ClassVar[type[FetchResponse]] = FetchResponse
    wire_order: ClassVar[tuple[str, ...]] = ("max_wait_ms", "min_bytes", "max_bytes", "topics", "replica_id",
                                             "isolation_level")
    topics: tuple[TopicRequest[FetchPartition], ...] = wire(Topics(TopicRequest, FetchPartition))
    max_wait_ms: int = wire(INT, 0)
    min_bytes: int = wire(INT, 1)
    max_bytes: int | None = wire(INT, None)
    replica_id: int = wire(INT, CONSUMER_REPLICA_ID, omit=CONSUMER_REPLICA_ID, check=Check(
        lambda v: v >= CONSUMER_REPLICA_ID, "replica_id is a broker id (>= 0) or -1 for a consumer, got {value}"))
    isolation_level: int = wire(INT, READ_UNCOMMITTED, omit=READ_UNCOMMITTED, check=ISOLATION_LEVEL)
