"""decoder without a broker: where a corrupt batch is reported."""
from __future__ import annotations

import pytest

from segment_format import batch_body, record
from broker.client.decoder import corrupt_batch_offset


def _batch_at(base_offset: int) -> bytes:
    return bytes(record.encode_batch(batch_body.make_body([b"v"], timestamps_ms=1), base_offset=base_offset))


@pytest.mark.parametrize("data, at, position, high_watermark, expected", [
    (_batch_at(7), 0, 5, 10, 7),
    (_batch_at(7), 0, 5, 7, 5),
    (_batch_at(3), 0, 5, 10, 5),
    (_batch_at(7)[:40], 0, 5, 10, 5),
], ids=["compaction-gap-base-believed", "base-at-high-watermark-not-believed", "base-below-position", "header-truncated"])
def test_corrupt_batch_offset_believes_only_a_plausible_base_offset(data, at, position, high_watermark, expected):
    """The base offset is outside the CRC: it counts only between the position and the high watermark."""
    assert corrupt_batch_offset(memoryview(data), at, position, high_watermark) == expected
