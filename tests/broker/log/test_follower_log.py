"""UnifiedLog as a replica uses it: follower appends that keep the leader's offsets and epochs,
truncation to a divergence point, starting over at a leader's log start, and the epoch end
offsets a leader answers OffsetsForLeaderEpoch with."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from segment_format import batch_body, record
from common.errors import CorruptMessageError

R = 3  # records per test batch; three batches fill a 4 KiB segment


def leader_batch(base_offset: int, epoch: int, records: int = R, timestamp_ms: int = 1_000) -> bytearray:
    """A batch as a leader wrote it: offsets and epoch assigned."""
    return record.encode_batch(batch_body.make_body([b"value-0123"] * records, timestamps_ms=timestamp_ms),
                               base_offset=base_offset, partition_leader_epoch=epoch)


def replicate(partition_log, epochs: list[int], start: int = 0) -> None:
    """One follower append per epoch in `epochs`, R records each, from offset `start`."""
    for i, epoch in enumerate(epochs):
        partition_log.append_as_follower(leader_batch(start + i * R, epoch))


def stored(partition_log) -> list[tuple[int, int]]:
    """(base offset, epoch) of every batch on disk, CRC-checked."""
    return [(h.base_offset, h.partition_leader_epoch)
            for s in partition_log.segments() for _, h in record.iter_batches(s.log_path.read_bytes())]


# --- follower appends --------------------------------------------------------------------


def test_follower_append_keeps_offsets_and_epochs_and_records_new_epochs(unified_log):
    partition_log = unified_log(segment_bytes=1 << 20)
    payload = leader_batch(0, 1) + leader_batch(R, 1)
    info = partition_log.append_as_follower(payload)
    replicate(partition_log, [3, 3, 4], start=2 * R)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 2 * R - 1, 2 * R)
    assert stored(partition_log) == [(0, 1), (3, 1), (6, 3), (9, 3), (12, 4)]
    assert partition_log.leader_epoch_entries == [(1, 0), (3, 6), (4, 12)]
    assert partition_log.log_end_offset == 5 * R
    assert partition_log.high_watermark == 0  # the leader's HW arrives with the fetch, not with the data


def test_follower_append_rolls_at_the_batch_base_offset_across_a_gap(unified_log):
    """Compaction leaves gaps: the new segment is named after the batch's own base offset."""
    partition_log = unified_log()
    replicate(partition_log, [0, 0, 0])
    partition_log.append_as_follower(leader_batch(50, 0))
    assert [(s.base_offset, s.next_offset) for s in partition_log.segments()] == [(0, 9), (50, 53)]
    partition_log.maybe_increment_high_watermark(53)
    assert partition_log.read(50, 1).first_offset == 50
    assert partition_log.read(20, 1).first_offset == 50  # an offset in the gap reads the next batch


@pytest.mark.parametrize("base_offset", [0, 3, 5], ids=["from-zero-again", "last-batch-again", "overlapping"])
def test_follower_append_rejects_batches_that_do_not_follow_the_leo(unified_log, base_offset):
    partition_log = unified_log()
    replicate(partition_log, [0, 0])
    before = stored(partition_log)
    with pytest.raises(CorruptMessageError, match="does not follow 6"):
        partition_log.append_as_follower(leader_batch(base_offset, 0))
    assert stored(partition_log) == before and partition_log.log_end_offset == 2 * R


def test_follower_append_validates_every_batch_before_writing(unified_log):
    partition_log = unified_log()
    payload = leader_batch(0, 0) + leader_batch(R, 0)
    payload[-3] ^= 0xFF
    with pytest.raises(CorruptMessageError):
        partition_log.append_as_follower(payload)
    assert partition_log.log_end_offset == 0 and stored(partition_log) == []


