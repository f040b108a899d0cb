"""UnifiedLog with idempotent producers: duplicates answered with their original offsets, sequence
and epoch checks before anything is written, the state replicated to followers, snapshots at roll
and close, reloads after truncation and crashes, retention and expiry."""
from __future__ import annotations

import os

import pytest

from broker.log.producer_state import SNAPSHOT_SUFFIX, BatchMetadata
from common.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    KafkaStorageError,
    OutOfOrderSequenceError,
)
from segment_format import batch_body, record
from tests.broker.log.appends import append
from tests.helpers.logs import idempotent_batch

R = 3  # records per batch: three ~1.2 KiB batches fill a 4 KiB segment


idem = idempotent_batch


def stored_sequences(partition_log) -> list[tuple[int, int, int]]:
    """(base offset, producer id, base sequence) of every batch on disk, CRC-checked."""
    return [(h.base_offset, h.producer_id, h.base_sequence)
            for s in partition_log.segments() for _, h in record.iter_batches(s.log_path.read_bytes())]


def snapshots(partition_log) -> list[int]:
    return sorted(int(name[:20]) for name in os.listdir(partition_log.directory) if name.endswith(SNAPSHOT_SUFFIX))


def last_batches(partition_log, producer_id: int) -> list[BatchMetadata]:
    return list(partition_log.producer_entries()[producer_id].batches)


# --- leader appends ----------------------------------------------------------------------


def test_a_retried_batch_is_answered_with_its_original_offsets_and_not_written(unified_log):
    """The same batch twice (a lost response): the second append writes nothing."""
    partition_log = unified_log(segment_bytes=1 << 20)
    first = append(partition_log, idem(7, 0, 0))
    append(partition_log, idem(7, 0, R))
    retry = append(partition_log, idem(7, 0, 0))
    assert (retry.first_offset, retry.last_offset, retry.record_count) == (first.first_offset, first.last_offset, R)
    assert partition_log.log_end_offset == 2 * R
    assert stored_sequences(partition_log) == [(0, 7, 0), (R, 7, R)]


def test_leading_duplicates_followed_by_new_batches_write_only_the_new_ones(unified_log):
    """A retry of [b1, b2] after b1 was written: b1 is answered with its offset, b2 appended."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0))
    append(partition_log, idem(8, 0, 0))  # another producer's batch between
    info = append(partition_log, idem(7, 0, 0) + idem(7, 0, R))
    assert info.batch_offsets == (0, 2 * R)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 3 * R - 1, 2 * R)
    assert stored_sequences(partition_log) == [(0, 7, 0), (R, 8, 0), (2 * R, 7, R)]


def test_a_record_set_of_duplicates_only_returns_the_originals(unified_log):
    """Two batches, both written before: nothing written, both original offsets answered."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0) + idem(7, 0, R))
    info = append(partition_log, idem(7, 0, 0) + idem(7, 0, R))
    assert (info.first_offset, info.last_offset, info.record_count, info.batch_offsets) == (0, 2 * R - 1, 2 * R, (0, R))
    assert partition_log.log_end_offset == 2 * R


@pytest.mark.parametrize(("payload", "error"), [
    (lambda: idem(7, 0, 2 * R), OutOfOrderSequenceError),  # a gap
    (lambda: idem(7, 0, R) + idem(7, 0, 0), OutOfOrderSequenceError),  # a duplicate after a new batch
    (lambda: idem(7, 0, R) + idem(7, 0, 3 * R), OutOfOrderSequenceError),  # not consecutive in one set
    (lambda: idem(7, 1, 5), OutOfOrderSequenceError),  # a new epoch not at 0
    (lambda: idem(7, -1, 0), InvalidRecordError),  # no epoch
    (lambda: idem(7, 0, -1), InvalidRecordError),  # no sequence
    (lambda: idem(-2, 0, 0), InvalidRecordError),  # not a producer id
    (lambda: idem(7, 0, R, attributes=record.CONTROL_BIT), InvalidRecordError),  # a client's control batch
], ids=["gap", "duplicate-after-new", "not-consecutive", "new-epoch-not-at-zero", "no-epoch", "no-sequence",
        "bad-producer-id", "control-batch"])
