"""Segment: append and index, find/read by offset, recovery of torn tails, load, truncation."""
from __future__ import annotations

import errno
import itertools
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format import batch_body, record
from common.errors import CorruptMessageError, KafkaStorageError, LogInvariantError
from segment_format.index_file import CorruptIndexError, NO_TIMESTAMP
from broker.log.file_cache import FileCache
from broker.log.segment import BatchInfo, Segment


def build_batch(records: int, timestamp_ms: int | list[int] = 1_000) -> bytearray:
    """One encoded batch of equal values: equal record counts give equal sizes."""
    return record.encode_batch(batch_body.make_body([b"value-0123"] * records, timestamps_ms=timestamp_ms))

RECORDS = 3  # per batch
SIZE = len(build_batch(RECORDS))  # every test batch has this size
NO_INDEX = 10**9  # an index interval that never adds entries


def append(segment: Segment, data: bytearray, interval: int = 0, now_ms: int = 0) -> None:
    """Append one encoded batch at the segment's next offset, as UnifiedLog would."""
    header = record.read_header(data)
    record.patch_offsets(data, 0, segment.next_offset, 0)
    info = BatchInfo(segment.next_offset, segment.next_offset + header.record_count, header.size, header.max_timestamp)
    segment.append(memoryview(data), [info], interval, now_ms)


@pytest.fixture
def segment(tmp_path, cache):
    segment = Segment.create(tmp_path, 0, cache)
    yield segment
    segment.close()


def filled(segment: Segment, batches: int = 5, interval: int = 0, timestamps: list[int] | None = None) -> Segment:
    for i in range(batches):
        append(segment, build_batch(RECORDS, timestamps[i] if timestamps else 1_000 + i), interval)
    return segment


def reopen(segment: Segment) -> Segment:
    segment.close()
    return Segment.open(segment.log_path.parent, segment.base_offset, segment._cache)


@pytest.mark.parametrize("interval", [0, SIZE, NO_INDEX], ids=["every-batch", "every-other-batch", "no-index"])
def test_find_position_locates_the_batch_holding_every_offset(segment, interval):
    """Index lookup plus header scan finds the batch for first, middle and last records."""
    filled(segment, interval=interval)
    for offset in range(5 * RECORDS):
        position, header = segment.find_position(offset)
        assert position == offset // RECORDS * SIZE
        assert header.base_offset <= offset < header.next_offset
    assert segment.find_position(5 * RECORDS) is None


@pytest.mark.parametrize(
    "interval, entries",
    [(0, [1, 2, 3, 4]), (SIZE, [2, 4]), (2 * SIZE, [3]), (NO_INDEX, [])],
    ids=["zero", "one-batch", "two-batches", "never"],
)
def test_index_entry_once_more_than_interval_bytes_since_last(segment, interval, entries):
    """Kafka's rule: an entry when bytes since the last entry exceed index.interval.bytes."""
    filled(segment, interval=interval)
    assert [segment.offset_index.position_of(batch * RECORDS) for batch in entries] == [
        (batch * RECORDS, batch * SIZE) for batch in entries
    ]
    assert len(segment.offset_index) == len(entries)


@pytest.mark.parametrize(
    "offset, max_bytes, max_offset, expected",
    [
        (0, 10, None, (0, SIZE)),
        (0, SIZE + 10, None, (0, SIZE + 10)),
        (4, 10**6, None, (SIZE, 4 * SIZE)),
        (14, 10**6, None, (4 * SIZE, SIZE)),
        (0, 10**6, 6, (0, 2 * SIZE)),
        (0, 10**6, 7, (0, 2 * SIZE)),
        (0, 10, 7, (0, SIZE)),
        (4, 10**6, 5, (SIZE, 0)),
        (0, 10**6, 100, (0, 5 * SIZE)),
    ],
    ids=[
        "kip74-whole-first-batch",
        "cut-mid-batch",
        "middle-to-end",
        "last-record",
        "stop-before-max-offset-batch",
        "max-offset-mid-batch",
        "kip74-with-max-offset",
        "max-offset-in-first-batch",
        "max-offset-past-end",
    ],
)
def test_read_range(segment, offset, max_bytes, max_offset, expected):
    """read() starts at the batch holding `offset` and sizes the range by max_bytes, max_offset, KIP-74."""
    filled(segment)
    found = segment.read(offset, max_bytes, max_offset)
    assert (found.position if found.size else expected[0], found.size) == expected  # an empty range has no position
    assert found.first_offset == offset // RECORDS * RECORDS
    assert found.read_bytes() == segment.log_path.read_bytes()[expected[0] : sum(expected)]


