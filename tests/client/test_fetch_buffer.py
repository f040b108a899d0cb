"""FetchBuffer without a broker: polls take from the buffered partitions in turn, each partition's
records in order and once, and an error marker waits for the poll that reaches it."""
from __future__ import annotations

import pyarrow as pa

from client.decoder import FetchedBatch
from client.fetch_buffer import FetchBuffer
from common.errors import CorruptRecordError

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def batch(first_offset: int, rows: int) -> FetchedBatch:
    return FetchedBatch(first_offset, pa.record_batch({"value": pa.array([b"x"] * rows, pa.binary())}), None, -1)


def rows(taken: list[tuple[tuple[str, int], FetchedBatch, int]]) -> list[tuple[tuple[str, int], int, int]]:
    """(partition, first offset, next offset) of each batch taken."""
    return [(tp, b.first_offset, b.next_offset) for tp, b, _ in taken]


def test_takes_rotate_over_partitions_and_keep_each_in_order():
    """Three partitions of two 10-row batches each, taken 15 at a time: each take starts with the
    partition least recently taken from, a batch larger than what is left is split, and the
    buffered bytes go back to zero once everything is taken."""
    buffer = FetchBuffer()
    for tp in (A, B, C):
        buffer.extend(tp, [(batch(0, 10), 100), (batch(10, 10), 100)])
    assert buffer.bytes == 600
    assert rows(buffer.take(15)) == [(A, 0, 10), (A, 10, 15)]
    assert rows(buffer.take(15)) == [(B, 0, 10), (B, 10, 15)]
    assert rows(buffer.take(15)) == [(C, 0, 10), (C, 10, 15)]
    assert rows(buffer.take(float("inf"))) == [(A, 15, 20), (B, 15, 20), (C, 15, 20)]
    assert (bool(buffer), buffer.bytes) == (False, 0)


def test_a_partition_drained_and_refilled_goes_last():
    """A partition whose records were all taken joins the back of the order when it gets more."""
    buffer = FetchBuffer()
    buffer.extend(A, [(batch(0, 5), 10)])
    buffer.extend(B, [(batch(0, 20), 10)])
    assert rows(buffer.take(10)) == [(A, 0, 5), (B, 0, 5)]
    buffer.extend(A, [(batch(5, 5), 10)])
    assert rows(buffer.take(10)) == [(B, 5, 15)]
    assert rows(buffer.take(10)) == [(A, 5, 10), (B, 15, 20)]


def test_an_error_marker_stays_until_popped_and_blocks_only_its_partition():
    """Records before a partition's error marker and the other partitions' records are taken; the
    marker is then the only thing left, reported by `blocked` and removed by `pop_error`."""
    buffer = FetchBuffer()
    err = CorruptRecordError("bad batch", topic="t", partition=0, offset=3)
    buffer.extend(A, [(batch(0, 3), 30), (err, 0)])
    buffer.extend(B, [(batch(0, 4), 40)])
    assert rows(buffer.take(100)) == [(A, 0, 3), (B, 0, 4)]
    assert buffer.blocked() == [(A, err)]
    assert buffer.take(100) == []
    assert buffer.pop_error(A) is err
    assert (bool(buffer), buffer.blocked(), buffer.bytes) == (False, [], 0)


def test_dropping_partitions_forgets_their_records_and_bytes():
    buffer = FetchBuffer()
    buffer.extend(A, [(batch(0, 3), 30)])
    buffer.extend(B, [(batch(0, 4), 40)])
    buffer.drop({A, C})
    assert (buffer.partitions(), buffer.bytes) == ({B}, 40)
