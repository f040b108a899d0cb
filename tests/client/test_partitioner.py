"""Partitioners: the vectorized murmur3 agrees with mmh3 bit for bit, murmur2 with Kafka's own
test vectors and the scalar with the vectorized one, key -> partition is pinned for both, null
keys are left to the sticky partitioner, which moves on only when its own batch is sealed."""
from __future__ import annotations

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.partitioner import (
    StickyPartitioner,
    murmur2,
    murmur2_32,
    murmur3_32,
    partition_for_key,
    partitions_for_keys,
)

keys_strategy = st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=100, max_size=300)), max_size=40)


def expected_hashes(keys: list[bytes | None]) -> list[int]:
    """The reference: mmh3 one key at a time; a null key hashes as the empty key."""
    return [mmh3.hash(b"" if k is None else k, 0, signed=False) for k in keys]


@settings(max_examples=200)
@given(keys=keys_strategy)
def test_murmur3_of_binary_array_matches_mmh3_for_every_key(keys):
    """Any list of binary keys (empty, short, long) hashes exactly as mmh3 hashes each key."""
    hashes = murmur3_32(pa.array(keys, pa.binary()))
    assert hashes.dtype == np.uint32
    assert hashes.tolist() == expected_hashes(keys)


@settings(max_examples=200)
@given(keys=keys_strategy, data=st.data())
def test_murmur3_of_sliced_array_hashes_only_the_slice(keys, data):
    """A slice with offset != 0 (binary and large_binary) hashes its own rows, not the parent's."""
    start = data.draw(st.integers(0, len(keys)), label="start")
    length = data.draw(st.integers(0, len(keys) - start), label="length")
    for kind in (pa.binary(), pa.large_binary()):
        sliced = pa.array(keys, kind).slice(start, length)
        assert murmur3_32(sliced).tolist() == expected_hashes(keys[start : start + length])


@settings(max_examples=150)
@given(keys=st.lists(st.text(max_size=30), max_size=30), start=st.integers(0, 5))
def test_murmur3_of_string_array_matches_mmh3_of_utf8(keys, start):
    """string and large_string arrays hash their UTF-8 bytes, sliced or not."""
    expected = [mmh3.hash(k.encode(), 0, signed=False) for k in keys]
    for kind in (pa.string(), pa.large_string()):
        array = pa.array(keys, kind)
        assert murmur3_32(array).tolist() == expected
        assert murmur3_32(array.slice(start)).tolist() == expected[start:]


@settings(max_examples=150)
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=40), partitions=st.integers(1, 50))
def test_partitions_for_keys_matches_partition_for_key_and_marks_nulls(keys, partitions):
    """Each non-null key gets partition_for_key's partition; each null key gets -1."""
    parts = partitions_for_keys(pa.array(keys, pa.binary()), partitions)
    assert parts.tolist() == [-1 if k is None else partition_for_key(k, partitions) for k in keys]


@pytest.mark.parametrize("length", range(0, 13), ids=lambda n: f"len{n}")
def test_murmur3_matches_mmh3_around_4_byte_block_boundaries(length):
    """Keys of every length 0..12 (whole blocks plus 0-3 tail bytes) hash as mmh3 does, side by side."""
    keys = [bytes(range(i, i + length)) for i in range(0, 200, 7)] + [b"\xff" * length]
    assert murmur3_32(pa.array(keys, pa.binary())).tolist() == expected_hashes(keys)


def test_murmur3_of_chunk_slices_agrees_with_the_combined_array():
    """Hashing each chunk of a chunked column (slices at arbitrary boundaries) gives the whole column's hashes."""
    keys = [b"k%d" % i * (i % 5) for i in range(100)]
    whole = pa.array(keys, pa.binary())
    chunked = pa.chunked_array([whole.slice(0, 33), whole.slice(33, 1), whole.slice(34, 66)])
    pieces = np.concatenate([murmur3_32(chunk) for chunk in chunked.chunks])
    assert pieces.tolist() == murmur3_32(chunked.combine_chunks()).tolist() == expected_hashes(keys)


def test_murmur3_of_empty_and_all_empty_arrays():
    """A zero-length array hashes to nothing; an array of empty keys (no data buffer) hashes to zeros."""
    assert murmur3_32(pa.array([], pa.binary())).tolist() == []
    assert murmur3_32(pa.array([b"", b""], pa.binary())).tolist() == [0, 0]


