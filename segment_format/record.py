"""Record batch codec: the one format on the wire, on disk and in object storage (docs/architecture.md, Record batch).

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
    23     4    last_offset_delta (int32)      record_count - 1, or the last offset_delta of a
                                               compacted batch
    27     8    base_timestamp (int64, ms)     smallest record timestamp
    35     8    max_timestamp (int64, ms)      largest record timestamp
    43     8    producer_id (int64)            -1 when none
    51     2    producer_epoch (int16)
    53     4    base_sequence (int32)
    57     4    record_count (int32)
    61     ...  body: Arrow IPC stream (schema message + one record batch message, then optionally
                the end-of-stream marker, which pymq does not write: the header frames the body),
                lz4_frame or zstd buffer compression

The body's schema, and building and writing bodies, live in `segment_format.batch_body`; its
optional last column offset_delta (compacted batches) gives record i the offset base_offset +
offset_delta[i] instead of base_offset + i (strictly increasing, the last = last_offset_delta).

This module is pure: bytes in, values out, no I/O. The broker only calls `validate_batch` and
`patch_offsets`; clients call `encode_batch` and `decode_batch`. `validate_batch` reads the
body's IPC structure at constant cost through `segment_format.arrow_ipc`; for a producer's batch
on the leader it also decodes the body and validates it in full (Arrow's kernels), so that what
the broker stores is what every reader can decode.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import CorruptMessageError, InvalidRecordError, InvalidTimestampError, MessageTooLargeError
from segment_format import arrow_ipc, body_template
from segment_format.batch_body import (
    BODY_SCHEMA,
    COMPACTED_BODY_SCHEMA,
    COMPACTED_LAYOUT,
    OFFSET_DELTA_FIELD,
    STANDARD_LAYOUT,
    BodyLayout,
    encode_body,
)
from segment_format.limits import INT64_MAX

HEADER = struct.Struct("<qiibIhiqqqhii")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 61
LENGTH_PREFIX = 12  # base_offset + batch_length: the bytes not counted in batch_length
CRC_START = 21
MAGIC = 1
_CRC = struct.Struct("<I")
_OFFSET_AND_LENGTH = struct.Struct("<qi")
_EPOCH = struct.Struct("<i")

TIMESTAMP_TYPE_BIT = 1 << 3
TRANSACTIONAL_BIT = 1 << 4
CONTROL_BIT = 1 << 5
_KNOWN_ATTRIBUTE_BITS = TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT


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
    if "offset_delta" in body.schema.names:
        header_fields["last_offset_delta"] = body.column("offset_delta")[-1].as_py()
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
    last_offset_delta: int | None = None,
) -> EncodedBatch:
    """The 61-byte header for an already-serialized IPC body, CRC computed over both in place.
    `last_offset_delta` defaults to record_count - 1 (a compacted body: its last offset_delta)."""
    body = memoryview(ipc_body).cast("B")
    header = bytearray(HEADER_SIZE)
    if last_offset_delta is None:
        last_offset_delta = record_count - 1
    HEADER.pack_into(
        header, 0, base_offset, HEADER_SIZE + len(body) - LENGTH_PREFIX, partition_leader_epoch, MAGIC, 0,
        attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
        base_sequence, record_count,
    )
    crc = _crc32c.crc32c(body, _crc32c.crc32c(memoryview(header)[CRC_START:]))
    _CRC.pack_into(header, 17, crc)
    return EncodedBatch(header, body)


_PRODUCER = struct.Struct("<qhi")  # producer_id, producer_epoch, base_sequence at byte 43
_ATTRIBUTES = struct.Struct("<h")  # at byte 21


def with_producer(batch: EncodedBatch, producer_id: int, producer_epoch: int, base_sequence: int,
                  attributes: int | None = None) -> EncodedBatch:
    """`batch` with other producer fields (an idempotent producer's batch given a new sequence
    after it was encoded), and `attributes` when given: a new header, its CRC computed again
    over the header and the body."""
    header = bytearray(batch.header)
    _PRODUCER.pack_into(header, 43, producer_id, producer_epoch, base_sequence)
    if attributes is not None:
        _ATTRIBUTES.pack_into(header, 21, attributes)
    crc = _crc32c.crc32c(batch.body, _crc32c.crc32c(memoryview(header)[CRC_START:]))
    _CRC.pack_into(header, 17, crc)
    return EncodedBatch(header, batch.body)


class TimestampBounds(NamedTuple):
    """A CreateTime topic's window for producer timestamps (KIP-937): a batch's base_timestamp
    may lie at most `before_max_ms` before the broker's clock, its max_timestamp at most
    `after_max_ms` after it (`message.timestamp.before.max.ms` / `.after.max.ms`)."""

    before_max_ms: int
    after_max_ms: int


class ProducerInput(NamedTuple):
    """Marks a batch as a producer's, as the leader appends it, with what its timestamps are
    judged against: the broker's clock and, on a CreateTime topic, its TimestampBounds (None on
    a LogAppendTime topic, whose timestamps the broker sets); and how many bytes its body may
    take once decompressed (`message.decompressed.max.bytes`)."""

    now_ms: int
    timestamp_bounds: TimestampBounds | None
    max_decompressed_bytes: int = INT64_MAX
    # The broker's own coordinator writes it (Kafka's COORDINATOR origin): a transactional batch
    # of a producer's offsets (TxnOffsetCommit) carries the producer's id and epoch but no sequence.
    coordinator: bool = False


# A body written by pymq (or pyarrow) opens with one of these two schema messages byte for byte.
_CANONICAL_SCHEMA_MESSAGES: dict[bytes, BodyLayout] = {
    layout.schema_message: layout for layout in (STANDARD_LAYOUT, COMPACTED_LAYOUT)
}
# Limits on the metadata the validator reads: pymq's are ~420 and ~500 bytes; other writers may
# add schema or batch metadata, but not without bound (decoding a schema must stay cheap).
SCHEMA_MESSAGE_MAX_BYTES = 16 << 10
RECORD_BATCH_METADATA_MAX_BYTES = 64 << 10
_LEARNED_SCHEMA_MESSAGES_MAX = 32


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


def complete_prefix(buf: bytes | bytearray | memoryview) -> int:
    """How many bytes at the start of `buf` are whole batches (by their length fields): a fetch
    response may end mid-batch by design, and a follower appends only the whole ones."""
    pos, end = 0, len(buf)
    while True:
        size = batch_size_at(buf, pos)
        if size is None or size < HEADER_SIZE or pos + size > end:
            return pos
        pos += size


def validate_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    max_batch_bytes: int | None = None,
    producer: ProducerInput | None = None,
    check_body: bool = True,
) -> BatchHeader:
    """Check the batch at `pos` and return its header.

    Without `producer`, constant cost per batch apart from the CRC, and no buffer is decoded:
    the header's fields (magic, length in bounds and fully present, reserved attribute bits,
    record_count / last_offset_delta, timestamps ordered), the CRC, then the body's Arrow IPC
    structure: a schema message equal to one of the two body schemas, and one record batch
    message whose row count, top-level field node lengths, null counts, buffers and codec agree
    with the header and the schema, ending exactly at the batch's end. A standard-schema batch
    has last_offset_delta == record_count - 1; a compacted one may have gaps (>=). Raises
    CorruptMessageError (MessageTooLargeError past `max_batch_bytes`).

    With `producer` (a leader's append of a producer's batches), the batch must also be one a
    producer may write (`_check_producer_batch`: else InvalidRecordError), its header's
    timestamps are checked (base_timestamp >= 0 and, with `timestamp_bounds` (CreateTime
    topics), inside the bounds around `now_ms`; else InvalidTimestampError), and its body is
    checked as every consumer will check it before it is stored (`_check_producer_body`):
    decompressed (at most `max_decompressed_bytes`, else MessageTooLargeError) and validated in
    full by Arrow, and its timestamp column's min and max equal to the header's claims. That
    part costs O(records) in Arrow's kernels (and decompression), constant Python per batch.
    Followers and recovery pass no `producer`: they keep what the leader wrote, compacted
    batches and timestamps included. Every error names the failing field and the batch's byte
    position.
    """
    header = read_header(buf, pos)
    _check_header(buf, pos, header, max_batch_bytes)
    view = memoryview(buf)
    if view.format != "B":
        view = view.cast("B")
    crc = _crc32c.crc32c(view[pos + CRC_START : pos + header.size])
    if crc != header.crc:
        raise CorruptMessageError(f"batch at byte {pos}: CRC {crc:#010x} != stored {header.crc:#010x}")
    if not check_body:
        return header
    body = view[pos + HEADER_SIZE : pos + header.size]
    layout, message = _check_body(body, pos, header)
    if producer is not None:
        _check_producer_batch(pos, header, layout, producer.coordinator)
        _check_timestamps(pos, header, producer.now_ms, producer.timestamp_bounds)
        _check_producer_body(body, pos, header, message, producer.max_decompressed_bytes)
    if not layout.compacted and header.last_offset_delta != header.record_count - 1:
        raise CorruptMessageError(
            f"batch at byte {pos}: last_offset_delta {header.last_offset_delta} != record_count "
            f"{header.record_count} - 1 (only a compacted body, with an offset_delta column, has offset gaps)"
        )
    return header


def _check_producer_batch(pos: int, header: BatchHeader, layout: BodyLayout, coordinator: bool = False) -> None:
    """What a producer may not write though the format allows it (Kafka's LogValidator): offsets
    that do not run contiguously over the records, whether through the header or through the
    offset_delta column only compaction writes (a forged range would consume offsets and later
    make the log cleaner give up on the partition), a producer id without an epoch and a
    sequence (or below -1, the "none"), the control bit, which only the broker's transaction
    machinery sets, and the transactional bit without a producer id. Raises InvalidRecordError."""
    where = f"batch at byte {pos}"
    if layout.compacted:
        raise InvalidRecordError(f"{where}: inconsistent batch offset range: a producer batch has the standard body "
                                 f"schema, not the compacted one with an {OFFSET_DELTA_FIELD.name} column")
    if header.last_offset_delta != header.record_count - 1:
        raise InvalidRecordError(f"{where}: inconsistent batch offset range: last_offset_delta "
                                 f"{header.last_offset_delta} != record_count {header.record_count} - 1")
    if header.producer_id >= 0:
        if header.producer_epoch < 0 or (header.base_sequence < 0 and not (coordinator and header.is_transactional)):
            raise InvalidRecordError(f"{where}: producer id {header.producer_id} needs a producer epoch and a base "
                                     f"sequence >= 0, not {header.producer_epoch} and {header.base_sequence}")
    elif header.producer_id != -1:
        raise InvalidRecordError(f"{where}: invalid producer id {header.producer_id} (-1: none)")
    if header.attributes & CONTROL_BIT:
        raise InvalidRecordError(f"{where}: clients are not allowed to write control batches "
                                 f"(attributes {header.attributes:#x})")
    if header.attributes & TRANSACTIONAL_BIT and header.producer_id < 0:
        raise InvalidRecordError(f"{where}: a transactional batch needs a producer id (attributes "
                                 f"{header.attributes:#x})")


def _check_header(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, max_batch_bytes: int | None) -> None:
    if header.magic != MAGIC:
        raise CorruptMessageError(f"batch at byte {pos}: magic {header.magic}, expected {MAGIC}")
    size = header.size
    if header.batch_length < HEADER_SIZE - LENGTH_PREFIX + len(arrow_ipc.CONTINUATION):
        raise CorruptMessageError(f"batch at byte {pos}: batch_length {header.batch_length} too small")
    if pos + size > len(buf):
        raise CorruptMessageError(
            f"batch at byte {pos}: batch_length says {size} bytes, only {len(buf) - pos} present"
        )
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise MessageTooLargeError(f"batch at byte {pos}: batch of {size} bytes exceeds max.message.bytes {max_batch_bytes}")
    if header.attributes & ~_KNOWN_ATTRIBUTE_BITS:
        raise CorruptMessageError(f"batch at byte {pos}: reserved attribute bits set ({header.attributes:#x})")
    if header.record_count < 1 or header.last_offset_delta < header.record_count - 1:
        raise CorruptMessageError(
            f"batch at byte {pos}: record_count {header.record_count} does not match "
            f"last_offset_delta {header.last_offset_delta}"
        )
    if header.max_timestamp < header.base_timestamp:
        raise CorruptMessageError(
            f"batch at byte {pos}: max_timestamp {header.max_timestamp} before base_timestamp {header.base_timestamp}"
        )


def _check_body(body: memoryview, pos: int, header: BatchHeader) -> tuple[BodyLayout, arrow_ipc.RecordBatchMessage]:
    """The body's IPC structure against the header (see validate_batch); its schema's layout and
    its record batch message."""
    try:
        schema_end = arrow_ipc.message_end(body, 0, "schema message", SCHEMA_MESSAGE_MAX_BYTES)
        encoded = bytes(body[:schema_end])
        layout = _CANONICAL_SCHEMA_MESSAGES.get(encoded) or _layout_of_schema_message(encoded)
        message = arrow_ipc.read_record_batch(body, schema_end, nodes=layout.nodes, buffers=layout.buffers,
                                              max_metadata_bytes=RECORD_BATCH_METADATA_MAX_BYTES, shapes=_known_shapes())
    except arrow_ipc.IpcFormatError as err:
        raise CorruptMessageError(f"batch at byte {pos}: {err}") from err
    rows = header.record_count
    if message.length != rows:
        raise CorruptMessageError(f"{_where(pos, message)}: length {message.length} rows != record_count {rows}")
    for index, name, nullable in layout.columns:
        length, null_count = message.node(index)
        if length != rows:
            raise CorruptMessageError(
                f"{_where(pos, message)}: field node of column {name!r} has length {length} != record_count {rows}")
        if not 0 <= null_count <= (length if nullable else 0):
            raise CorruptMessageError(f"{_where(pos, message)}: field node of {'nullable' if nullable else 'non-null'} "
                                      f"column {name!r} has null_count {null_count}")
    return layout, message


def _check_producer_body(body: memoryview, pos: int, header: BatchHeader, message: arrow_ipc.RecordBatchMessage,
                         max_decompressed_bytes: int) -> None:
    """What the leader checks in a producer's body before storing it, so that nothing it
    acknowledges fails a consumer's `decode_body` (or the log cleaner's) later: a body whose
    IPC metadata is sound can still hold value offsets past the data buffer, wrong null counts,
    header keys that are not UTF-8 or compressed buffers that do not decompress.

    The declared decompressed size is bounded first (read from the buffers' length prefixes,
    before Arrow allocates it); then the body is decoded (zero-copy when uncompressed) and
    validated in full, exactly as `decode_body` does for a consumer; then its timestamp column's
    min and max must be the header's base_timestamp and max_timestamp, which `_check_timestamps`
    judged (Kafka checks each record's timestamp; here the header speaks for them only once
    it is proven to describe them)."""
    decompressed = message.decompressed_bytes(body)
    if decompressed > max_decompressed_bytes:
        raise MessageTooLargeError(
            f"batch at byte {pos}: its {arrow_ipc.CODEC_NAMES.get(message.codec, 'uncompressed')} body decompresses to "
            f"{decompressed} bytes, above message.decompressed.max.bytes {max_decompressed_bytes}")
    decoded = _decoded_body(pa.py_buffer(body), header, f"batch at byte {pos}", in_this_thread=message.codec is not None)
    millis = decoded.column(2).to_numpy().view(np.int64)  # zero-copy (no nulls): min and max in C, ~1 us each
    low, high = int(millis.min()), int(millis.max())
    if (low, high) != (header.base_timestamp, header.max_timestamp):
        raise InvalidTimestampError(
            f"batch at byte {pos}: record timestamps run from {low} to {high}, but the header's base_timestamp "
            f"and max_timestamp (which the broker checks against message.timestamp.before.max.ms / "
            f"message.timestamp.after.max.ms) say {header.base_timestamp} to {header.max_timestamp}")


@functools.cache
def _known_shapes() -> tuple[arrow_ipc.RecordBatchShape, ...]:
    """The metadata shapes of the small bodies pymq's producers write (body_template), whose
    numbers the validator reads from known places."""
    return body_template.known_shapes()


def _where(pos: int, message: arrow_ipc.RecordBatchMessage) -> str:
    return f"batch at byte {pos}: record batch message at body byte {message.start}"


@functools.lru_cache(maxsize=_LEARNED_SCHEMA_MESSAGES_MAX)
def _layout_of_schema_message(encoded: bytes) -> BodyLayout:
    """The layout of a schema message that is not pyarrow's canonical encoding but may still be
    an equal schema from another Arrow writer: decoded with pyarrow (the message is at most
    SCHEMA_MESSAGE_MAX_BYTES, so this is constant cost too) and compared by names, types,
    nullability and order. Accepted encodings are cached (bounded) so the next is a lookup;
    foreign ones raise IpcFormatError naming what differs (and are not cached)."""
    arrow_ipc.check_schema_message(memoryview(encoded), 0, len(encoded))
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(encoded))
    except (pa.ArrowException, OSError, ValueError, MemoryError) as err:
        raise arrow_ipc.IpcFormatError(f"schema message at body byte 0 does not decode: {err}") from err
    for layout in (STANDARD_LAYOUT, COMPACTED_LAYOUT):
        if schema.equals(layout.schema, check_metadata=False):
            return layout
    try:
        difference = _schema_difference(schema)
    except UnicodeDecodeError:  # Arrow requires UTF-8 names but pyarrow decodes them only when asked
        difference = "a field name is not UTF-8"
    raise arrow_ipc.IpcFormatError(f"schema message at body byte 0: foreign body schema: {difference}")


def _schema_difference(schema: pa.Schema) -> str:
    """The first way `schema` differs from the body schema with its number of fields."""
    expected = COMPACTED_BODY_SCHEMA if len(schema) == len(COMPACTED_BODY_SCHEMA) else BODY_SCHEMA
    if len(schema) != len(expected):
        return (f"{len(schema)} fields ({', '.join(schema.names)}), expected {', '.join(BODY_SCHEMA.names)} "
                f"and, for a compacted batch, {OFFSET_DELTA_FIELD.name}")
    for i, (found, wanted) in enumerate(zip(schema, expected)):
        if found.name != wanted.name:
            return f"field {i} is named {found.name!r}, expected {wanted.name!r}"
        if not found.type.equals(wanted.type):
            return f"field {i} {found.name!r} has type {found.type}, expected {wanted.type}"
        if found.nullable != wanted.nullable:
            return f"field {i} {found.name!r} is {'nullable' if found.nullable else 'not null'}, expected the opposite"
    return "the schema's endianness or feature flags differ"


def _check_timestamps(pos: int, header: BatchHeader, now_ms: int, bounds: TimestampBounds | None) -> None:
    if header.base_timestamp < 0:
        raise InvalidTimestampError(f"batch at byte {pos}: base_timestamp {header.base_timestamp} is negative")
    if bounds is None:
        return
    if header.base_timestamp < now_ms - bounds.before_max_ms:
        raise InvalidTimestampError(
            f"batch at byte {pos}: base_timestamp {header.base_timestamp} is more than "
            f"message.timestamp.before.max.ms ({bounds.before_max_ms}) before the broker's time {now_ms}"
        )
    if header.max_timestamp > now_ms + bounds.after_max_ms:
        raise InvalidTimestampError(
            f"batch at byte {pos}: max_timestamp {header.max_timestamp} is more than "
            f"message.timestamp.after.max.ms ({bounds.after_max_ms}) after the broker's time {now_ms}"
        )


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify: bool = True, check_body: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each complete batch in a buffer of concatenated batches.

    A partial batch at the end is skipped silently: fetch responses may end mid-batch by design.
    With `verify`, every yielded batch passed `validate_batch` (`check_body=False`: all of it
    but the body's IPC structure, for readers that decode the body with `decode_body`, which
    checks it fully anyway).
    """
    pos, end = 0, len(buf)
    while True:
        size = batch_size_at(buf, pos)
        if size is None or size < HEADER_SIZE or pos + size > end:
            if size is not None and size < HEADER_SIZE:
                raise CorruptMessageError(f"batch at byte {pos}: batch_length {size - LENGTH_PREFIX} too small")
            return
        header = validate_batch(buf, pos, check_body=check_body) if verify else read_header(buf, pos)
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
    """Decode the Arrow body of the batch at `pos` (zero-copy over `buf` when uncompressed), in
    either body schema. Checks it fully (any Arrow structure, row count, and for a compacted body
    offset deltas strictly increasing from >= 0 to last_offset_delta): CorruptMessageError."""
    body = pa.py_buffer(buf) if not isinstance(buf, pa.Buffer) else buf
    return _decoded_body(body.slice(pos + HEADER_SIZE, header.size - HEADER_SIZE), header,
                         f"batch at offset {header.base_offset}")


