"""LogLoader: turn a partition directory into segments and offsets on open (Kafka's LogLoader).

What recovery promises (DESIGN.md section 3):
- Segments wholly below the recovery point were flushed: they are opened from their indexes and
  never truncated. A missing or bad index is rebuilt by framing the batches; damage met while
  doing so is recorded on the segment (readers reaching it get CORRUPT_MESSAGE), logged and
  counted, never "repaired" by deleting data that follows it.
- From the recovery point on, every batch is validated in full. The first torn or corrupt batch
  ends the log: the file is cut there and every later segment deleted (an unflushed tail).
So the cost of opening a log after a crash is the unflushed tail, not the size of the log.

Every batch of a segment the loader recovers is passed to `on_batch`, so that state derived from
the log (leader epochs now, producer state later) is rebuilt from the same scan.

Leftovers of interrupted operations are removed first: `.deleted` files, checkpoint temp files,
indexes whose `.log` is gone.
"""
from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker import record
from broker.config import LogConfig
from broker.errors import CorruptMessageError, KafkaStorageError
from broker.log.checkpoint import TMP_SUFFIX
from broker.log.file_cache import FileCache
from broker.log.index_file import CorruptIndexError
from broker.log.log_segments import LogSegments
from broker.log.segment import DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, Segment

log = logging.getLogger(__name__)

_SEGMENT_NAME_DIGITS = 20

OnBatch = Callable[[record.BatchHeader], None]


@dataclass(slots=True)
class LoadedLog:
    """What a load found: the segments (last = active), where the log ends, and what recovery did."""

    segments: LogSegments
    next_offset: int
    recovery_point: int
    truncated_bytes: int = 0
    recovered: list[Segment] = field(default_factory=list)  # re-framed or validated: to be flushed
    damaged: list[Segment] = field(default_factory=list)


class LogLoader:
    def __init__(self, directory: Path, config: LogConfig, cache: FileCache, recovery_point: int,
                 on_batch: OnBatch | None = None) -> None:
        self.directory = directory
        self.config = config
        self.cache = cache
        self.recovery_point = recovery_point
        self.on_batch = on_batch

    def load(self, start_offset: int = 0) -> LoadedLog:
        """Open every segment, recovering what follows the recovery point. An empty directory
        gets one empty segment at `start_offset`."""
        segments = LogSegments()
        bases = self._segment_bases()
        if not bases:
            segments.add(Segment.create(self.directory, start_offset, self.cache))
            return LoadedLog(segments, start_offset, start_offset)
        loaded = LoadedLog(segments, 0, self.recovery_point)
        holding = max(0, bisect_right(bases, self.recovery_point) - 1)  # the segment holding it
        for i, base in enumerate(bases):
            if len(segments) and base < segments.active.next_offset:
                raise KafkaStorageError(f"{self.directory}: segment {base} overlaps {segments.active}")
            segment = Segment.open(self.directory, base, self.cache)
            segments.add(segment)
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            if i < holding and self._load_trusted(segment, next_base):
                continue
            if i == holding and self._load_trusted(segment, None) and segment.next_offset == self.recovery_point:
                continue
            truncated = segment.recover(self.config.index_interval_bytes, self.recovery_point, next_base, self.on_batch)
            loaded.recovered.append(segment)
            if segment.damage is not None:
                loaded.damaged.append(segment)
            if truncated:
                log.warning("%s: recovery truncated %d bytes at offset %d", self.directory, truncated, segment.next_offset)
                loaded.truncated_bytes += truncated + self._delete(bases[i + 1:])
                break
        for segment in list(segments)[:-1]:
            segment.seal()
        loaded.next_offset = segments.active.next_offset
        loaded.recovery_point = min(self.recovery_point, loaded.next_offset)
        return loaded

    def _segment_bases(self) -> list[int]:
        """Base offsets of the `.log` files, after removing leftovers of interrupted operations."""
        bases, indexes = [], []
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(DELETED_SUFFIX) or name.endswith(TMP_SUFFIX):
                _unlink(path)
            elif path.suffix == LOG_SUFFIX and len(path.stem) == _SEGMENT_NAME_DIGITS and path.stem.isdigit():
                bases.append(int(path.stem))
            elif path.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                indexes.append(path)
        for path in indexes:
            if not path.with_suffix(LOG_SUFFIX).exists():
                _unlink(path)
        return sorted(bases)

    def _load_trusted(self, segment: Segment, next_base: int | None) -> bool:
        """Load a flushed segment from its index files. False if they are bad or disagree with the
        `.log` (or with the next segment's base offset): rebuild them then."""
        try:
            segment.load()
        except (CorruptIndexError, CorruptMessageError) as err:
            log.warning("%s: rebuilding the indexes of %s: %s", self.directory, segment.log_path.name, err)
            return False
        return next_base is None or segment.next_offset <= next_base

    def _delete(self, bases: list[int]) -> int:
        """Delete the segments of `bases` (they follow a torn tail); returns their total bytes."""
        dropped = 0
        for base in bases:
            segment = Segment.open(self.directory, base, self.cache)
            dropped += segment.log_path.stat().st_size
            segment.delete()
        return dropped


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise KafkaStorageError(f"cannot delete {path}: {err}") from err
