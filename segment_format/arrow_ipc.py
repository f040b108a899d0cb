"""Arrow IPC stream framing and message metadata, read at constant cost without decoding buffers.

The broker must tell a well-formed record batch body from poison without handing hostile bytes to
a full Arrow reader (that would cost O(bytes) and trust the flatbuffer). This module reads just
enough of the stream's structure to check it, with the `flatbuffers` runtime's Table accessors,
and bound-checks every read first: hostile offsets raise IpcFormatError, never IndexError,
struct.error or TypeError. Pure: bytes in, values out.

An Arrow IPC stream is a sequence of encapsulated messages and an optional end-of-stream marker:

    offset  size  field
    0       4     continuation marker 0xFFFFFFFF
    4       4     metadata_length (int32)   flatbuffer bytes that follow, padding included
    8       m     Message flatbuffer (Message.fbs)
    8+m     b     message body: bodyLength bytes (a RecordBatch's buffers; none for a Schema)
    ...     8     end of stream: 0xFFFFFFFF 0x00000000

Flatbuffer field slots read (Arrow's format/Message.fbs and Schema.fbs, metadata V4/V5); a
slot's vtable entry sits at byte 4 + 2 * slot of the vtable:

    Message          slot 0  version: short (MetadataVersion V4 = 3, V5 = 4)
                     slot 1  header_type: ubyte (MessageHeader Schema = 1, RecordBatch = 3)
                     slot 2  header: table (the union's value)
                     slot 3  bodyLength: long
    RecordBatch      slot 0  length: long (row count)
                     slot 1  nodes: [FieldNode]   struct {length: long, null_count: long}, pre-order
                     slot 2  buffers: [Buffer]    struct {offset: long, length: long}, body-relative
                     slot 3  compression: BodyCompression (absent: buffers are uncompressed)
                     slot 4  variadicBufferCounts: [long] (view types only)
    BodyCompression  slot 0  codec: byte (CompressionType LZ4_FRAME = 0, ZSTD = 1; default 0)
                     slot 1  method: byte (BodyCompressionMethod BUFFER = 0; default 0)

A flatbuffer starts with a uint32 offset to its root table. A table starts with an int32 offset
back to its vtable (vtable = table - soffset); the vtable holds uint16 vtable size, uint16 table
size, then one uint16 per slot: the field's offset from the table, 0 when absent. A field
referring to a table or vector holds a uint32 offset from the field itself; a vector starts with
its uint32 element count.
"""
from __future__ import annotations

import operator
import struct
from typing import NamedTuple

from flatbuffers import number_types as fb
from flatbuffers.table import Table

CONTINUATION = b"\xff\xff\xff\xff"
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"
PREFIX_SIZE = 8  # continuation marker + metadata_length
_PREFIX = struct.Struct("<4si")

METADATA_V4, METADATA_V5 = 3, 4
HEADER_SCHEMA, HEADER_RECORD_BATCH = 1, 3
CODEC_LZ4_FRAME, CODEC_ZSTD = 0, 1
CODEC_NAMES = {CODEC_LZ4_FRAME: "lz4_frame", CODEC_ZSTD: "zstd"}
_METHOD_BUFFER = 0
_PAIR = struct.Struct("<qq")  # FieldNode and Buffer are both two longs
_UNCOMPRESSED_LENGTH = struct.Struct("<q")  # the prefix of each buffer of a compressed body


class IpcFormatError(ValueError):
    """The bytes are not the Arrow IPC structure expected; the message names the field and its
    position in the stream. Callers turn it into their own error (the broker: CORRUPT_MESSAGE)."""


