"""Log compaction core: latest record per key wins, null keys and offsets are kept, tombstones
expire, untouched batches pass through, the offset map's bound, idempotence, a reference-model
property, and a round trip through segments written by the real log and read by SegmentReader."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format import batch_body, record
from client.decoder import FetchedBatch
from broker.config import LogConfig
from common.errors import CorruptMessageError
from broker.log import LogManager, TopicLogSpec
from segment_format.compaction import CompactionStats, OffsetMap, _codec, build_offset_map, compact_batches
from segment_format.segment_reader import SegmentReader

TOPIC_ID = "0123456789abcdef0123456789abcdef"
NOW_MS = 1_700_000_000_000
RETENTION_MS = 86_400_000
OLD_MS = NOW_MS - RETENTION_MS - 1  # a tombstone this old has expired
RECENT_MS = NOW_MS - 1000

Record = tuple[bytes | None, bytes | None]  # (key, value)


def encode(base_offset: int, records: list[Record], timestamp_ms: int | list[int] = RECENT_MS,
           compression: str = "none", **header_fields: int) -> bytes:
    """One batch of (key, value) records at `base_offset`."""
    body = batch_body.make_body([v for _, v in records], keys=[k for k, _ in records], timestamps_ms=timestamp_ms)
    return bytes(record.encode_batch(body, base_offset=base_offset, compression=compression, **header_fields))


def batches_of(sizes_and_records: list[list[Record]], **kwargs: object) -> list[bytes]:
    """Consecutive batches, each starting where the previous one ended."""
    out, offset = [], 0
    for records in sizes_and_records:
        out.append(encode(offset, records, **kwargs))
        offset += len(records)
    return out


def compact(batches: list[bytes], now_ms: int = NOW_MS, max_keys: int = 1 << 20, **kwargs: object) -> list[bytes]:
    offset_map = build_offset_map(batches, max_keys)
    return [bytes(b) for b in compact_batches(batches, offset_map, now_ms, RETENTION_MS, **kwargs)]


def survivors(batches: list[bytes]) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, each batch validated and decoded."""
    out = []
    for data in batches:
        header, body = record.decode_batch(data)
        assert header.size == len(data)
        offsets = record.record_offsets(header, body).to_pylist()
        out.extend(zip(offsets, body.column("key").to_pylist(), body.column("value").to_pylist()))
    return out


