"""RemoteSegmentStore conformance suite: every test taking `store` runs against each backend
(`file://` in tmp_path, S3 over HTTP through s3fs to moto's server, `memory://`), with segments
written by the broker's own log. The outage tests that need a server to kill are S3-only."""
from __future__ import annotations

import time

import crc32c
import pyarrow as pa
import pytest

from segment_format import record
from common.errors import CorruptMessageError
from segment_format.layout import SegmentFiles
from segment_format.index_file import CorruptIndexError
from segment_format.segment_metadata import SegmentMetadata
from segment_format.segment_reader import SegmentReader
from tests.tiered_storage.backends import TOPIC, TOPIC_ID, MotoServer, free_port, make_bucket, s3_options
from tiered_storage import (
    ManifestConflictError,
    RemoteObjectNotFoundError,
    RemoteSegmentStore,
    RemoteStorageError,
    RemoteTopicIdMismatchError,
    UploadVerificationError,
)
from segment_format.manifest import CorruptManifestError, PartitionManifest
from segment_format.manifest import manifest_object_name


class Crash(BaseException):
    """A broker killed mid-operation: nothing after the raise runs, no except-Exception cleanup."""


def upload_and_commit(store: RemoteSegmentStore, segments: list[SegmentFiles], partition: int = 0) -> PartitionManifest:
    manifest = store.load_manifest(TOPIC, partition, TOPIC_ID)
    for files in segments:
        segment = store.upload_segment(TOPIC, partition, files)
        manifest = store.commit_manifest(manifest.version, manifest.with_segment(segment))
    return manifest


def object_names(store: RemoteSegmentStore, partition: int = 0) -> list[str]:
    """Names of the segment objects in the partition's folder (manifests excluded)."""
    prefix = store.partition_path(TOPIC, partition) + "/"
    store.fs.invalidate_cache(prefix.rstrip("/"))
    return sorted(path.removeprefix(prefix) for path in store.fs.find(prefix.rstrip("/")) if "/manifests/" not in path)


