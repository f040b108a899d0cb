"""SegmentReader: a pure reader of one segment's `.log` over any file-like object (docs/architecture.md, Tiered storage).

Sealed segments are uploaded to object storage and read there by brokers and by Spark executors
straight through fsspec, without a broker in between. Such a reader has a file object (read, seek,
tell; maybe no fileno) rather than a local descriptor, and every read may be a network round trip.
So the reader never reads a 61-byte header on its own: all reads go through one window over the
file that fetches large ranges, starting at `min_read_bytes` and doubling, up to
`max_read_bytes`, while the reads stay sequential (a seek elsewhere starts small again). A lookup
through the offset index then costs one ranged read; a scan of the whole segment costs a handful.

    source        a seekable binary file object (`open(path, "rb")`, `fs.open(url, "rb")`), or a
                  `pread(size, position) -> bytes` callable with the segment's size given
    offset_index  the `.index` file's bytes (or a loaded SparseIndex): find_position's shortcut
    time_index    the `.timeindex` file's bytes (or a loaded SparseIndex): offset_for_timestamp's

The index bytes go through the same parser the broker uses (`IndexFile.parse`), so a bad index
file raises CorruptIndexError here too. Bad `.log` bytes raise CorruptMessageError naming the
segment and the byte position: never struct.error or IndexError, and no batch that failed a check
is ever yielded. Pure: no global state, no sockets, no asyncio; not thread-safe (the window and a
file object's position are state): one reader per thread.
"""
from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import pyarrow as pa

from common.errors import CorruptMessageError, KafkaStorageError
from segment_format import record
from segment_format.index_file import OFFSET_INDEX, TIME_INDEX, CorruptIndexError, SparseIndex
from segment_format.limits import INT32_MAX, INT64_MAX

PRead = Callable[[int, int], bytes]
"""pread(size, position): up to `size` bytes of the segment from byte `position` (fewer only at EOF)."""

FRAME_ONLY = INT64_MAX
"""A `verify_from_offset` that validates no batch: each is only framed (magic, length, offsets)."""

MIN_READ_BYTES = 64 << 10  # covers an index interval (4 KiB by default) and then some, in one read
MAX_READ_BYTES = 8 << 20  # large enough that a remote scan is a few ranged GETs per segment


class StoredBatch(NamedTuple):
    """One batch of the segment: where it starts, its header, and its bytes (header and body;
    read-only, and valid as long as the caller keeps it: it holds the read buffer alive)."""

    position: int
    header: record.BatchHeader
    data: memoryview


