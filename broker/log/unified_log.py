"""UnifiedLog: one partition's log as the rest of the broker sees it (Kafka's UnifiedLog).

    {topic}-{partition}/
        {base_offset:020d}.log|.index|.timeindex   segments (segment.py), oldest first
        *.deleted                                  segments removed by retention or replaced by
                                                   the log cleaner, awaiting unlink
        *.cleaned, *.swap                          a segment the log cleaner writes / swaps in
        leader-epoch-checkpoint                    "epoch start_offset" lines (leader_epoch.py)
        {base_offset:020d}.txnindex                aborted transactions whose ABORT marker the segment
                                                   holds (txn_index.py); only where there is one
        {offset:020d}.snapshot                     producer state below `offset` (producer_state.py),
                                                   taken at each roll and at a clean close
        partition.metadata                         the topic id this directory belongs to

Offsets, each checkpointed per log directory by the LogManager:

    log_start_offset <= local_log_start_offset <= ... <= high_watermark <= log_end_offset
                        (equal until segments tier)     (consumers read below it)

- `log_end_offset` (LEO): the next offset to assign.
- `high_watermark`: what consumers may read. The partition layer moves it (to the LEO on a single
  broker; to the minimum LEO of the ISR once replicated); this class only keeps it in bounds.
- `recovery_point`: every offset below it is fsynced. A crash re-validates only what follows it.
- `log_start_offset`: the first offset kept; `local_log_start_offset` the first kept on local disk.

Appends come in two kinds: `append_as_leader` validates and assigns offsets by patching headers;
`append_as_follower` keeps the offsets and epochs a leader assigned and rolls at the batch's base.
Either fails whole: on an error nothing of the append stays visible (a write that failed part way
is cut back), and if even that fails, the log directory goes offline.

Producer state (producer_state.py, Kafka's ProducerStateManager): batches with a producer id are
checked by the leader against their producer's last batches before anything is written (a retry
of one of them is answered with its original offsets, not written again; gaps and older epochs
are refused); followers and recovery replay them unchecked. The state is rebuilt on open from the
newest snapshot at or below the log end plus the batch headers after it, and reloaded the same way
whenever the log's end is cut (truncation, a failed append).

Durability: `flush` (from a worker thread) fsyncs and then advances the recovery point. A failed
fsync takes the whole log directory offline (`LogDirFailure`): the kernel may have dropped the
dirty pages, so a later fsync that succeeds would launder the loss. Nothing retries it.

Compaction (cleanup.policy=compact): the log cleaner reads sealed segments below
`cleanable_segments().end_offset` without the lock (Segment.detached_reader), writes a cleaned
segment, and swaps it in with `replace_segments`, which checks under the lock that the segments
are still there as they were read. Retention by time and size applies only to logs whose
cleanup.policy has delete.

Tiered storage (docs/architecture.md, Tiered storage): when the log is `tiered` (the broker runs the remote log
manager and the topic has remote.storage.enable), the RemoteLogManager uploads sealed segments and
records the highest offset the remote store holds here (`update_remote_log_state`). Local
retention (local.retention.ms/bytes) then deletes only segments wholly at or below it, moving
`local_log_start_offset`; `log_start_offset` stays the start of the whole log (remote plus local),
moved only by the remote log manager once expired remote segments left the manifest. Reads below
the local log start raise OffsetMovedToTieredStorageError: the fetch handler reads them from the
remote tier. Compacted logs tier too: the cleaner never replaces a segment that is uploaded or
being uploaded (`pin_for_upload`), so each uploaded segment is exactly one local segment.

Locking: every public method may be called from any thread. Three locks, always taken in this
order, each guarding a narrower thing than the one before:

- the maintenance lock (`_maintenance_lock`) serializes what rewrites or syncs the log as a whole:
  `flush`, retention, truncation, the cleaner's swap, `close`, `delete`, `rename_directory`. It
  may be held across fsyncs and renames. The event loop never takes it.
- the append lock (`_append_lock`) serializes changes to the log's bytes: appends (their pwrite,
  rolls with file creation and index writes, the leader-epoch checkpoint), truncation, and the
  start of a flush (index entries written, descriptors duplicated). It may be held across
  writes, never across an fsync of the segments. The event loop takes it only to append a small
  batch inline; `broker/log_writer.py` never lets such an append queue behind a large one of the
  same log, so it never waits for another append's I/O.
- the view lock (`_lock`, owned by LocalLog) guards what readers see: the segment list, each
  segment's published size and index entries, the offsets (LEO, high watermark, log start,
  recovery point), the upload pin. It is held for in-memory changes only: a writer does its I/O
  first and then publishes under it, so `read`, `update_high_watermark` and the other calls of
  the event loop never wait for the disk, and a reader never sees bytes past the published end.
  Two exceptions, both off the produce/fetch path: the renames that make the cleaner's swapped
  segment live, and a follower's truncation (`truncate_to`, `truncate_fully_and_start_at`), which
  cut files and the view together.

`needs_flush` and `durable_end_offset` read without a lock: an append demands its flush
(`_must_flush_to`) before its offsets are published, so neither ever sees an LEO the flush policy
has not yet accounted for.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from broker.config import LogConfig
from broker.histogram import Histogram
from broker.log.checkpoint import read_partition_metadata, write_partition_metadata
from broker.log.file_cache import FileCache
from broker.log.leader_epoch import LeaderEpochCache
from broker.log.local_log import LocalLog, SegmentsRemovedError, SwapFailedError
from broker.log.log_dir_space import LogDirSpace
from broker.log.log_loader import LogLoader
from broker.log.producer_state import (
    DEFAULT_MAX_PRODUCERS,
    CorruptSnapshotError,
    ProducerEntry,
    ProducerStateManager,
    decode_snapshot,
)
from broker.log.segment import BatchInfo, FetchSlice, Segment
from common.errors import (
    CorruptMessageError,
    InconsistentTopicIdError,
    KafkaStorageError,
    OffsetOutOfRangeError,
)
from segment_format import batch_body, control_batch, record
from segment_format.txn_index import AbortedTxn, collect_aborted

log = logging.getLogger(__name__)

LEADER_EPOCH_FILE = "leader-epoch-checkpoint"
INT64_END = 2**63  # past every offset


class OffsetMovedToTieredStorageError(OffsetOutOfRangeError):
    """The offset is in the log but below the local log start: only the remote tier holds it
    (Kafka's OffsetMovedToTieredStorageException). The replica manager reads it from there; any
    other reader sees OFFSET_OUT_OF_RANGE (not a wire code of its own)."""

    @classmethod
    def name(cls) -> str:
        return OffsetOutOfRangeError.name()


class LogDirFailure:
    """Shared by every log of one directory: once an fsync (or a write that could not be undone)
    failed there, the directory is offline and every operation on its logs raises
    KafkaStorageError (KAFKA_STORAGE_ERROR on the wire) until the broker restarts. It also times
    the directory's log flushes (`sync_seconds`, Kafka's LogFlushRateAndTimeMs), from the flush
    workers, under a lock."""

    def __init__(self, directory: Path | None = None) -> None:
        self.error: KafkaStorageError | None = None
        self.space = LogDirSpace(directory or Path("."))  # appends refused for lack of space (not offline)
        self.sync_seconds = Histogram()
        self._sync_lock = threading.Lock()

    def synced(self, seconds: float) -> None:
        with self._sync_lock:
            self.sync_seconds.observe(seconds)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def fail(self, err: KafkaStorageError) -> None:
        if self.error is None:
            log.error("log directory offline: %s", err)
            self.error = err

    def check(self) -> None:
        if self.error is not None:
            raise KafkaStorageError(f"log directory is offline after an I/O failure: {self.error}")


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an append landed. `log_append_time_ms` is -1 unless the topic uses LogAppendTime.

    `batch_offsets`: each batch's base offset, in the order of the record set, when they do not
    follow from `first_offset` and the record counts: an idempotent producer's retry whose leading
    batches were written before (duplicates answered with their original offsets) and whose
    others were appended now. None otherwise (the usual case)."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_count: int
    batch_offsets: tuple[int, ...] | None = None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class CleanableSegments:
    """What the log cleaner may clean, read at one instant under the log's lock."""

    segments: list[Segment]  # the sealed segments wholly below end_offset, oldest first
    end_offset: int  # min(active segment's base, high watermark, recovery point)
    log_start_offset: int
    active_base_offset: int
    generation: int  # truncations so far: a truncation rewrites sealed segments in place

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)


