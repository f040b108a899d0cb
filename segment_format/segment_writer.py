"""SegmentWriter: a sealed segment written without a broker (docs/architecture.md, Log layers).

Spark jobs (compaction, bulk loads) write segments that brokers and tiered storage then read as
their own: the same `.log`, `.index` and `.timeindex` bytes the broker's `Segment` writes for the
same batches and `index.interval.bytes` (the index entries come from the one IndexBuilder both
use), into any binary file objects opened for writing: local files or fsspec files of an object
store. Each file is written front to back with `write` only, which every fsspec file supports.

Batches arrive already offset-assigned (a compaction keeps the offsets it read); each is validated
as recovery validates a segment (framing, CRC, Arrow structure, offsets growing and fitting an
index entry): O(1) Python per batch, and a bad one raises CorruptMessageError before any byte of
its append is written. `close` seals the segment (the time index's last entry is its max
timestamp, as at the broker's seal), writes both indexes and returns the SegmentMetadata that a
manifest lists, computed from the bytes written.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from common.errors import CorruptMessageError, KafkaStorageError, LogInvariantError
from segment_format import record
from segment_format.index_builder import IndexBuilder
from segment_format.index_file import OFFSET_INDEX, TIME_INDEX, SparseIndex
from segment_format.layout import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_file
from segment_format.limits import INT32_MAX
from segment_format.segment_metadata import SegmentMetadata, SegmentMetadataBuilder

DEFAULT_INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes' default


class SegmentWriter:
    """Writes one segment's batches to `log` and, at `close`, its indexes to `index` and
    `time_index`. The caller opens and closes the file objects. Not thread-safe."""

    def __init__(self, log: BinaryIO, index: BinaryIO, time_index: BinaryIO, base_offset: int, *,
                 index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES) -> None:
        if not 0 <= index_interval_bytes <= INT32_MAX:
            raise ValueError(f"index.interval.bytes must be in [0, {INT32_MAX}], got {index_interval_bytes}")
        self.base_offset = base_offset
        self.name = segment_file(Path(), base_offset, LOG_SUFFIX).name
        self._files = (log, index, time_index)
        self._interval = index_interval_bytes
        self._indexes = IndexBuilder(SparseIndex(OFFSET_INDEX, segment_file(Path(), base_offset, INDEX_SUFFIX), base_offset),
                                     SparseIndex(TIME_INDEX, segment_file(Path(), base_offset, TIME_INDEX_SUFFIX), base_offset))
        self._metadata = SegmentMetadataBuilder(base_offset, self.name)
        self._size = 0
        self._next_offset = base_offset
        self._closed = False

    @property
    def size(self) -> int:
        """Bytes written to the `.log` so far."""
        return self._size

    @property
    def next_offset(self) -> int:
        """One past the last offset written; the base offset while empty."""
        return self._next_offset

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Validate the concatenated batches in `data` and write them at the end of the `.log`
        with one write. CorruptMessageError (naming the batch's byte position in the segment) if
        a batch is bad or torn, or its offsets do not follow the last batch's or do not fit the
        index; nothing of `data` is written then."""
        if self._closed:
            raise LogInvariantError(f"{self.name}: append after close")
        view = memoryview(data).cast("B")
        headers = self._validate(view)
        self._write(0, view)
        start = 0
        for header in headers:  # O(1) Python per batch
            position = self._size + start
            self._indexes.add(header.base_offset, header.max_timestamp, position, self._interval)
            self._metadata.add(position, header, view[start:start + header.size])
            start += header.size
        self._size += start
        if headers:
            self._next_offset = headers[-1].next_offset

    def _validate(self, view: memoryview) -> list[record.BatchHeader]:
        headers: list[record.BatchHeader] = []
        pos, lower = 0, self._next_offset
        while pos < len(view):
            where = f"{self.name}: batch at byte {self._size + pos}"
            try:
                header = record.validate_batch(view, pos)
            except CorruptMessageError as err:
                raise CorruptMessageError(f"{where}: {str(err).removeprefix(f'batch at byte {pos}: ')}") from err
            if header.base_offset < lower or header.last_offset - self.base_offset > INT32_MAX:
                raise CorruptMessageError(f"{where}: offsets {header.base_offset}..{header.last_offset} do not follow "
                                          f"{lower - 1} in a segment based at {self.base_offset}")
            headers.append(header)
            lower = header.next_offset
            pos += header.size
        return headers

    def close(self) -> SegmentMetadata:
        """Seal: the time index's last entry (the segment's max timestamp), both index files
        written, and the metadata of what was written. The file objects stay open."""
        if self._closed:
            raise LogInvariantError(f"{self.name}: closed twice")
        self._closed = True
        self._indexes.seal()
        self._write(1, self._indexes.offset_index.image())
        self._write(2, self._indexes.time_index.image())
        return self._metadata.build(self._size)

    def _write(self, which: int, data: bytes | memoryview) -> None:
        file = self._files[which]
        try:
            written = file.write(data)
            while written is not None and written < len(data):  # a raw file may write short
                written += file.write(data[written:])
        except OSError as err:
            raise KafkaStorageError(f"cannot write {self.name} or its indexes: {err}") from err
