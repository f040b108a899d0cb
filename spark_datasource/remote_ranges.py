"""Batch reads straight from the remote tier (option `remoteStorage.url`; docs/architecture.md, Spark read from the remote tier).

Planning (driver): each partition's [start, end) is cut at its manifest's remote log end. Below
it, the remote segments that `PartitionManifest.prune` keeps for the range make
`RemoteRangePartition`s, one per run of kept segments next to each other in the manifest (a
range that starts or ends inside a segment keeps it; a compacted manifest may skip some); at or
above it, the rest goes to
the brokers as before (`ranges.split_ranges`, `task.read_offset_range`). Offsets below the
manifest's `log_start_offset` are deleted remotely: they go to the brokers too, which answer
them or report them lost (failOnDataLoss). Remote ranges and broker ranges are then cut into
tasks by one rule (`split_partitions`, with `ranges.split_each`: at most `maxRecordsPerPartition`
offsets per task, at least `minPartitions` tasks in all), so a partition's history is as many
tasks whether the brokers or the store hold it, as in the Kafka source; each piece keeps the
segments it overlaps. The cuts are offset arithmetic; a compacted segment's gaps only make some
pieces smaller. (A task per segment instead cost Spark ~60 ms per task on its Python worker
protocol, and lost the read-ahead from one segment into the next.)

`remoteStorage.only` (`RemoteOffsetReader`): the driver plans from the store alone, with no
broker. The subscription's partitions are the store's (`RemoteSegmentStore.topics` and
`.partitions`: numeric folders under `{root}/{topic}/` holding a manifest); earliest and latest
are each manifest's `log_start_offset` and `log_end_offset`, a time the first remote record at
or after it (`RemoteSegmentStore.offset_for_timestamp`); the manifests loaded for the offsets
are the ones planned from, so both agree. Partitions of one topic with two topic ids (a topic
deleted and created again, remote data left behind) are refused: without a broker nothing says
which is current. With brokers, a manifest whose topic id is not theirs is not read at all.

Reading (executors): `read_remote_range` builds its own `RemoteSegmentStore` from the options
(once per Python worker) and reads each segment through a SegmentReader whose source is a
`read_ahead.ReadAhead`: ranged GETs of `READ_AHEAD_BYTES`, the next one fetched on a background
thread while this one is decoded, and the next segment's indexes and first window fetched while
this segment is read. One sequential scan frames the batches (indexes used once, to find the
first); `DECODE_BYTES` at a time are decoded and validated (CRC included) by the consumer's
decoder (`decode_fetched`: compacted batches keep their offsets, so gaps need nothing more) and
turned into rows with `schema.to_rows`, as a broker fetch is. No byte goes through a broker.

read_committed (`kafka.isolation.level`, the default): the tier is read only below its stable
offset (`tier_stable_offset`: the first offset of a transaction still open at the remote log end,
from the last segment's producer snapshot); the rest goes to the brokers, which know how those
transactions end. Below it every transaction ended inside the tier, so the aborted ones are in
the tier's transaction indexes (`tier_aborted`, read on the driver at planning); each task drops
their batches with the consumer's `AbortedFilter`, as a read_committed fetch does, and markers
are skipped either way.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from client.decoder import AbortedFilter, decode_fetched
from common.topic_partition import TopicPartition
from protocol import READ_COMMITTED
from segment_format import producer_snapshot
from segment_format.segment_reader import FRAME_ONLY
from spark_datasource.offsets import OffsetReader
from spark_datasource.options import EARLIEST, LATEST, InvalidOptionError
from spark_datasource.ranges import OffsetRange, RangePartition, split_each
from spark_datasource.schema import arrow_schema, to_rows

if TYPE_CHECKING:
    from segment_format.manifest import PartitionManifest, RemoteSegment
    from segment_format.txn_index import AbortedTxn
    from segment_format.segment_reader import SegmentReader
    from spark_datasource.options import SourceOptions
    from tiered_storage import RemoteSegmentStore

log = logging.getLogger(__name__)

# Bytes of `.log` per ranged GET. The next one is fetched while this one is decoded
# (`read_ahead.ReadAhead`): a GET's latency, not its size, is the cost, and a task holds at most
# three windows (the one decoded, the one ahead, the next segment's first).
READ_AHEAD_BYTES = 32 << 20
# Framed batches decoded, validated and handed to Spark at a time.
DECODE_BYTES = 8 << 20


class RemoteRangePartition(InputPartition):
    """One Spark task's work: the records of `range` held by `segments`, remote segments of one
    partition next to each other in its manifest (none pruned between them), in offset order.
    Picklable."""

    def __init__(self, offset_range: OffsetRange, segments: "tuple[RemoteSegment, ...]",
                 aborted: "tuple[AbortedTxn, ...]" = ()) -> None:
        super().__init__(offset_range)
        self.range = offset_range
        self.segments = segments
        self.aborted = aborted  # read_committed: the tier's aborted transactions that may touch the range

    def aborted_filter(self) -> AbortedFilter:
        """read_committed's filter for this range: the aborted transactions overlapping it (those
        whose ABORT marker comes before it are over: their producers' later batches are kept)."""
        r = self.range
        return AbortedFilter((t.producer_id, t.first_offset) for t in self.aborted
                             if t.last_offset >= r.start and t.first_offset < r.end)


