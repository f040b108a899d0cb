"""The producer snapshot format: a partition's producer state at an offset, as the broker writes
it at each segment roll and uploads it with each tiered segment (`{base}.snapshot`).

    offset size field
    0      4    magic b"PYPS"
    4      2    version (uint16) = 1
    6      4    crc (uint32): CRC32C of the payload
    10     ...  payload: msgpack array, one row per producer:
                [producer_id, epoch, last_timestamp, coordinator_epoch, txn_first_offset,
                 [[first_seq, last_seq, first_offset, last_offset], ...]]  (oldest batch first)

`txn_first_offset` is the first offset of the producer's transaction still open at the snapshot's
offset (-1: none). The broker keeps the state (broker/log/producer_state.py); readers of the tier
take what they need from the rows (`open_transactions`: a Spark read of the tier stops below a
transaction it cannot know the end of).
"""
from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import crc32c
import msgpack

MAGIC = b"PYPS"
VERSION = 1
_HEADER = struct.Struct("<4sHI")
NO_OFFSET = -1


class CorruptSnapshotError(ValueError):
    """A producer snapshot that is torn, of an unknown version, or fails its CRC: not a wire error
    (the broker falls back to an older snapshot or a replay)."""


def encode(rows: Iterable[list[Any]]) -> bytes:
    payload = msgpack.packb(list(rows))
    return _HEADER.pack(MAGIC, VERSION, crc32c.crc32c(payload)) + payload


def decode(data: bytes, where: str) -> list[list[Any]]:
    """The rows of a snapshot (see the module docstring). CorruptSnapshotError."""
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(f"{where}: {len(data)} bytes, too short for a producer snapshot")
    magic, version, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptSnapshotError(f"{where}: not a version {VERSION} producer snapshot (magic {magic!r}, version {version})")
    payload = memoryview(data)[_HEADER.size:]
    if crc32c.crc32c(payload) != crc:
        raise CorruptSnapshotError(f"{where}: CRC32C mismatch")
    try:
        rows = msgpack.unpackb(payload)
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 6 for r in rows):
            raise ValueError("not a list of producer rows")
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise CorruptSnapshotError(f"{where}: bad payload: {err}") from err
    return rows


def open_transactions(data: bytes, where: str) -> list[int]:
    """The first offsets of the transactions open at the snapshot's offset."""
    return [row[4] for row in decode(data, where) if row[4] != NO_OFFSET]
