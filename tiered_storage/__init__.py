"""Tiered storage: sealed segments in object storage, listed by a per-partition manifest (docs/architecture.md, Tiered storage).

Brokers upload each sealed segment here and delete their local copy only once a committed
manifest names the upload. Brokers serving old offsets, Spark executors and users read the same
objects directly through fsspec (`file://`, `s3://` via s3fs, any fsspec URL), without a broker in
between. This docstring is the public contract for those readers.

Layout under the store's root URL (e.g. `s3://bucket/pymq`, or `file:///data/pymq-remote`):

    {root}/{topic}/{partition}/
        manifests/manifest-{version:020d}.json          one object per manifest version, never overwritten
        {base_offset:020d}-{upload_id}.log              the segment's record batches (docs/architecture.md, Record batch)
        {base_offset:020d}-{upload_id}.index            its offset index (segment_format/index_file.py)
        {base_offset:020d}-{upload_id}.timeindex        its time index (segment_format/index_file.py)
        {base_offset:020d}-{upload_id}.snapshot         the producer state at its next offset (optional)
        {base_offset:020d}-{upload_id}.txnindex         its aborted transactions (segment_format/txn_index.py;
                                                        only segments holding an ABORT marker have one)

Object names carry the id of the upload attempt: `upload_id` is 16 random
hex digits per attempt, so a crashed or failed attempt never overwrites or shadows a good one.
Only the objects a manifest names are part of the log. A listing of the folder may show others
(attempts in flight, crashed ones, segments retention dropped whose deletion is pending): never
glob `*.log`, always go through the current manifest. `clean_orphans` deletes unnamed objects
once older than a grace period (an hour by default).

The manifest (JSON, UTF-8; full schema and invariants in manifest.py):

    {"format_version": 2, "version": 7, "leader_epoch": 4, "topic": "events", "topic_id": "3f2a...", "partition": 0,
     "log_start_offset": 120,
     "segments": [
       {"format_version": 1, "base_offset": 100, "next_offset": 250,
        "min_timestamp": 1700000000000, "max_timestamp": 1700000060000,
        "size_bytes": 1048500, "record_count": 150, "leader_epochs": [[3, 100]], "crc32c": 2882400018,
        "upload_id": "9f86d081884c7d65",
        "objects": {"log":       {"name": "00000000000000000100-9f86d081884c7d65.log", "size_bytes": 1048500, "crc32c": 2882400018},
                    "index":     {"name": "00000000000000000100-9f86d081884c7d65.index", "size_bytes": 1040, "crc32c": 305419896},
                    "timeindex": {"name": "00000000000000000100-9f86d081884c7d65.timeindex", "size_bytes": 1552, "crc32c": 4023233417}}},
       ...]}

Offsets are int64, timestamps ms since the epoch (-1: none), CRCs CRC32C as unsigned ints, object
names relative to the partition's folder. Segments are sorted by base offset and do not overlap
(gaps are allowed: compaction leaves them); `next_offset` is one past a segment's last offset.
Offsets below `log_start_offset` are deleted even where the first segment still holds them.

Reading a partition (what Spark's reader does):
1. List `{root}/{topic}/{partition}/manifests/`; take the highest `manifest-{version}.json` that
   parses and passes the checks in manifest.py (version and place equal to its name). A version
   that does not is a torn write: use the next lower. Retry the listing if the chosen version is
   gone (garbage collection keeps the three newest).
2. Pick segments by offset and timestamp with `PartitionManifest.prune` (min/max timestamps make
   time filters cheap), read their `.log` objects with ranged reads (`SegmentReader` finds an
   offset's byte position through the `.index`), skip batches below `log_start_offset` and trim
   records to the range. Validate each batch (CRC32C of bytes 21..end) before using it.
3. An object missing under a manifest you hold means retention or a topic deletion removed the
   segment since: read the manifest again.
4. read_committed: skip control batches (attribute bit 5: transaction markers), and drop the
   batches of aborted transactions: `RemoteSegmentStore.collect_aborted_transactions(topic,
   partition, manifest, start, end)` (or `read_txn_index` + `segment_format.txn_index.parse` per
   segment whose manifest entry has a `txnindex` object) gives (producer_id, first_offset) of each;
   a transactional batch (bit 4) of that producer from that offset up to its ABORT marker is
   aborted. Only data below the partition's last stable offset is decided: the tier holds sealed
   segments, but an open transaction may have started in one; its outcome is in a later marker.

Writing (brokers only; one writer per partition, its leader, fenced by its leader epoch): upload a segment as a new attempt
(`RemoteSegmentStore.upload_segment`: streamed, then read back and checked by size and CRC32C),
commit a manifest naming it (`commit_manifest(expected_version, manifest)`: compare-and-set on
the version read; the new version is above every version present; S3's conditional PUT or, on
`file://`, an fsynced temporary file linked to its name, so no reader ever sees it half-written),
and only then delete the local copy. Every version carries the leader epoch of its writer, and a
commit whose epoch is below the current version's is refused (ManifestFencedError): a new leader
commits a version with its epoch before anything else, so a deposed leader that read the latest
version can no longer commit. Retention commits a manifest without the expired segments
(`with_log_start_offset`), then deletes their objects. A crash at any step leaves either the old
manifest with orphans or the new manifest with its objects whole.

Errors: RemoteStorageError (retriable; KAFKA_STORAGE_ERROR on the wire) for every failure of the
store, its subclasses for the named cases (tiered_storage.errors), and the broker's
CorruptMessageError (CORRUPT_MESSAGE) for bytes that fail their checks.
"""
from tiered_storage.errors import (
    ManifestConflictError,
    ManifestFencedError,
    RemoteObjectNotFoundError,
    RemoteStorageError,
    RemoteTopicIdMismatchError,
    UploadVerificationError,
)
from tiered_storage.remote_store import DEFAULT_ORPHAN_GRACE_MS, RemoteSegmentStore

__all__ = [
    "DEFAULT_ORPHAN_GRACE_MS",
    "ManifestConflictError",
    "ManifestFencedError",
    "RemoteObjectNotFoundError",
    "RemoteSegmentStore",
    "RemoteStorageError",
    "RemoteTopicIdMismatchError",
    "UploadVerificationError",
]