def remote_store(options: "SourceOptions") -> "RemoteSegmentStore":
    """The store the options name (driver or executor: each process builds its own, once: an S3
    client costs a tenth of a second or more, and Spark reuses its Python workers across tasks)."""
    assert options.remote_storage_url is not None
    return _store(options.remote_storage_url, tuple(sorted(options.remote_storage_options.items())))


@functools.lru_cache(maxsize=8)
def _store(url: str, store_options: tuple[tuple[str, str], ...]) -> "RemoteSegmentStore":
    from tiered_storage import RemoteSegmentStore

    return RemoteSegmentStore.from_url(url, dict(store_options))


def split_at_remote_end(offset_range: OffsetRange, manifest: "PartitionManifest", remote_end: int | None = None,
                        aborted: "tuple[AbortedTxn, ...]" = ()) -> tuple[list[RemoteRangePartition], OffsetRange]:
    """`offset_range` as remote range partitions, one per run of the manifest's segments next to
    each other that hold its offsets below `remote_end` (default: the remote log end), and the
    range left for the brokers (possibly empty)."""
    start, end = offset_range.start, offset_range.end
    remote_low = max(start, manifest.log_start_offset)
    remote_high = min(end, manifest.log_end_offset if remote_end is None else remote_end)
    if not manifest.segments or start < manifest.log_start_offset or remote_low >= remote_high:
        # Nothing remote, or the range starts below the remote log start: the brokers answer
        # (or report the loss) for the whole range rather than leave a hole in the middle.
        return [], offset_range
    kept = manifest.prune(remote_low, remote_high)
    position = {segment.base_offset: i for i, segment in enumerate(manifest.segments)}
    runs: list[list[RemoteSegment]] = []
    for segment in kept:
        if runs and position[segment.base_offset] == position[runs[-1][-1].base_offset] + 1:
            runs[-1].append(segment)
        else:
            runs.append([segment])
    parts = []
    for run in runs:
        lo, hi = max(remote_low, run[0].base_offset), min(remote_high, run[-1].next_offset)
        if lo < hi:
            parts.append(RemoteRangePartition(offset_range.within(lo, hi), tuple(run), aborted))
    return parts, offset_range.within(remote_high, end)


