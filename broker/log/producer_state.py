"""ProducerStateManager: what one partition knows of each idempotent producer (Kafka's
ProducerStateManager and ProducerAppendInfo).

Per producer id the partition keeps the producer's epoch, the last `BATCHES_KEPT` batches it
appended (first and last sequence, first and last offset), the timestamp of its last batch (for
expiry), and, for transactions, the coordinator epoch of its last marker and the first offset of
its ongoing transaction. With it the leader

- answers a retried batch (the same producer, epoch and sequences as one of the last five) with
  the offsets it was first written at, instead of appending it twice;
- refuses a gap in sequences (OUT_OF_ORDER_SEQUENCE) and a zombie's older epoch
  (INVALID_PRODUCER_EPOCH).

The state is derived from the log: a follower and recovery replay batch headers without checks
(`replay`, Kafka's REPLICATION origin), so a new leader after a failover knows every producer's
last batches. Snapshots bound the replay:

    {offset:020d}.snapshot   the state of every batch below `offset` (ProducerSnapshot below)

written when a segment rolls (state as of the new segment's base offset) and at a clean close (at
the log end: a clean restart replays nothing). A snapshot is written to a temporary name and
renamed, without an fsync: a torn or lost snapshot fails its CRC and the next older one is used
(or the log is replayed from its start), so a snapshot is a shortcut, never the only copy.

The leader's checks (`plan_leader_append`) read the committed state and stage every change in
copies, so a refused append changes nothing; the caller applies the accepted batches with
`apply` once their offsets are assigned and written. Not thread-safe: UnifiedLog calls it under
its append lock (its reads of `entries` for a snapshot too).
"""
from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


from common.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    KafkaStorageError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from segment_format import producer_snapshot, record
from segment_format.control_batch import EndTransactionMarker
from segment_format.producer_snapshot import CorruptSnapshotError

log = logging.getLogger(__name__)

BATCHES_KEPT = 5  # Kafka's NUM_BATCHES_TO_RETAIN: a producer has at most 5 requests in flight
DEFAULT_MAX_PRODUCERS = 20_000  # producer.state.max.producers.per.partition
_EVICT_TO = 0.9  # an eviction makes room for a tenth of the bound: one sort per that many new producers
INT32_MAX = 2**31 - 1
NO_OFFSET = -1

SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_DIGITS = 20


class BatchMetadata(NamedTuple):
    """One appended batch of a producer: its sequences and the offsets it was written at."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The last sequence of a batch; sequences wrap from INT32_MAX to 0 (Kafka's
    DefaultRecordBatch.incrementSequence)."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state in one partition. `epoch` -1: unknown (no batch seen yet)."""

    producer_id: int
    epoch: int = -1
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    txn_first_offset: int = NO_OFFSET  # first offset of its ongoing transaction here, -1: none

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else NO_OFFSET

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The kept batch this one repeats (same epoch and sequences), if any."""
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata, timestamp: int) -> None:
        """Record an appended batch; a new epoch forgets the old one's batches."""
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)
        self.last_timestamp = max(self.last_timestamp, timestamp)

    def touch(self, epoch: int, timestamp: int) -> None:
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.last_timestamp = max(self.last_timestamp, timestamp)

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.producer_id, self.epoch, deque(self.batches, maxlen=BATCHES_KEPT),
                             self.last_timestamp, self.coordinator_epoch, self.txn_first_offset)


class CompletedTxn(NamedTuple):
    """A transaction a marker ended in this partition: its data from `first_offset`, the marker at
    `last_offset`; `last_stable_offset` is the partition's once it ended (Kafka's CompletedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int


class _Staged(NamedTuple):
    """A producer's state as the batches of one record set checked so far leave it: its epoch
    (-1 unknown), last sequence (None: no batch kept) and ongoing transaction's first offset."""

    epoch: int
    last_seq: int | None
    txn_first_offset: int


