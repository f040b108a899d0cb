"""SegmentMetadata: computed in one pass from segments written by the real log (local file and
fsspec memory), pinned JSON, strict parsing, and JSON round trips."""
from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import crc32c
import fsspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segment_format import batch_body, record
from broker.config import LogConfig
from common.errors import CorruptMessageError
from broker.log import LogManager, TopicLogSpec
from broker.log.leader_epoch import LeaderEpochCache
from segment_format.segment_metadata import FORMAT_VERSION, CorruptSegmentMetadataError, SegmentMetadata
from segment_format.segment_reader import SegmentReader
from segment_format.index_file import NO_TIMESTAMP

TOPIC_ID = "0123456789abcdef0123456789abcdef"
CONFIG = LogConfig(segment_bytes=8 << 10, index_interval_bytes=1024, retention_ms=-1)
BASE_TS = 1_700_000_000_000
EPOCHS = [0, 0, 0, 2, 2, 5]  # the leader epoch of each tenth of the appends


def write_partition(root: Path, appends: int = 60) -> tuple[Path, list[tuple[int, int]]]:
    """Append `appends` batches of 1-3 records as leader (epochs from EPOCHS) through a real
    LogManager, close it cleanly; return the partition directory and its leader-epoch entries."""
    manager = LogManager(root, lambda: BASE_TS)
    try:
        log = manager.load({"topic": TopicLogSpec(TOPIC_ID, CONFIG, 1)})[("topic", 0)]
        for i in range(appends):
            n = i % 3 + 1
            body = batch_body.make_body([b"x" * 300] * n, timestamps_ms=[BASE_TS + 7 * i - j for j in range(n)])
            log.append_as_leader(record.encode_batch(body), EPOCHS[i * len(EPOCHS) // appends])
        entries = log.leader_epoch_entries
    finally:
        manager.close()
    return root / "topic-0", entries


@pytest.fixture(scope="module")
def partition(tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    directory, entries = write_partition(tmp_path_factory.mktemp("metadata"))
    assert len(list(directory.glob("*.log"))) >= 3
    return directory, entries


def expected_epochs(entries: list[tuple[int, int]], base: int, next_offset: int) -> tuple[tuple[int, int], ...]:
    """The (epoch, start) pairs of the log's epoch cache that fall in [base, next_offset); an epoch
    begun in an earlier segment starts at `base`."""
    out = []
    for i, (epoch, start) in enumerate(entries):
        end = entries[i + 1][1] if i + 1 < len(entries) else next_offset
        if start < next_offset and end > base:
            out.append((epoch, max(start, base)))
    return tuple(out)


def test_metadata_of_each_segment_matches_the_log(partition):
    """Offsets, size, records, timestamps, epochs and CRC agree with the files and the log's epoch cache."""
    directory, entries = partition
    segments = sorted(directory.glob("*.log"))
    assert entries == LeaderEpochCache.load(directory / "leader-epoch-checkpoint").entries
    for i, segment in enumerate(segments):
        data = segment.read_bytes()
        with open(segment, "rb") as file:
            metadata = SegmentMetadata.from_reader(SegmentReader(file, int(segment.stem)))
        headers = [h for _, h in record.iter_batches(data)]
        assert metadata.base_offset == int(segment.stem) == headers[0].base_offset
        assert metadata.next_offset == headers[-1].next_offset
        if i + 1 < len(segments):
            assert metadata.next_offset == int(segments[i + 1].stem)
        assert metadata.last_offset == headers[-1].last_offset
        assert metadata.size_bytes == len(data)
        assert metadata.crc32c == crc32c.crc32c(data)
        assert metadata.record_count == sum(h.record_count for h in headers)
        assert metadata.min_timestamp == min(h.base_timestamp for h in headers)
        assert metadata.max_timestamp == max(h.max_timestamp for h in headers)
        assert metadata.leader_epochs == expected_epochs(entries, metadata.base_offset, metadata.next_offset)
        assert metadata.format_version == FORMAT_VERSION
    assert any(len(SegmentMetadata.from_reader(SegmentReader(io.BytesIO(s.read_bytes()), int(s.stem))).leader_epochs) > 1
               for s in segments)


def test_metadata_through_fsspec_equals_the_local_one(partition):
    """A reader over the memory filesystem computes the same record as over the local file."""
    directory, _ = partition
    fs = fsspec.filesystem("memory")
    root = f"/metadata-{uuid.uuid4().hex}"
    try:
        for segment in sorted(directory.glob("*.log")):
            fs.pipe_file(f"{root}/{segment.name}", segment.read_bytes())
            with fs.open(f"{root}/{segment.name}", "rb") as remote, open(segment, "rb") as local:
                assert (SegmentMetadata.from_reader(SegmentReader(remote, int(segment.stem), min_read_bytes=512))
                        == SegmentMetadata.from_reader(SegmentReader(local, int(segment.stem))))
    finally:
        fs.rm(root, recursive=True)


def test_metadata_of_an_empty_segment(tmp_path):
    """The active segment of a new log: no records, no timestamps, no epochs."""
    directory, _ = write_partition(tmp_path, appends=0)
    with open(directory / f"{0:020d}.log", "rb") as file:
        metadata = SegmentMetadata.from_reader(SegmentReader(file, 0))
    assert metadata == SegmentMetadata(0, 0, NO_TIMESTAMP, NO_TIMESTAMP, 0, 0, (), 0)
    assert metadata.last_offset == -1


def test_a_corrupt_segment_has_no_metadata(partition):
    """One flipped body byte: the builder raises instead of describing bad bytes."""
    segment = sorted(partition[0].glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0xFF
    with pytest.raises(CorruptMessageError, match="CRC"):
        SegmentMetadata.from_reader(SegmentReader(io.BytesIO(bytes(data)), int(segment.stem)))


def test_a_segment_whose_epochs_go_back_has_no_metadata():
    """Epochs are not covered by the CRC; a batch whose epoch goes backwards is corrupt data."""
    batches = [record.encode_batch(batch_body.make_body([b"v"], timestamps_ms=1), base_offset=i, partition_leader_epoch=3 - i)
               for i in range(2)]
    with pytest.raises(CorruptMessageError, match="leader epoch 2 after 3"):
        SegmentMetadata.from_reader(SegmentReader(io.BytesIO(b"".join(batches)), 0))


# --- JSON --------------------------------------------------------------------------------------------

PINNED = SegmentMetadata(base_offset=100, next_offset=150, min_timestamp=1000, max_timestamp=2000, size_bytes=4096,
                         record_count=48, leader_epochs=((3, 100), (4, 120)), crc32c=0xDEADBEEF)
PINNED_JSON = ('{"base_offset":100,"crc32c":3735928559,"format_version":1,"leader_epochs":[[3,100],[4,120]],'
               '"max_timestamp":2000,"min_timestamp":1000,"next_offset":150,"record_count":48,"size_bytes":4096}')


def test_json_is_pinned():
    """The manifest's per-segment record, byte for byte."""
    assert PINNED.to_json() == PINNED_JSON
    assert SegmentMetadata.from_json(PINNED_JSON) == PINNED
    assert SegmentMetadata.from_json(PINNED_JSON.encode()) == PINNED


@st.composite
def metadata_records(draw) -> SegmentMetadata:
    base = draw(st.integers(0, 2**62))
    count = draw(st.integers(0, 10_000))
    next_offset = base + count + draw(st.integers(0, 1000))
    if count:
        min_ts = draw(st.integers(-(2**62), 2**62))
        max_ts = draw(st.integers(min_ts, 2**62))
        starts = sorted(draw(st.sets(st.integers(base, next_offset - 1), max_size=5)))
        epochs = sorted(draw(st.sets(st.integers(0, 2**31 - 1), min_size=len(starts), max_size=len(starts))))
    else:
        min_ts = max_ts = NO_TIMESTAMP
        starts, epochs = [], []
    return SegmentMetadata(
        base_offset=base, next_offset=next_offset, min_timestamp=min_ts, max_timestamp=max_ts,
        size_bytes=draw(st.integers(1, 2**31)) if count else 0, record_count=count,
        leader_epochs=tuple(zip(epochs, starts)), crc32c=draw(st.integers(0, 2**32 - 1)))


@given(metadata_records())
def test_json_round_trips(metadata):
    assert SegmentMetadata.from_json(metadata.to_json()) == metadata
    assert SegmentMetadata.from_dict(json.loads(json.dumps(metadata.to_dict()))) == metadata


def with_field(**changes: object) -> str:
    return json.dumps(dict(json.loads(PINNED_JSON), **changes))


def without_field(name: str) -> str:
    data = json.loads(PINNED_JSON)
    del data[name]
    return json.dumps(data)


@pytest.mark.parametrize(
    "text, match",
    [
        ("{", "not JSON"),
        (b"\xff", "not JSON"),
        ("[]", "must be an object"),
        (without_field("crc32c"), r"missing \['crc32c'\]"),
        (with_field(topic="t"), r"unknown \['topic'\]"),
        (with_field(format_version=2), "format version 2"),
        (without_field("format_version"), "format version None"),
        (with_field(base_offset="100"), "base_offset must be an integer"),
        (with_field(size_bytes=4096.0), "size_bytes must be an integer"),
        (with_field(record_count=True), "record_count must be an integer"),
        (with_field(leader_epochs=[[3]]), "leader_epochs"),
        (with_field(leader_epochs={"3": 100}), "leader_epochs"),
        (with_field(next_offset=99), "not a range"),
        (with_field(base_offset=-1), "not a range"),
        (with_field(record_count=51), "do not fit"),
        (with_field(size_bytes=0), "bytes for 48 records"),
        (with_field(crc32c=2**32), "not a uint32"),
        (with_field(min_timestamp=2001), "timestamps"),
        (with_field(leader_epochs=[[4, 100], [3, 120]]), "do not grow"),
        (with_field(leader_epochs=[[3, 120], [4, 120]]), "do not grow"),
        (with_field(leader_epochs=[[3, 150]]), "outside the segment"),
        (with_field(leader_epochs=[[-1, 100]]), "outside the segment"),
        (with_field(record_count=0, size_bytes=0), "an empty segment has timestamps"),
    ],
    ids=[
        "not-json", "not-utf8", "not-an-object", "missing-key", "unknown-key", "newer-version", "no-version",
        "string-int", "float-int", "bool-int", "epoch-pair-short", "epochs-not-a-list", "offsets-reversed",
        "negative-base", "too-many-records", "no-bytes", "crc-too-big", "timestamps-reversed",
        "epochs-decrease", "epoch-starts-repeat", "epoch-past-end", "negative-epoch", "empty-with-timestamps",
    ],
)
def test_from_json_rejects_bad_input(text, match):
    """A bad manifest entry raises CorruptSegmentMetadataError naming what is wrong."""
    with pytest.raises(CorruptSegmentMetadataError, match=match):
        SegmentMetadata.from_json(text)
