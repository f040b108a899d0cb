"""Batch reads straight from the remote tier (option `remoteStorage.url`; DESIGN.md sections 7 and 8).

Planning (driver): each partition's [start, end) is cut at its manifest's remote log end. Below
it, one `RemoteSegmentPartition` per remote segment that `PartitionManifest.prune` keeps for the
range and the pushed time bounds (a segment whose time span misses them is never opened); at or
above it, the rest goes to the brokers as before (`ranges.split_ranges`, `task.read_offset_range`).
Offsets below the manifest's `log_start_offset` are deleted remotely: they go to the brokers too,
which answer them or report them lost (failOnDataLoss). A remote segment's range is then split
like a broker range (`split_partitions`, with `ranges.split_each`: at most
`maxRecordsPerPartition` offsets per task, at least `minPartitions` tasks in all): each piece is
another `RemoteSegmentPartition` of the same segment, read from its first offset to its end. The
cuts are offset arithmetic; a compacted segment's gaps only make some pieces smaller.

`remoteStorage.only` (`RemoteOffsetReader`): the driver plans from the store alone, with no
broker. The subscription's partitions are the store's (`RemoteSegmentStore.topics` and
`.partitions`: numeric folders under `{root}/{topic}/` holding a manifest); earliest and latest
are each manifest's `log_start_offset` and `log_end_offset`; the manifests loaded for the
offsets are the ones planned from, so both agree.

Reading (executors): `read_remote_segment` builds its own `RemoteSegmentStore` from the options
and reads the segment's batches through one SegmentReader for the whole task (indexes read once;
ranged GETs of 8 MiB growing to 64 MiB while it reads on: a GET's latency is the cost), a bounded
amount at a time, decodes and validates them (CRC included) once with the consumer's decoder (`decode_fetched`: compacted batches
keep their offsets, so gaps need nothing more) and turns them into rows with `schema.to_rows`, as
a broker fetch is. No byte goes through a broker.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from spark_datasource.offsets import OffsetReader
from spark_datasource.options import EARLIEST, LATEST, InvalidOptionError
from spark_datasource.ranges import OffsetRange, RangePartition, split_each

if TYPE_CHECKING:
    from broker.log.segment_reader import SegmentReader
    from spark_datasource.options import SourceOptions
    from tiered_storage import PartitionManifest, RemoteSegment, RemoteSegmentStore

log = logging.getLogger(__name__)

# Bytes of `.log` one ranged read asks for (the first batch comes whole however large it is).
REMOTE_READ_BYTES = 8 << 20
# The task's one reader reads ahead in ranged GETs from this size, doubling to the max while it
# reads on: a 64 MiB segment costs a handful of GETs (a GET's latency, not its size, is the cost).
REMOTE_WINDOW_MIN_BYTES = 8 << 20
REMOTE_WINDOW_MAX_BYTES = 64 << 20


class RemoteSegmentPartition(InputPartition):
    """One Spark task's work: the records of `range` held by one remote segment. Picklable."""

    def __init__(self, offset_range: OffsetRange, segment: "RemoteSegment") -> None:
        super().__init__(offset_range)
        self.range = offset_range
        self.segment = segment


def remote_store(options: "SourceOptions") -> "RemoteSegmentStore":
    """The store the options name (driver or executor: each process builds its own, once: an S3
    client costs a tenth of a second or more, and Spark reuses its Python workers across tasks)."""
    assert options.remote_storage_url is not None
    return _store(options.remote_storage_url, tuple(sorted(options.remote_storage_options.items())))


@functools.lru_cache(maxsize=8)
def _store(url: str, store_options: tuple[tuple[str, str], ...]) -> "RemoteSegmentStore":
    from tiered_storage import RemoteSegmentStore

    return RemoteSegmentStore.from_url(url, dict(store_options))


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
                time_high_ms: int | None, manifests: "dict[tuple[str, int], PartitionManifest] | None" = None,
                ) -> tuple[list[RemoteSegmentPartition], list[OffsetRange]]:
    """Remote segment partitions for `ranges` from each partition's manifest (from `manifests`
    if given, else the current one in the store), and the ranges left for the brokers."""
    store = remote_store(options) if manifests is None else None
    remote: list[RemoteSegmentPartition] = []
    rest: list[OffsetRange] = []
    for r in ranges:
        if r.size == 0:
            continue
        if manifests is not None:
            manifest = manifests[(r.topic, r.partition)]
        else:
            assert store is not None
            manifest = store.load_manifest(r.topic, r.partition)
        parts, tail = split_at_remote_end(r, manifest, time_low_ms, time_high_ms)
        log.info("%s-%d [%d, %d): %d of %d remote segment(s) planned, [%d, %d) from the brokers", r.topic,
                 r.partition, r.start, r.end, len(parts), len(manifest.segments), tail.start, tail.end)
        remote.extend(parts)
        rest.append(tail)
    return remote, rest


def split_partitions(remote: list[RemoteSegmentPartition], rest: list[OffsetRange], min_partitions: int | None,
                     max_records: int | None) -> list[InputPartition]:
    """Remote segment partitions and broker ranges cut into Spark tasks by one rule
    (`ranges.split_each`: `maxRecordsPerPartition`, and `minPartitions` over all of them), in
    (topic, partition, offset) order. A remote segment's pieces stay partitions of that segment."""
    cuts = split_each([p.range for p in remote] + rest, min_partitions, max_records)
    parts: list[InputPartition] = [RemoteSegmentPartition(piece, p.segment)
                                   for p, cut in zip(remote, cuts) for piece in cut]
    parts.extend(RangePartition(piece) for cut in cuts[len(remote):] for piece in cut)
    return sorted(parts, key=lambda p: (p.range.topic, p.range.partition, p.range.start))


