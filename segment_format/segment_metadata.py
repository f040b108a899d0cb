"""SegmentMetadata: what a remote manifest lists per segment (docs/architecture.md, Tiered storage), as a frozen record.

    field            JSON            meaning
    format_version   int = 1         the segment layout: record batch magic 1, index files version 1
    base_offset      int             the segment's base offset (its file name)
    next_offset      int             one past the last offset stored (base_offset when empty)
    min_timestamp    int (ms)        smallest batch base_timestamp, -1 when empty
    max_timestamp    int (ms)        largest batch max_timestamp, -1 when empty
    size_bytes       int             length of the `.log`
    record_count     int             records in the segment (fewer than offsets after compaction)
    leader_epochs    [[int, int]]    (epoch, start_offset) at each change of the batches' leader
                                     epoch, in offset order; batches without an epoch (-1) start none
    crc32c           int (uint32)    CRC32C of the whole `.log`, to check a download end to end

The manifest is public: Spark executors and other brokers trust it to pick segments, so
`from_json` / `from_dict` are strict: unknown or missing keys, wrong types, an unknown format
version or values that contradict each other raise CorruptSegmentMetadataError.
`from_reader` computes the record in one pass over the segment, validating every batch on the way.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import crc32c

from common.errors import CorruptMessageError, KafkaStorageError
from segment_format import record
from segment_format.index_file import NO_TIMESTAMP
from segment_format.segment_reader import SegmentReader

FORMAT_VERSION = 1
UINT32_MAX = 2**32 - 1


class CorruptSegmentMetadataError(KafkaStorageError):
    """A segment's metadata record is malformed or inconsistent (a bad manifest entry)."""


