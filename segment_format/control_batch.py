"""Control batches: the transaction markers a partition leader writes (Kafka's control records and
EndTransactionMarker, in pymq's Arrow format).

A marker is a one-record batch with the standard body schema, CONTROL_BIT and TRANSACTIONAL_BIT
set in the header, the producer id and epoch of the transaction it ends, base_sequence -1, and

    key   (4 bytes, big-endian)  int16 version = 0, int16 type (0 ABORT, 1 COMMIT)
    value (6 bytes, big-endian)  int16 version = 0, int32 coordinator_epoch

(Kafka's ControlRecordType key and EndTransactionMarker value bytes). Only brokers write them:
`record.validate_batch` refuses a control batch from a producer. Readers skip control batches
(`is_control`): they hold no data; a read_committed reader drops the aborted transaction's
batches they end (collect_aborted_transactions).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import pyarrow as pa

from common.errors import CorruptMessageError
from segment_format import record
from segment_format.batch_body import make_body

ABORT = 0
COMMIT = 1
CONTROL_ATTRIBUTES = record.CONTROL_BIT | record.TRANSACTIONAL_BIT
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_VERSION = 0


class EndTransactionMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def is_control(header: record.BatchHeader) -> bool:
    return bool(header.attributes & record.CONTROL_BIT)


def encode_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                  timestamp_ms: int) -> bytearray:
    """The marker batch (base offset 0: the leader patches it as any batch it appends)."""
    key = _KEY.pack(_VERSION, COMMIT if commit else ABORT)
    value = _VALUE.pack(_VERSION, coordinator_epoch)
    body = make_body([value], keys=[key], timestamps_ms=timestamp_ms)
    return record.encode_batch(body, attributes=CONTROL_ATTRIBUTES, producer_id=producer_id,
                               producer_epoch=producer_epoch, base_sequence=-1)


def decode_marker(buf: bytes | bytearray | memoryview, pos: int = 0) -> EndTransactionMarker:
    """The marker of the control batch at `pos`. CorruptMessageError if it is not one."""
    header = record.read_header(buf, pos)
    if not is_control(header) or header.record_count != 1:
        raise CorruptMessageError(f"batch at byte {pos}: not a one-record control batch")
    body = record.decode_body(buf, header, pos)
    return marker_of(body, pos)


def marker_of(body: pa.RecordBatch, pos: int = 0) -> EndTransactionMarker:
    key, value = body.column("key")[0].as_py(), body.column("value")[0].as_py()
    if key is None or value is None or len(key) != _KEY.size or len(value) < _VALUE.size:
        raise CorruptMessageError(f"control batch at byte {pos}: key {key!r} and value {value!r} are not a marker")
    key_version, kind = _KEY.unpack(key)
    value_version, coordinator_epoch = _VALUE.unpack_from(value)
    if key_version != _VERSION or value_version != _VERSION or kind not in (ABORT, COMMIT):
        raise CorruptMessageError(f"control batch at byte {pos}: unknown control record (key version "
                                  f"{key_version}, type {kind}, value version {value_version})")
    return EndTransactionMarker(kind == COMMIT, coordinator_epoch)
