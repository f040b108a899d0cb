"""Log manager: every partition log under one log directory (Kafka's LogManager).

    {log_dir}/
        {topic}-{partition}/                 one UnifiedLog (unified_log.py); topic names may
                                             contain '-' and '.', so the partition number is
                                             what follows the LAST '-'
        {topic}-{partition}.{uuid}-delete/   a deleted topic's log, moved aside at once and
                                             removed in the background (and on the next start);
                                             the topic is cut to fit the name in NAME_MAX bytes
        recovery-point-offset-checkpoint     per-partition offsets (checkpoint.py), written for
        log-start-offset-checkpoint          every partition at once: periodically, after a
        replication-offset-checkpoint        segment roll was flushed, after a load, when a
                                             topic is deleted, and on a clean stop
        cleaner-offset-checkpoint            per compacted partition: its first dirty offset,
                                             where the log cleaner's next round starts reading
                                             (also written after every cleaned log)
        anything else                        metadata files, foreign directories: left alone

The manager opens, creates and deletes logs, runs retention, hands out the logs that are due a
flush and writes the directory's checkpoints (the log cleaner's too: log_cleaner.py keeps the first
dirty offsets here, as Kafka's LogCleanerManager keeps them beside the log). Everything here that touches the disk is meant for
worker threads (the server wraps calls in `asyncio.to_thread`); `get` and `partitions` are cheap.
Segments removed by retention or replaced by the cleaner stay open for `delay_ms` (in-flight reads finish) before
`purge_deleted` unlinks them. All logs of the directory share one `LogDirFailure`: after an fsync
failed, every one of them answers KAFKA_STORAGE_ERROR.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from broker.config import LogConfig
from broker.log.checkpoint import read_offsets, sync_filesystem, write_offsets
from broker.log.file_cache import FileCache
from broker.log.local_log import SegmentsRemovedError
from broker.log.producer_state import DEFAULT_MAX_PRODUCERS
from broker.log.segment import Segment
from broker.log.unified_log import LogDirFailure, UnifiedLog
from common.errors import InconsistentTopicIdError, InvalidTopicError, KafkaStorageError
from common.topic_partition import TopicPartition
from segment_format import batch_body
from segment_format.layout import validate_topic_name

log = logging.getLogger(__name__)


RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
DELETE_DIR_SUFFIX = "-delete"
# A file name's limit in bytes (ext4, xfs, btrfs, tmpfs: 255). Topic names are ASCII, so characters
# are bytes. A partition directory of the longest topic fits (249 + '-' + 4 digits < 255); its
# delete name (40 more characters) would not, so delete names cut the topic (Kafka's
# LocalLog.logDeleteDirName): every topic that can be created can be deleted.
NAME_MAX = 255


def parse_partition_dir(path: Path) -> TopicPartition | None:
    """(topic, partition) of a `{topic}-{partition}` directory, or None for anything else."""
    topic, dash, partition = path.name.rpartition("-")
    if not dash or not partition.isdigit() or not path.is_dir():
        return None
    try:
        return validate_topic_name(topic), int(partition)
    except InvalidTopicError:
        return None


def delete_dir_name(name: str) -> str:
    """The name a `{topic}-{partition}` directory is moved aside to: unique, ending in `-delete`
    (what `purge_deleted_directories` removes), never a partition directory's name, and at most
    NAME_MAX bytes whatever the topic's length (the topic is cut, the rest kept)."""
    topic, _, partition = name.rpartition("-")
    suffix = f"-{partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return f"{topic[:NAME_MAX - len(suffix)]}{suffix}"


@dataclass(frozen=True, slots=True)
class TopicLogSpec:
    """What the manager needs to know of a topic to open its logs."""

    topic_id: str | None
    config: LogConfig
    partitions: int
    leader_epoch: int | None = None
    hosted: frozenset[int] | None = None  # in a cluster: the partitions with a replica on this broker (None: all)

    def hosts(self, partition: int) -> bool:
        return partition < self.partitions and (self.hosted is None or partition in self.hosted)