class UnifiedLog:
    """Build with `UnifiedLog.open` (from a worker thread: it may recover and fsync)."""

    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig, local: LocalLog,
                 epochs: LeaderEpochCache, clock: Callable[[], int], dir_failure: LogDirFailure, topic_id: str | None,
                 max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config
        self._local = local
        self._epochs = epochs
        self._clock = clock
        self._dir_failure = dir_failure
        self._maintenance_lock = threading.Lock()  # flush, retention, truncation, swap, close: may fsync
        self._append_lock = threading.Lock()  # one writer of the log's bytes at a time: may pwrite
        self._lock = local.lock  # the view lock: in-memory state readers see, never held across I/O
        self._first_unflushed_ms: int | None = None
        self._must_flush_to = 0  # the flush policy demands offsets below this be fsynced before they count
        self._roll_flush_to = 0  # segments sealed by a roll end here: flush them (Kafka flushes on roll)
        self._closed = False
        self._truncations = 0  # cuts of the log's end: a flush in flight across one vouches for nothing
        self.log_start_offset = local.start_offset
        self.high_watermark = local.log_end_offset
        self.remote_storage = False  # the broker runs tiered storage (open's remote_storage)
        self.tiered = False  # remote_storage and the topic's remote.storage.enable
        self.highest_offset_in_remote_storage = -1  # -1 until the remote log manager read the manifest
        self._remote_state_known = False  # update_remote_log_state ran (the cleaner waits for it)
        self._upload_pin: Segment | None = None  # being uploaded: the cleaner must not replace it
        self._swapping: list[Segment] = []  # being replaced by the cleaner: tiering must not pin them
        self.last_recovery_truncated_bytes = 0
        self.recovered_bytes = 0  # what the last open re-validated after the recovery point
        self.damaged_segments = 0
        self.producers = ProducerStateManager(directory, f"{topic}-{partition}", max_producers)  # under the append lock
        # Batches of the append being written, not yet in `producers`: (header, base offset,
        # max timestamp, marker of a control batch) in offset order; a roll applies those below
        # the new segment's base before it snapshots there.
        self._pending_producer_batches: list[_PendingBatch] = []
        local.on_roll = self._snapshot_on_roll

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        *,
        topic_id: str | None = None,
        cache: FileCache | None = None,
        clock: Callable[[], int] = batch_body.now_ms,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        high_watermark: int | None = None,
        dir_failure: LogDirFailure | None = None,
        leader_epoch: int | None = None,
        durable: bool = True,
        remote_storage: bool = False,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> UnifiedLog:
        """Create the directory with one empty segment, or load it and recover what follows
        `recovery_point`. With `topic_id`, a directory that belongs to another incarnation of the
        topic raises InconsistentTopicIdError (the caller moves it aside). `leader_epoch`, if
        newer than the log's, starts at the LEO. `durable=False` leaves the new files unsynced for
        a caller that creates many logs and syncs the filesystem once. `remote_storage`: the broker
        runs tiered storage (the topic's remote.storage.enable then makes the log `tiered`, and
        the checkpointed `log_start_offset` may lie below the local segments). `max_producers`:
        producer.state.max.producers.per.partition. Raises KafkaStorageError if the directory
        cannot be used."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stored_id = read_partition_metadata(directory)
            if topic_id is not None and stored_id is not None and stored_id != topic_id:
                raise InconsistentTopicIdError(
                    f"{directory} belongs to topic id {stored_id}, not {topic_id}: a stale directory of a deleted topic")
            cache = cache if cache is not None else FileCache()  # an empty cache is falsy (len 0)
            epochs = LeaderEpochCache.load(directory / LEADER_EPOCH_FILE)
            loaded = LogLoader(directory, config, cache, recovery_point, _epoch_replayer(epochs)).load(log_start_offset)
            local = LocalLog(directory, config, loaded.segments, loaded.recovery_point, cache)
            if local.segments.active.damage is not None:
                local.roll()  # new data starts clean after a tail that cannot be framed
            # Epochs past the log end have no records here (they never reached the disk), nor have
            # those from the end when recovery cut a torn tail there. Otherwise one starting at the
            # log end is kept: it is the epoch a leader starts before its first record, and
            # rewriting it on every open (two fsyncs per partition, and again when leadership is
            # taken back) made restarts with many partitions take minutes.
            epochs.truncate_from_end(local.log_end_offset + (0 if loaded.truncated_bytes else 1))
            if loaded.recovered:
                # Recovered bytes may sit in the page cache only: sync them once, and everything
                # up to the LEO is known durable.
                local.sync(local.prepare_flush(local.log_end_offset), True)
                local.recovery_point = local.log_end_offset
            if topic_id is not None and stored_id is None:
                write_partition_metadata(directory, topic_id, durable=durable)
                local.dir_dirty = True
            if leader_epoch is not None and (epochs.latest_epoch is None or leader_epoch > epochs.latest_epoch):
                epochs.assign(leader_epoch, local.log_end_offset, durable=durable)
        except OSError as err:
            raise KafkaStorageError(f"cannot load {directory}: {err}") from err
        unified = cls(directory, topic, partition, config, local, epochs, clock, dir_failure or LogDirFailure(directory.parent),
                      topic_id, max_producers)
        unified.remote_storage = remote_storage
        unified.tiered = remote_storage and config.remote_storage_enable
        if unified.tiered:
            # The whole log starts where the remote one does, below the local segments.
            unified.log_start_offset = min(log_start_offset, local.start_offset)
        else:
            unified.log_start_offset = min(max(log_start_offset, local.start_offset), local.log_end_offset)
        hw = local.log_end_offset if high_watermark is None else high_watermark
        unified.high_watermark = min(max(hw, unified.log_start_offset), local.log_end_offset)
        unified.last_recovery_truncated_bytes = loaded.truncated_bytes
        unified.recovered_bytes = sum(segment.size for segment in loaded.recovered)
        unified.damaged_segments = len(loaded.damaged)
        try:
            unified._load_producer_state(loaded.snapshot_offsets)
        except (KafkaStorageError, CorruptMessageError):
            local.close()
            raise
        return unified

    def __repr__(self) -> str:
        return f"UnifiedLog({self.topic}-{self.partition}, offsets {self.log_start_offset}..{self.log_end_offset})"

    # --- state -----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._local.log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def local_log_start_offset(self) -> int:
        return self._local.start_offset

    @property
    def offline(self) -> bool:
        return self._dir_failure.failed

    @property
    def leader_epoch_entries(self) -> list[tuple[int, int]]:
        """(epoch, start_offset) pairs from the leader-epoch checkpoint, oldest first."""
        with self._lock:
            return self._epochs.entries

    @property
    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._epochs.latest_epoch

    def update_config(self, config: LogConfig) -> None:
        """Apply new topic configs; they govern the next append, roll, retention and flush check."""
        with self._lock:
            self.config = config
            self._local.config = config
            # Once tiered, a log stays tiered until the broker restarts (its log start is the remote one's).
            self.tiered = self.tiered or (self.remote_storage and config.remote_storage_enable)

    def segments(self) -> list[Segment]:
        """A snapshot of the segments, oldest first; the last is the active one."""
        with self._lock:
            return self._local.segments.snapshot()

    def size_bytes(self) -> int:
        with self._lock:
            return self._local.segments.size_bytes()

    def _check_usable(self) -> None:
        self._dir_failure.check()
        if self._closed:
            raise KafkaStorageError(f"{self.topic}-{self.partition} is closed")

    # --- high watermark and epochs ---------------------------------------------------------

    def update_high_watermark(self, offset: int) -> int:
        """Move the high watermark to `offset` kept within [log_start_offset, LEO]; returns it."""
        with self._lock:
            self.high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)
            return self.high_watermark

    def maybe_increment_high_watermark(self, offset: int) -> bool:
        """Advance the high watermark to `offset` (bounded by the LEO) if that is forward."""
        with self._lock:
            new = min(offset, self.log_end_offset)
            if new <= self.high_watermark:
                return False
            self.high_watermark = new
            return True

    @property
    def durable_end_offset(self) -> int:
        """The end of what the flush policy lets count as committed: the LEO, unless an append
        that the policy said must be fsynced first is still waiting for its flush (then the
        recovery point). The partition never moves the high watermark past it."""
        return self.log_end_offset if self.recovery_point >= self._must_flush_to else self.recovery_point

    def assign_epoch_start_offset(self, epoch: int, start_offset: int | None = None) -> None:
        """Record that `epoch` starts at `start_offset` (default LEO): a new leader calls this as it
        takes over (Kafka's makeLeader), so a leader's appends never write the checkpoint. Writes
        and fsyncs the checkpoint (under the append lock: readers do not wait): call from a worker
        thread."""
        with self._append_lock:
            self._check_usable()
            latest = self._epochs.latest_epoch
            if latest is None or epoch > latest:
                self._epochs.assign(epoch, self.log_end_offset if start_offset is None else start_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetsForLeaderEpoch answers a follower (LeaderEpochCache)."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    # --- append ----------------------------------------------------------------------------

    def append_as_leader(self, payload: memoryview | bytearray, leader_epoch: int, coordinator: bool = False) -> AppendInfo:
        """Validate every batch of `payload`, assign offsets from the LEO by patching headers in
        place, and write all of it (one write per segment it spans).

        `payload` must be writable: base offsets, leader epochs and (for LogAppendTime) timestamps
        and CRCs are rewritten in it. If any batch is invalid nothing is written:
        CorruptMessageError, InvalidRecordError (a batch no producer may write),
        InvalidTimestampError, MessageTooLargeError. KafkaStorageError if the disk fails (nothing
        of the append stays). O(batches) Python work; each body is decoded and validated by Arrow
        (O(records) in C++, zero-copy unless compressed) before the append lock is taken.

        Batches with a producer id are checked against the producer state first (nothing is
        written if one fails): InvalidProducerEpochError, OutOfOrderSequenceError. Leading
        batches that repeat one of their producer's last five are not written again: they are
        answered with their original offsets (`batch_offsets` lists every batch's then), and a
        record set of duplicates only writes nothing.

        `coordinator`: the broker's own coordinator writes the batches (Kafka's COORDINATOR
        origin): a transactional batch with a producer id and no sequence (a TxnOffsetCommit's
        offsets) is checked for its epoch only, and starts the producer's transaction here.
        """
        with memoryview(payload).cast("B") as view:  # released on return: the caller may reuse the buffer
            if view.readonly:
                raise TypeError("append needs a writable buffer: offsets are patched in place")
            headers = self._validate(view, coordinator=coordinator)  # the CRCs: before any lock
            with self._append_lock:  # the LEO moves only under it: offsets assigned here stay unique
                self._check_usable()
                now = self._clock()
                if any(header.producer_id >= 0 for _, header in headers):  # the plain path's only cost
                    return self._append_idempotent(view, headers, leader_epoch, now, coordinator)
                batches = self._assign_offsets(view, headers, leader_epoch, now)
                self._write_as_leader(view, batches, leader_epoch, now)
                return AppendInfo(
                    first_offset=batches[0].base_offset,
                    last_offset=batches[-1].next_offset - 1,
                    log_append_time_ms=now if self._log_append_time else -1,
                    log_start_offset=self.log_start_offset,
                    record_count=batches[-1].next_offset - batches[0].base_offset,
                )

    def _append_idempotent(self, view: memoryview, headers: list[tuple[int, record.BatchHeader]], leader_epoch: int,
                           now: int, coordinator: bool = False) -> AppendInfo:
        """append_as_leader for a record set with producer ids (under the append lock)."""
        plan = self.producers.plan_leader_append(headers, coordinator)
        duplicate_offsets = [batch.first_offset for batch in plan.duplicates]
        if plan.first_new == len(headers):  # a retry of what is written already
            return AppendInfo(duplicate_offsets[0], plan.duplicates[-1].last_offset, -1, self.log_start_offset,
                              sum(header.last_offset_delta + 1 for _, header in headers), tuple(duplicate_offsets))
        new = headers
        if plan.first_new:  # leading duplicates: write from the first new batch on
            start = headers[plan.first_new][0]
            new = [(position - start, header) for position, header in headers[plan.first_new:]]
            view = view[start:]
        batches = self._assign_offsets(view, new, leader_epoch, now)
        self._pending_producer_batches = [
            _PendingBatch(header, batch.base_offset, batch.max_timestamp, None)
            for (_, header), batch in zip(new, batches) if header.producer_id >= 0]
        self._write_as_leader(view, batches, leader_epoch, now)
        self._apply_pending_producer_batches(INT64_END)
        log_append_time_ms = now if self._log_append_time else -1
        if not duplicate_offsets:
            return AppendInfo(batches[0].base_offset, batches[-1].next_offset - 1, log_append_time_ms,
                              self.log_start_offset, batches[-1].next_offset - batches[0].base_offset)
        return AppendInfo(duplicate_offsets[0], batches[-1].next_offset - 1, log_append_time_ms, self.log_start_offset,
                          sum(header.last_offset_delta + 1 for _, header in headers),
                          tuple(duplicate_offsets + [batch.base_offset for batch in batches]))

    def append_transaction_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                                  leader_epoch: int) -> AppendInfo:
        """Write a COMMIT or ABORT marker ending `producer_id`'s transaction in this partition
        (the leader's side of WriteTxnMarkers; Kafka's appendAsLeader with origin COORDINATOR).
        InvalidProducerEpochError if `producer_epoch` is older than the known one,
        TransactionCoordinatorFencedError if `coordinator_epoch` is older than the last marker's
        for this producer; nothing is written then. A marker for a producer with no ongoing
        transaction here is still written (Kafka does). An ABORT adds the transaction to the
        index of the segment holding the marker. KafkaStorageError as any append."""
        with self._append_lock:
            self._check_usable()
            self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            now = self._clock()
            payload = control_batch.encode_marker(producer_id, producer_epoch, commit, coordinator_epoch, now)
            view = memoryview(payload)
            header = record.read_header(view)
            batches = self._assign_offsets(view, [(0, header)], leader_epoch, now)
            marker = control_batch.EndTransactionMarker(commit, coordinator_epoch)
            self._pending_producer_batches = [_PendingBatch(header, batches[0].base_offset, now, marker)]
            self._write_as_leader(view, batches, leader_epoch, now)
            self._apply_pending_producer_batches(INT64_END)
            return AppendInfo(batches[0].base_offset, batches[0].base_offset,
                              now if self._log_append_time else -1, self.log_start_offset, 1)

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read below: the first offset of the oldest ongoing
        transaction, bounded by the high watermark (Kafka's LSO). Lock-free read of the producer
        state's cached bound (an int, replaced whole under the append lock)."""
        unstable = self.producers.first_unstable_offset
        high_watermark = self.high_watermark
        return high_watermark if unstable is None else min(unstable, high_watermark)

    def collect_aborted_transactions(self, start_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of every aborted transaction whose data may lie in
        [start_offset, upper_bound): entries with last_offset >= start_offset and first_offset <
        upper_bound, from the transaction indexes of the local segments from the one holding
        `start_offset` on (a transaction's marker may be in a later segment than its data;
        Kafka's collectAbortedTxns), up to the first whose entries reach a last stable offset of
        `upper_bound` (every transaction started below it ended by then). A read_committed
        reader drops those producers' batches from each first offset on, up to their ABORT
        marker. O(segments scanned + entries); an index is read from its file on first use (the
        loader marks the segments without one)."""
        with self._lock:
            self._check_usable()
            segments = self._local.segments.holding(start_offset)
        found: list[tuple[int, int]] = []
        for segment in segments:
            entries = segment.txn_index.entries
            if entries:
                found += collect_aborted(entries, start_offset, upper_bound)
                if entries[-1].last_stable_offset >= upper_bound:
                    break
        return found

    def _write_as_leader(self, view: memoryview, batches: list[BatchInfo], leader_epoch: int, now: int) -> None:
        """Record the leader epoch at the first offset if it is new, then write (under the append lock)."""
        epochs_before = len(self._epochs)
        if leader_epoch >= 0:
            latest = self._epochs.latest_epoch
            if leader_epoch != latest:  # before the data: an epoch entry never lags its records
                self._epochs.assign(leader_epoch, batches[0].base_offset)
        self._write(view, batches, now, epochs_before)

    def append_as_follower(self, payload: memoryview | bytes | bytearray) -> AppendInfo:
        """Append batches exactly as a leader assigned them (offsets and epochs kept), after
        checking they are valid and follow the LEO. Epochs the batches bring are recorded."""
        view = memoryview(payload).cast("B")
        headers = self._validate(view, from_producer=False)
        with self._append_lock:
            self._check_usable()
            expected = self.log_end_offset
            batches = []
            for position, header in headers:
                if header.base_offset < expected:
                    raise CorruptMessageError(
                        f"{self.topic}-{self.partition}: follower batch at offset {header.base_offset} does not follow {expected}")
                batches.append(BatchInfo(header.base_offset, header.next_offset, header.size, header.max_timestamp))
                expected = header.next_offset
            epochs_before = len(self._epochs)
            for _, header in headers:
                latest = self._epochs.latest_epoch
                if header.partition_leader_epoch >= 0 and (latest is None or header.partition_leader_epoch > latest):
                    self._epochs.assign(header.partition_leader_epoch, header.base_offset)
            self._pending_producer_batches = [
                _PendingBatch(header, header.base_offset, header.max_timestamp,
                              control_batch.decode_marker(view, position) if header.is_control else None)
                for position, header in headers if header.producer_id >= 0]
            self._write(view, batches, self._clock(), epochs_before)
            self._apply_pending_producer_batches(INT64_END)
            return AppendInfo(batches[0].base_offset, batches[-1].next_offset - 1, -1, self.log_start_offset,
                              sum(h.record_count for _, h in headers))

    def _write(self, view: memoryview, batches: list[BatchInfo], now: int, epochs_before: int) -> None:
        """Write batches whose offsets are assigned (under the append lock; LocalLog publishes
        them under the view lock once written); on failure cut the log back to where it was, and
        forget the epoch entries the append added (those past the first `epochs_before`)."""
        first_offset = self.log_end_offset
        end_offset = batches[-1].next_offset
        if end_offset - self.recovery_point >= self.config.flush_messages or self.config.flush_ms == 0:
            # Before the LEO moves: durable_end_offset, read without a lock, must not count these
            # offsets as committed before their flush.
            self._must_flush_to = end_offset
        try:
            sealed = self._local.append(view, batches, now)
        except KafkaStorageError as err:
            self._pending_producer_batches = []
            self._restore(first_offset, epochs_before)
            self._dir_failure.space.write_failed(err)
            raise
        self._dir_failure.space.write_succeeded()
        if sealed:
            self._roll_flush_to = max(self._roll_flush_to, sealed[-1].next_offset)
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now

    def _restore(self, offset: int, epochs_before: int) -> None:
        """Undo a partly written append; if even that fails the directory goes offline. Only the
        append's own epoch entries go: one a new leader recorded at the LEO before it stays."""
        self._must_flush_to = min(self._must_flush_to, offset)
        try:
            self._local.truncate_to(offset)
            self._epochs.keep_first(epochs_before)
            self._reload_producer_state()  # a roll may have applied some of the append's batches
        except (KafkaStorageError, CorruptMessageError) as err:
            self._dir_failure.fail(KafkaStorageError(str(err)))

    @property
    def _log_append_time(self) -> bool:
        return self.config.message_timestamp_type == "LogAppendTime"

    def _validate(self, view: memoryview, from_producer: bool = True,
                  coordinator: bool = False) -> list[tuple[int, record.BatchHeader]]:
        """(position, header) of every batch; raises on the first bad one or a partial tail.
        `from_producer`: also what a producer may not write (InvalidRecordError), its
        timestamps (>= 0, the CreateTime window of KIP-937, the body's equal to the header's)
        and its body, decompressed and validated in full (what every consumer checks)."""
        if not len(view):
            raise CorruptMessageError("empty record set")
        batches, position, config = [], 0, self.config
        bounds = None if self._log_append_time else record.TimestampBounds(
            config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms)
        producer = (record.ProducerInput(self._clock(), bounds, config.message_decompressed_max_bytes, coordinator)
                    if from_producer else None)
        while position < len(view):
            header = record.validate_batch(view, position, max_batch_bytes=config.max_message_bytes, producer=producer)
            batches.append((position, header))
            position += header.size
        return batches

    def _assign_offsets(self, view: memoryview, headers: list[tuple[int, record.BatchHeader]], leader_epoch: int,
                        now: int) -> list[BatchInfo]:
        """Patch base offset and epoch into each header (the CRC does not cover them)."""
        batches, next_offset, log_append_time = [], self.log_end_offset, self._log_append_time
        for position, header in headers:
            max_timestamp = header.max_timestamp
            if log_append_time:
                record.stamp_log_append_time(view, position, header, next_offset, leader_epoch, now)
                max_timestamp = now
            else:
                record.patch_offsets(view, position, next_offset, leader_epoch)
            span = header.last_offset_delta + 1
            batches.append(BatchInfo(next_offset, next_offset + span, header.size, max_timestamp))
            next_offset += span
        return batches

    # --- producer state --------------------------------------------------------------------

    def _apply_pending_producer_batches(self, below: int) -> None:
        """Move the written batches of the current append that start below `below` into the
        producer state, and the transactions their markers aborted into the index of the segment
        holding the marker (under the append lock)."""
        pending = self._pending_producer_batches
        applied = 0
        for header, base_offset, timestamp, marker in pending:
            if base_offset >= below:
                break
            if marker is not None:
                self._complete_txn(self.producers, header.producer_id, header.producer_epoch, base_offset, marker,
                                   timestamp)
            else:
                self.producers.apply(header.producer_id, header.producer_epoch, header.base_sequence,
                                     header.last_offset_delta, base_offset, timestamp, header.is_transactional)
            applied += 1
        self._pending_producer_batches = pending[applied:]

    def _complete_txn(self, state: ProducerStateManager, producer_id: int, epoch: int, marker_offset: int,
                      marker: control_batch.EndTransactionMarker, timestamp: int) -> None:
        """A marker was written at `marker_offset`: end the producer's transaction; an aborted one
        goes into the transaction index of the segment holding the marker (Kafka's TxnIndex)."""
        completed = state.complete_txn(producer_id, epoch, marker_offset, marker, timestamp)
        if completed is not None and completed.aborted and state is self.producers:
            segments = self._local.segments
            segments[segments.floor_index(marker_offset)].txn_index.append(AbortedTxn(
                completed.producer_id, completed.first_offset, completed.last_offset, completed.last_stable_offset))

    def _snapshot_on_roll(self, base_offset: int) -> None:
        """LocalLog is about to seal the active segment and start one at `base_offset`: snapshot
        the producer state as of there (Kafka's takeSnapshot on roll), so a reload replays at most
        the segments after it. Under the append lock."""
        self._apply_pending_producer_batches(base_offset)
        self.producers.take_snapshot(base_offset)

    def _load_producer_state(self, listed_snapshots: list[int] | None = None) -> None:
        """Load the newest snapshot at or below the log end and replay the batches after it (on
        open, and whenever the end was cut), rebuilding the aborted transaction index of the
        replayed range from its markers. Under the append lock, or before the log is shared."""
        end = self.log_end_offset
        loaded = self.producers.load(end, listed=listed_snapshots)
        start = max(loaded, self._local.start_offset)
        if loaded < self._local.start_offset:
            self.producers.clear()  # older than the local segments, or none: rebuild from the local log
            start = self._local.start_offset
        for segment in self._local.segments:
            if segment.next_offset <= start:
                continue
            if segment.base_offset < start:
                segment.txn_index.truncate_to(start)  # its entries below `start` are the snapshot's past
            else:
                segment.txn_index.reset()
            if segment.size:
                self._replay(self.producers, segment, start, INT64_END)
        self.producers.remove_below(self.log_start_offset)

    def _replay(self, state: ProducerStateManager, segment: Segment, start: int, end: int) -> None:
        """Replay `segment`'s batches in [start, end) into `state` (markers decoded: control
        batches are one small record each)."""
        try:
            for position, header in segment.headers_from(start):
                if header.base_offset >= end:
                    break
                if header.producer_id < 0:
                    continue
                if header.is_control:
                    marker = control_batch.decode_marker(segment.batch_bytes(position, header.size))
                    self._complete_txn(state, header.producer_id, header.producer_epoch, header.base_offset, marker,
                                       header.max_timestamp)
                else:
                    state.replay(header)
        except CorruptMessageError as err:
            # Damage recovery recorded (readers get CORRUPT_MESSAGE there): the batches past it
            # cannot be framed, so their producers' state is incomplete, never invented.
            log.error("%s: producer state replay stopped in %s: %s", self, segment.log_path.name, err)

    def _reload_producer_state(self) -> None:
        """The log's end was cut: snapshots past it go, and the state is rebuilt up to it."""
        self._pending_producer_batches = []
        self._load_producer_state()

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for `expiration_ms` (producer.id.expiration.ms) with no ongoing
        transaction; returns how many. O(producers of this partition), from the retention pass."""
        with self._append_lock:
            if self._closed:
                return 0
            return self.producers.remove_expired(now_ms, expiration_ms)

    def producer_snapshot_at(self, offset: int) -> bytes:
        """The encoded producer state of every batch below `offset` (a sealed segment's next
        offset), which tiering uploads with that segment: the `{offset}.snapshot` taken at the
        roll, or, if there is none (a follower's segments roll at batch bases, an older log), one
        rebuilt from the newest snapshot below plus the headers up to `offset` and written first.
        Under the maintenance lock (no truncation, retention or swap meanwhile), so appends go on.
        From a worker thread; KafkaStorageError if the files cannot be read or written."""
        with self._maintenance_lock:
            self._check_usable()
            path = self.producers.snapshot_path(offset)
            try:
                data = path.read_bytes()
                decode_snapshot(data, str(path))
                return data
            except (FileNotFoundError, CorruptSnapshotError):
                pass
            except OSError as err:
                raise KafkaStorageError(f"cannot read {path}: {err}") from err
            state = ProducerStateManager(self.directory, self.producers.name)
            start = state.load(offset, delete=False)
            if start < self._local.start_offset:
                state.clear()
                start = self._local.start_offset
            for segment in self.segments():
                if segment.next_offset <= start or segment.base_offset >= offset or not segment.size:
                    continue
                self._replay(state, segment, start, offset)
            state.take_snapshot(offset)
            return path.read_bytes()

    def producer_entries(self) -> dict[int, ProducerEntry]:
        """A copy of the producer state (tests, tooling)."""
        with self._append_lock:
            return {pid: entry.copy() for pid, entry in self.producers.entries.items()}

    # --- read ------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FetchSlice:
        """Bytes of one segment from the batch holding `offset`, below `max_offset` (default: the
        high watermark; a follower reads to the LEO). KIP-74: the whole first batch even past
        `max_bytes`; the end may cut a batch. Empty at or past `max_offset`.
        OffsetOutOfRangeError outside [log_start_offset, LEO]; OffsetMovedToTieredStorageError
        below the local log start (the remote tier holds it: broker/remote_log/remote_log_reader.py)."""
        with self._lock:
            self._check_usable()
            if self.log_start_offset <= offset < self.local_log_start_offset:
                raise OffsetMovedToTieredStorageError(
                    f"{self.topic}-{self.partition}: offset {offset} is in remote storage (below the local log "
                    f"start {self.local_log_start_offset})")
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range for {self.topic}-{self.partition}: "
                    f"[{self.log_start_offset}, {self.log_end_offset}]"
                )
            upper = self.high_watermark if max_offset is None else min(max_offset, self.log_end_offset)
            if offset >= upper:
                return FetchSlice.empty(offset)
            return self._local.read(offset, max_bytes, upper, self.log_start_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record with timestamp >= `timestamp_ms` below the
        high watermark (Kafka's ListOffsets), or None if every such record is older."""
        with self._lock:
            self._check_usable()
            found = self._local.offset_for_timestamp(timestamp_ms, self.log_start_offset)
            if found is None or found[0] >= self.high_watermark:
                return None
            return found

    # --- truncation (replication) ----------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Cut the log so that it ends before `offset` (a follower diverged from its leader).
        Below the local log start the log is emptied and restarts at `offset`. Returns bytes removed.
        From a worker thread: it waits for a flush in flight (the maintenance lock)."""
        with self._maintenance_lock, self._append_lock:
            self._check_usable()
            if offset >= self.log_end_offset:
                return 0
            if offset < self.local_log_start_offset:
                return self._truncate_fully(offset)
            removed = self._local.truncate_to(offset)
            with self._lock:
                self._truncations += 1
                self.high_watermark = min(self.high_watermark, self.log_end_offset)
                # Offsets cut away need no fsync: a flush can never reach them, so needs_flush must not wait for them.
                self._must_flush_to = min(self._must_flush_to, self.log_end_offset)
                self._roll_flush_to = min(self._roll_flush_to, self.log_end_offset)
                if self.recovery_point >= self.log_end_offset:
                    self._first_unflushed_ms = None
            self._epochs.truncate_from_end(self.log_end_offset)  # a checkpoint write: outside the view lock
            self._reload_producer_state()
            return removed

    def truncate_fully_and_start_at(self, offset: int) -> int:
        """Delete every record and continue at `offset` (a follower that fell behind the leader's
        log start). Returns the bytes removed. From a worker thread, as `truncate_to`."""
        with self._maintenance_lock, self._append_lock:
            self._check_usable()
            return self._truncate_fully(offset)

    def _truncate_fully(self, offset: int) -> int:
        """Under the maintenance and append locks."""
        with self._lock:
            removed = self._local.truncate_fully_and_start_at(offset)
            self._truncations += 1
            self.log_start_offset = self.high_watermark = offset
            self._must_flush_to = self._roll_flush_to = 0
            self._first_unflushed_ms = None
        self._epochs.clear()
        self.producers.clear()
        self.producers.delete_all_snapshots()
        return removed

    def rebuild_from_remote(self, offset: int, remote_log_start_offset: int, leader_epochs: list[tuple[int, int]],
                            producer_snapshot: bytes | None = None) -> int:
        """A follower whose fetch position fell below its leader's local log start (Kafka's
        ReplicaFetcherTierStateMachine): delete every record and continue at `offset`, where
        the remote tier's log ends, taking from the tier's manifest what the records below it
        would have told: the log start (`remote_log_start_offset`), that everything below
        `offset` is uploaded, and the leader epochs (`leader_epochs`, (epoch, start offset) at
        each change; the last one in effect at `offset`), which OffsetForLeaderEpoch answers
        from once this replica leads, and the producer state at `offset` (`producer_snapshot`,
        the encoded snapshot the tier keeps with its last segment; None: no producers known).
        CorruptSnapshotError if it is not a valid snapshot (nothing changed then). Returns the
        bytes removed. From a worker thread."""
        with self._maintenance_lock, self._append_lock:
            self._check_usable()
            producers = decode_snapshot(producer_snapshot, f"remote snapshot at {offset}") if producer_snapshot else {}
            removed = self._truncate_fully(offset)
            self.producers.entries = producers
            self.producers.take_snapshot(offset)
            self._epochs.reset_to([entry for entry in leader_epochs if entry[1] < offset])
            with self._lock:
                self._remote_state_known = True
                self.highest_offset_in_remote_storage = offset - 1
                self.log_start_offset = min(remote_log_start_offset, offset)
        return removed

    # --- durability ------------------------------------------------------------------------

    def needs_flush(self, now_ms: int) -> bool:
        """True when the flush policy or a roll asks for an fsync: flush.messages unflushed
        messages, the oldest unflushed one flush.ms old, an append waiting for durability, or a
        sealed segment not yet flushed. False once the log is closed (deleted, renamed aside,
        shut down): `flush` does nothing then, and a caller that flushes while this is True
        would never stop.

        Lock-free: the event loop asks after every append, and a stale answer only moves a flush
        by one check (an append demands its flush before it publishes its offsets)."""
        if self._closed:
            return False
        recovery_point = self._local.recovery_point
        if recovery_point < self._must_flush_to or recovery_point < self._roll_flush_to:
            return True
        first_unflushed_ms = self._first_unflushed_ms
        if first_unflushed_ms is None:
            return False
        return (self.log_end_offset - recovery_point >= self.config.flush_messages
                or now_ms - first_unflushed_ms >= self.config.flush_ms)

    def flush(self, up_to: int | None = None) -> bool:
        """fsync every segment holding offsets in [recovery_point, up_to) (default LEO) and
        advance the recovery point. Returns True if that made a sealed segment durable (the
        caller then checkpoints the recovery point, so a crash re-validates only the tail). From
        a worker thread: the fsyncs run on duplicated fds under the maintenance lock only (no
        truncation can rewrite what they sync), so appends and reads go on meanwhile. A failed
        fsync takes the log directory offline and raises KafkaStorageError; flush state is reset
        only after success."""
        with self._maintenance_lock:
            with self._append_lock:  # index entries are written here, and appends queue them
                if self._closed:  # close() flushed everything
                    return False
                self._check_usable()
                target = self.log_end_offset if up_to is None else min(up_to, self.log_end_offset)
                start = self.recovery_point
                if target <= start:
                    return False
                sealed = sum(1 for segment in self._local.segments.holding(start, target)[:-1])
                fds = self._local.prepare_flush(target)
                sync_directory, self._local.dir_dirty = self._local.dir_dirty, False
            started = time.perf_counter()
            try:
                self._local.sync(fds, sync_directory)
            except KafkaStorageError as err:
                self._dir_failure.fail(err)
                raise
            self._dir_failure.synced(time.perf_counter() - started)
            with self._lock:
                self._local.recovery_point = max(self._local.recovery_point, target)
                if self._local.recovery_point >= self.log_end_offset:
                    self._first_unflushed_ms = None
                return sealed > 0 or target >= self._roll_flush_to > start

    # --- retention -------------------------------------------------------------------------

    def delete_old_segments(self, now_ms: int) -> list[Segment]:
        """Apply retention.ms and retention.bytes to whole segments below the high watermark,
        oldest first. An expired non-empty active segment is rolled first, so the log stays
        writable at the LEO. Removed segments leave the log with their files renamed `*.deleted`;
        they are returned still open so in-flight reads finish: the caller calls
        `Segment.delete()` later. If anything fails after segments left the log, the error is a
        SegmentsRemovedError carrying them, for the caller to delete all the same. From a worker
        thread (renames, a roll, the epoch checkpoint): the segments leave the view under the view
        lock, and their renames, like the roll's file creation, happen outside it."""
        with self._maintenance_lock:
            with self._append_lock:
                self._check_usable()
                with self._lock:
                    deletable = self._deletable_segments(now_ms)
                if not deletable:
                    return []
                if deletable[-1] is self._local.segments.active:
                    self._local.roll()
                error: KafkaStorageError | None = None
                try:
                    removed = self._local.remove_oldest(
                        len(deletable), functools.partial(self._follow_local_start, self.log_start_offset))
                except SegmentsRemovedError as err:
                    # A rename failed part way: the segments renamed before it left the log.
                    removed, error = err.removed, err
                with self._lock:
                    # Nothing below the (local) log start needs recovery: the recovery point may skip ahead.
                    self._local.recovery_point = max(self._local.recovery_point, self.log_start_offset,
                                                     self._local.start_offset)
                    epochs_changed = self._epochs.truncate_from_start(self.log_start_offset, write=False)
                # Kafka's onLogStartOffsetIncremented: producers whose batches all went are dropped,
                # and snapshots below the local log start can no longer be replayed from.
                self.producers.remove_below(self.log_start_offset)
                try:
                    self.producers.delete_snapshots_below(self._local.start_offset)
                except KafkaStorageError as err:
                    error = error or err
            if epochs_changed:
                # Outside the append lock: appends on the event loop must not wait for these
                # fsyncs. Under the maintenance lock, which a close or a rename of the directory
                # takes: a log closed meanwhile writes nothing (its path may be another
                # incarnation's by now).
                try:
                    if not self._closed:
                        self._epochs.write()
                except KafkaStorageError as err:
                    error = error or err
        if error is not None:
            # The caller still gets the removed segments to delete, whatever failed.
            raise SegmentsRemovedError(str(error), removed) from error
        log.info("%s: retention deleted %d segments, log start offset now %d (local %d)", self, len(removed),
                 self.log_start_offset, self.local_log_start_offset)
        return removed

    def _follow_local_start(self, floor: int) -> None:
        """Retention changed the segments in the view (under the view lock, in the same critical
        section): the log start becomes the first local offset, but never below `floor` (its value
        before), so no reader looks for offsets below the first segment left. A tiered log's
        start is the remote log's (update_remote_log_state)."""
        if not self.tiered:
            self.log_start_offset = max(floor, self._local.start_offset)

    def remote_state_wanted(self, now_ms: int) -> bool:
        """Whether reading the remote manifest could let local retention delete more: a tiered log
        whose remote state was never read, or whose local retention is held back only by what it
        knows to be uploaded. A follower reads the manifest only then (reads of object storage cost
        money; one a minute per followed partition would be most of a cluster's requests)."""
        with self._lock:
            if not self.tiered:
                return False
            if not self._remote_state_known:
                return True
            would = [segment for segment in self._deletable_segments(now_ms, uploaded_end=INT64_END)
                     if segment is not self._local.segments.active]  # never uploaded: the leader's is active too
            return bool(would) and would[-1].next_offset > self.highest_offset_in_remote_storage + 1

    def _deletable_segments(self, now_ms: int, uploaded_end: int | None = None) -> list[Segment]:
        """The longest prefix of segments below the high watermark each of which is older than
        retention.ms, leaves at least retention.bytes behind when removed, or lies wholly below
        the log start offset (no reader can reach it: Kafka's log start breach). Retention by
        time and size applies only when cleanup.policy has delete. An empty sealed segment (the
        cleaner emptied it) never stops the prefix: it goes with the next segment that goes.
        `uploaded_end` replaces the end of what is known uploaded (a tiered log's bound)."""
        delete = self.config.delete
        retention_ms = self.config.retention_ms if delete else -1
        retention_bytes = self.config.retention_bytes if delete else -1
        # Tiered: local retention, and only over what the remote store holds (uploaded and committed).
        if not self.tiered:
            uploaded_end = INT64_END
        else:  # compacted too: the remote copy is the one that stays
            retention_ms = self.config.effective_local_retention_ms
            retention_bytes = self.config.effective_local_retention_bytes
            uploaded_end = self.highest_offset_in_remote_storage + 1 if uploaded_end is None else uploaded_end
        segments = self._local.segments
        excess_bytes = segments.size_bytes() - retention_bytes
        deletable: list[Segment] = []
        empty: list[Segment] = []
        for segment in segments:
            if segment.next_offset > self.high_watermark or (not segment.size and segment is segments.active):
                break
            if segment.next_offset > uploaded_end and segment.next_offset > self.log_start_offset:
                break  # not in the remote store yet: its only copy is this one
            if not segment.size:
                empty.append(segment)
                continue
            expired = retention_ms >= 0 and now_ms - segment.max_timestamp > retention_ms
            oversize = retention_bytes >= 0 and excess_bytes - segment.size >= 0
            unreachable = segment.next_offset <= self.log_start_offset
            if not (expired or oversize or unreachable):
                break
            deletable += empty
            deletable.append(segment)
            empty = []
            excess_bytes -= segment.size
        return deletable

    def update_remote_log_state(self, log_start_offset: int, highest_offset: int) -> None:
        """The remote log manager read or committed the manifest: the remote log starts at
        `log_start_offset` and holds every offset up to `highest_offset` (-1: nothing). Local
        retention may then delete local segments wholly at or below `highest_offset`; the log
        start moves up to the remote log's (never down, never past the local segments' start
        unless retention dropped them: the offsets between are gone)."""
        with self._lock:
            self._remote_state_known = True
            self.highest_offset_in_remote_storage = max(self.highest_offset_in_remote_storage, highest_offset)
            if highest_offset < 0 or highest_offset + 1 < self._local.start_offset:
                # Nothing remote, or a gap below the local segments: the log starts locally.
                start = self._local.start_offset
            else:
                start = log_start_offset
            self.log_start_offset = min(max(self.log_start_offset, start), self.log_end_offset)
            self.high_watermark = max(self.high_watermark, self.log_start_offset)

    def pin_for_upload(self, segment: Segment) -> bool:
        """Keep the cleaner from replacing `segment` while it uploads (an uploaded segment must be
        exactly one local segment, or the local copy of its records and the next ones could
        straddle the remote log end and never tier). False if the log no longer holds it."""
        with self._lock:
            if (self._closed or all(s is not segment for s in self._local.segments)
                    or any(s is segment for s in self._swapping)):
                return False
            self._upload_pin = segment
            return True

    def unpin_upload(self) -> None:
        with self._lock:
            self._upload_pin = None

    def _tiering_holds(self, segment: Segment) -> bool:
        """Whether tiering has `segment` (uploaded, being uploaded, or not known yet): the cleaner
        leaves it alone. Under the lock."""
        if not self.tiered:
            return False
        return (not self._remote_state_known or segment is self._upload_pin
                or segment.base_offset <= self.highest_offset_in_remote_storage)

    def local_segments_above(self, offset: int) -> list[Segment]:
        """The segments holding offsets at or above `offset` (remote retention counts their bytes)."""
        with self._lock:
            return [segment for segment in self._local.segments if segment.next_offset > offset]

    # --- compaction ------------------------------------------------------------------------

    def cleanable_segments(self) -> CleanableSegments:
        """The segments the log cleaner may read and replace: sealed (the active segment takes
        appends), below the high watermark (consumers may not have seen what is above; a
        follower's may still be truncated), below the recovery point (a record the cleaner
        takes as superseding older ones must survive a crash), and below the first offset of an
        ongoing transaction (its records are not decided yet: Kafka's first unstable offset)."""
        with self._lock:
            self._check_usable()
            segments = self._local.segments
            end = min(segments.active.base_offset, self.high_watermark, self.recovery_point)
            unstable = self.producers.first_unstable_offset
            if unstable is not None:
                end = min(end, unstable)
            cleanable = []
            for segment in segments.snapshot()[:-1]:
                if segment.next_offset > end:
                    break
                if self._tiering_holds(segment):
                    cleanable.clear()  # only what lies above everything tiering holds
                    continue
                cleanable.append(segment)
            return CleanableSegments(cleanable, end, self.log_start_offset, segments.active.base_offset,
                                     self._truncations)

    def holds_segments(self, segments: list[Segment], generation: int) -> bool:
        """Whether the log is open and still holds `segments` as they were when `generation` was
        read (the cleaner tells an error of its own from the log changing under it)."""
        with self._lock:
            if self._closed or self._truncations != generation:
                return False
            live = set(map(id, self._local.segments))
            return all(id(segment) in live for segment in segments)

    def replace_segments(self, cleaned: Segment, old: list[Segment], generation: int) -> bool:
        """Swap `cleaned` (sealed, fsynced, in `.cleaned` state) in for `old` (LocalLog's swap)
        and make the swap durable (a directory fsync) before returning True. False, with nothing
        changed, if `old` is no longer in the log as it was when `generation` was read (retention
        removed some, a truncation rewrote them, the log was closed): the caller deletes
        `cleaned`. KafkaStorageError if the swap fails; once it was committed the directory goes
        offline (a restart completes it). From the cleaner thread.

        Under the maintenance lock, so retention, truncation, a flush, a close or a directory
        rename waits for the swap to finish (and none of them can take `old` away meanwhile);
        appends, which never touch sealed segments, and reads go on: the view lock is held for
        the check and the in-memory swap only, never across the directory fsyncs."""
        with self._maintenance_lock:
            with self._lock:
                if (self._closed or self._truncations != generation or self._local.segments.index_of_run(old) is None
                        or any(self._tiering_holds(segment) for segment in old)):
                    return False
                self._dir_failure.check()
                self._swapping = old  # tiering must not pin them from here on
            try:
                self._swap(cleaned, old)
            finally:
                with self._lock:
                    self._swapping = []
            # The snapshots taken when the replaced segments rolled are stray now (Kafka's
            # removeStraySnapshots): a compacted log would keep one per roll for ever.
            self.producers.delete_snapshots_at(
                [segment.base_offset for segment in old[1:] if segment.base_offset != cleaned.base_offset])
        return True

    def _swap(self, cleaned: Segment, old: list[Segment]) -> None:
        """LocalLog's swap, then a directory fsync that makes its renames durable before the
        cleaner checkpoints past them. Any failure after the commit takes the directory offline."""
        try:
            self._local.replace_segments(cleaned, old)
        except SwapFailedError as err:
            self._dir_failure.fail(err)
            raise
        try:
            self._local.sync([], sync_directory=True)
        except KafkaStorageError as err:
            self._dir_failure.fail(err)
            raise

    # --- lifecycle -------------------------------------------------------------------------

    def close(self, sync: bool = True) -> None:
        """Clean shutdown: seal and fsync everything (recovery point = LEO), release files; the
        next open then re-validates nothing. Idempotent. On an offline directory, closes without
        syncing. Readers fail from the start (the log is closed); the fsyncs run outside the view
        lock. `sync=False` leaves the fsyncs to a caller closing many logs: it syncs the whole
        filesystem once before it checkpoints the recovery point set here (LogManager.close)."""
        with self._maintenance_lock, self._append_lock:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            try:
                if not self._dir_failure.failed:
                    self._local.segments.active.seal()  # its max timestamp becomes the last time-index entry
                    # At the log end: a clean restart loads it and replays nothing. Synced with the
                    # segments (or by the caller's filesystem sync). None for a log without records
                    # (nothing to replay): a clean stop of many new partitions creates no files.
                    if self.producers.entries or self.log_end_offset > self._local.start_offset:
                        try:
                            self.producers.take_snapshot(self.log_end_offset, sync=sync)
                        except KafkaStorageError as err:  # only costs the next open a longer replay
                            log.error("%s: no producer snapshot at close: %s", self, err)
                    if sync:
                        self._local.sync(self._local.prepare_flush(self.log_end_offset), self._local.dir_dirty)
                    self._local.recovery_point = self.log_end_offset
            finally:
                self._local.close()

    def delete(self) -> None:
        """Close without syncing and remove the whole directory."""
        with self._maintenance_lock, self._append_lock:
            with self._lock:
                self._closed = True
            self._local.delete_directory()

    def rename_directory(self, target: Path) -> None:
        """Close and move the directory aside (a deleted topic's logs: renamed at once, removed
        later in the background). KafkaStorageError if the rename fails."""
        with self._maintenance_lock, self._append_lock:
            with self._lock:
                self._closed = True
            self._local.close()
            try:
                os.rename(self.directory, target)
            except OSError as err:
                raise KafkaStorageError(f"cannot rename {self.directory}: {err}") from err


class _PendingBatch(NamedTuple):
    """A written batch of the current append, not yet in the producer state."""

    header: record.BatchHeader
    base_offset: int
    max_timestamp: int
    marker: control_batch.EndTransactionMarker | None


def _epoch_replayer(epochs: LeaderEpochCache) -> Callable[[record.BatchHeader], None]:
    """Recovery's per-batch callback: every epoch newer than the cache's latest starts where its
    first batch does (Kafka's LogSegment.recover with a leader-epoch cache)."""
    def on_batch(header: record.BatchHeader) -> None:
        latest = epochs.latest_epoch
        if header.partition_leader_epoch >= 0 and (latest is None or header.partition_leader_epoch > latest):
            epochs.assign(header.partition_leader_epoch, header.base_offset)
    return on_batch
