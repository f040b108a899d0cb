"""PartitionManifest: pinned JSON, strict parsing, and the pure functions tiering, retention, fetch
and Spark's filter pushdown rely on (lookups by offset, pruning, retention, log start)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segment_format.segment_metadata import SegmentMetadata
from segment_format.manifest import CorruptManifestError, PartitionManifest, RemoteSegment

UPLOAD_ID = "0123456789abcdef"


def segment(base: int, next_offset: int, min_ts: int = 1_000, max_ts: int = 2_000, size: int = 100,
            upload_id: str = UPLOAD_ID) -> RemoteSegment:
    metadata = SegmentMetadata(base_offset=base, next_offset=next_offset, min_timestamp=min_ts, max_timestamp=max_ts,
                               size_bytes=size, record_count=next_offset - base, leader_epochs=((1, base),),
                               crc32c=size * 7 % 2**32)
    return RemoteSegment.create(metadata, upload_id, (16 + 8, 11), (16 + 12, 22))


def manifest(*segments: RemoteSegment, log_start_offset: int | None = None, version: int = 3) -> PartitionManifest:
    start = segments[0].base_offset if log_start_offset is None else log_start_offset
    return PartitionManifest("events", 0, "ab" * 16, version, start, segments)


# Three segments: offsets 0..10, 10..20, a gap (compaction) 20..25, then 25..40; timestamps grow.
A, B, C = segment(0, 10, 1_000, 1_900), segment(10, 20, 2_000, 2_900, 200), segment(25, 40, 3_000, 3_900, 300)
M = manifest(A, B, C)


def test_json_is_pinned():
    """The public format, byte for byte: Spark and users parse exactly this."""
    assert json.loads(manifest(A).with_leader_epoch(4).to_json()) == {
        "format_version": 2, "version": 3, "leader_epoch": 4, "topic": "events", "topic_id": "ab" * 16, "partition": 0,
        "log_start_offset": 0,
        "segments": [{
            "format_version": 1, "base_offset": 0, "next_offset": 10, "min_timestamp": 1_000, "max_timestamp": 1_900,
            "size_bytes": 100, "record_count": 10, "leader_epochs": [[1, 0]], "crc32c": 700,
            "upload_id": UPLOAD_ID,
            "objects": {
                "log": {"name": "00000000000000000000-0123456789abcdef.log", "size_bytes": 100, "crc32c": 700},
                "index": {"name": "00000000000000000000-0123456789abcdef.index", "size_bytes": 24, "crc32c": 11},
                "timeindex": {"name": "00000000000000000000-0123456789abcdef.timeindex", "size_bytes": 28, "crc32c": 22},
            }}]}


def test_json_round_trips():
    assert PartitionManifest.from_json(M.to_json()) == M
    assert PartitionManifest.from_json(M.with_leader_epoch(7).to_json()).leader_epoch == 7
    assert PartitionManifest.from_json(manifest(A, B, log_start_offset=5).to_json()).log_start_offset == 5


def test_format_version_1_reads_as_2_without_a_leader_epoch():
    """Manifests written before leader epochs (format 1) stay readable: no epoch is known."""
    data = json.loads(M.to_json())
    data["format_version"] = 1
    del data["leader_epoch"]
    parsed = PartitionManifest.from_json(json.dumps(data))
    assert parsed == M and parsed.leader_epoch == -1 and parsed.format_version == 2


def edited(change) -> bytes:
    data = json.loads(M.to_json())
    change(data)
    return json.dumps(data).encode()


def set_in(path: tuple, value: object):
    def change(data: dict) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return change


BAD = {
    "not-json": b"{",
    "not-an-object": b"[]",
    "future-format": edited(set_in(("format_version",), 3)),
    "bool-format": edited(set_in(("format_version",), True)),
    "v1-with-epoch": edited(set_in(("format_version",), 1)),
    "v2-without-epoch": edited(lambda d: d.pop("leader_epoch")),
    "epoch-below-none": edited(set_in(("leader_epoch",), -2)),
    "epoch-string": edited(set_in(("leader_epoch",), "1")),
    "unknown-key": edited(set_in(("extra",), 1)),
    "missing-key": edited(lambda d: d.pop("log_start_offset")),
    "version-0": edited(set_in(("version",), 0)),
    "version-string": edited(set_in(("version",), "3")),
    "bool-partition": edited(set_in(("partition",), True)),
    "bad-topic": edited(set_in(("topic",), "../etc")),
    "overlap": edited(set_in(("segments", 1, "base_offset"), 5)),
    "unsorted": edited(lambda d: d["segments"].reverse()),
    "start-before-first": edited(set_in(("log_start_offset",), 40)),
    "path-escape": edited(set_in(("segments", 0, "objects", "log", "name"), "../../other/0.log")),
    "log-crc-differs": edited(set_in(("segments", 0, "objects", "log", "crc32c"), 1)),
    "bad-upload-id": edited(set_in(("segments", 0, "upload_id"), "XYZ")),
    "missing-object": edited(lambda d: d["segments"][0]["objects"].pop("timeindex")),
    "segment-metadata": edited(set_in(("segments", 0, "record_count"), 11)),
    "empty-segment": edited(lambda d: d["segments"][0].update(next_offset=0, record_count=0)),
}


@pytest.mark.parametrize("data", BAD.values(), ids=BAD.keys())
def test_strict_parsing_rejects_bad_manifests(data):
    """A manifest that does not validate is CorruptManifestError (readers then skip that version)."""
    with pytest.raises(CorruptManifestError):
        PartitionManifest.from_json(data)


@pytest.mark.parametrize("offset, expected", [(-1, None), (0, A), (9, A), (10, B), (19, B), (20, C), (24, C), (25, C),
                                              (39, C), (40, None)],
                         ids=["below", "first", "end-of-first", "second", "end-of-second", "gap-start", "gap-end",
                              "third", "last", "end"])
def test_segment_for_offset(offset, expected):
    """The segment a fetch reads; offsets in a compaction gap belong to the segment after it."""
    assert M.segment_for_offset(offset) == expected


def test_segment_for_offset_respects_the_log_start():
    assert manifest(A, B, log_start_offset=5).segment_for_offset(4) is None
    assert manifest(A, B, log_start_offset=5).segment_for_offset(5) == A


def test_offsets_and_sizes():
    assert (M.log_start_offset, M.log_end_offset, M.size_bytes) == (0, 40, 600)
    empty = PartitionManifest.empty("events", 0)
    assert (empty.version, empty.log_end_offset, empty.segments) == (0, 0, ())
    assert M.segment_at(10) == B and M.segment_at(11) is None and M.segment_at(50) is None


@pytest.mark.parametrize("bounds, expected", [
    ({}, [A, B, C]),
    ({"start_offset": 10}, [B, C]),
    ({"start_offset": 21, "end_offset": 26}, [C]),
    ({"end_offset": 10}, [A]),
    ({"end_offset": 11}, [A, B]),
    ({"min_timestamp": 1_950, "max_timestamp": 2_950}, [B]),
    ({"min_timestamp": 2_900}, [B, C]),
    ({"max_timestamp": 999}, []),
    ({"start_offset": 0, "end_offset": 30, "min_timestamp": 3_500}, [C]),
], ids=["all", "from-offset", "gap", "to-boundary", "past-boundary", "time-window", "from-time", "before-all",
        "offsets-and-time"])
def test_prune_keeps_every_segment_that_may_match(bounds, expected):
    """Filter pushdown: offset range [start, end) and timestamp range [min, max] (inclusive)."""
    assert list(M.prune(**bounds)) == expected


def test_with_segment_appends_in_offset_order_only():
    grown = manifest(A).with_segment(B)
    assert grown.segments == (A, B) and grown.version == 3  # the commit assigns the next version
    with pytest.raises(ValueError):
        grown.with_segment(segment(15, 30))
    first = PartitionManifest.empty("events", 0).with_segment(B)
    assert first.log_start_offset == 10  # offsets before the first segment are not remote


def test_with_log_start_offset_drops_segments_below_it():
    assert M.with_log_start_offset(5).segments == (A, B, C)
    assert M.with_log_start_offset(10).segments == (B, C)
    in_gap = M.with_log_start_offset(22)
    assert (in_gap.log_start_offset, in_gap.segments) == (25, (C,))  # a gap's offsets do not exist
    past = M.with_log_start_offset(50)
    assert (past.log_start_offset, past.segments, past.log_end_offset) == (50, (), 50)
    assert M.with_log_start_offset(10).with_log_start_offset(3).log_start_offset == 10  # never backwards


@pytest.mark.parametrize("kwargs, expected", [
    ({}, []),
    ({"retention_ms": 1_000}, [A]),  # now 3_000: max timestamps below 2_000 expire
    ({"retention_ms": 0}, [A, B]),
    ({"retention_bytes": 600}, []),
    ({"retention_bytes": 450}, [A, B]),
    ({"retention_bytes": 600, "local_bytes": 1}, [A]),
    ({"retention_ms": 1_000, "retention_bytes": 350}, [A, B]),
], ids=["unlimited", "by-time", "by-time-more", "fits", "by-size", "local-counts", "both"])
def test_expired_segments(kwargs, expected):
    assert list(M.expired_segments(3_000, **kwargs)) == expected


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 50), st.integers(0, 10**13), st.integers(0, 10**6),
                          st.integers(1, 10**9)), max_size=8),
       st.integers(0, 49))
def test_any_manifest_round_trips(specs, start_within):
    """Whatever segments a manifest holds, its JSON parses back to an equal manifest."""
    segments, offset = [], 0
    for i, (gap, length, ts, span, size) in enumerate(specs):
        base = offset + gap
        segments.append(segment(base, base + length, ts, ts + span, size, upload_id=f"{i:016x}"))
        offset = base + length
    start = segments[0].base_offset + min(start_within, segments[0].next_offset - segments[0].base_offset - 1) if segments else 0
    value = PartitionManifest("t.x_y-1", 7, "", 1, start, tuple(segments))
    assert PartitionManifest.from_json(value.to_json()) == value


def run_of(m: PartitionManifest, *indexes: int) -> list[tuple[int, str]]:
    return [(m.segments[i].base_offset, m.segments[i].upload_id) for i in indexes]


def test_with_segments_replaced_swaps_a_run_for_segments_within_its_offsets():
    m = manifest(segment(0, 100), segment(100, 200), segment(200, 300), segment(300, 400))
    swapped = m.with_segments_replaced(run_of(m, 1, 2), [segment(100, 150, upload_id="9"*16), segment(260, 290, upload_id="9"*16)])
    assert [(s.base_offset, s.next_offset) for s in swapped.segments] == [(0, 100), (100, 150), (260, 290), (300, 400)]
    assert swapped.log_start_offset == 0 and swapped.log_end_offset == m.log_end_offset
    # The whole run's records removed: the offsets become a gap.
    assert [s.base_offset for s in m.with_segments_replaced(run_of(m, 1), []).segments] == [0, 200, 300]


def test_with_segments_replaced_moves_the_log_start_up_to_the_first_offset_still_held():
    m = manifest(segment(0, 100), segment(100, 200), segment(200, 300), log_start_offset=50)
    assert m.with_segments_replaced(run_of(m, 0), [segment(70, 100, upload_id="9"*16)]).log_start_offset == 70
    assert m.with_segments_replaced(run_of(m, 0), [segment(0, 100, upload_id="9"*16)]).log_start_offset == 50  # never down
    emptied = m.with_segments_replaced(run_of(m, 0, 1), [])
    assert emptied.log_start_offset == 200 and [s.base_offset for s in emptied.segments] == [200]


@pytest.mark.parametrize("case", ["not a run", "unknown upload", "last segment", "outside", "overlapping"])
def test_with_segments_replaced_refuses_what_does_not_fit(case):
    m = manifest(segment(0, 100), segment(100, 200), segment(200, 300), segment(300, 400))
    replaced, segments = {
        "not a run": (run_of(m, 0, 2), []),
        "unknown upload": ([(100, "f" * 16)], []),
        "last segment": (run_of(m, 2, 3), []),
        "outside": (run_of(m, 1), [segment(150, 250, upload_id="9"*16)]),
        "overlapping": (run_of(m, 1, 2), [segment(100, 180, upload_id="9"*16), segment(170, 190, upload_id="8"*16)]),
    }[case]
    with pytest.raises(ValueError):
        m.with_segments_replaced(replaced, segments)
