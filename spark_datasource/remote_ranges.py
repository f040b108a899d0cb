"""Batch reads straight from the remote tier (option `remoteStorage.url`; DESIGN.md sections 7 and 8).

Planning (driver): each partition's [start, end) is cut at its manifest's remote log end. Below
it, one `RemoteSegmentPartition` per remote segment that `PartitionManifest.prune` keeps for the
range and the pushed time bounds (a segment whose time span misses them is never opened); at or
above it, the rest goes to the brokers as before (`ranges.split_ranges`, `task.read_offset_range`).
Offsets below the manifest's `log_start_offset` are deleted remotely: they go to the brokers too,
which answer them or report them lost (failOnDataLoss).

Reading (executors): `read_remote_segment` builds its own `RemoteSegmentStore` from the options
and reads the segment's batches with ranged, CRC-validated reads (`read_batches`, a bounded
amount per read), decodes them with the consumer's decoder (`decode_fetched`: compacted batches
keep their offsets, so gaps need nothing more) and turns them into rows with `schema.to_rows`, as
a broker fetch is. No byte goes through a broker.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from spark_datasource.ranges import OffsetRange

if TYPE_CHECKING:
    from spark_datasource.options import SourceOptions
    from tiered_storage import PartitionManifest, RemoteSegment, RemoteSegmentStore

log = logging.getLogger(__name__)

# Bytes of `.log` one ranged read asks for (the first batch comes whole however large it is).
REMOTE_READ_BYTES = 8 << 20


class RemoteSegmentPartition(InputPartition):
    """One Spark task's work: the records of `range` held by one remote segment. Picklable."""

    def __init__(self, offset_range: OffsetRange, segment: "RemoteSegment") -> None:
        super().__init__(offset_range)
        self.range = offset_range
        self.segment = segment


def remote_store(options: "SourceOptions") -> "RemoteSegmentStore":
    """The store the options name (driver or executor: each builds its own)."""
    from tiered_storage import RemoteSegmentStore

    assert options.remote_storage_url is not None
    return RemoteSegmentStore.from_url(options.remote_storage_url, dict(options.remote_storage_options))


def split_at_remote_end(offset_range: OffsetRange, manifest: "PartitionManifest", time_low_ms: int | None,
                        time_high_ms: int | None) -> tuple[list[RemoteSegmentPartition], OffsetRange]:
    """`offset_range` as remote segment partitions (pruned by offsets and the time bounds, ms,
    inclusive; None: open) and the range left for the brokers (possibly empty)."""
    start, end = offset_range.start, offset_range.end
    remote_low = max(start, manifest.log_start_offset)
    remote_high = min(end, manifest.log_end_offset)
    if not manifest.segments or start < manifest.log_start_offset or remote_low >= remote_high:
        # Nothing remote, or the range starts below the remote log start: the brokers answer
        # (or report the loss) for the whole range rather than leave a hole in the middle.
        return [], offset_range
    parts = []
    for segment in manifest.prune(remote_low, remote_high, time_low_ms, time_high_ms):
        lo, hi = max(remote_low, segment.base_offset), min(remote_high, segment.next_offset)
        if lo < hi:
            parts.append(RemoteSegmentPartition(
                OffsetRange(offset_range.topic, offset_range.partition, lo, hi), segment))
    return parts, OffsetRange(offset_range.topic, offset_range.partition, remote_high, end)


def plan_remote(options: "SourceOptions", ranges: list[OffsetRange], time_low_ms: int | None,
                time_high_ms: int | None) -> tuple[list[RemoteSegmentPartition], list[OffsetRange]]:
    """Remote segment partitions for `ranges` from each partition's current manifest, and the
    ranges left for the brokers."""
    store = remote_store(options)
    remote: list[RemoteSegmentPartition] = []
    rest: list[OffsetRange] = []
    for r in ranges:
        if r.size == 0:
            continue
        manifest = store.load_manifest(r.topic, r.partition)
        parts, tail = split_at_remote_end(r, manifest, time_low_ms, time_high_ms)
        log.info("%s-%d [%d, %d): %d of %d remote segment(s) planned, [%d, %d) from the brokers", r.topic,
                 r.partition, r.start, r.end, len(parts), len(manifest.segments), tail.start, tail.end)
        remote.extend(parts)
        rest.append(tail)
    return remote, rest


def read_remote_segment(options: "SourceOptions", part: RemoteSegmentPartition) -> Iterator[pa.RecordBatch]:
    """The rows of `part.range` from its remote segment, read from the object store directly.
    RemoteStorageError if the store fails (RemoteObjectNotFoundError: retention removed the
    segment since planning; the query can be run again), CorruptRecordError for a bad batch."""
    from broker.client.consumer import decode_fetched
    from spark_datasource.schema import arrow_schema, to_rows

    store = remote_store(options)
    schema = arrow_schema(options.include_headers)
    topic, partition, end = part.range.topic, part.range.partition, part.range.end
    position = part.range.start
    while position < end:
        data = store.read_batches(topic, partition, part.segment, position, end, max_bytes=REMOTE_READ_BYTES)
        if not data:
            return  # the segment ends before `end`: a compaction gap
        decoded = decode_fetched((topic, partition), data, position, end, True)
        chunk = []
        for batch, _ in decoded.batches:
            if batch.first_offset >= end:
                break
            if batch.next_offset > end:
                batch = batch.split(_rows_before(batch, end))[0]
            if batch.num_rows:
                chunk.append(batch)
        yield from to_rows(topic, partition, chunk, schema)
        if decoded.corrupt is not None and decoded.position < end:
            raise decoded.corrupt  # a batch the range needs failed its checks
        if decoded.position <= position:
            return  # nothing past `position` in this segment: the range ends in a compaction gap
        position = decoded.position


def _rows_before(batch, end: int) -> int:
    import numpy as np

    if batch.offsets is None:
        return end - batch.first_offset
    return int(np.searchsorted(batch.offsets.to_numpy(), end))