TopicPartition = tuple[str, int]


class RemoteOffsetReader(OffsetReader):
    """`offsets.OffsetReader` answered from the remote store's manifests, with no broker
    (`remoteStorage.only`): the subscription's partitions are the store's, EARLIEST and LATEST
    each manifest's `log_start_offset` and `log_end_offset`; JSON offsets are resolved and checked
    by OffsetReader's own code. Asking anything of a broker (the time lookups, which the options
    refuse with remoteStorage.only) is a bug. The manifests read are kept (`manifests`) for
    planning, so that offsets and segments come from the same versions."""

    def __init__(self, options: "SourceOptions") -> None:
        super().__init__(options)
        self.store = remote_store(options)
        self.manifests: dict[TopicPartition, PartitionManifest] = {}

    @property
    def admin(self):  # noqa: ANN201 - never returns
        raise AssertionError("remoteStorage.only: a broker was about to be contacted")

    def topic_partitions(self, missing_ok: bool) -> list[TopicPartition]:
        """The subscription's partitions in the store. A named topic (or assigned partition) the
        store does not hold is an error unless `missing_ok`."""
        opts, store = self.options, self.store
        if opts.subscribe_pattern is not None:
            topics = [t for t in store.topics() if opts.topic_matches(t) and not t.startswith("__")]
            return [(t, p) for t in topics for p in store.partitions(t)]
        wanted = list(opts.subscribe) if opts.subscribe else sorted(opts.assign or {})
        found = {t: store.partitions(t) for t in wanted}
        missing = [t for t in wanted if not found[t]]
        if missing and not missing_ok:
            raise InvalidOptionError(
                f"unknown topic(s) {', '.join(missing)} in option {'subscribe' if opts.subscribe else 'assign'}: "
                f"the remote store has no partition with a manifest under "
                f"{', '.join(store.topic_path(t) + '/' for t in missing)} (remoteStorage.only=true reads only "
                "tiered partitions)")
        if opts.assign is None:
            return [(t, p) for t in wanted for p in found[t]]
        out = []
        for t in wanted:
            absent = [p for p in opts.assign[t] if p not in found[t]]
            if absent and found[t] and not missing_ok:
                raise InvalidOptionError(f"option 'assign': partition {t}-{absent[0]} is not in the remote store "
                                         f"(tiered partitions of {t!r}: {found[t]}; remoteStorage.only=true)")
            out.extend((t, p) for p in opts.assign[t] if p in found[t])
        return out

    def manifest(self, tp: TopicPartition) -> "PartitionManifest":
        if tp not in self.manifests:
            self.manifests[tp] = self.store.load_manifest(*tp)
        return self.manifests[tp]

    def _list(self, positions: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        out = {}
        for tp, position in positions.items():
            if position not in (EARLIEST, LATEST):
                raise AssertionError(f"remoteStorage.only: a time lookup ({position}) needs a broker")
            m = self.manifest(tp)
            out[tp] = m.log_start_offset if position == EARLIEST else m.log_end_offset
        return out


def check_remote_start(options: "SourceOptions", offset_range: OffsetRange, log_start: int) -> OffsetRange:
    """remoteStorage.only: a range starting below the remote log start wants deleted offsets:
    DataLossError (failOnDataLoss=true), or the range from the log start on (false)."""
    from broker.errors import DataLossError

    r = offset_range
    if r.start >= min(log_start, r.end):
        return r
    gone_to = min(log_start, r.end)
    message = (f"{r.topic}-{r.partition}: offsets {r.start}..{gone_to - 1} were deleted from the remote store "
               f"(retention) before they were read; the remote log now starts at {log_start}")
    if options.fail_on_data_loss:
        raise DataLossError(message + " (failOnDataLoss=true; set it to false to skip them)",
                            r.topic, r.partition, r.start, gone_to)
    log.warning("%s; skipping %d offsets (failOnDataLoss=false)", message, gone_to - r.start)
    return OffsetRange(r.topic, r.partition, gone_to, r.end)


def read_remote_segment(options: "SourceOptions", part: RemoteSegmentPartition) -> Iterator[pa.RecordBatch]:
    """The rows of `part.range` from its remote segment, read from the object store directly.
    RemoteStorageError if the store fails (RemoteObjectNotFoundError: retention removed the
    segment since planning; the query can be run again), CorruptRecordError for a bad batch."""
    from broker.client.consumer import decode_fetched
    from spark_datasource.schema import arrow_schema, to_rows

    from broker.log.index_file import CorruptIndexError

    store = remote_store(options)
    schema = arrow_schema(options.include_headers)
    topic, partition, end = part.range.topic, part.range.partition, part.range.end

    def open_reader(indexes: bool = True) -> "SegmentReader":
        # One reader for the whole task: its indexes are read once, its window grows as it reads on.
        return store.open_reader(topic, partition, part.segment, indexes=indexes,
                                 min_read_bytes=REMOTE_WINDOW_MIN_BYTES, max_read_bytes=REMOTE_WINDOW_MAX_BYTES)

    reader = open_reader()
    position = part.range.start
    while position < end:
        # Framed here, validated once by the decoder (check_crcs), as a broker fetch is.
        try:
            data = reader.read_range(position, end, max_bytes=REMOTE_READ_BYTES, validate=False)
        except CorruptIndexError as err:  # an entry points at the wrong batch: the `.log` alone answers
            log.warning("%s: %s; reading without the index", part.segment.log.name, err)
            reader = open_reader(indexes=False)
            data = reader.read_range(position, end, max_bytes=REMOTE_READ_BYTES, validate=False)
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
