"""SegmentReader over segments written by the real log, through a local file, an fsspec memory
filesystem and a pread callable: iteration, lookups, ranges, Arrow bodies, round trips, and what
corrupt or truncated bytes do."""
from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format import batch_body, record
from broker.config import LogConfig
from common.errors import CorruptMessageError, KafkaStorageError
from broker.log import LogManager, TopicLogSpec
from segment_format.index_file import CorruptIndexError, OFFSET_INDEX
from segment_format.segment_reader import FRAME_ONLY, SegmentReader

TOPIC_ID = "0123456789abcdef0123456789abcdef"
BASE_TS = 1_700_000_000_000
APPENDS = 90
CONFIG = LogConfig(segment_bytes=16 << 10, index_interval_bytes=1024, retention_ms=-1)


@dataclass
class Written:
    """A partition directory written by the real log, and what went into it."""

    directory: Path
    records: list[tuple[int, bytes, int]] = field(default_factory=list)  # (offset, value, timestamp)

    @property
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.log"))


def write_partition(root: Path, appends: Iterator[tuple[bytearray, int]], config: LogConfig = CONFIG) -> Path:
    """Append (payload, leader_epoch) pairs as leader to topic-0 of a LogManager in `root`, close
    it cleanly (indexes written, segments sealed) and return the partition directory."""
    manager = LogManager(root, lambda: BASE_TS + 10**6)
    try:
        log = manager.load({"topic": TopicLogSpec(TOPIC_ID, config, 1)})[("topic", 0)]
        for payload, epoch in appends:
            log.append_as_leader(payload, epoch)
    finally:
        manager.close()
    return root / "topic-0"


def batch_timestamps(i: int, n: int) -> list[int]:
    """Timestamps that grow from batch to batch but not within one (the last record is oldest)."""
    ts = [BASE_TS + 100 * i + 10 * j for j in range(n)]
    return ts[1:] + ts[:1]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Written:
    """~90 batches of 1-4 records in several segments, three leader epochs, all three compressions."""
    out = Written(Path())
    offset = 0

    def appends():
        nonlocal offset
        for i in range(APPENDS):
            n = i % 4 + 1
            values = [f"value-{i}-{j}-".encode() * 20 for j in range(n)]
            timestamps = batch_timestamps(i, n)
            body = batch_body.make_body(values, timestamps_ms=timestamps)
            out.records.extend((offset + j, v, t) for j, (v, t) in enumerate(zip(values, timestamps)))
            offset += n
            yield record.encode_batch(body, compression=batch_body.COMPRESSIONS[i % 3]), i // 30

    out.directory = write_partition(tmp_path_factory.mktemp("reader"), appends())
    assert len(out.segments) >= 3
    return out


def base_of(segment: Path) -> int:
    return int(segment.stem)


def stored(segment: Path) -> list[tuple[int, record.BatchHeader]]:
    """The batches of a segment file as the codec parses them (the test's oracle)."""
    return list(record.iter_batches(segment.read_bytes()))


