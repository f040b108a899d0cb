"""Log segment `{base_offset:020d}.log`: concatenated record batches plus their two sparse indexes.

    {base_offset:020d}.log        batch | batch | ...   record.py's format, base offsets strictly
                                                        increasing, the first >= base_offset
    {base_offset:020d}.index      OFFSET_INDEX (segment_format/index_file.py), kept by an IndexFile
    {base_offset:020d}.timeindex  TIME_INDEX (segment_format/index_file.py), kept by an IndexFile
    *.deleted                     the same files after retention or the log cleaner removed the
                                  segment from its log, waiting for in-flight reads to finish
                                  before they are unlinked
    *.cleaned                     a segment the log cleaner is writing (garbage after a crash)
    *.swap                        a cleaned segment, complete and fsynced, replacing the segments it
                                  was cleaned from (a restart finishes the swap: log_loader.py)

Only the active (last) segment of a partition is appended to; once sealed it is immutable. The
`.log` is written with pwrite at the segment's known size, so a failed write never shifts later
data, and read with pread. A segment owns no descriptor of its `.log`: it borrows one from the
broker's `FileCache` for each operation, so idle segments cost no open files. A fetch response
gets a descriptor of its own (`FetchSlice`), so neither the cache nor retention can close or reuse
the one a `sendfile` is reading. Index entries are derived data: `recover` rebuilds both indexes.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from broker.log.checkpoint import fsync_and_close
from broker.log.file_cache import FileCache
from broker.log.index_file import IndexFile
from broker.log.txn_index import TxnIndexFile
from common.errors import CorruptMessageError, KafkaStorageError, LogInvariantError, MessageTooLargeError
from segment_format import record
from segment_format.index_builder import IndexBuilder
from segment_format.index_file import OFFSET_INDEX, TIME_INDEX, CorruptIndexError
from segment_format.layout import DELETED_SUFFIX, SegmentFiles
from segment_format.limits import INT32_MAX
from segment_format.segment_reader import FRAME_ONLY, SegmentReader

log = logging.getLogger(__name__)

_READ_CHUNK = 4 << 20  # recovery reads this much at a time, so small batches cost no syscall each
_RECENT_BATCHES = 16  # batch boundaries the active segment remembers for tailing fetches (Segment._recent):
# ~2.5 KB per partition, 25 MB for 10,000 partitions taking appends
_LOOKUP_READ = 8 << 10  # a lookup from an index entry scans about index.interval.bytes (4 KiB) of headers


class BatchInfo(NamedTuple):
    """What a segment needs to know about one appended batch (from its validated header)."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(slots=True)
