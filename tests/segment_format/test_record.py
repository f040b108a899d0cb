"""Record batch codec (segment_format/record.py): known bytes pin the 61-byte header, hypothesis proves
round trips and that every single-bit corruption covered by the CRC is detected."""
from __future__ import annotations

import random
import struct

import crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CorruptMessageError, InvalidRecordError, InvalidTimestampError, MessageTooLargeError
from segment_format.record import (
    CONTROL_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    batch_size_at,
    decode_batch,
    decode_body,
    encode_batch,
    encode_batch_parts,
    frame_body,
    iter_batches,
    patch_offsets,
    read_header,
    record_offsets,
    ProducerInput,
    TimestampBounds,
    validate_batch,
)
from segment_format.batch_body import (
    BODY_SCHEMA,
    COMPACTED_BODY_SCHEMA,
    COMPRESSIONS,
    encode_body,
    make_body,
)
from tests.broker.forged_batches import (
    BODY_TIMESTAMP_BATCHES,
    FORGED_BATCHES,
    POISON_BATCHES,
    decompression_bomb,
    with_gap,
)

PROPERTY = settings(max_examples=150)

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
# Milliseconds since the epoch, from 1970 to roughly the year 2286.
TIMESTAMPS = st.integers(0, 10**13)
NULLABLE_BINARY = st.none() | st.binary(max_size=48)
HEADER_LISTS = st.none() | st.lists(st.tuples(st.text(max_size=12), st.binary(max_size=12)), max_size=3)
RECORDS = st.lists(st.tuples(NULLABLE_BINARY, NULLABLE_BINARY, TIMESTAMPS, HEADER_LISTS), min_size=1, max_size=12)
ATTRIBUTES = st.sampled_from(
    [0, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, CONTROL_BIT, TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT]
)


def _headers_column(headers):
    return [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers]


def _body(records) -> pa.RecordBatch:
    keys, values, timestamps, headers = (list(col) for col in zip(*records))
    return make_body(values, keys=keys, timestamps_ms=timestamps, headers=_headers_column(headers))


def _tiny_batch() -> bytearray:
    body = make_body([b"v1", None, b"v3"], keys=[b"k1", b"k2", None], timestamps_ms=[1_000, 3_000, 2_000])
    return encode_batch(
        body, base_offset=42, partition_leader_epoch=7, attributes=TRANSACTIONAL_BIT,
        producer_id=1234, producer_epoch=5, base_sequence=99,
    )


def _flip(buf: bytes | bytearray, bit: int) -> bytearray:
    out = bytearray(buf)
    out[bit // 8] ^= 1 << (bit % 8)
    return out


# -- known bytes ----------------------------------------------------------------------------------


def test_crc_is_crc32c_castagnoli():
    """The checksum library computes CRC32C (check value of '123456789' is 0xE3069283), not CRC32."""
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_header_fields_sit_at_documented_offsets():
    """A three-record batch has every field of docs/architecture.md's Record batch table at its little-endian offset."""
    buf = bytes(_tiny_batch())
    assert HEADER_SIZE == 61
    assert struct.unpack_from("<q", buf, 0)[0] == 42
    assert struct.unpack_from("<i", buf, 8)[0] == len(buf) - 12
    assert struct.unpack_from("<i", buf, 12)[0] == 7
    assert struct.unpack_from("<b", buf, 16)[0] == 1
    assert struct.unpack_from("<I", buf, 17)[0] == crc32c.crc32c(buf[21:])
    assert struct.unpack_from("<h", buf, 21)[0] == TRANSACTIONAL_BIT == 0x10
    assert struct.unpack_from("<i", buf, 23)[0] == 2
    assert struct.unpack_from("<q", buf, 27)[0] == 1_000
    assert struct.unpack_from("<q", buf, 35)[0] == 3_000
    assert struct.unpack_from("<q", buf, 43)[0] == 1234
    assert struct.unpack_from("<h", buf, 51)[0] == 5
    assert struct.unpack_from("<i", buf, 53)[0] == 99
    assert struct.unpack_from("<i", buf, 57)[0] == 3
    assert buf[61:65] == b"\xff\xff\xff\xff"  # the body opens as an Arrow IPC stream


def test_header_bytes_match_pinned_hex_apart_from_crc_and_length():
    """The header's bytes are pinned exactly, with the body-dependent CRC and length masked."""
    buf = _tiny_batch()
    masked = bytearray(buf[:HEADER_SIZE])
    masked[8:12] = b"\0" * 4
    masked[17:21] = b"\0" * 4
    assert masked.hex() == (
        "2a00000000000000" "00000000" "07000000" "01" "00000000" "1000" "02000000"
        "e803000000000000" "b80b000000000000" "d204000000000000" "0500" "63000000" "03000000"
    )


def test_read_header_exposes_derived_properties():
    """read_header decodes the header and derives size, last/next offset and attribute flags."""
    buf = _tiny_batch()
    header = read_header(buf)
    assert header.size == len(buf)
    assert (header.base_offset, header.last_offset, header.next_offset) == (42, 44, 45)
    assert header.is_transactional and not header.is_control and not header.log_append_time
    assert batch_size_at(buf, 0) == len(buf)
    assert batch_size_at(buf[:11], 0) is None


def test_patch_offsets_rewrites_only_offset_and_epoch_and_crc_still_holds():
    """patch_offsets changes bytes 0..8 and 12..16 only, and the patched batch still validates."""
    original = _tiny_batch()
    patched = bytearray(original)
    patch_offsets(patched, 0, 1_000_000_007, 31)
    changed = {i for i, (a, b) in enumerate(zip(original, patched)) if a != b}
    assert changed and changed <= set(range(0, 8)) | set(range(12, 16))
    header = validate_batch(patched)
    assert (header.base_offset, header.partition_leader_epoch, header.crc) == (1_000_000_007, 31, read_header(original).crc)


def test_patch_offsets_at_a_position_leaves_neighbours_alone():
    """Patching the second of two concatenated batches leaves the first batch untouched."""
    first, second = _tiny_batch(), _tiny_batch()
    buf = first + second
    patch_offsets(buf, len(first), 500, 9)
    assert buf[: len(first)] == first
    assert validate_batch(buf, len(first)).base_offset == 500


# -- round trips ----------------------------------------------------------------------------------


@PROPERTY
@given(
    records=RECORDS, compression=st.sampled_from(COMPRESSIONS), base_offset=INT64, epoch=INT32,
    attributes=ATTRIBUTES, producer_id=INT64, producer_epoch=INT16, base_sequence=INT32,
)
def test_encode_decode_round_trips_body_and_header(
    records, compression, base_offset, epoch, attributes, producer_id, producer_epoch, base_sequence
):
    """Any records, compression and producer fields survive encode_batch -> decode_batch unchanged."""
    body = _body(records)
    buf = encode_batch(
        body, compression=compression, base_offset=base_offset, partition_leader_epoch=epoch,
        attributes=attributes, producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    header, decoded = decode_batch(buf)
    assert decoded.equals(body)
    assert decoded.column("key").to_pylist() == [r[0] for r in records]
    assert decoded.column("value").to_pylist() == [r[1] for r in records]
    assert decoded.column("timestamp").cast(pa.int64()).to_pylist() == [r[2] for r in records]
    assert decoded.column("headers").to_pylist() == _headers_column([r[3] for r in records])
    timestamps = [r[2] for r in records]
    assert header.record_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert (header.base_timestamp, header.max_timestamp) == (min(timestamps), max(timestamps))
    assert (header.base_offset, header.partition_leader_epoch, header.attributes) == (base_offset, epoch, attributes)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (producer_id, producer_epoch, base_sequence)
    assert header.size == len(buf)


@PROPERTY
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS))
def test_decode_accepts_bytes_memoryview_and_offset_position(records, compression):
    """decode_batch reads a batch at a non-zero position in bytes or a memoryview alike."""
    batch = bytes(encode_batch(_body(records), compression=compression))
    buf = b"\x00" * 5 + batch
    for view in (buf, memoryview(buf), bytearray(buf)):
        header, decoded = decode_batch(view, 5)
        assert header.size == len(batch) and decoded.num_rows == len(records)