class RecordBatchMessage(NamedTuple):
    """The metadata of one RecordBatch message, as read from its flatbuffer.

    `nodes` and `buffers` are flat (length, null_count, ...) and (offset, length, ...) tuples;
    every buffer is known to lie inside the body."""

    start: int  # stream position of the message's continuation marker
    length: int
    body_length: int
    nodes: tuple[int, ...]
    buffers: tuple[int, ...]
    codec: int | None
    body_start: int  # stream position of the message body (buffer offsets count from here)

    def node(self, index: int) -> tuple[int, int]:
        """(length, null_count) of the index-th field node (pre-order)."""
        return self.nodes[2 * index], self.nodes[2 * index + 1]

    def decompressed_bytes(self, stream: memoryview) -> int:
        """Bytes the body's buffers take once a reader decompressed them: each compressed buffer
        opens with its uncompressed length (int64; -1 when the buffer is stored as is), which is
        what Arrow allocates before decompressing. Reading those lengths first lets a caller
        refuse a decompression bomb without allocating anything. The body's length for an
        uncompressed message. One read per buffer; a prefix that is missing or negative is left
        for the decoder to refuse (it allocates nothing for it)."""
        if self.codec is None:
            return self.body_length
        total, buffers = 0, self.buffers
        for i in range(0, len(buffers), 2):
            offset, size = buffers[i], buffers[i + 1]
            if size >= _UNCOMPRESSED_LENGTH.size:
                declared = _UNCOMPRESSED_LENGTH.unpack_from(stream, self.body_start + offset)[0]
                total += size - _UNCOMPRESSED_LENGTH.size if declared == -1 else max(declared, 0)
        return total


def message_end(stream: memoryview, pos: int, what: str, max_metadata_bytes: int) -> int:
    """Position just after the flatbuffer of the message at `pos` (its body, if any, follows).

    Checks the continuation marker and that metadata_length is positive, at most
    `max_metadata_bytes` and inside `stream`. An end-of-stream marker here is an error: the
    caller expects a message."""
    if len(stream) - pos < PREFIX_SIZE:
        raise IpcFormatError(f"{what} at body byte {pos}: {len(stream) - pos} bytes, too short for a message prefix")
    marker, metadata_length = _PREFIX.unpack_from(stream, pos)
    if marker != CONTINUATION:
        raise IpcFormatError(f"{what} at body byte {pos}: continuation marker missing (not an Arrow IPC stream)")
    if metadata_length <= 0:
        raise IpcFormatError(f"{what} at body byte {pos}: metadata_length {metadata_length} (a message was expected)")
    if metadata_length > max_metadata_bytes:
        raise IpcFormatError(f"{what} at body byte {pos}: metadata_length {metadata_length} exceeds {max_metadata_bytes}")
    end = pos + PREFIX_SIZE + metadata_length
    if end > len(stream):
        raise IpcFormatError(f"{what} at body byte {pos}: metadata_length {metadata_length} runs past the body's end")
    return end


def check_schema_message(stream: memoryview, pos: int, end: int) -> None:
    """The message at `pos` (flatbuffer up to `end`) is a Schema message with no body.

    Only its Message table is read: the caller decodes the schema itself (with pyarrow, whose
    flatbuffer verifier then guards the rest)."""
    where = f"schema message at body byte {pos}"
    header_type, _, body_length = _message(stream[pos + PREFIX_SIZE : end], where)
    if header_type != HEADER_SCHEMA:
        raise IpcFormatError(f"{where}: header_type {header_type}, expected Schema ({HEADER_SCHEMA})")
    if body_length != 0:
        raise IpcFormatError(f"{where}: bodyLength {body_length}, a schema message has none")