# --- truncation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "offset, leo, segments, entries",
    [(21, 21, [0, 9, 18], [(0, 0), (2, 6), (5, 15)]),
     (15, 15, [0, 9], [(0, 0), (2, 6)]),
     (16, 15, [0, 9], [(0, 0), (2, 6)]),
     (12, 12, [0, 9], [(0, 0), (2, 6)]),
     (9, 9, [0], [(0, 0), (2, 6)]),
     (6, 6, [0], [(0, 0)]),
     (0, 0, [0], [])],
    ids=["at-leo", "epoch-start", "mid-batch-cuts-the-whole-batch", "inside-a-segment", "segment-boundary",
         "previous-segment", "everything"],
)
def test_truncate_to_cuts_at_batch_boundaries_across_segments_with_epochs(unified_log, offset, leo, segments, entries):
    partition_log = unified_log()
    replicate(partition_log, [0, 0, 2, 2, 2, 5, 5])  # segments 0 (0..8), 9 (9..17), 18 (18..20)
    partition_log.update_high_watermark(21)
    partition_log.truncate_to(offset)
    assert partition_log.log_end_offset == leo
    assert partition_log.high_watermark == leo
    assert [s.base_offset for s in partition_log.segments()] == segments
    assert sorted(p.name for p in partition_log.directory.glob("*.log")) == [f"{b:020d}.log" for b in segments]
    assert partition_log.leader_epoch_entries == entries
    assert [o for o, _ in stored(partition_log)] == list(range(0, leo, R))
    partition_log.append_as_follower(leader_batch(leo, 7))  # the log continues where it was cut
    assert partition_log.log_end_offset == leo + R
    assert partition_log.leader_epoch_entries == entries + [(7, leo)]


def test_truncate_to_a_sealed_segment_boundary_makes_it_writable_again(unified_log):
    """After a cut at a rolled segment's end, that sealed segment is active and takes appends."""
    partition_log = unified_log()
    replicate(partition_log, [0, 0, 0, 0])  # segments 0 (0..8) and 9 (9..11)
    partition_log.update_config(replace(partition_log.config, segment_bytes=1 << 20))
    partition_log.truncate_to(9)
    partition_log.append_as_follower(leader_batch(9, 1))
    assert [(s.base_offset, s.next_offset) for s in partition_log.segments()] == [(0, 12)]
    partition_log.update_high_watermark(12)
    assert partition_log.read(9, 1).first_offset == 9


def test_truncate_to_survives_a_crash_and_reopen(open_log, crash_log):
    partition_log = open_log()
    replicate(partition_log, [0, 0, 2, 2, 2, 5, 5])
    partition_log.flush()
    partition_log.truncate_to(12)
    crash_log(partition_log)
    reopened = open_log()
    assert reopened.log_end_offset == 12
    assert reopened.leader_epoch_entries == [(0, 0), (2, 6)]
    assert [o for o, _ in stored(reopened)] == [0, 3, 6, 9]


def test_truncate_fully_and_start_at_empties_the_log_and_moves_every_offset(unified_log):
    partition_log = unified_log()
    replicate(partition_log, [0, 0, 2, 2])
    removed = partition_log.truncate_fully_and_start_at(100)
    assert removed == 4 * len(leader_batch(0, 0))
    assert (partition_log.log_start_offset, partition_log.high_watermark, partition_log.log_end_offset,
            partition_log.recovery_point) == (100, 100, 100, 100)
    assert [s.base_offset for s in partition_log.segments()] == [100]
    assert [p.name for p in partition_log.directory.glob("*.log")] == [f"{100:020d}.log"]
    assert partition_log.leader_epoch_entries == []
    assert partition_log.read(100, 1).size == 0
    assert partition_log.append_as_leader(leader_batch(0, 0), 3).first_offset == 100
    assert partition_log.leader_epoch_entries == [(3, 100)]


def test_truncate_to_below_the_local_log_start_starts_over_there(unified_log):
    partition_log = unified_log(retention_ms=1_000)
    replicate(partition_log, [0] * 7)
    partition_log.update_high_watermark(21)
    for segment in partition_log.delete_old_segments(10_000):
        segment.delete()
    assert partition_log.log_start_offset == 21
    partition_log.truncate_to(5)
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (5, 5)


# --- epoch end offsets -------------------------------------------------------------------


@pytest.mark.parametrize(
    "epoch, expected",
    [(5, (5, 12)), (3, (3, 9)), (1, (1, 6)), (2, (1, 6)), (4, (3, 9)), (0, (0, 0)), (6, (-1, -1)), (-1, (-1, -1))],
    ids=["latest-epoch-ends-at-leo", "middle-epoch-ends-where-the-next-starts", "first-epoch", "unknown-between",
         "unknown-before-latest", "older-than-all", "newer-than-all", "undefined"],
)
def test_end_offset_for_epoch_answers_as_kafka_does(unified_log, epoch, expected):
    partition_log = unified_log(segment_bytes=1 << 20)
    replicate(partition_log, [1, 1, 3, 5])  # epoch 1 from 0, 3 from 6, 5 from 9; LEO 12
    assert partition_log.leader_epoch_entries == [(1, 0), (3, 6), (5, 9)]
    assert partition_log.end_offset_for_epoch(epoch) == expected


def test_end_offset_for_epoch_of_a_log_without_epochs_is_undefined(unified_log):
    assert unified_log().end_offset_for_epoch(0) == (-1, -1)


