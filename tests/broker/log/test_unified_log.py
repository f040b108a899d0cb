"""UnifiedLog: offsets, reads, rolls, retention, recovery, flush, checkpoints."""
from __future__ import annotations

import os
import threading

import pytest

from segment_format import record
from broker.config import LogConfig
from common.errors import CorruptMessageError, MessageTooLargeError, OffsetOutOfRangeError
from broker.log import Segment, UnifiedLog
from broker.log.checkpoint import read_offsets
from broker.log.unified_log import LEADER_EPOCH_FILE
from broker.log.log_manager import RECOVERY_POINT_CHECKPOINT

from tests.broker.log.appends import append

R = 3  # records per test batch; with SMALL's 4096-byte segments, 3 batches fill a segment


def stored_batches(partition_log: UnifiedLog) -> list[record.BatchHeader]:
    """Every batch on disk, CRC-checked, oldest first."""
    return [h for s in partition_log.segments() for _, h in record.iter_batches(s.log_path.read_bytes())]


def fill(partition_log: UnifiedLog, batch, count: int, timestamps: list[int] | None = None) -> None:
    for i in range(count):
        append(partition_log, batch(R, timestamps[i] if timestamps else 1_000 + i), leader_epoch=0)


def expire(partition_log: UnifiedLog, now_ms: int) -> int:
    """Run retention and unlink what it removed at once (no reads in flight); returns the count."""
    removed = partition_log.delete_old_segments(now_ms)
    for segment in removed:
        segment.delete()
    return len(removed)


def file_sizes(partition_log: UnifiedLog) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in partition_log.directory.iterdir()}


# --- append -----------------------------------------------------------------------------


def test_append_assigns_consecutive_offsets_by_patching_only_the_header(open_log, batch):
    """Offsets and epoch are written into the headers; every other byte and the CRC stay as sent."""
    partition_log = open_log(segment_bytes=1 << 20, max_message_bytes=1 << 20)
    payloads = [batch(1), batch(3), batch(2) + batch(4)]
    originals = [bytes(p) for p in payloads]
    infos = [append(partition_log, p, leader_epoch=7) for p in payloads]
    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == [(0, 0, 1), (1, 3, 3), (4, 9, 6)]
    assert partition_log.log_end_offset == partition_log.high_watermark == 10
    data = partition_log.segments()[0].log_path.read_bytes()
    assert data == b"".join(payloads)
    headers = stored_batches(partition_log)  # iter_batches verifies each CRC
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 7), (1, 7), (4, 7), (6, 7)]
    for original, patched in zip(originals, payloads):
        for position, header in record.iter_batches(original):
            before, after = original[position : position + header.size], patched[position : position + header.size]
            assert before[8:12] == after[8:12] and before[16:] == after[16:]


def test_append_info_reports_log_start_and_create_time(open_log, batch):
    info = append(open_log(), batch(2), leader_epoch=0)
    assert info == type(info)(first_offset=0, last_offset=1, log_append_time_ms=-1, log_start_offset=0, record_count=2)


def test_log_append_time_rewrites_timestamps_with_a_valid_crc(open_log, batch, clock):
    """LogAppendTime: attribute bit 3 set, base and max timestamp = broker time, CRC recomputed."""
    partition_log = open_log(message_timestamp_type="LogAppendTime")
    clock.now_ms = 5_000_000
    info = append(partition_log, batch(R, 1_000) + batch(R, 2_000), leader_epoch=0)
    assert info.log_append_time_ms == 5_000_000
    headers = stored_batches(partition_log)
    assert [(h.log_append_time, h.base_timestamp, h.max_timestamp, h.base_offset) for h in headers] == [
        (True, 5_000_000, 5_000_000, 0),
        (True, 5_000_000, 5_000_000, R),
    ]
    assert partition_log.offset_for_timestamp(4_000_000) == (0, 5_000_000)


def _partial_tail(batch):
    return batch(R) + batch(R)[:100]


def _corrupt_second(batch):
    payload = batch(R) + batch(R)
    payload[-5] ^= 0xFF
    return payload