def flip_byte(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


# --- upload and read back ----------------------------------------------------------------------------

def test_upload_then_ranges_read_back_as_the_local_bytes(store, sealed_segments):
    """Upload and commit three segments: the manifest lists them and byte ranges of each remote
    `.log` equal the local file's."""
    manifest = upload_and_commit(store, sealed_segments[:3])
    assert store.load_manifest(TOPIC, 0, TOPIC_ID) == manifest
    assert [s.base_offset for s in manifest.segments] == [f.base_offset for f in sealed_segments[:3]]
    for files, segment in zip(sealed_segments, manifest.segments):
        local = files.log.read_bytes()
        with open(files.log, "rb") as file:
            assert segment.metadata == SegmentMetadata.from_reader(SegmentReader(file, files.base_offset))
        for position, size in [(0, len(local)), (0, 61), (100, 1000), (len(local) - 7, 7), (5, 0)]:
            assert store.read_range(TOPIC, 0, segment, position, size) == local[position : position + size]
        with pytest.raises(ValueError):
            store.read_range(TOPIC, 0, segment, len(local) - 1, 2)


def test_batches_found_through_the_remote_index_equal_local_reads(store, sealed_segments):
    """find_position and read_batches over the remote offset index give what the local reader gives."""
    files = sealed_segments[1]
    segment = upload_and_commit(store, [files]).segments[0]
    index = store.read_offset_index(TOPIC, 0, segment)
    assert len(index) >= 2  # the lookups below go through real entries
    assert store.read_time_index(TOPIC, 0, segment).last_entry[0] == segment.max_timestamp
    with open(files.log, "rb") as file:
        local = SegmentReader(file, files.base_offset)
        for offset in range(segment.base_offset, segment.next_offset):
            assert store.find_position(TOPIC, 0, segment, offset) == local.find_position(offset)
            assert store.read_batches(TOPIC, 0, segment, offset) == local.read_range(offset)
            assert store.read_batches(TOPIC, 0, segment, offset, offset + 2, max_bytes=1) == local.read_range(offset, offset + 2, max_bytes=1)
    assert store.find_position(TOPIC, 0, segment, segment.next_offset) is None


def test_offset_for_timestamp_is_the_first_remote_record_at_or_after_the_time(store, sealed_segments):
    """ListOffsets by time from the store: the least offset at or after the log start whose
    record time is at or after the time (CreateTime need not grow within a batch), or None."""
    manifest = upload_and_commit(store, sealed_segments[:3])
    records: list[tuple[int, int]] = []  # (offset, ms) of every uploaded record
    for files in sealed_segments[:3]:
        with open(files.log, "rb") as file:
            for header, body in SegmentReader(file, files.base_offset).read_arrow(0):
                times = body.column("timestamp").cast(pa.int64()).to_pylist()
                records += zip(record.record_offsets(header, body).to_pylist(), times)

    def expected(m: PartitionManifest, ms: int) -> tuple[int, int] | None:
        return next(((o, t) for o, t in records if o >= m.log_start_offset and t >= ms), None)

    trimmed = manifest.with_log_start_offset(manifest.segments[1].base_offset + 1)
    times = sorted({t for _, t in records})
    for m in (manifest, trimmed):
        for ms in [times[0] - 1, times[0], times[len(times) // 2] + 1, times[-1], times[-1] + 1]:
            assert store.offset_for_timestamp(TOPIC, 0, m, ms) == expected(m, ms), (m.log_start_offset, ms)


def test_segment_objects_hold_their_crc(store, sealed_segments):
    """The manifest's CRC32C of each object is that of the bytes the store holds (what Spark checks)."""
    segment = upload_and_commit(store, sealed_segments[:1]).segments[0]
    for obj in segment.objects():
        data = store.fs.cat_file(store.object_path(TOPIC, 0, obj))
        assert (len(data), crc32c.crc32c(data)) == (obj.size_bytes, obj.crc32c)


# --- upload verification and crashes -----------------------------------------------------------------

@pytest.mark.parametrize("tamper", [lambda data: flip_byte(data, len(data) // 2), lambda data: data[:-1],
                                    lambda data: data + b"\0"], ids=["flipped-byte", "truncated", "extended"])
def test_verification_catches_a_bad_upload_and_removes_the_attempt(store, sealed_segments, monkeypatch, tamper):
    """The store keeps other bytes than were sent: UploadVerificationError, and none of the
    attempt's objects is left behind."""
    put_file = store.fs.put_file

    def put_then_tamper(local_path, remote_path, *args, **kwargs):
        put_file(local_path, remote_path, *args, **kwargs)
        store.fs.pipe_file(remote_path, tamper(open(local_path, "rb").read()))

    monkeypatch.setattr(store.fs, "put_file", put_then_tamper)
    with pytest.raises(UploadVerificationError):
        store.upload_segment(TOPIC, 0, sealed_segments[0])
    assert object_names(store) == []
    assert store.load_manifest(TOPIC, 0).segments == ()


def test_crash_mid_upload_leaves_only_unreferenced_objects_that_clean_orphans_removes(store, sealed_segments, monkeypatch):
    """A broker killed while the `.log` uploads: no segment is visible, the partial objects stay
    while younger than the grace period, clean_orphans removes them after, and the retried
    upload commits."""
    files = sealed_segments[0]

    def half_then_crash(local_path, remote_path, *args, **kwargs):
        store.fs.pipe_file(remote_path, open(local_path, "rb").read()[:1000])
        raise Crash()

    with monkeypatch.context() as patch:
        patch.setattr(store.fs, "put_file", half_then_crash)
        with pytest.raises(Crash):
            store.upload_segment(TOPIC, 0, files)
    orphans = object_names(store)
    assert len(orphans) == 3 and {name.rsplit(".", 1)[1] for name in orphans} == {"log", "index", "timeindex"}
    assert store.load_manifest(TOPIC, 0).segments == ()

    assert store.clean_orphans(TOPIC, 0, grace_ms=3_600_000) == []  # young: maybe an upload in flight
    later = RemoteSegmentStore(store.fs, store.root, clock=lambda: time.time_ns() // 1_000_000 + 7_200_000)
    assert later.clean_orphans(TOPIC, 0, grace_ms=3_600_000) == orphans
    assert object_names(store) == []
    manifest = upload_and_commit(store, [files])
    assert len(manifest.segments) == 1 and store.read_batches(TOPIC, 0, manifest.segments[0], files.base_offset)


def test_crash_between_upload_and_commit_then_reupload_is_idempotent(store, sealed_segments):
    """Upload done, crash before the manifest commit; on restart the segment is not remote yet, the
    re-upload is a new attempt, and once committed only the first attempt is an orphan."""
    files = sealed_segments[0]
    first = store.upload_segment(TOPIC, 0, files)  # ... then the broker dies
    manifest = store.load_manifest(TOPIC, 0, TOPIC_ID)
    assert manifest.segment_at(files.base_offset) is None
    second = store.upload_segment(TOPIC, 0, files)
    assert second.upload_id != first.upload_id and second.metadata == first.metadata
    committed = store.commit_manifest(manifest.version, manifest.with_segment(second))
    assert store.load_manifest(TOPIC, 0).segments == (second,) == committed.segments
    assert store.clean_orphans(TOPIC, 0, grace_ms=0) == sorted(obj.name for obj in first.objects())
    assert object_names(store) == sorted(obj.name for obj in second.objects())
    assert store.read_range(TOPIC, 0, second, 0, second.size_bytes) == files.log.read_bytes()


def test_commit_refuses_a_segment_whose_objects_are_gone(store, sealed_segments):
    """A manifest never names a missing object: here orphan cleaning raced the commit."""
    segment = store.upload_segment(TOPIC, 0, sealed_segments[0])
    store.clean_orphans(TOPIC, 0, grace_ms=0)
    with pytest.raises(RemoteObjectNotFoundError):
        store.commit_manifest(0, PartitionManifest.empty(TOPIC, 0, TOPIC_ID).with_segment(segment))
    assert store.manifest_versions(TOPIC, 0) == []


# --- manifests ------------------------------------------------------------------------------------------

def test_manifest_versions_grow_and_old_ones_are_collected(store, sealed_segments):
    """Each commit makes a new version object; only the newest three are kept."""
    manifest = upload_and_commit(store, sealed_segments[:5])
    assert manifest.version == 5
    assert store.manifest_versions(TOPIC, 0) == [3, 4, 5]
    assert store.load_manifest(TOPIC, 0) == manifest


def test_a_stale_writer_loses_the_compare_and_set(store, sealed_segments):
    """Two brokers read version 1; the one that commits second gets ManifestConflictError, as does
    any commit expecting a version that is no longer current, and nothing is overwritten."""
    upload_and_commit(store, sealed_segments[:1])
    leader = store.load_manifest(TOPIC, 0)
    stale = store.load_manifest(TOPIC, 0)
    segment = store.upload_segment(TOPIC, 0, sealed_segments[1])
    committed = store.commit_manifest(leader.version, leader.with_segment(segment))
    for expected in (stale.version, 0, committed.version + 1):
        with pytest.raises(ManifestConflictError):
            store.commit_manifest(expected, stale.with_log_start_offset(stale.log_end_offset))
    assert store.load_manifest(TOPIC, 0) == committed


def test_two_writers_creating_the_same_version_cannot_both_win(store, sealed_segments, monkeypatch):
    """A writer whose listing missed a version just created: the exclusive create (conditional
    PUT, link on file://) makes it lose instead of overwriting."""
    manifest = upload_and_commit(store, sealed_segments[:1])
    other = RemoteSegmentStore(store.fs, store.root)
    won = other.commit_manifest(manifest.version, manifest.with_log_start_offset(manifest.segments[0].base_offset + 1))
    monkeypatch.setattr(store, "manifest_versions", lambda topic, partition: [manifest.version])  # a stale listing
    with pytest.raises(ManifestConflictError):
        store.commit_manifest(manifest.version, manifest)
    assert RemoteSegmentStore(store.fs, store.root).load_manifest(TOPIC, 0) == won


GARBAGE = {
    "empty": lambda good: b"",
    "torn": lambda good: good[: len(good) // 2],
    "not-json": lambda good: b"\x00\xffgarbage",
    "schema": lambda good: b'{"format_version": 1}',
    "other-version-inside": lambda good: good,  # a valid manifest, but of the version below its name
    "other-partition": lambda good: good.replace(b'"partition":0', b'"partition":1'),
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_garbage_manifest_version_is_ignored_for_the_last_valid_one(store, sealed_segments, garbage):
    """The newest version object does not parse or validate: readers get the one below, and the
    next commit goes above the garbage."""
    manifest = upload_and_commit(store, sealed_segments[:2])
    folder = store.manifests_path(TOPIC, 0)
    store.fs.pipe_file(f"{folder}/{manifest_object_name(manifest.version + 1)}", garbage(manifest.to_json()))
    assert store.load_manifest(TOPIC, 0) == manifest
    segment = store.upload_segment(TOPIC, 0, sealed_segments[2])
    committed = store.commit_manifest(manifest.version, manifest.with_segment(segment))
    assert committed.version == manifest.version + 2
    assert store.load_manifest(TOPIC, 0) == committed


def test_no_valid_manifest_is_an_error_not_an_empty_partition(store, sealed_segments):
    """Every version is garbage: CorruptManifestError, and clean_orphans deletes nothing."""
    manifest = upload_and_commit(store, sealed_segments[:1])
    folder = store.manifests_path(TOPIC, 0)
    store.fs.pipe_file(f"{folder}/{manifest_object_name(manifest.version)}", b"{")
    with pytest.raises(CorruptManifestError):
        store.load_manifest(TOPIC, 0)
    with pytest.raises(CorruptManifestError):
        store.clean_orphans(TOPIC, 0, grace_ms=0)
    assert len(object_names(store)) == 3


def test_a_manifest_of_another_topic_incarnation_is_refused(store, sealed_segments):
    """Same topic name, other topic id: the remote segments are not this topic's."""
    upload_and_commit(store, sealed_segments[:1])
    with pytest.raises(RemoteTopicIdMismatchError):
        store.load_manifest(TOPIC, 0, topic_id="f" * 32)
    current = store.load_manifest(TOPIC, 0)
    with pytest.raises(RemoteTopicIdMismatchError):
        store.commit_manifest(current.version, current.with_topic_id("f" * 32))


def test_clean_orphans_keeps_named_objects_and_deletes_dropped_segments(store, sealed_segments):
    """Retention commits a manifest without the oldest segment; its objects, not yet deleted when
    the broker died, are orphans; the others and the manifests stay."""
    manifest = upload_and_commit(store, sealed_segments[:3])
    dropped = manifest.segments[0]
    store.commit_manifest(manifest.version, manifest.with_log_start_offset(dropped.next_offset))
    assert store.clean_orphans(TOPIC, 0, grace_ms=0) == sorted(obj.name for obj in dropped.objects())
    assert object_names(store) == sorted(obj.name for s in manifest.segments[1:] for obj in s.objects())
    assert store.load_manifest(TOPIC, 0).segments == manifest.segments[1:]
    with pytest.raises(RemoteObjectNotFoundError):
        store.read_range(TOPIC, 0, dropped, 0, 10)  # a reader holding the old manifest


# --- listing ----------------------------------------------------------------------------------------

def test_topics_and_partitions_list_the_folders_that_hold_manifests(store, sealed_segments):
    """partitions(topic): the numeric folders with a manifest, ascending (not one holding only
    segment objects, nor a non-numeric folder); topics(): the topic folders; both [] when empty."""
    assert store.topics() == [] and store.partitions(TOPIC) == []
    upload_and_commit(store, sealed_segments[:1], partition=10)
    upload_and_commit(store, sealed_segments[:1], partition=2)
    store.upload_segment(TOPIC, 3, sealed_segments[0])  # uploaded, never committed: no manifest
    store.fs.pipe_file(f"{store.topic_path(TOPIC)}/notes/x", b"x")
    store.fs.pipe_file(f"{store.topic_path('other')}/0/{sealed_segments[0].log.name}", b"x")
    assert store.partitions(TOPIC) == [2, 10]
    assert store.partitions("other") == [] and store.partitions("absent") == []
    assert store.topics() == sorted([TOPIC, "other"])
    store.delete_partition(TOPIC, 10)
    assert store.partitions(TOPIC) == [2]


# --- deletion ---------------------------------------------------------------------------------------

def test_delete_partition_and_topic_empty_their_prefixes(store, sealed_segments):
    """delete_partition empties one partition's folder, delete_topic every one; reads afterwards
    see empty manifests."""
    upload_and_commit(store, sealed_segments[:2], partition=0)
    upload_and_commit(store, sealed_segments[:2], partition=1)
    store.delete_partition(TOPIC, 0)
    assert store.fs.find(store.partition_path(TOPIC, 0)) == []
    assert store.load_manifest(TOPIC, 0).version == 0
    assert len(store.load_manifest(TOPIC, 1).segments) == 2
    store.delete_topic(TOPIC)
    store.fs.invalidate_cache(store.topic_path(TOPIC))
    assert store.fs.find(store.topic_path(TOPIC)) == []
    assert store.load_manifest(TOPIC, 1) == PartitionManifest.empty(TOPIC, 1)
    store.delete_topic(TOPIC)  # idempotent


# --- bad bytes --------------------------------------------------------------------------------------

def test_a_corrupted_remote_batch_is_corrupt_message_never_bytes(store, sealed_segments):
    """A byte of the second batch's body flips at rest: reads reaching it raise CorruptMessageError;
    the batch before it still reads."""
    files = sealed_segments[0]
    segment = upload_and_commit(store, [files]).segments[0]
    local = files.log.read_bytes()
    (first_position, first), (second_position, second) = list(record.iter_batches(local))[:2]
    path = store.object_path(TOPIC, 0, segment.log)
    store.fs.pipe_file(path, flip_byte(local, second_position + record.HEADER_SIZE + 20))
    with pytest.raises(CorruptMessageError, match="crc|CRC"):
        store.read_batches(TOPIC, 0, segment, second.base_offset)
    assert store.read_batches(TOPIC, 0, segment, first.base_offset) == local[:second_position]  # stops before it
    assert store.read_batches(TOPIC, 0, segment, first.base_offset, second.base_offset) == local[:second_position]
    assert store.read_range(TOPIC, 0, segment, 0, segment.size_bytes) != local  # raw ranges are not validated
    with pytest.raises(UploadVerificationError):
        store.verify_upload(TOPIC, 0, segment)


def test_a_truncated_remote_log_is_corrupt_message(store, sealed_segments):
    """The object is shorter than its manifest entry: CorruptMessageError, not a short read."""
    files = sealed_segments[0]
    segment = upload_and_commit(store, [files]).segments[0]
    store.fs.pipe_file(store.object_path(TOPIC, 0, segment.log), files.log.read_bytes()[:-100])
    with pytest.raises(CorruptMessageError):
        store.read_range(TOPIC, 0, segment, segment.size_bytes - 200, 200)
    with pytest.raises(CorruptMessageError):
        store.read_batches(TOPIC, 0, segment, segment.last_offset)


def test_a_corrupt_remote_index_costs_a_scan_not_the_read(store, sealed_segments):
    """The `.index` object fails its CRC: read_offset_index raises CorruptIndexError, while
    find_position and read_batches fall back to scanning the `.log`."""
    files = sealed_segments[0]
    segment = upload_and_commit(store, [files]).segments[0]
    index_path = store.object_path(TOPIC, 0, segment.index)
    store.fs.pipe_file(index_path, flip_byte(files.index.read_bytes(), 20))
    with pytest.raises(CorruptIndexError):
        store.read_offset_index(TOPIC, 0, segment)
    with open(files.log, "rb") as file:
        local = SegmentReader(file, files.base_offset)
        offset = segment.last_offset
        assert store.find_position(TOPIC, 0, segment, offset) == local.find_position(offset)
        assert store.read_batches(TOPIC, 0, segment, offset) == local.read_range(offset)


# --- failures of the store ----------------------------------------------------------------------------

@pytest.mark.parametrize("error", [ConnectionResetError("reset by peer"), TimeoutError("timed out"),
                                   PermissionError("denied"), RuntimeError("backend-specific failure")],
                         ids=["connection-reset", "timeout", "permission", "other"])
def test_filesystem_failures_become_remote_storage_errors(store, sealed_segments, monkeypatch, error):
    """Whatever the filesystem raises surfaces as a retriable RemoteStorageError from every operation."""
    manifest = upload_and_commit(store, sealed_segments[:1])
    segment = manifest.segments[0]

    def fail(*args, **kwargs):
        raise error

    for method in ("cat_file", "ls", "put_file", "pipe_file", "rm", "info", "find"):
        monkeypatch.setattr(store.fs, method, fail)
    operations = {
        "load_manifest": lambda: store.load_manifest(TOPIC, 0),
        "commit_manifest": lambda: store.commit_manifest(manifest.version, manifest),
        "upload_segment": lambda: store.upload_segment(TOPIC, 0, sealed_segments[1]),
        "read_range": lambda: store.read_range(TOPIC, 0, segment, 0, 100),
        "read_batches": lambda: store.read_batches(TOPIC, 0, segment, segment.base_offset),
        "delete_segment": lambda: store.delete_segment(TOPIC, 0, segment),
        "clean_orphans": lambda: store.clean_orphans(TOPIC, 0),
        "delete_partition": lambda: store.delete_partition(TOPIC, 0),
    }
    for name, operation in operations.items():
        with pytest.raises(RemoteStorageError) as caught:
            operation()
        assert caught.value.retriable and caught.value.__cause__ is error, name


# --- S3 outages (a server to kill) --------------------------------------------------------------------

def test_s3_outage_fails_fast_with_remote_storage_error(tmp_path, sealed_segments):
    """The S3 endpoint dies (SIGKILL) under a store with segments committed: every operation raises
    RemoteStorageError within seconds, none hangs."""
    server = MotoServer(tmp_path / "moto.log").start()
    try:
        store = RemoteSegmentStore.from_url(f"s3://{make_bucket(server.endpoint_url)}/pymq",
                                            s3_options(server.endpoint_url, max_attempts=1))
        manifest = upload_and_commit(store, sealed_segments[:1])
    finally:
        server.stop()
    segment = manifest.segments[0]
    for operation in (lambda: store.load_manifest(TOPIC, 0),
                      lambda: store.read_batches(TOPIC, 0, segment, segment.base_offset),
                      lambda: store.upload_segment(TOPIC, 0, sealed_segments[1]),
                      lambda: store.commit_manifest(manifest.version, manifest),
                      lambda: store.clean_orphans(TOPIC, 0, grace_ms=0),
                      lambda: store.delete_topic(TOPIC)):
        started = time.monotonic()
        with pytest.raises(RemoteStorageError) as caught:
            operation()
        assert caught.value.retriable
        assert time.monotonic() - started < 5


def test_s3_endpoint_never_reachable_fails_fast(sealed_segments):
    """Nothing listens on the endpoint's port: RemoteStorageError within seconds, not a hang."""
    store = RemoteSegmentStore.from_url("s3://bucket/pymq", s3_options(f"http://127.0.0.1:{free_port()}", max_attempts=1))
    started = time.monotonic()
    with pytest.raises(RemoteStorageError):
        store.upload_segment(TOPIC, 0, sealed_segments[0])
    with pytest.raises(RemoteStorageError):
        store.load_manifest(TOPIC, 0)
    assert time.monotonic() - started < 10