def test_assign_epoch_start_offset_on_leadership_survives_a_reopen_once_written_under(unified_log, batch):
    """A new leader's epoch starts at its LEO; an entry with no record yet survives a reopen
    (unlike Kafka's truncateFromEnd on load: rewriting it on every open, and again when the broker
    takes leadership back, cost two fsyncs per partition per restart)."""
    partition_log = unified_log()
    replicate(partition_log, [1, 1])
    partition_log.assign_epoch_start_offset(4)
    partition_log.assign_epoch_start_offset(2)  # older than the latest: ignored
    assert partition_log.end_offset_for_epoch(1) == (1, 6)
    assert partition_log.end_offset_for_epoch(4) == (4, 6)
    partition_log.close()
    reopened = unified_log()
    assert reopened.leader_epoch_entries == [(1, 0), (4, 6)]
    reopened.close()
    reopened = unified_log(leader_epoch=4)
    reopened.append_as_leader(batch(R), 4)
    reopened.close()
    assert unified_log().leader_epoch_entries == [(1, 0), (4, 6)]


@pytest.mark.parametrize("overrides", [{}, {"flush_ms": 100}], ids=["rolled-segment", "flush-ms"])
def test_truncation_leaves_no_flush_pending_that_a_flush_cannot_satisfy(unified_log, clock, overrides):
    """Offsets cut away need no fsync: once the rest is flushed, needs_flush is False again
    (otherwise the flusher would be handed this log forever)."""
    partition_log = unified_log(**overrides)
    replicate(partition_log, [0, 0])
    partition_log.flush()
    replicate(partition_log, [0, 0], start=2 * R)  # rolls: segment 0 (0..8) waits for its fsync
    clock.advance(1_000)
    partition_log.truncate_to(2 * R)
    assert partition_log.log_end_offset == partition_log.recovery_point == 2 * R
    partition_log.flush()
    assert partition_log.needs_flush(clock()) is False


def test_a_truncation_during_a_flush_waits_for_it_and_the_flush_vouches_for_nothing_new(unified_log, monkeypatch):
    """The flush's fsyncs run outside the append and view locks. A truncation (a new leader)
    arriving meanwhile waits for them, so the log is never cut and rewritten under a flush: the
    recovery point never covers records the fsyncs did not see (that would launder unsynced data
    past a crash)."""
    partition_log = unified_log(segment_bytes=1 << 20)
    replicate(partition_log, [0, 0, 0, 0])  # LEO 12, nothing flushed
    local = partition_log._local
    real_sync = local.sync

    def diverge() -> None:
        partition_log.truncate_to(R)  # a new leader: everything from 3 is replaced
        replicate(partition_log, [1, 1, 1], start=R)

    diverging = threading.Thread(target=diverge)

    def sync_while_the_log_diverges(fds, sync_directory):
        diverging.start()
        diverging.join(0.2)
        assert diverging.is_alive(), "the truncation did not wait for the flush"
        real_sync(fds, sync_directory)

    monkeypatch.setattr(local, "sync", sync_while_the_log_diverges)
    partition_log.flush()
    diverging.join(10)
    monkeypatch.undo()
    assert partition_log.log_end_offset == 4 * R
    assert partition_log.recovery_point <= R


class _Crash(BaseException):
    """The process dies here."""


def test_a_crash_while_starting_over_leaves_a_log_that_ends_at_the_new_start(open_log, crash_log, monkeypatch):
    """truncate_fully_and_start_at past the log end (a follower behind its leader's log start)
    makes the new empty segment durable before deleting the old ones: a crash between two
    deletions reopens as a log whose end is the new start (the old segments left are a prefix
    below it), which the follower then fetches from; never a log that lost its new start."""
    from broker.log.segment import Segment

    partition_log = open_log()
    replicate(partition_log, [0] * 7)
    assert len(partition_log.segments()) > 2
    delete, deleted = Segment.delete, []

    def dies_on_the_second(segment: Segment) -> None:
        if deleted:
            raise _Crash
        deleted.append(segment)
        delete(segment)

    monkeypatch.setattr(Segment, "delete", dies_on_the_second)
    with pytest.raises(_Crash):
        partition_log.truncate_fully_and_start_at(100)
    monkeypatch.setattr(Segment, "delete", delete)
    crash_log(partition_log)
    reopened = open_log()
    assert reopened.log_end_offset == 100
    assert reopened.segments()[-1].base_offset == 100
    assert reopened.append_as_follower(leader_batch(100, 1)).first_offset == 100