@PROPERTY
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS))
def test_encoded_parts_concatenate_to_the_joined_batch(records, compression):
    """encode_batch_parts computes the CRC across its two buffers: header + body, written one
    after the other (as the producer sends them), is a valid batch identical to encode_batch's."""
    body = _body(records)
    parts = encode_batch_parts(body, compression=compression)
    assert len(parts.header) == HEADER_SIZE and parts.size == len(parts.header) + len(parts.body)
    wire = bytes(parts.header) + bytes(parts.body)
    validate_batch(wire)
    assert wire == bytes(parts.join()) and decode_batch(wire)[1].equals(body)


@pytest.mark.parametrize("n", [1, 10, 1024, 5000, (1 << 20) + 1])
def test_null_headers_encode_without_hidden_child_rows(n):
    """A body whose headers are all null encodes no bigger than one without a headers column
    but for its own schema, validity and offsets, whether the column is a slice of the shared one,
    a grown one, or one built for a size past the sharing limit; and it decodes to n nulls."""
    values = pa.array([b"v"] * n, pa.binary())
    body = make_body(values, timestamps_ms=1_700_000_000_000)
    headers = body.column("headers")
    assert len(headers) == n and headers.null_count == n and len(headers.values) == 0
    without = pa.RecordBatch.from_arrays(body.columns[:3], names=body.schema.names[:3])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, without.schema) as writer:  # not a body schema: encode_body refuses it
        writer.write_batch(without)
    # validity bitmap and list offsets only: no hidden child rows (pa.nulls would add ~12 B a row)
    assert len(encode_body(body)) - len(sink.getvalue()) < 600 + n // 8 + 4 * (n + 1)
    [decoded] = decode_batch(encode_batch(body))[1:]
    assert decoded.column("headers").null_count == n


# -- corruption ----------------------------------------------------------------------------------

_OUTSIDE_CRC = set(range(0, 8)) | set(range(12, 16))  # base_offset, partition_leader_epoch


@settings(max_examples=200)
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS), data=st.data())
def test_any_single_bit_flip_is_detected_except_in_offset_and_epoch(records, compression, data):
    """Flipping one bit anywhere fails validation with CORRUPT_MESSAGE, unless it lies in the
    base_offset or leader epoch, which the CRC deliberately leaves out."""
    buf = encode_batch(_body(records), compression=compression)
    bit = data.draw(st.integers(0, len(buf) * 8 - 1), label="bit")
    corrupt = _flip(buf, bit)
    if bit // 8 in _OUTSIDE_CRC:
        validate_batch(corrupt)
    else:
        with pytest.raises(CorruptMessageError):
            validate_batch(corrupt)


@pytest.mark.parametrize("byte", range(8, 12), ids=lambda b: f"batch_length_byte_{b}")
@pytest.mark.parametrize("bit", range(8))
def test_every_bit_flip_in_batch_length_is_rejected(byte, bit):
    """Each of the 32 single-bit flips of batch_length is rejected as a length mismatch."""
    with pytest.raises(CorruptMessageError):
        validate_batch(_flip(_tiny_batch(), byte * 8 + bit))


@pytest.mark.parametrize("byte", sorted(_OUTSIDE_CRC), ids=lambda b: f"byte_{b}")
def test_flips_in_offset_and_epoch_still_validate(byte):
    """Every bit of base_offset and partition_leader_epoch can change without breaking the CRC."""
    buf = _tiny_batch()
    for bit in range(8):
        validate_batch(_flip(buf, byte * 8 + bit))


def test_every_truncation_is_rejected():
    """A batch cut short at any length, including zero, fails validate_batch."""
    buf = bytes(_tiny_batch())
    for length in range(len(buf)):
        with pytest.raises(CorruptMessageError):
            validate_batch(buf[:length])


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_iter_batches_yields_exactly_the_complete_batches_before_a_torn_tail(compression):
    """Concatenated batches plus a torn tail of any length yield only the complete batches."""
    batches = [
        encode_batch(make_body([b"x" * i] * (i + 1), timestamps_ms=i), compression=compression, base_offset=10 * i)
        for i in range(3)
    ]
    complete = b"".join(batches)
    tail = encode_batch(make_body([b"tail"], timestamps_ms=5), compression=compression, base_offset=99)
    expected = [(sum(len(b) for b in batches[:i]), 10 * i) for i in range(3)]
    for cut in range(len(tail)):
        found = [(pos, h.base_offset) for pos, h in iter_batches(complete + tail[:cut])]
        assert found == expected
    assert [h.base_offset for _, h in iter_batches(complete + tail)] == [0, 10, 20, 99]