def test_refused_record_sets_write_nothing_and_change_no_state(unified_log, payload, error):
    """Each is refused whole with its named error; log and producer state are as before."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0))
    before = partition_log.producer_entries()
    with pytest.raises(error):
        append(partition_log, payload())
    assert partition_log.log_end_offset == R and partition_log.producer_entries() == before


def test_an_older_epoch_is_fenced_and_names_the_epochs(unified_log):
    """A zombie's batch after its successor's: INVALID_PRODUCER_EPOCH, nothing written."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0))
    append(partition_log, idem(7, 1, 0))
    with pytest.raises(InvalidProducerEpochError, match="topic-0: producer 7 epoch 0 is older than the current epoch 1"):
        append(partition_log, idem(7, 0, R))
    assert partition_log.log_end_offset == 2 * R


def test_an_unknown_producer_may_start_at_any_sequence(unified_log):
    """Its state may have expired: accepted, and its sequences are checked from there on."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(9, 4, 1000))
    with pytest.raises(OutOfOrderSequenceError):
        append(partition_log, idem(9, 4, 1000 + 2 * R))
    assert append(partition_log, idem(9, 4, 1000 + R)).first_offset == R


def test_plain_batches_are_not_checked(unified_log):
    """producer_id -1: any epoch and sequence, as before."""
    partition_log = unified_log(segment_bytes=1 << 20)
    plain = record.encode_batch(batch_body.make_body([b"v"], timestamps_ms=1_000))
    append(partition_log, plain)
    append(partition_log, record.encode_batch(batch_body.make_body([b"v"], timestamps_ms=1_000)))
    assert partition_log.log_end_offset == 2 and not partition_log.producer_entries()


def test_a_failed_write_leaves_no_producer_state(unified_log, monkeypatch):
    """The disk fails mid-append: the next retry of the same batch is appended, not a duplicate."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0))
    from broker.log.segment import Segment

    def broken(self, data, position):
        raise KafkaStorageError("injected write failure")

    with monkeypatch.context() as patch:
        patch.setattr(Segment, "_write", broken)
        with pytest.raises(KafkaStorageError):
            append(partition_log, idem(7, 0, R))
    assert last_batches(partition_log, 7) == [BatchMetadata(0, R - 1, 0, R - 1)]
    assert append(partition_log, idem(7, 0, R)).first_offset == R


# --- followers, snapshots, recovery ------------------------------------------------------


def follower_copy(leader, follower) -> None:
    """Replicate the leader's log to the follower, batch by batch, as written."""
    for segment in leader.segments():
        data = segment.log_path.read_bytes()
        for position, header in record.iter_batches(data):
            if header.base_offset >= follower.log_end_offset:
                follower.append_as_follower(data[position:position + header.size])


def test_a_follower_knows_every_producer_and_answers_a_retry_after_failover(unified_log, tmp_path, clock):
    """Replicated batches update the follower's state unchecked: as leader it dedups the retry."""
    from broker.log import UnifiedLog
    from tests.helpers.logs import SMALL

    leader = unified_log()
    for sequence in range(0, 4 * R, R):
        append(leader, idem(7, 0, sequence))
    follower = UnifiedLog.open(tmp_path / "follower" / "topic-0", "topic", 0, SMALL, clock=clock)
    try:
        follower_copy(leader, follower)
        assert follower.producer_entries() == leader.producer_entries()
        retry = follower.append_as_leader(idem(7, 0, 3 * R), 1)
        assert retry.first_offset == 3 * R and follower.log_end_offset == 4 * R
    finally:
        follower.close()


def test_a_snapshot_is_taken_at_each_roll_and_a_reopen_after_a_crash_replays_from_it(open_log, crash_log):
    """Three batches per segment: snapshots at each new base; a crash keeps the state."""
    partition_log = open_log()
    for sequence in range(0, 7 * R, R):
        append(partition_log, idem(7, 0, sequence))
    bases = [s.base_offset for s in partition_log.segments()]
    assert snapshots(partition_log) == bases[1:]
    before = partition_log.producer_entries()
    crash_log(partition_log)
    reopened = open_log()
    assert reopened.producer_entries() == before
    assert append(reopened, idem(7, 0, 6 * R)).first_offset == 6 * R  # a retry of the last one


