"""RemoteSegmentStore: sealed segments and partition manifests in object storage, over any fsspec filesystem.

The layout and the manifest's format are public (the package docstring documents them for Spark
and for users); this module is their one writer. What it guarantees:

- Nothing half-written is ever part of the log. Each upload attempt writes its three objects
  under names of its own (`{base_offset:020d}-{upload_id}.{log,index,timeindex}`), reads them back
  (size of each, CRC32C of every byte) and only then returns the RemoteSegment that a manifest may
  name. A crashed or failed attempt leaves objects no manifest names: invisible to readers, removed
  by `clean_orphans` once older than a grace period. Uploading the same segment again is safe.
- Manifests are never overwritten: each commit creates `manifest-{version:020d}.json`, with an
  exclusive create (S3's `If-None-Match: *`; on `file://` a fully written and fsynced temporary file
  linked to its name), after a compare-and-set check of the version the writer read. Readers take
  the highest version that parses and validates, so a torn or garbage object is skipped.
- Every failure of the store is a RemoteStorageError (see errors.py); bytes that fail their checks
  are CorruptMessageError (batches, CRC32C of a range read through `read_batches`) or
  CorruptIndexError (index objects), never returned.

Blocking: every method does network I/O. Call them from worker threads (asyncio.to_thread), never
on an event loop. A store holds no per-partition state and may be shared by threads; the callers
keep one manifest writer per partition (the leader), and the compare-and-set fences a stale one.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import crc32c
import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from common.errors import CorruptMessageError, KafkaStorageError, PymqError
from segment_format import record, txn_index
from segment_format.index_file import OFFSET_INDEX, TIME_INDEX, CorruptIndexError, SparseIndex
from segment_format.layout import SegmentFiles, validate_topic_name
from segment_format.manifest import (
    MANIFEST_OBJECT_NAME,
    MANIFESTS_FOLDER,
    SEGMENT_OBJECT_NAME,
    UPLOAD_ID_HEX_DIGITS,
    CorruptManifestError,
    PartitionManifest,
    RemoteObject,
    RemoteSegment,
    manifest_object_name,
)
from segment_format.segment_metadata import SegmentMetadata
from segment_format.segment_reader import FRAME_ONLY, PRead, SegmentReader
from segment_format.txn_index import AbortedTxn
from tiered_storage.errors import (
    ManifestConflictError,
    ManifestFencedError,
    RemoteObjectNotFoundError,
    RemoteStorageError,
    RemoteTopicIdMismatchError,
    UploadVerificationError,
)

log = logging.getLogger(__name__)

DEFAULT_ORPHAN_GRACE_MS = 3_600_000  # longer than any upload-to-commit: younger objects may be in flight
MANIFEST_VERSIONS_KEPT = 3  # old versions stay a while for readers that listed before a commit
S3_MAX_ATTEMPTS = 3  # per S3 request, the first included, before a RemoteStorageError
VERIFY_READ_BYTES = 8 << 20  # the read-back CRC of an upload reads this much per request
_LOAD_ATTEMPTS = 3  # a manifest version garbage-collected between a listing and its read: list again
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})  # no directories to make
_TEMP_SUFFIX = ".tmp"
# Exceptions that mean a bug in the caller or here, never the store failing: they are not translated.
_BUGS = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class _Vanished(Exception):
    """A listed manifest version was gone when read (garbage-collected by a newer commit)."""


class RemoteSegmentStore:
    """Segments and manifests under `root` of the fsspec filesystem `fs` (see the module docstring).

    `from_url` builds one from a URL; the constructor takes a filesystem as is (tests inject one).
    `clock` gives wall-clock ms, compared with object modification times by `clean_orphans`.
    """

    def __init__(self, fs: AbstractFileSystem, root: str, *, manifest_versions_kept: int = MANIFEST_VERSIONS_KEPT,
                 clock: Callable[[], int] = _wall_clock_ms, verify_read_bytes: int = VERIFY_READ_BYTES) -> None:
        assert manifest_versions_kept >= 1, manifest_versions_kept
        assert verify_read_bytes > 0, verify_read_bytes
        self.fs = fs
        self.root = root.rstrip("/")
        self.manifest_versions_kept = manifest_versions_kept
        self.verify_read_bytes = verify_read_bytes
        self._clock = clock
        self._local = isinstance(fs, LocalFileSystem)
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        self._has_directories = not protocols & _OBJECT_STORES

    @classmethod
    def from_url(cls, url: str, options: Mapping[str, Any] | None = None, **store_kwargs: Any) -> RemoteSegmentStore:
        """A store at `url`:

            file:///abs/path  (or a plain path)  the local filesystem (a shared mount, or a folder
                                                 of the broker's data dir by default)
            s3://bucket/prefix                   S3 or any S3-compatible endpoint, through s3fs
            any other fsspec URL                 e.g. gs://, abfs://, memory://

        `options` go to the filesystem. For s3:// these are understood (the rest go to s3fs as
        they are): `endpoint_url`, `key`, `secret`, `region`, `connect_timeout_s`,
        `read_timeout_s`, `max_attempts` (per request, the first included; default 3). Listing
        caches are off: a reader must see the manifest another broker just committed."""
        options = dict(options or {})
        protocol, _, rest = url.partition("://")
        if not rest:  # a plain path
            return cls(LocalFileSystem(auto_mkdir=True), os.path.abspath(url), **store_kwargs)
        if protocol == "file":
            return cls(LocalFileSystem(auto_mkdir=True), LocalFileSystem._strip_protocol(url), **store_kwargs)
        if protocol in ("s3", "s3a"):
            return cls(_s3_filesystem(options), rest, **store_kwargs)
        fs, root = fsspec.core.url_to_fs(url, **options)
        return cls(fs, root, **store_kwargs)

    # --- paths ---------------------------------------------------------------------------------

    def topic_path(self, topic: str) -> str:
        validate_topic_name(topic)
        return f"{self.root}/{topic}"

    def partition_path(self, topic: str, partition: int) -> str:
        """`{root}/{topic}/{partition}`: the folder of the partition's segment objects."""
        if not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, got {partition!r}")
        return f"{self.topic_path(topic)}/{partition}"

    def manifests_path(self, topic: str, partition: int) -> str:
        """`{root}/{topic}/{partition}/manifests`: the folder of the partition's manifest versions."""
        return f"{self.partition_path(topic, partition)}/{MANIFESTS_FOLDER}"

    def object_path(self, topic: str, partition: int, obj: RemoteObject) -> str:
        return f"{self.partition_path(topic, partition)}/{obj.name}"

    # --- error translation ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _remote(self, what: str) -> Iterator[None]:
        """Turn whatever the filesystem raises into RemoteStorageError (RemoteObjectNotFoundError
        for a missing object); pymq's own errors and bugs pass through."""
        try:
            yield
        except (PymqError, *_BUGS):
            raise
        except FileNotFoundError as err:
            raise RemoteObjectNotFoundError(f"{what}: not found ({err})") from err
        except Exception as err:  # botocore, aiohttp, OSError, timeouts: whatever the backend raises
            raise RemoteStorageError(f"{what}: {type(err).__name__}: {err}") from err

    # --- manifests -------------------------------------------------------------------------------

    def manifest_versions(self, topic: str, partition: int) -> list[int]:
        """The versions whose manifest objects exist, ascending (valid or not)."""
        folder = self.manifests_path(topic, partition)
        versions = []
        for name, _ in self._list(folder):
            match = MANIFEST_OBJECT_NAME.fullmatch(name)
            if match:
                versions.append(int(match.group(1)))
        return sorted(versions)

    def load_manifest(self, topic: str, partition: int, topic_id: str | None = None) -> PartitionManifest:
        """The partition's current manifest: the highest version that parses and validates (a torn
        or garbage one is skipped with a warning), or an empty version-0 manifest if none exists.
        RemoteTopicIdMismatchError if `topic_id` is given and the manifest's is another one;
        CorruptManifestError if versions exist but none is valid (nothing is ever assumed empty
        then: orphan cleaning would delete the segments)."""
        for _ in range(_LOAD_ATTEMPTS):
            versions = self.manifest_versions(topic, partition)
            if not versions:
                return PartitionManifest.empty(topic, partition, topic_id or "")
            try:
                manifest = self._latest_valid(topic, partition, versions)
            except _Vanished:
                continue
            if topic_id and manifest.topic_id and manifest.topic_id != topic_id:
                raise RemoteTopicIdMismatchError(
                    f"{self.manifests_path(topic, partition)}: manifest version {manifest.version} is of topic id "
                    f"{manifest.topic_id}, not {topic_id}")
            return manifest
        raise RemoteStorageError(f"{self.manifests_path(topic, partition)}: manifest versions kept vanishing while read")

    def _latest_valid(self, topic: str, partition: int, versions: list[int]) -> PartitionManifest:
        problems = []
        for version in reversed(versions):
            try:
                return self._read_manifest(topic, partition, version)
            except CorruptManifestError as err:
                log.warning("%s: skipping manifest version %d: %s", self.manifests_path(topic, partition), version, err)
                problems.append(f"{version}: {err}")
        raise CorruptManifestError(f"{self.manifests_path(topic, partition)}: no valid manifest among {problems}")

    def _read_manifest(self, topic: str, partition: int, version: int) -> PartitionManifest:
        """Version `version`, checked against its name and place. _Vanished if it is gone."""
        path = f"{self.manifests_path(topic, partition)}/{manifest_object_name(version)}"
        try:
            with self._remote(f"read of {path}"):
                data = self.fs.cat_file(path)
        except RemoteObjectNotFoundError as err:
            raise _Vanished(path) from err
        manifest = PartitionManifest.from_json(data)
        if (manifest.topic, manifest.partition, manifest.version) != (topic, partition, version):
            raise CorruptManifestError(
                f"{path} holds version {manifest.version} of {manifest.topic}-{manifest.partition}")
        return manifest

    def commit_manifest(self, expected_version: int, manifest: PartitionManifest) -> PartitionManifest:
        """Make `manifest` the partition's current one, if the current one is still version
        `expected_version` (0: none yet); returns it as committed, with its new version (above
        every version present, valid or torn).

        Before writing, the segments it adds to version `expected_version` are checked to exist
        at their recorded sizes: a manifest never names an object that is not there.
        ManifestConflictError if a newer valid version exists, `expected_version` is gone, or a
        concurrent writer created the same version first; ManifestFencedError if `manifest`'s
        leader epoch is below that of version `expected_version` (its writer was deposed: the
        exclusive create of the next version orders this check against the new leader's first
        commit); RemoteTopicIdMismatchError if the
        current manifest has another topic id. Old versions beyond `manifest_versions_kept` are
        deleted afterwards (a failure there is only logged)."""
        topic, partition = manifest.topic, manifest.partition
        folder = self.manifests_path(topic, partition)
        versions = self.manifest_versions(topic, partition)
        current = self._expected_manifest(topic, partition, expected_version, versions)
        if current.topic_id and manifest.topic_id and current.topic_id != manifest.topic_id:
            raise RemoteTopicIdMismatchError(f"{folder}: version {expected_version} is of topic id {current.topic_id}, "
                                             f"not {manifest.topic_id}")
        if manifest.leader_epoch < current.leader_epoch:
            raise ManifestFencedError(f"{folder}: version {expected_version} was committed by the leader of epoch "
                                      f"{current.leader_epoch}; a writer of epoch {manifest.leader_epoch} is deposed")
        known = {s.upload_id for s in current.segments}
        for segment in manifest.segments:
            if segment.upload_id not in known:
                self._check_uploaded(topic, partition, segment)
        committed = replace(manifest, version=max(versions, default=0) + 1)
        self._create_exclusive(folder, manifest_object_name(committed.version), committed.to_json())
        self._collect_manifests(folder, [*versions, committed.version])
        return committed

    def _expected_manifest(self, topic: str, partition: int, expected_version: int, versions: list[int]) -> PartitionManifest:
        """The manifest a commit replaces, after checking no valid newer one exists."""
        folder = self.manifests_path(topic, partition)
        for version in reversed(versions):
            if version <= expected_version:
                break
            try:
                newer = self._read_manifest(topic, partition, version)
            except (CorruptManifestError, _Vanished):
                continue  # torn: never visible, and the commit goes above it
            raise ManifestConflictError(f"{folder}: version {newer.version} exists, the writer expected {expected_version}")
        if expected_version == 0:
            return PartitionManifest.empty(topic, partition)
        if expected_version not in versions:
            raise ManifestConflictError(f"{folder}: version {expected_version} the writer expected is gone")
        try:
            return self._read_manifest(topic, partition, expected_version)
        except _Vanished as err:
            raise ManifestConflictError(f"{folder}: version {expected_version} the writer expected is gone") from err

    def _check_uploaded(self, topic: str, partition: int, segment: RemoteSegment) -> None:
        for obj in segment.objects():
            path = self.object_path(topic, partition, obj)
            size = self._size(path)
            if size != obj.size_bytes:
                raise UploadVerificationError(f"{path}: {size} bytes, the manifest would say {obj.size_bytes}")

    def _create_exclusive(self, folder: str, name: str, data: bytes) -> None:
        """Create `folder/name` holding `data`, visible whole or not at all; ManifestConflictError
        if it exists."""
        path = f"{folder}/{name}"
        try:
            with self._remote(f"write of {path}"):
                if self._local:
                    _create_local_exclusive(folder, name, data)
                else:
                    # S3: a conditional PUT (If-None-Match: *), atomic. Other filesystems: fsspec
                    # checks existence first (not atomic: one writer per partition is assumed).
                    self.fs.pipe_file(path, data, mode="create")
        except RemoteStorageError as err:
            if isinstance(err.__cause__, FileExistsError):
                raise ManifestConflictError(f"{path} was created by another writer first") from err
            raise

    def _collect_manifests(self, folder: str, versions: list[int]) -> None:
        """Delete every version below the `manifest_versions_kept` newest (valid or torn)."""
        old = sorted(versions)[:-self.manifest_versions_kept]
        if not old:
            return
        try:
            self._delete_paths([f"{folder}/{manifest_object_name(v)}" for v in old])
        except RemoteStorageError as err:
            log.warning("%s: old manifest versions %s not deleted (the next commit retries): %s", folder, old, err)

    # --- upload ----------------------------------------------------------------------------------

    def upload_segment(self, topic: str, partition: int, files: SegmentFiles,
                       metadata: SegmentMetadata | None = None, extras: Mapping[str, bytes] | None = None) -> RemoteSegment:
        """Upload a sealed, flushed segment (its `.log`, `.index` and `.timeindex`, and `extras`:
        the bytes of optional kinds, e.g. "snapshot", the producer state at the segment's end) as
        a new attempt, verify it, and return the entry to add to the manifest (nothing is visible until
        that manifest is committed). `metadata` is computed from the `.log` when not given
        (validating every batch; CorruptMessageError if one is bad).

        The `.log` streams from disk; the indexes are parsed and checked against the segment
        before they go (CorruptIndexError: rebuild them first). KafkaStorageError if a local file
        cannot be read; RemoteStorageError if the store fails, UploadVerificationError if what it
        holds differs from what was sent. On any failure the attempt's objects are deleted where
        possible (`clean_orphans` removes the rest)."""
        directory = self.partition_path(topic, partition)
        if metadata is None:
            metadata = _local_metadata(files)
        log_size = _local_size(files.log)
        if log_size != metadata.size_bytes:
            raise ValueError(f"{files.log}: {log_size} bytes, its metadata says {metadata.size_bytes}: not a sealed segment?")
        index_bytes, time_index_bytes = _read_local(files.index), _read_local(files.time_index)
        OFFSET_INDEX.parse(index_bytes, files.index, metadata.base_offset).sanity_check(metadata.size_bytes)
        TIME_INDEX.parse(time_index_bytes, files.time_index, metadata.base_offset).sanity_check(metadata.next_offset)
        extras = dict(extras or {})
        segment = RemoteSegment.create(metadata, secrets.token_hex(UPLOAD_ID_HEX_DIGITS // 2),
                                       (len(index_bytes), crc32c.crc32c(index_bytes)),
                                       (len(time_index_bytes), crc32c.crc32c(time_index_bytes)),
                                       {kind: (len(data), crc32c.crc32c(data)) for kind, data in extras.items()})
        try:
            with self._remote(f"upload of {directory}/{segment.log.name}"):
                if self._has_directories:
                    self.fs.makedirs(directory, exist_ok=True)
                self.fs.pipe_file(self.object_path(topic, partition, segment.index), index_bytes)
                self.fs.pipe_file(self.object_path(topic, partition, segment.time_index), time_index_bytes)
                for kind, data in extras.items():
                    obj = segment.object_of(kind)
                    assert obj is not None
                    self.fs.pipe_file(self.object_path(topic, partition, obj), data)
                self.fs.put_file(str(files.log), self.object_path(topic, partition, segment.log))
                if self._local:
                    _fsync_local([self.object_path(topic, partition, obj) for obj in segment.objects()], directory)
            self.verify_upload(topic, partition, segment)
        except Exception:
            self._discard(topic, partition, segment)
            raise
        return segment

    def verify_upload(self, topic: str, partition: int, segment: RemoteSegment) -> None:
        """Check the store holds `segment`'s objects as recorded: the size of each, the CRC32C of
        every byte of each (the `.log` read back in `verify_read_bytes` ranges).
        UploadVerificationError on a difference; RemoteStorageError if the store fails."""
        for obj in segment.objects():
            path = self.object_path(topic, partition, obj)
            size = self._size(path)
            if size != obj.size_bytes:
                raise UploadVerificationError(f"{path}: {size} bytes stored, {obj.size_bytes} sent")
            crc = self._stored_crc(path, size)
            if crc != obj.crc32c:
                raise UploadVerificationError(f"{path}: CRC32C {crc:#010x} stored, {obj.crc32c:#010x} sent")

    def _size(self, path: str) -> int:
        with self._remote(f"size of {path}"):
            self.fs.invalidate_cache(path)
            return int(self.fs.info(path)["size"])

    def _stored_crc(self, path: str, size: int) -> int:
        crc, position = 0, 0
        while position < size:
            end = min(position + self.verify_read_bytes, size)
            with self._remote(f"read of {path}"):
                chunk = self.fs.cat_file(path, start=position, end=end)
            if len(chunk) != end - position:
                raise UploadVerificationError(f"{path}: read {len(chunk)} bytes at {position}, expected {end - position}")
            crc = crc32c.crc32c(chunk, crc)
            position = end
        return crc

    def _discard(self, topic: str, partition: int, segment: RemoteSegment) -> None:
        """Best effort: delete a failed attempt's objects (those left are orphans)."""
        try:
            self.delete_segment(topic, partition, segment)
        except RemoteStorageError as err:
            log.warning("%s: failed upload attempt %s left for clean_orphans: %s",
                        self.partition_path(topic, partition), segment.upload_id, err)

    # --- reads -----------------------------------------------------------------------------------

    def read_range(self, topic: str, partition: int, segment: RemoteSegment, position: int, size: int) -> bytes:
        """`size` raw bytes of the segment's `.log` from byte `position` (unvalidated: see
        `read_batches`). ValueError if the range is not inside the segment; CorruptMessageError if
        the object is shorter than the manifest says; RemoteObjectNotFoundError if it is gone."""
        if not (0 <= position and 0 <= size and position + size <= segment.size_bytes):
            raise ValueError(f"range {position}+{size} is outside the {segment.size_bytes}-byte segment {segment.log.name}")
        if not size:
            return b""
        path = self.object_path(topic, partition, segment.log)
        with self._remote(f"read of {path}"):
            data = self.fs.cat_file(path, start=position, end=position + size)
        if len(data) != size:
            raise CorruptMessageError(f"{path}: ends at byte {position + len(data)}, before its manifest size of {segment.size_bytes}")
        return data

    def read_offset_index(self, topic: str, partition: int, segment: RemoteSegment) -> SparseIndex:
        """The segment's offset index. CorruptIndexError if the object's size or CRC32C is not the
        manifest's or its entries are bad."""
        data = self._read_index_object(topic, partition, segment.index)
        index = OFFSET_INDEX.parse(data, Path(segment.index.name), segment.base_offset)
        index.sanity_check(segment.size_bytes)
        return index

    def read_time_index(self, topic: str, partition: int, segment: RemoteSegment) -> SparseIndex:
        """The segment's time index; CorruptIndexError as `read_offset_index`."""
        data = self._read_index_object(topic, partition, segment.time_index)
        index = TIME_INDEX.parse(data, Path(segment.time_index.name), segment.base_offset)
        index.sanity_check(segment.next_offset)
        return index

    def read_optional_object(self, topic: str, partition: int, segment: RemoteSegment, kind: str) -> bytes | None:
        """The bytes of the segment's object of an optional kind ("snapshot", "txnindex"), or None
        if its upload had none (an entry older than the kind). CorruptIndexError if the object's
        size or CRC32C is not the manifest's."""
        obj = segment.object_of(kind)
        return None if obj is None else self._read_index_object(topic, partition, obj)

    def read_txn_index(self, topic: str, partition: int, segment: RemoteSegment) -> list[AbortedTxn]:
        """The aborted transactions whose ABORT marker is in `segment` (none if it was uploaded
        without a `.txnindex`). CorruptIndexError if the object is not the manifest's or bad."""
        data = self.read_optional_object(topic, partition, segment, "txnindex")
        if data is None:
            return []
        return txn_index.parse(data, f"{self.partition_path(topic, partition)}/{segment.base_offset}.txnindex",
                               segment.base_offset)

    def collect_aborted_transactions(self, topic: str, partition: int, manifest: PartitionManifest,
                                     start_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of the aborted transactions overlapping [start_offset,
        upper_bound) in `manifest`'s segments from the one holding `start_offset` on (Kafka's
        collectAbortedTxns over the remote tier). One object read per segment with a `.txnindex`."""
        found: list[tuple[int, int]] = []
        for segment in manifest.segments:
            if segment.next_offset <= start_offset or segment.object_of("txnindex") is None:
                continue
            entries = self.read_txn_index(topic, partition, segment)
            found += txn_index.collect_aborted(entries, start_offset, upper_bound)
            if entries and entries[-1].last_stable_offset >= upper_bound:
                break  # every transaction started below upper_bound had ended (Kafka's isComplete)
        return found

    def _read_index_object(self, topic: str, partition: int, obj: RemoteObject) -> bytes:
        path = self.object_path(topic, partition, obj)
        with self._remote(f"read of {path}"):
            data = self.fs.cat_file(path)
        if len(data) != obj.size_bytes or crc32c.crc32c(data) != obj.crc32c:
            raise CorruptIndexError(f"{path}: {len(data)} bytes with CRC32C {crc32c.crc32c(data):#010x}, "
                                    f"the manifest says {obj.size_bytes} with {obj.crc32c:#010x}")
        return data

    def open_reader(self, topic: str, partition: int, segment: RemoteSegment, *, indexes: bool = True,
                    source: PRead | None = None, **reader_kwargs: Any) -> SegmentReader:
        """A SegmentReader over the remote `.log` (ranged reads, or `source` when given, e.g. a
        `read_ahead.ReadAhead` over `read_range`; `reader_kwargs` tune its window) with both
        indexes loaded when `indexes`; a corrupt index is logged and done without (the reader
        scans from the segment's start instead)."""
        offset_index = time_index = None
        if indexes:
            try:
                offset_index = self.read_offset_index(topic, partition, segment)
                time_index = self.read_time_index(topic, partition, segment)
            except CorruptIndexError as err:
                log.warning("%s: reading without indexes: %s", self.partition_path(topic, partition), err)
                offset_index = time_index = None

        def pread(size: int, position: int) -> bytes:
            return self.read_range(topic, partition, segment, position, size)

        return SegmentReader(source or pread, segment.base_offset, size=segment.size_bytes,
                             name=f"{topic}/{partition}/{segment.log.name}", offset_index=offset_index,
                             time_index=time_index, **reader_kwargs)

    def offset_for_timestamp(self, topic: str, partition: int, manifest: PartitionManifest,
                             timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of `manifest`'s segments at or after
        `timestamp_ms` and at or after its log start, or None: ListOffsets by time, answered
        from the store (a bad index only costs a scan)."""
        return offset_for_timestamp(manifest, timestamp_ms, functools.partial(self._with_index_fallback, topic, partition))

    def find_position(self, topic: str, partition: int, segment: RemoteSegment, offset: int) -> tuple[int, record.BatchHeader] | None:
        """(byte position, header) of the first batch whose last offset >= `offset`, located
        through the remote offset index; None if the segment ends before `offset`."""
        return self._with_index_fallback(topic, partition, segment, lambda reader: reader.find_position(offset))

    def read_batches(self, topic: str, partition: int, segment: RemoteSegment, start_offset: int,
                     end_offset: int | None = None, *, max_bytes: int | None = None) -> bytes:
        """The raw bytes of the batches holding offsets [start_offset, end_offset), as a fetch
        returns them: the first batch may start before `start_offset`; with `max_bytes`, the
        first batch whole and then as many as fit (KIP-74); b"" if the segment ends before
        `start_offset`. Every batch returned passed `record.validate_batch`, its CRC included.
        Bad bytes are never returned: the batches before them are, and a read starting at them
        raises CorruptMessageError (CORRUPT_MESSAGE), as a local fetch does."""
        return self._with_index_fallback(
            topic, partition, segment, lambda reader: validated_range(reader, start_offset, end_offset, max_bytes)[1])

    def _with_index_fallback(self, topic: str, partition: int, segment: RemoteSegment, read: Callable[[SegmentReader], Any]) -> Any:
        """`read(reader)`; an index entry that points at the wrong batch (CorruptIndexError) only
        costs a scan from the segment's start, never the read."""
        try:
            return read(self.open_reader(topic, partition, segment))
        except CorruptIndexError as err:
            log.warning("%s: %s; reading without the index", self.partition_path(topic, partition), err)
            return read(self.open_reader(topic, partition, segment, indexes=False))

    # --- deletion --------------------------------------------------------------------------------

    def delete_segment(self, topic: str, partition: int, segment: RemoteSegment) -> None:
        """Delete the segment's objects (those already gone are fine). Call it only after a
        committed manifest stopped naming the segment."""
        self._delete_paths([self.object_path(topic, partition, obj) for obj in segment.objects()])

    def clean_orphans(self, topic: str, partition: int, grace_ms: int = DEFAULT_ORPHAN_GRACE_MS) -> list[str]:
        """Delete the partition's segment objects that the current manifest does not name and
        that were last modified at least `grace_ms` ago (failed or crashed upload attempts,
        segments dropped by a commit whose deletion did not finish), and leftover temporary
        manifest files as old. Returns the names deleted. The grace period must exceed the
        longest upload-to-commit time of any writer: a younger object may belong to an attempt
        still in flight. Objects whose age the filesystem does not tell are kept (unless
        `grace_ms` is 0). CorruptManifestError if no valid manifest exists: nothing is deleted."""
        manifest = self.load_manifest(topic, partition)
        referenced = {obj.name for segment in manifest.segments for obj in segment.objects()}
        now = self._clock()
        doomed = []
        for folder, pattern in ((self.partition_path(topic, partition), SEGMENT_OBJECT_NAME),
                                (self.manifests_path(topic, partition), None)):
            for name, info in self._list(folder):
                ours = pattern.fullmatch(name) if pattern else name.startswith(".manifest-") and name.endswith(_TEMP_SUFFIX)
                if not ours or name in referenced:
                    continue
                modified = _modified_ms(info)
                if grace_ms == 0 or (modified is not None and now - modified >= grace_ms):
                    doomed.append((folder, name))
        self._delete_paths([f"{folder}/{name}" for folder, name in doomed])
        return sorted(name for _, name in doomed)

    def delete_partition(self, topic: str, partition: int) -> None:
        """Empty the partition's folder: manifests first, so that a crash midway leaves only
        objects no manifest names."""
        self._delete_tree(self.manifests_path(topic, partition))
        self._delete_tree(self.partition_path(topic, partition))

    def delete_topic(self, topic: str, topic_id: str | None = None) -> None:
        """Empty the topic's folder, every partition's manifests first. With `topic_id`, a
        partition whose manifest is of another topic id (a topic of the same name created since)
        is kept, and so is the folder."""
        kept = 0
        for name, info in self._list(self.topic_path(topic), files=False):
            if info.get("type") == "directory" and name.isdigit():
                if topic_id:
                    try:
                        self.load_manifest(topic, int(name), topic_id)
                    except RemoteTopicIdMismatchError as err:
                        log.warning("not deleting %s: %s", self.partition_path(topic, int(name)), err)
                        kept += 1
                        continue
                    except CorruptManifestError:
                        pass  # nothing valid names a topic id: it goes with the topic
                self.delete_partition(topic, int(name))
        if not kept:
            self._delete_tree(self.topic_path(topic))

    def _delete_tree(self, path: str) -> None:
        with self._remote(f"delete of {path}"):
            self.fs.invalidate_cache(path)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=True)
            self.fs.invalidate_cache(path)

    def _delete_paths(self, paths: list[str]) -> None:
        """Delete objects (one batched request where the store has one); missing ones are fine."""
        if not paths:
            return
        with self._remote(f"delete of {paths[0]} and {len(paths) - 1} more"):
            try:
                self.fs.rm(paths)
            except FileNotFoundError:
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(path)
            for path in paths:
                self.fs.invalidate_cache(path)

    # --- listing ---------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """The names of the topic folders under the root, sorted: a reader's list of what may be
        tiered (a listed topic may have no partition with a manifest yet: see `partitions`)."""
        names = []
        for name, info in self._list(self.root, files=False):
            if info.get("type") != "directory":
                continue
            try:
                validate_topic_name(name)
            except PymqError:
                continue
            names.append(name)
        return sorted(names)

    def partitions(self, topic: str) -> list[int]:
        """The partitions of `topic` in the store, ascending: its numeric folders
        `{root}/{topic}/{partition}/` that hold at least one manifest version (valid or not; a
        folder without one holds nothing a reader may use). [] for a topic not in the store."""
        found = []
        for name, info in self._list(self.topic_path(topic), files=False):
            if info.get("type") == "directory" and name.isdigit() and str(int(name)) == name:
                if self.manifest_versions(topic, int(name)):
                    found.append(int(name))
        return sorted(found)

    def _list(self, folder: str, *, files: bool = True) -> list[tuple[str, dict[str, Any]]]:
        """(name, info) of the entries of `folder` (files only by default), fresh from the store;
        an absent folder is empty."""
        with self._remote(f"listing of {folder}"):
            self.fs.invalidate_cache(folder)
            try:
                entries = self.fs.ls(folder, detail=True)
            except FileNotFoundError:
                return []
        out = []
        for info in entries:
            if files and info.get("type") != "file":
                continue
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            out.append((name, info))
        return out


def offset_for_timestamp(manifest: PartitionManifest, timestamp_ms: int,
                         with_reader: Callable[[RemoteSegment, Callable[[SegmentReader], Any]], Any]) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of `manifest`'s segments at or after `timestamp_ms`
    and at or after its log start, or None, with `with_reader(segment, read)` calling `read` on a
    reader of the segment (the store's own, or the broker's through its chunk cache). Segments
    whose max timestamp is older are not read; in the first one that may hold the answer, its
    time index bounds the scan."""
    for segment in manifest.prune(manifest.log_start_offset, None, timestamp_ms, None):
        found = with_reader(segment, lambda reader: reader.offset_for_timestamp(timestamp_ms, manifest.log_start_offset))
        if found is not None:
            return found
    return None


def validated_range(reader: SegmentReader, start_offset: int, end_offset: int | None,
                    max_bytes: int | None) -> tuple[int, bytes]:
    """`read_batches` over any reader (the broker's goes through its chunk cache): the byte
    position of the first batch returned (the segment's size if none) and the batches. They are
    framed while scanning and each is validated only when it is to be returned, so a bad batch
    past the range does not fail the read."""
    found = reader.find_position(start_offset)
    if found is None:
        return reader.size, b""
    parts: list[memoryview] = []
    total = 0
    try:
        for batch in reader.stored_batches(found[0], verify_from_offset=FRAME_ONLY):
            if end_offset is not None and batch.header.base_offset >= end_offset:
                break
            if max_bytes is not None and parts and total + len(batch.data) > max_bytes:
                break
            try:
                record.validate_batch(batch.data)
            except CorruptMessageError as err:
                raise CorruptMessageError(f"{reader.name}: batch at byte {batch.position}: "
                                          f"{str(err).removeprefix('batch at byte 0: ')}") from err
            parts.append(batch.data)
            total += len(batch.data)
    except CorruptMessageError:
        if not parts:
            raise
        # The intact batches before the bad one are the answer; a read from the bad one fails.
    return found[0], b"".join(parts)


# --- local files ---------------------------------------------------------------------------------

def _local_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as err:
        raise KafkaStorageError(f"cannot stat {path}: {err}") from err


def _read_local(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise KafkaStorageError(f"cannot read {path}: {err}") from err


def _local_metadata(files: SegmentFiles) -> SegmentMetadata:
    try:
        with open(files.log, "rb") as file:
            return SegmentMetadata.from_reader(SegmentReader(file, files.base_offset, name=files.log.name))
    except OSError as err:
        raise KafkaStorageError(f"cannot read {files.log}: {err}") from err


def _fsync_local(paths: list[str], directory: str) -> None:
    """A `file://` store is as durable as the data it replaces: the local copy is deleted once
    the manifest names the upload."""
    for path in [*paths, directory]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create_local_exclusive(folder: str, name: str, data: bytes) -> None:
    """Write a temporary file, fsync it, link it to its name (FileExistsError if taken: the
    link is the compare-and-set), fsync the folder. A crash leaves at most the temporary file."""
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}{_TEMP_SUFFIX}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temp, os.path.join(folder, name))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    _fsync_local([], folder)


def _modified_ms(info: Mapping[str, Any]) -> int | None:
    """When an object was last written, from whatever its filesystem's `info` reports."""
    for key in ("LastModified", "mtime", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return int(value.timestamp() * 1000)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value * 1000)  # POSIX seconds
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return _modified_ms({key: datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))})
    return None


