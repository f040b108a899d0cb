"""BodyTemplate: small record bodies written by filling in a record batch message, not by pyarrow.

A batch under a latency target holds a handful of records, and building it with pyarrow (three
arrays, a RecordBatch, `serialize`) costs ~15 us with warm caches and ~45 us in a producer whose
CPU caches the broker and consumer processes keep evicting: a third of the producer's work per
request. Yet for the common shape of such a batch (the standard body schema, no headers, no null
values, keys all null or all set, no compression) only numbers change from one body to the next:
the row count, each field node's (length, null_count), each buffer's (offset, length) and the
body length sit at fixed places in the record batch message's flatbuffer.

So pyarrow writes one example body per key variant, the places of those numbers are read from
it once, and `encode` packs the numbers in and concatenates the buffers (offsets and timestamps
with `array`, values with `bytes.join`). The output is byte-for-byte what
`record.encode_body(record.make_body(...))` writes: that is checked against pyarrow for a spread
of shapes when a template is built, and a template that does not match (another pyarrow version
laying its flatbuffers out differently) is not used. Every other shape goes through pyarrow.
"""
from __future__ import annotations

import functools
import itertools
import logging
import struct
from array import array

import flatbuffers
import pyarrow as pa
from flatbuffers.number_types import UOffsetTFlags

from broker import record

log = logging.getLogger(__name__)

MAX_RECORDS = 256  # above this pyarrow's fixed cost is spread thin enough
_ALIGNMENT = 8  # Arrow IPC pads every body buffer to 8 bytes
_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
_STRUCT_SIZE = 16  # a FieldNode (length, null_count) and a Buffer (offset, length) are two int64s
if array("i").itemsize != 4 or array("q").itemsize != 8:
    raise ImportError("array('i') / array('q') are not 32 / 64-bit on this platform")


class BodyTemplate:
    """Encodes bodies of one key variant (`keyed`: every key set; else every key null)."""

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        sample = record.make_body([b"v"], [b"k"] if keyed else None, [0])
        message = sample.serialize().to_pybytes()
        _, metadata_size = _PREFIX.unpack_from(message)
        self._metadata = message[_PREFIX.size:_PREFIX.size + metadata_size]
        self._prefix = record.STANDARD_LAYOUT.schema_message + message[:_PREFIX.size]
        self._find_slots(self._metadata)
        # The headers column is always null here: after its validity bitmap and offsets (which
        # grow with the row count) its child buffers are empty and constant, taken as written.
        self._header_children = self._sample_buffers(message)[10:]

    def _find_slots(self, metadata: bytes) -> None:
        """Where the row count, field nodes, buffers and body length live in the metadata."""
        root = flatbuffers.table.Table(bytearray(metadata), 0)
        message = flatbuffers.table.Table(root.Bytes, root.Get(UOffsetTFlags, 0))
        self._body_length_at = message.Pos + message.Offset(10)  # Message.bodyLength (slot 3)
        batch = flatbuffers.table.Table(message.Bytes, message.Indirect(message.Pos + message.Offset(8)))
        self._length_at = batch.Pos + batch.Offset(4)  # RecordBatch.length (slot 0)
        self._nodes_at = batch.Vector(batch.Offset(6))  # RecordBatch.nodes (slot 1)
        self._node_count = batch.VectorLen(batch.Offset(6))
        self._buffers_at = batch.Vector(batch.Offset(8))  # RecordBatch.buffers (slot 2)
        self._buffer_count = batch.VectorLen(batch.Offset(8))
        if min(self._body_length_at, self._length_at, self._nodes_at, self._buffers_at) <= 0:
            raise ValueError("the example record batch message lacks a field the template fills in")
        if (self._node_count, self._buffer_count) != (7, 17):
            raise ValueError(f"{self._node_count} field nodes and {self._buffer_count} buffers, expected 7 and 17")
        self._nodes = struct.Struct(f"<{2 * self._node_count}q")
        self._buffers = struct.Struct(f"<{2 * self._buffer_count}q")

    def _sample_buffers(self, message: bytes) -> list[bytes]:
        """The body buffers of a message written by pyarrow, unpadded, in order."""
        values = self._buffers.unpack_from(self._metadata, self._buffers_at)
        body = message[_PREFIX.size + len(self._metadata):]
        return [body[offset:offset + length] for offset, length in zip(values[0::2], values[1::2])]

    def encode(self, keys: list[bytes] | None, values: list[bytes], timestamps: list[int]) -> bytes:
        """The IPC body (schema message + record batch message) of these records; `keys` None
        when every key is null. Callers check the shape (see `template_for`)."""
        n = len(values)
        offsets = array("i", itertools.accumulate(map(len, values), initial=0)).tobytes()
        null_bitmap = bytes((n + 7) // 8)
        zero_offsets = bytes(4 * (n + 1))
        if keys is None:
            key_buffers = [null_bitmap, zero_offsets, b""]
            key_nulls = n
        else:
            key_buffers = [b"", array("i", itertools.accumulate(map(len, keys), initial=0)).tobytes(), b"".join(keys)]
            key_nulls = 0
        buffers = [*key_buffers, b"", offsets, b"".join(values), b"", array("q", timestamps).tobytes(),
                   null_bitmap, zero_offsets, *self._header_children]
        spans: list[int] = []
        parts: list[bytes] = []
        position = 0
        for buffer in buffers:
            size = len(buffer)
            spans += (position, size)
            parts.append(buffer)
            pad = -size % _ALIGNMENT
            if pad:
                parts.append(bytes(pad))
            position += size + pad
        metadata = bytearray(self._metadata)
        struct.pack_into("<q", metadata, self._length_at, n)
        struct.pack_into("<q", metadata, self._body_length_at, position)
        # Pre-order: key, value, timestamp, headers (all null), its struct and the struct's two
        # fields (empty: a null list has no elements).
        self._nodes.pack_into(metadata, self._nodes_at, n, key_nulls, n, 0, n, 0, n, n, 0, 0, 0, 0, 0, 0)
        self._buffers.pack_into(metadata, self._buffers_at, *spans)
        return b"".join([self._prefix, metadata, *parts])

    def matches_pyarrow(self) -> bool:
        """True if `encode` writes exactly what pyarrow writes, for a spread of row counts (bitmap
        and offset sizes cross their padding boundaries) and value sizes."""
        for n in (1, 2, 3, 7, 8, 9, 16, 17, 63, 64, 65, 100, MAX_RECORDS):
            values = [bytes([65 + i % 26]) * ((i * 37) % 301) for i in range(n)]
            keys = [b"key-%d" % i for i in range(n)] if self.keyed else None
            timestamps = [1_700_000_000_000 + i * 13 for i in range(n)]
            body = record.make_body(values, keys, timestamps)
            if self.encode(keys, values, timestamps) != record.encode_body(body).to_pybytes():
                return False
        return True


@functools.cache
def template_for(keyed: bool) -> BodyTemplate | None:
    """The template of a key variant, or None where pyarrow lays bodies out differently than
    the template expects (then pyarrow encodes every body)."""
    try:
        template = BodyTemplate(keyed)
        if template.matches_pyarrow():
            return template
    except (ValueError, struct.error, IndexError) as err:
        log.info("no body template (keyed=%s): %s", keyed, err)
        return None
    log.info("no body template (keyed=%s): its output differs from pyarrow's on this version", keyed)
    return None
