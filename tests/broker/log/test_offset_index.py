"""The offset index (OFFSET_INDEX): floor lookups, growth invariants, truncation, persistence and sanity checks."""
from __future__ import annotations

import struct

import pytest

from broker.config import LogConfig
from broker.log import LogManager, TopicLogSpec
from broker.log.index_file import IndexFile
from segment_format.index_file import CorruptIndexError, HEADER_SIZE, OFFSET_INDEX, TIME_INDEX, IndexOrderError
from segment_format.record import encode_batch
from segment_format.batch_body import make_body

BASE = 100
ENTRIES = [(110, 1000), (120, 2000), (130, 3000)]
# The header pinned byte by byte: magic "PMQI", version 1 (uint16), entry size 8 (uint16), base offset 100 (int64).
HEADER = bytes.fromhex("504d5149" "0100" "0800" "6400000000000000")


RELATIVE_ENTRIES = [(offset - BASE, position) for offset, position in ENTRIES]


def index_file(tmp_path, entries, base=BASE, header=None):
    """Write an `.index` file holding `header` (the valid one by default) and `entries`
    (relative offset, position)."""
    path = tmp_path / f"{base:020d}.index"
    header = OFFSET_INDEX.header(base) if header is None else header
    path.write_bytes(header + b"".join(struct.pack("<ii", *entry) for entry in entries))
    return path


@pytest.fixture
def index(tmp_path):
    index = IndexFile.create(OFFSET_INDEX, tmp_path / f"{BASE:020d}.index", BASE)
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
    assert index.position_of(offset) == expected


@pytest.mark.parametrize(
    "offset, position",
    [(130, 4000), (125, 4000), (140, 3000), (140, 2500)],
    ids=["same-offset", "lower-offset", "same-position", "lower-position"],
)
def test_append_refuses_entries_that_do_not_grow(index, offset, position):
    """Entries that do not strictly grow in offset and position are IndexOrderError naming the
    file and both entries (checked under python -O too)."""
    with pytest.raises(IndexOrderError, match=rf"\.index: entry \(offset {offset}, position {position}\) does not follow"):
        index.append(offset, position)


def test_append_refuses_a_relative_offset_beyond_int32(index):
    """An offset too far from the base cannot be stored in the 4-byte relative field."""
    with pytest.raises(CorruptIndexError, match="outside what an entry holds"):
        index.append(BASE + 2**31, 5000)


def test_create_writes_the_versioned_header_at_the_first_write(tmp_path):
    """A new index costs no I/O until it is written; then its file is exactly the 16 known
    header bytes."""
    index = IndexFile.create(OFFSET_INDEX, tmp_path / f"{BASE:020d}.index", BASE)
    assert not index.path.exists()
    index.write_pending()
    index.close()
    assert index.path.read_bytes() == HEADER
    assert OFFSET_INDEX.header(BASE) == HEADER


def test_entries_reach_the_file_only_when_written(index):
    """Appends queue entries in memory; the first write_pending creates the file with the header
    and them in one write, a later one adds entries after those."""
    assert not index.path.exists()
    index.write_pending()
    assert index.path.read_bytes() == HEADER + b"".join(struct.pack("<ii", o - BASE, p) for o, p in ENTRIES)
    index.append(ENTRIES[-1][0] + 10, ENTRIES[-1][1] + 100)
    index.write_pending()
    assert index.path.read_bytes()[-8:] == struct.pack("<ii", ENTRIES[-1][0] + 10 - BASE, ENTRIES[-1][1] + 100)
    index.truncate_entries(len(ENTRIES))
    assert index.path.read_bytes() == HEADER + b"".join(struct.pack("<ii", o - BASE, p) for o, p in ENTRIES)


def test_flushed_entries_load_back(index):
    """A flushed index loads with the same entries and lookups."""
    index.flush()
    loaded = IndexFile.load(OFFSET_INDEX, index.path, BASE)
    assert len(loaded) == 3
    assert (loaded.last_entry) == (130, 3000)
    assert loaded.position_of(125) == (120, 2000)


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
    assert len(IndexFile.load(OFFSET_INDEX, index.path, BASE)) == remaining


def test_reset_empties_memory_and_file_but_keeps_the_header(index):
    """reset() is the first step of a rebuild; the file stays a valid (empty) index."""
    index.write_pending()
    index.reset()
    assert len(index) == 0 and index.path.read_bytes() == HEADER
    assert index.position_of(130) == (BASE, 0)
    assert len(IndexFile.load(OFFSET_INDEX, index.path, BASE)) == 0


