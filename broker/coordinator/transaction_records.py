"""The records of `__transaction_state`: one per transactional id, what the transaction coordinator
writes and replays (docs/exactly-once.md).

The topic is compacted: the latest value per key is the transactional id's state.

    key   = msgpack ["t", transactional_id]
    value = msgpack {v: 0, producer_id, producer_epoch, timeout_ms, state, partitions: [[topic, p], ...],
                     start_ms, update_ms, label, last_label, last_committed, last_epoch}, or null
                     (the id expired)

`state` is a `TxnState` name. `label` is what the current transaction was prepared with (two-phase
commit); `last_label` and `last_committed` say how the previous one ended (InitProducerId answers
them). `last_epoch` is the epoch before the producer's own last bump (Kafka's lastProducerEpoch),
-1 after anything else: a retried bump whose answer was lost is recognised by it. A value
without it (written before it existed) reads as -1. A value's `v` lets later versions add
fields; a reader refuses a newer version.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from common.errors import CorruptMessageError, InvalidRequestError
from common.topic_partition import TopicPartition
from protocol.messages.transactions import LABEL_MAX_BYTES

TRANSACTION_STATE_TOPIC = "__transaction_state"
KIND = "t"
VALUE_VERSION = 0
TRANSACTIONAL_ID_MAX_BYTES = 32_767  # Kafka's STRING (int16 length)


class TxnState(enum.Enum):
    """Kafka's TransactionState, plus PREPARED: prepared by its producer, waiting for its owner's
    commit or abort (two-phase commit); it never times out."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARED = "Prepared"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def open(self) -> bool:
        """A transaction is in progress: its partitions hold data no decision covers yet."""
        return self in (TxnState.ONGOING, TxnState.PREPARED)

    @property
    def completing(self) -> bool:
        """Decided; its markers are being written."""
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """One transactional id's state, as stored."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    start_ms: int = -1  # when the current transaction added its first partition
    update_ms: int = -1
    label: str | None = None
    last_label: str | None = None
    last_committed: bool | None = None
    last_epoch: int = -1  # the epoch the producer's own last bump (InitProducerId) left

    def but(self, **changes: Any) -> "TxnMetadata":
        return replace(self, **changes)


def check_transactional_id(transactional_id: str) -> None:
    if not transactional_id:
        raise InvalidRequestError("the transactional id must not be empty")
    if len(transactional_id.encode("utf-8", "surrogatepass")) > TRANSACTIONAL_ID_MAX_BYTES:
        raise InvalidRequestError(f"the transactional id is longer than {TRANSACTIONAL_ID_MAX_BYTES} UTF-8 bytes")


def check_label(label: str | None) -> None:
    if label is not None and len(label.encode("utf-8", "surrogatepass")) > LABEL_MAX_BYTES:
        raise InvalidRequestError(f"a transaction's label is at most {LABEL_MAX_BYTES} UTF-8 bytes")


class TxnRecordSerde:
    """The runtime's RecordSerde for `__transaction_state`: key = transactional id, value = TxnMetadata."""

    def serialize(self, key: str, value: TxnMetadata | None) -> tuple[bytes, bytes | None]:
        key_bytes = msgpack.packb([KIND, key])
        if value is None:
            return key_bytes, None
        return key_bytes, msgpack.packb({
            "v": VALUE_VERSION, "producer_id": value.producer_id, "producer_epoch": value.producer_epoch,
            "timeout_ms": value.timeout_ms, "state": value.state.value,
            "partitions": sorted([t, p] for t, p in value.partitions), "start_ms": value.start_ms,
            "update_ms": value.update_ms, "label": value.label, "last_label": value.last_label,
            "last_committed": value.last_committed, "last_epoch": value.last_epoch,
        })

    def deserialize(self, key: bytes | None, value: bytes | None) -> tuple[str, TxnMetadata | None]:
        try:
            kind, transactional_id = msgpack.unpackb(key) if key is not None else (None, None)
            if kind != KIND or not isinstance(transactional_id, str):
                raise ValueError(f"not a transaction key: {key!r}")
            if value is None:
                return transactional_id, None
            fields = msgpack.unpackb(value)
            if fields["v"] > VALUE_VERSION:
                raise ValueError(f"value version {fields['v']} is newer than this broker reads ({VALUE_VERSION})")
            return transactional_id, TxnMetadata(
                transactional_id, fields["producer_id"], fields["producer_epoch"], fields["timeout_ms"],
                TxnState(fields["state"]), frozenset((t, p) for t, p in fields["partitions"]), fields["start_ms"],
                fields["update_ms"], fields["label"], fields["last_label"], fields["last_committed"],
                fields.get("last_epoch", -1))
        except (ValueError, TypeError, KeyError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
            raise CorruptMessageError(f"unreadable {TRANSACTION_STATE_TOPIC} record: {err}") from None
