"""ListOffsets by time on the log: the first record stamped at or after the time, with that
record's own timestamp (a batch's base timestamp is its smallest, not its first record's)."""
from __future__ import annotations

import pytest

from segment_format import batch_body, record
from tests.broker.log.appends import append, append_compacted


@pytest.mark.parametrize(
    "target, expected",
    [(0, (0, 20)), (15, (0, 20)), (20, (0, 20)), (21, (2, 30)), (30, (2, 30)), (31, None)],
    ids=["before-all", "between-min-and-first", "first", "after-first", "last", "after-all"],
)
def test_offset_for_timestamp_with_unordered_timestamps(open_log, target, expected):
    partition_log = open_log()
    append(partition_log, record.encode_batch(batch_body.make_body([b"a", b"b", b"c"], timestamps_ms=[20, 10, 30])))
    assert partition_log.offset_for_timestamp(target) == expected


def test_offset_for_timestamp_in_a_compacted_batch_maps_rows_to_offsets(open_log):
    """A compacted body's rows carry offset deltas with gaps: the answer is the record's offset."""
    partition_log = open_log()
    compacted = batch_body.make_body([b"x", b"y"], timestamps_ms=[10, 40], offset_deltas=[0, 5])
    append_compacted(partition_log, record.encode_batch(compacted, last_offset_delta=5))
    assert partition_log.offset_for_timestamp(20) == (5, 40)
