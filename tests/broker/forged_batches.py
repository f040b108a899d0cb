"""Batches in the record format that no producer may write: Kafka's LogValidator refuses them with
INVALID_RECORD, and so does the leader here (`record.validate_batch` with producer input). Those
a leader writes itself (compacted bodies from the log cleaner, control and transactional batches)
pass the validation followers and recovery do.

Also poison (POISON_BATCHES, BODY_TIMESTAMP_BATCHES): bodies whose IPC metadata is sound but whose
buffers no reader can decode, or whose timestamps are not what the header claims; the leader
decodes and validates a producer's body to refuse them.

Shared by the validator's unit tests, the bad-input tests against a real broker and the wire fuzz.
"""
from __future__ import annotations

import struct
from typing import Callable

import crc32c

from segment_format import arrow_ipc, batch_body, record

TS = 1_700_000_000_000
OFFSET_RANGE = "inconsistent batch offset range"


def compacted(deltas: list[int], ts: int = TS) -> bytearray:
    """A batch in the compacted body layout whose offset_delta column claims `deltas` (its
    header's last_offset_delta is the last of them, so only the deltas tell it is forged)."""
    values = [b"forged-%d" % i for i in range(len(deltas))]
    keys = [b"key-%d" % i for i in range(len(deltas))]
    return record.encode_batch(batch_body.make_body(values, keys=keys, timestamps_ms=ts, offset_deltas=deltas))


def with_gap(gap: int, ts: int = TS) -> bytearray:
    """A standard-body batch of two records whose header claims `gap` offsets more than it holds."""
    return record.encode_batch(batch_body.make_body([b"forged-0", b"forged-1"], timestamps_ms=ts), last_offset_delta=1 + gap)


def with_attributes(bits: int, ts: int = TS) -> bytearray:
    """A standard two-record batch with attribute `bits` set (and a producer id, as a
    transactional producer would have)."""
    body = batch_body.make_body([b"forged-0", b"forged-1"], timestamps_ms=ts)
    return record.encode_batch(body, attributes=bits, producer_id=7, producer_epoch=0, base_sequence=0)


def without_producer(bits: int, ts: int = TS) -> bytearray:
    """A standard two-record batch with attribute `bits` set and no producer id."""
    return record.encode_batch(batch_body.make_body([b"forged-0", b"forged-1"], timestamps_ms=ts), attributes=bits)


FORGED_BATCHES: list[tuple[str, Callable[[], bytearray], str]] = [
    # id, the batch, words the error message must contain
    ("compacted-claiming-2^20-offsets", lambda: compacted([1 << 20, 1 << 20]), OFFSET_RANGE),
    ("compacted-with-increasing-deltas", lambda: compacted([0, 3, 7]), OFFSET_RANGE),
    ("standard-body-with-offset-gap", lambda: with_gap(1 << 20), OFFSET_RANGE),
    ("control-bit", lambda: with_attributes(record.CONTROL_BIT), "not allowed to write control batches"),
    ("transactional-bit-without-producer-id", lambda: without_producer(record.TRANSACTIONAL_BIT),
     "a transactional batch needs a producer id"),
    ("control-and-transactional-bits", lambda: with_attributes(record.CONTROL_BIT | record.TRANSACTIONAL_BIT),
     "not allowed to write control batches"),
]


# -- poison: bodies whose IPC metadata is sound but whose buffers no reader can decode ------------
# The CRC is right and `validate_batch` without producer input (constant cost) passes them; every
# consumer's `decode_body` fails on them, so the leader must decode and validate a producer's body
# before storing it. Buffers are numbered as in the body's record batch message: key 0-2 (validity,
# offsets, data), value 3-5, timestamp 6-7, headers 8-9, its struct 10, header key 11-13, value 14-16.
KEY_OFFSETS, VALUE_OFFSETS, VALUE_DATA, HEADER_KEY_DATA = 1, 4, 5, 13
YEAR_3000_MS = 32_503_680_000_000


def _three_records(compression: str = "none", headers: list | None = None) -> bytearray:
    values = [b"alpha" * 40, b"beta" * 40, b"gamma" * 40]  # compressible, so lz4/zstd bodies stay compressed
    body = batch_body.make_body(values, keys=[b"k0", b"k1", b"k2"], timestamps_ms=TS, headers=headers)
    return record.encode_batch(body, compression=compression)


def body_buffer(batch: bytearray, index: int) -> tuple[int, int]:
    """(position in `batch`, length) of the index-th buffer of its body's record batch message."""
    body = memoryview(batch)[record.HEADER_SIZE:]
    schema_end = arrow_ipc.message_end(body, 0, "schema message", 1 << 16)
    layout = batch_body.STANDARD_LAYOUT
    message = arrow_ipc.read_record_batch(body, schema_end, nodes=layout.nodes, buffers=layout.buffers,
                                          max_metadata_bytes=1 << 16)
    return record.HEADER_SIZE + message.body_start + message.buffers[2 * index], message.buffers[2 * index + 1]