class LeaderAppendPlan(NamedTuple):
    """What a leader's append must do: `duplicates`, the leading batches of the record set that
    were appended before (answered with these original offsets, not written again), and
    `first_new`, the index of the first batch to write (len(headers) when all are duplicates)."""

    duplicates: list[BatchMetadata]
    first_new: int


class ProducerStateManager:
    """The producer state of one partition, and its snapshots in the partition's directory."""

    def __init__(self, directory: Path, name: str, max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        self.directory = directory
        self.name = name  # topic-partition, for error messages
        self.max_producers = max_producers
        self.evicted = 0  # producers forgotten to keep within max_producers (a metric)
        self._entries: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its ongoing transaction
        self._first_unstable: int | None = None  # min(_ongoing.values()), kept as they change

    @property
    def entries(self) -> dict[int, ProducerEntry]:
        return self._entries

    @entries.setter
    def entries(self, entries: dict[int, ProducerEntry]) -> None:
        self._entries = entries
        self._ongoing = {pid: e.txn_first_offset for pid, e in entries.items() if e.txn_first_offset != NO_OFFSET}
        self._first_unstable = min(self._ongoing.values(), default=None)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest ongoing transaction (None: none): the last stable
        offset's bound (Kafka's firstUnstableOffset)."""
        return self._first_unstable

    def _begin_txn(self, entry: ProducerEntry, first_offset: int) -> None:
        entry.txn_first_offset = first_offset
        self._ongoing[entry.producer_id] = first_offset
        if self._first_unstable is None or first_offset < self._first_unstable:
            self._first_unstable = first_offset

    def _end_txn(self, entry: ProducerEntry) -> None:
        first = self._ongoing.pop(entry.producer_id, None)
        entry.txn_first_offset = NO_OFFSET
        if first is not None and first == self._first_unstable:
            self._first_unstable = min(self._ongoing.values(), default=None)

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self.entries.get(producer_id)

    # --- leader appends (Kafka's ProducerAppendInfo with origin CLIENT) --------------------------

    def plan_leader_append(self, headers: Sequence[tuple[int, record.BatchHeader]],
                           coordinator: bool = False) -> LeaderAppendPlan:
        """Check every batch of a producer's record set ((position, header) each, as the log
        validated them) against the state, changing nothing.

        Leading batches that repeat one of their producer's last five (same epoch, same first and
        last sequence) are duplicates. Every later batch with a producer id must follow its
        producer's state as staged by the batches before it: an epoch older than the known one is
        InvalidProducerEpochError; a newer epoch must start at sequence 0; the same epoch must
        continue the last sequence (a duplicate after a new batch is out of order too); an
        unknown producer may start anywhere (its state may have expired). Else
        OutOfOrderSequenceError. O(batches); nothing copied (what a batch stages for the next ones
        of its producer is a small tuple).

        `coordinator` (the broker's coordinator writes them): a batch without a sequence (-1) is
        checked for its epoch only and is never a duplicate: it carries a producer's transactional
        offsets, and two of them in one transaction are two writes."""
        staged: dict[int, _Staged] = {}
        duplicates: list[BatchMetadata] = []
        first_new = len(headers)
        for i, (_, header) in enumerate(headers):
            producer_id = header.producer_id
            if producer_id < 0:
                first_new = min(first_new, i)
                continue
            first_seq = header.base_sequence
            if coordinator and first_seq < 0:
                first_new = min(first_new, i)
                self._check_coordinator_batch(producer_id, staged, header)
                continue
            last_seq = last_sequence(first_seq, header.last_offset_delta)
            state = staged.get(producer_id)
            if state is None:
                committed = self.entries.get(producer_id)
                if committed is None:
                    state = _Staged(-1, None, NO_OFFSET)
                else:
                    if first_new == len(headers):
                        duplicate = committed.find_duplicate(header.producer_epoch, first_seq, last_seq)
                        if duplicate is not None:
                            duplicates.append(duplicate)
                            continue
                    state = _Staged(committed.epoch, committed.last_seq if committed.batches else None,
                                    committed.txn_first_offset)
            first_new = min(first_new, i)
            self._check(producer_id, state, header, first_seq, last_seq)
            staged[producer_id] = _Staged(header.producer_epoch, last_seq,
                                          0 if header.is_transactional and state.txn_first_offset == NO_OFFSET
                                          else state.txn_first_offset)  # 0: "ongoing", its offset comes later
        return LeaderAppendPlan(duplicates, first_new)

    def _check_coordinator_batch(self, producer_id: int, staged: dict[int, _Staged], header: record.BatchHeader) -> None:
        state = staged.get(producer_id)
        if state is None:
            committed = self.entries.get(producer_id)
            state = _Staged(-1, None, NO_OFFSET) if committed is None else _Staged(
                committed.epoch, committed.last_seq if committed.batches else None, committed.txn_first_offset)
        if header.producer_epoch < state.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: producer {producer_id} epoch {header.producer_epoch} is older than the current epoch "
                f"{state.epoch} (a fenced instance)")
        staged[producer_id] = _Staged(header.producer_epoch, state.last_seq if header.producer_epoch == state.epoch
                                      else None, 0 if state.txn_first_offset == NO_OFFSET else state.txn_first_offset)

    def _check(self, producer_id: int, state: _Staged, header: record.BatchHeader, first_seq: int,
               last_seq: int) -> None:
        """Kafka's ProducerAppendInfo.checkProducerEpoch and checkSequence, and its transaction
        check: a producer inside a transaction writes only transactional batches until its
        marker (InvalidTxnStateError; a new epoch ends nothing here, the coordinator's marker does)."""
        epoch = header.producer_epoch
        if epoch < state.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: producer {producer_id} epoch {epoch} is older than the current epoch "
                f"{state.epoch} (a fenced instance)")
        if epoch > state.epoch:
            if first_seq != 0 and state.epoch >= 0:
                raise OutOfOrderSequenceError(
                    f"{self.name}: producer {producer_id} starts epoch {epoch} at sequence {first_seq}, expected 0")
            return
        last = state.last_seq
        if last is not None and not in_sequence(last, first_seq):
            raise OutOfOrderSequenceError(
                f"{self.name}: producer {producer_id} epoch {epoch} sent sequences {first_seq}..{last_seq} "
                f"after {last}, expected {last + 1 if last < INT32_MAX else 0}")
        if not header.is_transactional and state.txn_first_offset != NO_OFFSET:
            raise InvalidTxnStateError(
                f"{self.name}: producer {producer_id} sent a non-transactional batch inside its ongoing "
                f"transaction (from offset {state.txn_first_offset})")

    # --- changes without checks (appended batches, followers, recovery) --------------------------

    def apply(self, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int, first_offset: int,
              timestamp: int, transactional: bool = False) -> None:
        """Record a batch written at `first_offset` (Kafka's REPLICATION origin: no checks); a
        transactional one starts its producer's transaction here unless one is ongoing."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self._new_entry(producer_id)
        if first_seq >= 0:
            entry.add(epoch, BatchMetadata(first_seq, last_sequence(first_seq, last_offset_delta), first_offset,
                                           first_offset + last_offset_delta), timestamp)
        else:  # a coordinator's batch (no sequence): its epoch counts, it is no batch a retry could repeat
            entry.touch(epoch, timestamp)
        if transactional and entry.txn_first_offset == NO_OFFSET:
            self._begin_txn(entry, first_offset)

    def _new_entry(self, producer_id: int) -> ProducerEntry:
        """A new producer's entry, within `max_producers`: at the bound the least recently active
        producers without an ongoing transaction go first (as if expired early: a retry of
        theirs would be appended again), down to 90% of it, so the sort is paid once per tenth of
        the bound of new producers (a client forging producer ids cannot grow the state)."""
        if len(self._entries) >= self.max_producers:
            idle = sorted((entry.last_timestamp, pid) for pid, entry in self._entries.items()
                          if entry.txn_first_offset == NO_OFFSET)
            excess = len(self._entries) - int(self.max_producers * _EVICT_TO)
            for _, pid in idle[:excess]:
                del self._entries[pid]
            self.evicted += min(excess, len(idle))
            log.warning("%s: %d producers tracked, the most producer.state.max.producers.per.partition allows: "
                        "forgot the %d least recently active", self.name, self.max_producers, min(excess, len(idle)))
        entry = self._entries[producer_id] = ProducerEntry(producer_id)
        return entry

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """A coordinator's marker for `producer_id` (Kafka's origin COORDINATOR): its producer
        epoch must not be older than the known one (InvalidProducerEpochError), nor its
        coordinator epoch older than the last marker's (TransactionCoordinatorFencedError)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self.name}: transaction marker for producer {producer_id} with epoch {epoch}, older than the "
                f"current epoch {entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{self.name}: transaction marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}")

    def complete_txn(self, producer_id: int, epoch: int, marker_offset: int, marker: EndTransactionMarker,
                     timestamp: int) -> CompletedTxn | None:
        """A marker at `marker_offset` ends the producer's ongoing transaction (if any: a marker
        for none is still written, as Kafka does, and returns None). Unchecked."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self._new_entry(producer_id)
        if epoch != entry.epoch:
            entry.batches.clear()
            entry.epoch = epoch
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        first = entry.txn_first_offset
        if first == NO_OFFSET:
            return None
        self._end_txn(entry)
        unstable = self._first_unstable
        return CompletedTxn(producer_id, first, marker_offset, not marker.commit,
                            marker_offset + 1 if unstable is None else unstable)

    def replay(self, header: record.BatchHeader, marker: EndTransactionMarker | None = None) -> CompletedTxn | None:
        """A batch as it is in the log (a follower's append, recovery's replay); a control batch
        comes with its decoded `marker`. Returns the transaction a marker completed."""
        if header.producer_id < 0:
            return None
        if header.is_control:
            if marker is None:
                return None
            return self.complete_txn(header.producer_id, header.producer_epoch, header.base_offset, marker,
                                     header.max_timestamp)
        self.apply(header.producer_id, header.producer_epoch, header.base_sequence, header.last_offset_delta,
                   header.base_offset, header.max_timestamp, header.is_transactional)
        return None

    def clear(self) -> None:
        self.entries = {}

    def remove_below(self, log_start_offset: int) -> int:
        """Forget producers whose last batch lies below the log start (retention removed every
        batch of theirs: Kafka's onLogStartOffsetIncremented). Returns how many went."""
        gone = [pid for pid, entry in self.entries.items()
                if entry.last_offset < log_start_offset and entry.txn_first_offset == NO_OFFSET]
        for pid in gone:
            del self.entries[pid]
        return len(gone)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for `expiration_ms` (producer.id.expiration.ms; the timestamp of
        their last batch) and with no ongoing transaction. O(producers). Returns how many went."""
        gone = [pid for pid, entry in self.entries.items()
                if now_ms - entry.last_timestamp >= expiration_ms and entry.txn_first_offset == NO_OFFSET]
        for pid in gone:
            del self.entries[pid]
        return len(gone)

    # --- snapshots -------------------------------------------------------------------------------

    def snapshot_path(self, offset: int) -> Path:
        return self.directory / f"{offset:0{_SNAPSHOT_DIGITS}d}{SNAPSHOT_SUFFIX}"

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files in the directory, oldest first."""
        try:
            names = os.listdir(self.directory)
        except OSError as err:
            raise KafkaStorageError(f"cannot list {self.directory}: {err}") from err
        return sorted(offset for name in names if (offset := snapshot_offset(name)) is not None)

    def take_snapshot(self, offset: int, sync: bool = False) -> Path:
        """Write the state (that of every batch below `offset`) as `{offset}.snapshot`.
        KafkaStorageError if it cannot be written."""
        path = self.snapshot_path(offset)
        write_snapshot(path, encode_snapshot(self.entries.values()), sync)
        return path

    def load(self, end_offset: int, delete: bool = True, listed: list[int] | None = None) -> int:
        """Replace the state with the newest intact snapshot at or below `end_offset`; with
        `delete`, delete the snapshots above it and the corrupt ones met on the way. Returns the
        snapshot's offset (where a replay must start), or -1 if none was usable (empty state:
        replay the whole log). `listed`: the snapshot offsets a listing just found (the log
        loader's, on open: one listing per partition, not two)."""
        self.entries = {}
        offsets = self.snapshot_offsets() if listed is None else sorted(listed)
        for offset in offsets:
            if offset > end_offset and delete:
                _unlink(self.snapshot_path(offset))
        for offset in reversed([o for o in offsets if o <= end_offset]):
            path = self.snapshot_path(offset)
            try:
                self.entries = decode_snapshot(path.read_bytes(), str(path))
                return offset
            except (OSError, CorruptSnapshotError) as err:
                log.warning("%s: ignoring producer snapshot %s: %s", self.name, path.name, err)
                if delete:
                    _unlink(path)
        return -1

    def load_bytes(self, data: bytes, where: str) -> None:
        """Replace the state with an encoded snapshot (the remote tier's). CorruptSnapshotError."""
        self.entries = decode_snapshot(data, where)

    def delete_snapshots_below(self, offset: int) -> None:
        """Delete the snapshots below `offset`, but never the newest one."""
        offsets = self.snapshot_offsets()
        for old in offsets[:-1]:
            if old < offset:
                _unlink(self.snapshot_path(old))

    def delete_snapshots_at(self, offsets: Iterable[int]) -> None:
        """Delete the snapshots at `offsets` (segments the cleaner merged away), never the newest."""
        existing = self.snapshot_offsets()
        newest = existing[-1] if existing else None
        for offset in set(offsets) & set(existing):
            if offset != newest:
                _unlink(self.snapshot_path(offset))

    def delete_snapshots_above(self, offset: int) -> None:
        for old in self.snapshot_offsets():
            if old > offset:
                _unlink(self.snapshot_path(old))

    def delete_all_snapshots(self) -> None:
        for old in self.snapshot_offsets():
            _unlink(self.snapshot_path(old))


# --- the snapshot format: segment_format/producer_snapshot.py ---------------------------------


def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    return producer_snapshot.encode(
        [e.producer_id, e.epoch, e.last_timestamp, e.coordinator_epoch, e.txn_first_offset,
         [list(batch) for batch in e.batches]]
        for e in entries)


def decode_snapshot(data: bytes, where: str) -> dict[int, ProducerEntry]:
    entries = {}
    try:
        for pid, epoch, last_timestamp, coordinator_epoch, txn_first_offset, batches in producer_snapshot.decode(data, where):
            entries[pid] = ProducerEntry(pid, epoch, deque((BatchMetadata(*b) for b in batches), maxlen=BATCHES_KEPT),
                                         last_timestamp, coordinator_epoch, txn_first_offset)
    except (ValueError, TypeError) as err:
        raise CorruptSnapshotError(f"{where}: bad payload: {err}") from err
    return entries


def write_snapshot(path: Path, data: bytes, sync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            file.write(data)
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise KafkaStorageError(f"cannot write producer snapshot {path}: {err}") from err


def snapshot_offset(name: str) -> int | None:
    """The offset of `{offset:020d}.snapshot`, else None."""
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[: -len(SNAPSHOT_SUFFIX)]
    return int(stem) if len(stem) == _SNAPSHOT_DIGITS and stem.isdigit() else None


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise KafkaStorageError(f"cannot delete {path}: {err}") from err