def reference(records: list[Record], now_ms: int = NOW_MS, timestamps: list[int] | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """The straightforward model: keep null keys and each key's last record, minus expired tombstones."""
    latest = {key: offset for offset, (key, _) in enumerate(records) if key is not None}
    timestamps = timestamps or [RECENT_MS] * len(records)
    return [
        (offset, key, value) for offset, (key, value) in enumerate(records)
        if key is None or (latest[key] == offset and not (value is None and timestamps[offset] < now_ms - RETENTION_MS))
    ]


# --- latest value per key ------------------------------------------------------------------------

def test_latest_value_per_key_wins_across_batches():
    """Ten batches rewriting five keys: each key's last record survives at its original offset."""
    groups = [[(b"k%d" % ((3 * i + j) % 5), b"v%d-%d" % (i, j)) for j in range(4)] for i in range(10)]
    records = [r for group in groups for r in group]
    batches = batches_of(groups)
    out = compact(batches)
    assert survivors(out) == reference(records)
    assert {key for _, key, _ in survivors(out)} == {b"k%d" % i for i in range(5)}
    for data in out:
        record.validate_batch(data)


def test_null_key_records_are_kept_in_place():
    """Records without a key are not compactable: all survive, interleaved with keyed survivors."""
    groups = [[(None, b"n0"), (b"a", b"a0"), (None, b"n1")], [(b"a", b"a1"), (None, b"n2")]]
    out = compact(batches_of(groups))
    assert survivors(out) == [(0, None, b"n0"), (2, None, b"n1"), (3, b"a", b"a1"), (4, None, b"n2")]


def test_rewritten_batch_keeps_header_fields_and_codec():
    """A batch that lost records keeps base offset, epoch, attributes, producer fields and zstd."""
    records = [(b"k%d" % (i % 3), b"value-%d-" % i * 50) for i in range(12)]
    data = bytearray(encode(100, records, timestamp_ms=list(range(1000, 1012)), compression="zstd",
                            attributes=record.TRANSACTIONAL_BIT, producer_id=7, producer_epoch=2, base_sequence=40))
    record.patch_offsets(data, 0, 100, leader_epoch=5)
    [out] = compact([bytes(data)])
    header, body = record.decode_batch(out)
    assert body.schema.equals(batch_body.COMPACTED_BODY_SCHEMA)
    assert (header.base_offset, header.partition_leader_epoch, header.attributes) == (100, 5, record.TRANSACTIONAL_BIT)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert (header.record_count, header.last_offset_delta) == (3, 11)
    assert record.record_offsets(header, body).to_pylist() == [109, 110, 111]
    assert (header.base_timestamp, header.max_timestamp) == (1009, 1011)  # recomputed from the survivors
    assert _codec(out, body) == "zstd"


def test_log_append_time_ages_tombstones_by_the_header():
    """LogAppendTime: the header's append time, not the body's create time, ages a tombstone."""
    data = bytearray(encode(0, [(b"a", b"1"), (b"a", None), (b"b", None)], timestamp_ms=RECENT_MS))
    record.stamp_log_append_time(data, 0, record.read_header(data), 0, 0, OLD_MS)  # appended long ago
    assert compact([bytes(data)]) == []  # both tombstones expired by append time; "1" superseded
    record.stamp_log_append_time(data, 0, record.read_header(data), 0, 0, RECENT_MS)
    assert survivors(compact([bytes(data)])) == [(1, b"a", None), (2, b"b", None)]


def test_log_append_time_rewrite_keeps_header_timestamps():
    """A LogAppendTime batch that loses some records keeps base and max timestamp = append time."""
    data = bytearray(encode(0, [(b"a", b"1"), (b"a", b"2"), (None, b"n")], timestamp_ms=[5, 6, 7]))
    record.stamp_log_append_time(data, 0, record.read_header(data), 0, 0, RECENT_MS)
    [out] = compact([bytes(data)])
    header, _ = record.decode_batch(out)
    assert header.log_append_time and (header.base_timestamp, header.max_timestamp) == (RECENT_MS, RECENT_MS)
    assert survivors([out]) == [(1, b"a", b"2"), (2, None, b"n")]


# --- consumers ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("position", "expected"),
    [(0, [12, 13, 14, 16, 18, 19]), (12, [12, 13, 14, 16, 18, 19]), (15, [16, 18, 19]), (16, [16, 18, 19]),
     (17, [18, 19]), (19, [19]), (20, [])],
    ids=["before-base", "first-survivor", "in-gap", "at-survivor", "gap-before-last", "last", "past-end"],
)
def test_consumer_reads_exactly_the_survivors_from_any_position(position, expected):
    """FetchedBatch.of on a compacted batch yields the survivors at or after the fetch position."""
    keys = [b"x", b"x", b"x", b"a", b"b", b"y", b"c", b"y", b"y", b"d"]  # offsets 10..19
    values = [b"v%d" % (10 + i) for i in range(10)]
    first = encode(0, [(b"a", b"old"), (b"b", b"old")] + [(None, b"pad")] * 8)
    data = encode(10, list(zip(keys, values)))
    out = compact([first, data])
    assert survivors(out)[:8] == [(i, None, b"pad") for i in range(2, 10)]
    header, body = record.decode_batch(out[-1])
    fetched = FetchedBatch.of(header, body, position)
    assert fetched.offsets.to_pylist() == expected
    assert fetched.body.column("value").to_pylist() == [b"v%d" % o for o in expected]
    if expected:
        assert fetched.first_offset == expected[0] and fetched.next_offset == 20