@dataclass(frozen=True, slots=True)
class SegmentMetadata:
    """Immutable description of one sealed segment; see the module docstring for the fields."""

    base_offset: int
    next_offset: int
    min_timestamp: int
    max_timestamp: int
    size_bytes: int
    record_count: int
    leader_epochs: tuple[tuple[int, int], ...]
    crc32c: int
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        problem = _inconsistency(self)
        if problem is not None:
            raise CorruptSegmentMetadataError(f"segment metadata of {self.base_offset}: {problem}")

    @property
    def last_offset(self) -> int:
        """The last offset stored; base_offset - 1 when empty."""
        return self.next_offset - 1

    @classmethod
    def from_reader(cls, reader: SegmentReader) -> SegmentMetadata:
        """Compute the metadata of the whole segment behind `reader` in one pass: every batch is
        fully validated and the CRC32C is taken over the same bytes. CorruptMessageError if any
        batch is bad (nothing should be uploaded then)."""
        builder = SegmentMetadataBuilder(reader.base_offset, reader.name)
        for batch in reader.stored_batches():
            builder.add(batch.position, batch.header, batch.data)
        return builder.build(reader.size)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (leader epochs as lists of pairs)."""
        out = asdict(self)
        out["leader_epochs"] = [list(pair) for pair in self.leader_epochs]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object) -> SegmentMetadata:
        """Parse `to_dict`'s output strictly; CorruptSegmentMetadataError names what is wrong."""
        if not isinstance(data, dict):
            raise CorruptSegmentMetadataError(f"segment metadata must be an object, got {type(data).__name__}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:  # first: another version may have other keys
            raise CorruptSegmentMetadataError(f"segment metadata format version {version!r}, this reader knows {FORMAT_VERSION}")
        names = {f.name for f in fields(cls)}
        if set(data) != names:
            missing, unknown = sorted(names - set(data)), sorted(set(data) - names)
            raise CorruptSegmentMetadataError(f"segment metadata keys: missing {missing}, unknown {unknown}")
        for name in names - {"leader_epochs"}:
            if not _is_int(data[name]):
                raise CorruptSegmentMetadataError(f"segment metadata {name} must be an integer, got {data[name]!r}")
        epochs = data["leader_epochs"]
        if not isinstance(epochs, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and all(_is_int(v) for v in pair) for pair in epochs):
            raise CorruptSegmentMetadataError(f"segment metadata leader_epochs must be [epoch, start_offset] pairs, got {epochs!r}")
        values = dict(data, leader_epochs=tuple((epoch, start) for epoch, start in epochs))
        problem = _inconsistency_of(values)
        if problem is not None:
            raise CorruptSegmentMetadataError(f"segment metadata of {values['base_offset']}: {problem}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str | bytes) -> SegmentMetadata:
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptSegmentMetadataError(f"segment metadata is not JSON: {err}") from err
        return cls.from_dict(data)


class SegmentMetadataBuilder:
    """The metadata of a segment accumulated batch by batch, in offset order, by whoever reads or
    writes its validated batches (`SegmentMetadata.from_reader`, `SegmentWriter`)."""

    def __init__(self, base_offset: int, name: str) -> None:
        self.base_offset = base_offset
        self.name = name
        self._crc = 0
        self._next_offset = base_offset
        self._min_timestamp = self._max_timestamp = NO_TIMESTAMP
        self._record_count = 0
        self._epochs: list[tuple[int, int]] = []

    def add(self, position: int, header: record.BatchHeader, data: bytes | bytearray | memoryview) -> None:
        """Account the batch at byte `position` whose bytes are `data`. CorruptMessageError if its
        leader epoch goes back (the CRC does not cover the epoch)."""
        self._crc = crc32c.crc32c(data, self._crc)
        if self._min_timestamp == NO_TIMESTAMP or header.base_timestamp < self._min_timestamp:
            self._min_timestamp = header.base_timestamp
        self._max_timestamp = max(self._max_timestamp, header.max_timestamp)
        self._record_count += header.record_count
        epoch, epochs = header.partition_leader_epoch, self._epochs
        if epoch >= 0 and (not epochs or epoch != epochs[-1][0]):
            if epochs and epoch < epochs[-1][0]:
                raise CorruptMessageError(
                    f"{self.name}: batch at byte {position}: leader epoch {epoch} after {epochs[-1][0]}")
            epochs.append((epoch, header.base_offset))
        self._next_offset = header.next_offset

    def build(self, size_bytes: int) -> SegmentMetadata:
        """The metadata of the batches added so far, which fill `size_bytes` of `.log`."""
        return SegmentMetadata(
            base_offset=self.base_offset, next_offset=self._next_offset, min_timestamp=self._min_timestamp,
            max_timestamp=self._max_timestamp, size_bytes=size_bytes, record_count=self._record_count,
            leader_epochs=tuple(self._epochs), crc32c=self._crc,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _inconsistency(metadata: SegmentMetadata) -> str | None:
    return _inconsistency_of({f.name: getattr(metadata, f.name) for f in fields(metadata)})


def _inconsistency_of(values: dict[str, Any]) -> str | None:
    """What makes these field values impossible for a segment, or None."""
    base, next_offset = values["base_offset"], values["next_offset"]
    min_ts, max_ts, count = values["min_timestamp"], values["max_timestamp"], values["record_count"]
    if base < 0 or next_offset < base:
        return f"offsets {base}..{next_offset} are not a range"
    if not 0 <= count <= next_offset - base:
        return f"{count} records do not fit offsets {base}..{next_offset}"
    if values["size_bytes"] < 0 or (values["size_bytes"] == 0) != (count == 0):
        return f"{values['size_bytes']} bytes for {count} records"
    if not 0 <= values["crc32c"] <= UINT32_MAX:
        return f"crc32c {values['crc32c']} is not a uint32"
    if count == 0 and (min_ts, max_ts) != (NO_TIMESTAMP, NO_TIMESTAMP):
        return "an empty segment has timestamps"
    if count and not min_ts <= max_ts:
        return f"timestamps {min_ts}..{max_ts} are not a range"
    epochs = values["leader_epochs"]
    for i, (epoch, start) in enumerate(epochs):
        if epoch < 0 or not base <= start < next_offset:
            return f"leader epoch ({epoch}, {start}) outside the segment"
        if i and (epoch <= epochs[i - 1][0] or start <= epochs[i - 1][1]):
            return f"leader epochs {list(epochs)} do not grow"
    return None
