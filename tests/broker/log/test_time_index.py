"""The time index (TIME_INDEX): only-growing timestamps, floor lookups, truncation, persistence and sanity checks."""
from __future__ import annotations

import struct

import pytest

from broker.log.index_file import IndexFile
from segment_format.index_file import CorruptIndexError, HEADER_SIZE, NO_TIMESTAMP, TIME_INDEX, IndexOrderError

BASE = 50
# The header pinned byte by byte: magic "PMQT", version 1 (uint16), entry size 12 (uint16), base offset 50 (int64).
HEADER = bytes.fromhex("504d5154" "0100" "0c00" "3200000000000000")


def index_file(tmp_path, entries, base=BASE, header=None):
    """Write a `.timeindex` file holding `header` (the valid one by default) and `entries`
    (timestamp, relative offset)."""
    path = tmp_path / f"{base:020d}.timeindex"
    header = TIME_INDEX.header(base) if header is None else header
    path.write_bytes(header + b"".join(struct.pack("<qi", *entry) for entry in entries))
    return path


@pytest.fixture
def index(tmp_path):
    index = IndexFile.create(TIME_INDEX, tmp_path / f"{BASE:020d}.timeindex", BASE)
    for timestamp, offset in [(100, 55), (200, 60), (300, 70)]:
        index.append(timestamp, offset)
    yield index
    index.close()


def test_maybe_append_keeps_only_larger_timestamps(index):
    """An entry whose timestamp does not exceed the last one adds nothing."""
    index.append(300, 80)
    index.append(250, 90)
    assert len(index) == 3
    index.append(301, 90)
    assert index.last_entry == (301, 90)


def test_maybe_append_refuses_an_offset_that_goes_back(index):
    """Offsets never decrease in a time index: IndexOrderError naming the file and both entries."""
    with pytest.raises(IndexOrderError, match=r"\.timeindex: entry \(timestamp 400, offset 69\) does not follow "
                                              r"\(timestamp 300, offset 70\) in time index order"):
        index.append(400, 69)


def test_empty_index_has_no_timestamp(tmp_path):
    index = IndexFile.create(TIME_INDEX, tmp_path / "t.timeindex", 7)
    assert index.last_entry == (NO_TIMESTAMP, 7)
    assert index.offset_for_time(12345) == 7


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
    assert index.offset_for_time(timestamp) == offset


@pytest.mark.parametrize(
    "offset, remaining", [(55, 0), (56, 1), (70, 2), (71, 3)], ids=["first", "after-first", "last", "past-last"]
)
def test_truncate_to_removes_entries_at_and_above(index, offset, remaining):
    index.write_pending()
    index.truncate_to(offset)
    assert len(index) == remaining
    assert len(IndexFile.load(TIME_INDEX, index.path, BASE)) == remaining


def test_create_writes_the_versioned_header(tmp_path):
    """A new time index file is exactly the 16 known header bytes."""
    index = IndexFile.create(TIME_INDEX, tmp_path / f"{BASE:020d}.timeindex", BASE)
    index.flush()
    assert index.path.read_bytes() == HEADER
    assert TIME_INDEX.header(BASE) == HEADER


def test_flushed_entries_load_back(index):
    """Entries follow the header: (timestamp int64, relative offset int32), 12 bytes each."""
    index.flush()
    assert index.path.read_bytes()[:HEADER_SIZE + 12] == HEADER + struct.pack("<qi", 100, 5)
    loaded = IndexFile.load(TIME_INDEX, index.path, BASE)
    assert loaded.last_entry == (300, 70)
    assert loaded.offset_for_time(250) == 60


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
    path = index_file(tmp_path, entries, base=0)
    with pytest.raises(CorruptIndexError):
        IndexFile.load(TIME_INDEX, path, 0).sanity_check(next_offset)


def test_load_rejects_partial_entry(tmp_path):
    """A torn write leaves entry bytes that are not a multiple of 12."""
    path = index_file(tmp_path, [])
    path.write_bytes(path.read_bytes() + struct.pack("<qi", 100, 1)[:7])
    with pytest.raises(CorruptIndexError, match="whole number"):
        IndexFile.load(TIME_INDEX, path, BASE)


def test_reset_keeps_a_valid_header(index):
    """A rebuild starts from a file that loads as an empty time index."""
    index.write_pending()
    index.reset()
    assert index.path.read_bytes() == HEADER
    assert IndexFile.load(TIME_INDEX, index.path, BASE).last_entry == (NO_TIMESTAMP, BASE)


@pytest.mark.parametrize(
    "header, match",
    [
        (HEADER[:10], "too short"),
        (b"PMQI" + HEADER[4:], "magic"),
        (HEADER[:4] + struct.pack("<H", 2) + HEADER[6:], "version 2"),
        (HEADER[:6] + struct.pack("<H", 8) + HEADER[8:], "entry size"),
        (HEADER[:8] + struct.pack("<q", 0), "base offset"),
    ],
    ids=["torn-header", "offset-index-magic", "newer-version", "entry-size", "other-base"],
)
def test_load_rejects_a_bad_header(tmp_path, header, match):
    """A file that is not a version-1 time index of this segment is rebuilt, never trusted."""
    entries = [(100, 5)] if len(header) == HEADER_SIZE else []
    with pytest.raises(CorruptIndexError, match=match):
        IndexFile.load(TIME_INDEX, index_file(tmp_path, entries, header=header), BASE)


def test_load_rejects_a_file_written_before_headers_existed(tmp_path):
    """A headerless time index of an earlier data directory is rebuilt by recovery."""
    path = tmp_path / f"{BASE:020d}.timeindex"
    path.write_bytes(struct.pack("<qi", 100, 5) + struct.pack("<qi", 200, 10))
    with pytest.raises(CorruptIndexError, match="magic"):
        IndexFile.load(TIME_INDEX, path, BASE)
