"""The codec of the sparse index files `.index` and `.timeindex`: one class, SparseIndex, of two kinds.

An index file is a 16-byte header followed by a flat array of fixed-size entries, little-endian:

    offset size field
    0      4    magic (4 ASCII bytes)     the kind of index: b"PMQI" offset index, b"PMQT" time index
    4      2    version (uint16) = 1      the entry layout; any other value is unreadable
    6      2    entry_size (uint16)       bytes per entry: 8 (offset index), 12 (time index)
    8      8    base_offset (int64)       the segment's base offset, as in the file name
    16     ...  entries                   the kind's entry layout, below

Each entry is a key (int32 or int64) and a value (int32), little-endian; keys strictly increase.

    OFFSET_INDEX `{base_offset:020d}.index`: batch base offset -> byte position in the `.log`
    0      4    relative_offset (int32)   batch base_offset - segment base_offset
    4      4    position (int32)          byte position of that batch; strictly increasing
    The segment adds an entry once more than index.interval.bytes were appended since the
    previous one (IndexBuilder), so a lookup lands at most about one interval before the wanted
    batch and a short scan of 61-byte headers finishes the job. Unlike Kafka, which indexes each
    batch's last offset, pymq indexes its base offset: the floor entry of an offset is then often
    the very batch holding it. An entry that does not grow is an IndexOrderError.

    TIME_INDEX `{base_offset:020d}.timeindex`: largest timestamp so far -> offset that reached it
    0      8    timestamp (int64, ms)     the segment's max batch timestamp so far
    8      4    relative_offset (int32)   base offset of the batch that first reached it, minus
                                          the segment base offset; never decreasing
    An entry is kept only if its timestamp exceeds the last one (Kafka's maybeAppend). Because an
    entry names the first batch that reached its timestamp, every batch before that offset has
    only smaller timestamps: a search for the first record with timestamp >= T may start at the
    floor entry of T. The last entry of a sealed segment is its max timestamp, which is what
    time-based retention reads after a restart.

Sealed segments and their indexes are uploaded to object storage, where readers other than the
broker parse them (docs/architecture.md, Tiered storage), so the layout is public and versioned. Every header byte
has exactly one valid value for a given kind and segment, so `parse` detects any damage to it. A
file without a valid header (an index written before headers existed, a torn creation) raises
CorruptIndexError, and the log's recovery rebuilds it from the `.log`.

Pure, as the rest of the format: `IndexKind.parse` reads an index from a file's bytes (read from
disk or from object storage by the caller), `SparseIndex` holds its entries in memory (two arrays,
for bisect) and `image` gives the bytes of the whole file. Keeping the entries of a local segment
in their file (lazy writes, truncation, fsync, renames) is the broker's: broker/log/index_file.py
(IndexFile, a SparseIndex mirrored to its file).
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.errors import KafkaStorageError
from segment_format.limits import INT32_MAX

HEADER = struct.Struct("<4sHHq")  # magic, version, entry_size, base_offset
HEADER_SIZE = HEADER.size
VERSION = 1
NO_TIMESTAMP = -1  # the time index's key when it has no entry
if array("i").itemsize != 4 or array("q").itemsize != 8:
    raise ImportError("array('i') / array('q') are not 32 / 64-bit on this platform")


class CorruptIndexError(KafkaStorageError):
    """An index file is missing, torn, of another kind or version, or inconsistent with its
    segment; the caller rebuilds it (or, reading a remote segment, does without it)."""


class IndexOrderError(CorruptIndexError):
    """An index entry that does not follow the last one in its kind's order."""