@pytest.mark.parametrize(
    "make_payload, error",
    [
        (lambda batch: bytearray(), CorruptMessageError),
        (_partial_tail, CorruptMessageError),
        (lambda batch: batch(R) + bytearray(5), CorruptMessageError),
        (_corrupt_second, CorruptMessageError),
        (lambda batch: bytearray(b"\x00" * 200), CorruptMessageError),
        (lambda batch: batch(R) + batch(300), MessageTooLargeError),
    ],
    ids=["empty", "partial-trailing-batch", "trailing-bytes", "second-batch-crc", "garbage", "second-batch-too-large"],
)
def test_invalid_payload_writes_nothing(open_log, batch, make_payload, error):
    """Validation covers every batch before any byte is written or any header is patched."""
    partition_log = open_log()
    append(partition_log, batch(R), leader_epoch=0)
    before, payload = file_sizes(partition_log), make_payload(batch)
    untouched = bytes(payload)
    with pytest.raises(error):
        append(partition_log, payload, leader_epoch=0)
    assert file_sizes(partition_log) == before
    assert bytes(payload) == untouched
    assert partition_log.log_end_offset == R


def test_append_releases_the_payload_buffer(open_log, batch):
    """The server may reuse (resize) its receive buffer once append returns."""
    payload = batch(R)
    append(open_log(), payload, leader_epoch=0)
    payload += b"more"  # BufferError if a memoryview still pinned it


def test_append_rejects_a_read_only_buffer(open_log, batch):
    with pytest.raises(TypeError, match="writable"):
        append(open_log(), bytes(batch(R)), leader_epoch=0)


# --- read -------------------------------------------------------------------------------


def test_read_returns_the_batch_holding_every_offset(open_log, batch):
    """First, middle and last record of every batch, across segments; max_bytes=1 still gets a whole batch."""
    partition_log = open_log()
    fill(partition_log, batch, 10)
    assert len(partition_log.segments()) == 4
    size = len(batch(R))
    for offset in range(10 * R):
        found = partition_log.read(offset, max_bytes=1)
        assert found.first_offset == offset // R * R and found.size == size
        header = record.validate_batch(found.read_bytes())
        assert header.base_offset <= offset < header.next_offset


@pytest.mark.parametrize("offset", [-1, 31, 10**6], ids=["negative", "past-leo", "far-past-leo"])
def test_read_outside_the_log_is_out_of_range(open_log, batch, offset):
    partition_log = open_log()
    fill(partition_log, batch, 10)
    with pytest.raises(OffsetOutOfRangeError, match=r"\[0, 30\]"):
        partition_log.read(offset, 100)


def test_read_at_log_end_is_empty(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 2)
    found = partition_log.read(2 * R, 100)
    assert (found.size, found.first_offset, found.read_bytes()) == (0, 2 * R, b"")


@pytest.mark.parametrize(
    "offset, max_bytes, max_offset, batches",
    [(0, 10**6, None, 3), (3, 10**6, None, 2), (0, 10**6, 6, 2), (9, 10**6, 12, 1), (0, 1, None, 1)],
    ids=["whole-first-segment", "rest-of-segment", "stop-at-max-offset", "next-segment", "kip74"],
)
def test_read_stays_within_one_segment(open_log, batch, offset, max_bytes, max_offset, batches):
    partition_log = open_log()
    fill(partition_log, batch, 10)
    assert partition_log.read(offset, max_bytes, max_offset).size == batches * len(batch(R))


def test_read_may_end_mid_batch(open_log, batch):
    """The slice honours max_bytes past the first batch; clients drop the partial tail."""
    partition_log = open_log()
    fill(partition_log, batch, 3)
    size = len(batch(R))
    found = partition_log.read(0, size + 10)
    assert found.size == size + 10
    assert [h.base_offset for _, h in record.iter_batches(found.read_bytes())] == [0]


# --- rolling ----------------------------------------------------------------------------


def test_segment_rolls_before_exceeding_segment_bytes(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 10)
    segments = partition_log.segments()
    assert [s.base_offset for s in segments] == [0, 9, 18, 27]
    assert all(s.size <= 4096 for s in segments)
    assert all(s.sealed for s in segments[:-1]) and not segments[-1].sealed


def test_one_append_of_many_batches_rolls_between_them_at_segment_bytes(open_log, batch):
    """A record set of ten batches in one append is split over segments like ten separate appends."""
    partition_log = open_log()
    payload = bytearray().join(batch(R) for _ in range(10))
    info = append(partition_log, payload, leader_epoch=0)
    assert (info.first_offset, info.last_offset) == (0, 10 * R - 1)
    segments = partition_log.segments()
    assert [s.base_offset for s in segments] == [0, 9, 18, 27]  # as ten separate appends
    assert all(s.size <= 4096 for s in segments)
    assert partition_log.read(18, 1 << 20).first_offset == 18


