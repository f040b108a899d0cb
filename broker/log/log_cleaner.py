"""LogCleaner: compaction of the logs whose cleanup.policy has compact (Kafka's LogCleaner, Cleaner
and LogCleanerManager, on one background thread).

A compacted log, as the cleaner sees it:

    log start        first dirty offset               end of the cleanable range      LEO
    |-- clean section --|--------- dirty section ---------|--- not cleanable yet ---|-active-|

- The clean section was compacted already: at most one record per key. The first dirty offset
  of every compacted log is kept in the LogManager's `cleaner-offset-checkpoint`.
- The cleanable range is the sealed segments below the high watermark and the recovery point
  (`UnifiedLog.cleanable_segments`), less the dirty segments younger than min.compaction.lag.ms.
- dirty ratio = dirty bytes / (clean + dirty bytes) of the cleanable range. A log is due when its
  ratio reaches min.cleanable.dirty.ratio, or when its oldest dirty batch is older than
  max.compaction.lag.ms. Each round cleans the dirtiest due log.

One round over one log (compaction.py does the record work, pure):
1. Map: `build_offset_map` over the dirty section, bounded by the dedupe buffer. When the buffer
   cannot hold every dirty key, the map stops early and this round cleans up to where it covers
   (`end`); the next round carries on from there.
2. Clean: every cleanable segment holding offsets below `end`, from the log start, in groups of
   consecutive segments whose bytes fit segment.bytes (`group_segments`). Each group is compacted
   into one `.cleaned` segment, fsynced, and swapped in (`UnifiedLog.replace_segments`, which
   checks the segments are still there as read; crash points: LocalLog.replace_segments). The
   replaced segments go to the LogManager's delayed delete, like retention's.
3. Checkpoint: the first dirty offset becomes `end`.

Reads go through detached descriptors (Segment.detached_reader), so fetches and appends carry on
meanwhile; only the swap takes the log's lock. `stop()` interrupts a clean between batches and
deletes its `.cleaned` files; a swap is never interrupted. The offset map lives in this thread's
memory: log.cleaner.dedupe.buffer.size / DEDUPE_BYTES_PER_KEY keys.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields

from broker.config import BrokerConfig, LogConfig
from broker.log.log_manager import LogManager
from broker.log.segment import BatchInfo, Segment
from broker.log.unified_log import UnifiedLog
from common.errors import CorruptMessageError, KafkaStorageError
from segment_format import batch_body, record
from segment_format.compaction import BatchBytes, CompactionStats, OffsetMap, build_offset_map, compact_batches
from segment_format.layout import CLEANED_SUFFIX
from segment_format.limits import INT32_MAX, INT64_MAX
from segment_format.segment_reader import FRAME_ONLY, StoredBatch

log = logging.getLogger(__name__)

DEDUPE_BYTES_PER_KEY = 128
"""Memory per distinct key of the offset map: ~95 bytes of Python objects and dict slot plus the
key's bytes (compaction.OffsetMap measures 107 for 12-byte keys); 128 leaves room for keys up to
~30 bytes, so the default 128 MiB dedupe buffer maps 1M keys a round."""

_FIRST_HEADER_READ = 4096  # reading one batch header for max.compaction.lag.ms


def max_keys_for(dedupe_buffer_bytes: int) -> int:
    """The offset map's bound for log.cleaner.dedupe.buffer.size bytes."""
    return max(1, dedupe_buffer_bytes // DEDUPE_BYTES_PER_KEY)


class CleanerError(Exception):
    """A log the cleaner cannot clean as it is (the dedupe buffer holds less than one batch's
    keys, a cleaned segment would outgrow the index's positions): it is marked uncleanable."""


class _Stopped(Exception):
    """stop() was called: the clean in progress is given up."""


@dataclass
class CleanerStats:
    """What one cleaning of one log did (Kafka's CleanerStats); logged at INFO."""

    log: str
    first_dirty_offset: int
    end_offset: int = 0  # the new first dirty offset
    map_keys: int = 0
    map_bytes_read: int = 0
    map_seconds: float = 0.0
    compaction: CompactionStats = field(default_factory=CompactionStats)  # the cleaning pass
    segments_in: int = 0
    segments_out: int = 0
    duration_s: float = 0.0

    @property
    def bytes_read(self) -> int:
        return self.map_bytes_read + self.compaction.bytes_in

    @property
    def bytes_written(self) -> int:
        return self.compaction.bytes_out

    @property
    def records_removed(self) -> int:
        return self.compaction.records_removed


@dataclass(frozen=True)
class LogToClean:
    """One compacted log's cleanable range at the start of a round (Kafka's LogToClean)."""

    log: UnifiedLog
    config: LogConfig
    segments: list[Segment]  # cleanable, oldest first: the clean section, then the dirty one
    first_dirty_offset: int
    generation: int  # UnifiedLog.cleanable_segments().generation: the swap checks it
    max_lag_exceeded: bool = False

    @property
    def dirty_segments(self) -> list[Segment]:
        return [segment for segment in self.segments if segment.next_offset > self.first_dirty_offset]

    @property
    def dirty_bytes(self) -> int:
        return sum(segment.size for segment in self.dirty_segments)

    @property
    def dirty_ratio(self) -> float:
        total = sum(segment.size for segment in self.segments)
        return self.dirty_bytes / total if total else 0.0

    @property
    def due(self) -> bool:
        return self.dirty_bytes > 0 and (self.dirty_ratio >= self.config.min_cleanable_dirty_ratio or self.max_lag_exceeded)


def group_segments(segments: list[Segment], max_bytes: int) -> list[list[Segment]]:
    """Consecutive segments in groups that each clean into one segment (Kafka's
    groupSegmentsBySize): a group's bytes stay within `max_bytes` (segment.bytes; a larger
    segment makes a group alone), and its offsets within the offset index's int32 relative
    offsets from the group's base offset."""
    groups: list[list[Segment]] = []
    group_bytes = 0
    for segment in segments:
        group = groups[-1] if groups else None
        if (group is not None and group_bytes + segment.size <= max_bytes
                and segment.next_offset - 1 - group[0].base_offset <= INT32_MAX):
            group.append(segment)
            group_bytes += segment.size
        else:
            groups.append([segment])
            group_bytes = segment.size
    return groups


class LogCleaner:
    """Cleans the compacted logs of one LogManager on one background thread, or in the caller's
    thread with `clean_once` (tests, benchmarks). Thread-safe; one clean runs at a time."""

    def __init__(self, logs: LogManager, *, max_keys: int = max_keys_for(128 << 20), backoff_ms: int = 15_000,
                 io_buffer_bytes: int = 512 << 10, clock: Callable[[], int] = batch_body.now_ms) -> None:
        self.logs = logs
        self.max_keys = max_keys
        self.backoff_ms = backoff_ms
        self.io_buffer_bytes = io_buffer_bytes
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._clean_lock = threading.Lock()
        self._uncleanable: weakref.WeakSet[UnifiedLog] = weakref.WeakSet()  # until the broker restarts
        self.last_stats: CleanerStats | None = None
        self.logs_cleaned = 0

    @classmethod
    def from_config(cls, config: BrokerConfig, logs: LogManager) -> LogCleaner:
        return cls(logs, max_keys=max_keys_for(config["log.cleaner.dedupe.buffer.size"]),
                   backoff_ms=config["log.cleaner.backoff.ms"], io_buffer_bytes=config["log.cleaner.io.buffer.size"])

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the cleaner thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="log-cleaner-0", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it: a clean in progress is given up between two batches
        (its `.cleaned` files deleted), a swap in progress finishes first. Final: a stopped
        cleaner cleans no more. Blocks: call it from a worker thread, before the logs close."""
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        """Look for a dirty log now instead of after the backoff."""
        self._wakeup.set()

    @property
    def uncleanable(self) -> list[UnifiedLog]:
        """Logs given up on after an error (each was logged), skipped until the broker restarts."""
        return list(self._uncleanable)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wakeup.clear()
            try:
                cleaned = self.clean_once(self._clock())
            except Exception:  # a bug must not end the thread: every compacted log would grow forever
                log.exception("log cleaner round failed")
                cleaned = None
            if cleaned is None:
                self._wakeup.wait(self.backoff_ms / 1000)

    # --- one round -------------------------------------------------------------------------

    def clean_once(self, now_ms: int) -> CleanerStats | None:
        """Clean the dirtiest due log, if any (`now_ms`: the clock that ages tombstones and
        compaction lags). Returns what it did, or None if no log was due or the clean was given
        up (stopped, segments changed meanwhile, an error: logged)."""
        with self._clean_lock:
            candidates = [self.log_to_clean(partition_log, now_ms) for partition_log in self.logs.all_logs()]
            due = [ltc for ltc in candidates if ltc is not None and ltc.due]
            if not due or self._stopping.is_set():
                return None
            return self._clean_log(max(due, key=lambda ltc: ltc.dirty_ratio), now_ms)

    def log_to_clean(self, partition_log: UnifiedLog, now_ms: int) -> LogToClean | None:
        """`partition_log`'s cleanable range, or None if it is not a log to clean."""
        config = partition_log.config
        if not config.compact or partition_log.offline or partition_log in self._uncleanable:
            return None
        try:
            view = partition_log.cleanable_segments()
        except KafkaStorageError:  # closed or offline meanwhile
            return None
        first_dirty = self.logs.first_dirty_offset(partition_log)
        if first_dirty is None or not view.log_start_offset <= first_dirty <= view.active_base_offset:
            first_dirty = view.log_start_offset  # never cleaned, or the log was cut or moved past it
        segments = _within_min_lag(view.segments, first_dirty, config, now_ms)
        lag_exceeded = config.max_compaction_lag_ms < INT64_MAX and _max_lag_exceeded(
            [segment for segment in segments if segment.next_offset > first_dirty], config, now_ms)
        return LogToClean(partition_log, config, segments, first_dirty, view.generation, lag_exceeded)

    def _clean_log(self, ltc: LogToClean, now_ms: int) -> CleanerStats | None:
        """Clean one log; errors are logged, and mark the log uncleanable unless its segments
        changed meanwhile (then the next round starts over)."""
        remaining = list(ltc.segments)  # those not swapped yet: an error while they are intact is ours
        try:
            stats = self._clean(ltc, now_ms, remaining)
        except _Stopped:
            log.info("cleaning of %s stopped", ltc.log)
            return None
        except (KafkaStorageError, CorruptMessageError, CleanerError, ValueError) as err:
            if not ltc.log.holds_segments(remaining, ltc.generation):
                log.info("cleaning of %s given up: its segments changed meanwhile (%s)", ltc.log, err)
                return None
            log.error("cannot clean %s, skipping it until a restart: %s", ltc.log, err)
            self._uncleanable.add(ltc.log)
            return None
        if stats is None:
            log.info("cleaning of %s given up: its segments changed meanwhile", ltc.log)
            return None
        self.last_stats = stats
        self.logs_cleaned += 1
        _log_stats(stats, self.max_keys)
        return stats

    def _clean(self, ltc: LogToClean, now_ms: int, remaining: list[Segment]) -> CleanerStats | None:
        """Map, clean group by group, checkpoint. None if a swap found the segments changed."""
        started = time.monotonic()
        stats = CleanerStats(f"{ltc.log.topic}-{ltc.log.partition}", ltc.first_dirty_offset)
        offset_map = self._build_map(ltc, stats)
        end = stats.end_offset = offset_map.end_offset
        for group in group_segments([s for s in ltc.segments if s.base_offset < end], ltc.config.segment_bytes):
            if not self._clean_group(ltc, group, offset_map, end, now_ms, stats):
                return None
            del remaining[:len(group)]
        self.logs.update_first_dirty_offset(ltc.log, end)
        stats.duration_s = time.monotonic() - started
        return stats

    def _build_map(self, ltc: LogToClean, stats: CleanerStats) -> OffsetMap:
        started = time.monotonic()
        dirty = ltc.dirty_segments  # not empty: the log is due
        aborted = ltc.log.collect_aborted_transactions(ltc.first_dirty_offset, dirty[-1].next_offset)
        offset_map = build_offset_map(self._tally(self._batches(dirty, ltc.first_dirty_offset), stats), self.max_keys,
                                      aborted)
        if offset_map.end_offset <= ltc.first_dirty_offset:
            raise CleanerError(f"the dedupe buffer ({self.max_keys} keys) cannot hold the keys of the batch at "
                               f"offset {offset_map.end_offset}: raise log.cleaner.dedupe.buffer.size")
        stats.map_keys = len(offset_map.latest)
        stats.map_seconds = time.monotonic() - started
        return offset_map

    def _clean_group(self, ltc: LogToClean, group: list[Segment], offset_map: OffsetMap, end: int, now_ms: int,
                     stats: CleanerStats) -> bool:
        """Compact `group` into one segment and swap it in. False if the log changed meanwhile."""
        group_stats = CompactionStats()
        cleaned = self._write_cleaned(ltc, group, offset_map, end, now_ms, group_stats)
        _add_stats(stats.compaction, group_stats)
        if len(group) == 1 and not group_stats.records_removed:
            cleaned.delete()  # the same bytes again: nothing to swap
            return True
        try:
            swapped = ltc.log.replace_segments(cleaned, group, ltc.generation)
        except BaseException:
            if cleaned.files.state == CLEANED_SUFFIX:  # not committed: ours to delete
                cleaned.delete()
            raise
        if not swapped:
            cleaned.delete()
            return False
        self.logs.schedule_delete(group, self._clock())
        stats.segments_in += len(group)
        stats.segments_out += 1
        return True

    def _write_cleaned(self, ltc: LogToClean, group: list[Segment], offset_map: OffsetMap, end: int, now_ms: int,
                       stats: CompactionStats) -> Segment:
        """The group's survivors in a new sealed, fsynced `.cleaned` segment at the group's base."""
        cleaned = Segment.create(ltc.log.directory, group[0].base_offset, self.logs.cache, CLEANED_SUFFIX)
        try:
            writer = _CleanedWriter(cleaned, ltc.config.index_interval_bytes, self.io_buffer_bytes, now_ms)
            aborted = ltc.log.collect_aborted_transactions(group[0].base_offset, end)
            for data in compact_batches(self._batches(group), offset_map, now_ms, ltc.config.delete_retention_ms,
                                        up_to_offset=end, stats=stats, aborted=aborted):
                writer.add(data)
            writer.flush()
            for segment in group:  # markers are kept: so are the aborted transactions they index
                for txn in segment.txn_index.entries:
                    cleaned.txn_index.append(txn)
            cleaned.seal()
            cleaned.flush()
        except BaseException:
            try:
                cleaned.delete()
            except KafkaStorageError as err:  # a restart removes `.cleaned` files
                log.error("cannot delete %s: %s", cleaned, err)
            raise
        return cleaned

    def _batches(self, segments: list[Segment], from_offset: int | None = None) -> Iterator[StoredBatch]:
        """The batches of `segments` from the one holding `from_offset`, over detached
        descriptors. Fully validated: a cleaned batch gets a fresh CRC, and damage must not be
        laundered into it. Raises _Stopped between batches once stop() is called."""
        for segment in segments:
            if not segment.size or (from_offset is not None and segment.next_offset <= from_offset):
                continue
            with segment.detached_reader() as reader:
                position = 0
                if from_offset is not None and from_offset > segment.base_offset:
                    found = reader.find_position(from_offset)
                    if found is None:
                        continue
                    position = found[0]
                for batch in reader.stored_batches(position):
                    if self._stopping.is_set():
                        raise _Stopped
                    yield batch

    @staticmethod
    def _tally(batches: Iterable[StoredBatch], stats: CleanerStats) -> Iterator[StoredBatch]:
        for batch in batches:
            stats.map_bytes_read += len(batch.data)
            yield batch


class _CleanedWriter:
    """Appends cleaned batches to a `.cleaned` segment in runs of `buffer_bytes` (one pwrite
    each), indexing them as the log does."""

    def __init__(self, segment: Segment, index_interval_bytes: int, buffer_bytes: int, now_ms: int) -> None:
        self.segment = segment
        self._index_interval_bytes = index_interval_bytes
        self._buffer_bytes = buffer_bytes
        self._now_ms = now_ms
        self._buffer = bytearray()
        self._batches: list[BatchInfo] = []

    def add(self, data: BatchBytes) -> None:
        position = self.segment.size + len(self._buffer)
        if position > INT32_MAX:
            raise CleanerError(f"{self.segment} would hold a batch at byte {position}, past the offset index's "
                               f"32-bit positions: lower segment.bytes")
        header = record.read_header(data)
        self._batches.append(BatchInfo(header.base_offset, header.next_offset, header.size, header.max_timestamp))
        self._buffer += data
        if len(self._buffer) >= self._buffer_bytes:
            self.flush()

    def flush(self) -> None:
        if self._batches:
            self.segment.append(memoryview(self._buffer), self._batches, self._index_interval_bytes, self._now_ms)
            self._buffer = bytearray()
            self._batches = []


def _within_min_lag(segments: list[Segment], first_dirty: int, config: LogConfig, now_ms: int) -> list[Segment]:
    """`segments` up to the first dirty one holding a record younger than min.compaction.lag.ms
    (by its max timestamp, as Kafka judges it)."""
    if config.min_compaction_lag_ms <= 0:
        return segments
    horizon_ms = now_ms - config.min_compaction_lag_ms
    for i, segment in enumerate(segments):
        if segment.next_offset > first_dirty and segment.max_timestamp > horizon_ms:
            return segments[:i]
    return segments


def _max_lag_exceeded(dirty: list[Segment], config: LogConfig, now_ms: int) -> bool:
    """Whether the first dirty batch is older than max.compaction.lag.ms (Kafka reads the first
    batch's max timestamp of the first dirty segment)."""
    first = next((segment for segment in dirty if segment.size), None)
    if first is None:
        return False
    try:
        with first.detached_reader(_FIRST_HEADER_READ) as reader:
            _, header = next(reader.batches(verify_from_offset=FRAME_ONLY))
    except (KafkaStorageError, CorruptMessageError, StopIteration):
        return False  # gone meanwhile or damaged: the dirty ratio still decides
    return 0 <= header.max_timestamp < now_ms - config.max_compaction_lag_ms


def _add_stats(total: CompactionStats, part: CompactionStats) -> None:
    for f in fields(CompactionStats):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


def _log_stats(stats: CleanerStats, max_keys: int) -> None:
    """One INFO line per cleaned log, with what Kafka's cleaner reports."""
    c = stats.compaction
    mb = 1 << 20
    seconds = max(stats.duration_s, 1e-9)
    log.info(
        "cleaned %s (dirty section [%d, %d)): %.1f MB read in %.2f s (%.1f MB/s); offset map: %d keys "
        "(%.1f%% of the dedupe buffer) from %.1f MB in %.2f s; %d -> %d records, %.1f -> %.1f MB "
        "(%.1f%% smaller), %d tombstones expired; %d segments swapped for %d",
        stats.log, stats.first_dirty_offset, stats.end_offset, stats.bytes_read / mb, stats.duration_s,
        stats.bytes_read / mb / seconds, stats.map_keys, 100 * stats.map_keys / max_keys, stats.map_bytes_read / mb,
        stats.map_seconds, c.records_in, c.records_kept, c.bytes_in / mb, c.bytes_out / mb,
        100 * (1 - c.bytes_out / c.bytes_in) if c.bytes_in else 0.0, c.tombstones_removed, stats.segments_in,
        stats.segments_out)
