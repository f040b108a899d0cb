"""Log manager: every partition log under one log directory.

    {log_dir}/
        {topic}-{partition}/   one PartitionLog (partition_log.py); topic names may contain '-' and
                               '.', so the partition number is what follows the LAST '-'
        anything else          metadata files, foreign directories: left alone

The manager opens, creates and deletes partition logs, runs retention and hands out the logs that
are due a flush. Segments removed by retention stay open for `delay_ms` (in-flight sendfile reads
finish) before `purge_deleted` closes and unlinks them.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from broker import record
from broker.config import LogConfig, validate_topic_name
from broker.errors import InvalidTopicError, KafkaStorageError
from broker.log.partition_log import PartitionLog
from broker.log.segment import Segment

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def parse_partition_dir(path: Path) -> TopicPartition | None:
    """(topic, partition) of a `{topic}-{partition}` directory, or None for anything else."""
    topic, dash, partition = path.name.rpartition("-")
    if not dash or not partition.isdigit() or not path.is_dir():
        return None
    try:
        return validate_topic_name(topic), int(partition)
    except InvalidTopicError:
        return None


class LogManager:
    """The partition logs of one log directory, keyed by (topic, partition). Thread-safe."""

    def __init__(self, log_dir: Path, clock: Callable[[], int] = record.now_ms) -> None:
        self.log_dir = Path(log_dir)
        self._clock = clock
        self._lock = threading.Lock()
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._deleted: list[tuple[int, Segment]] = []  # (ms when retention removed it, segment)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot create {self.log_dir}: {err}") from err

    def load(self, configs: dict[str, LogConfig]) -> dict[TopicPartition, PartitionLog]:
        """Open (and recover) the partition directories of the topics in `configs`. Directories of
        other topics are left untouched and logged as orphans. Returns every open log."""
        try:
            paths = sorted(self.log_dir.iterdir())
        except OSError as err:
            raise KafkaStorageError(f"cannot list {self.log_dir}: {err}") from err
        for path in paths:
            key = parse_partition_dir(path)
            if key is None:
                continue
            topic, partition = key
            if topic not in configs:
                log.warning("orphan partition directory %s: topic %r is unknown, leaving it alone", path, topic)
                continue
            with self._lock:
                if key not in self._logs:
                    self._logs[key] = PartitionLog.open(path, topic, partition, configs[topic], self._clock)
        with self._lock:
            return dict(self._logs)

    def create(self, topic: str, partition: int, config: LogConfig) -> PartitionLog:
        """The log of (topic, partition), created if needed (an existing directory is loaded, as
        Kafka's getOrCreateLog does)."""
        key = (validate_topic_name(topic), partition)
        with self._lock:
            if key not in self._logs:
                path = self.log_dir / f"{topic}-{partition}"
                self._logs[key] = PartitionLog.open(path, topic, partition, config, self._clock)
            return self._logs[key]

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def partitions(self, topic: str) -> list[PartitionLog]:
        """The open logs of `topic`, by partition number."""
        with self._lock:
            return [self._logs[key] for key in sorted(key for key in self._logs if key[0] == topic)]

    def update_config(self, topic: str, config: LogConfig) -> None:
        for partition_log in self.partitions(topic):
            partition_log.update_config(config)

    def delete_topic(self, topic: str) -> None:
        """Close and remove every partition directory of `topic`."""
        with self._lock:
            doomed = [self._logs.pop(key) for key in [key for key in self._logs if key[0] == topic]]
        for partition_log in doomed:
            partition_log.delete()

    def run_retention(self, now_ms: int) -> int:
        """Apply retention to every log; returns how many segments it removed. They are queued for
        `purge_deleted`, not unlinked yet."""
        with self._lock:
            logs = list(self._logs.values())
        removed = 0
        for partition_log in logs:
            segments = partition_log.delete_old_segments(now_ms)
            removed += len(segments)
            with self._lock:
                self._deleted.extend((now_ms, segment) for segment in segments)
        return removed

    def purge_deleted(self, now_ms: int, delay_ms: int) -> int:
        """Close and unlink the segments retention removed at least `delay_ms` ago; returns how many."""
        with self._lock:
            due = [segment for deleted_ms, segment in self._deleted if now_ms - deleted_ms >= delay_ms]
            self._deleted = [entry for entry in self._deleted if now_ms - entry[0] < delay_ms]
        for segment in due:
            segment.delete()
        return len(due)

    def logs_needing_flush(self, now_ms: int) -> list[PartitionLog]:
        """Logs past flush.messages or flush.ms: hand them to a worker thread's `flush()`."""
        with self._lock:
            logs = list(self._logs.values())
        return [partition_log for partition_log in logs if partition_log.needs_flush(now_ms)]

    def close(self) -> None:
        """Clean shutdown: close every log (fsync, recovery point = LEO) and unlink every segment
        waiting for deletion (no reads are in flight any more)."""
        with self._lock:
            logs, self._logs = list(self._logs.values()), {}
            deleted, self._deleted = self._deleted, []
        for partition_log in logs:
            partition_log.close()
        for _, segment in deleted:
            segment.delete()