def test_iter_batches_raises_on_length_smaller_than_a_header():
    """A length field too small to hold a header cannot be skipped over and is CORRUPT_MESSAGE."""
    buf = _tiny_batch()
    struct.pack_into("<i", buf, 8, 10)
    with pytest.raises(CorruptMessageError):
        list(iter_batches(buf))


def test_iter_batches_with_verify_rejects_a_corrupt_middle_batch():
    """A bad CRC in a complete batch stops iteration with CORRUPT_MESSAGE when verifying."""
    good = _tiny_batch()
    bad = _flip(_tiny_batch(), (HEADER_SIZE + 10) * 8)
    with pytest.raises(CorruptMessageError):
        list(iter_batches(good + bad + good))
    assert len(list(iter_batches(good + bad + good, verify=False))) == 3


def test_decode_body_rejects_row_count_disagreeing_with_header():
    """A well-framed batch whose header claims 2 records but whose body holds 3 fails decoding
    (a client's own check, behind the broker's validate_batch, which rejects it too)."""
    body = make_body([b"a", b"b", b"c"], timestamps_ms=1)
    buf = frame_body(encode_body(body), record_count=2, base_timestamp=1, max_timestamp=1)
    with pytest.raises(CorruptMessageError, match="record_count"):
        validate_batch(buf)
    with pytest.raises(CorruptMessageError, match="rows"):
        decode_body(buf, read_header(buf))


def test_decode_body_rejects_garbage_behind_a_valid_crc():
    """A body that starts like IPC but is not a stream is CORRUPT_MESSAGE, not an Arrow error."""
    buf = frame_body(b"\xff\xff\xff\xff" + b"\x07" * 40, record_count=1, base_timestamp=0, max_timestamp=0)
    with pytest.raises(CorruptMessageError):
        validate_batch(buf)
    with pytest.raises(CorruptMessageError):
        decode_body(buf, read_header(buf))


def test_validate_batch_enforces_max_batch_bytes():
    """A batch one byte over max_batch_bytes is MESSAGE_TOO_LARGE; exactly at the limit passes."""
    buf = _tiny_batch()
    validate_batch(buf, max_batch_bytes=len(buf))
    with pytest.raises(MessageTooLargeError):
        validate_batch(buf, max_batch_bytes=len(buf) - 1)


def test_length_beyond_the_buffer_is_corrupt_even_with_a_size_limit():
    """A batch_length claiming more bytes than exist is CORRUPT_MESSAGE even when a limit is set."""
    buf = _tiny_batch()
    struct.pack_into("<i", buf, 8, 1 << 30)
    with pytest.raises(CorruptMessageError):
        validate_batch(buf, max_batch_bytes=1 << 20)


@pytest.mark.parametrize("bit", [b for b in range(16) if not (1 << b) & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT)])
def test_reserved_attribute_bits_are_rejected(bit):
    """Setting any reserved attribute bit fails validation even though the CRC is recomputed."""
    buf = frame_body(encode_body(make_body([b"v"], timestamps_ms=1)), record_count=1, base_timestamp=1,
                     max_timestamp=1, attributes=struct.unpack("<h", struct.pack("<H", 1 << bit))[0])
    with pytest.raises(CorruptMessageError, match="reserved"):
        validate_batch(buf)


@pytest.mark.parametrize(
    "fields",
    [
        {"record_count": 0, "base_timestamp": 1, "max_timestamp": 1},
        {"record_count": 1, "base_timestamp": 2, "max_timestamp": 1},
    ],
    ids=["zero_record_count", "max_timestamp_before_base"],
)
def test_inconsistent_header_fields_are_rejected(fields):
    """A CRC-valid header with an empty record count or inverted timestamps is CORRUPT_MESSAGE."""
    buf = frame_body(encode_body(make_body([b"v"], timestamps_ms=1)), **fields)
    with pytest.raises(CorruptMessageError):
        validate_batch(buf)


def test_body_that_is_not_arrow_ipc_is_rejected():
    """A CRC-valid batch whose body lacks the IPC continuation marker is CORRUPT_MESSAGE."""
    buf = frame_body(b"\x00" * 64, record_count=1, base_timestamp=0, max_timestamp=0)
    with pytest.raises(CorruptMessageError, match="Arrow"):
        validate_batch(buf)


def test_bad_magic_is_rejected():
    """A magic byte other than 1 is CORRUPT_MESSAGE."""
    buf = _tiny_batch()
    buf[16] = 2
    with pytest.raises(CorruptMessageError, match="magic"):
        validate_batch(buf)


def test_encode_batch_refuses_an_empty_body():
    """A batch holds at least one record: a zero-row body is refused at encode time."""
    with pytest.raises(ValueError):
        encode_batch(make_body([]))


def test_encode_batch_refuses_null_timestamps():
    """Every record needs a timestamp: a null in the timestamp column is refused."""
    body = make_body([b"a", b"b"], timestamps_ms=pa.array([1, None], pa.int64()))
    with pytest.raises(ValueError):
        encode_batch(body)


def test_encode_body_rejects_unknown_compression():
    """Only none, lz4 and zstd are accepted as compression names."""
    with pytest.raises(ValueError, match="compression"):
        encode_body(make_body([b"v"], timestamps_ms=1), "gzip")


# -- CRC-consistent garbage: a buggy or hostile producer computes a valid CRC over a bad body -------


def _reframed_flips(compression: str):
    """Every single-bit flip of a fixed IPC body (past its continuation marker), re-framed with a
    correct CRC: the broker rejects those its constant-cost checks see; a flip inside a buffer
    (the values, say) passes them, so the decoder is the clients' last line of defence."""
    body = make_body([b"value%d" % i for i in range(5)], keys=[b"k"] * 5, timestamps_ms=[1, 2, 3, 4, 5],
                     headers=[[{"key": "h", "value": b"x"}]] * 5)
    ipc = bytes(encode_body(body, compression))
    for bit in range(32, len(ipc) * 8):
        flipped = _flip(ipc, bit)
        buf = frame_body(bytes(flipped), record_count=5, base_timestamp=1, max_timestamp=5)
        yield bit, buf, read_header(buf)