def test_null_keys_get_partition_minus_one_even_in_a_slice():
    """partitions_for_keys marks nulls -1 in plain and sliced arrays; the other rows keep their partition."""
    keys = pa.array([b"a", None, b"customer-42", None, b"orders"], pa.binary())
    assert partitions_for_keys(keys, 3).tolist() == [2, -1, 1, -1, 0]
    assert partitions_for_keys(keys.slice(1, 3), 3).tolist() == [-1, 1, -1]
    assert partitions_for_keys(pa.nulls(4, pa.binary()), 5).tolist() == [-1] * 4


def test_murmur3_known_value_of_hello():
    """The canonical murmur3_x86_32('hello', seed 0) = 0x248BFA47 pins the function itself."""
    assert murmur3_32(pa.array([b"hello"])).tolist() == [0x248BFA47]
    assert partition_for_key(b"hello", 2**32 - 1) == 0x248BFA47


@pytest.mark.parametrize(
    "key, partitions, expected",
    [
        (b"customer-42", 3, 1),
        (b"customer-42", 7, 3),
        (b"orders", 3, 0),
        (b"orders", 7, 4),
        (b"user-1", 3, 2),
        (b"user-1", 7, 0),
    ],
    ids=["customer-42/3", "customer-42/7", "orders/3", "orders/7", "user-1/3", "user-1/7"],
)
def test_partition_for_key_is_stable(key, partitions, expected):
    """Pinned key -> partition values: any change to the hash would move existing keys."""
    assert partition_for_key(key, partitions) == expected
    assert partitions_for_keys(pa.array([key]), partitions).tolist() == [expected]


# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed Java ints), and murmur2 of no bytes.
KAFKA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                 b"a-little-bit-longer-string": -1486304829,
                 b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107, b"": 275646681}


def test_murmur2_is_kafkas():
    """Kafka's test vectors, scalar and vectorized: a key lands where Kafka's producer puts it."""
    unsigned = [v & 0xFFFFFFFF for v in KAFKA_MURMUR2.values()]
    assert [murmur2(k) for k in KAFKA_MURMUR2] == unsigned
    assert murmur2_32(pa.array(list(KAFKA_MURMUR2), pa.binary())).tolist() == unsigned
    # Kafka's placement: Utils.toPositive(murmur2(key)) % partitions
    assert partition_for_key(b"foobar", 7, "murmur2") == ((-790332482 & 0x7FFFFFFF) % 7)


@settings(max_examples=200)
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=100, max_size=300)), max_size=40),
       partitions=st.integers(1, 50), start=st.integers(0, 5))
def test_murmur2_of_an_array_matches_the_scalar_for_every_key(keys, partitions, start):
    """Any keys (empty, short, long, null; sliced): the column's partitions are the scalar's."""
    array = pa.array(keys, pa.binary()).slice(min(start, len(keys)))
    rest = keys[min(start, len(keys)):]
    assert murmur2_32(array).tolist() == [murmur2(b"" if k is None else k) for k in rest]
    assert partitions_for_keys(array, partitions, "murmur2").tolist() == [
        -1 if k is None else partition_for_key(k, partitions, "murmur2") for k in rest]


def test_sticky_partitioner_stays_until_its_own_partition_is_sealed():
    """`next` with another partition's seal changes nothing; with the current one it moves elsewhere."""
    sticky = StickyPartitioner()
    current = sticky.partition("t", 5)
    assert 0 <= current < 5
    for other in set(range(5)) - {current}:
        sticky.next("t", 5, other)
        assert sticky.partition("t", 5) == current
    for _ in range(20):
        sticky.next("t", 5, current)
        moved = sticky.partition("t", 5)
        assert moved != current and 0 <= moved < 5
        current = moved


def test_sticky_partitioner_keeps_topics_apart_and_single_partitions_fixed():
    """Each topic has its own sticky partition; a one-partition topic never moves."""
    sticky = StickyPartitioner()
    a = sticky.partition("a", 4)
    b = sticky.partition("b", 1)
    assert b == 0
    sticky.next("b", 1, 0)
    assert sticky.partition("b", 1) == 0
    sticky.next("b", 4, sticky.partition("b", 4))  # moving b never touches a
    assert sticky.partition("a", 4) == a


def test_sticky_partitioner_rechooses_when_the_topic_shrinks_below_it():
    """A sticky partition outside the current partition count is replaced by a valid one."""
    sticky = StickyPartitioner()
    for _ in range(50):
        if sticky.partition("t", 10) >= 2:
            break
        sticky.next("t", 10, sticky.partition("t", 10))
    assert sticky.partition("t", 10) >= 2
    assert sticky.partition("t", 2) in (0, 1)
