"""Record batch codec: the one format on the wire, on disk and in object storage (DESIGN.md section 2).

A record batch is a fixed 61-byte little-endian header followed by an Arrow IPC stream holding
exactly one record batch:

    offset size field
    0      8    base_offset (int64)            written by the partition leader when it appends
    8      4    batch_length (int32)           bytes after this field
    12     4    partition_leader_epoch (int32) written by the leader
    16     1    magic (int8) = 1
    17     4    crc (uint32)                   CRC32C of bytes 21..end, so the leader can rewrite
                                               base_offset and epoch without recomputing it
    21     2    attributes (int16)             bit 3 timestamp type (0 create, 1 log-append),
                                               bit 4 transactional, bit 5 control; others reserved
    23     4    last_offset_delta (int32)      record_count - 1
    27     8    base_timestamp (int64, ms)     smallest record timestamp
    35     8    max_timestamp (int64, ms)      largest record timestamp
    43     8    producer_id (int64)            -1 when none
    51     2    producer_epoch (int16)
    53     4    base_sequence (int32)
    57     4    record_count (int32)
    61     ...  body: Arrow IPC stream (schema + one record batch), lz4_frame or zstd buffer compression

Body schema: key binary, value binary, timestamp timestamp[ms, UTC], headers
list<struct<key string, value binary>>; offsets are implicit (record i has base_offset + i).

This module is pure: bytes in, values out, no I/O. The broker only calls `validate_batch` and
`patch_offsets` (it never decodes a body); clients call `encode_batch` and `decode_batch`.
"""
from __future__ import annotations

import functools
import struct
import time
from dataclasses import dataclass
from typing import Iterator, Literal, NamedTuple

import crc32c as _crc32c
import numpy as np
import pyarrow as pa

from broker.errors import CorruptMessageError, MessageTooLargeError

HEADER = struct.Struct("<qiibIhiqqqhii")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 61
LENGTH_PREFIX = 12  # base_offset + batch_length: the bytes not counted in batch_length
CRC_START = 21
MAGIC = 1
_CRC = struct.Struct("<I")
_OFFSET_AND_LENGTH = struct.Struct("<qi")
_EPOCH = struct.Struct("<i")
_IPC_CONTINUATION = b"\xff\xff\xff\xff"

TIMESTAMP_TYPE_BIT = 1 << 3
TRANSACTIONAL_BIT = 1 << 4
CONTROL_BIT = 1 << 5
_KNOWN_ATTRIBUTE_BITS = TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
BODY_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("headers", HEADERS_TYPE),
    ]
)

