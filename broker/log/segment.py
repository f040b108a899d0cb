"""Log segment `{base_offset:020d}.log`: concatenated record batches plus their two sparse indexes.

    {base_offset:020d}.log        batch | batch | ...   record.py's format, base offsets strictly
                                                        increasing, the first >= base_offset
    {base_offset:020d}.index      OffsetIndex (offset_index.py)
    {base_offset:020d}.timeindex  TimeIndex (time_index.py)
    *.deleted                     the same files after retention removed the segment from its log,
                                  waiting for in-flight reads to finish before they are unlinked

Only the active (last) segment of a partition is appended to; once sealed it is immutable. The
`.log` is written with pwrite at the segment's known size, so a failed write never shifts later
data, and read with pread / sendfile through a separate read-only file object. Index entries are
derived data: `recover` re-validates every batch and rebuilds both indexes.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from broker import record
from broker.config import INT32_MAX
from broker.errors import CorruptMessageError, KafkaStorageError, MessageTooLargeError
from broker.log.checkpoint import fsync_and_close
from broker.log.index_file import CorruptIndexError
from broker.log.offset_index import OffsetIndex
from broker.log.time_index import NO_TIMESTAMP, TimeIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
_READ_CHUNK = 4 << 20  # recovery reads this much at a time, so small batches cost no syscall each


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    """Path of one of a segment's files; 20-digit names make `ls` sort by offset."""
    return directory / f"{base_offset:020d}{suffix}"


