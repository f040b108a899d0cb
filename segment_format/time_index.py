"""Sparse time index `{base_offset:020d}.timeindex`: largest timestamp so far -> offset that reached it.

    offset size field
    0      16   header (index_file.py)                  magic b"PMQT", version 1, entry_size 12,
                                                        the segment's base offset
    then, per entry:
    0      8    timestamp (int64, ms, little-endian)    the segment's max batch timestamp so far
    8      4    relative_offset (int32, little-endian)  base offset of the batch that first reached
                                                        it, minus the segment base offset

12 bytes per entry; timestamps strictly increase, offsets never decrease. The segment
offers an entry at each offset-index entry and when it is sealed; an entry is kept only if its
timestamp exceeds the last one (Kafka's `maybeAppend`). Because an entry names the first batch that
reached its timestamp, every batch before that offset has only smaller timestamps: a search for
the first record with timestamp >= T may start at the floor entry of T. The last entry of a sealed
segment is its max timestamp, which is what time-based retention reads after a restart.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np

from segment_format.limits import INT32_MAX
from segment_format.index_file import CorruptIndexError, IndexFile

_ENTRY_DTYPE = np.dtype([("timestamp", "<i8"), ("relative_offset", "<i4")])
NO_TIMESTAMP = -1
assert array("q").itemsize == 8 and array("i").itemsize == 4


class TimeIndex(IndexFile):
    """In-memory arrays of (timestamp, relative offset) for bisect, mirrored to the `.timeindex` file."""

    ENTRY = struct.Struct("<qi")
    MAGIC = b"PMQT"

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._timestamps = array("q")
        self._relative = array("i")

    def __len__(self) -> int:
        return len(self._timestamps)

    def _load_entries(self, data: memoryview) -> None:
        entries = np.frombuffer(data, dtype=_ENTRY_DTYPE)
        self._timestamps.frombytes(entries["timestamp"].astype(np.int64).tobytes())
        self._relative.frombytes(entries["relative_offset"].astype(np.int32).tobytes())

    def _entry_bytes(self) -> bytes:
        entries = np.empty(len(self), dtype=_ENTRY_DTYPE)
        entries["timestamp"] = self._timestamps
        entries["relative_offset"] = self._relative
        return entries.tobytes()

    def _keep_entries(self, count: int) -> None:
        del self._timestamps[count:]
        del self._relative[count:]

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (NO_TIMESTAMP, base_offset) when empty."""
        if not self._timestamps:
            return NO_TIMESTAMP, self.base_offset
        return self._timestamps[-1], self.base_offset + self._relative[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if `timestamp` exceeds the last entry's (or NO_TIMESTAMP when
        empty); offsets must not decrease."""
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise CorruptIndexError(f"{self.path.name}: offset {offset} is outside what an entry holds from base "
                                    f"offset {self.base_offset}")
        if self._relative and relative < self._relative[-1]:
            raise CorruptIndexError(f"{self.path.name}: offset {offset} goes back before the last entry's "
                                    f"{self.base_offset + self._relative[-1]}")
        if timestamp <= self.last_entry[0]:
            return
        self._timestamps.append(timestamp)
        self._relative.append(relative)
        self._queue(timestamp, relative)

    def lookup(self, timestamp: int) -> int:
        """Offset from which to scan for the first record with timestamp >= `timestamp`.

        That is the offset of the largest entry with entry timestamp <= `timestamp` (Kafka's
        floor lookup), else the base offset: no batch before the returned offset can qualify.
        """
        i = bisect_right(self._timestamps, timestamp) - 1
        return self.base_offset + (self._relative[i] if i >= 0 else 0)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= `offset`."""
        self.truncate_entries(bisect_left(self._relative, offset - self.base_offset))

    def sanity_check(self, next_offset: int) -> None:
        """Raise CorruptIndexError unless timestamps strictly increase and offsets stay in
        [base_offset, next_offset) without decreasing."""
        timestamps = np.frombuffer(self._timestamps, dtype=np.int64).copy()
        relative = np.frombuffer(self._relative, dtype=np.int32).copy()
        if len(relative) == 0:
            return
        if relative[0] < 0 or self.base_offset + int(relative[-1]) >= next_offset:
            raise CorruptIndexError(f"{self.path.name}: offsets outside [{self.base_offset}, {next_offset})")
        if np.any(np.diff(timestamps) <= 0) or np.any(np.diff(relative) < 0):
            raise CorruptIndexError(f"{self.path.name}: entries out of order")