def test_decode_body_raises_only_corrupt_message_for_garbage_bodies():
    """Any CRC-consistent corruption of a compressed body decodes or raises CORRUPT_MESSAGE, nothing else."""
    leaked = {}
    for bit, buf, header in _reframed_flips("lz4"):
        try:
            decode_body(buf, header)
        except CorruptMessageError:
            pass
        except Exception as err:  # noqa: BLE001 - collecting what leaks is the point
            leaked.setdefault(type(err).__name__, bit)
    assert leaked == {}


def test_decode_body_never_returns_a_structurally_invalid_batch():
    """A CRC-consistent body with broken offsets/buffers is rejected, never handed to the caller."""
    invalid = {}
    for bit, buf, header in _reframed_flips("none"):
        try:
            batch = decode_body(buf, header)
        except CorruptMessageError:
            continue
        try:
            batch.validate(full=True)  # safe: checks bounds without reading out of them
        except pa.ArrowInvalid as err:
            invalid.setdefault(str(err)[:40], bit)
    assert invalid == {}


def test_decode_body_rejects_a_body_outside_the_standard_schema():
    """A CRC-valid batch whose body has some other schema is CORRUPT_MESSAGE, not a foreign batch."""
    other = pa.record_batch({"x": pa.array([1, 2], pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_batch(other)
    buf = frame_body(sink.getvalue(), record_count=2, base_timestamp=0, max_timestamp=0)
    with pytest.raises(CorruptMessageError):
        decode_body(buf, read_header(buf))


# -- the body's Arrow structure at constant cost (validate_batch reads no buffer) ------------------

TS = 1_700_000_000_000


def _ipc(batch: pa.RecordBatch, schema: pa.Schema | None = None, **options) -> bytes:
    """A plain pyarrow IPC stream of `batch`, end-of-stream marker included (any Arrow writer's)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema or batch.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _three() -> pa.RecordBatch:
    return make_body([b"a", b"b", b"c"], timestamps_ms=TS)


def _framed(ipc: bytes, record_count: int = 3, **fields) -> bytearray:
    return frame_body(ipc, record_count=record_count, base_timestamp=TS, max_timestamp=TS, **fields)


def _recrc(buf: bytearray) -> bytearray:
    struct.pack_into("<I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return buf


def _schema_end(ipc: bytes) -> int:
    return 8 + struct.unpack_from("<i", ipc, 4)[0]


def _with_schema(schema: pa.Schema, columns: list[pa.Array]) -> bytes:
    return _ipc(pa.RecordBatch.from_arrays(columns, schema=schema))


def _foreign_schema(change) -> bytes:
    """A three-row body whose schema is the record schema with one field replaced by change(field)."""
    body = _three()
    fields = [change(f) if f.name == "timestamp" else f for f in BODY_SCHEMA]
    columns = [c.cast(f.type) for c, f in zip(body.columns, fields)]
    return _with_schema(pa.schema(fields), columns)


_OURS = encode_body(_three()).to_pybytes()  # schema message + record batch message, no end marker
_OURS_SCHEMA_END = _schema_end(_OURS)
_THEIRS = _ipc(_three())  # the same with the end-of-stream marker
_HEADERS_AS_ELEMENT = pa.field("headers", pa.list_(pa.field("element", BODY_SCHEMA.field("headers").type.value_type)))

STRUCTURE_CASES = [
    # id (the rule), batch bytes, words the CORRUPT_MESSAGE text must contain
    ("record-count-above-body-rows", lambda: _framed(_OURS, record_count=1000), "length 3 rows != record_count 1000"),
    ("record-count-below-body-rows", lambda: _framed(_OURS, record_count=2), "length 3 rows != record_count 2"),
    ("schema-foreign-columns", lambda: _framed(_ipc(pa.record_batch({"x": pa.array([1, 2, 3])}))), "1 fields (x)"),
    ("schema-extra-column", lambda: _framed(_with_schema(BODY_SCHEMA.append(pa.field("extra", pa.int8())),
                                                         _three().columns + [pa.array([1, 2, 3], pa.int8())])),
     "field 4 is named 'extra'"),
    ("schema-renamed-column", lambda: _framed(_foreign_schema(lambda f: f.with_name("ts"))), "field 2 is named 'ts'"),
    ("schema-timestamp-unit", lambda: _framed(_foreign_schema(lambda f: f.with_type(pa.timestamp("us", tz="UTC")))),
     "field 2 'timestamp' has type timestamp[us, tz=UTC]"),
    ("schema-timestamp-zone", lambda: _framed(_foreign_schema(lambda f: f.with_type(pa.timestamp("ms")))),
     "field 2 'timestamp' has type timestamp[ms]"),
    ("schema-timestamp-nullable", lambda: _framed(_foreign_schema(lambda f: f.with_nullable(True))),
     "field 2 'timestamp' is nullable"),
    ("schema-offset-delta-nullable", lambda: _framed(_with_schema(
        BODY_SCHEMA.append(pa.field("offset_delta", pa.int32())), _three().columns + [pa.array([0, 1, 2], pa.int32())])),
     "field 4 'offset_delta' is nullable"),
    ("schema-message-not-flatbuffer", lambda: _framed(
        b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x07" * 16 + _OURS[_OURS_SCHEMA_END:]),
     "schema message"),
    ("garbage-after-marker", lambda: _framed(b"\xff\xff\xff\xff" + random.Random(3).randbytes(600)), "schema message"),
    ("no-record-batch-message", lambda: _framed(_OURS[:_OURS_SCHEMA_END]),
     "record batch message at body byte 424: 0 bytes"),
    ("end-of-stream-instead-of-batch", lambda: _framed(_OURS[:_OURS_SCHEMA_END] + b"\xff\xff\xff\xff\0\0\0\0"),
     "metadata_length 0"),
    ("record-batch-message-truncated", lambda: _framed(_OURS[:-16]), "bodyLength"),
    ("trailing-garbage-after-batch", lambda: _framed(_OURS + b"\0" * 16), "bodyLength"),
    ("trailing-bytes-instead-of-end-marker", lambda: _framed(_OURS + b"\xff" * 8), "end-of-stream marker"),
    ("two-record-batches", lambda: _framed(_OURS + _THEIRS[_schema_end(_THEIRS):]), "bodyLength"),
    ("standard-schema-with-offset-gap", lambda: _framed(_OURS, last_offset_delta=5),
     "last_offset_delta 5 != record_count 3 - 1"),
]


@pytest.mark.parametrize("make, words", [c[1:] for c in STRUCTURE_CASES], ids=[c[0] for c in STRUCTURE_CASES])
def test_validate_batch_rejects_a_body_that_disagrees_with_header_or_schema(make, words):
    """A CRC-valid batch whose Arrow body breaks one structural rule is CORRUPT_MESSAGE, the
    message naming the field and the batch's position."""
    buf = make()
    with pytest.raises(CorruptMessageError, match="batch at byte 0") as raised:
        validate_batch(buf)
    assert words in str(raised.value)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_body_with_the_end_of_stream_marker_is_accepted(compression):
    """The end-of-stream marker is optional: another writer's body ending with it validates."""
    ipc = _ipc(_three(), compression=None if compression == "none" else compression)
    assert ipc.endswith(b"\xff\xff\xff\xff\0\0\0\0")
    assert decode_batch(_framed(ipc))[1].equals(_three())


@pytest.mark.parametrize(
    "schema",
    [
        BODY_SCHEMA.with_metadata({"writer": "another Arrow library"}),
        pa.schema([f.with_metadata({"doc": "x"}) for f in BODY_SCHEMA]),
        pa.schema([*list(BODY_SCHEMA)[:3], _HEADERS_AS_ELEMENT]),
    ],
    ids=["schema-metadata", "field-metadata", "list-item-named-element"],
)
def test_an_equal_schema_encoded_differently_is_accepted_and_remembered(schema):
    """Another writer's encoding of the same names, types and nullability passes; the second time
    it is a cache hit (a bytes compare), not a decode."""
    from segment_format.record import _layout_of_schema_message

    ipc = _ipc(pa.RecordBatch.from_arrays(_three().columns, schema=schema))
    assert ipc[: _schema_end(ipc)] != BODY_SCHEMA.serialize().to_pybytes()
    buf = _framed(ipc)
    validate_batch(buf)
    hits = _layout_of_schema_message.cache_info().hits
    validate_batch(buf)
    assert _layout_of_schema_message.cache_info().hits == hits + 1
    assert decode_batch(buf)[1].num_rows == 3


def test_metadata_version_v4_is_accepted():
    """A body written with pre-1.0 metadata (V4: no unions here, so the same layout) validates."""
    ipc = _ipc(_three(), metadata_version=pa.ipc.MetadataVersion.V4)
    assert decode_batch(_framed(ipc))[1].equals(_three())


# -- timestamps ----------------------------------------------------------------------------------

NOW = 1_800_000_000_000
BOUNDS = TimestampBounds(before_max_ms=86_400_000, after_max_ms=3_600_000)


def _stamped(base: int, top: int) -> bytearray:
    return frame_body(encode_body(make_body([b"a", b"b"], timestamps_ms=[base, top])), record_count=2,
                      base_timestamp=base, max_timestamp=top)


TIMESTAMP_CASES = [
    # id, base_timestamp, max_timestamp, bounds, error (None: accepted)
    ("negative-base", -5, 10, BOUNDS, "base_timestamp -5 is negative"),
    ("negative-base-log-append-time", -5, 10, None, "base_timestamp -5 is negative"),
    ("zero-base", 0, NOW, None, None),
    ("past-beyond-before-max", NOW - BOUNDS.before_max_ms - 1, NOW, BOUNDS, "message.timestamp.before.max.ms"),
    ("past-at-before-max", NOW - BOUNDS.before_max_ms, NOW, BOUNDS, None),
    ("future-beyond-after-max", NOW, NOW + BOUNDS.after_max_ms + 1, BOUNDS, "message.timestamp.after.max.ms"),
    ("future-at-after-max", NOW, NOW + BOUNDS.after_max_ms, BOUNDS, None),
    ("far-future-log-append-time", NOW, NOW + 10**12, None, None),
]


@pytest.mark.parametrize("base, top, bounds, error", [c[1:] for c in TIMESTAMP_CASES], ids=[c[0] for c in TIMESTAMP_CASES])
def test_producer_timestamps_are_checked_against_the_clock(base, top, bounds, error):
    """With producer input a negative base_timestamp is INVALID_TIMESTAMP, and with
    bounds (CreateTime) so is one outside [now - before.max, now + after.max]; the bounds are
    inclusive. LogAppendTime topics pass no bounds."""
    buf = _stamped(base, top)
    if error is None:
        validate_batch(buf, producer=ProducerInput(NOW, bounds))
    else:
        with pytest.raises(InvalidTimestampError, match="batch at byte 0") as raised:
            validate_batch(buf, producer=ProducerInput(NOW, bounds))
        assert error in str(raised.value) and raised.value.code == 32
    validate_batch(buf)  # followers and recovery keep whatever the leader accepted


# -- what only a producer may not write (INVALID_RECORD) -----------------------------------------


@pytest.mark.parametrize("make, words", [c[1:] for c in FORGED_BATCHES], ids=[c[0] for c in FORGED_BATCHES])
def test_a_batch_no_producer_may_write_is_invalid_record_from_a_producer(make, words):
    """A compacted body, an offset gap, or the control / transactional bit from a producer is
    INVALID_RECORD (Kafka's code 87) naming why and where, before any timestamp check."""
    with pytest.raises(InvalidRecordError, match="batch at byte 0") as raised:
        validate_batch(make(), producer=ProducerInput(NOW, None))
    assert words in str(raised.value) and raised.value.code == 87 and raised.value.name() == "INVALID_RECORD"


@pytest.mark.parametrize("make", [c[1] for c in FORGED_BATCHES if "gap" not in c[0]],
                         ids=[c[0] for c in FORGED_BATCHES if "gap" not in c[0]])
def test_a_batch_only_a_leader_writes_passes_follower_and_recovery_validation(make):
    """Compacted bodies and control / transactional batches are the leader's to write: without
    producer input (a follower's copy, recovery) the validator keeps them."""
    buf = make()
    assert validate_batch(buf).record_count == read_header(buf).record_count


def test_an_offset_gap_in_a_standard_body_is_corrupt_for_followers_too():
    """Only a compacted body has gaps: a standard one claiming more offsets than records is
    CORRUPT_MESSAGE on every path, INVALID_RECORD (the more precise code) only from a producer."""
    with pytest.raises(CorruptMessageError, match="last_offset_delta 3 != record_count 2 - 1"):
        validate_batch(with_gap(2))


@PROPERTY
@given(deltas=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=5),
       attributes=st.sampled_from([0, CONTROL_BIT, TRANSACTIONAL_BIT, CONTROL_BIT | TRANSACTIONAL_BIT]))
def test_no_compacted_body_passes_as_producer_input(deltas, attributes):
    """Whatever offset deltas a compacted body claims (ordered or not) and whatever attribute bits
    it sets, a producer's batch in that layout is INVALID_RECORD (CORRUPT_MESSAGE when the last
    delta is below record_count - 1, which no batch may claim); a standard one only for the bits."""
    body = make_body([b"v"] * len(deltas), timestamps_ms=TS, offset_deltas=deltas)
    error = InvalidRecordError if deltas[-1] >= len(deltas) - 1 else CorruptMessageError
    with pytest.raises(error, match="inconsistent batch offset range" if error is InvalidRecordError else "record_count"):
        validate_batch(encode_batch(body, attributes=attributes), producer=ProducerInput(NOW, None))
    standard = encode_batch(make_body([b"v"] * len(deltas), timestamps_ms=TS), attributes=attributes)
    if attributes:
        with pytest.raises(InvalidRecordError):
            validate_batch(standard, producer=ProducerInput(NOW, None))
    else:
        assert validate_batch(standard, producer=ProducerInput(NOW, None)).last_offset_delta == len(deltas) - 1


# -- a producer's body is decoded and validated in full before it is stored ---------------------


@pytest.mark.parametrize("make, words", [c[1:] for c in POISON_BATCHES], ids=[c[0] for c in POISON_BATCHES])
def test_a_poison_body_is_corrupt_from_a_producer_though_its_structure_passes(make, words):
    """Value offsets past the data buffer, decreasing or negative offsets, a header key that is
    not UTF-8, a compressed buffer that does not decompress: the CRC and the IPC metadata hold
    (followers and recovery keep such a batch), but every consumer's decode_body fails, so a
    producer's is CORRUPT_MESSAGE naming the batch's byte position and the Arrow check."""
    buf = make()
    validate_batch(buf)
    with pytest.raises(CorruptMessageError):
        decode_batch(buf)
    with pytest.raises(CorruptMessageError, match="batch at byte 0: bad Arrow body") as raised:
        validate_batch(buf, producer=ProducerInput(NOW, None))
    assert words in str(raised.value) and raised.value.code == 2


@pytest.mark.parametrize("make", [c[1] for c in BODY_TIMESTAMP_BATCHES], ids=[c[0] for c in BODY_TIMESTAMP_BATCHES])
def test_body_timestamps_other_than_the_header_claims_are_invalid_timestamp(make):
    """Year 3000, int64 max or -1 in the body under a header that claims a timestamp inside the
    topic's bounds is INVALID_TIMESTAMP (Kafka checks each record's): the body's min and max
    must be the header's base_timestamp and max_timestamp, on LogAppendTime topics too."""
    buf = make()
    for bounds in (TimestampBounds(2**63 - 1, 2**63 - 1 - NOW), None):
        with pytest.raises(InvalidTimestampError, match="batch at byte 0: record timestamps run from") as raised:
            validate_batch(buf, producer=ProducerInput(NOW, bounds))
        assert raised.value.code == 32
    validate_batch(buf)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_body_declaring_more_decompressed_bytes_than_allowed_is_too_large(compression):
    """A compressed body whose buffers declare more bytes than message.decompressed.max.bytes is
    MESSAGE_TOO_LARGE before anything is allocated: a forged 1 TiB length, and a real 1 MiB of
    zeros (a few KiB on the wire) against a 64 KiB bound, which passes under a 2 MiB one."""
    with pytest.raises(MessageTooLargeError, match="decompresses to 1099511627"):
        validate_batch(decompression_bomb(compression, 1 << 40), producer=ProducerInput(NOW, None, 64 << 20))
    zeros = encode_batch(make_body([bytes(1 << 20)], timestamps_ms=TS), compression=compression)
    assert len(zeros) < 8 << 10
    with pytest.raises(MessageTooLargeError, match="message.decompressed.max.bytes 65536"):
        validate_batch(zeros, producer=ProducerInput(NOW, None, 64 << 10))
    validate_batch(zeros, producer=ProducerInput(NOW, None, 2 << 20))


@PROPERTY
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS))
def test_every_batch_a_producer_encodes_passes_the_leaders_full_check(records, compression):
    """No false alarm: whatever records encode_batch writes (nulls, headers, any timestamps in
    range, each compression) pass the producer body check."""
    keys, values, stamps, headers = (list(column) for column in zip(*records))
    body = make_body(values, keys=keys, timestamps_ms=stamps, headers=_headers_column(headers))
    validate_batch(encode_batch(body, compression=compression), producer=ProducerInput(NOW, None))


