"""Partition log: the `{topic}-{partition}` directory the broker appends to and fetches from.

    {topic}-{partition}/
        {base_offset:020d}.log         segments, oldest first; only the last (active) one grows
        {base_offset:020d}.index       their sparse offset indexes
        {base_offset:020d}.timeindex   their sparse time indexes
        *.deleted                      segments removed by retention, awaiting delayed unlink
        recovery-point.checkpoint      offsets below it are fsynced (checkpoint.py)
        leader-epoch.checkpoint        "epoch start_offset" lines (leader_epoch.py)

Offsets: log_start_offset (first stored) <= recovery_point, high_watermark <= log_end_offset (LEO,
the next offset to assign). On open, every segment from the one holding the recovery point on is
re-validated; a torn or corrupt tail is cut and every later segment deleted (DESIGN.md section 3).

Threading: every public method may be called from any thread; state changes happen under one
lock, and `flush` runs its fsyncs outside it on duplicated fds, so a flush in a worker thread
never stalls appends on the event loop for longer than it takes to write queued index entries.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker import record
from broker.config import INT32_MAX, LogConfig
from broker.errors import CorruptMessageError, KafkaStorageError, OffsetOutOfRangeError
from broker.log.checkpoint import TMP_SUFFIX, fsync_and_close, fsync_directory, read_recovery_point, write_recovery_point
from broker.log.index_file import CorruptIndexError
from broker.log.leader_epoch import LeaderEpochCache
from broker.log.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    BatchInfo,
    FetchSlice,
    Segment,
)

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point.checkpoint"
LEADER_EPOCH_FILE = "leader-epoch.checkpoint"
_SEGMENT_NAME_DIGITS = 20


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an append landed. `log_append_time_ms` is -1 unless the topic uses LogAppendTime."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_count: int


class PartitionLog:
    """One partition's segmented log. Build with `PartitionLog.open`."""

    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig, clock: Callable[[], int]) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()  # guards segments, offsets and counters
        self._flush_lock = threading.Lock()  # serializes flushes so checkpoints never go back
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # segment base offsets, for bisect
        self._epochs = LeaderEpochCache.load(directory / LEADER_EPOCH_FILE)
        self._unflushed_messages = 0
        self._first_unflushed_ms: int | None = None
        self._dir_dirty = False  # segment files were created since the last directory fsync
        self._closed = False
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.recovery_point = 0
        self.last_recovery_truncated_bytes = 0

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Callable[[], int] = record.now_ms,
    ) -> PartitionLog:
        """Create the directory with one empty segment, or load it and recover what follows the
        recovery point. Raises KafkaStorageError if the directory cannot be used."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot create {directory}: {err}") from err
        partition_log = cls(directory, topic, partition, config, clock)
        try:
            partition_log._load()
        except OSError as err:
            raise KafkaStorageError(f"cannot load {directory}: {err}") from err
        return partition_log

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic}-{self.partition}, offsets {self.log_start_offset}..{self.log_end_offset})"

    # --- loading and recovery ---------------------------------------------------------------

    def _load(self) -> None:
        bases = self._segment_bases()
        recovery_point = read_recovery_point(self.directory / RECOVERY_POINT_FILE)
        if bases:
            recovered = self._load_segments(bases, recovery_point)
        else:
            recovered = [self._add_segment(Segment.create(self.directory, 0))]
        for segment in self._segments[:-1]:
            segment.seal()
        self.log_start_offset = self._segments[0].base_offset
        self.log_end_offset = self.high_watermark = self._segments[-1].next_offset
        self._epochs.truncate_from_end(self.log_end_offset)
        if recovered:
            # Recovered bytes may still sit in the page cache only: sync them once, and the whole
            # log is known durable.
            for segment in recovered:
                segment.flush()
            self._fsync_directory()
            recovery_point = self.log_end_offset
            write_recovery_point(self.directory / RECOVERY_POINT_FILE, recovery_point)
        self.recovery_point = min(recovery_point, self.log_end_offset)

    def _segment_bases(self) -> list[int]:
        """Base offsets of the `.log` files, after removing leftovers of interrupted operations:
        `.deleted` segments, checkpoint temp files, indexes whose `.log` is gone."""
        bases, indexes = [], []
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(DELETED_SUFFIX) or name.endswith(TMP_SUFFIX):
                self._unlink(path)
            elif path.suffix == LOG_SUFFIX and len(path.stem) == _SEGMENT_NAME_DIGITS and path.stem.isdigit():
                bases.append(int(path.stem))
            elif path.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                indexes.append(path)
        for path in indexes:
            if not path.with_suffix(LOG_SUFFIX).exists():
                self._unlink(path)
        return sorted(bases)

    def _load_segments(self, bases: list[int], recovery_point: int) -> list[Segment]:
        """Open every segment: trust those wholly below the recovery point (rebuilding a bad
        index), recover the rest. Returns the segments that went through recovery."""
        holding = max(0, bisect_right(bases, recovery_point) - 1)  # index of the segment holding it
        recovered, dropped = [], 0
        for i, base in enumerate(bases):
            if self._segments and base < self._segments[-1].next_offset:
                raise KafkaStorageError(f"{self.directory}: segment {base} overlaps {self._segments[-1]}")
            segment = self._add_segment(Segment.open(self.directory, base))
            below_recovery_point = i < holding or (i == holding and base < recovery_point)
            if below_recovery_point and self._load_trusted(segment, recovery_point if i == holding else None):
                continue
            # No size limit here: a batch larger than today's configs was valid when it was
            # appended (limits can be lowered later); the file size bounds every read.
            truncated = segment.recover(None, self.config.index_interval_bytes)
            recovered.append(segment)
            dropped += truncated
            if truncated and i >= holding:  # a torn tail: nothing after it can be trusted
                log.warning("%s: recovery truncated %d bytes at offset %d", self.directory, truncated, segment.next_offset)
                dropped += self._delete_segments_after(bases[i + 1 :])
                break
        self.last_recovery_truncated_bytes = dropped
        return recovered

    def _load_trusted(self, segment: Segment, recovery_point: int | None) -> bool:
        """Load a segment from its index files. False if it must be recovered instead: its indexes
        are bad, or (for the segment holding the recovery point) it does not end exactly there."""
        try:
            segment.load()
        except (CorruptIndexError, CorruptMessageError) as err:
            log.warning("%s: rebuilding %s: %s", self.directory, segment.log_path.name, err)
            return False
        return recovery_point is None or segment.next_offset == recovery_point

    def _delete_segments_after(self, bases: list[int]) -> int:
        """Delete the segments of `bases` (they follow a torn tail); returns their total bytes."""
        dropped = 0
        for base in bases:
            segment = Segment.open(self.directory, base)
            dropped += segment.log_path.stat().st_size
            segment.delete()
        return dropped

    def _add_segment(self, segment: Segment) -> Segment:
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        return segment

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot delete {path}: {err}") from err

    # --- configuration and state ---------------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        """Apply new topic configs; they govern the next append, roll, retention and flush check."""
        with self._lock:
            self.config = config

    @property
    def leader_epoch_entries(self) -> list[tuple[int, int]]:
        """(epoch, start_offset) pairs from the leader-epoch checkpoint, oldest first."""
        with self._lock:
            return self._epochs.entries

    def segments(self) -> list[Segment]:
        """A snapshot of the segments, oldest first; the last is the active one."""
        with self._lock:
            return list(self._segments)

    def size_bytes(self) -> int:
        with self._lock:
            return self._size_bytes()

    def _size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"{self.topic}-{self.partition} is closed")

    # --- append ----------------------------------------------------------------------------

    def append(self, payload: memoryview | bytearray, leader_epoch: int) -> AppendInfo:
        """Validate every batch of `payload`, assign offsets by patching headers in place, and
        write all of it to the active segment with one write.

        `payload` must be writable: base offsets, leader epochs and (for LogAppendTime) timestamps
        and CRCs are rewritten in it. If any batch is invalid nothing is written:
        CorruptMessageError (bad or partial batch, empty payload) or MessageTooLargeError.
        KafkaStorageError if the disk fails. Costs O(batches) Python work; bodies are never decoded.
        """
        with memoryview(payload).cast("B") as view:  # released on return: the caller may reuse the buffer
            if view.readonly:
                raise TypeError("append needs a writable buffer: offsets are patched in place")
            headers = self._validate(view)
            with self._lock:
                self._check_open()
                return self._append_validated(view, headers, leader_epoch)

    def _append_validated(
        self, view: memoryview, headers: list[tuple[int, record.BatchHeader]], leader_epoch: int
    ) -> AppendInfo:
        now = self._clock()
        batches = self._assign_offsets(view, headers, leader_epoch, now)
        first_offset, next_offset = batches[0].base_offset, batches[-1].next_offset
        if leader_epoch >= 0:  # before the data, as Kafka: an epoch entry never lags its records
            self._epochs.assign(leader_epoch, first_offset)
        start = 0
        for run in self._runs(batches):
            size = sum(b.size for b in run)
            self._maybe_roll(size, run[-1].next_offset, now)
            self._segments[-1].append(view[start : start + size], run, self.config.index_interval_bytes, now)
            start += size
            self.log_end_offset = self.high_watermark = run[-1].next_offset
        self._unflushed_messages += next_offset - first_offset
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now
        return AppendInfo(
            first_offset=first_offset,
            last_offset=next_offset - 1,
            log_append_time_ms=now if self._log_append_time else -1,
            log_start_offset=self.log_start_offset,
            record_count=next_offset - first_offset,
        )

    @property
    def _log_append_time(self) -> bool:
        return self.config.message_timestamp_type == "LogAppendTime"

    def _validate(self, view: memoryview) -> list[tuple[int, record.BatchHeader]]:
        """(position, header) of every batch; raises on the first bad one or a partial tail."""
        if not len(view):
            raise CorruptMessageError("empty record set")
        batches, position, max_batch_bytes = [], 0, self.config.max_message_bytes
        while position < len(view):
            header = record.validate_batch(view, position, max_batch_bytes=max_batch_bytes)
            batches.append((position, header))
            position += header.size
        return batches

    def _assign_offsets(
        self, view: memoryview, headers: list[tuple[int, record.BatchHeader]], leader_epoch: int, now: int
    ) -> list[BatchInfo]:
        """Patch base offset and epoch into each header (the CRC does not cover them)."""
        batches, next_offset, log_append_time = [], self.log_end_offset, self._log_append_time
        for position, header in headers:
            max_timestamp = header.max_timestamp
            if log_append_time:
                record.stamp_log_append_time(view, position, header, next_offset, leader_epoch, now)
                max_timestamp = now
            else:
                record.patch_offsets(view, position, next_offset, leader_epoch)
            batches.append(BatchInfo(next_offset, next_offset + header.record_count, header.size, max_timestamp))
            next_offset += header.record_count
        return batches

    def _runs(self, batches: list[BatchInfo]) -> list[list[BatchInfo]]:
        """Split an append into runs that each fit one segment, so a large multi-batch append
        still rolls at segment.bytes; usually there is one run and so one write."""
        runs: list[list[BatchInfo]] = [[]]
        room = self.config.segment_bytes - self._segments[-1].size
        for batch in batches:
            if runs[-1] and batch.size > room:
                runs.append([])
                room = self.config.segment_bytes
            runs[-1].append(batch)
            room -= batch.size
        return runs

    def _maybe_roll(self, append_bytes: int, next_offset: int, now: int) -> None:
        """Roll a non-empty active segment that the append would push past segment.bytes, that is
        older than segment.ms, or whose relative offsets would overflow the index."""
        active = self._segments[-1]
        if not active.size:
            return
        if (
            active.size + append_bytes > self.config.segment_bytes
            or now - active.first_append_ms > self.config.segment_ms
            or next_offset - 1 - active.base_offset > INT32_MAX
        ):
            self._roll()

    def _roll(self) -> None:
        """Seal the active segment and start a new one at LEO."""
        segment = Segment.create(self.directory, self.log_end_offset)
        self._segments[-1].seal()
        self._add_segment(segment)
        self._dir_dirty = True

    # --- read ------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FetchSlice:
        """Bytes of one segment starting at the batch holding `offset` (KIP-74: the whole first
        batch even past `max_bytes`; the end may cut a batch). Empty at LEO; stops before the batch
        holding `max_offset` when given. OffsetOutOfRangeError outside [log_start, LEO]."""
        with self._lock:
            self._check_open()
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range for {self.topic}-{self.partition}: "
                    f"[{self.log_start_offset}, {self.log_end_offset}]"
                )
            i = bisect_right(self._bases, offset) - 1
            while offset < self.log_end_offset and i < len(self._segments):
                found = self._segments[i].read(offset, max_bytes, max_offset)
                if found is not None:
                    return found
                i += 1  # only past a segment that recovery cut short: its offsets are gone
            active = self._segments[-1]
            return FetchSlice(active.file, active.size, 0, self.log_end_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record with timestamp >= `timestamp_ms` (Kafka's
        ListOffsets), or None if every record is older."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp >= timestamp_ms:
                    found = segment.offset_for_timestamp(timestamp_ms)
                    if found is not None:
                        return found
            return None

    # --- durability ------------------------------------------------------------------------

    def needs_flush(self, now_ms: int) -> bool:
        """True once flush.messages messages are unflushed or the oldest is flush.ms old.

        Lock-free, because the event loop asks after every append while the log writer thread may
        hold the lock for a whole pwrite: a stale answer only moves a flush by one check, and
        `flush` itself works under the locks."""
        first_unflushed_ms, unflushed = self._first_unflushed_ms, self._unflushed_messages
        if first_unflushed_ms is None:
            return False
        return unflushed >= self.config.flush_messages or now_ms - first_unflushed_ms >= self.config.flush_ms

    def flush(self, up_to: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery_point, up_to) (default LEO), advance
        the recovery point and checkpoint it. Safe from a worker thread while another appends:
        the fsyncs run outside the lock on duplicated fds. A no-op once closed (close flushed)."""
        with self._flush_lock:
            with self._lock:
                if self._closed:  # close() flushed everything
                    return
                target = self.log_end_offset if up_to is None else min(up_to, self.log_end_offset)
                if target <= self.recovery_point:
                    return
                fds = self._prepare_sync(self._segments_holding(self.recovery_point, target))
                sync_directory, self._dir_dirty = self._dir_dirty, False
                if target == self.log_end_offset:
                    self._unflushed_messages, self._first_unflushed_ms = 0, None
            self._sync(fds, sync_directory)
            with self._lock:
                self.recovery_point = max(self.recovery_point, min(target, self.log_end_offset))
                recovery_point = self.recovery_point
            write_recovery_point(self.directory / RECOVERY_POINT_FILE, recovery_point)

    def _segments_holding(self, start: int, end: int | None = None) -> list[Segment]:
        """Segments that may hold offsets in [start, end) (to the last segment without `end`)."""
        first = max(0, bisect_right(self._bases, start) - 1)
        last = len(self._segments) if end is None else max(first + 1, bisect_left(self._bases, end))
        return self._segments[first:last]

    def _prepare_sync(self, segments: list[Segment]) -> list[int]:
        fds: list[int] = []
        try:
            for segment in segments:
                fds.extend(segment.prepare_sync())
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _sync(self, fds: list[int], sync_directory: bool) -> None:
        """fsync and close `fds` (owned by us: never another thread's fd), then the directory."""
        fsync_and_close(fds, self.directory)
        if sync_directory:
            self._fsync_directory()

    def _fsync_directory(self) -> None:
        try:
            fsync_directory(self.directory)
        except OSError as err:
            raise KafkaStorageError(f"cannot fsync {self.directory}: {err}") from err

    # --- retention -------------------------------------------------------------------------

    def delete_old_segments(self, now_ms: int) -> list[Segment]:
        """Apply retention.ms and retention.bytes to whole segments, oldest first.

        An expired non-empty active segment is rolled first so the log stays writable at LEO.
        Deleted segments leave the log at once, their files renamed `*.deleted`; they are
        returned still open so in-flight reads finish: the caller calls `Segment.delete()` later.
        """
        with self._lock:
            self._check_open()
            deletable = self._deletable_segments(now_ms)
            if not deletable:
                return []
            if deletable[-1] is self._segments[-1]:
                self._roll()
            del self._segments[: len(deletable)]
            del self._bases[: len(deletable)]
            self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            # Nothing below the log start needs recovery: the recovery point may skip ahead.
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
            self._epochs.truncate_from_start(self.log_start_offset)
            for segment in deletable:
                segment.mark_deleted()
            log.info("%s: retention deleted %d segments, log start offset now %d", self, len(deletable), self.log_start_offset)
            return deletable

    def _deletable_segments(self, now_ms: int) -> list[Segment]:
        """The longest prefix of non-empty segments below the high watermark each of which is
        older than retention.ms or leaves at least retention.bytes behind when removed."""
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        excess_bytes = self._size_bytes() - retention_bytes
        deletable = []
        for segment in self._segments:
            if not segment.size or segment.next_offset > self.high_watermark:
                break
            expired = retention_ms >= 0 and now_ms - segment.max_timestamp > retention_ms
            oversize = retention_bytes >= 0 and excess_bytes - segment.size >= 0
            if not (expired or oversize):
                break
            deletable.append(segment)
            excess_bytes -= segment.size
        return deletable

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: seal and fsync everything, checkpoint recovery point = LEO, close fds;
        the next open then re-validates nothing. Idempotent."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._segments[-1].seal()  # its max timestamp becomes the last time-index entry
            fds = self._prepare_sync(self._segments_holding(self.recovery_point))
            self._sync(fds, self._dir_dirty)
            self.recovery_point = self.log_end_offset
            write_recovery_point(self.directory / RECOVERY_POINT_FILE, self.recovery_point)
            self._close_segments()

    def delete(self) -> None:
        """Close without syncing and remove the whole directory."""
        with self._flush_lock, self._lock:
            if not self._closed:
                self._close_segments()
            try:
                shutil.rmtree(self.directory)
            except FileNotFoundError:
                pass
            except OSError as err:
                raise KafkaStorageError(f"cannot delete {self.directory}: {err}") from err

    def _close_segments(self) -> None:
        for segment in self._segments:
            segment.close()
        self._closed = True

