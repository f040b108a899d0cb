"""LogLoader: turn a partition directory into segments and offsets on open (Kafka's LogLoader).

What recovery promises (docs/architecture.md, Recovery):
- Segments wholly below the recovery point were flushed: they are opened from their indexes and
  never truncated. A missing or bad index is rebuilt by framing the batches; damage met while
  doing so is recorded on the segment (readers reaching it get CORRUPT_MESSAGE), logged and
  counted, never "repaired" by deleting data that follows it.
- From the recovery point on, every batch is validated in full. The first torn or corrupt batch
  ends the log: the file is cut there and every later segment deleted (an unflushed tail).
So the cost of opening a log after a crash is the unflushed tail, not the size of the log.

Every batch of a segment the loader recovers is passed to `on_batch`, so that state derived from
the log (leader epochs) is rebuilt from the same scan. The producer state and the aborted
transaction indexes are rebuilt after the load, by UnifiedLog, from the newest producer snapshot
on (which may lie before the recovery point).

Leftovers of interrupted operations are removed first: `.deleted` files, checkpoint temp files,
indexes whose `.log` is gone, and `.cleaned` segments a log cleaner was writing. A `.swap` segment
is a cleaned segment whose swap was committed (LocalLog.replace_segments): the swap is completed
by deleting every live segment based in [its base offset, its next offset) and renaming it into
place. Those are exactly the segments it was cleaned from that still hold records it may not
(a segment cleaned from that lost all its records starts at or past its next offset: kept, it
holds only superseded records, and duplicates no offset; the cleaner's checkpoint, not yet
advanced, has it cleaned again).
"""
from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.config import LogConfig
from broker.log.checkpoint import TMP_SUFFIX
from broker.log.file_cache import FileCache
from broker.log.producer_state import snapshot_offset
from broker.log.log_segments import LogSegments
from broker.log.segment import Segment
from common.errors import CorruptMessageError, KafkaStorageError
from segment_format import record
from segment_format.index_file import CorruptIndexError
from segment_format.layout import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
)
from segment_format.segment_reader import FRAME_ONLY, SegmentReader

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
    snapshot_offsets: list[int] = field(default_factory=list)  # the producer snapshots listed (unsorted)


