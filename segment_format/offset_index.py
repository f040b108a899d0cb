"""Sparse offset index `{base_offset:020d}.index`: batch base offset -> byte position in the segment.

    offset size field
    0      16   header (index_file.py)                  magic b"PMQI", version 1, entry_size 8,
                                                        the segment's base offset
    then, per entry:
    0      4    relative_offset (int32, little-endian)  batch base_offset - segment base_offset
    4      4    position (int32, little-endian)         byte position of that batch in the `.log`

8 bytes per entry; both fields strictly increase. The segment adds an entry once more
than `index.interval.bytes` were appended since the previous one, so a lookup lands at most about
one interval before the wanted batch and a short scan of 61-byte headers finishes the job.

Unlike Kafka, which indexes each batch's last offset, we index the batch's base offset: the floor
entry of an offset is then often the very batch holding it.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np

from segment_format.limits import INT32_MAX
from segment_format.index_file import CorruptIndexError, IndexFile

_ENTRY_DTYPE = np.dtype([("relative_offset", "<i4"), ("position", "<i4")])
assert array("i").itemsize == 4


class OffsetIndex(IndexFile):
    """In-memory arrays of (relative offset, position) for bisect, mirrored to the `.index` file."""

    ENTRY = struct.Struct("<ii")
    MAGIC = b"PMQI"

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._relative = array("i")
        self._positions = array("i")

    def __len__(self) -> int:
        return len(self._relative)

    def _load_entries(self, data: memoryview) -> None:
        entries = np.frombuffer(data, dtype=_ENTRY_DTYPE)
        self._relative.frombytes(entries["relative_offset"].astype(np.int32).tobytes())
        self._positions.frombytes(entries["position"].astype(np.int32).tobytes())

    def _entry_bytes(self) -> bytes:
        entries = np.empty(len(self), dtype=_ENTRY_DTYPE)
        entries["relative_offset"] = self._relative
        entries["position"] = self._positions
        return entries.tobytes()

    def _keep_entries(self, count: int) -> None:
        del self._relative[count:]
        del self._positions[count:]

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when there is none."""
        return self.base_offset + self._relative[-1] if self._relative else self.base_offset

    @property
    def last_position(self) -> int:
        """Position of the last entry, or 0 when there is none."""
        return self._positions[-1] if self._positions else 0

    def append(self, offset: int, position: int) -> None:
        """Add an entry; both offset and position must exceed the last entry's."""
        relative = offset - self.base_offset
        if not (0 <= relative <= INT32_MAX and 0 <= position <= INT32_MAX):
            raise CorruptIndexError(f"{self.path.name}: entry (offset {offset}, position {position}) is outside "
                                    f"what an entry holds from base offset {self.base_offset}")
        if self._relative and (relative <= self._relative[-1] or position <= self._positions[-1]):
            raise CorruptIndexError(f"{self.path.name}: entry (offset {offset}, position {position}) does not follow "
                                    f"(offset {self.last_offset}, position {self.last_position})")
        self._relative.append(relative)
        self._positions.append(position)
        self._queue(relative, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with offset <= `offset`, else (base_offset, 0)."""
        i = bisect_right(self._relative, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative[i], self._positions[i]

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= `offset`."""
        self.truncate_entries(bisect_left(self._relative, offset - self.base_offset))

    def sanity_check(self, log_size: int) -> None:
        """Raise CorruptIndexError unless entries strictly increase and point inside the log.

        Works on copies: a view would pin the arrays (no resize) while a traceback holds it."""
        relative = np.frombuffer(self._relative, dtype=np.int32).copy()
        positions = np.frombuffer(self._positions, dtype=np.int32).copy()
        if len(relative) == 0:
            return
        if relative[0] < 0 or positions[0] < 0 or positions[-1] >= log_size:
            raise CorruptIndexError(f"{self.path.name}: entries outside the segment ({log_size} bytes)")
        if np.any(np.diff(relative) <= 0) or np.any(np.diff(positions) <= 0):
            raise CorruptIndexError(f"{self.path.name}: entries do not strictly increase")