def test_batch_larger_than_segment_bytes_goes_alone_into_a_fresh_segment(open_log, batch):
    partition_log = open_log(max_message_bytes=16_384)
    big = batch(400)
    assert len(big) > 4096
    fill(partition_log, batch, 1)
    append(partition_log, big, leader_epoch=0)
    fill(partition_log, batch, 1)
    assert [(s.base_offset, s.next_offset) for s in partition_log.segments()] == [(0, R), (R, R + 400), (R + 400, 2 * R + 400)]
    assert partition_log.read(R + 7, 1).size == len(big)


def test_segment_rolls_once_older_than_segment_ms(open_log, batch, clock):
    partition_log = open_log(segment_bytes=1 << 20, max_message_bytes=1 << 20, segment_ms=1_000)
    clock.advance(10_000)  # an empty segment never rolls, however old
    fill(partition_log, batch, 1)
    clock.advance(1_000)
    fill(partition_log, batch, 1)
    assert len(partition_log.segments()) == 1
    clock.advance(1)
    fill(partition_log, batch, 1)
    assert [s.base_offset for s in partition_log.segments()] == [0, 2 * R]


def test_update_config_applies_to_the_next_append(open_log, batch):
    partition_log = open_log(segment_bytes=1 << 20, max_message_bytes=1 << 20)
    fill(partition_log, batch, 4)
    partition_log.update_config(LogConfig(segment_bytes=4096, max_message_bytes=4096))
    fill(partition_log, batch, 1)
    assert [s.base_offset for s in partition_log.segments()] == [0, 4 * R]


# --- timestamps -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, expected",
    [(0, (0, 1_000)), (1_000, (0, 1_000)), (1_003, (3, 1_010)), (1_040, (12, 1_040)), (1_092, (29, 1_092)), (1_093, None)],
    ids=["before-all", "first", "between-batches", "second-segment", "last-record", "after-all"],
)
def test_offset_for_timestamp_across_segments(open_log, batch, target, expected):
    partition_log = open_log()
    for i in range(10):
        append(partition_log, batch(R, [1_000 + 10 * i, 1_001 + 10 * i, 1_002 + 10 * i]), leader_epoch=0)
    assert partition_log.offset_for_timestamp(target) == expected


# --- retention --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "now_ms, deleted, log_start",
    [(2_000, 0, 0), (2_001, 1, 9), (6_500, 2, 18)],
    ids=["exactly-retention-ms-old", "one-segment-expired", "two-segments-expired"],
)
def test_retention_ms_deletes_whole_expired_segments(open_log, batch, now_ms, deleted, log_start):
    partition_log = open_log(retention_ms=1_000)
    fill(partition_log, batch, 7, timestamps=[1_000] * 3 + [5_000] * 3 + [9_000])
    assert expire(partition_log, now_ms) == deleted
    assert partition_log.log_start_offset == log_start
    assert [s.base_offset for s in partition_log.segments()][0] == log_start
    assert partition_log.log_end_offset == 21
    if log_start:
        with pytest.raises(OffsetOutOfRangeError):
            partition_log.read(log_start - 1, 100)
    assert partition_log.read(log_start, 100).first_offset == log_start


def test_deleted_segments_are_renamed_and_still_readable_until_deleted(open_log, batch):
    """Retention hands back open segments so in-flight sendfile reads can finish."""
    partition_log = open_log(retention_ms=1_000)
    fill(partition_log, batch, 7, timestamps=[1_000] * 6 + [9_000])
    in_flight = partition_log.read(0, 10**6)
    removed = partition_log.delete_old_segments(6_500)
    names = {p.name for p in partition_log.directory.iterdir()}
    assert {f"{0:020d}.log.deleted", f"{9:020d}.log.deleted"} <= names and f"{0:020d}.log" not in names
    assert len(in_flight.read_bytes()) == 3 * len(batch(R))
    for segment in removed:
        segment.delete()
    assert not any(name.endswith(".deleted") for name in os.listdir(partition_log.directory))