class LogManager:
    """The partition logs of one log directory, keyed by (topic, partition). Thread-safe."""

    def __init__(self, log_dir: Path, clock: Callable[[], int] = batch_body.now_ms, max_open_files: int = 1024,
                 remote_storage: bool = False, producer_id_expiration_ms: int = 86_400_000,
                 producer_state_max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        self.log_dir = Path(log_dir)
        self.producer_id_expiration_ms = producer_id_expiration_ms  # producer.id.expiration.ms
        self.producer_state_max_producers = producer_state_max_producers  # ...max.producers.per.partition
        self.remote_storage = remote_storage  # remote.log.storage.system.enable: logs of remote.storage.enable topics tier
        self._clock = clock
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._logs: dict[TopicPartition, UnifiedLog] = {}
        self._deleted: list[tuple[int, Segment]] = []  # (ms when retention or the cleaner removed it, segment)
        self._first_dirty: dict[TopicPartition, int] = {}  # the cleaner's, for compacted logs
        self._first_dirty_written: dict[TopicPartition, int] | None = None  # the file's content, once known
        self.cache = FileCache(max_open_files)
        self.failure = LogDirFailure(self.log_dir)
        self.retention_failures = 0  # partitions whose retention raised (a metric; each is logged)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot create {self.log_dir}: {err}") from err

    # --- opening and creating --------------------------------------------------------------

    def load(self, topics: dict[str, TopicLogSpec]) -> dict[TopicPartition, UnifiedLog]:
        """Open (and recover) the partition directories of `topics`, creating missing partitions.
        Directories of unknown topics are left untouched and logged as orphans; a directory that
        belongs to an older incarnation of its topic is moved aside. Returns every open log."""
        started = time.monotonic()
        self.purge_deleted_directories()
        checkpoints = self._read_checkpoints()
        with self._lock:
            self._first_dirty = read_offsets(self.log_dir / CLEANER_CHECKPOINT)
        for path in self._list_dir():
            key = parse_partition_dir(path)
            if key is None:
                continue
            topic, partition = key
            spec = topics.get(topic)
            if spec is None or not spec.hosts(partition):
                log.warning("orphan partition directory %s: no replica of it is assigned here, leaving it alone", path)
                continue
            self._open(topic, partition, spec, checkpoints)
        for topic, spec in topics.items():
            missing = [p for p in range(spec.partitions) if spec.hosts(p) and self.get(topic, p) is None]
            if missing:
                self.create_logs(topic, spec, missing)
        with self._lock:
            logs = dict(self._logs)
        self._log_recovery(logs.values(), time.monotonic() - started)
        # Drop the entries of partitions that are gone (a topic deleted before a crash could not
        # checkpoint): a topic created again under the name must not inherit their offsets.
        self.checkpoint()
        return logs

    @staticmethod
    def _log_recovery(logs: Iterable[UnifiedLog], seconds: float) -> None:
        """One line an operator reads after a restart: how much was re-validated (the unflushed
        tails only, after a crash) and whether anything was cut or found damaged."""
        logs = list(logs)
        recovered = [partition_log for partition_log in logs if partition_log.recovered_bytes]
        truncated = sum(partition_log.last_recovery_truncated_bytes for partition_log in logs)
        damaged = [partition_log for partition_log in logs if partition_log.damaged_segments]
        log.info("loaded %d logs in %.2f s: recovered %d bytes of %d logs after their recovery points, "
                 "truncated %d bytes", len(logs), seconds, sum(p.recovered_bytes for p in recovered), len(recovered),
                 truncated)
        for partition_log in damaged:
            log.error("%s has %d damaged segments below its recovery point (kept; readers get CORRUPT_MESSAGE)",
                      partition_log, partition_log.damaged_segments)

    def create_logs(self, topic: str, spec: TopicLogSpec, partitions: list[int]) -> list[UnifiedLog]:
        """Create (or adopt existing directories of) the logs of `partitions`, all or nothing: if
        one fails (out of file descriptors, disk full) every log this call created is removed again
        and the error is raised. The caller runs this in a worker thread."""
        validate_topic_name(topic)
        created: list[tuple[UnifiedLog, bool]] = []  # (log, its directory existed before: adopted)
        logs: list[UnifiedLog] = []  # not looked up again at the end: a concurrent delete_topic may drop them
        try:
            for partition in partitions:
                partition_log = self.get(topic, partition)
                if partition_log is None:
                    existed = (self.log_dir / f"{topic}-{partition}").exists()
                    partition_log = self._open_new(topic, partition, spec)
                    created.append((partition_log, existed))
                logs.append(partition_log)
            if created:
                sync_filesystem(self.log_dir)  # one syncfs for every file of every new log
        except BaseException:
            for partition_log, existed in created:
                with self._lock:
                    self._logs.pop((topic, partition_log.partition), None)
                try:
                    if existed:  # an adopted directory holds records of its own: leave it as it was found
                        partition_log.close()
                    else:
                        partition_log.delete()
                except KafkaStorageError as err:
                    log.error("cannot roll back %s after a failed creation: %s", partition_log.directory, err)
            raise
        return logs

    def _open_new(self, topic: str, partition: int, spec: TopicLogSpec) -> UnifiedLog:
        """Create one log (unsynced); if that fails part way, remove what it left on disk."""
        path = self.log_dir / f"{topic}-{partition}"
        existed = path.exists()
        try:
            return self._open(topic, partition, spec, {}, durable=False)
        except BaseException:
            if not existed:
                shutil.rmtree(path, ignore_errors=True)
            raise

    def _open(self, topic: str, partition: int, spec: TopicLogSpec,
              checkpoints: dict[str, dict[TopicPartition, int]], durable: bool = True) -> UnifiedLog:
        key = (topic, partition)
        path = self.log_dir / f"{topic}-{partition}"
        try:
            partition_log = self._open_log(path, key, spec, checkpoints, durable)
        except InconsistentTopicIdError as err:
            log.warning("%s; moving it aside", err)
            self._move_aside(path)
            partition_log = self._open_log(path, key, spec, {}, durable)
        with self._lock:
            self._logs[key] = partition_log
        return partition_log

    def _open_log(self, path: Path, key: TopicPartition, spec: TopicLogSpec,
                  checkpoints: dict[str, dict[TopicPartition, int]], durable: bool) -> UnifiedLog:
        return UnifiedLog.open(
            path, key[0], key[1], spec.config, topic_id=spec.topic_id, cache=self.cache, clock=self._clock,
            recovery_point=checkpoints.get(RECOVERY_POINT_CHECKPOINT, {}).get(key, 0),
            log_start_offset=checkpoints.get(LOG_START_OFFSET_CHECKPOINT, {}).get(key, 0),
            high_watermark=checkpoints.get(HIGH_WATERMARK_CHECKPOINT, {}).get(key),
            dir_failure=self.failure,
            leader_epoch=spec.leader_epoch,
            durable=durable,
            remote_storage=self.remote_storage,
            max_producers=self.producer_state_max_producers,
        )

    # --- lookups ---------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> UnifiedLog | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def partitions(self, topic: str) -> list[UnifiedLog]:
        """The open logs of `topic`, by partition number."""
        with self._lock:
            return [self._logs[key] for key in sorted(key for key in self._logs if key[0] == topic)]

    def all_logs(self) -> list[UnifiedLog]:
        with self._lock:
            return list(self._logs.values())

    def update_config(self, topic: str, config: LogConfig) -> None:
        for partition_log in self.partitions(topic):
            partition_log.update_config(config)

    # --- deletion --------------------------------------------------------------------------

    def delete_topic(self, topic: str) -> None:
        """Move every partition directory of `topic` aside (one rename each: the topic's logs
        are gone at once) and remove them; `-delete` directories a crash left are removed by
        `purge_deleted_directories` on the next start."""
        self._delete_logs(lambda key: key[0] == topic)

    def delete_partition(self, topic: str, partition: int) -> None:
        """As `delete_topic`, for one partition whose replica moved to other brokers."""
        self._delete_logs(lambda key: key == (topic, partition))

    def _delete_logs(self, doomed_key: Callable[[TopicPartition], bool]) -> None:
        with self._lock:
            doomed = [self._logs.pop(key) for key in [key for key in self._logs if doomed_key(key)]]
            self._first_dirty = {key: offset for key, offset in self._first_dirty.items() if not doomed_key(key)}
            directories = {partition_log.directory for partition_log in doomed}
            # Segments retention queued go with their directories; purged later by their old
            # paths, they would unlink files of a topic re-created under the same name.
            queued = [segment for _, segment in self._deleted if segment.files.directory in directories]
            self._deleted = [entry for entry in self._deleted if entry[1].files.directory not in directories]
        for partition_log in doomed:
            target = self._aside_path(partition_log.directory)
            partition_log.rename_directory(target)
            _remove_tree(target)
        for segment in queued:
            segment.delete()  # its files went with the directory: this releases its descriptor
        if doomed:
            # As Kafka's asyncDelete: the checkpoints must forget the topic now. Left until the
            # periodic checkpoint, a topic re-created under the name would inherit its recovery
            # point (an unflushed tail taken for durable data) and log start (records hidden).
            self.checkpoint()

    def _move_aside(self, path: Path) -> None:
        try:
            path.rename(self._aside_path(path))
        except OSError as err:
            raise KafkaStorageError(f"cannot move {path} aside: {err}") from err

    @staticmethod
    def _aside_path(path: Path) -> Path:
        return path.with_name(delete_dir_name(path.name))

    def purge_deleted_directories(self) -> int:
        """Remove the `-delete` directories of deleted topics and stale logs; returns how many."""
        doomed = [path for path in self._list_dir() if path.name.endswith(DELETE_DIR_SUFFIX) and path.is_dir()]
        for path in doomed:
            _remove_tree(path)
        return len(doomed)

    # --- retention -------------------------------------------------------------------------

    def run_retention(self, now_ms: int) -> int:
        """Apply retention to every log, and expire its idle producers (producer.id.expiration.ms);
        returns how many segments it removed. A log whose retention fails is logged and skipped:
        the others still run. Removed segments are queued for `purge_deleted`, not unlinked yet."""
        removed = 0
        for partition_log in self.all_logs():
            try:
                partition_log.expire_producers(now_ms, self.producer_id_expiration_ms)
                segments = partition_log.delete_old_segments(now_ms)
            except KafkaStorageError as err:
                self.retention_failures += 1
                log.error("retention failed for %s: %s", partition_log, err)
                # Segments that left the log before the failure are ours to delete all the same.
                segments = err.removed if isinstance(err, SegmentsRemovedError) else []
            except Exception:  # a bug in one log's retention must not stop the pass for the others
                self.retention_failures += 1
                log.exception("retention failed for %s", partition_log)
                segments = []
            removed += len(segments)
            self.schedule_delete(segments, now_ms)
        return removed

    def schedule_delete(self, segments: list[Segment], now_ms: int) -> None:
        """Queue segments that left their log (renamed `.deleted`) for `purge_deleted`."""
        with self._lock:
            self._deleted.extend((now_ms, segment) for segment in segments)

    def purge_deleted(self, now_ms: int, delay_ms: int) -> int:
        """Close and unlink the segments retention removed at least `delay_ms` ago; returns how many."""
        with self._lock:
            due = [segment for deleted_ms, segment in self._deleted if now_ms - deleted_ms >= delay_ms]
            self._deleted = [entry for entry in self._deleted if now_ms - entry[0] < delay_ms]
        for segment in due:
            try:
                segment.delete()
            except KafkaStorageError as err:
                log.error("cannot delete %s: %s", segment, err)
            except Exception:  # one segment's bug must not keep the others from being unlinked
                log.exception("cannot delete %s", segment)
        return len(due)

    # --- the log cleaner's checkpoint ------------------------------------------------------

    def first_dirty_offset(self, partition_log: UnifiedLog) -> int | None:
        """Where the cleaner's last round over `partition_log` stopped, or None if never cleaned."""
        with self._lock:
            return self._first_dirty.get((partition_log.topic, partition_log.partition))

    def update_first_dirty_offset(self, partition_log: UnifiedLog, offset: int) -> None:
        """Record that `partition_log` is clean below `offset` and write the cleaner checkpoint
        (an atomic write and fsyncs: from the cleaner thread). KafkaStorageError if it fails."""
        with self._lock:
            self._first_dirty[(partition_log.topic, partition_log.partition)] = offset
        if self.failure.failed:
            return
        with self._checkpoint_lock:
            self._write_cleaner_checkpoint(self.all_logs())

    def _write_cleaner_checkpoint(self, logs: list[UnifiedLog]) -> None:
        """Entries of the compacted logs open now: a deleted topic's or one no longer compacted
        go, so a topic compacted (again) under that name starts wholly dirty. Written only when
        that changes what the file holds (the periodic checkpoint calls this too)."""
        compacted = {(l.topic, l.partition) for l in logs if l.config.compact}
        with self._lock:
            offsets = {key: offset for key, offset in self._first_dirty.items() if key in compacted}
        if offsets != self._first_dirty_written:
            write_offsets(self.log_dir / CLEANER_CHECKPOINT, offsets)
            self._first_dirty_written = offsets

    # --- durability ------------------------------------------------------------------------

    def logs_needing_flush(self, now_ms: int) -> list[UnifiedLog]:
        """Logs past flush.messages or flush.ms, or with a rolled segment to flush."""
        return [partition_log for partition_log in self.all_logs() if partition_log.needs_flush(now_ms)]

    def checkpoint(self) -> None:
        """Write the directory's recovery-point, log-start, high-watermark and cleaner
        checkpoints for every log (one atomic file each). From a worker thread. Skipped once the directory is
        offline: its logs' offsets can no longer be trusted."""
        if self.failure.failed:
            return
        with self._checkpoint_lock:
            logs = self.all_logs()
            for name, offsets in (
                (RECOVERY_POINT_CHECKPOINT, {(l.topic, l.partition): l.recovery_point for l in logs}),
                (LOG_START_OFFSET_CHECKPOINT, {(l.topic, l.partition): l.log_start_offset for l in logs}),
                (HIGH_WATERMARK_CHECKPOINT, {(l.topic, l.partition): l.high_watermark for l in logs}),
            ):
                write_offsets(self.log_dir / name, offsets)
            self._write_cleaner_checkpoint(logs)

    def _read_checkpoints(self) -> dict[str, dict[TopicPartition, int]]:
        return {name: read_offsets(self.log_dir / name)
                for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, HIGH_WATERMARK_CHECKPOINT)}

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: close every log (recovery point = LEO), sync the filesystem once (not an
        fsync per file: with 100,000 partitions those took minutes), then checkpoint, and unlink
        every segment waiting for deletion (no reads are in flight any more). A failed sync takes
        the directory offline: the checkpoints keep the recovery points of the last good write."""
        started = time.monotonic()
        logs = self.all_logs()
        for partition_log in logs:
            try:
                partition_log.close(sync=False)
            except KafkaStorageError as err:
                log.error("closing %s failed: %s", partition_log, err)
                self.failure.fail(err)
        if logs and not self.failure.failed:
            try:
                sync_filesystem(self.log_dir)
            except KafkaStorageError as err:
                log.error("syncing %s on close failed: %s", self.log_dir, err)
                self.failure.fail(err)
        self.checkpoint()
        log.info("closed %d logs in %.2f s", len(logs), time.monotonic() - started)
        with self._lock:
            self._logs = {}
            deleted, self._deleted = self._deleted, []
        for _, segment in deleted:
            segment.delete()
        self.cache.close()

    def _list_dir(self) -> list[Path]:
        try:
            return sorted(self.log_dir.iterdir())
        except OSError as err:
            raise KafkaStorageError(f"cannot list {self.log_dir}: {err}") from err


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.error("cannot remove %s: %s (it is removed on the next start)", path, err)