# --- tombstones --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("tombstone_ms", "kept"),
    [(RECENT_MS, True), (NOW_MS - RETENTION_MS, True), (OLD_MS, False)],
    ids=["recent", "exactly-at-horizon", "expired"],
)
def test_latest_tombstone_is_kept_until_delete_retention_passes(tombstone_ms, kept):
    """A tombstone that is the key's latest record survives while younger than delete retention."""
    batches = [encode(0, [(b"a", b"1"), (b"b", b"2")]), encode(2, [(b"a", None)], timestamp_ms=tombstone_ms)]
    stats = CompactionStats()
    out = [bytes(b) for b in compact_batches(batches, build_offset_map(batches, 10), NOW_MS, RETENTION_MS, stats=stats)]
    assert survivors(out) == [(1, b"b", b"2")] + ([(2, b"a", None)] if kept else [])
    assert stats.tombstones_removed == (0 if kept else 1)
    assert stats.records_removed == (1 if kept else 2)


def test_superseded_tombstone_is_dropped_however_recent():
    """A tombstone followed by a new value for its key is removed like any superseded record."""
    batches = [encode(0, [(b"a", b"1"), (b"a", None)]), encode(2, [(b"a", b"3")], timestamp_ms=NOW_MS)]
    out = compact(batches)
    assert survivors(out) == [(2, b"a", b"3")]


def test_tombstone_timestamps_are_per_record():
    """Within one batch only the tombstones older than the horizon expire."""
    records = [(b"a", None), (b"b", None), (b"c", b"live")]
    out = compact([encode(0, records, timestamp_ms=[OLD_MS, RECENT_MS, OLD_MS])])
    assert survivors(out) == [(1, b"b", None), (2, b"c", b"live")]


# --- pass-through and removal --------------------------------------------------------------------

def test_unchanged_batches_pass_through_byte_identical_and_superseded_ones_vanish():
    """Only the batch that lost some records is rewritten; untouched ones are the same buffers."""
    batches = [
        encode(0, [(b"a", b"1"), (b"b", b"1")]),  # both superseded: removed
        encode(2, [(None, b"n"), (b"c", b"1")]),  # untouched
        encode(4, [(b"a", b"2"), (b"d", b"1"), (b"d", b"2")]),  # loses d=1
        encode(7, [(b"b", b"2")], compression="lz4"),  # untouched
    ]
    stats = CompactionStats()
    out = list(compact_batches(batches, build_offset_map(batches, 10), NOW_MS, RETENTION_MS, stats=stats))
    assert len(out) == 3
    assert out[0] is batches[1] and out[2] is batches[3]
    assert survivors([out[1]]) == [(4, b"a", b"2"), (6, b"d", b"2")]
    assert stats == CompactionStats(
        batches_in=4, batches_out=3, batches_rewritten=1, batches_removed=1, records_in=8, records_kept=5,
        records_removed=3, tombstones_removed=0, bytes_in=sum(map(len, batches)), bytes_out=sum(map(len, out)))


def test_stored_batches_pass_through_as_their_buffers(tmp_path: Path):
    """A StoredBatch that loses nothing comes back as its own memoryview, no copy."""
    path = tmp_path / "segment.log"
    path.write_bytes(encode(0, [(b"a", b"1"), (None, b"x")]))
    with open(path, "rb") as file:
        stored = list(SegmentReader(file, 0).stored_batches())
        out = list(compact_batches(stored, build_offset_map(stored, 10), NOW_MS, RETENTION_MS))
        assert out[0] is stored[0].data


def test_control_batches_pass_through_and_stay_out_of_the_map():
    """A control batch is never compacted, and its keys do not supersede records."""
    batches = [encode(0, [(b"a", b"1")]), encode(1, [(b"a", b"marker")], attributes=record.CONTROL_BIT)]
    offset_map = build_offset_map(batches, 10)
    assert offset_map.latest == {b"a": 0}
    assert list(compact_batches(batches, offset_map, NOW_MS, RETENTION_MS)) == batches


