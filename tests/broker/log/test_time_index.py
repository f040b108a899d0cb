"""TimeIndex: only-growing timestamps, floor lookups, truncation, persistence and sanity checks."""
from __future__ import annotations

import struct

import pytest

from broker.log.index_file import CorruptIndexError
from broker.log.time_index import NO_TIMESTAMP, TimeIndex

BASE = 50


@pytest.fixture
def index(tmp_path):
    index = TimeIndex.create(tmp_path / f"{BASE:020d}.timeindex", BASE)
    for timestamp, offset in [(100, 55), (200, 60), (300, 70)]:
        index.maybe_append(timestamp, offset)
    yield index
    index.close()


def test_maybe_append_keeps_only_larger_timestamps(index):
    """An entry whose timestamp does not exceed the last one adds nothing."""
    index.maybe_append(300, 80)
    index.maybe_append(250, 90)
    assert len(index) == 3
    index.maybe_append(301, 90)
    assert index.last_entry == (301, 90)


def test_maybe_append_asserts_offsets_never_decrease(index):
    with pytest.raises(AssertionError):
        index.maybe_append(400, 69)


def test_empty_index_has_no_timestamp(tmp_path):
    index = TimeIndex.create(tmp_path / "t.timeindex", 7)
    assert index.last_entry == (NO_TIMESTAMP, 7)
    assert index.lookup(12345) == 7


@pytest.mark.parametrize(
    "timestamp, offset",
    [(50, BASE), (99, BASE), (100, 55), (150, 55), (200, 60), (299, 60), (300, 70), (10**12, 70)],
    ids=[
        "far-before", "just-before-first", "exact-first", "between",
        "exact-second", "just-before-last", "exact-last", "after-last",
    ],
)
def test_lookup_gives_offset_from_which_to_scan(index, timestamp, offset):
    """Kafka's floor lookup: no batch before the returned offset holds a timestamp >= target."""
    assert index.lookup(timestamp) == offset


@pytest.mark.parametrize(
    "offset, remaining", [(55, 0), (56, 1), (70, 2), (71, 3)], ids=["first", "after-first", "last", "past-last"]
)
def test_truncate_to_removes_entries_at_and_above(index, offset, remaining):
    index.write_pending()
    index.truncate_to(offset)
    assert len(index) == remaining
    assert len(TimeIndex.load(index.path, BASE)) == remaining


def test_flushed_entries_load_back(index):
    index.flush()
    assert index.path.read_bytes()[:12] == struct.pack("<qi", 100, 5)
    loaded = TimeIndex.load(index.path, BASE)
    assert loaded.last_entry == (300, 70)
    assert loaded.lookup(250) == 60


@pytest.mark.parametrize(
    "entries, next_offset",
    [
        ([(200, 1), (100, 2)], 10),
        ([(100, 1), (100, 2)], 10),
        ([(100, 5), (200, 4)], 10),
        ([(100, 1), (200, 10)], 10),
    ],
    ids=["timestamps-decrease", "timestamps-repeat", "offsets-decrease", "offset-past-log-end"],
)
def test_sanity_check_rejects_inconsistent_index(tmp_path, entries, next_offset):
    path = tmp_path / "bad.timeindex"
    path.write_bytes(b"".join(struct.pack("<qi", *entry) for entry in entries))
    with pytest.raises(CorruptIndexError):
        TimeIndex.load(path, 0).sanity_check(next_offset)


def test_load_rejects_partial_entry(tmp_path):
    path = tmp_path / "torn.timeindex"
    path.write_bytes(struct.pack("<qi", 100, 1)[:7])
    with pytest.raises(CorruptIndexError):
        TimeIndex.load(path, 0)