def test_create_over_an_old_file_leaves_only_the_header(tmp_path):
    """An index re-created at a path that held entries of old data starts empty."""
    path = index_file(tmp_path, RELATIVE_ENTRIES)
    index = IndexFile.create(OFFSET_INDEX, path, BASE)
    index.flush()
    assert path.read_bytes() == HEADER


def test_parse_reads_the_bytes_of_a_whole_file(tmp_path):
    """parse() is load() without the file: what a remote segment reader uses."""
    data = index_file(tmp_path, RELATIVE_ENTRIES).read_bytes()
    parsed = OFFSET_INDEX.parse(data, tmp_path / "remote.index", BASE)
    assert parsed.position_of(125) == (120, 2000) and len(parsed) == 3


def test_load_rejects_missing_file(tmp_path):
    with pytest.raises(CorruptIndexError, match="missing"):
        IndexFile.load(OFFSET_INDEX, tmp_path / "nope.index", 0)


def test_load_rejects_partial_entry(tmp_path):
    """A torn write leaves entry bytes that are not a multiple of 8."""
    path = index_file(tmp_path, [(1, 100)])
    path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
    with pytest.raises(CorruptIndexError, match="whole number"):
        IndexFile.load(OFFSET_INDEX, path, BASE)


@pytest.mark.parametrize(
    "header, match",
    [
        (b"", "too short"),
        (HEADER[:15], "too short"),
        (b"PMQT" + HEADER[4:], "magic"),
        (HEADER[:4] + struct.pack("<H", 2) + HEADER[6:], "version 2"),
        (HEADER[:4] + struct.pack("<H", 0) + HEADER[6:], "version 0"),
        (HEADER[:6] + struct.pack("<H", 12) + HEADER[8:], "entry size"),
        (HEADER[:8] + struct.pack("<q", BASE + 1), "base offset"),
    ],
    ids=["empty", "torn-header", "time-index-magic", "newer-version", "version-0", "entry-size", "other-base"],
)
def test_load_rejects_a_bad_header(tmp_path, header, match):
    """A file that is not a version-1 offset index of this segment is rebuilt, never trusted."""
    entries = RELATIVE_ENTRIES if len(header) == HEADER_SIZE else []  # a torn header ends the file
    with pytest.raises(CorruptIndexError, match=match):
        IndexFile.load(OFFSET_INDEX, index_file(tmp_path, entries, header=header), BASE)


def test_load_rejects_a_file_written_before_headers_existed(tmp_path):
    """An index of the headerless format of earlier data directories is rebuilt by recovery."""
    path = tmp_path / f"{BASE:020d}.index"
    path.write_bytes(b"".join(struct.pack("<ii", o - BASE, p) for o, p in ENTRIES[:2]))  # 16 bytes
    with pytest.raises(CorruptIndexError, match="magic"):
        IndexFile.load(OFFSET_INDEX, path, BASE)


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
    path = index_file(tmp_path, entries, base=0)
    with pytest.raises(CorruptIndexError):
        IndexFile.load(OFFSET_INDEX, path, 0).sanity_check(log_size)


def test_sanity_check_accepts_valid_index(index):
    index.sanity_check(3001)


def test_a_log_with_headerless_indexes_opens_and_rebuilds_them(tmp_path):
    """A data directory from before index headers: recovery rebuilds both indexes (now with
    headers) from the `.log`, and every read still finds its records."""
    config = LogConfig(segment_bytes=4096, index_interval_bytes=0, retention_ms=-1)
    spec = {"topic": TopicLogSpec("0123456789abcdef0123456789abcdef", config, 1)}
    manager = LogManager(tmp_path, lambda: 1_000)
    log = manager.load(spec)[("topic", 0)]
    for i in range(20):
        log.append_as_leader(encode_batch(make_body([b"v" * 300], timestamps_ms=100 + i)), 0)
    manager.close()
    directory = tmp_path / "topic-0"
    indexes = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
    assert len(indexes) >= 4
    for path in indexes:  # strip the header: the format of earlier data directories
        path.write_bytes(path.read_bytes()[HEADER_SIZE:])

    manager = LogManager(tmp_path, lambda: 1_000)
    try:
        log = manager.load(spec)[("topic", 0)]
        assert log.log_end_offset == 20
        log.update_high_watermark(20)
        assert [log.offset_for_timestamp(100 + i)[0] for i in range(20)] == list(range(20))
        for path in sorted(directory.glob("*.index")):
            assert IndexFile.load(OFFSET_INDEX, path, int(path.stem)).path == path
        for path in sorted(directory.glob("*.timeindex")):
            assert IndexFile.load(TIME_INDEX, path, int(path.stem)).last_entry[0] >= 100
    finally:
        manager.close()
