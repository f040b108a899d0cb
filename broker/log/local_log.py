"""LocalLog: a partition's segments on local disk (Kafka's LocalLog).

Appends validated, offset-assigned batches (rolling at `segment.bytes`, `segment.ms` and before the
offset index's relative offsets would overflow), reads byte ranges, truncates at either end and
prepares flushes. It knows nothing of high watermarks, leader epochs or retention policy: that is
UnifiedLog's.

Locking (the rule is UnifiedLog's, see unified_log.py): every call comes from a thread holding
UnifiedLog's append lock, so one writer at a time. `lock`, the view lock, guards what readers
see (the segment list and each segment's published size, offsets and index entries); this class
takes it only around in-memory changes (`Segment.publish`, `Segment.mark_sealed`, list edits), never
across I/O, so a reader waits for no pwrite, file creation, rename or fsync. `read` and
`offset_for_timestamp` must be called under `lock`.

    log_end_offset    next offset to assign (LEO)
    recovery_point    every offset below it is fsynced; recovery validates from here on a crash
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from broker.config import LogConfig
from broker.log.checkpoint import fsync_and_close, fsync_directory
from broker.log.file_cache import FileCache
from broker.log.log_segments import LogSegments
from broker.log.segment import BatchInfo, FetchSlice, Segment
from common.errors import KafkaStorageError, LogInvariantError, OffsetOutOfRangeError
from segment_format.layout import SWAP_SUFFIX
from segment_format.limits import INT32_MAX

log = logging.getLogger(__name__)


class SegmentsRemovedError(KafkaStorageError):
    """Retention failed part way: the segments in `removed` had already left the log (renamed
    `.deleted`) when a later rename failed. The caller still owns them: queue them for deletion."""

    def __init__(self, message: str, removed: list[Segment]) -> None:
        super().__init__(message)
        self.removed = removed


class SwapFailedError(KafkaStorageError):
    """A cleaned segment was committed (renamed `.swap`) but the segments it replaces could not
    all be renamed away: only a restart's LogLoader can finish the swap, so the caller takes the
    log directory offline."""


class LocalLog:
    def __init__(self, directory: Path, config: LogConfig, segments: LogSegments, recovery_point: int,
                 cache: FileCache) -> None:
        self.directory = directory
        self.config = config
        self.segments = segments
        self.recovery_point = recovery_point
        self.cache = cache
        self.dir_dirty = False  # segment files were created or removed since the last directory fsync
        self.lock = threading.Lock()  # the view lock: held for in-memory changes only, never across I/O
        # Called with the new segment's base offset once a non-empty segment was sealed: the
        # unified log snapshots its producer state there (Kafka's takeSnapshot on roll).
        self.on_roll: Callable[[int], None] | None = None

    @property
    def log_end_offset(self) -> int:
        return self.segments.active.next_offset

    @property
    def start_offset(self) -> int:
        """The first offset held locally (the local log start)."""
        return self.segments.first.base_offset

    # --- append ----------------------------------------------------------------------------

    def append(self, data: memoryview, batches: Sequence[BatchInfo], now_ms: int) -> list[Segment]:
        """Write `batches` (the bytes of `data`, offsets already assigned, the first at or past
        LEO) in as few writes as segment boundaries allow. Returns the segments sealed by rolls,
        which the caller should flush. On failure raises KafkaStorageError: the caller restores
        the log with `truncate_to` (earlier runs of this append may have been written)."""
        sealed = []
        start = 0
        for run in self._runs(batches):
            size = sum(b.size for b in run)
            rolled = self._maybe_roll(size, run[0].base_offset, run[-1].next_offset, now_ms)
            if rolled is not None:
                sealed.append(rolled)
            active = self.segments.active
            active.write(data[start:start + size], run)  # readers do not see these bytes yet
            with self.lock:
                active.publish(run, self.config.index_interval_bytes, now_ms)
            start += size
        return sealed

    def _runs(self, batches: Sequence[BatchInfo]) -> list[list[BatchInfo]]:
        """Split an append into runs that each fit one segment, so a large multi-batch append
        still rolls at segment.bytes; usually there is one run and so one write."""
        runs: list[list[BatchInfo]] = [[]]
        room = self.config.segment_bytes - self.segments.active.size
        for batch in batches:
            if runs[-1] and (batch.size > room or batch.next_offset - 1 - runs[-1][0].base_offset > INT32_MAX):
                runs.append([])
                room = self.config.segment_bytes
            runs[-1].append(batch)
            room -= batch.size
        return runs

    def _maybe_roll(self, append_bytes: int, base_offset: int, next_offset: int, now_ms: int) -> Segment | None:
        """Roll a non-empty active segment that the append would push past segment.bytes, that is
        older than segment.ms, or whose relative offsets would overflow the index. The new segment
        starts at the append's first offset (a follower's batches keep their offsets). Returns the
        sealed segment, if any."""
        active = self.segments.active
        if not active.size:
            if base_offset != active.base_offset and next_offset - 1 - active.base_offset > INT32_MAX:
                return self.roll(base_offset)  # an empty segment whose base is too far behind
            return None
        if (
            active.size + append_bytes > self.config.segment_bytes
            or (active.first_append_ms is not None and now_ms - active.first_append_ms > self.config.segment_ms)
            or next_offset - 1 - active.base_offset > INT32_MAX
        ):
            return self.roll(base_offset)
        return None

    def roll(self, base_offset: int | None = None) -> Segment:
        """Seal the active segment and start a new one at `base_offset` (default LEO). An empty
        active segment is replaced instead. Returns the segment that stopped being active."""
        base = self.log_end_offset if base_offset is None else base_offset
        if base < self.log_end_offset:
            raise LogInvariantError(f"{self.directory.name}: cannot roll a segment at offset {base}, below the log "
                                    f"end offset {self.log_end_offset}")
        old = self.segments.active
        # The I/O first (file creation, index writes), outside the view lock; then the view changes.
        segment = Segment.create(self.directory, base, self.cache)
        if old.size:
            try:
                old.write_indexes()
            except BaseException:
                # The old segment stays active; a new segment left on disk would make every
                # later roll at this offset fail ("File exists").
                with contextlib.suppress(KafkaStorageError):
                    segment.delete()
                raise
        self.dir_dirty = True
        with self.lock:
            if old.size:
                old.mark_sealed()  # queues its last time-index entry, written by the roll's flush
            else:
                self.segments.remove_from(len(self.segments) - 1)
            self.segments.add(segment)
        if old.size and self.on_roll is not None:
            self.on_roll(base)
        if not old.size:
            try:
                old.delete()
            except KafkaStorageError as err:
                # The roll is done; an empty segment left on disk holds no offsets and the next
                # open takes it as such.
                log.error("cannot delete the empty segment %s replaced by a roll: %s", old, err)
        return old

    # --- read ------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int, start_offset: int) -> FetchSlice:
        """Bytes of one segment starting at the batch holding `offset`, stopping before the batch
        holding `max_offset` (KIP-74: the whole first batch even past `max_bytes`). Empty at
        `max_offset`. OffsetOutOfRangeError outside [start_offset, max_offset]."""
        if not start_offset <= offset <= max_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is out of range [{start_offset}, {max_offset}]")
        if offset == max_offset:
            return FetchSlice.empty(offset)
        i = max(self.segments.floor_index(offset), 0)
        while i < len(self.segments):
            segment = self.segments[i]
            found = segment.read(max(offset, segment.base_offset), max_bytes, max_offset)
            if found is not None:
                return found
            i += 1  # past a segment that ends before `offset`: compaction or recovery left a gap
        return FetchSlice.empty(self.log_end_offset)

    def offset_for_timestamp(self, timestamp_ms: int, start_offset: int = 0) -> tuple[int, int] | None:
        """The first record at or after `start_offset` with timestamp >= `timestamp_ms`."""
        for segment in self.segments:
            if segment.max_timestamp >= timestamp_ms and segment.next_offset > start_offset:
                found = segment.offset_for_timestamp(timestamp_ms, start_offset)
                if found is not None:
                    return found
        return None

    # --- truncation ------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset >= `offset` (a batch holding `offset` goes whole:
        callers truncate at batch boundaries). Segments wholly past it are deleted. Returns the
        bytes removed. The segments wholly past `offset` leave the view first and are deleted
        outside the view lock; the cut of the last one (file and indexes together) happens under it."""
        if offset >= self.log_end_offset:
            return 0
        first_gone = next((i for i, s in enumerate(self.segments) if s.base_offset >= offset), len(self.segments))
        with self.lock:
            gone = self.segments.remove_from(max(first_gone, 1))
        removed = 0
        for segment in gone:
            removed += segment.size
            segment.delete()
            self.dir_dirty = True
        with self.lock:
            removed += self.segments.active.truncate_to(offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> int:
        """Delete every segment and start empty at `offset` (a follower far behind, or a log whose
        local data was wholly replaced). Returns the bytes removed. The caller holds the view lock
        (the log is never without a segment).

        Crash-safe when `offset` is past the log end (a follower behind its leader's log
        start, the case replication meets): the new empty segment is created and made durable
        first, and only then are the old ones deleted, so a crash at any point leaves either the
        old log or a log ending in the new segment (with a prefix of old segments that retention
        removes), never a log without its new start."""
        if offset > self.log_end_offset:
            fresh = Segment.create(self.directory, offset, self.cache)
            self.segments.add(fresh)
            fsync_directory(self.directory)
            doomed = self.segments.remove_first(len(self.segments) - 1)
        else:
            doomed = self.segments.clear()
        removed = 0
        for old in doomed:
            removed += old.size
            old.delete()
        if not len(self.segments):
            self.segments.add(Segment.create(self.directory, offset, self.cache))
        self.recovery_point = offset
        self.dir_dirty = True
        return removed

    def remove_oldest(self, count: int, on_removed: Callable[[], None]) -> list[Segment]:
        """Retention: drop the `count` oldest segments from the view (calling `on_removed` in the
        same critical section, and again if some go back: the caller's log start follows the
        first segment), then rename their files
        `.deleted` outside the view lock (no reader opens them by name any more). Returns them
        still open (in-flight reads finish); the caller deletes them later. If a rename fails,
        the segments not renamed yet go back to the front of the log, so a segment never leaves
        the log without its files being renamed, and SegmentsRemovedError carries the renamed
        ones to the caller, which must delete them all the same."""
        if not 0 < count < len(self.segments):
            raise LogInvariantError(f"{self.directory.name}: retention cannot remove {count} of {len(self.segments)} "
                                    f"segments (at least one, never the active one)")
        with self.lock:
            removed = self.segments.remove_first(count)
            on_removed()
        self.dir_dirty = True
        for renamed, segment in enumerate(removed):
            try:
                segment.mark_deleted()
            except KafkaStorageError as err:
                with self.lock:
                    self.segments.restore_first(removed[renamed:])
                    on_removed()
                raise SegmentsRemovedError(str(err), removed[:renamed]) from err
        return removed

    def replace_segments(self, cleaned: Segment, old: list[Segment]) -> None:
        """The log cleaner's swap: put `cleaned` (sealed, fsynced, its files in `.cleaned` state,
        based at old[0]'s base offset) in place of `old`, consecutive sealed segments of this log.
        The old segments leave with their files renamed `.deleted` and stay open (in-flight reads
        finish); the caller deletes them later. Renames and one directory fsync, all outside the
        view lock but the cleaned segment's final renames (readers open its files by name): the
        view changes in one critical section, so readers see either the old segments or the
        cleaned one. The caller keeps everything else that changes sealed segments out meanwhile
        (UnifiedLog's maintenance lock).

        Each step is a crash point that LogLoader resolves (Kafka's replaceSegments):
        1. `.cleaned` -> `.swap`, the `.log` last: the commit. Before it, a restart deletes the
           `.cleaned` files and the log is as it was.
        2. fsync the directory, so the commit is durable before any old file is renamed.
        3. each old segment -> `.deleted`; 4. `.swap` -> the final names. From the commit on, a
           restart deletes every old segment the `.swap` covers and renames it into place.
        KafkaStorageError from step 1: nothing changed (the caller deletes `cleaned`).
        SwapFailedError after it: the files are half swapped until a restart."""
        cleaned.rename_to(SWAP_SUFFIX)
        try:
            fsync_directory(self.directory)
            with self.lock:
                self.segments.replace(old, cleaned)  # readers reach it under its `.swap` names for now
            for segment in old:
                segment.mark_deleted()  # out of the view: no reader opens them by name any more
            with self.lock:
                cleaned.rename_to("")
        except (OSError, KafkaStorageError) as err:
            raise SwapFailedError(f"{self.directory}: swapping in {cleaned} failed after its commit: {err}") from err
        self.dir_dirty = True

    # --- durability ------------------------------------------------------------------------

    def prepare_flush(self, target: int) -> list[int]:
        """Descriptors (owned by the caller) whose fsync makes every offset below `target` durable."""
        fds: list[int] = []
        try:
            for segment in self.segments.holding(self.recovery_point, target):
                fds.extend(segment.prepare_sync())
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def sync(self, fds: list[int], sync_directory: bool) -> None:
        """fsync and close `fds`, then the directory if segments came or went. Any thread."""
        fsync_and_close(fds, self.directory)
        if sync_directory:
            try:
                fsync_directory(self.directory)
            except OSError as err:
                raise KafkaStorageError(f"cannot fsync {self.directory}: {err}") from err

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        for segment in self.segments:
            segment.close()

    def delete_directory(self) -> None:
        """Delete every segment and remove the directory. Not `close` first: that would write
        queued index entries, and create the index files of a segment that has none yet, only for
        them to be removed (and a rollback of a creation that failed for want of descriptors or
        space would fail again on them)."""
        for segment in self.segments:
            segment.delete()
        try:
            shutil.rmtree(self.directory)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise KafkaStorageError(f"cannot delete {self.directory}: {err}") from err