class Sources:
    """Opens readers over a segment's files through one kind of source."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fs = fsspec.filesystem("memory")
        self.root = f"/segments-{uuid.uuid4().hex}"
        self._files: list[object] = []
        self._fds: list[int] = []

    def reader(self, segment: Path, indexes: bool = True, **kwargs: object) -> SegmentReader:
        index = segment.with_suffix(".index").read_bytes() if indexes else None
        time_index = segment.with_suffix(".timeindex").read_bytes() if indexes else None
        if self.kind == "file":
            source = open(segment, "rb")
            self._files.append(source)
        elif self.kind == "fsspec-memory":
            remote = f"{self.root}/{segment.name}"
            for path in (segment, segment.with_suffix(".index"), segment.with_suffix(".timeindex")):
                self.fs.pipe_file(f"{self.root}/{path.name}", path.read_bytes())
            if indexes:  # read the indexes back from the object store, as a remote reader does
                index = self.fs.cat_file(remote.replace(".log", ".index"))
                time_index = self.fs.cat_file(remote.replace(".log", ".timeindex"))
            source = self.fs.open(remote, "rb")
            self._files.append(source)
        else:
            fd = os.open(segment, os.O_RDONLY)
            self._fds.append(fd)
            kwargs.setdefault("size", os.fstat(fd).st_size)
            source = lambda size, position: os.pread(fd, size, position)  # noqa: E731
        return SegmentReader(source, base_of(segment), offset_index=index, time_index=time_index, **kwargs)

    def close(self) -> None:
        for file in self._files:
            file.close()
        for fd in self._fds:
            os.close(fd)
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)


@pytest.fixture(params=["file", "fsspec-memory", "pread"])
def sources(request) -> Iterator[Sources]:
    opened = Sources(request.param)
    yield opened
    opened.close()


# --- iteration -----------------------------------------------------------------------------------


def test_batches_are_those_the_log_appended(written, sources):
    """Every segment yields its batches in order, validated, and together they hold every offset once."""
    next_offset = 0
    for segment in written.segments:
        reader = sources.reader(segment)
        batches = list(reader.batches())
        assert batches == stored(segment)
        for _, header in batches:
            assert header.base_offset == next_offset
            next_offset = header.next_offset
    assert next_offset == len(written.records)


def test_stored_batches_carry_each_batch_bytes(written, sources):
    """The bytes of a stored batch are exactly its slice of the `.log`."""
    segment = written.segments[1]
    data = segment.read_bytes()
    for batch in sources.reader(segment).stored_batches():
        assert bytes(batch.data) == data[batch.position : batch.position + batch.header.size]


def test_frame_only_scan_skips_bodies(written, sources):
    """With FRAME_ONLY the headers still come back, and no body bytes are handed out."""
    segment = written.segments[0]
    batches = list(sources.reader(segment).stored_batches(verify_from_offset=FRAME_ONLY))
    assert [(b.position, b.header) for b in batches] == stored(segment)
    assert list(sources.reader(segment).batches(verify_from_offset=FRAME_ONLY)) == stored(segment)


# --- lookups -------------------------------------------------------------------------------------


@pytest.mark.parametrize("indexes", [True, False], ids=["with-index", "scan"])
def test_find_position_returns_the_batch_holding_each_offset(written, sources, indexes):
    """find_position(o) is the batch whose offsets include o; None past the segment's end."""
    segment = written.segments[1]
    reader = sources.reader(segment, indexes=indexes)
    batches = stored(segment)
    for position, header in batches:
        for offset in range(header.base_offset, header.next_offset):
            assert reader.find_position(offset) == (position, header)
    assert reader.find_position(base_of(segment) - 1) == batches[0]
    assert reader.find_position(batches[-1][1].next_offset) is None


def test_find_position_through_the_index_costs_one_read(written):
    """With the offset index, a lookup is one ranged read starting at the index entry."""
    segment = written.segments[0]
    counting = CountingFile(segment.read_bytes())
    reader = SegmentReader(counting, 0, offset_index=segment.with_suffix(".index").read_bytes())
    assert len(reader.offset_index) >= 3
    last = stored(segment)[-1]
    counting.reads.clear()
    assert reader.find_position(last[1].last_offset) == last
    assert len(counting.reads) == 1 and counting.reads[0][1] == reader.offset_index.last_entry[1]


def test_offset_for_timestamp_matches_a_search_of_every_record(written, sources):
    """The first record (in offset order) whose timestamp reaches the target, for targets before,
    inside (straddling a batch), between and after the records of a segment."""
    segment = written.segments[1]
    reader = sources.reader(segment)
    headers = [h for _, h in stored(segment)]
    records = [r for r in written.records if headers[0].base_offset <= r[0] < headers[-1].next_offset]
    targets = sorted({t for _, _, t in records} | {t + 1 for _, _, t in records} | {0, records[0][2] - 1})
    for target in targets:
        expected = next(((o, t) for o, _, t in records if t >= target), None)
        assert reader.offset_for_timestamp(target) == expected, target


