"""The log's invariants are named errors, not `assert`s, so `python -O` keeps them: each kind is
triggered here and names what broke and where (file, offsets), and one runs under `python -O`."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from segment_format import batch_body, record
from common.errors import CorruptMessageError, InvalidRequestError, LogInvariantError
from broker.replica_manager import _local_offset_for
from segment_format.index_file import CorruptIndexError
from broker.log.log_segments import LogSegments
from broker.log.segment import BatchInfo, Segment
from segment_format.segment_metadata import CorruptSegmentMetadataError, SegmentMetadata
from segment_format.manifest import CorruptManifestError
from segment_format.manifest import PartitionManifest
from tests.broker.log.appends import append

REPO = Path(__file__).resolve().parents[3]


def batch(records: int = 3) -> bytearray:
    return record.encode_batch(batch_body.make_body([b"v"] * records, timestamps_ms=1_000))


@pytest.fixture
def segment(tmp_path, cache):
    """A segment at base offset 100 holding offsets 100..102."""
    made = Segment.create(tmp_path, 100, cache)
    data = batch()
    record.patch_offsets(data, 0, 100, 0)
    made.append(memoryview(data), [BatchInfo(100, 103, len(data), 1_000)], 0, 0)
    yield made
    made.close()


def info(base: int, next_offset: int, extra_bytes: int) -> list[BatchInfo]:
    """One batch's BatchInfo, claiming `extra_bytes` more than the appended data holds."""
    return [BatchInfo(base, next_offset, extra_bytes, 1_000)]


@pytest.mark.parametrize("batches, words", [
    (info(102, 105, 0), "append at offset 102 does not follow the next offset 103"),
    ([], "append at offset None does not follow"),
    (info(103, 106, 1), "appended as"),
    (info(103, 100 + 2**31 + 1, 0), "overflows the index's relative offsets"),
], ids=["offset-goes-back", "no-batches", "sizes-disagree", "relative-offset-overflow"])
def test_segment_append_that_breaks_the_offset_order_is_log_invariant_error(segment, batches, words):
    """An append that does not follow the segment's next offset, whose batch sizes do not add up
    to its bytes, or that overflows the index is refused before a byte is written."""
    data = batch()
    batches = [b._replace(size=len(data) + b.size) for b in batches]  # info's size: bytes beyond the data's
    before = segment.log_path.stat().st_size
    with pytest.raises(LogInvariantError, match=words) as raised:
        segment.append(memoryview(data), batches, 0, 0)
    assert f"{segment.log_path.name} (offsets 100..103)" in str(raised.value)
    assert segment.log_path.stat().st_size == before == segment.size


def test_segment_list_refuses_a_segment_that_does_not_follow(tmp_path, cache, segment):
    """LogSegments.add, remove_first and replace keep the segments in offset order."""
    segments = LogSegments()
    segments.add(segment)
    behind = Segment.create(tmp_path, 101, cache)
    with pytest.raises(LogInvariantError, match=rf"{behind.log_path.name}: segment at offset 101 does not follow"):
        segments.add(behind)
    with pytest.raises(LogInvariantError, match="cannot remove the 1 oldest of 1 segments"):
        segments.remove_first(1)
    with pytest.raises(LogInvariantError, match="are not a sealed run of the log"):
        segments.replace([segment], behind)
    behind.close()


def test_local_log_refuses_a_roll_below_its_end_and_retention_of_the_active_segment(open_log):
    """A roll must start at or past the log end offset; retention removes at least one segment
    and never the active one."""
    partition_log = open_log()
    append(partition_log, batch())
    local = partition_log._local
    with pytest.raises(LogInvariantError, match="cannot roll a segment at offset 1, below the log end offset 3"):
        local.roll(1)
    with pytest.raises(LogInvariantError, match="retention cannot remove 1 of 1 segments"):
        local.remove_oldest(1, lambda: None)
    assert partition_log.log_end_offset == 3


def test_index_truncation_past_its_entries_is_corrupt_index_error(segment):
    with pytest.raises(CorruptIndexError, match=r"00000000000000000100\.index: cannot keep 5 of its 0 entries"):
        segment.offset_index.truncate_entries(5)


def test_segment_reader_refuses_a_scan_outside_the_segment(segment):
    """A reader asked for bytes past the segment's size (a bad index position) gets CORRUPT_MESSAGE."""
    with pytest.raises(CorruptMessageError, match=rf"{segment.log_path.name}: batch at byte 0: a scan to byte"):
        list(segment._reader().batches(0, segment.size + 10))


def test_impossible_segment_metadata_and_manifests_are_named_errors():
    """Metadata built from a segment's state or a manifest with overlapping segments is refused
    whoever builds it, not only when parsed from JSON."""
    with pytest.raises(CorruptSegmentMetadataError, match="segment metadata of 10: offsets 10..5 are not a range"):
        SegmentMetadata(10, 5, 1, 1, 10, 1, (), 0)
    with pytest.raises(CorruptManifestError, match="manifest of t-0 version 1: partition 0, version 1, log start -1"):
        PartitionManifest("t", 0, version=1, log_start_offset=-1)


def test_list_offsets_for_an_unknown_negative_timestamp_is_invalid_request(open_log):
    with pytest.raises(InvalidRequestError, match="ListOffsets timestamp -3"):
        _local_offset_for(open_log(), -3)


def test_an_out_of_order_append_is_caught_under_python_O(tmp_path):
    """`python -O` strips asserts: the invariant checks are still there (index and segment)."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from common.errors import LogInvariantError
        from broker.log.file_cache import FileCache
        from segment_format.index_file import CorruptIndexError
        from broker.log.segment import BatchInfo, Segment
        segment = Segment.create(Path({str(tmp_path)!r}), 0, FileCache())
        segment.offset_index.append(10, 100)
        for call, error in [(lambda: segment.offset_index.append(5, 200), CorruptIndexError),
                            (lambda: segment.append(memoryview(b""), [BatchInfo(-1, 0, 0, 0)], 0, 0), LogInvariantError)]:
            try:
                call()
            except error as err:
                print(type(err).__name__, err)
            else:
                print("not caught")
        print("optimize", sys.flags.optimize)
    """)
    done = subprocess.run([sys.executable, "-O", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "optimize 1"
    assert lines[0].startswith("IndexOrderError 00000000000000000000.index: entry (offset 5, position 200)")
    assert lines[1].startswith("LogInvariantError 00000000000000000000.log (offsets 0..0): append at offset -1")