def test_reads_at_recently_appended_boundaries_match_reads_after_reopen(segment):
    """Tailing fetches find their batch among the recent appends (no index scan); the answers
    equal those of a reopened segment, which has only the index, for every boundary and limit."""
    filled(segment, batches=6, interval=NO_INDEX)
    fresh = [(s.position, s.size, s.first_offset) for s in
             (segment.read(o, 10**6, limit) for o in range(0, 18, RECORDS) for limit in (None, 9, 18))]
    reopened = reopen(segment)
    reopened.load()
    assert [(s.position, s.size, s.first_offset) for s in
            (reopened.read(o, 10**6, limit) for o in range(0, 18, RECORDS) for limit in (None, 9, 18))] == fresh
    reopened.close()


def test_no_read_uses_a_batch_boundary_that_truncation_removed(segment):
    """After truncate_to, batches appended again at the same offsets (here larger) are read where
    they are now, not where the removed ones were."""
    filled(segment, batches=4)
    segment.truncate_to(6)
    bigger = build_batch(RECORDS * 2)
    append(segment, bigger)
    append(segment, build_batch(RECORDS))
    inside = segment.read(9, 1)  # a boundary before the truncation, inside the bigger batch now
    assert (inside.position, inside.size, inside.first_offset) == (2 * SIZE, len(bigger), 6)
    after = segment.read(12, 1)
    assert (after.position, after.first_offset) == (2 * SIZE + len(bigger), 12)
    assert after.read_bytes() == segment.log_path.read_bytes()[2 * SIZE + len(bigger):]


def test_read_past_the_end_is_none(segment):
    filled(segment)
    assert segment.read(15, 100) is None


@pytest.mark.parametrize("interval", [0, NO_INDEX], ids=["indexed", "unindexed"])
def test_load_restores_state_written_by_appends(segment, interval):
    """After flush, a reopened segment knows its size, next offset, max timestamp and age."""
    filled(segment, interval=interval, timestamps=[5_000, 3_000, 9_000, 1_000, 2_000])
    segment.flush()
    loaded = reopen(segment)
    loaded.load()
    assert (loaded.size, loaded.next_offset, loaded.max_timestamp) == (5 * SIZE, 15, 9_000)
    assert loaded.first_append_ms == 5_000  # Kafka's rule after a restart: the first batch's timestamp
    assert loaded.find_position(7)[0] == 2 * SIZE
    loaded.close()


def test_empty_segment_has_no_timestamp(segment):
    assert (segment.size, segment.next_offset, segment.max_timestamp, segment.first_append_ms) == (0, 0, NO_TIMESTAMP, None)


def test_load_rejects_missing_index(segment):
    filled(segment)
    segment.flush()
    segment.offset_index.path.unlink()
    loaded = reopen(segment)
    with pytest.raises(CorruptIndexError, match="missing"):
        loaded.load()
    loaded.close()


def test_load_rejects_index_entry_that_does_not_match_the_log(segment):
    """An entry pointing at a batch with another base offset means the index is stale."""
    filled(segment)
    segment.flush()
    header = segment.offset_index.kind.header(segment.base_offset)
    segment.offset_index.path.write_bytes(header + (4).to_bytes(4, "little") + SIZE.to_bytes(4, "little"))
    loaded = reopen(segment)
    with pytest.raises(CorruptIndexError, match="does not match"):
        loaded.load()
    loaded.close()