def read_record_batch(stream: memoryview, pos: int, *, nodes: int, buffers: int,
                      max_metadata_bytes: int, shapes: tuple["RecordBatchShape", ...] = ()) -> RecordBatchMessage:
    """Read the RecordBatch message at `pos`, which must be the stream's last message: its body
    ends exactly at the end of `stream`, or 8 bytes before it followed by the end-of-stream marker.

    The caller knows the schema, so it says how many field `nodes` and `buffers` the batch must
    carry (that also keeps the reads constant). Checks: message type and version, bodyLength,
    the node and buffer counts, every buffer (offset, length) inside the body, the compression
    codec (LZ4_FRAME or ZSTD, per-buffer method) and no variadic buffer counts. Metadata laid
    out exactly like one of `shapes` (see RecordBatchShape) has its numbers read from their
    known places instead of walking the flatbuffer; the checks on them are the same."""
    where = f"record batch message at body byte {pos}"
    end = message_end(stream, pos, "record batch message", max_metadata_bytes)
    metadata = stream[pos + PREFIX_SIZE : end]
    for shape in shapes:
        numbers = shape.numbers(metadata)
        if numbers is not None and shape.counts == (nodes, buffers):
            length, body_length, node_values, buffer_values = numbers
            _check_body_extent(stream, end, body_length, where)
            _check_buffers(buffer_values, body_length, where)
            return RecordBatchMessage(pos, length, body_length, node_values, buffer_values, None, end)
    header_type, batch, body_length = _message(metadata, where)
    if header_type != HEADER_RECORD_BATCH:
        raise IpcFormatError(f"{where}: header_type {header_type}, expected RecordBatch ({HEADER_RECORD_BATCH})")
    _check_body_extent(stream, end, body_length, where)
    length = _scalar(batch, 0, fb.Int64Flags, 0, where, "length")
    node_values = _pairs(batch, 1, nodes, where, "nodes")
    buffer_values = _pairs(batch, 2, buffers, where, "buffers")
    _check_buffers(buffer_values, body_length, where)
    codec = _compression(batch, where)
    variadic = _field(batch, 4, 4, where, "variadicBufferCounts")
    if variadic is not None and _vector(batch.table, variadic, 8, where, "variadicBufferCounts")[1]:
        raise IpcFormatError(f"{where}: variadicBufferCounts present (no view types in this schema)")
    return RecordBatchMessage(pos, length, body_length, node_values, buffer_values, codec, end)


def _check_body_extent(stream: memoryview, end: int, body_length: int, where: str) -> None:
    """The body fills the stream after the metadata (ending at `end`), or all but a trailing
    end-of-stream marker."""
    remaining = len(stream) - end
    if body_length < 0 or body_length not in (remaining, remaining - len(END_OF_STREAM)):
        raise IpcFormatError(f"{where}: bodyLength {body_length} does not fill the {remaining} bytes left in the body")
    if body_length != remaining and stream[end + body_length :] != END_OF_STREAM:
        raise IpcFormatError(f"{where}: the {len(END_OF_STREAM)} bytes after it are not the end-of-stream marker")


def _check_buffers(buffer_values: tuple[int, ...], body_length: int, where: str) -> None:
    outside = _first_buffer_outside(buffer_values, body_length)
    if outside is not None:
        offset, size = buffer_values[2 * outside], buffer_values[2 * outside + 1]
        raise IpcFormatError(f"{where}: buffer {outside} (offset {offset}, length {size}) lies outside the "
                             f"{body_length}-byte message body")


