"""BodyTemplate writes exactly the bytes pyarrow writes for the shapes it takes, and the producer
uses it only for those shapes."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import body_template, record
from broker.client.producer import ProducerBatch

values_st = st.lists(st.binary(max_size=300), min_size=1, max_size=body_template.MAX_RECORDS)


@settings(max_examples=60, deadline=None)
@given(values=values_st, keyed=st.booleans(), data=st.data())
def test_template_bytes_equal_pyarrows(values, keyed, data):
    n = len(values)
    keys = data.draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n)) if keyed else None
    timestamps = data.draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n))
    template = body_template.template_for(keyed)
    assert template is not None, "pyarrow's layout changed: the producer lost its fast path"
    expected = record.encode_body(record.make_body(values, keys, timestamps)).to_pybytes()
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