def test_offset_for_timestamp_without_a_time_index_scans_from_the_start(written, sources):
    segment = written.segments[0]
    reader = sources.reader(segment, indexes=False)
    target = written.records[7][2] + 1
    assert reader.offset_for_timestamp(target) == next((o, t) for o, _, t in written.records if t >= target)


# --- ranges --------------------------------------------------------------------------------------


def test_read_range_returns_the_bytes_of_the_batches_covering_it(written, sources):
    """From the batch holding start_offset to the one holding end_offset - 1, byte for byte."""
    segment = written.segments[1]
    data, batches = segment.read_bytes(), stored(segment)
    reader = sources.reader(segment)
    first, last = batches[2], batches[5]
    start, end = first[1].base_offset + first[1].last_offset_delta, last[1].base_offset + 1
    assert reader.read_range(start, end) == data[first[0] : last[0] + last[1].size]
    assert reader.read_range(first[1].base_offset) == data[first[0] :]
    assert reader.read_range(batches[-1][1].next_offset) == b""


def test_read_range_stops_at_max_bytes_but_returns_the_first_batch_whole(written, sources):
    segment = written.segments[1]
    data, batches = segment.read_bytes(), stored(segment)
    reader = sources.reader(segment)
    (p0, h0), (p1, h1) = batches[0], batches[1]
    assert reader.read_range(h0.base_offset, max_bytes=1) == data[p0 : p0 + h0.size]
    assert reader.read_range(h0.base_offset, max_bytes=h0.size + h1.size) == data[p0 : p1 + h1.size]


def test_read_arrow_decodes_the_records_appended(written, sources):
    """Bodies decode (any compression) to the values and timestamps the producer wrote."""
    got = []
    for segment in written.segments:
        for header, body in sources.reader(segment).read_arrow(base_of(segment)):
            assert body.num_rows == header.record_count
            got.extend(zip(range(header.base_offset, header.next_offset), body.column("value").to_pylist(),
                           body.column("timestamp").cast(pa.int64()).to_pylist()))
    assert got == written.records


def test_read_arrow_of_uncompressed_bodies_allocates_nothing(written):
    """Uncompressed bodies are views of the read buffer: Arrow's pool gives out no memory."""
    segment = written.segments[0]
    reader = SegmentReader(io.BytesIO(segment.read_bytes()), 0)
    uncompressed = [h for i, (_, h) in enumerate(stored(segment)) if batch_body.COMPRESSIONS[i % 3] == "none"]
    before = pa.total_allocated_bytes()
    bodies = [body for h in uncompressed for _, body in reader.read_arrow(h.base_offset, h.next_offset)]
    assert len(bodies) == len(uncompressed) > 1
    assert pa.total_allocated_bytes() == before


def test_read_arrow_is_bounded_by_end_offset(written, sources):
    segment = written.segments[0]
    batches = stored(segment)
    headers = [h for h, _ in sources.reader(segment).read_arrow(batches[1][1].base_offset, batches[3][1].base_offset)]
    assert headers == [batches[1][1], batches[2][1]]


def test_log_append_time_batches_carry_the_append_time_in_their_header(tmp_path):
    """A LogAppendTime topic: the body keeps the create times, the header holds the append time,
    and a timestamp search uses the header's."""
    config = LogConfig(message_timestamp_type="LogAppendTime", retention_ms=-1)
    body = batch_body.make_body([b"a", b"b"], timestamps_ms=[5, 6])
    directory = write_partition(tmp_path, iter([(record.encode_batch(body), 0)]), config)
    with open(directory / f"{0:020d}.log", "rb") as file:
        reader = SegmentReader(file, 0)
        [(header, decoded)] = list(reader.read_arrow(0))
        assert header.log_append_time and header.max_timestamp == BASE_TS + 10**6
        assert decoded.column("timestamp").cast(pa.int64()).to_pylist() == [5, 6]
        assert reader.offset_for_timestamp(7) == (0, BASE_TS + 10**6)