# -- compacted bodies and offsets ----------------------------------------------------------------


def test_a_compacted_batch_round_trips_with_its_offset_gaps():
    """A body with offset_delta [0, 3, 7] encodes with last_offset_delta 7, validates, decodes, and
    record_offsets gives base_offset + delta; a plain body gives base_offset + row index."""
    body = make_body([b"a", b"b", b"c"], timestamps_ms=TS, offset_deltas=[0, 3, 7])
    buf = encode_batch(body, base_offset=100, compression="zstd")
    header, decoded = decode_batch(buf)
    assert (header.record_count, header.last_offset_delta, header.next_offset) == (3, 7, 108)
    assert decoded.equals(body) and decoded.schema.equals(COMPACTED_BODY_SCHEMA)
    assert record_offsets(header, decoded).to_pylist() == [100, 103, 107]
    header, decoded = decode_batch(encode_batch(_three(), base_offset=100))
    assert record_offsets(header, decoded).to_pylist() == [100, 101, 102]
    assert record_offsets(header, decoded).type == pa.int64()


@pytest.mark.parametrize(
    "deltas, last, words",
    [([0, 3, 3], 3, "strictly increasing"), ([0, 4, 2], 2, "strictly increasing"), ([-1, 0, 5], 5, "from -1"),
     ([0, 3, 7], 9, "last_offset_delta 9")],
    ids=["repeated-delta", "decreasing-delta", "negative-first-delta", "last-delta-not-header"],
)
def test_decode_body_rejects_bad_offset_deltas(deltas, last, words):
    """The broker checks a compacted batch only at constant cost; the client's decode checks the
    deltas themselves (Arrow kernels) and refuses offsets that are not strictly increasing or end
    elsewhere than the header says."""
    body = make_body([b"a", b"b", b"c"], timestamps_ms=TS, offset_deltas=deltas)
    buf = _framed(encode_body(body), last_offset_delta=last)
    validate_batch(buf)
    with pytest.raises(CorruptMessageError, match=words):
        decode_body(buf, read_header(buf))


