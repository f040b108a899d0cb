"""SegmentWriter writes the segment the broker's Segment writes: same `.log`, `.index` and
`.timeindex` bytes for the same batches and index.interval.bytes, readable by SegmentReader and by
tiered storage, into local files or fsspec files."""
from __future__ import annotations

import io
import random

import fsspec
import pytest

from common.errors import CorruptMessageError, LogInvariantError
from broker.log.file_cache import FileCache
from broker.log.segment import BatchInfo, Segment
from segment_format import batch_body, record
from segment_format.layout import SegmentFiles
from segment_format.segment_metadata import SegmentMetadata
from segment_format.segment_reader import SegmentReader
from segment_format.segment_writer import SegmentWriter
from tiered_storage import RemoteSegmentStore

BASE = 1_000
TOPIC_ID = "0123456789abcdef0123456789abcdef"


def batches(count: int, seed: int = 7) -> list[bytearray]:
    """Batches of varying size and timestamps (not monotonic, so the time index skips some),
    offset-assigned from BASE with a gap now and then (as after compaction), epochs rising."""
    rng = random.Random(seed)
    out, offset = [], BASE
    for i in range(count):
        n = rng.randint(1, 40)
        timestamps = [10_000 + rng.randint(-500, 500) + 50 * i for _ in range(n)]
        data = record.encode_batch(batch_body.make_body([b"v" * rng.randint(1, 300) for _ in range(n)],
                                                        timestamps_ms=timestamps))
        record.patch_offsets(data, 0, offset, i // 10)
        out.append(data)
        offset += n + (5 if i % 7 == 3 else 0)
    return out


def broker_segment(directory, data: list[bytearray], interval: int) -> SegmentFiles:
    """The segment the broker writes for `data`: appended a few batches at a time, then sealed."""
    cache = FileCache()
    directory.mkdir()
    segment = Segment.create(directory, BASE, cache)
    for start in range(0, len(data), 3):
        chunk = data[start:start + 3]
        infos = [BatchInfo(h.base_offset, h.next_offset, h.size, h.max_timestamp)
                 for h in (record.read_header(b) for b in chunk)]
        segment.append(memoryview(b"".join(chunk)), infos, interval, 0)
    segment.seal()
    segment.close()
    cache.close()
    return segment.files


def write_with_writer(directory, data: list[bytearray], interval: int, per_append: int = 2) -> tuple[SegmentFiles, SegmentMetadata]:
    files = SegmentFiles(directory, BASE)
    directory.mkdir(exist_ok=True)
    with open(files.log, "wb") as log, open(files.index, "wb") as index, open(files.time_index, "wb") as time_index:
        writer = SegmentWriter(log, index, time_index, BASE, index_interval_bytes=interval)
        for start in range(0, len(data), per_append):
            writer.append(b"".join(data[start:start + per_append]))
        metadata = writer.close()
    return files, metadata


@pytest.mark.parametrize("interval", [0, 1_000, 4_096, 10**9], ids=["every-batch", "1000", "default", "none"])
def test_writer_writes_the_bytes_the_broker_writes(tmp_path, interval):
    """Same batches, same interval: the three files are byte-identical to the broker's, and the
    metadata is what a reader computes from the `.log`."""
    data = batches(60)
    ours = broker_segment(tmp_path / "broker", data, interval)
    theirs, metadata = write_with_writer(tmp_path / "writer", data, interval)
    for a, b in [(ours.log, theirs.log), (ours.index, theirs.index), (ours.time_index, theirs.time_index)]:
        assert a.read_bytes() == b.read_bytes(), b.name
    if interval == 0:
        assert len(theirs.index.read_bytes()) > 16 + 8 * 30  # the comparison covered real entries
    with open(theirs.log, "rb") as file:
        assert metadata == SegmentMetadata.from_reader(SegmentReader(file, BASE))
    assert metadata.leader_epochs == ((0, BASE), (1, record.read_header(data[10]).base_offset),
                                      (2, record.read_header(data[20]).base_offset),
                                      (3, record.read_header(data[30]).base_offset),
                                      (4, record.read_header(data[40]).base_offset),
                                      (5, record.read_header(data[50]).base_offset))


def test_written_segment_reads_back_through_its_indexes(tmp_path):
    """SegmentReader over the written files finds every batch and answers time lookups."""
    data = batches(40)
    files, metadata = write_with_writer(tmp_path, data, 1_000)
    with open(files.log, "rb") as log:
        reader = SegmentReader(log, BASE, offset_index=files.index.read_bytes(),
                               time_index=files.time_index.read_bytes())
        assert len(reader.offset_index) > 5
        assert [bytes(b.data) for b in reader.stored_batches()] == [bytes(b) for b in data]
        for data_batch in data[::5]:
            header = record.read_header(data_batch)
            assert reader.find_position(header.last_offset)[1].base_offset == header.base_offset
        assert reader.offset_for_timestamp(metadata.max_timestamp)[1] == metadata.max_timestamp
        assert reader.offset_for_timestamp(metadata.max_timestamp + 1) is None


def test_written_segment_uploads_and_reads_from_the_remote_store(tmp_path):
    """Tiered storage takes the written segment with its metadata (file:// store) and serves its
    batches back, located through the uploaded indexes."""
    data = batches(30)
    files, metadata = write_with_writer(tmp_path / "local", data, 1_000)
    store = RemoteSegmentStore.from_url(f"file://{tmp_path / 'remote'}")
    manifest = store.load_manifest("t", 0, TOPIC_ID)
    segment = store.upload_segment("t", 0, files, metadata)
    manifest = store.commit_manifest(manifest.version, manifest.with_segment(segment))
    [remote] = store.load_manifest("t", 0, TOPIC_ID).segments
    assert remote.base_offset == BASE and remote.next_offset == metadata.next_offset
    middle = record.read_header(data[15])
    got = store.read_batches("t", 0, remote, middle.base_offset, max_bytes=1)
    assert got == bytes(data[15])
    assert store.offset_for_timestamp("t", 0, manifest, metadata.max_timestamp)[1] == metadata.max_timestamp


def test_writer_writes_fsspec_files(tmp_path):
    """An object store's files (fsspec's memory filesystem here) take the segment as local files do."""
    data = batches(20)
    local, _ = write_with_writer(tmp_path, data, 0)
    fs = fsspec.filesystem("memory")
    with fs.open("/seg/a.log", "wb") as log, fs.open("/seg/a.index", "wb") as index, \
            fs.open("/seg/a.timeindex", "wb") as time_index:
        writer = SegmentWriter(log, index, time_index, BASE, index_interval_bytes=0)
        writer.append(b"".join(data))
        writer.close()
    assert fs.cat_file("/seg/a.log") == local.log.read_bytes()
    assert fs.cat_file("/seg/a.index") == local.index.read_bytes()
    assert fs.cat_file("/seg/a.timeindex") == local.time_index.read_bytes()
    fs.rm("/seg", recursive=True)


def _writer() -> tuple[SegmentWriter, io.BytesIO]:
    log = io.BytesIO()
    return SegmentWriter(log, io.BytesIO(), io.BytesIO(), BASE), log


@pytest.mark.parametrize("damage", ["torn", "crc", "offset-back", "below-base", "past-index"])
def test_a_bad_batch_is_a_named_error_and_nothing_of_its_append_is_written(damage):
    data = batches(3)
    writer, log = _writer()
    writer.append(data[0])
    second, third = bytearray(data[1]), bytearray(data[2])
    if damage == "torn":
        third = third[:-1]
    elif damage == "crc":
        third[-1] ^= 0xFF
    elif damage == "offset-back":
        record.patch_offsets(third, 0, record.read_header(data[0]).base_offset, 0)
    elif damage == "below-base":
        writer, log = _writer()
        record.patch_offsets(third, 0, BASE - 1, 0)
    else:
        record.patch_offsets(third, 0, BASE + 2**31, 0)
    size = writer.size
    with pytest.raises(CorruptMessageError, match=r"00000000000000001000\.log: batch at byte \d+"):
        writer.append(second + third if damage != "below-base" else third)
    assert writer.size == size and len(log.getvalue()) == size


def test_append_after_close_is_refused():
    writer, _ = _writer()
    writer.append(batches(1)[0])
    writer.close()
    with pytest.raises(LogInvariantError):
        writer.append(batches(1)[0])
    with pytest.raises(LogInvariantError):
        writer.close()