def test_expired_active_segment_is_rolled_so_the_log_stays_writable(open_log, batch):
    partition_log = open_log(retention_ms=1_000)
    fill(partition_log, batch, 7)
    assert expire(partition_log, 100_000) == 3
    assert [s.base_offset for s in partition_log.segments()] == [21]
    assert partition_log.log_start_offset == partition_log.log_end_offset == 21
    assert partition_log.read(21, 100).size == 0
    assert append(partition_log, batch(R), leader_epoch=0).first_offset == 21


@pytest.mark.parametrize(
    "retention_batches, extra_bytes, deleted",
    [(7, 0, 0), (4, 1, 0), (4, 0, 1), (1, 0, 2), (0, 0, 3)],
    ids=["at-limit", "one-byte-short-of-a-segment", "exactly-one-segment-over", "keep-active", "zero-deletes-everything"],
)
def test_retention_bytes_deletes_oldest_segments_while_still_over(open_log, batch, retention_batches, extra_bytes, deleted):
    """7 batches in segments of 3, 3 and 1: delete the oldest while what remains >= retention.bytes."""
    size = len(batch(R))
    partition_log = open_log(retention_bytes=retention_batches * size + extra_bytes)
    fill(partition_log, batch, 7)
    assert expire(partition_log, 0) == deleted
    batches_deleted = [0, 3, 6, 7][deleted]
    assert partition_log.size_bytes() == (7 - batches_deleted) * size
    assert partition_log.log_start_offset == [0, 9, 18, 21][deleted]
    assert partition_log.log_end_offset == 21


def test_disabled_retention_deletes_nothing(open_log, batch):
    partition_log = open_log(retention_ms=-1, retention_bytes=-1)
    fill(partition_log, batch, 7, timestamps=[0] * 7)
    assert partition_log.delete_old_segments(10**12) == []


# --- recovery ---------------------------------------------------------------------------


def _garbage(path, size):
    with open(path, "ab") as f:
        f.write(b"\x5a" * 100)


def _half_last_batch(path, size):
    os.truncate(path, os.path.getsize(path) - size // 2)


def _flip_last_body_byte(path, size):
    with open(path, "r+b") as f:
        f.seek(-20, os.SEEK_END)
        byte = f.read(1)
        f.seek(-20, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))