def test_a_clean_close_snapshots_at_the_log_end(open_log):
    """The reopened log replays nothing: its state comes from the snapshot at the LEO."""
    partition_log = open_log()
    append(partition_log, idem(7, 0, 0))
    end = partition_log.log_end_offset
    before = partition_log.producer_entries()
    reopened = open_log()
    assert end in snapshots(reopened) and reopened.producer_entries() == before


def test_a_corrupt_snapshot_is_deleted_and_an_older_one_used(open_log, crash_log):
    """The newest snapshot's bytes are damaged: it goes, the state comes from the older one plus a replay."""
    partition_log = open_log()
    for sequence in range(0, 7 * R, R):
        append(partition_log, idem(7, 0, sequence))
    before = partition_log.producer_entries()
    newest = snapshots(partition_log)[-1]
    crash_log(partition_log)
    path = partition_log.directory / f"{newest:020d}{SNAPSHOT_SUFFIX}"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    reopened = open_log()
    assert newest not in snapshots(reopened)
    assert reopened.producer_entries() == before


def test_without_any_snapshot_the_state_is_rebuilt_from_the_log(open_log, crash_log):
    """Every snapshot deleted (an upgrade, a lost directory entry): a full replay of headers."""
    partition_log = open_log()
    for sequence in range(0, 5 * R, R):
        append(partition_log, idem(7, 0, sequence))
    append(partition_log, idem(8, 2, 0))
    before = partition_log.producer_entries()
    crash_log(partition_log)
    for offset in snapshots(partition_log):
        os.unlink(partition_log.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}")
    assert open_log().producer_entries() == before


def test_truncation_reloads_the_state_as_of_the_new_end(unified_log):
    """A follower cut back to a divergence point forgets the batches past it, snapshots too."""
    partition_log = unified_log()
    for sequence in range(0, 7 * R, R):
        append(partition_log, idem(7, 0, sequence))
    partition_log.truncate_to(4 * R)
    assert max(snapshots(partition_log)) <= 4 * R
    assert [b.first_seq for b in last_batches(partition_log, 7)] == [0, R, 2 * R, 3 * R]
    assert append(partition_log, idem(7, 0, 4 * R)).first_offset == 4 * R  # the next sequence, not a duplicate


def test_truncate_fully_forgets_every_producer(unified_log):
    """Starting over at a leader's log start: no state, no snapshot."""
    partition_log = unified_log()
    for sequence in range(0, 4 * R, R):
        append(partition_log, idem(7, 0, sequence))
    partition_log.truncate_fully_and_start_at(100)
    assert not partition_log.producer_entries() and snapshots(partition_log) == []


def test_retention_drops_old_snapshots_and_producers_whose_batches_are_gone(unified_log, clock):
    """Segments removed: snapshots below the new log start go (the newest stays), and the
    producer whose last batch was removed is forgotten."""
    partition_log = unified_log(retention_ms=10_000)
    append(partition_log, idem(1, 0, 0, timestamp_ms=clock() - 20_000))
    for sequence in range(0, 6 * R, R):
        append(partition_log, idem(7, 0, sequence, timestamp_ms=clock() - 20_000))
    append(partition_log, idem(7, 0, 6 * R, timestamp_ms=clock()))
    removed = partition_log.delete_old_segments(clock())
    assert removed and partition_log.log_start_offset > 0
    assert all(offset >= partition_log.local_log_start_offset for offset in snapshots(partition_log))
    assert set(partition_log.producer_entries()) == {7}


def test_idle_producers_expire(unified_log, clock):
    """producer.id.expiration.ms after its last batch, a producer is forgotten."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idem(7, 0, 0, timestamp_ms=clock()))
    assert partition_log.expire_producers(clock() + 999, 1_000) == 0
    assert partition_log.expire_producers(clock() + 1_000, 1_000) == 1 and not partition_log.producer_entries()


def test_the_retention_pass_expires_idle_producers(logs, clock):
    """LogManager.run_retention applies producer.id.expiration.ms to every log."""
    partition_log = logs.open()
    append(partition_log, idem(7, 0, 0, timestamp_ms=clock()))
    logs.manager.producer_id_expiration_ms = 1_000
    logs.manager.run_retention(clock() + 999)
    assert set(partition_log.producer_entries()) == {7}
    logs.manager.run_retention(clock() + 1_000)
    assert not partition_log.producer_entries()