class RecordBatchShape:
    """The layout of one writer's RecordBatch metadata, learned from an example message.

    A writer lays out the flatbuffer of every record batch of one schema the same way: vtables,
    offsets and vector counts are equal, and only the numbers differ (the row count, bodyLength,
    each field node's and buffer's values). Given an example, this knows where those numbers sit,
    so that (a) metadata whose every other byte equals the example's is read by unpacking them
    there, with the same result the flatbuffer walk gives (checked on the example), and (b) a
    writer can produce such metadata by packing numbers into a copy (`pack`). Only uncompressed
    examples with no variadic counts are accepted (their bytes then prove both absent)."""

    def __init__(self, metadata: bytes, nodes: int, buffers: int) -> None:
        where = "example record batch message"
        _, batch, body_length = _message(memoryview(metadata), where)
        if _compression(batch, where) is not None or _field(batch, 4, 4, where, "variadicBufferCounts") is not None:
            raise IpcFormatError(f"{where}: compressed or with variadic counts")
        message = Table(bytearray(metadata), 0)
        message = Table(message.Bytes, message.Get(fb.UOffsetTFlags, 0))
        record_batch = Table(message.Bytes, message.Indirect(message.Pos + message.Offset(8)))
        self.counts = (nodes, buffers)
        self.metadata = metadata
        self.length_at = record_batch.Pos + record_batch.Offset(4)
        self.body_length_at = message.Pos + message.Offset(10)
        self.nodes_at = record_batch.Vector(record_batch.Offset(6))
        self.buffers_at = record_batch.Vector(record_batch.Offset(8))
        self._int64 = struct.Struct("<q")
        self._nodes = struct.Struct(f"<{2 * nodes}q")
        self._buffers = struct.Struct(f"<{2 * buffers}q")
        self._slots = [(self.length_at, 8), (self.body_length_at, 8), (self.nodes_at, self._nodes.size),
                       (self.buffers_at, self._buffers.size)]
        self._fixed = self._without_numbers(metadata)
        expected = (_scalar(batch, 0, fb.Int64Flags, 0, where, "length"), body_length,
                    _pairs(batch, 1, nodes, where, "nodes"), _pairs(batch, 2, buffers, where, "buffers"))
        if min(self.length_at, self.body_length_at, self.nodes_at, self.buffers_at) <= 0 or self.numbers(metadata) != expected:
            raise IpcFormatError(f"{where}: its numbers are not where this reader looks for them")

    def _without_numbers(self, metadata: bytes | memoryview) -> bytearray:
        out = bytearray(metadata)
        for at, size in self._slots:
            out[at : at + size] = bytes(size)
        return out

    def numbers(self, metadata: bytes | memoryview) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
        """(length, bodyLength, node values, buffer values) of metadata in this shape, else None."""
        if len(metadata) != len(self.metadata) or self._without_numbers(metadata) != self._fixed:
            return None
        return (self._int64.unpack_from(metadata, self.length_at)[0], self._int64.unpack_from(metadata, self.body_length_at)[0],
                self._nodes.unpack_from(metadata, self.nodes_at), self._buffers.unpack_from(metadata, self.buffers_at))

    def pack(self, length: int, body_length: int, node_values: tuple[int, ...] | list[int],
             buffer_values: tuple[int, ...] | list[int]) -> bytearray:
        """Metadata of this shape carrying these numbers."""
        out = bytearray(self.metadata)
        self._int64.pack_into(out, self.length_at, length)
        self._int64.pack_into(out, self.body_length_at, body_length)
        self._nodes.pack_into(out, self.nodes_at, *node_values)
        self._buffers.pack_into(out, self.buffers_at, *buffer_values)
        return out


def _first_buffer_outside(buffers: tuple[int, ...], body_length: int) -> int | None:
    """Index of the first (offset, length) pair not inside the body; None when all are (decided
    by one min and one max, in C, on the common path)."""
    offsets, lengths = buffers[0::2], buffers[1::2]
    if not buffers or (min(buffers) >= 0 and max(map(operator.add, offsets, lengths)) <= body_length):
        return None
    return next(i for i, (offset, size) in enumerate(zip(offsets, lengths))
                if offset < 0 or size < 0 or offset + size > body_length)


# -- bound-checked flatbuffer reads -------------------------------------------------------------


def _message(metadata: memoryview, where: str) -> tuple[int, _Table, int]:
    """(header_type, header table, bodyLength) of a Message flatbuffer, version checked."""
    if len(metadata) < 4:
        raise IpcFormatError(f"{where}: metadata of {len(metadata)} bytes has no root offset")
    root = Table(metadata, 0)
    message = _table(metadata, root.Get(fb.UOffsetTFlags, 0), where, "Message table")
    version = _scalar(message, 0, fb.Int16Flags, 0, where, "version")
    if version not in (METADATA_V4, METADATA_V5):
        raise IpcFormatError(f"{where}: metadata version {version}, expected V4 ({METADATA_V4}) or V5 ({METADATA_V5})")
    header_type = _scalar(message, 1, fb.Uint8Flags, 0, where, "header_type")
    header_at = _field(message, 2, 4, where, "header")
    if header_at is None:
        raise IpcFormatError(f"{where}: header missing")
    header = _table(metadata, message.table.Indirect(header_at), where, "header table")
    body_length = _scalar(message, 3, fb.Int64Flags, 0, where, "bodyLength")
    return header_type, header, body_length


class _Table(NamedTuple):
    """A flatbuffers Table with its vtable's slot entries, read once in one unpack: Table.Offset
    would re-read the vtable's position and size for every field, three reads per field on the
    broker's produce path (each Table.Get costs ~0.4 us)."""

    table: Table
    slots: tuple[int, ...]  # each slot's offset from the table, 0 when the field is absent