def reframed(batch: bytearray, **header_fields: int) -> bytearray:
    """`batch` with its header written anew over its (changed) body: the CRC holds again."""
    header = record.read_header(batch)
    fields = {"record_count": header.record_count, "base_timestamp": header.base_timestamp,
              "max_timestamp": header.max_timestamp, **header_fields}
    return record.frame_body(bytes(batch[record.HEADER_SIZE:]), **fields)


def with_int32(index: int, slot: int, value: int, compression: str = "none") -> bytearray:
    """Three records whose body buffer `index` (offsets) holds `value` in int32 slot `slot`."""
    batch = _three_records(compression)
    at, _ = body_buffer(batch, index)
    struct.pack_into("<i", batch, at + 4 * slot, value)
    return reframed(batch)


def header_key_not_utf8() -> bytearray:
    """Three records with one header whose key's bytes are not UTF-8 (the column is string)."""
    batch = _three_records(headers=[[("h", b"v")], None, None])
    at, _ = body_buffer(batch, HEADER_KEY_DATA)
    batch[at] = 0xFF
    return reframed(batch)


def compressed_buffer_garbled(compression: str) -> bytearray:
    """Three records compressed, the compressed bytes of the values' data buffer overwritten."""
    batch = _three_records(compression)
    at, size = body_buffer(batch, VALUE_DATA)
    assert size > 16 and struct.unpack_from("<q", batch, at)[0] != -1, "the value data buffer is not compressed"
    batch[at + 8 : at + size] = bytes(size - 8)
    return reframed(batch)


def decompression_bomb(compression: str, declared: int) -> bytearray:
    """Three records compressed, the values' data buffer declaring `declared` bytes once
    decompressed (what a reader allocates before it finds out)."""
    batch = _three_records(compression)
    at, _ = body_buffer(batch, VALUE_DATA)
    struct.pack_into("<q", batch, at, declared)
    return reframed(batch)


def body_timestamps(timestamps: list[int], header_ts: int = TS) -> bytearray:
    """Records with `timestamps` in the body whose header claims every one is `header_ts`."""
    body = batch_body.make_body([b"r%d" % i for i in range(len(timestamps))], timestamps_ms=timestamps)
    return reframed(record.encode_batch(body), base_timestamp=header_ts, max_timestamp=header_ts)


POISON_BATCHES: list[tuple[str, Callable[[], bytearray], str]] = [
    # id, the batch, words the error message must contain (all CORRUPT_MESSAGE)
    ("value-offset-past-data-buffer", lambda: with_int32(VALUE_OFFSETS, 3, 1 << 20), "out of bounds"),
    ("value-offsets-decreasing", lambda: with_int32(VALUE_OFFSETS, 2, 1), "offset"),
    ("key-offset-negative", lambda: with_int32(KEY_OFFSETS, 1, -5), "offset"),
    ("header-key-not-utf8", header_key_not_utf8, "UTF8"),
    ("lz4-buffer-garbled", lambda: compressed_buffer_garbled("lz4"), "bad Arrow body"),
    ("zstd-buffer-garbled", lambda: compressed_buffer_garbled("zstd"), "bad Arrow body"),
]

BODY_TIMESTAMP_BATCHES: list[tuple[str, Callable[[], bytearray]]] = [
    # id, a batch whose body timestamps lie outside what its header claims (INVALID_TIMESTAMP)
    ("year-3000", lambda: body_timestamps([TS, YEAR_3000_MS])),
    ("int64-max", lambda: body_timestamps([TS, 2**63 - 1])),
    ("minus-one", lambda: body_timestamps([-1, TS])),
    ("all-but-header-differ", lambda: body_timestamps([TS + 1, TS + 2])),
]


def poison_stored_batch(data: bytearray, pos: int) -> None:
    """Poison the batch at byte `pos` of stored batches in place as a damaged disk or a broker
    without body validation would have left it: its value offsets point past the data buffer,
    its base offset and epoch stay, and its CRC is computed anew (so only decoding fails)."""
    header = record.read_header(data, pos)
    batch = bytearray(data[pos : pos + header.size])
    at, _ = body_buffer(batch, VALUE_OFFSETS)
    struct.pack_into("<i", batch, at + 4 * header.record_count, 1 << 20)
    struct.pack_into("<I", batch, 17, crc32c.crc32c(bytes(batch[record.CRC_START:])))
    data[pos : pos + header.size] = batch