@PROPERTY
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS),
       gaps=st.lists(st.integers(1, 1000), min_size=12, max_size=12), base_offset=st.integers(0, 2**62))
def test_any_valid_body_passes_and_plain_pyarrow_reads_it(records, compression, gaps, base_offset):
    """Any records, compression and (for compacted bodies) offset gaps make a batch validate_batch
    accepts, and whose body plain `pyarrow.ipc.open_stream` reads with no pymq code."""
    for deltas in (None, [sum(gaps[:i]) for i in range(len(records))]):
        body = _body(records)
        if deltas is not None:
            body = pa.RecordBatch.from_arrays(body.columns + [pa.array(deltas, pa.int32())], schema=COMPACTED_BODY_SCHEMA)
        buf = encode_batch(body, compression=compression, base_offset=base_offset)
        header = validate_batch(buf)
        plain = pa.ipc.open_stream(bytes(buf[HEADER_SIZE:])).read_all()
        assert plain.equals(pa.Table.from_batches([body]))
        assert record_offsets(header, body).to_pylist() == [base_offset + d for d in (deltas or range(len(records)))]


# -- per-batch overhead ------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("n", [1, 100, 2000])  # 2000 x 100 B is past the small-body shortcut
def test_encoded_body_leaves_out_the_end_of_stream_marker(compression, n):
    """The header frames the body, so the 8-byte end-of-stream marker is not written: the body is
    the schema message and the record batch message, nothing more, byte for byte what Arrow's
    stream writer writes (whether or not the small-body shortcut wrote it)."""
    body = make_body([b"%099d" % i for i in range(n)], timestamps_ms=TS)
    ipc = encode_body(body, compression).to_pybytes()
    assert ipc.startswith(BODY_SCHEMA.serialize().to_pybytes())
    compressed = compression != "none" and n > 1  # one record would grow compressed: it is written plain
    assert ipc + b"\xff\xff\xff\xff\0\0\0\0" == _ipc(body, compression=compression if compressed else None)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