def test_compacted_batches_are_read_with_their_offset_gaps():
    """A body rewritten by compaction names its offsets: lookups land on the batch spanning a gap,
    and a timestamp search answers the offset of the matching record, not its row."""
    plain = record.encode_batch(batch_body.make_body([b"a", b"b"], timestamps_ms=[5, 6]), base_offset=0)
    compacted = record.encode_batch(batch_body.make_body([b"c", b"d", b"e"], timestamps_ms=[10, 50, 60], offset_deltas=[0, 3, 7]),
                                    base_offset=2)
    reader = SegmentReader(io.BytesIO(bytes(plain + compacted)), 0)
    assert reader.find_position(4) == (len(plain), record.read_header(compacted))
    assert reader.offset_for_timestamp(40) == (5, 50)
    assert reader.offset_for_timestamp(55) == (9, 60)
    [(header, body)] = list(reader.read_arrow(3))
    assert record.record_offsets(header, body).to_pylist() == [2, 5, 9]
    assert reader.find_position(10) is None


# --- round trips ---------------------------------------------------------------------------------


class CountingFile(io.BytesIO):
    """A file object that records each read as (size, position): a stand-in for ranged GETs."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[tuple[int, int]] = []

    def read(self, size: int | None = -1) -> bytes:
        self.reads.append((size, self.tell()))
        return super().read(size)


def test_a_full_scan_reads_large_doubling_ranges(written):
    """A validated scan of a segment reads min_read_bytes first, then doubling ranges up to
    max_read_bytes: a handful of round trips, never one per batch."""
    segment = written.segments[0]
    data = segment.read_bytes()
    counting = CountingFile(data)
    reader = SegmentReader(counting, 0, min_read_bytes=1024, max_read_bytes=4096)
    counting.reads.clear()
    assert len(list(reader.batches())) == len(stored(segment))
    sizes, position, wanted = [], 0, 1024
    while position < len(data):  # the read sizes the window should choose
        sizes.append(min(wanted, len(data) - position))
        position, wanted = position + sizes[-1], min(2 * wanted, 4096)
    assert counting.reads == [(size, sum(sizes[:i])) for i, size in enumerate(sizes)]  # nothing read twice
    assert len(sizes) < len(stored(segment))


# --- errors --------------------------------------------------------------------------------------


def segment_bytes(written: Written) -> tuple[bytes, list[tuple[int, record.BatchHeader]]]:
    segment = written.segments[0]
    return segment.read_bytes(), stored(segment)


UNCOVERED_BY_CRC = (*range(0, 8), *range(12, 16))  # base_offset, partition_leader_epoch


@settings(max_examples=150)
@given(data=st.data())
def test_a_corrupted_byte_raises_and_nothing_invalid_is_yielded(written, data):
    """Flip any byte: iteration raises CorruptMessageError at the damaged batch (or, for the
    offset and epoch fields the CRC leaves out, yields a batch that still validates), and every
    batch yielded before is exactly as written."""
    original, batches = segment_bytes(written)
    at = data.draw(st.integers(0, len(original) - 1), label="byte")
    flip = data.draw(st.integers(1, 255), label="xor")
    corrupt = original[:at] + bytes([original[at] ^ flip]) + original[at + 1 :]
    damaged = max(i for i, (position, _) in enumerate(batches) if position <= at)
    position, header = batches[damaged]
    yielded = []
    try:
        for batch in SegmentReader(io.BytesIO(corrupt), 0).stored_batches():
            record.validate_batch(batch.data)  # nothing invalid, ever
            yielded.append(batch)
    except CorruptMessageError as err:
        # A changed base offset passes its own batch's checks when it still grows; the next batch
        # then does not follow it.
        assert len(yielded) in ((damaged, damaged + 1) if at - position < 8 else (damaged,))
        assert str(err).startswith(f"{0:020d}.log: batch at byte {batches[len(yielded)][0]}: ")
    else:
        assert at - position in UNCOVERED_BY_CRC
        assert len(yielded) == len(batches)
    assert [(b.position, b.header) for b in yielded[:damaged]] == batches[:damaged]


@settings(max_examples=100)
@given(data=st.data())
def test_a_truncated_segment_yields_its_whole_batches_then_raises(written, data):
    """Cut the `.log` anywhere: the whole batches before the cut come out, then CorruptMessageError
    names the torn batch's position (a cut at a batch boundary is just a shorter segment)."""
    original, batches = segment_bytes(written)
    length = data.draw(st.integers(0, len(original) - 1), label="length")
    whole = [b for b in batches if b[0] + b[1].size <= length]
    reader = SegmentReader(io.BytesIO(original[:length]), 0)
    yielded = []
    if length in {p for p, _ in batches}:
        yielded = list(reader.batches())
    else:
        torn = batches[len(whole)][0]
        with pytest.raises(CorruptMessageError, match=f"batch at byte {torn}:"):
            for batch in reader.batches():
                yielded.append(batch)
    assert yielded == whole


