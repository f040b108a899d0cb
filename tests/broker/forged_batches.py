"""Batches in the record format that no producer may write: Kafka's LogValidator refuses them with
INVALID_RECORD, and so does the leader here (`record.validate_batch` with producer input). Those
a leader writes itself (compacted bodies from the log cleaner, control and transactional batches)
pass the validation followers and recovery do.

Shared by the validator's unit tests, the bad-input tests against a real broker and the wire fuzz.
"""
from __future__ import annotations

from typing import Callable

from segment_format import batch_body, record

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


FORGED_BATCHES: list[tuple[str, Callable[[], bytearray], str]] = [
    # id, the batch, words the error message must contain
    ("compacted-claiming-2^20-offsets", lambda: compacted([1 << 20, 1 << 20]), OFFSET_RANGE),
    ("compacted-with-increasing-deltas", lambda: compacted([0, 3, 7]), OFFSET_RANGE),
    ("standard-body-with-offset-gap", lambda: with_gap(1 << 20), OFFSET_RANGE),
    ("control-bit", lambda: with_attributes(record.CONTROL_BIT), "not allowed to write control batches"),
    ("transactional-bit", lambda: with_attributes(record.TRANSACTIONAL_BIT), "transactions are not supported yet"),
    ("control-and-transactional-bits", lambda: with_attributes(record.CONTROL_BIT | record.TRANSACTIONAL_BIT),
     "not allowed to write control batches"),
]