@pytest.mark.parametrize("n", [1, 10, 1000])
def test_compression_never_makes_a_body_larger(compression, n):
    """A batch that compression would grow (small ones: a frame and an 8-byte length per buffer)
    is written uncompressed; a large compressible one is compressed."""
    body = make_body([b"%099d" % i for i in range(n)], timestamps_ms=TS)
    plain, packed = len(encode_body(body, "none")), len(encode_body(body, compression))
    assert packed <= plain
    if n == 1000:
        assert packed < plain // 2
    assert decode_batch(encode_batch(body, compression=compression))[1].equals(body)


# -- hostile metadata: every checked field, and any bytes at all ---------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _metadata_fields(ipc: bytes) -> dict[str, tuple[int, str, object]]:
    """Where the checked fields of a valid body sit: name -> (byte position in the body, struct
    format, strategy of values that break the rule). Found independently of segment_format.arrow_ipc,
    with the flatbuffers Table accessors over pyarrow's output and Arrow's Message.fbs slots."""
    from flatbuffers import number_types as fb
    from flatbuffers.table import Table

    schema_end = _schema_end(ipc)
    meta_start = schema_end + 8
    meta = ipc[meta_start : meta_start + struct.unpack_from("<i", ipc, schema_end + 4)[0]]
    body_length = len(ipc) - meta_start - len(meta)

    def at(table: Table, slot: int) -> int:
        offset = table.Offset(4 + 2 * slot)
        assert offset, f"slot {slot} absent"
        return table.Pos + offset

    message = Table(meta, Table(meta, 0).Get(fb.UOffsetTFlags, 0))
    batch = Table(meta, message.Indirect(at(message, 2)))
    nodes, buffers = batch.Vector(batch.Offset(6)), batch.Vector(batch.Offset(8))
    rows = struct.unpack_from("<q", meta, at(batch, 0))[0]
    not_rows = st.integers(INT64_MIN, INT64_MAX).filter(lambda v: v != rows)
    outside = st.integers(INT64_MIN, -1) | st.integers(body_length + 1, 2**62)
    fields = {
        "schema-continuation": (0, "<I", st.integers(0, 2**32 - 2)),
        "schema-metadata-length": (4, "<i", st.integers(-(2**31), 2**31 - 1).filter(lambda v: v != schema_end - 8)),
        "batch-continuation": (schema_end, "<I", st.integers(0, 2**32 - 2)),
        "batch-metadata-length": (schema_end + 4, "<i", st.integers(-(2**31), 2**31 - 1).filter(lambda v: v != len(meta))),
        "version": (meta_start + at(message, 0), "<h", st.integers(-(2**15), 2**15 - 1).filter(lambda v: v not in (3, 4))),
        "header-type": (meta_start + at(message, 1), "<B", st.integers(0, 255).filter(lambda v: v != 3)),
        "body-length": (meta_start + at(message, 3), "<q",
                        st.integers(INT64_MIN, INT64_MAX).filter(lambda v: v != body_length)),
        "row-count": (meta_start + at(batch, 0), "<q", not_rows),
        "node-count": (meta_start + nodes - 4, "<I", st.integers(0, 2**32 - 1).filter(lambda v: v != 7)),
        "buffer-count": (meta_start + buffers - 4, "<I", st.integers(0, 2**32 - 1).filter(lambda v: v != 17)),
        "timestamp-null-count": (meta_start + nodes + 2 * 16 + 8, "<q", st.integers(INT64_MIN, INT64_MAX).filter(bool)),
    }
    for text in (b"key", b"value", b"timestamp", b"headers", b"UTC"):  # field names (struct children too), time zone
        found = -1
        while (found := ipc.find(text, found + 1, schema_end)) >= 0:
            original = ipc[found]
            fields[f"schema-{text.decode()}-at-{found}"] = (found, "<B",
                                                            st.integers(0, 255).filter(lambda v, o=original: v != o))
    for i, column in enumerate(["key", "value", "timestamp", "headers"]):
        fields[f"{column}-node-length"] = (meta_start + nodes + 16 * i, "<q", not_rows)
    for column, i in [("key", 0), ("headers", 3)]:  # nullable: 0 <= null_count <= rows
        fields[f"{column}-null-count"] = (meta_start + nodes + 16 * i + 8, "<q",
                                          st.integers(INT64_MIN, -1) | st.integers(rows + 1, INT64_MAX))
    for i in range(17):
        fields[f"buffer-{i}-offset"] = (meta_start + buffers + 16 * i, "<q", outside)
        fields[f"buffer-{i}-length"] = (meta_start + buffers + 16 * i + 8, "<q", outside)
    if batch.Offset(10):
        compression = Table(meta, batch.Indirect(at(batch, 3)))
        if compression.Offset(4):
            fields["codec"] = (meta_start + at(compression, 0), "<b",
                               st.integers(-128, 127).filter(lambda v: v not in (0, 1)))
    return fields