class BatchInfo(NamedTuple):
    """What a segment needs to know about one appended batch (from its validated header)."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(slots=True)
class FetchSlice:
    """A byte range of one segment file, ready for sendfile or pread.

    `file` is the segment's shared read-only file object: use its fileno() with sendfile / pread,
    never seek or close it, and take the fileno() when sending, not earlier (once the segment is
    deleted the number may name another file; a closed file object raises instead).
    `first_offset` is the base offset of the first batch in the range (at or before the requested
    offset); the range may end mid-batch (KIP-74). An empty slice has size 0.
    """

    file: io.FileIO
    position: int
    size: int
    first_offset: int

    def read_bytes(self) -> bytes:
        """The slice's bytes via pread (for transports without sendfile, and tests)."""
        chunks, position, remaining = [], self.position, self.size
        while remaining:
            try:
                chunk = os.pread(self.file.fileno(), remaining, position)
            except OSError as err:
                raise KafkaStorageError(f"cannot read {self.file.name}: {err}") from err
            if not chunk:
                break  # the file shrank under us: return what exists
            chunks.append(chunk)
            position += len(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


class Segment:
    """One `.log` file and its indexes.

    Build with `create` (a new empty segment) or `open` followed by `load` (trust the indexes,
    check the tail) or `recover` (re-validate everything). Not thread-safe: PartitionLog serializes
    calls; only `prepare_sync`'s returned fds may be used from another thread.
    """

    def __init__(self, directory: Path, base_offset: int) -> None:
        self.base_offset = base_offset
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        self.offset_index = OffsetIndex(segment_file(directory, base_offset, INDEX_SUFFIX), base_offset)
        self.time_index = TimeIndex(segment_file(directory, base_offset, TIME_INDEX_SUFFIX), base_offset)
        self._write_fd: int | None = None
        self._size = 0
        self._next_offset = base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = base_offset
        self._first_append_ms: int | None = None
        self._sealed = False
        try:
            self._file = io.FileIO(self.log_path, "r")
        except OSError as err:
            raise KafkaStorageError(f"cannot open {self.log_path}: {err}") from err

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> Segment:
        """A new empty active segment. Raises KafkaStorageError if its `.log` already exists."""
        path = segment_file(directory, base_offset, LOG_SUFFIX)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as err:
            raise KafkaStorageError(f"cannot create {path}: {err}") from err
        segment = cls(directory, base_offset)
        segment.offset_index = OffsetIndex.create(segment.offset_index.path, base_offset)
        segment.time_index = TimeIndex.create(segment.time_index.path, base_offset)
        return segment

    @classmethod
    def open(cls, directory: Path, base_offset: int) -> Segment:
        """Open an existing segment; call `load` or `recover` before anything else."""
        return cls(directory, base_offset)

    # --- state -------------------------------------------------------------------------------

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
        """Largest batch max_timestamp stored (ms), NO_TIMESTAMP (-1) when empty."""
        return self._max_timestamp

    @property
    def first_append_ms(self) -> int | None:
        """When the segment got its first batch, for segment.ms: the clock at that append, or after
        a restart the first batch's max timestamp (Kafka's rule). None while empty."""
        return self._first_append_ms

    @property
    def file(self) -> io.FileIO:
        """The shared read-only file object that FetchSlices point into."""
        return self._file

    @property
    def sealed(self) -> bool:
        return self._sealed

    # --- append ------------------------------------------------------------------------------

    def append(self, data: memoryview, batches: Sequence[BatchInfo], index_interval_bytes: int, now_ms: int) -> None:
        """Write validated, offset-assigned batches at the end with one pwrite, then index them.

        Raises KafkaStorageError if the write fails; the segment's state is then unchanged.
        """
        assert not self._sealed, f"{self.log_path.name} is sealed"
        assert batches and batches[0].base_offset >= self._next_offset, (batches[:1], self._next_offset)
        assert sum(b.size for b in batches) == len(data)
        self._write(data, self._size)
        position = self._size
        for batch in batches:
            self._index_batch(batch, position, index_interval_bytes)
            position += batch.size
        self._size = position
        if self._first_append_ms is None:
            self._first_append_ms = now_ms

    def _write(self, data: memoryview, position: int) -> None:
        fd = self._writer()
        try:
            written = os.pwrite(fd, data, position)
            while written < len(data):  # regular files only write short on a full disk
                written += os.pwrite(fd, data[written:], position + written)
        except OSError as err:
            with contextlib.suppress(OSError):  # if this fails too, the next pwrite overwrites the torn bytes
                os.ftruncate(fd, position)
            raise KafkaStorageError(f"cannot write {self.log_path}: {err}") from err

    def _index_batch(self, batch: BatchInfo, position: int, index_interval_bytes: int) -> None:
        """Account one batch at `position`: max timestamp, next offset, index entries (Kafka's rule:
        an entry once more than index.interval.bytes were written since the last one)."""
        assert batch.next_offset - 1 - self.base_offset <= INT32_MAX, "relative offset overflows the index"
        if batch.max_timestamp > self._max_timestamp:
            self._max_timestamp = batch.max_timestamp
            self._offset_of_max_timestamp = batch.base_offset
        if position - self.offset_index.last_position > index_interval_bytes:
            self.offset_index.append(batch.base_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self._next_offset = batch.next_offset

    def _writer(self) -> int:
        if self._write_fd is None:
            try:
                self._write_fd = os.open(self.log_path, os.O_RDWR)
            except OSError as err:
                raise KafkaStorageError(f"cannot open {self.log_path} for writing: {err}") from err
        return self._write_fd

    # --- read --------------------------------------------------------------------------------

    def find_position(self, offset: int) -> tuple[int, record.BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= `offset`, or None if the
        segment ends before `offset`. Index lookup, then a short scan of 61-byte headers."""
        if offset >= self._next_offset:
            return None
        _, start = self.offset_index.lookup(offset)
        for position, header in self._headers(start, self._size):
            if header.next_offset > offset:
                return position, header
        raise KafkaStorageError(f"{self.log_path.name} ends before its next offset {self._next_offset}")

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FetchSlice | None:
        """Bytes from the batch holding `offset`: min(max_bytes, what the segment holds [before the
        batch holding `max_offset`]), but the whole first batch even beyond max_bytes (KIP-74).
        None if the segment ends before `offset`."""
        found = self.find_position(offset)
        if found is None:
            return None
        position, header = found
        end = self._size
        if max_offset is not None:
            limit = self.find_position(max_offset)
            end = end if limit is None else limit[0]
        size = max(0, min(end - position, max(max_bytes, header.size)))
        return FetchSlice(self._file, position, size, header.base_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp_ms`, or None.

        The time index bounds the scan; the matching batch's body is decoded only when its
        records may straddle the target (CreateTime and base_timestamp < target).
        """
        if self._max_timestamp < timestamp_ms:
            return None
        _, start = self.offset_index.lookup(self.time_index.lookup(timestamp_ms))
        for position, header in self._headers(start, self._size):
            if header.max_timestamp >= timestamp_ms:
                return self._first_record_at_or_after(position, header, timestamp_ms)
        return None

    def _first_record_at_or_after(self, position: int, header: record.BatchHeader, timestamp_ms: int) -> tuple[int, int]:
        if header.log_append_time:  # every record carries the batch's max timestamp
            return header.base_offset, header.max_timestamp
        body = record.decode_body(self._pread(header.size, position), header)
        timestamps = body.column("timestamp").cast(pa.int64()).to_numpy()
        i = int(np.argmax(timestamps >= timestamp_ms))
        return header.base_offset + i, int(timestamps[i])

    def _pread(self, size: int, position: int) -> bytes:
        try:
            return os.pread(self._file.fileno(), size, position)
        except OSError as err:
            raise KafkaStorageError(f"cannot read {self.log_path}: {err}") from err

    def _headers(self, position: int, end: int) -> Iterator[tuple[int, record.BatchHeader]]:
        """Headers of consecutive batches from `position` to `end`, one pread each (no CRC check)."""
        while position < end:
            header = record.read_header(self._pread(record.HEADER_SIZE, position))
            if header.size < record.HEADER_SIZE or position + header.size > end:
                raise CorruptMessageError(f"{self.log_path.name}: bad batch length at byte {position}")
            yield position, header
            position += header.size

    def _validated_batches(
        self, position: int, end: int, max_batch_bytes: int | None
    ) -> Iterator[tuple[int, record.BatchHeader]]:
        """Fully validated batches from `position` to `end`, read in large chunks. Raises
        CorruptMessageError / MessageTooLargeError at the first bad or torn batch."""
        buf, buf_start = b"", position
        while position < end:
            offset_in_buf = position - buf_start
            size = record.batch_size_at(buf, offset_in_buf)
            if size is None or offset_in_buf + max(size, record.HEADER_SIZE) > len(buf):
                wanted = size if size is not None and (max_batch_bytes is None or size <= max_batch_bytes) else 0
                buf = self._pread(min(end - position, max(_READ_CHUNK, wanted)), position)
                buf_start, offset_in_buf = position, 0
            header = record.validate_batch(buf, offset_in_buf, max_batch_bytes=max_batch_bytes)
            yield position, header
            position += header.size

    # --- load and recovery ---------------------------------------------------------------------

    def load(self) -> None:
        """Trust the index files, check them against the `.log`, and fully validate the batches
        after the last index entry (the part a crash could have torn).

        Raises CorruptIndexError / CorruptMessageError if anything disagrees: call `recover` then.
        """
        file_size = self._file_size()
        self.offset_index = OffsetIndex.load(self.offset_index.path, self.base_offset)
        self.time_index = TimeIndex.load(self.time_index.path, self.base_offset)
        self.offset_index.sanity_check(file_size)
        if len(self.offset_index):
            indexed = self._header_at(self.offset_index.last_position)
            if indexed.base_offset != self.offset_index.last_offset:
                raise CorruptIndexError(f"{self.offset_index.path.name}: last entry does not match the log")
        self._size = file_size
        # The time index covers every batch up to the last offset-index entry (entries are added
        # together), so only the batches from there on need reading: and they are the ones a
        # crash could have torn, so they are validated in full.
        self._max_timestamp, self._offset_of_max_timestamp = self.time_index.last_entry
        self._next_offset = self.offset_index.last_offset
        self._scan(self._validated_batches(self.offset_index.last_position, file_size, None))
        self.time_index.sanity_check(self._next_offset)
        self._first_append_ms = self._header_at(0).max_timestamp if file_size else None

    def recover(self, max_batch_bytes: int | None, index_interval_bytes: int) -> int:
        """Re-validate every batch, truncate the file at the first torn or corrupt one (or the
        first larger than `max_batch_bytes`, if given), rebuild both indexes. Returns how many
        bytes were dropped."""
        file_size = self._file_size()
        self._reset()
        try:
            for position, header in self._validated_batches(0, file_size, max_batch_bytes):
                self._check_offsets(position, header)
                batch = BatchInfo(header.base_offset, header.next_offset, header.size, header.max_timestamp)
                self._index_batch(batch, position, index_interval_bytes)
                self._size = position + header.size
        except (CorruptMessageError, MessageTooLargeError) as err:
            log.warning("%s: truncating %d bytes at byte %d: %s", self.log_path, file_size - self._size, self._size, err)
        if self._size < file_size:
            self._truncate_file(self._size)
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._first_append_ms = self._header_at(0).max_timestamp if self._size else None
        return file_size - self._size

    def _reset(self) -> None:
        self.offset_index.reset()
        self.time_index.reset()
        self._sealed = False
        self._size = 0
        self._next_offset = self.base_offset
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = self.base_offset

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
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.base_offset

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset >= `offset` (so the batch holding `offset` goes
        whole). Returns the bytes removed; the segment becomes writable again."""
        found = self.find_position(offset)
        if found is None:
            return 0
        position, header = found
        removed = self._size - position
        self._truncate_file(position)
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        self._size = position
        self._sealed = False
        # Kafka's loadLargestTimestamp: the time index's last entry, then every batch after it.
        self._max_timestamp, self._offset_of_max_timestamp = self.time_index.last_entry
        self._next_offset, start = self.offset_index.lookup(self._offset_of_max_timestamp)
        self._scan(self._headers(start, position))
        if not self._size:
            self._first_append_ms = None
        return removed

    def _header_at(self, position: int) -> record.BatchHeader:
        return record.read_header(self._pread(record.HEADER_SIZE, position))

    def _file_size(self) -> int:
        try:
            return os.fstat(self._file.fileno()).st_size
        except OSError as err:
            raise KafkaStorageError(f"cannot stat {self.log_path}: {err}") from err

    def _truncate_file(self, size: int) -> None:
        try:
            os.ftruncate(self._writer(), size)
        except OSError as err:
            raise KafkaStorageError(f"cannot truncate {self.log_path}: {err}") from err

    # --- durability and lifecycle -----------------------------------------------------------

    def seal(self) -> None:
        """Make the segment immutable: record its max timestamp as the last time-index entry,
        write queued index entries, release the write fds. Not durable until flushed."""
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._close_writers()
        self._sealed = True

    def prepare_sync(self) -> list[int]:
        """Write queued index entries and return new fds (owned by the caller, who must close
        them) whose fsync makes the segment durable; safe to fsync from another thread."""
        try:
            fds = [os.dup(self._file.fileno())]
        except OSError as err:
            raise KafkaStorageError(f"cannot dup the fd of {self.log_path}: {err}") from err
        try:
            fds.append(self.offset_index.prepare_sync())
            fds.append(self.time_index.prepare_sync())
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def flush(self) -> None:
        """fsync the `.log` and both indexes."""
        fsync_and_close(self.prepare_sync(), self.log_path)

    def mark_deleted(self) -> None:
        """Rename the files with a `.deleted` suffix; open fds (and in-flight reads) stay valid."""
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._close_writers()
        deleted = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        try:
            os.rename(self.log_path, deleted)
        except OSError as err:
            raise KafkaStorageError(f"cannot rename {self.log_path}: {err}") from err
        self.log_path = deleted
        for index in (self.offset_index, self.time_index):
            index.rename(index.path.with_name(index.path.name + DELETED_SUFFIX))

    def close(self) -> None:
        """Write queued index entries and close every fd (no fsync). Idempotent."""
        if self._file.closed:
            return
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self._close_writers()
        self._file.close()

    def delete(self) -> None:
        """Close and unlink the segment's files, wherever they are named now."""
        self._close_writers()
        self._file.close()
        self.offset_index.delete()
        self.time_index.delete()
        try:
            self.log_path.unlink(missing_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot delete {self.log_path}: {err}") from err

    def _close_writers(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        self.offset_index.close()
        self.time_index.close()

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, offsets {self.base_offset}..{self._next_offset}, {self._size} bytes)"