@dataclass(frozen=True, slots=True)
class IndexKind:
    """What makes an index an offset index or a time index: its magic, its entry (key int32 or
    int64 + value int32), which column holds the (relative) offset, and its order rules."""

    name: str
    magic: bytes
    key_type: str  # array typecode of the key: "i" int32, "q" int64
    key_name: str  # in messages and the entry dtype
    value_name: str
    offset_in_key: bool  # the key is the relative offset (else the value is)
    empty_key: int  # what `last_entry` and `floor` give as key when there is no entry
    values_strictly_increase: bool  # else values never decrease
    append_skips_old_keys: bool  # Kafka's maybeAppend: a key not above the last is skipped, not an error

    entry: struct.Struct = field(init=False, repr=False, compare=False)  # the packed entry, as in the file
    dtype: np.dtype = field(init=False, repr=False, compare=False)  # the same, for numpy

    def __post_init__(self) -> None:
        object.__setattr__(self, "entry", struct.Struct(f"<{self.key_type}i"))
        object.__setattr__(self, "dtype", np.dtype([(self.key_name, f"<i{array(self.key_type).itemsize}"),
                                                    (self.value_name, "<i4")]))

    def header(self, base_offset: int) -> bytes:
        """The 16 bytes that open an index of this kind for the segment at `base_offset`."""
        return HEADER.pack(self.magic, VERSION, self.entry.size, base_offset)

    def parse(self, data: bytes | bytearray | memoryview, path: Path, base_offset: int) -> SparseIndex:
        """An index from the bytes of a whole file (read from disk or from object storage; `path`
        names it in errors). Raises CorruptIndexError as `entries`."""
        index = SparseIndex(self, path, base_offset)
        index._load_entries(self.entries(data, path, base_offset))
        return index

    def entries(self, data: bytes | bytearray | memoryview, path: Path, base_offset: int) -> memoryview:
        """The entry bytes of a whole file's `data`. Raises CorruptIndexError unless the header is
        this kind's, of a known version, for `base_offset`, followed by whole entries."""
        data = memoryview(data).cast("B")
        if len(data) < HEADER_SIZE:
            raise CorruptIndexError(f"{path.name}: {len(data)} bytes, too short for the {HEADER_SIZE}-byte header")
        magic, version, entry_size, stored_base = HEADER.unpack_from(data)
        if magic != self.magic:
            raise CorruptIndexError(f"{path.name}: magic {magic!r}, expected {self.magic!r} ({self.name})")
        if version != VERSION:
            raise CorruptIndexError(f"{path.name}: format version {version}, this broker reads version {VERSION}")
        if entry_size != self.entry.size:
            raise CorruptIndexError(f"{path.name}: entry size {entry_size}, expected {self.entry.size}")
        if stored_base != base_offset:
            raise CorruptIndexError(f"{path.name}: base offset {stored_base}, expected {base_offset}")
        entries = data[HEADER_SIZE:]
        if len(entries) % entry_size:
            raise CorruptIndexError(f"{path.name}: {len(entries)} bytes of entries is not a whole number of entries")
        return entries


OFFSET_INDEX = IndexKind("offset index", b"PMQI", "i", "offset", "position", offset_in_key=True,
                         empty_key=0, values_strictly_increase=True, append_skips_old_keys=False)
TIME_INDEX = IndexKind("time index", b"PMQT", "q", "timestamp", "offset", offset_in_key=False,
                       empty_key=NO_TIMESTAMP, values_strictly_increase=False, append_skips_old_keys=True)