@settings(max_examples=100)
@given(garbage=st.binary(max_size=300), frame_only=st.booleans())
def test_garbage_raises_only_corrupt_message(garbage, frame_only):
    """Arbitrary bytes never surface as struct.error or IndexError, whatever the scan mode."""
    reader = SegmentReader(io.BytesIO(garbage), 0)
    verify = FRAME_ONLY if frame_only else 0
    try:
        for _ in reader.stored_batches(verify_from_offset=verify):
            pass
    except CorruptMessageError:
        pass


def test_a_short_read_is_corrupt_message_naming_the_segment(written):
    """A source shorter than the size it was opened with (the object shrank) is corrupt data."""
    data, _ = segment_bytes(written)
    reader = SegmentReader(lambda size, position: data[position : position + size], 0, size=len(data) + 100)
    with pytest.raises(CorruptMessageError, match=f"{0:020d}.log"):
        list(reader.batches())


def test_a_failing_source_raises_storage_error(written):
    def broken(size: int, position: int) -> bytes:
        raise OSError("connection reset")

    with pytest.raises(KafkaStorageError, match="connection reset"):
        list(SegmentReader(broken, 0, size=4096).batches())


def test_a_pread_source_needs_a_size():
    with pytest.raises(ValueError, match="size"):
        SegmentReader(lambda size, position: b"", 0)


def test_an_index_without_header_is_rejected(written):
    """Index bytes go through the broker's parser: a headerless file raises CorruptIndexError."""
    segment = written.segments[0]
    index = segment.with_suffix(".index").read_bytes()
    with pytest.raises(CorruptIndexError, match="magic"):
        SegmentReader(io.BytesIO(segment.read_bytes()), 0, offset_index=index[16:])


def test_an_index_entry_at_the_wrong_batch_is_rejected(written):
    """An entry whose position holds a batch with another base offset is caught at lookup."""
    segment = written.segments[0]
    (_, first), (position, second) = stored(segment)[:2]
    index = OFFSET_INDEX.header(0) + OFFSET_INDEX.entry.pack(second.base_offset + 1, position)
    reader = SegmentReader(io.BytesIO(segment.read_bytes()), 0, offset_index=index)
    with pytest.raises(CorruptIndexError, match="points at a batch"):
        reader.find_position(second.base_offset + 1)


def test_an_index_entry_past_the_segment_is_rejected(written):
    segment = written.segments[0]
    index = OFFSET_INDEX.header(0) + OFFSET_INDEX.entry.pack(5, segment.stat().st_size)
    with pytest.raises(CorruptIndexError, match="outside the segment"):
        SegmentReader(io.BytesIO(segment.read_bytes()), 0, offset_index=index)
