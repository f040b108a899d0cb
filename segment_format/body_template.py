"""BodyTemplate: small record bodies written by filling in a record batch message, not by pyarrow.

A batch under a latency target holds a handful of records, and building it with pyarrow (three
arrays, a RecordBatch, `serialize`) costs ~15 us with warm caches and ~45 us in a producer whose
CPU caches the broker and consumer processes keep evicting: a third of the producer's work per
request. Yet for the common shape of such a batch (the standard body schema, no headers, no null
values, keys all null or all set, no compression) only numbers change from one body to the next:
the row count, each field node's (length, null_count), each buffer's (offset, length) and the
body length sit at fixed places in the record batch message's flatbuffer.

So pyarrow writes one example body per key variant, the places of those numbers are learned from
it once (`arrow_ipc.RecordBatchShape`), and `encode` packs the numbers in and concatenates the buffers (offsets and timestamps
with `array`, values with `bytes.join`). The output is byte-for-byte what
`batch_body.encode_body(batch_body.make_body(...))` writes: that is checked against pyarrow for a spread
of shapes when a template is built, and a template that does not match (another pyarrow version
laying its flatbuffers out differently) is not used. Every other shape goes through pyarrow.
"""
from __future__ import annotations

import functools
import itertools
import logging
import struct
from array import array

from segment_format import arrow_ipc, batch_body

log = logging.getLogger(__name__)

MAX_RECORDS = 256  # above this pyarrow's fixed cost is spread thin enough
_ALIGNMENT = 8  # Arrow IPC pads every body buffer to 8 bytes
_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
if array("i").itemsize != 4 or array("q").itemsize != 8:
    raise ImportError("array('i') / array('q') are not 32 / 64-bit on this platform")


class BodyTemplate:
    """Encodes bodies of one key variant (`keyed`: every key set; else every key null)."""

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        sample = batch_body.make_body([b"v"], [b"k"] if keyed else None, [0])
        message = sample.serialize().to_pybytes()
        _, metadata_size = _PREFIX.unpack_from(message)
        layout = batch_body.STANDARD_LAYOUT
        self.shape = arrow_ipc.RecordBatchShape(message[_PREFIX.size:_PREFIX.size + metadata_size],
                                                layout.nodes, layout.buffers)
        if self.shape.counts != (7, 17):
            raise ValueError(f"{layout.nodes} field nodes and {layout.buffers} buffers, expected 7 and 17")
        self._prefix = layout.schema_message + message[:_PREFIX.size]
        # The headers column is always null here: after its validity bitmap and offsets (which
        # grow with the row count) its child buffers are empty and constant, taken as written.
        body = message[_PREFIX.size + metadata_size:]
        spans = self.shape.numbers(self.shape.metadata)[3]  # type: ignore[index]
        self._header_children = [body[offset:offset + size] for offset, size in zip(spans[20::2], spans[21::2])]

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
        # Field nodes in pre-order: key, value, timestamp, headers (all null), its struct and the
        # struct's two fields (empty: a null list has no elements).
        metadata = self.shape.pack(n, position, (n, key_nulls, n, 0, n, 0, n, n, 0, 0, 0, 0, 0, 0), spans)
        return b"".join([self._prefix, metadata, *parts])

    def matches_pyarrow(self) -> bool:
        """True if `encode` writes exactly what pyarrow writes, for a spread of row counts (bitmap
        and offset sizes cross their padding boundaries) and value sizes."""
        for n in (1, 2, 3, 7, 8, 9, 16, 17, 63, 64, 65, 100, MAX_RECORDS):
            values = [bytes([65 + i % 26]) * ((i * 37) % 301) for i in range(n)]
            keys = [b"key-%d" % i for i in range(n)] if self.keyed else None
            timestamps = [1_700_000_000_000 + i * 13 for i in range(n)]
            body = batch_body.make_body(values, keys, timestamps)
            if self.encode(keys, values, timestamps) != batch_body.encode_body(body).to_pybytes():
                return False
        return True


def known_shapes() -> tuple[arrow_ipc.RecordBatchShape, ...]:
    """The record batch metadata shapes pymq's producers write for small bodies: the broker's
    validator reads their numbers without walking the flatbuffer."""
    return tuple(t.shape for t in (template_for(False), template_for(True)) if t is not None)


@functools.cache
def template_for(keyed: bool) -> BodyTemplate | None:
    """The template of a key variant, or None where pyarrow lays bodies out differently than
    the template expects (then pyarrow encodes every body)."""
    try:
        template = BodyTemplate(keyed)
        if template.matches_pyarrow():
            return template
    except (ValueError, struct.error, IndexError) as err:  # IpcFormatError is a ValueError
        log.info("no body template (keyed=%s): %s", keyed, err)
        return None
    log.info("no body template (keyed=%s): its output differs from pyarrow's on this version", keyed)
    return None
