"""Leader-epoch checkpoint `leader-epoch-checkpoint`: the first offset written under each epoch.

    <epoch> <start_offset>\\n    one line per epoch; epochs and start offsets both increase

Kafka's LeaderEpochFileCache: a follower asks "where did epoch E end?" to find where its log
diverges from the new leader's, so the entries must survive restarts and follow truncation at
either end of the log. Rewritten atomically (checkpoint.py) on every change; changes are rare
(one per leader election) and made where a leader takes over (`Partition.make_leader`, off the
event loop) or where a follower appends, never on a leader's append path.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from broker.log.checkpoint import write_atomically
from common.errors import KafkaStorageError

log = logging.getLogger(__name__)


UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Ordered (epoch, start_offset) entries backed by the checkpoint file. Not thread-safe:
    UnifiedLog calls it under its lock."""

    def __init__(self, path: Path, entries: list[tuple[int, int]]) -> None:
        self.path = path
        self._entries = entries  # replaced, never changed in place: `write` reads it from any thread
        self._file_lock = threading.Lock()  # orders the file's writes; taken after the log's lock

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache:
        """Read the checkpoint (none yet: no entries). Raises KafkaStorageError if malformed."""
        try:
            lines = path.read_text(encoding="ascii").split("\n")
        except FileNotFoundError:
            return cls(path, [])
        except UnicodeDecodeError as err:  # torn into binary garbage
            log.warning("%s is malformed (%s): starting with no epochs", path, err)
            return cls(path, [])
        except OSError as err:
            raise KafkaStorageError(f"cannot read {path}: {err}") from err
        try:
            entries = [(int(epoch), int(start)) for epoch, start in (line.split() for line in lines if line.strip())]
            if any(a[0] >= b[0] or a[1] > b[1] for a, b in zip(entries, entries[1:])):
                raise ValueError("entries out of order")
        except ValueError as err:
            # Written without an fsync at topic creation, so a crash can leave it torn. Epochs are
            # derived data: recovery replays the ones the batches after the recovery point carry.
            log.warning("%s is malformed (%s): starting with no epochs", path, err)
            return cls(path, [])
        return cls(path, entries)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    def clear(self) -> None:
        """Forget every epoch (the log was emptied and restarts elsewhere)."""
        if self._entries:
            self._store([])

    def reset_to(self, entries: list[tuple[int, int]]) -> None:
        """Adopt `entries` (epochs and start offsets, both growing) in place of every entry: a
        follower that restarts its log from the remote tier takes the epochs the tier recorded."""
        for (epoch, start), (next_epoch, next_start) in zip(entries, entries[1:]):
            if not (next_epoch > epoch and next_start >= start):
                raise ValueError(f"leader epochs must grow: {entries}")
        self._store(list(entries))

    def __len__(self) -> int:
        return len(self._entries)

    def keep_first(self, count: int) -> None:
        """Forget the entries after the first `count` (undo the assignments of a failed append)."""
        if len(self._entries) > count:
            self._store(self._entries[:count])

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    def assign(self, epoch: int, start_offset: int, *, durable: bool = True) -> None:
        """Record that `epoch` starts at `start_offset` (nothing to do if it is the latest epoch).

        Epochs normally only grow. If the log holds newer epochs than the one assigned (a directory
        adopted from elsewhere, metadata restored from an older copy), Kafka's rule applies: the
        entries that contradict the new one (epoch or start offset at or above it) are dropped, with
        a warning, rather than refusing every append of the partition. (An epoch that started at
        the same offset as the new one covers no record and goes too, as in Kafka.)"""
        if self._entries and self._entries[-1][0] == epoch:
            return
        kept = [entry for entry in self._entries if entry[0] < epoch and entry[1] < start_offset]
        if self._entries and self._entries[-1][0] > epoch:
            log.warning("%s: leader epoch %d at offset %d is older than %s; dropping the entries it contradicts",
                        self.path, epoch, start_offset, self._entries[len(kept):])
        self._store([*kept, (epoch, start_offset)], durable=durable)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer: (the largest epoch <= `epoch` we know, the offset
        where it ended, i.e. where the next larger epoch starts, or LEO for the latest epoch).
        (-1, -1) when `epoch` is newer than every epoch here; for an epoch older than all of them,
        (`epoch`, start of the first epoch): a follower then truncates to that start. An undefined
        epoch (-1, a follower that knows none) gets (-1, -1): no answer to truncate to."""
        if epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._entries and epoch == self._entries[-1][0]:
            return epoch, log_end_offset
        higher = next((entry for entry in self._entries if entry[0] > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = [entry for entry in self._entries if entry[0] <= epoch]
        return (floor[-1][0] if floor else epoch), higher[1]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was cut there)."""
        kept = [entry for entry in self._entries if entry[1] < end_offset]
        if len(kept) != len(self._entries):
            self._store(kept)

    def truncate_from_start(self, start_offset: int, *, write: bool = True) -> bool:
        """Forget epochs wholly below `start_offset`; the one covering it now starts there (Kafka).
        With `write=False` only the entries change and the caller calls `write` later, outside its
        lock (Kafka's truncateFromStartAsyncFlush: entries below the log start serve nobody, so a
        crash before the write loses nothing). Returns whether anything changed."""
        below = [entry for entry in self._entries if entry[1] <= start_offset]
        if not below or below == [(below[0][0], start_offset)]:
            return False
        entries = [(below[-1][0], start_offset)] + self._entries[len(below) :]
        if write:
            self._store(entries)
        else:
            self._entries = entries
        return True

    def write(self) -> None:
        """Write the entries as they are now (after a change made with `write=False`). Any thread,
        without the log's lock: writes are serialized, and each writes the latest entries."""
        with self._file_lock:
            write_atomically(self.path, _render(self._entries))

    def _store(self, entries: list[tuple[int, int]], *, durable: bool = True) -> None:
        """Write `entries` to the checkpoint, then adopt them: if the write fails (KafkaStorageError)
        the cache keeps the entries the file has, and a later change writes again."""
        with self._file_lock:
            write_atomically(self.path, _render(entries), durable=durable)
            self._entries = entries


def _render(entries: list[tuple[int, int]]) -> str:
    return "".join(f"{epoch} {start}\n" for epoch, start in entries)