def file_pread(file: BinaryIO) -> PRead:
    """A pread over a seekable file object: seek, then read until `size` bytes or EOF (a file
    object may return short reads; fsspec files of remote objects do at block boundaries)."""

    def pread(size: int, position: int) -> bytes:
        file.seek(position)
        chunks, remaining = [], size
        while remaining:
            chunk = file.read(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    return pread


class SegmentReader:
    """Reads the batches of one segment `.log`; see the module docstring for sources and errors.

    `base_offset` is the segment's (from its file name); `name` names it in errors (default
    `{base_offset:020d}.log`). `size` is the `.log`'s length in bytes: required with a pread
    callable, found by seeking to the end of a file object otherwise. Batches past `size` do not
    exist for the reader, which is how a caller reads a segment still being appended to.
    """

    def __init__(
        self,
        source: BinaryIO | PRead,
        base_offset: int,
        *,
        size: int | None = None,
        name: str | None = None,
        offset_index: SparseIndex | bytes | bytearray | memoryview | None = None,
        time_index: SparseIndex | bytes | bytearray | memoryview | None = None,
        min_read_bytes: int = MIN_READ_BYTES,
        max_read_bytes: int = MAX_READ_BYTES,
        align: int | None = None,
    ) -> None:
        assert 0 < min_read_bytes <= max_read_bytes, (min_read_bytes, max_read_bytes)
        assert align is None or align > 0, align
        self.base_offset = base_offset
        self.name = name or f"{base_offset:020d}.log"
        if callable(source):
            if size is None:
                raise ValueError("a pread source needs the segment's size")
            self._pread: PRead = source
        else:
            self._pread = file_pread(source)
            if size is None:
                size = self._file_size(source)
        self.size = size
        self._min_read = min_read_bytes
        self._max_read = max_read_bytes
        self._align = align  # reads ahead stop at a multiple of it (a cache's chunk bounds)
        self._next_read = min_read_bytes
        self._buf = b""
        self._buf_start = 0
        self.offset_index = self._offset_index(offset_index)
        self.time_index = self._time_index(time_index)

    def _file_size(self, file: BinaryIO) -> int:
        try:
            file.seek(0, io.SEEK_END)
            return file.tell()
        except OSError as err:
            raise KafkaStorageError(f"cannot find the size of {self.name}: {err}") from err

    def _index_path(self, suffix: str) -> Path:
        return Path(self.name).with_suffix(suffix)

    def _offset_index(self, index: SparseIndex | bytes | bytearray | memoryview | None) -> SparseIndex | None:
        """Parse the `.index` bytes and check them against the `.log`'s size; a loaded SparseIndex
        is trusted as is (its owner checked it)."""
        if index is None or isinstance(index, SparseIndex):
            return index
        parsed = OFFSET_INDEX.parse(index, self._index_path(".index"), self.base_offset)
        parsed.sanity_check(self.size)
        return parsed

    def _time_index(self, index: SparseIndex | bytes | bytearray | memoryview | None) -> SparseIndex | None:
        """Parse the `.timeindex` bytes and check their order. Where the segment ends in offsets
        is unknown until it is scanned: an entry past the end is caught by offset_for_timestamp."""
        if index is None or isinstance(index, SparseIndex):
            return index
        parsed = TIME_INDEX.parse(index, self._index_path(".timeindex"), self.base_offset)
        parsed.sanity_check(INT64_MAX)
        return parsed

    # --- reading bytes ---------------------------------------------------------------------

    def _read(self, size: int, position: int) -> bytes:
        """Exactly `size` bytes at `position` (which the caller keeps within `self.size`)."""
        try:
            data = self._pread(size, position)
        except OSError as err:
            raise KafkaStorageError(f"cannot read {self.name} at byte {position}: {err}") from err
        if len(data) != size:
            raise CorruptMessageError(
                f"{self.name}: ends at byte {position + len(data)}, before its size of {self.size} bytes")
        return data

    def _bytes(self, position: int, size: int) -> tuple[bytes, int]:
        """A buffer holding bytes [position, position + size) of the segment, and where they start
        in it. Served from the window when it holds them; otherwise the window moves to `position`
        and reads ahead: at least `size` bytes, more while reads stay sequential."""
        if not (0 <= position and position + size <= self.size):
            raise self._corrupt(position, f"{size} bytes from here are outside the segment's {self.size} bytes")
        at = position - self._buf_start
        if 0 <= at and at + size <= len(self._buf):
            return self._buf, at
        sequential = 0 <= at <= len(self._buf)
        keep = self._buf[at:] if sequential else b""  # bytes already read, kept (a copy beats a round trip)
        if not sequential:
            self._next_read = self._min_read
        read_from = position + len(keep)
        needed = size - len(keep)
        wanted = max(needed, self._next_read)
        if self._align is not None:  # read ahead only to the end of the chunk holding the last byte needed
            wanted = max(needed, min(wanted, -(-(read_from + needed) // self._align) * self._align - read_from))
        wanted = min(wanted, self.size - read_from)
        fresh = self._read(wanted, read_from)
        self._buf = keep + fresh if keep else fresh
        self._buf_start = position
        self._next_read = min(2 * self._next_read, self._max_read)
        return self._buf, 0

    def _corrupt(self, position: int, why: str) -> CorruptMessageError:
        return CorruptMessageError(f"{self.name}: batch at byte {position}: {why}")

    # --- iterating batches -------------------------------------------------------------------

    def stored_batches(self, position: int = 0, end: int | None = None, *,
                       verify_from_offset: int = 0) -> Iterator[StoredBatch]:
        """The batches from byte `position` (a batch boundary) to `end` (default: the segment's
        size), with their bytes. Batches whose offsets reach `verify_from_offset` are fully
        validated (`record.validate_batch`: CRC, fields, body framing), so the default validates
        every batch; earlier ones, and every one with FRAME_ONLY, are only framed. Every batch is
        checked to follow the previous one in offsets. CorruptMessageError at the first bad batch,
        or if bytes before `end` do not make a whole batch (a torn tail)."""
        yield from self._scan(position, end, verify_from_offset, with_data=True)

    def batches(self, position: int = 0, end: int | None = None, *,
                verify_from_offset: int = 0) -> Iterator[tuple[int, record.BatchHeader]]:
        """(position, header) of each batch, as `stored_batches`. With FRAME_ONLY the bodies are
        not even looked at, only skipped (the window still reads them when they are small)."""
        for batch in self._scan(position, end, verify_from_offset, with_data=False):
            yield batch.position, batch.header

    def _scan(self, position: int, end: int | None, verify_from_offset: int, with_data: bool) -> Iterator[StoredBatch]:
        end = self.size if end is None else end
        if not 0 <= position <= end <= self.size:
            raise self._corrupt(position, f"a scan to byte {end} is outside the segment's {self.size} bytes")
        lower = self.base_offset  # the least base offset the next batch may have
        while position < end:
            if end - position < record.HEADER_SIZE:
                raise self._corrupt(position, f"{end - position} bytes left, too few for a batch header")
            buf, at = self._bytes(position, record.HEADER_SIZE)
            header = record.read_header(buf, at)
            size = header.size
            if header.magic != record.MAGIC or not record.HEADER_SIZE <= size <= end - position:
                raise self._corrupt(position, f"bad framing (magic {header.magic}, {size} bytes where {end - position} remain)")
            data = memoryview(b"")
            verify = header.next_offset > verify_from_offset
            if verify or with_data:
                buf, at = self._bytes(position, size)
                data = memoryview(buf)[at : at + size]
            if verify:
                header = self._validate(position, data)
            self._check_offsets(position, header, lower)
            yield StoredBatch(position, header, data)
            lower = header.next_offset
            position += size

    def _validate(self, position: int, data: memoryview) -> record.BatchHeader:
        try:
            return record.validate_batch(data)
        except CorruptMessageError as err:
            # validate_batch names the batch's position in `data`, which is always 0 here.
            raise self._corrupt(position, str(err).removeprefix("batch at byte 0: ")) from err

    def _check_offsets(self, position: int, header: record.BatchHeader, lower: int) -> None:
        """The CRC does not cover offsets: check they grow and fit a relative index entry."""
        if header.base_offset < lower or header.last_offset_delta < 0 or header.last_offset - self.base_offset > INT32_MAX:
            raise self._corrupt(
                position, f"offsets {header.base_offset}..{header.last_offset} do not follow {lower - 1} "
                          f"in a segment based at {self.base_offset}")

    # --- lookups -------------------------------------------------------------------------------

    def find_position(self, offset: int) -> tuple[int, record.BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= `offset`, or None if the
        segment ends before `offset`. The offset index (when given) gives where to start; a scan
        of framed headers finishes. CorruptIndexError if the index entry does not point at the
        start of the batch it names; CorruptMessageError if the scan meets bad bytes."""
        entry_offset, start = self.offset_index.position_of(offset) if self.offset_index is not None else (self.base_offset, 0)
        batches = self.batches(start, verify_from_offset=FRAME_ONLY)
        try:
            first = next(batches, None)
        except CorruptMessageError as err:
            if not start:
                raise
            # No batch begins where the entry says (it points inside one): the index is wrong.
            raise CorruptIndexError(f"{self._index_path('.index').name}: entry ({entry_offset}, {start}) "
                                    f"points at no batch: {err}") from err
        if first is not None and start and first[1].base_offset != entry_offset:
            raise CorruptIndexError(
                f"{self._index_path('.index').name}: entry ({entry_offset}, {start}) points at a batch "
                f"based at {first[1].base_offset}")
        for position, header in itertools.chain([first] if first is not None else [], batches):
            if header.next_offset > offset:
                return position, header
        return None

    def offset_for_timestamp(self, timestamp_ms: int, start_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `start_offset` (a log start: the
        records below it are deleted) with timestamp >= `timestamp_ms`, or None.

        The time index (when given) bounds the scan; only the matching batch's body is decoded,
        and only when its records' timestamps differ (a CreateTime batch: within a batch they need
        not grow) or some of its records lie below `start_offset`. A LogAppendTime batch's records
        all carry its max_timestamp. Callers holding a segment's max timestamp (the remote
        manifest has it) skip segments that end before the target: the reader cannot, without
        scanning."""
        floor_offset = start_offset
        if self.time_index is not None and len(self.time_index):
            floor_offset = max(floor_offset, self.time_index.offset_for_time(timestamp_ms))
        start = 0
        if floor_offset > self.base_offset:
            found = self.find_position(floor_offset)
            if found is None:
                if floor_offset > start_offset:
                    raise CorruptIndexError(
                        f"{self._index_path('.timeindex').name}: offset {floor_offset} is past the segment's end")
                return None
            start = found[0]
        for position, header in self.batches(start, verify_from_offset=FRAME_ONLY):
            if header.max_timestamp >= timestamp_ms and header.last_offset >= start_offset:
                hit = self._first_record_at_or_after(position, header, timestamp_ms, start_offset)
                if hit is not None:
                    return hit
        return None

    def _first_record_at_or_after(self, position: int, header: record.BatchHeader, timestamp_ms: int,
                                  start_offset: int) -> tuple[int, int] | None:
        same_timestamps = header.log_append_time or header.base_timestamp == header.max_timestamp
        if same_timestamps and header.base_offset >= start_offset:
            # Every record of a LogAppendTime batch carries its max timestamp, and the header
            # tells every timestamp of a batch whose records share one.
            return header.base_offset, header.max_timestamp
        # base_timestamp is the smallest timestamp, not the first record's: even when it reaches
        # the target (the first record qualifies), only the body tells that record's timestamp.
        buf, at = self._bytes(position, header.size)
        data = memoryview(buf)[at : at + header.size]
        body = self._decode(position, self._validate(position, data), data)
        offsets = record.record_offsets(header, body).to_numpy()  # compacted bodies have gaps
        if same_timestamps:
            timestamps = np.full(len(offsets), header.max_timestamp, dtype=np.int64)
        else:
            timestamps = body.column("timestamp").cast(pa.int64()).to_numpy()
        matches = (timestamps >= timestamp_ms) & (offsets >= start_offset)
        if not matches.any():
            return None
        i = int(np.argmax(matches))
        return int(offsets[i]), int(timestamps[i])

    # --- ranges ----------------------------------------------------------------------------------

    def _range(self, start_offset: int, end_offset: int | None, validate: bool) -> Iterator[StoredBatch]:
        """The batches holding offsets [start_offset, end_offset) (end None: to the segment's end)."""
        found = self.find_position(start_offset)
        if found is None:
            return
        for batch in self.stored_batches(found[0], verify_from_offset=0 if validate else FRAME_ONLY):
            if end_offset is not None and batch.header.base_offset >= end_offset:
                return
            yield batch

    def read_range(self, start_offset: int, end_offset: int | None = None, *, max_bytes: int | None = None,
                   validate: bool = True) -> bytes:
        """The raw bytes of the consecutive batches holding offsets [start_offset, end_offset):
        the first batch may begin before `start_offset`, as in a fetch. With `max_bytes`, stop
        before the batch that would exceed it, but always return the first batch whole (KIP-74).
        b"" if the segment ends before `start_offset`. `validate` checks each returned batch
        fully (CRC included) before any byte of it is returned."""
        parts: list[memoryview] = []
        total = 0
        for batch in self._range(start_offset, end_offset, validate):
            if max_bytes is not None and parts and total + len(batch.data) > max_bytes:
                break
            parts.append(batch.data)
            total += len(batch.data)
        return b"".join(parts)

    def read_arrow(self, start_offset: int, end_offset: int | None = None, *,
                   validate: bool = True) -> Iterator[tuple[record.BatchHeader, pa.RecordBatch]]:
        """(header, body) of each batch holding offsets [start_offset, end_offset), decoded with
        `record.decode_body`: zero copy over the read buffer when the body is uncompressed.

        Bodies are whole batches, as stored: `record.record_offsets(header, body)` gives each
        record's offset (base_offset + i, or + offset_delta[i] in a body rewritten by
        compaction), so the caller trims the first and last batch to its range. Control batches are included
        (`header.is_control`). Timestamps are the body's column, as the producer wrote them; for
        a LogAppendTime batch (`header.log_append_time`) every record's timestamp is really
        header.max_timestamp, the broker's append time, which the body does not carry (pymq's
        consumer substitutes it: `client.decoder.to_record_batch`)."""
        for batch in self._range(start_offset, end_offset, validate):
            yield batch.header, self._decode(batch.position, batch.header, batch.data)

    def _decode(self, position: int, header: record.BatchHeader, data: memoryview) -> pa.RecordBatch:
        try:
            return record.decode_body(data, header)
        except CorruptMessageError as err:
            raise self._corrupt(position, str(err)) from err

    def __repr__(self) -> str:
        return f"SegmentReader({self.name}, {self.size} bytes)"