Compression = Literal["none", "lz4", "zstd"]
COMPRESSIONS: tuple[str, ...] = ("none", "lz4", "zstd")
_WRITE_OPTIONS = {
    "none": pa.ipc.IpcWriteOptions(),
    "lz4": pa.ipc.IpcWriteOptions(compression="lz4"),
    "zstd": pa.ipc.IpcWriteOptions(compression="zstd"),
}


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch: the unit of every record timestamp."""
    return time.time_ns() // 1_000_000


@functools.cache
def warm_up() -> None:
    """Load Arrow's time-zone database now: the first cast to timestamp[ms, UTC] costs ~200 ms,
    which clients would otherwise add to their first record's latency."""
    pa.array([0], pa.int64()).cast(TIMESTAMP_TYPE)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded 61-byte header of one record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies (header + body)."""
        return LENGTH_PREFIX + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def null_headers(n: int) -> pa.ListArray:
    """A headers column of `n` nulls with an empty child array.

    `pa.nulls(n, HEADERS_TYPE)` gives its child struct n hidden elements, which Arrow IPC then
    writes out in full (about 12 bytes per record of nothing). Served as a zero-copy slice of a
    shared column (IPC writes only the slice), since nearly every batch needs one.
    """
    global _shared_null_headers
    shared = _shared_null_headers
    if shared is None or len(shared) < n:
        if n > _NULL_HEADERS_SHARED_MAX:
            return _build_null_headers(n)
        shared = _shared_null_headers = _build_null_headers(max(n, 1024, 2 * len(shared or ())))
    return shared.slice(0, n)


def _build_null_headers(n: int) -> pa.ListArray:
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)),
        pa.array([], HEADERS_TYPE.value_type),
        type=HEADERS_TYPE,
        mask=pa.array(np.ones(n, dtype=bool)),
    )


_NULL_HEADERS_SHARED_MAX = 1 << 20
_shared_null_headers: pa.ListArray | None = None  # built on first use: the broker never needs one


def make_body(
    values: pa.Array | list,
    keys: pa.Array | list | None = None,
    timestamps_ms: pa.Array | list | int | None = None,
    headers: pa.Array | list | None = None,
) -> pa.RecordBatch:
    """Build a body RecordBatch in the standard schema from columns (Arrow arrays or Python lists).

    `timestamps_ms` may be one int for every record; None means all null keys / headers.
    """
    values = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    n = len(values)
    if keys is None:
        keys = pa.nulls(n, pa.binary())
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.binary())
    if timestamps_ms is None or isinstance(timestamps_ms, int):
        ts = now_ms() if timestamps_ms is None else timestamps_ms
        timestamps = pa.array(np.full(n, ts, dtype=np.int64))
    elif isinstance(timestamps_ms, pa.Array):
        timestamps = timestamps_ms
    else:
        timestamps = pa.array(timestamps_ms, TIMESTAMP_TYPE)
    if timestamps.type != TIMESTAMP_TYPE:
        timestamps = timestamps.cast(TIMESTAMP_TYPE)
    if headers is None:
        headers = null_headers(n)
    elif not isinstance(headers, pa.Array):
        headers = pa.array(headers, HEADERS_TYPE)
    return pa.RecordBatch.from_arrays([keys, values, timestamps, headers], schema=BODY_SCHEMA)


def encode_body(body: pa.RecordBatch, compression: str = "none") -> pa.Buffer:
    """Serialize `body` as an Arrow IPC stream (schema + one batch) with buffer compression."""
    try:
        options = _WRITE_OPTIONS[compression]
    except KeyError:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}") from None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, body.schema, options=options) as writer:
        writer.write_batch(body)
    return sink.getvalue()


class EncodedBatch(NamedTuple):
    """One encoded record batch as its two buffers: the 61-byte header, then the IPC body.

    Kept apart for writers that take a list of buffers (socket `writelines`): joining them would
    copy every body once more only to put 61 bytes in front of it."""

    header: bytearray
    body: memoryview

    @property
    def size(self) -> int:
        return len(self.header) + len(self.body)

    def join(self) -> bytearray:
        """The batch as one buffer (callers that patch or slice it)."""
        out = bytearray(self.size)
        out[:HEADER_SIZE] = self.header
        out[HEADER_SIZE:] = self.body
        return out


def encode_batch(body: pa.RecordBatch, *, compression: str = "none", **header_fields: int) -> bytearray:
    """Encode one record batch as one buffer: header + IPC body, CRC32C over bytes 21..end.
    Returns a bytearray so callers can patch offsets in place. See `encode_batch_parts`."""
    return encode_batch_parts(body, compression=compression, **header_fields).join()


def encode_batch_parts(body: pa.RecordBatch, *, compression: str = "none", **header_fields: int) -> EncodedBatch:
    """Encode one record batch as header and IPC body without joining them.

    `header_fields` are frame_parts's optional header fields (base_offset, partition_leader_epoch,
    attributes, producer_id, producer_epoch, base_sequence). The body must have at least one row
    and no null timestamp.
    """
    count = body.num_rows
    if count == 0:
        raise ValueError("a record batch holds at least one record")
    ts = body.column("timestamp")
    if ts.null_count:
        raise ValueError("record timestamps must not be null")
    millis = ts.view(pa.int64()).to_numpy()
    return frame_parts(encode_body(body, compression), record_count=count, base_timestamp=int(millis.min()),
                       max_timestamp=int(millis.max()), **header_fields)


def frame_body(ipc_body: pa.Buffer | bytes, **header_fields: int) -> bytearray:
    """Put the 61-byte header in front of an already-serialized IPC body, as one buffer."""
    return frame_parts(ipc_body, **header_fields).join()


def frame_parts(
    ipc_body: pa.Buffer | bytes,
    *,
    record_count: int,
    base_timestamp: int,
    max_timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> EncodedBatch:
    """The 61-byte header for an already-serialized IPC body, CRC computed over both in place."""
    body = memoryview(ipc_body).cast("B")
    header = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        header, 0, base_offset, HEADER_SIZE + len(body) - LENGTH_PREFIX, partition_leader_epoch, MAGIC, 0,
        attributes, record_count - 1, base_timestamp, max_timestamp, producer_id, producer_epoch,
        base_sequence, record_count,
    )
    crc = _crc32c.crc32c(body, _crc32c.crc32c(memoryview(header)[CRC_START:]))
    _CRC.pack_into(header, 17, crc)
    return EncodedBatch(header, body)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at `pos` without checking the CRC. Raises CorruptMessageError if short."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptMessageError(f"truncated batch header at byte {pos}")
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int) -> int | None:
    """Total size of the batch starting at `pos` from its length field, or None if fewer than 12
    bytes remain. Cheap: used to walk a buffer of concatenated batches."""
    if len(buf) - pos < LENGTH_PREFIX:
        return None
    return LENGTH_PREFIX + _OFFSET_AND_LENGTH.unpack_from(buf, pos)[1]


def validate_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, max_batch_bytes: int | None = None
) -> BatchHeader:
    """Check one batch at `pos` completely except for decoding its body, and return its header.

    Checks: header present, magic, length in bounds and fully present, reserved attribute bits,
    record_count / last_offset_delta agreement, timestamps ordered, the body starts as an Arrow IPC
    stream, and the CRC. Raises CorruptMessageError (or MessageTooLargeError past the limit)
    naming the field that failed.
    """
    header = read_header(buf, pos)
    if header.magic != MAGIC:
        raise CorruptMessageError(f"batch at byte {pos}: magic {header.magic}, expected {MAGIC}")
    size = header.size
    if header.batch_length < HEADER_SIZE - LENGTH_PREFIX + len(_IPC_CONTINUATION):
        raise CorruptMessageError(f"batch at byte {pos}: batch_length {header.batch_length} too small")
    if pos + size > len(buf):
        raise CorruptMessageError(
            f"batch at byte {pos}: batch_length says {size} bytes, only {len(buf) - pos} present"
        )
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise MessageTooLargeError(f"batch of {size} bytes exceeds max.message.bytes {max_batch_bytes}")
    if header.attributes & ~_KNOWN_ATTRIBUTE_BITS:
        raise CorruptMessageError(f"batch at byte {pos}: reserved attribute bits set ({header.attributes:#x})")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise CorruptMessageError(
            f"batch at byte {pos}: record_count {header.record_count} does not match "
            f"last_offset_delta {header.last_offset_delta}"
        )
    if header.max_timestamp < header.base_timestamp:
        raise CorruptMessageError(f"batch at byte {pos}: max_timestamp before base_timestamp")
    view = memoryview(buf)
    if view[pos + HEADER_SIZE : pos + HEADER_SIZE + 4] != _IPC_CONTINUATION:
        raise CorruptMessageError(f"batch at byte {pos}: body is not an Arrow IPC stream")
    crc = _crc32c.crc32c(view[pos + CRC_START : pos + size])
    if crc != header.crc:
        raise CorruptMessageError(f"batch at byte {pos}: CRC {crc:#010x} != stored {header.crc:#010x}")
    return header


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each complete batch in a buffer of concatenated batches.

    A partial batch at the end is skipped silently: fetch responses may end mid-batch by design.
    With `verify`, every yielded batch passed `validate_batch`.
    """
    pos, end = 0, len(buf)
    while True:
        size = batch_size_at(buf, pos)
        if size is None or size < HEADER_SIZE or pos + size > end:
            if size is not None and size < HEADER_SIZE:
                raise CorruptMessageError(f"batch at byte {pos}: batch_length {size - LENGTH_PREFIX} too small")
            return
        header = validate_batch(buf, pos) if verify else read_header(buf, pos)
        yield pos, header
        pos += size


