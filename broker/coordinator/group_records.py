"""The records of `__consumer_offsets`: what the group coordinator writes and replays (docs/architecture.md, Coordinator).

The topic is compacted, so every record is keyed and the latest value per key is the state:

    key   = msgpack [kind, group_id, ...]
      OFFSET_KIND ("o"): ["o", group_id, topic, partition]      one committed offset
      GROUP_KIND  ("g"): ["g", group_id]                        one group's metadata
    value = msgpack map (below), or null: a tombstone (the offset or group was deleted)

    offset value = {v: 0, offset, leader_epoch, metadata, commit_timestamp}
    group value  = {v: 0, protocol_type, generation, protocol, leader, state_timestamp,
                    members: [{member_id, group_instance_id, client_id, session_timeout_ms,
                               rebalance_timeout_ms, subscription: bin, assignment: bin}]}

A TxnOffsetCommit's offset records are the same records in a transactional batch of the
producer (header producer id and epoch, TRANSACTIONAL bit): pending until the transaction's
marker (a control batch in the same partition) commits or aborts them (`group_coordinator`).

Keys put the group first, so one group's records hash to the same partition of the topic
(`partition_for`, Kafka's `abs(groupId.hashCode) % offsets.topic.num.partitions`) and the
compacted topic keeps one record per (group, partition) and per group. A value's `v` lets later
versions add fields; a reader refuses a newer version it cannot read instead of guessing.

Pure: bytes in, values out. The coordinator turns requests into these records; the runtime
appends them, and replays them (`decode_record`) when it takes over a partition of the topic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from common.errors import CorruptMessageError, InvalidGroupIdError

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KIND = "o"
GROUP_KIND = "g"
VALUE_VERSION = 0


# Kafka's protocol carries a group id as a STRING (int16 length): at most 32,767 UTF-8 bytes. msgpack
# has no such bound, so the coordinator sets it, before any work whose cost grows with the id.
GROUP_ID_MAX_BYTES = 32_767


def _powers_of_31(count: int) -> np.ndarray:
    """31**k mod 2**64 for k < count (uint64 products wrap mod 2**64)."""
    return np.cumprod(np.concatenate(([1], np.full(count - 1, 31))).astype(np.uint64), dtype=np.uint64)


# Every position an id within the bound can have (one UTF-16 unit per UTF-8 byte at most).
_POWERS = _powers_of_31(GROUP_ID_MAX_BYTES)


def check_group_id(group_id: str) -> None:
    """INVALID_GROUP_ID, as Kafka answers, for an id no group can have: empty, or longer than its
    protocol could carry."""
    if not group_id:
        raise InvalidGroupIdError("the group id must not be empty")
    if len(group_id) > GROUP_ID_MAX_BYTES or len(group_id.encode("utf-8", "surrogatepass")) > GROUP_ID_MAX_BYTES:
        raise InvalidGroupIdError(f"the group id is longer than {GROUP_ID_MAX_BYTES} UTF-8 bytes")


def partition_for(group_id: str, partitions: int) -> int:
    """The partition of `__consumer_offsets` that holds `group_id` (its leader coordinates the
    group): Java's String.hashCode, made non-negative as Kafka's Utils.abs does, modulo the
    partition count. Stable across processes and machines, unlike Python's salted `hash`.

    hashCode is sum(unit[i] * 31**(n-1-i)) mod 2**32 over the UTF-16 units: computed with numpy in
    a few calls, whatever the id's length (a loop per character kept the event loop for seconds
    on long ids). uint64 products and sums wrap mod 2**64, which keeps them right mod 2**32."""
    units = np.frombuffer(group_id.encode("utf-16-be", "surrogatepass"), dtype=">u2").astype(np.uint64)
    powers = _POWERS if len(units) <= len(_POWERS) else _powers_of_31(len(units))  # ids stored before the bound
    h = int(np.dot(units, powers[:len(units)][::-1])) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group_id: str


RecordKey = OffsetKey | GroupKey


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed position: the next offset to consume, with the leader epoch of the record before
    it (-1 unknown), the committer's metadata string, and when it was committed (expiry).

    `log_order` is not stored: the coordinator numbers the offset records in the order they go to
    (and replay from) the log, Kafka's appendedBatchOffset, so that a transaction's commit
    marker does not set back an offset committed after the transaction's offsets were written."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp: int = 0
    log_order: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes  # the member's metadata for the group's chosen protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class StoredGroup:
    """A group as of its last completed rebalance (or its becoming empty)."""

    protocol_type: str | None
    generation: int
    protocol: str | None
    leader: str | None
    state_timestamp: int
    members: tuple[StoredMember, ...]


RecordValue = CommittedOffset | StoredGroup | None


def encode_key(key: RecordKey) -> bytes:
    if isinstance(key, OffsetKey):
        return msgpack.packb([OFFSET_KIND, key.group_id, key.topic, key.partition])
    return msgpack.packb([GROUP_KIND, key.group_id])


def encode_value(value: RecordValue) -> bytes | None:
    """The record value; None for a tombstone."""
    if value is None:
        return None
    if isinstance(value, CommittedOffset):
        return msgpack.packb({"v": VALUE_VERSION, "offset": value.offset, "leader_epoch": value.leader_epoch,
                              "metadata": value.metadata, "commit_timestamp": value.commit_timestamp})
    return msgpack.packb({
        "v": VALUE_VERSION, "protocol_type": value.protocol_type, "generation": value.generation,
        "protocol": value.protocol, "leader": value.leader, "state_timestamp": value.state_timestamp,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                     "session_timeout_ms": m.session_timeout_ms, "rebalance_timeout_ms": m.rebalance_timeout_ms,
                     "subscription": m.subscription, "assignment": m.assignment} for m in value.members],
    })


def decode_record(key: bytes | None, value: bytes | None) -> tuple[RecordKey, RecordValue]:
    """One replayed record. CorruptMessageError for anything this version did not write: replay
    must not guess at the state of a group."""
    try:
        return _decode_key(key), _decode_value(key, value)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as err:
        raise CorruptMessageError(f"{OFFSETS_TOPIC} record cannot be read: {err}") from err


class GroupRecordSerde:
    """The bytes of `__consumer_offsets` records, for the coordinator runtime (`runtime.RecordSerde`)."""

    @staticmethod
    def serialize(key: RecordKey, value: RecordValue) -> tuple[bytes, bytes | None]:
        return encode_key(key), encode_value(value)

    @staticmethod
    def deserialize(key: bytes | None, value: bytes | None) -> tuple[RecordKey, RecordValue]:
        return decode_record(key, value)


def _decode_key(key: bytes | None) -> RecordKey:
    if key is None:
        raise ValueError("record without a key")
    parts = msgpack.unpackb(key)
    if not isinstance(parts, list) or not parts:
        raise ValueError("key is not a list")
    if parts[0] == OFFSET_KIND and len(parts) == 4:
        return OffsetKey(_str(parts[1]), _str(parts[2]), _int(parts[3]))
    if parts[0] == GROUP_KIND and len(parts) == 2:
        return GroupKey(_str(parts[1]))
    raise ValueError(f"unknown key {parts[:1]!r}")


def _decode_value(key: bytes | None, value: bytes | None) -> RecordValue:
    if value is None:
        return None
    raw = msgpack.unpackb(value)
    if not isinstance(raw, dict) or raw.get("v") != VALUE_VERSION:
        raise ValueError(f"value version {raw.get('v') if isinstance(raw, dict) else '?'} is not {VALUE_VERSION}")
    if "offset" in raw:
        return CommittedOffset(_int(raw["offset"]), _int(raw["leader_epoch"]), _opt_str(raw["metadata"]),
                               _int(raw["commit_timestamp"]))
    members = tuple(StoredMember(_str(m["member_id"]), _opt_str(m["group_instance_id"]), _str(m["client_id"]),
                                 _int(m["session_timeout_ms"]), _int(m["rebalance_timeout_ms"]),
                                 _bytes(m["subscription"]), _bytes(m["assignment"]))
                    for m in raw["members"])
    return StoredGroup(_opt_str(raw["protocol_type"]), _int(raw["generation"]), _opt_str(raw["protocol"]),
                       _opt_str(raw["leader"]), _int(raw["state_timestamp"]), members)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an int, got {type(value).__name__}")
    return value


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"expected bytes, got {type(value).__name__}")
    return value
