"""BodyTemplate writes exactly the bytes pyarrow writes for the shapes it takes, and the producer
uses it only for those shapes."""
from __future__ import annotations

import struct

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format import arrow_ipc, batch_body, body_template, record
from client.producer_batch import ProducerBatch

values_st = st.lists(st.binary(max_size=300), min_size=1, max_size=body_template.MAX_RECORDS)


@settings(max_examples=60)
@given(values=values_st, keyed=st.booleans(), data=st.data())
def test_template_bytes_equal_pyarrows(values, keyed, data):
    n = len(values)
    keys = data.draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n)) if keyed else None
    timestamps = data.draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n))
    template = body_template.template_for(keyed)
    assert template is not None, "pyarrow's layout changed: the producer lost its fast path"
    expected = batch_body.encode_body(batch_body.make_body(values, keys, timestamps)).to_pybytes()
    assert template.encode(keys, values, timestamps) == expected


def encoded_records(keys, values, headers=None, compression="none"):
    batch = ProducerBatch("t", 0)
    for i, (key, value) in enumerate(zip(keys, values)):
        batch.keys.append(key)
        batch.values.append(value)
        batch.timestamps.append(1_000 + i)
    batch.headers = headers
    encoded = batch.encode(compression)
    data = bytearray(bytes(encoded.header) + bytes(encoded.body))
    header = record.validate_batch(data, 0)
    return header, record.decode_body(memoryview(data), header, 0)


def test_every_shape_the_producer_batches_round_trips_through_the_validator_and_decoder():
    """Template shapes (null keys, set keys) and the ones that go through pyarrow (mixed keys,
    null values, headers, compression) all validate and decode to what was sent."""
    shapes = [
        ([None, None], [b"a", b"bb"], None, "none"),
        ([b"k1", b"k2"], [b"a", b""], None, "none"),
        ([b"k1", None], [b"a", b"b"], None, "none"),
        ([None, None], [b"a", None], None, "none"),
        ([None, None], [b"a", b"b"], [[("h", b"1")], None], "none"),
        ([None, None], [b"a" * 500, b"b"], None, "lz4"),
    ]
    for keys, values, headers, compression in shapes:
        header, body = encoded_records(keys, values, headers, compression)
        assert header.record_count == len(values)
        assert body.column("key").to_pylist() == keys
        assert body.column("value").to_pylist() == values
        assert body.column("timestamp").cast(pa.int64()).to_pylist() == [1_000 + i for i in range(len(values))]


def body_of(keys, values):
    batch = ProducerBatch("t", 0)
    for i, (key, value) in enumerate(zip(keys, values)):
        batch.keys.append(key)
        batch.values.append(value)
        batch.timestamps.append(1_000 + i)
    encoded = batch.encode("none")
    return bytearray(bytes(encoded.header) + bytes(encoded.body))


@settings(max_examples=200)
@given(keyed=st.booleans(), slot=st.integers(0, 3), index=st.integers(0, 33), value=st.integers(-2**63, 2**63 - 1))
def test_the_validator_reads_a_known_shape_exactly_as_it_walks_any_other(keyed, slot, index, value):
    """Whatever number a known-shape body carries (row count, bodyLength, a node or buffer
    value), the validator decides as the flatbuffer walk does: the same acceptance, the same error."""
    keys = [b"k1", b"k2", b"k3"] if keyed else [None] * 3
    data = body_of(keys, [b"a", b"bb", b"ccc"])
    layout = batch_body.STANDARD_LAYOUT
    body_at = record.HEADER_SIZE + len(layout.schema_message)
    shape = body_template.template_for(keyed).shape
    metadata_at = body_at + 8
    place = [(shape.length_at, 0), (shape.body_length_at, 0), (shape.nodes_at, index % 14), (shape.buffers_at, index)][slot]
    struct.pack_into("<q", data, metadata_at + place[0] + 8 * place[1], value)
    assert shape.numbers(bytes(data[metadata_at:metadata_at + len(shape.metadata)])) is not None  # the fast path
    body = memoryview(data)[record.HEADER_SIZE:]
    schema_end = len(layout.schema_message)

    def outcome(shapes):
        try:
            return arrow_ipc.read_record_batch(body, schema_end, nodes=layout.nodes, buffers=layout.buffers,
                                               max_metadata_bytes=4096, shapes=shapes)
        except arrow_ipc.IpcFormatError as err:
            return str(err)

    assert outcome((shape,)) == outcome(())