def patch_offsets(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Rewrite base_offset and partition_leader_epoch in place; the CRC stays valid by design."""
    struct.pack_into("<q", buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + 12, leader_epoch)


def stamp_log_append_time(buf: bytearray | memoryview, pos: int, header: BatchHeader, base_offset: int,
                          leader_epoch: int, now_ms: int) -> None:
    """Rewrite a header for LogAppendTime in place: offsets, epoch, the timestamp-type bit, base
    and max timestamp = now, and the CRC (which covers attributes and timestamps). Readers take
    every record's timestamp from the header for such batches, so the body is left untouched."""
    fields = [
        base_offset, header.batch_length, leader_epoch, header.magic, 0,
        header.attributes | TIMESTAMP_TYPE_BIT, header.last_offset_delta, now_ms, now_ms,
        header.producer_id, header.producer_epoch, header.base_sequence, header.record_count,
    ]
    HEADER.pack_into(buf, pos, *fields)
    _CRC.pack_into(buf, pos + 17, _crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.size]))


def decode_body(buf: bytes | bytearray | memoryview | pa.Buffer, header: BatchHeader, pos: int = 0) -> pa.RecordBatch:
    """Decode the Arrow body of the batch at `pos` (zero-copy over `buf` when uncompressed)."""
    body = pa.py_buffer(buf) if not isinstance(buf, pa.Buffer) else buf
    body = body.slice(pos + HEADER_SIZE, header.size - HEADER_SIZE)
    try:
        reader = pa.ipc.open_stream(body)
        if not reader.schema.equals(BODY_SCHEMA):
            raise CorruptMessageError(f"batch at offset {header.base_offset}: body schema is not the record schema")
        batch = reader.read_next_batch()
        # A CRC only proves the producer's bytes arrived intact, not that they are valid Arrow: a
        # structurally broken body could crash the reader later, so check it fully here.
        batch.validate(full=True)
    except (pa.ArrowException, MemoryError, StopIteration, OSError) as err:
        raise CorruptMessageError(f"batch at offset {header.base_offset}: bad Arrow body: {err}") from err
    if batch.num_rows != header.record_count:
        raise CorruptMessageError(
            f"batch at offset {header.base_offset}: body has {batch.num_rows} rows, header says {header.record_count}"
        )
    return batch


def decode_batch(buf: bytes | bytearray | memoryview, pos: int = 0, *, verify: bool = True) -> tuple[BatchHeader, pa.RecordBatch]:
    """Validate (optionally) and decode the batch at `pos`: its header and Arrow body."""
    header = validate_batch(buf, pos) if verify else read_header(buf, pos)
    return header, decode_body(buf, header, pos)