class FetchSlice:
    """A byte range of one segment file, ready for sendfile or pread.

    `file` owns a descriptor of its own (a dup of the segment's), so the range stays readable
    whatever happens to the segment meanwhile (closed by the file cache, renamed or unlinked by
    retention): close the slice once it is sent (`close()`; dropping it closes it too). An empty
    slice has no file. `first_offset` is the base offset of the first batch in the range (at or
    before the requested offset); the range may end mid-batch (KIP-74).
    """

    file: io.FileIO | None
    position: int
    size: int
    first_offset: int

    @classmethod
    def empty(cls, next_offset: int) -> FetchSlice:
        return cls(None, 0, 0, next_offset)

    def read_bytes(self) -> bytes:
        """The slice's bytes via pread (for transports without sendfile, and tests)."""
        if self.file is None or not self.size:
            return b""
        chunks, position, remaining = [], self.position, self.size
        while remaining:
            try:
                chunk = os.pread(self.file.fileno(), remaining, position)
            except (OSError, ValueError) as err:
                raise KafkaStorageError(f"cannot read segment bytes: {err}") from err
            if not chunk:
                break  # the file shrank under us (truncation): return what exists
            chunks.append(chunk)
            position += len(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class Segment:
    """One `.log` file and its indexes.

    Build with `create` (a new empty segment) or `open` followed by `load` (trust the indexes,
    check the tail) or `recover` (rebuild the indexes, validating what may be torn). Not
    thread-safe: the owning log serializes calls; only `prepare_sync`'s returned fds may be used
    from another thread. An append is split in an I/O half (`write`, `write_indexes`), which the
    log runs holding only its append lock, and an in-memory half (`publish`, `mark_sealed`),
    which it runs under its view lock: reads (under the view lock) never wait for the disk and
    never see bytes past the published size (locking: broker/log/unified_log.py).
    """

    def __init__(self, files: SegmentFiles, cache: FileCache) -> None:
        self.files = files
        self.base_offset = files.base_offset
        self._cache = cache
        self._indexes = IndexBuilder(IndexFile(OFFSET_INDEX, files.index, self.base_offset),
                                     IndexFile(TIME_INDEX, files.time_index, self.base_offset))
        self.txn_index = TxnIndexFile(files.txn_index, self.base_offset)
        self._size = 0
        self._next_offset = self.base_offset
        self._first_append_ms: int | None = None
        self._sealed = False
        self.damage: str | None = None  # what recovery found broken below the recovery point
        # base offset -> (position, size) of the batches appended last: a consumer tailing the
        # log fetches from exactly such a boundary, found here without an index lookup and a
        # scan of up to index.interval.bytes of headers per fetch. Oldest first, bounded.
        self._recent: dict[int, tuple[int, int]] = {}

    @classmethod
    def create(cls, directory: Path, base_offset: int, cache: FileCache, state: str = "") -> Segment:
        """A new empty active segment (named for `state`: the log cleaner writes `.cleaned` ones).
        Raises KafkaStorageError if its `.log` already exists or cannot be created. Only the `.log`
        is created here: the index files are made by their first write (IndexFile.create)."""
        files = SegmentFiles(directory, base_offset, state)
        try:
            os.close(os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as err:
            raise KafkaStorageError(f"cannot create {files.log}: {err}") from err
        segment = cls(files, cache)
        segment._indexes = IndexBuilder(IndexFile.create(OFFSET_INDEX, files.index, base_offset),
                                        IndexFile.create(TIME_INDEX, files.time_index, base_offset))
        segment.txn_index.mark_absent()
        return segment

    @classmethod
    def open(cls, directory: Path, base_offset: int, cache: FileCache, state: str = "") -> Segment:
        """Open an existing segment (its files named for `state`); call `load` or `recover`
        before anything else."""
        return cls(SegmentFiles(directory, base_offset, state), cache)

    # --- state -------------------------------------------------------------------------------

    @property
    def offset_index(self) -> IndexFile:
        return self._indexes.offset_index

    @property
    def time_index(self) -> IndexFile:
        return self._indexes.time_index

    @property
    def log_path(self) -> Path:
        return self.files.log

    @property
    def size(self) -> int:
        """Bytes of valid batches in the `.log`."""
        return self._size

    @property
    def next_offset(self) -> int:
        """One past the last offset stored; base_offset when empty."""
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch max_timestamp stored (ms), -1 (NO_TIMESTAMP) when empty."""
        return self._indexes.max_timestamp

    @property
    def first_append_ms(self) -> int | None:
        """When the segment got its first batch, for segment.ms: the clock at that append, or after
        a restart the first batch's max timestamp (Kafka's rule). None while empty."""
        return self._first_append_ms

    @property
    def sealed(self) -> bool:
        return self._sealed

    # --- append ------------------------------------------------------------------------------

    def append(self, data: memoryview, batches: Sequence[BatchInfo], index_interval_bytes: int, now_ms: int) -> None:
        """Write validated, offset-assigned batches at the end with one pwrite, then index them.

        Raises KafkaStorageError if the write fails; the segment's state is then unchanged.
        """
        self.write(data, batches)
        self.publish(batches, index_interval_bytes, now_ms)

    def write(self, data: memoryview, batches: Sequence[BatchInfo]) -> None:
        """The I/O half of `append`: pwrite `data` past the segment's end without changing its
        state, so a reader of the segment sees none of it until `publish`. The log calls this
        without its view lock (the bytes may be MiBs). KafkaStorageError if the write fails,
        LogInvariantError if the batches do not follow the segment."""
        self._check_append(data, batches)
        self._write(data, self._size)

    def publish(self, batches: Sequence[BatchInfo], index_interval_bytes: int, now_ms: int) -> None:
        """The in-memory half of `append`: account `batches`, just written by `write`, so reads
        reach them. No I/O (index entries are only queued): the log calls this under its view lock."""
        position = self._size
        recent = self._recent
        for batch in batches:
            self._indexes.add(batch.base_offset, batch.max_timestamp, position, index_interval_bytes)
            self._next_offset = batch.next_offset
            recent[batch.base_offset] = (position, batch.size)
            position += batch.size
        while len(recent) > _RECENT_BATCHES:
            del recent[next(iter(recent))]
        self._size = position
        if self._first_append_ms is None:
            self._first_append_ms = now_ms

    def _check_append(self, data: memoryview, batches: Sequence[BatchInfo]) -> None:
        """What the caller promised about an append, checked because a broken promise would
        write a `.log` that recovery cannot read back: LogInvariantError naming the offsets."""
        where = f"{self.log_path.name} (offsets {self.base_offset}..{self._next_offset})"
        if self._sealed:
            raise LogInvariantError(f"{where}: append to a sealed segment")
        if not batches or batches[0].base_offset < self._next_offset:
            raise LogInvariantError(f"{where}: append at offset {batches[0].base_offset if batches else None} "
                                    f"does not follow the next offset {self._next_offset}")
        size = sum(b.size for b in batches)
        if size != len(data):
            raise LogInvariantError(f"{where}: batches of {size} bytes appended as {len(data)} bytes")
        if batches[-1].next_offset - 1 - self.base_offset > INT32_MAX:
            raise LogInvariantError(f"{where}: last offset {batches[-1].next_offset - 1} overflows the index's "
                                    f"relative offsets")

    def _write(self, data: memoryview, position: int) -> None:
        with self._cache.pinned(self.log_path) as fd:
            try:
                written = os.pwrite(fd, data, position)
                while written < len(data):  # regular files only write short on a full disk
                    written += os.pwrite(fd, data[written:], position + written)
            except OSError as err:
                with contextlib.suppress(OSError):  # if this fails too, the next pwrite overwrites the torn bytes
                    os.ftruncate(fd, position)
                raise KafkaStorageError(f"cannot write {self.log_path}: {err}") from err

    # --- read --------------------------------------------------------------------------------

    def find_position(self, offset: int) -> tuple[int, record.BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= `offset`, or None if the
        segment ends before `offset`. Index lookup, then a short scan of 61-byte headers.
        CorruptMessageError if the scan meets damage (see `recover`)."""
        return self._find_position(self._reader(), offset)

    def _find_position(self, reader: SegmentReader, offset: int) -> tuple[int, record.BatchHeader] | None:
        if offset >= self._next_offset:
            return None
        found = reader.find_position(offset)
        if found is None:
            raise CorruptMessageError(f"{self.log_path.name} ends before its next offset {self._next_offset}: {self.damage}")
        return found

    def headers_from(self, offset: int) -> Iterator[tuple[int, record.BatchHeader]]:
        """(position, header) of the batches from the one holding `offset` to the published end,
        only framed (no CRC, no body): what replaying derived state (producer state) needs of
        bytes recovery has already checked. Under the append lock (the published end must not
        move), or on a sealed segment."""
        found = self._find_position(self._reader(), max(offset, self.base_offset))
        if found is None:
            return iter(())
        return self._batches(found[0], self._size, FRAME_ONLY)

    def batch_bytes(self, position: int, size: int) -> bytes:
        """The bytes of the batch at `position` (a control batch's marker, during a replay)."""
        data = self._pread(size, position)
        if len(data) != size:
            raise CorruptMessageError(f"{self.log_path.name}: batch at byte {position} ends early")
        return data

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FetchSlice | None:
        """Bytes from the batch holding `offset`: min(max_bytes, what the segment holds [before the
        batch holding `max_offset`]), but the whole first batch even beyond max_bytes (KIP-74).
        None if the segment ends before `offset`; an empty slice if `max_offset` leaves nothing."""
        found = self._batch_at(offset)
        if found is None:
            return None
        position, first_size, first_offset = found
        end = self._size
        if max_offset is not None:
            limit = self._batch_at(max_offset)
            end = end if limit is None else limit[0]
        size = max(0, min(end - position, max(max_bytes, first_size)))
        if not size:
            return FetchSlice.empty(first_offset)
        return FetchSlice(io.FileIO(self._cache.dup(self.log_path), "r"), position, size, first_offset)

    def _batch_at(self, offset: int) -> tuple[int, int, int] | None:
        """(position, size, base offset) of the first batch whose last offset >= `offset`."""
        recent = self._recent.get(offset)
        if recent is not None:
            return recent[0], recent[1], offset
        found = self._find_position(self._reader(), offset)
        return None if found is None else (found[0], found[1].size, found[1].base_offset)

    def offset_for_timestamp(self, timestamp_ms: int, start_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `start_offset` with timestamp >=
        `timestamp_ms`, or None. The time index bounds the scan (SegmentReader.offset_for_timestamp).
        """
        if self._indexes.max_timestamp < timestamp_ms:
            return None
        return self._reader().offset_for_timestamp(timestamp_ms, start_offset)

    @contextlib.contextmanager
    def detached_reader(self, min_read_bytes: int = _READ_CHUNK) -> Iterator[SegmentReader]:
        """A reader of the segment's valid bytes over a descriptor of its own, closed when the
        block ends. It reads the same bytes whatever the log does to the segment meanwhile
        (renamed, unlinked; a truncation shows as a torn tail), so the log cleaner can read a
        sealed segment without holding the log's lock. Only for sealed segments: it shares the
        in-memory offset index. KafkaStorageError if the `.log` is gone already."""
        fd = self._cache.dup(self.log_path)
        try:
            yield SegmentReader(lambda size, position: os.pread(fd, size, position), self.base_offset,
                                size=self._size, name=self.log_path.name, offset_index=self.offset_index,
                                min_read_bytes=min_read_bytes, max_read_bytes=max(min_read_bytes, _READ_CHUNK))
        finally:
            os.close(fd)

    def _pread(self, size: int, position: int) -> bytes:
        with self._cache.pinned(self.log_path) as fd:
            try:
                return os.pread(fd, size, position)
            except OSError as err:
                raise KafkaStorageError(f"cannot read {self.log_path}: {err}") from err

    def _reader(self, size: int | None = None, min_read_bytes: int = _LOOKUP_READ) -> SegmentReader:
        """A reader of the `.log`'s first `size` bytes (default: the valid ones) with this segment's
        indexes: framing, validation and lookups live there, shared with remote readers."""
        return SegmentReader(self._pread, self.base_offset, size=self._size if size is None else size,
                             name=self.log_path.name, offset_index=self.offset_index, time_index=self.time_index,
                             min_read_bytes=min_read_bytes, max_read_bytes=max(min_read_bytes, _READ_CHUNK))

    def _batches(self, position: int, end: int, verify_from_offset: int) -> Iterator[tuple[int, record.BatchHeader]]:
        """Batches from `position` to `end`, read in large chunks; those whose offsets reach
        `verify_from_offset` are fully validated, earlier ones (flushed) only framed. Raises
        CorruptMessageError at the first bad or torn batch."""
        return self._reader(end, _READ_CHUNK).batches(position, end, verify_from_offset=verify_from_offset)

    # --- load and recovery ---------------------------------------------------------------------

    def load(self) -> None:
        """Trust the index files, check them against the `.log`, and frame the batches after the
        last index entry (the part a crash could have torn, were the segment not flushed).

        Raises CorruptIndexError / CorruptMessageError if anything disagrees: call `recover` then.
        """
        file_size = self._file_size()
        if not file_size and not self.files.index.exists() and not self.files.time_index.exists():
            # Empty, and closed before any index write (`write_indexes`): nothing to index. The
            # files are made by the first write, as for a created segment.
            self._indexes = IndexBuilder(IndexFile.create(OFFSET_INDEX, self.files.index, self.base_offset),
                                         IndexFile.create(TIME_INDEX, self.files.time_index, self.base_offset))
            return
        self._indexes = IndexBuilder(IndexFile.load(OFFSET_INDEX, self.files.index, self.base_offset),
                                     IndexFile.load(TIME_INDEX, self.files.time_index, self.base_offset))
        self.offset_index.sanity_check(file_size)
        last_offset, last_position = self.offset_index.last_entry
        if len(self.offset_index) and self._header_at(last_position).base_offset != last_offset:
            raise CorruptIndexError(f"{self.offset_index.path.name}: last entry does not match the log")
        self._size = file_size
        # The time index covers every batch up to the last offset-index entry (entries are added
        # together), so only the batches from there on need reading.
        self._indexes.resume()
        self._next_offset = last_offset
        self._scan(self._batches(last_position, file_size, FRAME_ONLY))
        self.time_index.sanity_check(self._next_offset)
        self._first_append_ms = self._header_at(0).max_timestamp if file_size else None

    def recover(self, index_interval_bytes: int, verify_from_offset: int = 0, end_offset: int | None = None,
                on_batch: Callable[[record.BatchHeader], None] | None = None) -> int:
        """Rebuild both indexes from the `.log`. Batches at or past `verify_from_offset` (the
        recovery point) are fully validated and the file is truncated at the first torn or corrupt
        one among them: that is an unflushed tail. Earlier batches were flushed: damage there is
        never "repaired" by deleting data. It is recorded in `damage` (reads reaching it get
        CorruptMessageError), and `end_offset` (the next segment's base offset, when known) stands
        in for the offsets that can no longer be framed. `on_batch` sees every batch kept, in order.
        Returns how many bytes were truncated."""
        file_size = self._file_size()
        self._reset()
        try:
            for position, header in self._batches(0, file_size, verify_from_offset):
                self._check_offsets(position, header)
                self._indexes.add(header.base_offset, header.max_timestamp, position, index_interval_bytes)
                self._next_offset = header.next_offset
                self._size = position + header.size
                if on_batch is not None:
                    on_batch(header)
        except (CorruptMessageError, MessageTooLargeError) as err:
            if self._next_offset >= verify_from_offset:
                log.warning("%s: truncating %d bytes at byte %d: %s", self.log_path, file_size - self._size, self._size, err)
            else:
                self.damage = f"damaged at byte {self._size} (offset {self._next_offset}): {err}"
                log.error("%s: %s; kept as is (below the recovery point), readers get CORRUPT_MESSAGE there",
                          self.log_path, self.damage)
        truncated = 0
        if self.damage is not None:
            self._size = file_size
            self._next_offset = max(self._next_offset, end_offset if end_offset is not None else verify_from_offset)
        elif self._size < file_size:
            self._truncate_file(self._size)
            truncated = file_size - self._size
        self._indexes.seal()
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._first_append_ms = self._header_at(0).max_timestamp if self._size else None
        return truncated

    def _reset(self) -> None:
        self._recent.clear()
        self._indexes.reset()
        self._sealed = False
        self._size = 0
        self._next_offset = self.base_offset
        self.damage = None

    def _check_offsets(self, position: int, header: record.BatchHeader) -> None:
        """The CRC does not cover offsets, so recovery checks they grow and fit the index."""
        if header.base_offset < self._next_offset or header.next_offset - 1 - self.base_offset > INT32_MAX:
            raise CorruptMessageError(
                f"batch at byte {position}: offsets {header.base_offset}..{header.last_offset} do not "
                f"follow {self._next_offset - 1} in a segment based at {self.base_offset}"
            )

    def _scan(self, batches: Iterator[tuple[int, record.BatchHeader]]) -> None:
        """Advance next offset and max timestamp over `batches` (which must start at a batch
        whose base offset is at least the current next offset)."""
        for position, header in batches:
            self._check_offsets(position, header)
            self._next_offset = header.next_offset
            self._indexes.observe(header.base_offset, header.max_timestamp)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset >= `offset` (so the batch holding `offset` goes
        whole). Returns the bytes removed; the segment becomes writable again (even when nothing
        is cut: the log's end was cut back to it, so it is the active segment now)."""
        found = self.find_position(offset)
        self._sealed = False
        self._recent.clear()
        if found is None:
            return 0
        position, header = found
        removed = self._size - position
        self._truncate_file(position)
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        self.txn_index.truncate_to(header.base_offset)
        self._size = position
        # Kafka's loadLargestTimestamp: the time index's last entry, then every batch after it.
        self._indexes.resume()
        self._next_offset, start = self.offset_index.position_of(self._indexes.offset_of_max_timestamp)
        self._scan(self._batches(start, position, FRAME_ONLY))
        if not self._size:
            self._first_append_ms = None
        return removed

    def _header_at(self, position: int) -> record.BatchHeader:
        return record.read_header(self._pread(record.HEADER_SIZE, position))

    def _file_size(self) -> int:
        with self._cache.pinned(self.log_path) as fd:
            try:
                return os.fstat(fd).st_size
            except OSError as err:
                raise KafkaStorageError(f"cannot stat {self.log_path}: {err}") from err

    def _truncate_file(self, size: int) -> None:
        with self._cache.pinned(self.log_path) as fd:
            try:
                os.ftruncate(fd, size)
            except OSError as err:
                raise KafkaStorageError(f"cannot truncate {self.log_path}: {err}") from err

    # --- durability and lifecycle -----------------------------------------------------------

    def seal(self) -> None:
        """Make the segment immutable (`mark_sealed`), then write its queued index entries and
        release the index fds (`write_indexes`). Not durable until flushed."""
        self.mark_sealed()
        self.write_indexes()

    def mark_sealed(self) -> None:
        """The in-memory half of `seal`: record the max timestamp as the last time-index entry and
        take no more appends. No I/O: a log rolls under its view lock with this."""
        self._indexes.seal()
        self._sealed = True
        self._recent.clear()  # tailing fetches go to the new active segment; this one is read via its index

    def write_indexes(self) -> None:
        """Write queued index entries and release the index fds (the I/O half of `seal` and
        `close`). Readers use the in-memory entries only, so this needs no view lock. An empty
        segment whose index files were never made gets none: `load` takes an empty `.log` without
        index files as an empty segment (a clean stop of 100,000 new partitions would otherwise
        create 200,000 files)."""
        if self._size or self.offset_index.file_made or self.time_index.file_made:
            self.offset_index.write_pending()
            self.time_index.write_pending()
        self._close_indexes()

    def prepare_sync(self) -> list[int]:
        """Write queued index entries and return new fds (owned by the caller, who must close
        them) whose fsync makes the segment durable; safe to fsync from another thread."""
        fds = [self._cache.dup(self.log_path)]
        try:
            fds.append(self.offset_index.prepare_sync())
            fds.append(self.time_index.prepare_sync())
            txn_fd = self.txn_index.prepare_sync()
            if txn_fd is not None:
                fds.append(txn_fd)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            # Index entries reach their files only here, at seal and at close: their write fds
            # are reopened for that and closed again, so a partition holds no descriptor between
            # flushes (10,000 partitions would otherwise pin 20,000 of them). The `.log` fds live
            # in the bounded FileCache.
            self._close_indexes()
        return fds

    def flush(self) -> None:
        """fsync the `.log` and both indexes."""
        fsync_and_close(self.prepare_sync(), self.log_path)

    def mark_deleted(self) -> None:
        """Rename the segment's files `.deleted` (it left its log; see `rename_to`)."""
        self.rename_to(DELETED_SUFFIX)

    def rename_to(self, state: str) -> None:
        """Rename every file of the segment to its name in `state` ("" live, `.deleted`,
        `.cleaned`, `.swap`); descriptors in use (and the reads behind them) stay valid. The `.log`
        goes last: a restart judges a segment by its `.log`, so everything else must be renamed by
        then. KafkaStorageError if a rename fails; the `.log` then keeps its name (the indexes are
        renamed back if they can be, and a restart rebuilds them if not) and the segment is still
        whole in its old state."""
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._close_indexes()
        old, new = self.files, self.files.in_state(state)
        indexes = ((self.offset_index, old.index, new.index), (self.time_index, old.time_index, new.time_index),
                   (self.txn_index, old.txn_index, new.txn_index))
        try:
            for index, _, path in indexes:
                index.rename(path)
            os.rename(old.log, new.log)
        except (OSError, KafkaStorageError) as err:
            for index, path, _ in indexes:
                with contextlib.suppress(KafkaStorageError):
                    index.rename(path)
            raise KafkaStorageError(f"cannot rename {old.log} and its indexes to {new.log}: {err}") from err
        self._cache.rename(old.log, new.log)
        self.files = new

    def close(self) -> None:
        """Write queued index entries and close every fd (no fsync). Idempotent."""
        self.write_indexes()
        self._cache.forget(self.log_path)

    def delete(self) -> None:
        """Close and unlink the segment's files, wherever they are named now."""
        self._close_indexes()
        self._cache.forget(self.log_path)
        for path in self.files.paths():
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                raise KafkaStorageError(f"cannot delete {path}: {err}") from err

    def _close_indexes(self) -> None:
        self.offset_index.close()
        self.time_index.close()

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, offsets {self.base_offset}..{self._next_offset}, {self._size} bytes)"
