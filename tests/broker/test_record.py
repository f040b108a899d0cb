"""Record batch codec (broker/record.py): known bytes pin the 61-byte header, hypothesis proves
round trips and that every single-bit corruption covered by the CRC is detected."""
from __future__ import annotations

import struct

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import CorruptMessageError, MessageTooLargeError
from broker.record import (
    COMPRESSIONS,
    CONTROL_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    batch_size_at,
    decode_batch,
    decode_body,
    encode_batch,
    encode_batch_parts,
    encode_body,
    frame_body,
    iter_batches,
    make_body,
    patch_offsets,
    read_header,
    validate_batch,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

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
    """A three-record batch has every DESIGN.md section 2 field at its little-endian offset."""
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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