# --- the offset map's bound ------------------------------------------------------------------------

def test_max_keys_stops_the_map_and_reports_its_coverage():
    """The map stops before the batch that might overflow it; compaction keeps everything past it."""
    groups = [[(b"k%d" % (i * 2 + j), b"v") for j in range(2)] for i in range(4)]  # 8 distinct keys
    groups.append([(b"k0", b"new"), (b"k7", b"new")])  # offsets 8, 9: supersede k0 and k7
    batches = batches_of(groups)
    offset_map = build_offset_map(batches, max_keys=5)
    assert offset_map.full and offset_map.end_offset == 4 and len(offset_map.latest) == 4
    assert offset_map.start_offset == 0 and offset_map.latest[b"k3"] == 3
    out = list(compact_batches(batches, offset_map, NOW_MS, RETENTION_MS))
    assert out == batches  # nothing below offset 4 is superseded by offsets below 4
    # With room for every key, k0 at 0 and k7 at 7 go.
    assert [o for o, _, _ in survivors(compact(batches))] == [1, 2, 3, 4, 5, 6, 8, 9]


def test_up_to_offset_limits_compaction_further():
    """up_to_offset below the map's coverage keeps every record at or beyond it."""
    batches = batches_of([[(b"a", b"1")], [(b"a", b"2")], [(b"a", b"3")]])
    offset_map = build_offset_map(batches, 10)
    assert [o for o, _, _ in survivors(compact(batches, up_to_offset=1))] == [1, 2]
    assert [o for o, _, _ in survivors(list(compact_batches(batches, offset_map, NOW_MS, RETENTION_MS, up_to_offset=99)))] == [2]


def test_a_full_map_counts_distinct_keys_of_a_batch():
    """A batch repeating one key needs one slot, not one per record."""
    batches = batches_of([[(b"a", b"%d" % i) for i in range(100)], [(b"b", b"x")]])
    offset_map = build_offset_map(batches, max_keys=2)
    assert not offset_map.full and offset_map.end_offset == 101 and offset_map.latest == {b"a": 99, b"b": 100}


def test_bad_input_is_refused():
    """Corrupt bytes, trailing bytes, offsets going back, and a non-positive max_keys raise."""
    good = encode(0, [(b"a", b"1")])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError):
        build_offset_map([bytes(corrupt)], 10)
    with pytest.raises(ValueError, match="one batch per item"):
        list(compact_batches([good + good], OffsetMap(10), NOW_MS, RETENTION_MS))
    with pytest.raises(ValueError, match="does not follow"):
        build_offset_map([encode(5, [(b"a", b"1")]), good], 10)
    with pytest.raises(ValueError, match="max_keys"):
        build_offset_map([good], 0)


# --- idempotence and the reference model ------------------------------------------------------------

def test_compacting_compacted_output_again_changes_nothing():
    """A second run with the same map and clock yields the same buffers (all passed through)."""
    groups = [[(b"k%d" % ((i * j) % 4) if j % 3 else None, None if (i + j) % 5 == 0 else b"v") for j in range(5)]
              for i in range(8)]
    batches = batches_of(groups, timestamp_ms=OLD_MS)
    offset_map = build_offset_map(batches, 100)
    once = [bytes(b) for b in compact_batches(batches, offset_map, NOW_MS, RETENTION_MS)]
    assert len(once) < len(batches) or once != batches
    twice = list(compact_batches(once, offset_map, NOW_MS, RETENTION_MS))
    assert [bytes(b) for b in twice] == once
    assert build_offset_map(once, 100).latest.items() <= offset_map.latest.items()


records_strategy = st.lists(
    st.tuples(st.sampled_from([None, b"a", b"b", b"c", b"d"]), st.one_of(st.none(), st.binary(max_size=6))),
    min_size=1, max_size=60,
)