def plan_remote(options: "SourceOptions", ranges: list[OffsetRange],
                manifests: "dict[tuple[str, int], PartitionManifest] | None" = None,
                topic_ids: dict[str, str] | None = None) -> tuple[list[RemoteRangePartition], list[OffsetRange]]:
    """Remote range partitions for `ranges` from each partition's manifest (from `manifests`
    if given, else the current one in the store), and the ranges left for the brokers. With
    `topic_ids` (the brokers' topic ids), a manifest of another incarnation of the topic (one
    deleted and created again, whose remote data outlived it) is not read: the brokers answer."""
    from tiered_storage import RemoteTopicIdMismatchError

    store = remote_store(options) if manifests is None else None
    remote: list[RemoteRangePartition] = []
    rest: list[OffsetRange] = []
    for r in ranges:
        if r.size == 0:
            continue
        if manifests is not None:
            manifest = manifests[(r.topic, r.partition)]
        else:
            assert store is not None
            try:
                manifest = store.load_manifest(r.topic, r.partition, (topic_ids or {}).get(r.topic))
            except RemoteTopicIdMismatchError as err:
                log.warning("%s: not read; [%d, %d) from the brokers", err, r.start, r.end)
                rest.append(r)
                continue
        if options.isolation_level == READ_COMMITTED:
            tier = store if store is not None else remote_store(options)
            stable = tier_stable_offset(tier, r.topic, r.partition, manifest)
            parts, tail = split_at_remote_end(r, manifest, stable, tier_aborted(tier, r.topic, r.partition, manifest,
                                                                               r.start, stable))
        else:
            parts, tail = split_at_remote_end(r, manifest)
        log.info("%s-%d [%d, %d): %d of %d remote segment(s) planned, [%d, %d) from the brokers", r.topic,
                 r.partition, r.start, r.end, sum(len(p.segments) for p in parts), len(manifest.segments),
                 tail.start, tail.end)
        remote.extend(parts)
        rest.append(tail)
    return remote, rest


def split_partitions(remote: list[RemoteRangePartition], rest: list[OffsetRange], min_partitions: int | None,
                     max_records: int | None) -> list[InputPartition]:
    """Remote range partitions and broker ranges cut into Spark tasks by one rule
    (`ranges.split_each`: `maxRecordsPerPartition`, and `minPartitions` over all of them), in
    (topic, partition, offset) order. Each piece of a remote range keeps the segments it overlaps."""
    cuts = split_each([p.range for p in remote] + rest, min_partitions, max_records)
    parts: list[InputPartition] = [
        RemoteRangePartition(piece, tuple(s for s in p.segments if s.base_offset < piece.end and s.next_offset > piece.start),
                             p.aborted)
        for p, cut in zip(remote, cuts) for piece in cut]
    parts.extend(RangePartition(piece) for cut in cuts[len(remote):] for piece in cut)
    return sorted(parts, key=lambda p: (p.range.topic, p.range.partition, p.range.start))