class SparseIndex:
    """One index of either kind, in memory: its entries in two arrays (keys, values) for bisect.
    Offsets in and out are absolute; the entries hold them relative to `base_offset`. `path` is
    the file the index is (or will be) stored as, named in errors; this class never touches it
    (a local segment's indexes are IndexFiles, broker/log/index_file.py).

    Not thread-safe on its own: the owning segment serializes calls.
    """

    def __init__(self, kind: IndexKind, path: Path, base_offset: int) -> None:
        self.kind = kind
        self.path = path
        self.base_offset = base_offset
        self._keys = array(kind.key_type)
        self._values = array("i")

    def __len__(self) -> int:
        return len(self._keys)

    def _load_entries(self, data: memoryview) -> None:
        entries = np.frombuffer(data, dtype=self.kind.dtype)
        self._keys.frombytes(entries[self.kind.key_name].tobytes())
        self._values.frombytes(entries[self.kind.value_name].tobytes())

    # --- entries in domain terms ---------------------------------------------------------------

    def _absolute(self, key: int, value: int) -> tuple[int, int]:
        if self.kind.offset_in_key:
            return self.base_offset + key, value
        return key, self.base_offset + value

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last entry (offset index: (offset, position); time index: (timestamp, offset)), or
        with no entry (base_offset, 0) / (NO_TIMESTAMP, base_offset)."""
        if not self._keys:
            return self._absolute(self.kind.empty_key, 0)
        return self._absolute(self._keys[-1], self._values[-1])

    def floor(self, key: int) -> tuple[int, int]:
        """The entry with the largest key <= `key` (the key an offset for the offset index, a
        timestamp for the time index); `last_entry`'s empty value when there is none."""
        relative = key - self.base_offset if self.kind.offset_in_key else key
        i = bisect_right(self._keys, relative) - 1
        if i < 0:
            return self._absolute(self.kind.empty_key, 0)
        return self._absolute(self._keys[i], self._values[i])

    def position_of(self, offset: int) -> tuple[int, int]:
        """Offset index: (offset, position) of the largest entry with offset <= `offset`, else
        (base_offset, 0): where a scan for the batch holding `offset` starts."""
        return self.floor(offset)

    def offset_for_time(self, timestamp: int) -> int:
        """Time index: the offset from which to scan for the first record with timestamp >=
        `timestamp` (the floor entry's, else base_offset): no batch before it can qualify."""
        return self.floor(timestamp)[1]

    def append(self, key: int, value: int) -> None:
        """Add an entry (offset index: (offset, position); time index: (timestamp, offset)) by the
        kind's rule. A key that does not exceed the last raises IndexOrderError, or, for the time
        index (Kafka's maybeAppend), leaves the index as it is; a value out of its order raises
        IndexOrderError; one that an entry cannot hold, CorruptIndexError."""
        kind = self.kind
        relative_key, relative_value = (key - self.base_offset, value) if kind.offset_in_key else (key, value - self.base_offset)
        if not (0 <= relative_value <= INT32_MAX and (not kind.offset_in_key or 0 <= relative_key <= INT32_MAX)):
            raise CorruptIndexError(f"{self.path.name}: entry ({kind.key_name} {key}, {kind.value_name} {value}) is "
                                    f"outside what an entry holds from base offset {self.base_offset}")
        if self._values and (relative_value < self._values[-1]
                             or kind.values_strictly_increase and relative_value == self._values[-1]):
            raise IndexOrderError(self._out_of_order(key, value))
        if self._keys and relative_key <= self._keys[-1]:
            if kind.append_skips_old_keys:
                return
            raise IndexOrderError(self._out_of_order(key, value))
        self._keys.append(relative_key)
        self._values.append(relative_value)

    def _out_of_order(self, key: int, value: int) -> str:
        last_key, last_value = self.last_entry
        names = (self.kind.key_name, self.kind.value_name)
        return (f"{self.path.name}: entry ({names[0]} {key}, {names[1]} {value}) does not follow "
                f"({names[0]} {last_key}, {names[1]} {last_value}) in {self.kind.name} order")

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= `offset`."""
        column = self._keys if self.kind.offset_in_key else self._values
        self.truncate_entries(bisect_left(column, offset - self.base_offset))

    def sanity_check(self, limit: int) -> None:
        """Raise CorruptIndexError unless the entries keep the kind's order and stay inside the
        segment: the offset index's positions below `limit`, the log's size; the time index's
        offsets below `limit`, the segment's next offset. Works on copies: a view would pin the
        arrays (no resize) while a traceback holds it."""
        if not self._keys:
            return
        keys = np.frombuffer(self._keys, dtype=self._keys.typecode).copy()
        values = np.frombuffer(self._values, dtype=np.int32).copy()
        offsets = keys if self.kind.offset_in_key else values
        if offsets[0] < 0 or values[0] < 0 or self._absolute(int(keys[-1]), int(values[-1]))[1] >= limit:
            raise CorruptIndexError(f"{self.path.name}: entries outside the segment ({self.kind.value_name}s "
                                    f"below {limit})")
        value_steps = np.diff(values)
        if np.any(np.diff(keys) <= 0) or np.any(value_steps <= 0 if self.kind.values_strictly_increase else value_steps < 0):
            raise IndexOrderError(f"{self.path.name}: entries out of {self.kind.name} order")

    def image(self) -> bytes:
        """The whole file as bytes, from memory: the header and every entry (for writers that put
        an index built in memory anywhere: SegmentWriter)."""
        entries = np.empty(len(self), dtype=self.kind.dtype)
        entries[self.kind.key_name] = self._keys
        entries[self.kind.value_name] = self._values
        return self.kind.header(self.base_offset) + entries.tobytes()

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries."""
        if not 0 <= count <= len(self):
            raise CorruptIndexError(f"{self.path.name}: cannot keep {count} of its {len(self)} entries")
        del self._keys[count:]
        del self._values[count:]

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        del self._keys[:]
        del self._values[:]
