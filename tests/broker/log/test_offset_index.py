"""OffsetIndex: floor lookups, growth invariants, truncation, persistence and sanity checks."""
from __future__ import annotations

import struct

import pytest

from broker.log.index_file import CorruptIndexError
from broker.log.offset_index import OffsetIndex

BASE = 100
ENTRIES = [(110, 1000), (120, 2000), (130, 3000)]


@pytest.fixture
def index(tmp_path):
    index = OffsetIndex.create(tmp_path / f"{BASE:020d}.index", BASE)
    for offset, position in ENTRIES:
        index.append(offset, position)
    yield index
    index.close()


@pytest.mark.parametrize(
    "offset, expected",
    [
        (BASE, (BASE, 0)),
        (109, (BASE, 0)),
        (110, (110, 1000)),
        (115, (110, 1000)),
        (129, (120, 2000)),
        (130, (130, 3000)),
        (10**9, (130, 3000)),
    ],
    ids=["base", "before-first", "exact-first", "between", "just-before-last", "exact-last", "far-beyond"],
)
def test_lookup_returns_largest_entry_at_or_below(index, offset, expected):
    """A lookup gives the floor entry, or (base, 0) below the first entry."""
    assert index.lookup(offset) == expected


@pytest.mark.parametrize(
    "offset, position",
    [(130, 4000), (125, 4000), (140, 3000), (140, 2500)],
    ids=["same-offset", "lower-offset", "same-position", "lower-position"],
)
def test_append_asserts_both_fields_grow(index, offset, position):
    """Entries that do not strictly grow in offset and position are a bug, not data."""
    with pytest.raises(AssertionError):
        index.append(offset, position)


def test_append_asserts_relative_offset_fits_int32(index):
    """An offset too far from the base cannot be stored in the 4-byte relative field."""
    with pytest.raises(AssertionError):
        index.append(BASE + 2**31, 5000)


def test_entries_reach_the_file_only_when_written(index):
    """Appends queue entries in memory; write_pending puts them in the file with one write."""
    assert index.path.stat().st_size == 0
    index.write_pending()
    assert index.path.read_bytes() == b"".join(struct.pack("<ii", o - BASE, p) for o, p in ENTRIES)


def test_flushed_entries_load_back(index):
    """A flushed index loads with the same entries and lookups."""
    index.flush()
    loaded = OffsetIndex.load(index.path, BASE)
    assert len(loaded) == 3
    assert (loaded.last_offset, loaded.last_position) == (130, 3000)
    assert loaded.lookup(125) == (120, 2000)


@pytest.mark.parametrize(
    "offset, remaining",
    [(100, 0), (110, 0), (111, 1), (120, 1), (130, 2), (131, 3)],
    ids=["base", "first-entry", "after-first", "second-entry", "last-entry", "past-last"],
)
@pytest.mark.parametrize("written", [False, True], ids=["pending", "written"])
def test_truncate_to_removes_entries_at_and_above(index, offset, remaining, written):
    """truncate_to(o) keeps entries below o, in memory and in the file."""
    if written:
        index.write_pending()
    index.truncate_to(offset)
    index.write_pending()
    assert len(index) == remaining
    assert len(OffsetIndex.load(index.path, BASE)) == remaining


def test_reset_empties_memory_and_file(index):
    """reset() is the first step of a rebuild."""
    index.write_pending()
    index.reset()
    assert len(index) == 0 and index.path.stat().st_size == 0
    assert index.lookup(130) == (BASE, 0)


def test_load_rejects_missing_file(tmp_path):
    with pytest.raises(CorruptIndexError, match="missing"):
        OffsetIndex.load(tmp_path / "nope.index", 0)


def test_load_rejects_partial_entry(tmp_path):
    """A torn write leaves a size that is not a multiple of 8."""
    path = tmp_path / "torn.index"
    path.write_bytes(struct.pack("<ii", 1, 100) + b"\x01\x02\x03")
    with pytest.raises(CorruptIndexError, match="whole number"):
        OffsetIndex.load(path, 0)


@pytest.mark.parametrize(
    "entries, log_size",
    [
        ([(2, 100), (1, 200)], 1000),
        ([(1, 100), (2, 100)], 1000),
        ([(1, 100), (2, 1000)], 1000),
        ([(-1, 100)], 1000),
        ([(1, 100)], 0),
    ],
    ids=["offsets-decrease", "positions-repeat", "position-past-log-end", "negative-offset", "empty-log"],
)
def test_sanity_check_rejects_inconsistent_index(tmp_path, entries, log_size):
    """Garbage index files are caught at load so the segment rebuilds them."""
    path = tmp_path / "bad.index"
    path.write_bytes(b"".join(struct.pack("<ii", *entry) for entry in entries))
    with pytest.raises(CorruptIndexError):
        OffsetIndex.load(path, 0).sanity_check(log_size)


def test_sanity_check_accepts_valid_index(index):
    index.sanity_check(log_size=3001)