class RemoteOffsetReader(OffsetReader):
    """`offsets.OffsetReader` answered from the remote store's manifests, with no broker
    (`remoteStorage.only`): the subscription's partitions are the store's, EARLIEST and LATEST
    each manifest's `log_start_offset` and `log_end_offset`, a time the first remote record at or
    after it (`RemoteSegmentStore.offset_for_timestamp`, as a broker answers below its local log
    start); JSON offsets and times are resolved and checked by OffsetReader's own code. Asking
    anything of a broker is a bug. The manifests read are kept (`manifests`) for planning, so
    that offsets and segments come from the same versions."""

    def __init__(self, options: "SourceOptions") -> None:
        super().__init__(options)
        self.store = remote_store(options)
        self.manifests: dict[TopicPartition, PartitionManifest] = {}
        self._topic_ids: dict[str, tuple[int, str]] = {}  # topic -> (first partition read with an id, that id)

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
        """The partition's manifest (loaded once). RemoteTopicIdMismatchError if another
        partition of the topic read before is of another topic id: the store holds two
        incarnations of the topic, and there is no broker to say which one is current."""
        from tiered_storage import RemoteTopicIdMismatchError

        if tp not in self.manifests:
            manifest = self.store.load_manifest(*tp)
            topic = tp[0]
            if manifest.topic_id:
                partition, topic_id = self._topic_ids.setdefault(topic, (tp[1], manifest.topic_id))
                if topic_id != manifest.topic_id:
                    raise RemoteTopicIdMismatchError(
                        f"{self.store.topic_path(topic)}: partition {tp[1]} is of topic id {manifest.topic_id} but "
                        f"partition {partition} of {topic_id}: the store holds two incarnations of {topic!r} "
                        "(a topic deleted and created again); read the current one's partitions with 'assign', "
                        "or delete the stale ones")
            self.manifests[tp] = manifest
        return self.manifests[tp]

    def _list_offsets(self, positions: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        out = {}
        for tp, position in positions.items():
            m = self.manifest(tp)
            if position == EARLIEST:
                out[tp] = (m.log_start_offset, -1)
            elif position == LATEST:
                out[tp] = (m.log_end_offset if self.options.isolation_level != READ_COMMITTED
                           else tier_stable_offset(self.store, *tp, m), -1)
            else:
                out[tp] = self.store.offset_for_timestamp(*tp, m, position) or (-1, -1)
        return out


def tier_stable_offset(store: "RemoteSegmentStore", topic: str, partition: int, manifest: "PartitionManifest") -> int:
    """Where read_committed reads of the tier stop: the first offset of the first transaction
    still open at the remote log end (the last segment's producer snapshot says), else the
    remote log end. Below it every transaction with records there ended before the remote log
    end, so its ABORT marker, if any, is in the tier's transaction indexes; the rest is read from
    the brokers, which know how it ended (remoteStorage.only: not read until it is tiered)."""
    if not manifest.segments:
        return manifest.log_end_offset
    last = manifest.segments[-1]
    data = store.read_optional_object(topic, partition, last, "snapshot")
    if data is None:  # uploaded before producer snapshots existed: before transactions did too
        return manifest.log_end_offset
    opened = producer_snapshot.open_transactions(data, f"{store.partition_path(topic, partition)} snapshot at "
                                                       f"{last.next_offset}")
    return min([manifest.log_end_offset, *opened])


def tier_aborted(store: "RemoteSegmentStore", topic: str, partition: int, manifest: "PartitionManifest",
                 start: int, end: int) -> "tuple[AbortedTxn, ...]":
    """The tier's aborted transactions that may touch [start, end): from the transaction indexes
    of the segment holding `start` and every later one (an ABORT marker may come segments after
    its transaction's first records)."""
    found = []
    for segment in manifest.segments:
        if segment.next_offset <= start or segment.object_of("txnindex") is None:
            continue
        found += [t for t in store.read_txn_index(topic, partition, segment)
                  if t.last_offset >= start and t.first_offset < end]
    return tuple(found)


def check_remote_start(options: "SourceOptions", offset_range: OffsetRange, log_start: int) -> OffsetRange:
    """remoteStorage.only: a range starting below the remote log start wants deleted offsets:
    DataLossError (failOnDataLoss=true), or the range from the log start on (false)."""
    from common.errors import DataLossError

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
    return r.within(gone_to, r.end)


def read_remote_range(options: "SourceOptions", part: RemoteRangePartition) -> Iterator[pa.RecordBatch]:
    """The rows of `part.range` from its remote segments, read from the object store directly.
    RemoteStorageError if the store fails (RemoteObjectNotFoundError: retention removed a
    segment since planning; the query can be run again), CorruptRecordError for a bad batch."""
    from tiered_storage.read_ahead import ReadAhead

    store = remote_store(options)
    schema = arrow_schema(options.include_headers)
    topic, partition = part.range.topic, part.range.partition
    bounds = [(max(part.range.start, s.base_offset), min(part.range.end, s.next_offset)) for s in part.segments]
    aborted = part.aborted_filter() if options.isolation_level == READ_COMMITTED else None
    executor = ThreadPoolExecutor(1, thread_name_prefix=f"pymq-read-ahead-{topic}-{partition}")

    def open_segment(i: int, indexes: bool = True) -> "tuple[SegmentReader, ReadAhead]":
        """Segment i's reader (its indexes read here, on the read-ahead thread when opened
        ahead), its first window already on the way, and its read-ahead."""
        segment = part.segments[i]
        ahead = ReadAhead(functools.partial(store.read_range, topic, partition, segment), segment.size_bytes,
                          READ_AHEAD_BYTES, executor)
        reader = store.open_reader(topic, partition, segment, indexes=indexes, source=ahead,
                                   min_read_bytes=READ_AHEAD_BYTES, max_read_bytes=READ_AHEAD_BYTES)
        index = reader.offset_index
        ahead.prime(index.position_of(bounds[i][0])[1] if index is not None else 0)
        return reader, ahead

    try:
        opening = executor.submit(open_segment, 0)
        for i, (low, high) in enumerate(bounds):
            reader, ahead = opening.result()
            if i + 1 < len(bounds):  # the next segment's indexes and first window while this one is read
                opening = executor.submit(open_segment, i + 1)
            yield from _read_segment(reader, topic, partition, low, high, schema,
                                     reopen=lambda i=i: open_segment(i, False)[0], aborted=aborted)
            ahead.close()  # a window past the range's end (it ended mid-segment) is not fetched if still queued
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _read_segment(reader: "SegmentReader", topic: str, partition: int, low: int, high: int, schema: pa.Schema,
                  reopen: "Callable[[], SegmentReader]", aborted: AbortedFilter | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of offsets [low, high) of one segment: its batches framed in one sequential scan
    (no index lookup after the first), decoded and validated (CRC included) `DECODE_BYTES` at a
    time by the consumer's decoder (`decode_fetched`: compacted batches keep their offsets, so
    gaps need nothing more) and turned into rows by `schema.to_rows`, as a broker fetch is."""
    from segment_format.index_file import CorruptIndexError

    try:
        found = reader.find_position(low)
    except CorruptIndexError as err:  # an entry points at the wrong batch: the `.log` alone answers
        log.warning("%s: %s; reading without the index", reader.name, err)
        reader = reopen()
        found = reader.find_position(low)
    if found is None:
        return  # the segment ends before `low`: a compaction gap
    position = low
    chunk: list[memoryview] = []
    size = 0
    for batch in reader.stored_batches(found[0], verify_from_offset=FRAME_ONLY):
        if batch.header.base_offset >= high:
            break
        chunk.append(batch.data)
        size += len(batch.data)
        if size >= DECODE_BYTES:
            position = yield from _decode(topic, partition, b"".join(chunk), position, high, schema, aborted)
            chunk, size = [], 0
    if chunk:
        yield from _decode(topic, partition, b"".join(chunk), position, high, schema, aborted)


def _decode(topic: str, partition: int, data: bytes, position: int, high: int,
            schema: pa.Schema, aborted: AbortedFilter | None = None) -> Generator[pa.RecordBatch, None, int]:
    """Rows of the framed batches in `data` from offset `position` to `high`; returns the offset
    after the last batch. CorruptRecordError (after the rows before it) for a batch that fails
    its checks."""
    decoded = decode_fetched((topic, partition), data, position, high, True, aborted)
    chunk = []
    for batch, _ in decoded.batches:
        if batch.first_offset >= high:
            break
        if batch.next_offset > high:
            batch = batch.split(_rows_before(batch, high))[0]
        if batch.num_rows:
            chunk.append(batch)
    yield from to_rows(topic, partition, chunk, schema)
    if decoded.corrupt is not None:
        raise decoded.corrupt  # every batch here is one the range needs
    return decoded.position


def _rows_before(batch, end: int) -> int:
    import numpy as np

    if batch.offsets is None:
        return end - batch.first_offset
    return int(np.searchsorted(batch.offsets.to_numpy(), end))
