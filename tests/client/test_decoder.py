"""decoder without a broker: where a corrupt batch is reported."""
from __future__ import annotations

import pytest

from segment_format import batch_body, record
from client.decoder import corrupt_batch_offsets, decode_fetched
from tests.broker.forged_batches import poison_stored_batch


def _batch_at(base_offset: int, records: int = 1) -> bytes:
    body = batch_body.make_body([b"v%d" % i for i in range(records)], timestamps_ms=1)
    return bytes(record.encode_batch(body, base_offset=base_offset))


@pytest.mark.parametrize("data, at, position, high_watermark, expected", [
    (_batch_at(7), 0, 5, 10, 7),
    (_batch_at(7), 0, 5, 7, 5),
    (_batch_at(3), 0, 5, 10, 5),
    (_batch_at(7)[:40], 0, 5, 10, 5),
], ids=["compaction-gap-base-believed", "base-at-high-watermark-not-believed", "base-below-position", "header-truncated"])
def test_corrupt_batch_offsets_believe_only_a_plausible_base_offset(data, at, position, high_watermark, expected):
    """The base offset is outside the CRC: it counts only between the position and the high
    watermark; with no checked header the last offset is the first (skip one record at a time)."""
    assert corrupt_batch_offsets(memoryview(data), at, position, high_watermark, None) == (expected, expected)


@pytest.mark.parametrize("base, records, position, high_watermark, expected", [
    (5, 4, 5, 20, (5, 8)),
    (5, 4, 7, 20, (7, 8)),
    (5, 4, 5, 8, (5, 5)),
], ids=["whole-batch", "from-mid-batch", "last-offset-at-high-watermark-not-believed"])
def test_a_checked_header_gives_the_corrupt_batch_its_last_offset(base, records, position, high_watermark, expected):
    """A batch whose header passed its checks (CRC) but whose body did not decode is skipped whole:
    its last offset, when below the high watermark."""
    data = _batch_at(base, records)
    header = record.read_header(data)
    assert corrupt_batch_offsets(memoryview(data), 0, position, high_watermark, header) == expected


def test_decode_fetched_names_the_undecodable_batch_not_the_next_one():
    """Batches 0, 1-3 (CRC intact, body poisoned) and 4-5 in one fetch: the two records before it
    are kept and CorruptRecordError names offsets 1-3 (it named 4 before, so seek(offset + 1)
    dropped offset 4)."""
    data = bytearray(_batch_at(0) + _batch_at(1, 3) + _batch_at(4, 2))
    poison_stored_batch(data, len(_batch_at(0)))
    decoded = decode_fetched(("t", 0), data, 0, 6, verify=True)
    assert [b.first_offset for b, _ in decoded.batches] == [0] and decoded.position == 1
    assert decoded.corrupt is not None
    assert (decoded.corrupt.offset, decoded.corrupt.last_offset) == (1, 3)
    assert "t-0 offsets 1-3" in str(decoded.corrupt)
    unchecked = decode_fetched(("t", 0), data, 0, 6, verify=False)
    assert unchecked.corrupt is not None and (unchecked.corrupt.offset, unchecked.corrupt.last_offset) == (1, 1)