@settings(max_examples=150)
@given(records=records_strategy, data=st.data())
def test_compaction_matches_the_reference_model(records, data):
    """Random keys, values, tombstone ages and batch sizes: survivors equal the model's."""
    timestamps = data.draw(st.lists(st.sampled_from([OLD_MS, RECENT_MS]), min_size=len(records), max_size=len(records)))
    compression = data.draw(st.sampled_from(batch_body.COMPRESSIONS))
    batches, offset = [], 0
    while offset < len(records):
        n = data.draw(st.integers(1, len(records) - offset))
        batches.append(encode(offset, records[offset:offset + n], timestamp_ms=timestamps[offset:offset + n],
                              compression=compression))
        offset += n
    out = compact(batches)
    expected = reference(records, timestamps=timestamps)
    assert survivors(out) == expected
    for data_out in out:
        header = record.validate_batch(data_out)
        assert header.base_offset in {record.read_header(b).base_offset for b in batches}
    assert compact(out) == out  # idempotent (the map of the output agrees on every survivor)


# --- a round trip through real segments ----------------------------------------------------------------

def write_partition(root: Path, payloads: list[bytes]) -> list[Path]:
    """Append the batches as leader through the real log (small segments), close it, return its segments."""
    config = LogConfig(segment_bytes=8 << 10, index_interval_bytes=1024, retention_ms=-1)
    manager = LogManager(root, lambda: NOW_MS)
    try:
        log = manager.load({"topic": TopicLogSpec(TOPIC_ID, config, 1)})[("topic", 0)]
        for payload in payloads:
            log.append_as_leader(bytearray(payload), 0)
    finally:
        manager.close()
    return sorted((root / "topic-0").glob("*.log"))


def test_round_trip_through_segments_written_by_the_log(tmp_path: Path):
    """Segments from the real log, read with SegmentReader, compacted, written out and read back."""
    groups = [[(b"user-%d" % ((7 * i + j) % 20) if j % 4 else None, b"profile-%d-%d-" % (i, j) * 10)
               for j in range(6)] for i in range(60)]
    records = [r for group in groups for r in group]
    segments = write_partition(tmp_path / "data", batches_of(groups, compression="lz4"))
    sealed = segments[:-1]  # the active segment is never compacted
    assert len(sealed) >= 3

    def read(paths: list[Path]) -> list:
        out = []
        for path in paths:
            with open(path, "rb") as file:
                out.extend(SegmentReader(file, int(path.stem)).stored_batches())
        return out

    stored = read(sealed)
    offset_map = build_offset_map(stored, 1000)
    end = offset_map.end_offset
    assert end == int(segments[-1].stem)
    compacted_dir = tmp_path / "compacted"
    compacted_dir.mkdir()
    for path in sealed:  # one output segment per input segment, as a cleaner writes them
        with open(path, "rb") as file:
            out = b"".join(compact_batches(SegmentReader(file, int(path.stem)).stored_batches(), offset_map,
                                           NOW_MS, RETENTION_MS))
        (compacted_dir / path.name).write_bytes(out)
    back = read(sorted(compacted_dir.glob("*.log")))
    got = survivors([bytes(b.data) for b in back])
    # The model over the compacted range: keys whose latest lies below `end` keep only that record.
    latest = {key: offset for offset, (key, _) in enumerate(records[:end]) if key is not None}
    assert got == [(o, k, v) for o, (k, v) in enumerate(records[:end]) if k is None or latest[k] == o]
    # Reading by offset through the reader (gaps included) finds the survivors.
    with open(sorted(compacted_dir.glob("*.log"))[1], "rb") as file:
        reader = SegmentReader(file, int(sorted(compacted_dir.glob("*.log"))[1].stem))
        header, body = next(reader.read_arrow(reader.base_offset))
        assert record.record_offsets(header, body)[0].as_py() >= reader.base_offset
