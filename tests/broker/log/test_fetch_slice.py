"""FetchSlice: a fetch response's byte range owns a descriptor of its own, so the bytes it promised
stay readable whatever happens to the segment before they are sent."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from segment_format import record
from common.errors import KafkaStorageError
from broker.log import FileCache, UnifiedLog

from tests.helpers.logs import SMALL

R = 3  # records per test batch; three batches fill a 4 KiB segment


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def tiny_cache():
    cache = FileCache(max_open=1)
    yield cache
    cache.close()


@pytest.fixture
def three_segments(tmp_path, clock, batch, tiny_cache):
    """A log of segments 0, 9 and 18 (one batch in 18) sharing a one-descriptor cache; batches in
    segments 0 and 9 are old enough for retention at 6_500 with retention.ms=1000."""
    partition_log = UnifiedLog.open(tmp_path / "topic-0", "topic", 0, replace(SMALL, retention_ms=1_000),
                                    cache=tiny_cache, clock=clock)
    for timestamp in [1_000] * 6 + [9_000]:
        partition_log.append_as_leader(batch(R, timestamp), 0)
    partition_log.update_high_watermark(partition_log.log_end_offset)
    yield partition_log
    partition_log.close()


def first_segment_bytes(partition_log) -> bytes:
    return partition_log.segments()[0].log_path.read_bytes()


def test_a_slice_stays_readable_after_the_cache_closed_its_segment(three_segments, tiny_cache):
    expected = first_segment_bytes(three_segments)
    fetched = three_segments.read(0, 1 << 20)
    opened = tiny_cache.opened
    for offset in (9, 18, 12):  # each read takes the only cache slot from the previous segment
        three_segments.read(offset, 1 << 20).close()
    assert tiny_cache.opened > opened >= 1 and len(tiny_cache) == 1  # the log uses the cache it was given
    assert fetched.read_bytes() == expected
    fetched.close()


def test_a_slice_stays_readable_after_retention_renamed_and_purged_its_segment(three_segments):
    expected = first_segment_bytes(three_segments)
    fetched = three_segments.read(0, 1 << 20)
    removed = three_segments.delete_old_segments(6_500)
    assert [s.base_offset for s in removed] == [0, 9]
    assert removed[0].log_path.name.endswith(".deleted")
    assert fetched.read_bytes() == expected  # renamed
    for segment in removed:
        segment.delete()
    assert not removed[0].log_path.exists()
    assert fetched.read_bytes() == expected  # unlinked
    assert [h.base_offset for _, h in record.iter_batches(fetched.read_bytes())] == [0, 3, 6]
    fetched.close()


def test_a_slice_returns_what_still_exists_after_truncation_shortened_its_file(three_segments, batch):
    """A follower truncating the active segment cuts the file under an unsent slice: it returns
    the bytes that are left rather than raise (the server aborts a short send; the consumer
    fetches again)."""
    three_segments.truncate_to(18)  # segment 9 (9..17) is the active one now
    fetched = three_segments.read(9, 1 << 20)
    assert fetched.size == 3 * len(batch(R))
    three_segments.truncate_to(12)
    assert [h.base_offset for _, h in record.iter_batches(fetched.read_bytes())] == [9]
    fetched.close()


def test_closing_slices_releases_their_descriptors(three_segments):
    before = open_fds()
    slices = [three_segments.read(offset, 1 << 20) for offset in (0, 9, 18)]
    assert open_fds() - before >= 3
    for fetched in slices:
        fetched.close()
    assert open_fds() - before <= 1  # at most the cache's one slot changed hands
    with pytest.raises(KafkaStorageError):
        slices[0].read_bytes()


def test_an_empty_slice_owns_no_descriptor(three_segments):
    fetched = three_segments.read(three_segments.log_end_offset, 1 << 20)
    assert (fetched.file, fetched.size, fetched.read_bytes()) == (None, 0, b"")
    fetched.close()