def _s3_filesystem(options: dict[str, Any]) -> AbstractFileSystem:
    region = options.pop("region", None)
    connect_timeout_s = options.pop("connect_timeout_s", None)
    read_timeout_s = options.pop("read_timeout_s", None)
    max_attempts = options.pop("max_attempts", S3_MAX_ATTEMPTS)
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    config_kwargs = dict(options.pop("config_kwargs", None) or {})
    if region is not None:
        client_kwargs.setdefault("region_name", region)
    if connect_timeout_s is not None:
        config_kwargs["connect_timeout"] = connect_timeout_s
    if read_timeout_s is not None:
        config_kwargs["read_timeout"] = read_timeout_s
    # botocore's "max_attempts" counts retries after the first; "total_max_attempts" counts them all.
    config_kwargs.setdefault("retries", {"total_max_attempts": max_attempts, "mode": "standard"})
    # botocore's default CRC32 of every body sent and received (in Python, ~10 % of a ranged
    # read's CPU) repeats what the store already checks: uploads are read back and compared by
    # CRC32C, and every batch read is CRC32C-checked by its reader. Only where S3 demands it.
    config_kwargs.setdefault("request_checksum_calculation", "when_required")
    config_kwargs.setdefault("response_checksum_validation", "when_required")
    # An instance of its own (fsspec caches instances by their arguments) so the retry count set
    # below is not shared; no listing cache, as from_url says.
    fs = fsspec.filesystem("s3", client_kwargs=client_kwargs, config_kwargs=config_kwargs, use_listings_cache=False,
                           skip_instance_cache=True, **options)
    # s3fs wraps botocore's retries in a loop of its own: attempts would multiply. Every
    # RemoteStorageError is retriable, and its callers retry with their own backoff.
    fs.retries = 1
    return fs