@pytest.mark.parametrize(
    "tamper, dropped_batches, dropped_extra, leo",
    [(_garbage, 0, 100, 21), (_half_last_batch, 0, -0.5, 18), (_flip_last_body_byte, 1, 0, 18)],
    ids=["garbage-appended", "last-batch-cut-in-half", "last-batch-byte-flipped"],
)
def test_torn_tail_is_truncated_on_reopen(open_log, batch, crash_log, tamper, dropped_batches, dropped_extra, leo):
    """After a crash, recovery cuts the bad tail, reports the bytes and keeps every earlier record."""
    size = len(batch(R))
    partition_log = open_log()
    fill(partition_log, batch, 7)
    crash_log(partition_log)
    tamper(partition_log.segments()[-1].log_path, size)
    reopened = open_log()
    expected = dropped_batches * size + (dropped_extra if dropped_extra >= 0 else size - size // 2)
    assert reopened.last_recovery_truncated_bytes == expected
    assert reopened.log_end_offset == reopened.recovery_point == leo
    assert [h.base_offset for h in stored_batches(reopened)] == list(range(0, leo, R))
    assert append(reopened, batch(R), leader_epoch=0).first_offset == leo


def test_recovery_keeps_batches_larger_than_a_lowered_max_message_bytes(open_log, batch, crash_log):
    """Acknowledged batches stay valid after the topic's max.message.bytes shrinks below them."""
    partition_log = open_log()
    fill(partition_log, batch, 4)
    crash_log(partition_log)
    reopened = open_log(max_message_bytes=128)
    assert reopened.last_recovery_truncated_bytes == 0 and reopened.log_end_offset == 4 * R


def test_torn_tail_in_an_earlier_segment_deletes_every_later_segment(open_log, batch, crash_log):
    """Nothing was flushed (recovery point 0), so segment 9 is part of the unflushed tail: a bad
    batch there ends the log. Changed on purpose: below the recovery point the same damage is kept
    and reported instead (test_log_loader.py)."""
    size = len(batch(R))
    partition_log = open_log()
    fill(partition_log, batch, 7)
    crash_log(partition_log)
    middle = partition_log.segments()[1].log_path
    with open(middle, "r+b") as f:
        f.seek(size + 100)  # inside the segment's second batch
        f.write(b"\xff\xff")
    reopened = open_log()
    assert [s.base_offset for s in reopened.segments()] == [0, 9]
    assert reopened.log_end_offset == 12
    assert reopened.last_recovery_truncated_bytes == 2 * size + size  # rest of segment 9, all of 18
    assert not (reopened.directory / f"{18:020d}.log").exists()


def test_recovery_starts_at_the_segment_holding_the_recovery_point(open_log, logs, batch, crash_log, monkeypatch):
    """Restart work depends on the unflushed tail: segments below the checkpointed recovery point
    are trusted (loaded from their indexes), only the one holding it and later ones are scanned."""
    partition_log = open_log()
    fill(partition_log, batch, 7)
    partition_log.flush()
    assert partition_log.recovery_point == 21
    logs.manager.checkpoint()
    fill(partition_log, batch, 2)
    crash_log(partition_log)
    recovered = []
    real_recover = Segment.recover
    monkeypatch.setattr(Segment, "recover", lambda self, *a: recovered.append(self.base_offset) or real_recover(self, *a))
    reopened = open_log()
    assert recovered == [18]
    assert reopened.log_end_offset == reopened.recovery_point == 27
    assert reopened.last_recovery_truncated_bytes == 0


def test_clean_close_then_reopen_scans_nothing(open_log, batch, monkeypatch):
    partition_log = open_log()
    fill(partition_log, batch, 7)
    partition_log.close()
    monkeypatch.setattr(Segment, "recover", lambda *a: pytest.fail("a clean log was recovered"))
    reopened = open_log()
    assert reopened.recovery_point == reopened.log_end_offset == 21
    assert reopened.last_recovery_truncated_bytes == 0
    assert [s.max_timestamp for s in reopened.segments()] == [1_002, 1_005, 1_006]


@pytest.mark.parametrize("suffixes", [[".index"], [".timeindex"], [".index", ".timeindex"]], ids=["offset", "time", "both"])
def test_missing_indexes_are_rebuilt_on_open(open_log, batch, suffixes):
    partition_log = open_log()
    fill(partition_log, batch, 7)
    partition_log.close()
    for suffix in suffixes:
        for path in partition_log.directory.glob(f"*{suffix}"):
            path.unlink()
    reopened = open_log()
    for offset in range(21):
        assert reopened.read(offset, 1).first_offset == offset // R * R
    assert reopened.offset_for_timestamp(1_004) == (12, 1_004)
    assert all((reopened.directory / f"{b:020d}{s}").exists() for b in (0, 9, 18) for s in suffixes)


def test_garbage_index_of_an_old_segment_is_rebuilt(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 7)
    partition_log.close()
    (partition_log.directory / f"{0:020d}.index").write_bytes(b"\x09" * 16)
    reopened = open_log()
    assert reopened.last_recovery_truncated_bytes == 0
    assert [reopened.read(o, 1).first_offset for o in range(9)] == [0, 0, 0, 3, 3, 3, 6, 6, 6]


def test_empty_directory_gets_one_empty_segment_at_zero(open_log):
    partition_log = open_log()
    assert [s.base_offset for s in partition_log.segments()] == [0]
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (0, 0)
    assert (partition_log.directory / f"{0:020d}.log").exists()
    assert partition_log.read(0, 100).size == 0


def test_leftovers_of_interrupted_operations_are_removed_on_open(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 1)
    partition_log.close()
    leftovers = [f"{9:020d}.log.deleted", "recovery-point.checkpoint.tmp", f"{99:020d}.index", f"{99:020d}.timeindex"]
    for name in leftovers:
        (partition_log.directory / name).write_bytes(b"x")
    reopened = open_log()
    assert not any((reopened.directory / name).exists() for name in leftovers)
    assert reopened.log_end_offset == R


# --- flush ------------------------------------------------------------------------------


def test_flush_advances_the_recovery_point_and_the_manager_checkpoints_it(open_log, logs, batch):
    """The recovery points of a directory live in one Kafka-format file the manager writes."""
    partition_log = open_log()
    fill(partition_log, batch, 7)
    checkpoint = logs.directory / RECOVERY_POINT_CHECKPOINT
    partition_log.flush(up_to=10)
    logs.manager.checkpoint()
    assert partition_log.recovery_point == 10 and read_offsets(checkpoint) == {("topic", 0): 10}
    partition_log.flush()
    logs.manager.checkpoint()
    assert partition_log.recovery_point == 21 and read_offsets(checkpoint) == {("topic", 0): 21}
    partition_log.flush(up_to=5)  # never goes back
    assert partition_log.recovery_point == 21


def test_flush_from_a_thread_while_appending(open_log, batch, crash_log):
    """A worker thread flushes in a loop while this thread appends and rolls segments."""
    partition_log = open_log()
    payloads = [batch(R) for _ in range(150)]
    stop, errors = threading.Event(), []

    def flusher():
        try:
            while not stop.is_set():
                partition_log.flush()
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for payload in payloads:
            append(partition_log, payload, leader_epoch=0)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert errors == []
    partition_log.flush()
    assert partition_log.recovery_point == partition_log.log_end_offset == 150 * R
    crash_log(partition_log)
    reopened = open_log()
    assert reopened.last_recovery_truncated_bytes == 0
    assert len(stored_batches(reopened)) == 150


@pytest.mark.parametrize(
    "overrides, records, advance_ms, expected",
    [
        ({"flush_messages": 10}, 9, 0, False),
        ({"flush_messages": 10}, 12, 0, True),
        ({"flush_ms": 100}, 3, 99, False),
        ({"flush_ms": 100}, 3, 100, True),
        ({"flush_ms": 0}, 0, 1_000, False),
    ],
    ids=["under-flush-messages", "flush-messages-reached", "younger-than-flush-ms", "flush-ms-old", "nothing-unflushed"],
)
def test_needs_flush(open_log, batch, clock, overrides, records, advance_ms, expected):
    partition_log = open_log(**overrides)
    fill(partition_log, batch, records // R)
    clock.advance(advance_ms)
    assert partition_log.needs_flush(clock()) is expected
    partition_log.flush()
    assert partition_log.needs_flush(clock()) is False


# --- leader epochs and lifecycle --------------------------------------------------------


def test_leader_epoch_checkpoint_records_where_each_epoch_starts(open_log, batch, crash_log):
    partition_log = open_log()
    for epoch in [0, 0, 2, 5]:
        append(partition_log, batch(R), leader_epoch=epoch)
    assert partition_log.leader_epoch_entries == [(0, 0), (2, 6), (5, 9)]
    assert (partition_log.directory / LEADER_EPOCH_FILE).read_text() == "0 0\n2 6\n5 9\n"
    crash_log(partition_log)
    os.truncate(partition_log.segments()[-1].log_path, 10)  # epoch 5's only batch is torn
    assert open_log().leader_epoch_entries == [(0, 0), (2, 6)]


def test_an_older_leader_epoch_replaces_the_entries_it_contradicts(open_log, batch):
    """Kafka's non-monotonic rule: a log holding newer epochs than its partition's (a directory
    adopted from elsewhere, restored metadata) keeps accepting appends; the epoch entries at or
    above the assigned one are dropped (with a warning), not every produce refused."""
    partition_log = open_log()
    append(partition_log, batch(R), leader_epoch=3)
    append(partition_log, batch(R), leader_epoch=2)
    assert partition_log.leader_epoch_entries == [(2, R)]
    assert [h.partition_leader_epoch for h in stored_batches(partition_log)] == [3, 2]


@pytest.mark.parametrize(
    "epochs, entries",
    [([0, 1, 1, 1, 1, 1, 2], [(2, 18)]), ([0, 1, 1, 1, 1, 1, 1], [(1, 18)]), ([0, 0, 0, 0, 0, 0, 0], [(0, 18)])],
    ids=["epoch-starts-at-log-start", "epoch-spans-log-start", "single-epoch"],
)
def test_retention_moves_the_covering_epoch_to_the_new_log_start(open_log, batch, epochs, entries):
    partition_log = open_log(retention_ms=1_000)
    for epoch, timestamp in zip(epochs, [1_000] * 6 + [9_000]):
        append(partition_log, batch(R, timestamp), leader_epoch=epoch)
    expire(partition_log, 6_500)
    assert partition_log.log_start_offset == 18
    assert partition_log.leader_epoch_entries == entries


def test_delete_removes_the_directory(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 4)
    partition_log.delete()
    assert not partition_log.directory.exists()