# Arrow decompresses a batch's buffers on its CPU pool by default: for a producer's batch (17
# buffers, most of them small) waking the pool costs more than the work (lz4, 100 records of
# 100 B: 144 us with the pool, 25 us in the calling thread), and the broker's threads are busy.
_IN_THIS_THREAD = pa.ipc.IpcReadOptions(use_threads=False)


def _decoded_body(body: pa.Buffer, header: BatchHeader, where: str, *, in_this_thread: bool = False) -> pa.RecordBatch:
    """decode_body's work on the body's own bytes; errors begin with `where`. `in_this_thread`:
    decompress in the calling thread, not on Arrow's pool."""
    schema_message = STANDARD_LAYOUT.schema_message
    try:
        if (not in_this_thread and len(body) > len(schema_message)
                and memoryview(body).cast("B")[:len(schema_message)] == schema_message):
            # The schema message pymq writes itself: only the record batch message needs
            # reading (a stream reader would parse the schema again: half the cost of a small batch).
            batch = pa.ipc.read_record_batch(body.slice(len(schema_message)), BODY_SCHEMA)
        else:
            reader = pa.ipc.open_stream(body, options=_IN_THIS_THREAD if in_this_thread else None)
            if not (reader.schema.equals(BODY_SCHEMA) or reader.schema.equals(COMPACTED_BODY_SCHEMA)):
                raise CorruptMessageError(f"{where}: body schema is not the record schema")
            batch = reader.read_next_batch()
        # A CRC only proves the producer's bytes arrived intact, not that they are valid Arrow: a
        # structurally broken body could crash the reader later, so check it fully here.
        batch.validate(full=True)
    except (pa.ArrowException, MemoryError, StopIteration, OSError) as err:
        raise CorruptMessageError(f"{where}: bad Arrow body: {err}") from err
    if batch.num_rows != header.record_count:
        raise CorruptMessageError(f"{where}: body has {batch.num_rows} rows, header says {header.record_count}")
    if batch.num_columns == len(COMPACTED_BODY_SCHEMA):
        _check_offset_deltas(batch.column("offset_delta"), header, where)
    elif header.last_offset_delta != header.record_count - 1:
        raise CorruptMessageError(f"{where}: last_offset_delta {header.last_offset_delta} "
                                  f"!= record_count {header.record_count} - 1 in a body without offset deltas")
    return batch