def test_load_rejects_torn_tail(segment):
    """load() validates the batches after the last index entry: a torn one sends us to recover()."""
    filled(segment)
    segment.flush()
    with open(segment.log_path, "ab") as f:
        f.write(b"\x00" * 30)
    loaded = reopen(segment)
    with pytest.raises(CorruptMessageError):
        loaded.load()
    loaded.close()


def test_recover_of_a_clean_segment_drops_nothing_and_rebuilds_the_index(segment):
    filled(segment)
    segment.flush()
    offset_index = segment.offset_index.path.read_bytes()
    recovered = reopen(segment)
    assert recovered.recover(index_interval_bytes=0) == 0
    assert recovered.offset_index.path.read_bytes() == offset_index
    assert recovered.time_index.last_entry == (1_004, 12)
    assert (recovered.size, recovered.next_offset) == (5 * SIZE, 15)
    recovered.close()


def _append_garbage(path, size):
    with open(path, "ab") as f:
        f.write(b"\x07" * 100)


def _cut_last_batch_in_half(path, size):
    os.truncate(path, size - SIZE // 2)


def _flip_byte(position):
    def flip(path, size):
        with open(path, "r+b") as f:
            f.seek(position(size))
            byte = f.read(1)
            f.seek(position(size))
            f.write(bytes([byte[0] ^ 0xFF]))

    return flip


def _append_zeros(path, size):
    with open(path, "ab") as f:
        f.write(b"\x00" * 4096)


def _append_short_length_prefix(path, size):
    with open(path, "ab") as f:
        f.write(b"\x00" * 5)


@pytest.mark.parametrize(
    "tamper, dropped, next_offset",
    [
        (_append_garbage, 100, 15),
        (_append_zeros, 4096, 15),
        (_append_short_length_prefix, 5, 15),
        (_cut_last_batch_in_half, SIZE - SIZE // 2, 12),
        (_flip_byte(lambda size: size - 10), SIZE, 12),
        (_flip_byte(lambda size: size - SIZE + 30), SIZE, 12),
        (_flip_byte(lambda size: size - SIZE + 8), SIZE, 12),
        (_flip_byte(lambda size: size - 2 * SIZE + 100), 2 * SIZE, 9),
    ],
    ids=[
        "garbage-appended",
        "zeros-appended",
        "partial-length-prefix",
        "last-batch-cut-in-half",
        "last-batch-body-byte-flipped",
        "last-batch-timestamp-flipped",
        "last-batch-length-flipped",
        "second-to-last-batch-corrupt",
    ],
)
def test_recover_truncates_a_torn_or_corrupt_tail(segment, tamper, dropped, next_offset):
    """Everything from the first bad batch on is cut; earlier batches survive and the size dropped is reported."""
    filled(segment)
    segment.flush()
    tamper(segment.log_path, 5 * SIZE)
    recovered = reopen(segment)
    assert recovered.recover(index_interval_bytes=0) == dropped
    assert recovered.next_offset == next_offset
    assert recovered.log_path.stat().st_size == recovered.size == next_offset // RECORDS * SIZE
    data = recovered.log_path.read_bytes()
    assert [h.base_offset for _, h in record.iter_batches(data)] == list(range(0, next_offset, RECORDS))
    append(recovered, build_batch(RECORDS))  # writable again at the cut
    assert recovered.next_offset == next_offset + RECORDS
    recovered.close()


def test_recover_truncates_where_offsets_go_backwards(segment):
    """The CRC does not cover base_offset, so recovery checks offsets grow on its own."""
    filled(segment)
    segment.flush()
    with open(segment.log_path, "r+b") as f:
        f.seek(4 * SIZE)
        f.write((3).to_bytes(8, "little"))
    recovered = reopen(segment)
    assert recovered.recover(index_interval_bytes=0) == SIZE
    recovered.close()


def test_recover_keeps_a_batch_over_todays_size_limit(segment):
    """Changed on purpose: recovery no longer treats a batch larger than max.message.bytes as
    corrupt. The limit is a produce-time rule; a batch accepted under a larger limit before the
    topic's config shrank is intact and stays (Kafka's recovery checks only structure and CRC)."""
    filled(segment)
    segment.flush()
    recovered = reopen(segment)
    assert recovered.recover(index_interval_bytes=0) == 0
    assert recovered.next_offset == 5 * RECORDS
    recovered.close()


@pytest.mark.parametrize(
    "offset, size, next_offset",
    [(0, 0, 0), (6, 2 * SIZE, 6), (7, 2 * SIZE, 6), (14, 4 * SIZE, 12), (15, 5 * SIZE, 15)],
    ids=["everything", "batch-start", "mid-batch", "last-record", "past-end"],
)
def test_truncate_to_removes_the_batch_holding_offset_and_after(segment, offset, size, next_offset):
    filled(segment)
    removed = segment.truncate_to(offset)
    assert (removed, segment.size, segment.next_offset) == (5 * SIZE - size, size, next_offset)
    assert segment.log_path.stat().st_size == size
    assert segment.max_timestamp == (1_000 + next_offset // RECORDS - 1 if size else NO_TIMESTAMP)
    assert segment.offset_index.last_entry[0] < max(next_offset, 1)


def test_seal_records_the_max_timestamp_and_forbids_appends(segment):
    """The sealed time index ends with the segment's max timestamp (read by retention after restart)."""
    filled(segment, interval=NO_INDEX, timestamps=[5, 9, 7, 1, 2])
    segment.seal()
    assert segment.time_index.last_entry == (9, 3)
    with pytest.raises(LogInvariantError, match="append to a sealed segment"):
        append(segment, build_batch(RECORDS))


@pytest.mark.parametrize(
    "target, expected",
    [(5, (0, 10)), (10, (0, 10)), (15, (1, 20)), (26, (2, 30)), (31, (4, 40)), (50, (5, 50)), (55, (6, 60)), (61, None)],
    ids=[
        "before-all", "exact-first", "mid-first-batch", "earlier-offset-wins",
        "second-batch", "batch-max", "third-batch", "after-all",
    ],
)
@pytest.mark.parametrize("interval", [0, NO_INDEX], ids=["indexed", "unindexed"])
def test_offset_for_timestamp_finds_the_earliest_record_at_or_after(segment, interval, target, expected):
    """Record-level ListOffsets: the first offset whose timestamp >= target, decoding one batch."""
    for timestamps in ([10, 20, 30], [25, 40, 50], [60, 60, 60]):
        append(segment, build_batch(RECORDS, timestamps), interval)
    assert segment.offset_for_timestamp(target) == expected


def test_offset_for_timestamp_in_log_append_time_batch_is_its_base_offset(segment):
    """Every record of a LogAppendTime batch has the header's timestamp: no decoding needed."""
    body = batch_body.encode_body(batch_body.make_body([b"v"] * RECORDS, timestamps_ms=10))
    append(segment, record.frame_body(
        body, record_count=RECORDS, base_timestamp=77, max_timestamp=77, attributes=record.TIMESTAMP_TYPE_BIT
    ))
    assert segment.offset_for_timestamp(50) == (0, 77)


def test_mark_deleted_renames_files_and_open_reads_still_work(segment):
    filled(segment)
    found = segment.read(0, 10**6)
    segment.mark_deleted()
    names = sorted(p.name for p in segment.log_path.parent.iterdir())
    assert names == [f"{0:020d}{suffix}.deleted" for suffix in (".index", ".log", ".timeindex")]
    assert len(found.read_bytes()) == 5 * SIZE
    segment.delete()
    assert list(segment.log_path.parent.iterdir()) == []


def test_failed_write_raises_storage_error_and_leaves_the_file_unchanged(segment, monkeypatch):
    """A disk-full mid-write is rolled back so the next append lands where it should."""
    filled(segment, batches=1)
    real_pwrite = os.pwrite
    calls = []

    def failing_pwrite(fd, data, position):
        calls.append(position)
        if len(calls) == 1:
            return real_pwrite(fd, bytes(data[:100]), position)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    with pytest.raises(KafkaStorageError, match="No space"):
        append(segment, build_batch(RECORDS))
    monkeypatch.undo()
    assert (segment.size, segment.next_offset) == (SIZE, RECORDS)
    assert segment.log_path.stat().st_size == SIZE
    append(segment, build_batch(RECORDS))
    assert len(list(record.iter_batches(segment.log_path.read_bytes()))) == 2


def test_create_refuses_an_existing_log(segment, tmp_path, cache):
    with pytest.raises(KafkaStorageError):
        Segment.create(tmp_path, 0, cache)


def _segment_with(directory, record_counts: list[int]) -> tuple[Segment, list[int]]:
    """A flushed segment holding one batch per count; returns it and the batch sizes."""
    segment = Segment.create(directory, 0, FileCache())
    sizes = []
    for count in record_counts:
        data = build_batch(count)
        sizes.append(len(data))
        append(segment, data)
    segment.flush()
    return segment, sizes


@settings(max_examples=40)
@given(record_counts=st.lists(st.integers(1, 4), min_size=1, max_size=6), cut=st.floats(0, 1))
def test_recover_keeps_exactly_the_whole_batches_before_any_cut(record_counts, cut):
    """Property: truncating the file anywhere leaves exactly the batches that are still complete."""
    with tempfile.TemporaryDirectory() as directory:
        segment, sizes = _segment_with(Path(directory), record_counts)
        cut_at = int(cut * sum(sizes))
        os.truncate(segment.log_path, cut_at)
        kept = len([end for end in itertools.accumulate(sizes) if end <= cut_at])
        recovered = reopen(segment)
        try:
            assert recovered.recover(index_interval_bytes=0) == cut_at - sum(sizes[:kept])
            assert recovered.next_offset == sum(record_counts[:kept])
        finally:
            recovered.close()


@settings(max_examples=40)
@given(
    record_counts=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    batch_choice=st.integers(0, 5),
    byte_choice=st.integers(0, 2_000),
    xor=st.integers(1, 255),
)
def test_recover_detects_any_flipped_byte_the_crc_or_structure_covers(record_counts, batch_choice, byte_choice, xor):
    """Property: flipping any byte from magic on (magic, CRC, attributes..body) of batch k keeps batches < k.

    base_offset and leader epoch are outside the CRC by design; recovery checks offsets separately.
    """
    with tempfile.TemporaryDirectory() as directory:
        segment, sizes = _segment_with(Path(directory), record_counts)
        k = batch_choice % len(sizes)
        position = sum(sizes[:k]) + 16 + byte_choice % (sizes[k] - 16)
        with open(segment.log_path, "r+b") as f:
            f.seek(position)
            byte = f.read(1)
            f.seek(position)
            f.write(bytes([byte[0] ^ xor]))
        recovered = reopen(segment)
        try:
            assert recovered.recover(index_interval_bytes=0) == sum(sizes[k:])
            assert recovered.next_offset == sum(record_counts[:k])
        finally:
            recovered.close()


def test_sealing_an_empty_segment_writes_no_time_index_entry(tmp_path, cache):
    """An empty segment has no timestamp to name: sealing it adds no time-index entry (one at
    offset -1 made every restart of an empty partition rebuild its indexes with a warning)."""
    empty = Segment.create(tmp_path, 100, cache)
    empty.seal()
    assert len(empty.time_index) == 0
    again = reopen(empty)
    assert len(again.time_index) == 0 and again.time_index.last_entry[0] == NO_TIMESTAMP
    again.close()