HOSTILE_ROWS = 100


def _hostile_body() -> bytes:
    """A zstd body with nulls and headers, large and repetitive enough to stay compressed."""
    body = make_body([b"value-%050d" % i for i in range(HOSTILE_ROWS)], keys=[b"k", None] * (HOSTILE_ROWS // 2),
                     timestamps_ms=TS, headers=[None, [{"key": "h", "value": b"x"}]] * (HOSTILE_ROWS // 2))
    return encode_body(body, "zstd").to_pybytes()


_HOSTILE = _hostile_body()
_HOSTILE_FIELDS = _metadata_fields(_HOSTILE)


def test_the_hostile_body_is_valid_and_compressed_with_zstd():
    """The body the hostile-metadata properties corrupt validates untouched and carries a codec field."""
    assert "codec" in _HOSTILE_FIELDS
    validate_batch(_framed(_HOSTILE, record_count=HOSTILE_ROWS))


@settings(max_examples=400)
@given(data=st.data(), name=st.sampled_from(sorted(_HOSTILE_FIELDS)))
def test_any_single_field_corruption_of_the_metadata_is_rejected(data, name):
    """Setting any one checked field of the schema or record batch message to a value its rule
    forbids (re-CRC'd, so only the structure check can catch it) is CORRUPT_MESSAGE, never an
    IndexError, struct.error or other exception from reading the hostile flatbuffer."""
    position, fmt, values = _HOSTILE_FIELDS[name]
    ipc = bytearray(_HOSTILE)
    struct.pack_into(fmt, ipc, position, data.draw(values, label=name))
    with pytest.raises(CorruptMessageError):
        validate_batch(_framed(bytes(ipc), record_count=HOSTILE_ROWS))


@settings(max_examples=500)
@given(data=st.data(), count=st.integers(1, 6))
def test_any_bytes_in_the_metadata_raise_nothing_but_corrupt_message(data, count):
    """Overwriting up to six bytes anywhere in the two messages' metadata (re-CRC'd) either leaves
    a body the checks accept or is CORRUPT_MESSAGE: no other exception escapes the reads."""
    schema_end = _schema_end(_HOSTILE)
    batch_end = schema_end + 8 + struct.unpack_from("<i", _HOSTILE, schema_end + 4)[0]
    ipc = bytearray(_HOSTILE)
    for _ in range(count):
        ipc[data.draw(st.integers(0, batch_end - 1), label="at")] = data.draw(st.integers(0, 255), label="byte")
    try:
        validate_batch(_framed(bytes(ipc), record_count=HOSTILE_ROWS))
    except CorruptMessageError:
        pass


# -- the reader's shortcuts ----------------------------------------------------------------------


def test_iter_batches_without_the_body_check_still_verifies_the_crc():
    """Consumers skip the structural body check (decode_body checks the body fully), never the CRC."""
    buf = encode_batch(make_body([b"a", b"b"], timestamps_ms=TS))
    assert [h.record_count for _, h in iter_batches(buf, check_body=False)] == [2]
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError, match="CRC"):
        list(iter_batches(buf, check_body=False))


def test_decode_body_refuses_a_standard_body_whose_header_claims_offset_gaps():
    """Only a compacted body (with offset deltas) may have gaps; a reader that skipped the
    structural check learns it from decode_body."""
    body = make_body([b"a", b"b"], timestamps_ms=TS)
    buf = frame_body(encode_body(body), record_count=2, base_timestamp=TS, max_timestamp=TS, last_offset_delta=5)
    with pytest.raises(CorruptMessageError, match="last_offset_delta"):
        decode_body(buf, read_header(buf))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_decode_body_reads_pymq_and_foreign_encodings_alike(compression):
    """A body whose schema message is pymq's own takes the shortcut (no stream reader); one
    written by another Arrow writer (schema metadata added) is read in full: same rows."""
    body = make_body([b"%099d" % i for i in range(50)], timestamps_ms=TS)
    ours = encode_batch(body, compression=compression)
    foreign_schema = BODY_SCHEMA.with_metadata({"writer": "other"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, foreign_schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(body.columns, schema=foreign_schema))
    theirs = frame_body(sink.getvalue(), record_count=50, base_timestamp=TS, max_timestamp=TS)
    for buf in (ours, theirs):
        assert decode_body(buf, read_header(buf)).to_pydict() == body.to_pydict()


def test_complete_prefix_counts_only_whole_batches():
    """A fetch response cut mid-batch: only the whole batches at its start count."""
    from segment_format.batch_body import make_body
    from segment_format.record import complete_prefix

    one = encode_batch(make_body([b"v"] * 3, timestamps_ms=1_000))
    two = bytes(one) * 2
    assert complete_prefix(two) == len(two)
    assert complete_prefix(two[:-1]) == len(one)
    assert complete_prefix(two[:5]) == 0
    assert complete_prefix(b"") == 0