class LogLoader:
    def __init__(self, directory: Path, config: LogConfig, cache: FileCache, recovery_point: int,
                 on_batch: OnBatch | None = None) -> None:
        self.directory = directory
        self.config = config
        self.cache = cache
        self.recovery_point = recovery_point
        self.on_batch = on_batch
        self._txn_index_bases: set[int] = set()  # segments with a `.txnindex` (from the one listing)
        self._snapshot_offsets: list[int] = []  # producer snapshots, for UnifiedLog (the same listing)

    def load(self, start_offset: int = 0) -> LoadedLog:
        """Open every segment, recovering what follows the recovery point. An empty directory
        gets one empty segment at `start_offset`."""
        segments = LogSegments()
        bases = self._segment_bases()
        if not bases:
            segments.add(Segment.create(self.directory, start_offset, self.cache))
            return LoadedLog(segments, start_offset, start_offset, snapshot_offsets=self._snapshot_offsets)
        loaded = LoadedLog(segments, 0, self.recovery_point, snapshot_offsets=self._snapshot_offsets)
        holding = max(0, bisect_right(bases, self.recovery_point) - 1)  # the segment holding it
        for i, base in enumerate(bases):
            if len(segments) and base < segments.active.next_offset:
                raise KafkaStorageError(f"{self.directory}: segment {base} overlaps {segments.active}")
            segment = Segment.open(self.directory, base, self.cache)
            if base not in self._txn_index_bases:
                segment.txn_index.mark_absent()  # never read: most segments have no aborted transaction
            segments.add(segment)
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            if i < holding and self._load_trusted(segment, next_base):
                continue
            if (i == holding and self._load_trusted(segment, None, flushed=base < self.recovery_point)
                    and segment.next_offset == self.recovery_point):
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
        """Base offsets of the `.log` files, after removing leftovers of interrupted operations
        and completing interrupted swaps. One listing of the directory unless a swap completes
        (a restart opens every partition: with 100,000 of them each listing counts)."""
        names = os.listdir(self.directory)
        swaps = self._remove_leftovers(names)
        if swaps:
            self._complete_swaps(swaps)
            names = os.listdir(self.directory)
        bases, indexes = [], []
        for name in names:
            path = self.directory / name
            if _segment_base(path, LOG_SUFFIX) is not None:
                bases.append(int(path.stem))
            elif path.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                indexes.append(path)
                if path.suffix == TXN_INDEX_SUFFIX and (base := _segment_base(path, TXN_INDEX_SUFFIX)) is not None:
                    self._txn_index_bases.add(base)
            elif (offset := snapshot_offset(name)) is not None:
                self._snapshot_offsets.append(offset)
        present = set(names)
        for path in indexes:
            if path.with_suffix(LOG_SUFFIX).name not in present:
                _unlink(path)
        return sorted(bases)

    def _remove_leftovers(self, names: list[str]) -> list[Path]:
        """Unlink the `.deleted`, `.tmp` and `.cleaned` files among `names`; returns the `.swap` files."""
        swaps = []
        for name in names:
            if name.endswith((DELETED_SUFFIX, TMP_SUFFIX, CLEANED_SUFFIX)):
                _unlink(self.directory / name)
            elif name.endswith(SWAP_SUFFIX):
                swaps.append(self.directory / name)
        return swaps

    def _complete_swaps(self, swaps: list[Path]) -> None:
        """Finish each committed swap (a `.log.swap`). `.swap` indexes without one are from a
        commit that a crash cut short (their `.log` was still `.cleaned`): garbage."""
        committed = {base for path in swaps if (base := _segment_base(path, LOG_SUFFIX + SWAP_SUFFIX)) is not None}
        for path in swaps:
            for kind in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                base = _segment_base(path, kind + SWAP_SUFFIX)
                if base is not None and base not in committed:
                    _unlink(path)
        for base in sorted(committed):
            self._complete_swap(base)

    def _complete_swap(self, base: int) -> None:
        """Delete the live segments the `.swap` at `base` replaces, then rename it into place."""
        swap = Segment.open(self.directory, base, self.cache, SWAP_SUFFIX)
        end = max(self._swap_end(swap), base + 1)
        live = sorted(b for path in self.directory.glob(f"*{LOG_SUFFIX}") if (b := _segment_base(path, LOG_SUFFIX)) is not None)
        replaced = [b for b in live if base <= b < end]
        for old in replaced:
            Segment.open(self.directory, old, self.cache).delete()
        swap.rename_to("")
        swap.close()
        log.info("%s: completed the swap of cleaned segment %d (replacing segments %s)", self.directory, base, replaced)

    def _swap_end(self, swap: Segment) -> int:
        """The next offset of a `.swap` segment: from its indexes, or by framing its batches when
        those are gone (a crash while renaming it into place) or bad."""
        try:
            swap.load()
            return swap.next_offset
        except (CorruptIndexError, CorruptMessageError):
            pass
        end = swap.base_offset
        try:
            with open(swap.log_path, "rb") as file:
                for _, header in SegmentReader(file, swap.base_offset).batches(verify_from_offset=FRAME_ONLY):
                    end = header.next_offset
        except (OSError, CorruptMessageError) as err:
            raise KafkaStorageError(f"cannot complete the swap of {swap.log_path}: {err}") from err
        return end

    def _load_trusted(self, segment: Segment, next_base: int | None, flushed: bool = True) -> bool:
        """Load a segment from its index files. False if they are bad or disagree with the `.log`
        (or with the next segment's base offset): rebuild them then. A segment that nothing was
        flushed to (`flushed` False) may have no index files yet, as they are made by their first
        write: rebuilding those is routine, not worth a warning."""
        try:
            segment.load()
        except (CorruptIndexError, CorruptMessageError) as err:
            if flushed or segment.files.index.exists() and segment.files.time_index.exists():
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


def _segment_base(path: Path, suffix: str) -> int | None:
    """The base offset of `{base:020d}{suffix}`, or None for any other name."""
    name = path.name
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if len(stem) == _SEGMENT_NAME_DIGITS and stem.isdigit() else None


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise KafkaStorageError(f"cannot delete {path}: {err}") from err