def _check_offset_deltas(deltas: pa.Array, header: BatchHeader, batch_where: str) -> None:
    """A compacted body's offset deltas: no nulls, the first >= 0, strictly increasing, the last
    equal to the header's last_offset_delta (Arrow kernels, no per-record Python)."""
    where = f"{batch_where}: offset_delta"
    if deltas.null_count:
        raise CorruptMessageError(f"{where} has {deltas.null_count} nulls")
    if deltas[0].as_py() < 0 or deltas[-1].as_py() != header.last_offset_delta:
        raise CorruptMessageError(
            f"{where} runs from {deltas[0].as_py()} to {deltas[-1].as_py()}, expected >= 0 up to "
            f"last_offset_delta {header.last_offset_delta}"
        )
    if len(deltas) > 1 and not pc.all(pc.greater(deltas.slice(1), deltas.slice(0, len(deltas) - 1))).as_py():
        raise CorruptMessageError(f"{where} is not strictly increasing")


def record_offsets(header: BatchHeader, body: pa.RecordBatch) -> pa.Array:
    """The int64 offset of each record of a decoded body: base_offset + row index, or
    base_offset + offset_delta in a compacted body (whose offsets may have gaps)."""
    if "offset_delta" in body.schema.names:
        return pc.add(body.column("offset_delta").cast(pa.int64()), pa.scalar(header.base_offset, pa.int64()))
    return pa.array(np.arange(header.base_offset, header.base_offset + body.num_rows, dtype=np.int64))


def decode_batch(buf: bytes | bytearray | memoryview, pos: int = 0, *, verify: bool = True) -> tuple[BatchHeader, pa.RecordBatch]:
    """Validate (optionally) and decode the batch at `pos`: its header and Arrow body."""
    header = validate_batch(buf, pos) if verify else read_header(buf, pos)
    return header, decode_body(buf, header, pos)
