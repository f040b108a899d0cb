"""UnifiedLog's high watermark: separate from the LEO, moved only by the partition layer, bounding
what consumers read; and the durable end offset the flush policy lets it reach."""
from __future__ import annotations

import pytest

from common.errors import OffsetOutOfRangeError

R = 3  # records per test batch; three batches fill a 4 KiB segment


def leader_appends(partition_log, batch, count: int) -> None:
    for _ in range(count):
        partition_log.append_as_leader(batch(R), 0)


def test_append_as_leader_does_not_move_the_high_watermark(unified_log, batch):
    """The leader's append only moves the LEO; until the partition layer says so nothing is readable."""
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    assert (partition_log.high_watermark, partition_log.log_end_offset) == (0, 4 * R)
    assert partition_log.read(0, 1 << 20).size == 0
    assert partition_log.offset_for_timestamp(0) is None


@pytest.mark.parametrize(
    "moves, expected",
    [([6], [(True, 6)]), ([6, 3], [(True, 6), (False, 6)]), ([6, 6], [(True, 6), (False, 6)]),
     ([100], [(True, 12)]), ([12, 100], [(True, 12), (False, 12)])],
    ids=["forward", "never-back", "same-offset", "clamped-to-leo", "at-leo-already"],
)
def test_maybe_increment_high_watermark_only_moves_forward_within_the_leo(unified_log, batch, moves, expected):
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    results = []
    for offset in moves:
        moved = partition_log.maybe_increment_high_watermark(offset)
        results.append((moved, partition_log.high_watermark))
    assert results == expected


@pytest.mark.parametrize("offset, expected", [(-5, 0), (0, 0), (6, 6), (12, 12), (13, 12)],
                         ids=["below-log-start", "log-start", "inside", "leo", "past-leo"])
def test_update_high_watermark_clamps_to_log_start_and_leo(unified_log, batch, offset, expected):
    """update_high_watermark may move back (a new leader's view) but never outside the log."""
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    partition_log.update_high_watermark(9)
    assert partition_log.update_high_watermark(offset) == partition_log.high_watermark == expected


def test_read_stops_at_the_high_watermark_and_a_follower_reads_to_the_leo(unified_log, batch):
    """Consumers (no max_offset) see only what is below the HW; a follower passes max_offset=LEO."""
    partition_log = unified_log(segment_bytes=1 << 20)
    leader_appends(partition_log, batch, 4)
    partition_log.maybe_increment_high_watermark(2 * R)
    size = len(batch(R))
    assert partition_log.read(0, 1 << 20).size == 2 * size
    assert partition_log.read(R, 1 << 20).size == size
    follower = partition_log.read(0, 1 << 20, max_offset=partition_log.log_end_offset)
    assert follower.size == 4 * size
    assert partition_log.offset_for_timestamp(0) == (0, 1_000)


@pytest.mark.parametrize("offset", [6, 7, 11, 12], ids=["at-hw", "past-hw", "last-record", "at-leo"])
def test_offsets_between_high_watermark_and_leo_read_empty(unified_log, batch, offset):
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    partition_log.maybe_increment_high_watermark(2 * R)
    found = partition_log.read(offset, 1 << 20)
    assert (found.size, found.first_offset, found.file) == (0, offset, None)


@pytest.mark.parametrize("offset", [13, 10**9], ids=["one-past-leo", "far-past-leo"])
def test_read_beyond_the_leo_is_out_of_range_whatever_the_high_watermark(unified_log, batch, offset):
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(offset, 1 << 20)
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(offset, 1 << 20, max_offset=partition_log.log_end_offset)


def test_durable_end_offset_waits_for_the_flush_when_every_message_must_be_flushed(unified_log, batch):
    """flush.messages=1: an append counts as committed (the HW may reach it) only once fsynced."""
    partition_log = unified_log(flush_messages=1)
    leader_appends(partition_log, batch, 2)
    assert partition_log.recovery_point == 0
    assert partition_log.durable_end_offset == 0
    assert partition_log.maybe_increment_high_watermark(partition_log.durable_end_offset) is False
    partition_log.flush(up_to=R)
    assert partition_log.durable_end_offset == R  # the recovery point: the rest still waits
    partition_log.flush()
    assert partition_log.durable_end_offset == partition_log.recovery_point == 2 * R
    assert partition_log.maybe_increment_high_watermark(partition_log.durable_end_offset) is True


def test_durable_end_offset_is_the_leo_under_the_default_policy(unified_log, batch):
    partition_log = unified_log()
    leader_appends(partition_log, batch, 2)
    assert partition_log.recovery_point == 0
    assert partition_log.durable_end_offset == partition_log.log_end_offset == 2 * R


def test_high_watermark_survives_a_reopen_within_the_new_log(unified_log, batch):
    """The checkpointed HW is clamped to what the directory holds (a stale checkpoint past the LEO)."""
    partition_log = unified_log()
    leader_appends(partition_log, batch, 4)
    partition_log.close()
    assert unified_log(high_watermark=6).high_watermark == 6
    assert unified_log(high_watermark=10**6).high_watermark == 4 * R