def _table(buf: memoryview, pos: int, where: str, name: str) -> _Table:
    """The table at `pos`, once it and its whole vtable are known to lie inside `buf`."""
    size = len(buf)
    if not 0 <= pos <= size - 4:
        raise IpcFormatError(f"{where}: {name}: table offset {pos} outside the {size}-byte metadata")
    table = Table(buf, pos)
    vtable = pos - table.Get(fb.SOffsetTFlags, pos)
    if not 0 <= vtable <= size - 4:
        raise IpcFormatError(f"{where}: {name}: vtable offset {vtable} outside the {size}-byte metadata")
    vtable_size = table.Get(fb.VOffsetTFlags, vtable)
    if vtable_size < 4 or vtable_size % 2 or vtable + vtable_size > size:
        raise IpcFormatError(f"{where}: {name}: vtable of {vtable_size} bytes at {vtable} does not fit the metadata")
    return _Table(table, struct.unpack_from(f"<{(vtable_size - 4) // 2}H", buf, vtable + 4))


def _field(table: _Table, slot: int, size: int, where: str, name: str) -> int | None:
    """Position of the slot's `size`-byte value, None when the field is absent (default)."""
    if slot >= len(table.slots) or table.slots[slot] == 0:  # absent (or a vtable older than the slot)
        return None
    offset = table.slots[slot]
    at = table.table.Pos + offset
    if at + size > len(table.table.Bytes):
        raise IpcFormatError(f"{where}: {name}: field at {at} runs past the {len(table.table.Bytes)}-byte metadata")
    return at


def _scalar(table: _Table, slot: int, flags: type, default: int, where: str, name: str) -> int:
    at = _field(table, slot, flags.bytewidth, where, name)
    return default if at is None else table.table.Get(flags, at)


def _vector(table: Table, at: int, item_size: int, where: str, name: str) -> tuple[int, int]:
    """(position of the first element, element count) of the vector the field at `at` refers to."""
    vector = table.Indirect(at)
    size = len(table.Bytes)
    if vector + 4 > size:
        raise IpcFormatError(f"{where}: {name}: vector offset {vector} outside the {size}-byte metadata")
    count = table.Get(fb.UOffsetTFlags, vector)
    start = vector + 4
    if start + count * item_size > size:
        raise IpcFormatError(f"{where}: {name}: {count} elements run past the {size}-byte metadata")
    return start, count


def _pairs(table: _Table, slot: int, expected: int, where: str, name: str) -> tuple[int, ...]:
    """The flat values of a vector of `expected` two-long structs (FieldNode or Buffer), read in
    one unpack (a struct vector's elements are inline, little-endian)."""
    at = _field(table, slot, 4, where, name)
    if at is None:
        raise IpcFormatError(f"{where}: {name}: missing, expected {expected}")
    start, count = _vector(table.table, at, _PAIR.size, where, name)
    if count != expected:
        raise IpcFormatError(f"{where}: {name}: {count} entries, the schema has {expected}")
    return struct.unpack_from(f"<{2 * count}q", table.table.Bytes, start)


def _compression(batch: _Table, where: str) -> int | None:
    """The codec of a compressed batch, None for an uncompressed one."""
    at = _field(batch, 3, 4, where, "compression")
    if at is None:
        return None
    compression = _table(batch.table.Bytes, batch.table.Indirect(at), where, "compression table")
    codec = _scalar(compression, 0, fb.Int8Flags, CODEC_LZ4_FRAME, where, "compression codec")
    if codec not in CODEC_NAMES:
        raise IpcFormatError(f"{where}: compression codec {codec}, expected LZ4_FRAME ({CODEC_LZ4_FRAME}) "
                             f"or ZSTD ({CODEC_ZSTD})")
    method = _scalar(compression, 1, fb.Int8Flags, _METHOD_BUFFER, where, "compression method")
    if method != _METHOD_BUFFER:
        raise IpcFormatError(f"{where}: compression method {method}, expected BUFFER ({_METHOD_BUFFER})")
    return codec
