"""RemoteLogManager: tiers the sealed segments of led partitions to the remote store (Kafka's
RemoteLogManager; docs/architecture.md, Tiered storage; the store and manifest in tiered_storage/).

For each log that is `tiered` (the broker has remote.log.storage.system.enable and the topic
remote.storage.enable) and led here, one task at a time per partition, in a pool of
`remote.log.manager.thread.pool.size` worker threads (the event loop only submits tasks):

1. When leadership arrives (and after a conflict): read the partition's manifest (what is
   uploaded; a broker killed during an upload left only unnamed objects, so that segment is
   uploaded again: idempotent). A manifest committed under a later leader epoch means this broker
   was deposed: it stops (ManifestFencedError) and commits nothing. One committed under an
   earlier epoch is committed again under this leader's epoch before anything else: from then on
   the previous leader's commits are refused (the store's fence), even if it read this very
   version. Then, and again every grace period, clean the partition's orphans older than the
   grace period (an hour).
2. Upload, in offset order, every sealed segment not yet in the manifest that lies wholly below
   the high watermark and the recovery point (committed and fsynced): its `.log`, `.index` and
   `.timeindex`, read back and checked by size and CRC32C (RemoteSegmentStore.upload_segment).
   A new leader's segments need not end where the previous leader's did (replicas roll their
   segments independently): the one that straddles the remote log end is uploaded from the
   remote end on, rewritten as a segment of its own (`_tail_of`). Bandwidth is bounded by
   remote.log.manager.copy.max.bytes.per.second over all uploads.
3. Commit the manifest naming it (compare-and-set on the version read), and only then record the
   highest offset in remote storage on the UnifiedLog: local retention (local.retention.*) may
   delete local segments wholly at or below it, never anything else.
4. Whole-log retention (retention.ms / retention.bytes over remote plus local-only bytes): commit a
   manifest without the expired remote segments, move the log start offset, then delete their
   objects (a crash between leaves orphans, which step 1 cleans).

For each tiered log followed here, a run re-reads the manifest and tells the log what the remote
tier holds (Kafka's follower task): a follower's local retention deletes only what is uploaded,
and its log start follows the remote one. Only when that could let local retention delete more
(`UnifiedLog.remote_state_wanted`): object-store reads cost money, and followed partitions are
most of a broker's. A follower whose fetch position fell below its leader's local log start
restarts from the manifest (broker/cluster/replica_fetcher.py, `UnifiedLog.rebuild_from_remote`).

Any failure (the store down, a conflict, a local file gone) is logged once per run of failures
and retried with exponential backoff capped at `max_backoff_ms`; nothing local is ever deleted
here. Deleting a topic deletes its remote folder (`delete_topic`).

Compacted topics tier too (Kafka refuses them): the cleaner leaves alone the segments uploaded or
being uploaded (UnifiedLog.pin_for_upload), so the remote tier holds them as they were sealed;
remote retention then applies only if cleanup.policy has delete. Reads below the local log start
go through `reader` (broker/remote_log/remote_log_reader.py).
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from broker.config import BrokerConfig
from broker.log.producer_state import CorruptSnapshotError, decode_snapshot
from broker.log.segment import Segment
from broker.log.unified_log import UnifiedLog
from broker.remote_log.remote_log_reader import RemoteLogReader
from common.errors import InvalidRequestError, KafkaStorageError, NotLeaderError, PymqError, StaleManifestError
from segment_format import batch_body, txn_index
from segment_format.index_file import CorruptIndexError
from segment_format.layout import SegmentFiles
from segment_format.limits import INT64_MAX
from segment_format.manifest import CorruptManifestError, PartitionManifest, RemoteSegment
from segment_format.segment_metadata import SegmentMetadata
from segment_format.segment_reader import FRAME_ONLY
from segment_format.segment_writer import SegmentWriter
from segment_format.txn_index import AbortedTxn
from tiered_storage import DEFAULT_ORPHAN_GRACE_MS, ManifestConflictError, ManifestFencedError, RemoteSegmentStore

log = logging.getLogger(__name__)

INITIAL_BACKOFF_MS = 500


@dataclass
class _PartitionTiering:
    """What the manager knows of one partition; touched by one task at a time (`busy`), and its
    manifest changed only under `writing` (a tiering run and a segment swap never interleave)."""

    manifest: PartitionManifest | None = None  # None: read it (first run, or after a conflict)
    leader_epoch: int | None = None  # the epoch whose takeover of the manifest is done (None: not leading)
    writing: threading.Lock = field(default_factory=threading.Lock)
    busy: bool = False
    task: Future[None] | None = None  # the last task submitted (a topic deletion waits for it)
    deleted: bool = False  # its topic is being deleted: upload nothing more
    failures: int = 0  # consecutive failed runs
    retry_at_ms: int = 0
    orphans_cleaned_ms: int | None = None  # when clean_orphans last ran (again every grace period)
    last_error: str | None = None  # the last failed run's error, until a run succeeds
    # (base offset, upload id) -> aborted transactions of the remote segments uploaded with a .txnindex
    aborted: dict[tuple[int, str], list[AbortedTxn]] = field(default_factory=dict)


@dataclass(frozen=True)
class TieringStatus:
    """A partition's tiering as its last run left it: the manifest (None: not read yet), the
    failed runs in a row and the last one's error (0 and None once a run succeeds), and when the
    next run may start (ms; 0: at the next schedule)."""

    manifest: PartitionManifest | None
    failures: int
    last_error: str | None
    retry_at_ms: int


class CopyThrottle:
    """Bounds the bytes uploaded per second over all uploads: each upload reserves its size and
    waits until the reservations before it have had their time (a token bucket without burst).
    `close` ends every wait at once (a stopping broker does not sit out a throttle delay)."""

    def __init__(self, bytes_per_second: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] | None = None) -> None:
        assert bytes_per_second > 0, bytes_per_second
        self.bytes_per_second = bytes_per_second
        self._clock = clock
        self._closed = threading.Event()
        self._sleep = sleep or self._closed.wait
        self._lock = threading.Lock()
        self._next_free = 0.0

    def close(self) -> None:
        self._closed.set()

    def acquire(self, size: int) -> float:
        """Wait for `size` bytes of bandwidth; returns the seconds waited."""
        if self.bytes_per_second >= INT64_MAX:
            return 0.0
        with self._lock:
            now = self._clock()
            start = max(now, self._next_free)
            self._next_free = start + size / self.bytes_per_second
        if start > now:
            self._sleep(start - now)
        return start - now


class RemoteLogManager:
    """Build with `from_config`, or with a store (tests inject one). The replica manager tells it
    which logs this broker leads, under which epoch, and which it follows (`on_leadership_change`,
    Kafka's RemoteLogManager.onLeadershipChange): only a partition's leader tiers it, followers
    only read its manifest, and `forget` stops both."""

    def __init__(self, store: RemoteSegmentStore, *,
                 thread_pool_size: int = 2, copy_max_bytes_per_second: int = INT64_MAX,
                 clock: Callable[[], int] = batch_body.now_ms, orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
                 max_backoff_ms: int = 30_000, reader: RemoteLogReader | None = None) -> None:
        assert thread_pool_size >= 1, thread_pool_size
        self.store = store
        self.reader = reader or RemoteLogReader(store)
        self._led: dict[tuple[str, int], tuple[UnifiedLog, int]] = {}  # log and leader epoch, under _lock
        self._followed: dict[tuple[str, int], UnifiedLog] = {}  # under _lock
        self._clock = clock
        self._orphan_grace_ms = orphan_grace_ms
        self._max_backoff_ms = max_backoff_ms
        self._throttle = CopyThrottle(copy_max_bytes_per_second)
        self._executor = ThreadPoolExecutor(thread_pool_size, thread_name_prefix="remote-log")
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], _PartitionTiering] = {}
        self._closed = False
        self.uploaded_segments = 0  # metrics
        self.expired_segments = 0
        self.failures = 0

    @classmethod
    def from_config(cls, config: BrokerConfig, on_read_ready: Callable[[tuple[str, int]], None]) -> RemoteLogManager:
        """`on_read_ready((topic, partition))` is called from a reader thread when a remote read the
        cache lacked is ready for its retry (the broker wakes the fetches parked on the partition)."""
        store = RemoteSegmentStore.from_url(config.remote_storage_url, config.remote_storage_options)
        reader = RemoteLogReader(store, cache_bytes=config["remote.log.reader.cache.size.bytes"],
                                 chunk_bytes=config["remote.log.reader.chunk.bytes"],
                                 prefetch_chunks=config["remote.log.reader.prefetch.chunks"],
                                 threads=config["remote.log.reader.threads"],
                                 max_pending_tasks=config["remote.log.reader.max.pending.tasks"],
                                 on_ready=on_read_ready)
        return cls(store, thread_pool_size=config["remote.log.manager.thread.pool.size"],
                   copy_max_bytes_per_second=config["remote.log.manager.copy.max.bytes.per.second"], reader=reader)

    # --- leadership ------------------------------------------------------------------------

    def on_leadership_change(self, leading: Sequence[tuple[UnifiedLog, int]], following: Sequence[UnifiedLog]) -> None:
        """This broker now leads the logs of `leading` (each with its leader epoch) and follows
        those of `following`."""
        with self._lock:
            for partition_log, leader_epoch in leading:
                key = (partition_log.topic, partition_log.partition)
                self._followed.pop(key, None)
                self._led[key] = (partition_log, leader_epoch)
            for partition_log in following:
                key = (partition_log.topic, partition_log.partition)
                self._led.pop(key, None)
                self._followed[key] = partition_log

    def forget(self, keys: Sequence[tuple[str, int]]) -> None:
        """This broker no longer hosts these partitions."""
        with self._lock:
            for key in keys:
                self._led.pop(key, None)
                self._followed.pop(key, None)

    # --- scheduling ------------------------------------------------------------------------

    def schedule(self) -> list[Future[None]]:
        """Submit a task for every tiered partition led (tiering) or followed (reading the
        manifest) here that has none running and is not backing off; returns their futures.
        Never blocks (call it from the event loop)."""
        now = self._clock()
        futures = []
        with self._lock:
            if self._closed:
                return []
            work: list[tuple[UnifiedLog, int | None]] = [*self._led.values(),
                                                         *((log_, None) for log_ in self._followed.values())]
            for partition_log, leader_epoch in work:
                if not partition_log.tiered or partition_log.offline:
                    continue
                if leader_epoch is None and not partition_log.remote_state_wanted(now):
                    continue  # a follower whose local retention has nothing waiting on the manifest
                state = self._partitions.setdefault((partition_log.topic, partition_log.partition), _PartitionTiering())
                if state.busy or now < state.retry_at_ms:
                    continue
                state.busy = True
                state.task = self._executor.submit(self._run, partition_log, state, leader_epoch)
                futures.append(state.task)
        return futures

    def run_once(self) -> None:
        """Schedule and wait for the tasks (tests and tools)."""
        wait(self.schedule())

    def close(self) -> None:
        """Stop: tasks finish the upload in progress and start no other (call before the logs close)."""
        with self._lock:
            self._closed = True
        self._throttle.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.reader.close()

    def delete_topic(self, topic: str, topic_id: str | None = None) -> None:
        """Delete every remote object of `topic` (its local logs are already gone, so no new
        upload starts), after the uploads in flight finished: one committing after the deletion
        would leave a manifest behind for a topic of the same name created later. With
        `topic_id`, a partition whose manifest names another topic id (a newer topic of the same
        name) is left alone. RemoteStorageError if the store fails: the caller logs it."""
        with self._lock:
            keys = [key for key in self._partitions if key[0] == topic]
            states = [self._partitions.pop(key) for key in keys]
            for state in states:
                state.deleted = True
            tasks = [state.task for state in states if state.task is not None]
        wait(tasks)
        self.store.delete_topic(topic, topic_id)

    def manifest(self, topic: str, partition: int) -> PartitionManifest | None:
        """The last manifest read or committed for the partition (None if not read yet)."""
        with self._lock:
            state = self._partitions.get((topic, partition))
            return state.manifest if state is not None else None

    def current_manifest(self, partition_log: UnifiedLog) -> PartitionManifest:
        """The partition's manifest as the store holds it now (blocking: a worker thread)."""
        return self.store.load_manifest(partition_log.topic, partition_log.partition, partition_log.topic_id)

    def producer_snapshot(self, partition_log: UnifiedLog, manifest: PartitionManifest) -> bytes | None:
        """The producer state at `manifest`'s log end: the snapshot its last segment was uploaded
        with (None if there is no segment, or it was uploaded before snapshots were). Blocking.
        CorruptIndexError if the object is not the one the manifest records or not a snapshot."""
        if not manifest.segments:
            return None
        last = manifest.segments[-1]
        data = self.store.read_optional_object(partition_log.topic, partition_log.partition, last, "snapshot")
        if data is not None:
            try:
                decode_snapshot(data, f"remote snapshot of segment {last.base_offset}")
            except CorruptSnapshotError as err:
                raise CorruptIndexError(str(err)) from err
        return data

    def status(self, topic: str, partition: int) -> TieringStatus:
        """What tiering knows of the partition now (`pymq tier status`, metrics)."""
        with self._lock:
            state = self._partitions.get((topic, partition)) or _PartitionTiering()
            return TieringStatus(state.manifest, state.failures, state.last_error, state.retry_at_ms)

    def replace_segments(self, partition_log: UnifiedLog, expected_version: int, replaced: Sequence[tuple[int, str]],
                         segments: Sequence[RemoteSegment]) -> PartitionManifest:
        """Swap a run of the partition's remote segments for `segments` (a compaction's output,
        uploaded by the job) in one manifest commit, if the manifest is still at
        `expected_version`. Blocks while a tiering run of the partition is in progress (call it
        from a worker thread). The new objects are checked against their description (size and
        CRC32C of every byte) before the commit. The replaced objects are left to orphan cleaning
        (after its grace period): readers that planned on the old manifest finish first.

        StaleManifestError if the manifest moved on; InvalidRequestError if the segments are
        not a run of it or do not fit; RemoteStorageError if the store fails or holds other bytes."""
        key = (partition_log.topic, partition_log.partition)
        with self._lock:
            state = self._partitions.setdefault(key, _PartitionTiering())
            led = self._led.get(key)
        if led is None:
            raise NotLeaderError(f"{partition_log}: not led by this broker")
        leader_epoch = led[1]
        with state.writing:
            try:
                self._take_over(partition_log, state, leader_epoch)
            except ManifestConflictError as err:
                state.manifest = None
                raise StaleManifestError(f"{partition_log}: {err}") from None
            assert state.manifest is not None
            if state.manifest.version != expected_version:
                raise StaleManifestError(f"the manifest of {partition_log} is at version {state.manifest.version}, "
                                         f"not {expected_version}")
            try:
                manifest = state.manifest.with_segments_replaced(replaced, segments)
            except (ValueError, CorruptManifestError) as err:
                raise InvalidRequestError(f"{partition_log}: {err}") from None
            for segment in segments:
                self.store.verify_upload(*key, segment)
            try:
                self._commit(partition_log, state, leader_epoch, manifest)
            except ManifestConflictError as err:  # another writer committed: read it again next time
                state.manifest = None
                raise StaleManifestError(f"{partition_log}: {err}") from None
        log.info("%s: swapped %d remote segments for %d (manifest version %d)", partition_log, len(replaced),
                 len(segments), state.manifest.version)
        return state.manifest

    # --- one partition ---------------------------------------------------------------------

    def _run(self, partition_log: UnifiedLog, state: _PartitionTiering, leader_epoch: int | None) -> None:
        try:
            with state.writing:
                if leader_epoch is None:
                    self._follow(partition_log, state)
                else:
                    self._tier(partition_log, state, leader_epoch)
            state.failures = 0
            state.last_error = None
        except (PymqError, OSError, ValueError) as err:  # RemoteStorageError and KafkaStorageError are PymqErrors
            state.failures += 1
            self.failures += 1
            delay = min(INITIAL_BACKOFF_MS << min(state.failures - 1, 30), self._max_backoff_ms)
            state.retry_at_ms = self._clock() + delay
            state.last_error = f"{type(err).__name__}: {err}"
            if isinstance(err, ManifestConflictError):
                state.manifest = None  # another writer committed (or took over): read it again
            level = logging.WARNING if state.failures == 1 else logging.DEBUG
            log.log(level, "tiering %s failed (%d in a row; retry in %d ms): %s", partition_log, state.failures, delay, err)
        except Exception:
            state.failures += 1
            self.failures += 1
            state.retry_at_ms = self._clock() + self._max_backoff_ms
            state.last_error = "internal error (see the broker log)"
            log.exception("tiering %s failed", partition_log)
        finally:
            state.busy = False

    def _follow(self, partition_log: UnifiedLog, state: _PartitionTiering) -> None:
        """A followed partition: what the remote tier holds now, for local retention and the log start."""
        state.leader_epoch = None
        state.manifest = self.current_manifest(partition_log)
        self._publish(partition_log, state.manifest)

    def _take_over(self, partition_log: UnifiedLog, state: _PartitionTiering, leader_epoch: int) -> None:
        """Make sure the manifest is this leader's, of `leader_epoch`: read it if this term has
        not yet, refuse to go on if a later leader committed it (ManifestFencedError), and commit
        it under this epoch if an earlier one did (the fence for the leader before)."""
        if state.manifest is not None and state.leader_epoch == leader_epoch:
            return
        state.leader_epoch = None
        manifest = state.manifest = self.current_manifest(partition_log)
        self._publish(partition_log, manifest)
        if manifest.leader_epoch > leader_epoch:
            raise ManifestFencedError(f"{partition_log}: the manifest (version {manifest.version}) is of leader epoch "
                                      f"{manifest.leader_epoch}, this broker leads epoch {leader_epoch}: deposed")
        if manifest.leader_epoch < leader_epoch and manifest.version > 0:
            self._commit(partition_log, state, leader_epoch, manifest)
            log.info("%s: took over the remote manifest at version %d under leader epoch %d", partition_log,
                     state.manifest.version, leader_epoch)
        state.leader_epoch = leader_epoch

    def _commit(self, partition_log: UnifiedLog, state: _PartitionTiering, leader_epoch: int,
                manifest: PartitionManifest) -> None:
        """Commit `manifest` (a change of state.manifest) under `leader_epoch` and publish it."""
        assert state.manifest is not None
        if partition_log.topic_id and not manifest.topic_id:
            manifest = manifest.with_topic_id(partition_log.topic_id)
        state.manifest = self.store.commit_manifest(state.manifest.version, manifest.with_leader_epoch(leader_epoch))
        self._publish(partition_log, state.manifest)

    def _tier(self, partition_log: UnifiedLog, state: _PartitionTiering, leader_epoch: int) -> None:
        topic, partition = partition_log.topic, partition_log.partition
        self._take_over(partition_log, state, leader_epoch)
        assert state.manifest is not None
        now = self._clock()
        if state.manifest.version > 0 and (state.orphans_cleaned_ms is None
                                           or now - state.orphans_cleaned_ms >= self._orphan_grace_ms):
            # Attempts a crash or a failure left, once older than the grace period.
            removed = self.store.clean_orphans(topic, partition, self._orphan_grace_ms)
            state.orphans_cleaned_ms = now
            if removed:
                log.info("%s: removed %d orphaned remote objects", partition_log, len(removed))
        for segment in self._candidates(partition_log, state.manifest):
            if self._closed or state.deleted:
                return
            if not partition_log.pin_for_upload(segment):
                break  # the cleaner replaced it meanwhile: the next run sees the new segments
            try:
                self._throttle.acquire(segment.size)
                if self._closed:
                    return  # the throttle's wait was cut short by close()
                remote_end = state.manifest.log_end_offset
                if segment.base_offset < remote_end:  # a previous leader's upload ended inside it
                    with _tail_of(segment, remote_end, partition_log.config.index_interval_bytes) as (files, metadata):
                        remote = self.store.upload_segment(topic, partition, files, metadata,
                                                           self._extras(partition_log, segment, remote_end))
                else:
                    remote = self.store.upload_segment(topic, partition, segment.files,
                                                       extras=self._extras(partition_log, segment, segment.base_offset))
                self._commit(partition_log, state, leader_epoch, state.manifest.with_segment(remote))
                self.uploaded_segments += 1
            finally:
                partition_log.unpin_upload()
            log.debug("%s: uploaded segment %d..%d (%d bytes)", partition_log, remote.base_offset,
                      remote.last_offset, remote.size_bytes)
        self._expire(partition_log, state, leader_epoch)

    @staticmethod
    def _extras(partition_log: UnifiedLog, segment: Segment, base_offset: int) -> dict[str, bytes]:
        """What a segment uploaded from `base_offset` on carries beside its `.log` and indexes:
        the producer state at its end (KIP-405's producer snapshot), so a follower rebuilt from
        the tier knows the producers; and its aborted transactions (`.txnindex`) if it has any,
        so read_committed readers of the tier drop them."""
        extras = {"snapshot": partition_log.producer_snapshot_at(segment.next_offset)}
        aborted = [entry for entry in segment.txn_index.entries if entry.last_offset >= base_offset]
        if aborted:
            extras["txnindex"] = txn_index.encode(base_offset, aborted)
        return extras

    @staticmethod
    def _candidates(partition_log: UnifiedLog, manifest: PartitionManifest) -> list[Segment]:
        """Sealed, non-empty segments with offsets above what the manifest holds, wholly below
        the high watermark and the recovery point, oldest first (the first may straddle the
        remote log end)."""
        end = min(partition_log.high_watermark, partition_log.recovery_point)
        segments = partition_log.segments()[:-1]  # the last is the active one
        return [segment for segment in segments
                if segment.size and segment.next_offset <= end
                and segment.next_offset > manifest.log_end_offset
                and segment.next_offset > max(manifest.log_start_offset, partition_log.log_start_offset)]

    def _expire(self, partition_log: UnifiedLog, state: _PartitionTiering, leader_epoch: int) -> None:
        """Whole-log retention: expired remote segments leave the manifest, then their objects go."""
        manifest = state.manifest
        assert manifest is not None
        config = partition_log.config
        if not config.delete:
            return  # compact only: no retention by time or size, remote or local
        local_only = sum(segment.size for segment in partition_log.local_segments_above(manifest.log_end_offset))
        expired = manifest.expired_segments(self._clock(), config.retention_ms, config.retention_bytes, local_only)
        if not expired:
            return
        self._commit(partition_log, state, leader_epoch, manifest.with_log_start_offset(expired[-1].next_offset))
        self.expired_segments += len(expired)
        log.info("%s: remote retention removed %d segments, log start offset now %d", partition_log, len(expired),
                 partition_log.log_start_offset)
        for segment in expired:
            try:
                self.store.delete_segment(partition_log.topic, partition_log.partition, segment)
            except PymqError as err:  # unnamed by the manifest now: orphan cleaning removes them later
                log.warning("%s: objects of expired remote segment %d not deleted: %s", partition_log,
                            segment.base_offset, err)

    def _publish(self, partition_log: UnifiedLog, manifest: PartitionManifest) -> None:
        """Tell the log what the remote store holds (local retention may delete up to it), after
        reading the transaction indexes of the remote segments not read yet."""
        self._read_aborted(partition_log, manifest)
        highest = manifest.log_end_offset - 1 if manifest.segments else -1
        try:
            partition_log.update_remote_log_state(manifest.log_start_offset, highest)
        except KafkaStorageError:
            pass  # closed meanwhile


    def _read_aborted(self, partition_log: UnifiedLog, manifest: PartitionManifest) -> None:
        """Keep in memory the aborted transactions of `manifest`'s segments (read once per upload
        attempt; only segments uploaded with a `.txnindex`), so a read_committed fetch of the
        tier needs no object read on the event loop. A failed read is logged and retried at the
        next publish."""
        key = (partition_log.topic, partition_log.partition)
        with self._lock:
            state = self._partitions.get(key)
            known = dict(state.aborted) if state is not None else {}
        current: dict[tuple[int, str], list[AbortedTxn]] = {}
        for segment in manifest.segments:
            if segment.object_of("txnindex") is None:
                continue
            name = (segment.base_offset, segment.upload_id)
            if name not in known:
                try:
                    known[name] = self.store.read_txn_index(*key, segment)
                except PymqError as err:
                    log.error("%s: transaction index of remote segment %d not read: %s", partition_log,
                              segment.base_offset, err)
                    continue
            current[name] = known[name]
        with self._lock:
            state = self._partitions.get(key)
            if state is not None:
                state.aborted = current

    def aborted_transactions(self, topic: str, partition: int, start_offset: int,
                             upper_bound: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of the aborted transactions the remote segments index that
        overlap [start_offset, upper_bound) (from memory: `_read_aborted`)."""
        with self._lock:
            state = self._partitions.get((topic, partition))
            indexes = [] if state is None else [state.aborted[name] for name in sorted(state.aborted)]
        return [found for entries in indexes for found in txn_index.collect_aborted(entries, start_offset, upper_bound)]


@contextlib.contextmanager
def _tail_of(segment: Segment, start_offset: int, index_interval_bytes: int) -> Iterator[tuple[SegmentFiles, SegmentMetadata]]:
    """The batches of a sealed `segment` from `start_offset` on, written as a segment of their
    own (its `.log` and both indexes, by SegmentWriter, the bytes a broker would write) in a
    temporary folder that goes when the block ends: what tiers of a segment that straddles the
    remote log end. Every replica holds the leader's batches, so `start_offset`, where a previous
    leader's upload ended, starts a batch here too; KafkaStorageError if it does not (a cleaner
    rewrote this replica's batches differently): nothing is uploaded then, and nothing local is
    deleted, rather than a record lost or held twice."""
    with tempfile.TemporaryDirectory(prefix="pymq-tier-") as folder:
        files = SegmentFiles(Path(folder), start_offset)
        with segment.detached_reader() as reader:
            found = reader.find_position(start_offset)
            if found is None or found[1].base_offset != start_offset:
                raise KafkaStorageError(f"{segment.log_path}: no batch starts at the remote log end {start_offset}; "
                                        "its batches cannot continue the remote log")
            with open(files.log, "wb") as log_file, open(files.index, "wb") as index_file, \
                    open(files.time_index, "wb") as time_index_file:
                writer = SegmentWriter(log_file, index_file, time_index_file, start_offset,
                                       index_interval_bytes=index_interval_bytes)
                for batch in reader.stored_batches(found[0], verify_from_offset=FRAME_ONLY):
                    writer.append(batch.data)  # validated here, CRC included
                metadata = writer.close()
        yield files, metadata
