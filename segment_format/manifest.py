"""PartitionManifest: the list of a partition's remote segments, as a frozen value (docs/architecture.md, Tiered storage).

One JSON object per version, `{root}/{topic}/{partition}/manifests/manifest-{version:020d}.json`
(the layout and the commit protocol are in the package docstring):

    key               JSON             meaning
    format_version    int = 2          this schema (1: the same without leader_epoch, read as -1)
    version           int >= 1         the manifest's version, equal to the number in its name;
                                       grows with every commit (not necessarily by one)
    leader_epoch      int >= -1        the leader epoch of the partition's leader that committed
                                       this version (-1: not known). Never decreases from one
                                       version to the next: a writer whose epoch is below the
                                       current version's is a deposed leader, and its commit is
                                       refused (the fence of KIP-405's remote log metadata)
    topic             str              the topic's name, as in the path
    topic_id          str              the topic's id (32 hex digits; "" if unknown): a topic
                                       deleted and re-created under the same name has another id
    partition         int              the partition, as in the path
    log_start_offset  int              the remote log start: offsets below it are deleted, even
                                       where the first segment still holds them
    segments          [segment]        the remote segments, by base offset, not overlapping

    segment: the fields of segment_format.segment_metadata.SegmentMetadata (format_version,
    base_offset, next_offset, min_timestamp, max_timestamp, size_bytes, record_count,
    leader_epochs, crc32c), plus
    upload_id         str              16 hex digits, random per upload attempt
    objects           {kind: object}   kind "log", "index", "timeindex", and optionally
                                       "snapshot" (the producer state at the segment's next offset,
                                       broker/log/producer_state.py's format; KIP-405's producer
                                       snapshot) and "txnindex"; each
                                       {"name": str, "size_bytes": int, "crc32c": int}: the object
                                       `{base_offset:020d}-{upload_id}.{kind}` beside the
                                       manifests' folder, its length and the CRC32C of its bytes.
                                       Entries written before the optional kinds existed lack them.

Invariants, checked on every parse (a reader of a manifest trusts nothing it has not checked):
segments are non-empty (next_offset > base_offset), sorted and disjoint (a segment's next_offset
<= the next one's base_offset; gaps are allowed: compaction leaves them); the first segment holds
log_start_offset (base_offset <= log_start_offset < next_offset); object names are the ones derived
from base offset and upload id, so a manifest cannot point outside its partition's folder; the
`log` object's size and CRC are the segment's.

Everything here is pure: values in, values out. Methods that change a manifest return a new one
with the same `version`; committing it (RemoteSegmentStore.commit_manifest) assigns the next.
"""
from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.errors import InvalidTopicError, KafkaStorageError, PymqError
from segment_format.layout import validate_topic_name
from segment_format.segment_metadata import CorruptSegmentMetadataError, SegmentMetadata


class CorruptManifestError(PymqError):
    """A manifest's bytes are not a valid manifest (not JSON, wrong schema, inconsistent values),
    or no valid version of a partition's manifest exists although versions are present.

    KAFKA_STORAGE_ERROR on the wire, not retriable. Like the remote store's errors it does not
    subclass KafkaStorageError: a bad remote manifest must never take a local log directory offline."""

    code = KafkaStorageError.code
    retriable = False


FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
NO_LEADER_EPOCH = -1
UINT32_MAX = 2**32 - 1
UPLOAD_ID_HEX_DIGITS = 16
OBJECT_KINDS = ("log", "index", "timeindex")  # the JSON keys, which are also the file suffixes
OPTIONAL_OBJECT_KINDS = ("snapshot", "txnindex")  # absent from entries uploaded before they existed
MANIFESTS_FOLDER = "manifests"

_UPLOAD_ID = re.compile(rf"[0-9a-f]{{{UPLOAD_ID_HEX_DIGITS}}}")
SEGMENT_OBJECT_NAME = re.compile(rf"(\d{{20}})-([0-9a-f]{{{UPLOAD_ID_HEX_DIGITS}}})\.(log|index|timeindex|snapshot|txnindex)")
MANIFEST_OBJECT_NAME = re.compile(r"manifest-(\d{20})\.json")


def segment_object_name(base_offset: int, upload_id: str, kind: str) -> str:
    """`{base_offset:020d}-{upload_id}.{kind}`: 20 digits so listings sort by offset."""
    assert kind in OBJECT_KINDS or kind in OPTIONAL_OBJECT_KINDS, kind
    return f"{base_offset:020d}-{upload_id}.{kind}"


def manifest_object_name(version: int) -> str:
    return f"manifest-{version:020d}.json"


@dataclass(frozen=True, slots=True)
class RemoteObject:
    """One uploaded file of a segment: its object name (relative to the partition's folder), its
    length and the CRC32C of its bytes."""

    name: str
    size_bytes: int
    crc32c: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size_bytes": self.size_bytes, "crc32c": self.crc32c}


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """A manifest entry: a sealed segment's metadata, the upload attempt that holds it, and the
    objects of that attempt (`.log`, `.index`, `.timeindex`, and the optional kinds it has in
    `extras`, in OPTIONAL_OBJECT_KINDS order)."""

    metadata: SegmentMetadata
    upload_id: str
    log: RemoteObject
    index: RemoteObject
    time_index: RemoteObject
    extras: tuple[tuple[str, RemoteObject], ...] = ()

    def __post_init__(self) -> None:
        problem = _segment_inconsistency(self.metadata, self.upload_id, self.kinded_objects())
        if problem is not None:
            raise CorruptManifestError(f"segment {self.metadata.base_offset}: {problem}")

    @classmethod
    def create(cls, metadata: SegmentMetadata, upload_id: str, index: tuple[int, int], time_index: tuple[int, int],
               extras: dict[str, tuple[int, int]] | None = None) -> RemoteSegment:
        """The entry for an upload attempt: `index`, `time_index` and each of `extras` (by
        optional kind) are (size_bytes, crc32c)."""
        def named(kind: str, size_crc: tuple[int, int]) -> RemoteObject:
            return RemoteObject(segment_object_name(metadata.base_offset, upload_id, kind), *size_crc)

        extras = extras or {}
        return cls(metadata, upload_id, named("log", (metadata.size_bytes, metadata.crc32c)),
                   named("index", index), named("timeindex", time_index),
                   tuple((kind, named(kind, extras[kind])) for kind in OPTIONAL_OBJECT_KINDS if kind in extras))

    # --- the metadata's fields, for callers that think in segments ------------------------------

    @property
    def base_offset(self) -> int:
        return self.metadata.base_offset

    @property
    def next_offset(self) -> int:
        """One past the last offset the segment holds."""
        return self.metadata.next_offset

    @property
    def last_offset(self) -> int:
        return self.metadata.last_offset

    @property
    def min_timestamp(self) -> int:
        """Smallest batch base timestamp (ms): no record of the segment is older."""
        return self.metadata.min_timestamp

    @property
    def max_timestamp(self) -> int:
        """Largest batch max timestamp (ms)."""
        return self.metadata.max_timestamp

    @property
    def size_bytes(self) -> int:
        """Length of the `.log`."""
        return self.metadata.size_bytes

    @property
    def crc32c(self) -> int:
        """CRC32C of the whole `.log`."""
        return self.metadata.crc32c

    @property
    def leader_epochs(self) -> tuple[tuple[int, int], ...]:
        return self.metadata.leader_epochs

    def objects(self) -> tuple[RemoteObject, ...]:
        """The `.log`, `.index` and `.timeindex` objects, in that order, then the optional ones."""
        return (self.log, self.index, self.time_index) + tuple(obj for _, obj in self.extras)

    def kinded_objects(self) -> tuple[tuple[str, RemoteObject], ...]:
        return tuple(zip(OBJECT_KINDS, (self.log, self.index, self.time_index))) + self.extras

    def object_of(self, kind: str) -> RemoteObject | None:
        """The object of an optional kind ("snapshot", "txnindex"), or None if not uploaded."""
        return next((obj for k, obj in self.extras if k == kind), None)

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {**self.metadata.to_dict(), "upload_id": self.upload_id,
                "objects": {kind: obj.to_dict() for kind, obj in self.kinded_objects()}}

    @classmethod
    def from_dict(cls, data: object) -> RemoteSegment:
        """Parse `to_dict`'s output strictly; CorruptManifestError names what is wrong."""
        if not isinstance(data, dict):
            raise CorruptManifestError(f"a segment entry must be an object, got {type(data).__name__}")
        rest = dict(data)
        upload_id, objects = rest.pop("upload_id", None), rest.pop("objects", None)
        try:
            metadata = SegmentMetadata.from_dict(rest)
        except CorruptSegmentMetadataError as err:
            raise CorruptManifestError(str(err)) from err
        where = f"segment {metadata.base_offset}"
        if not isinstance(upload_id, str) or not _UPLOAD_ID.fullmatch(upload_id):
            raise CorruptManifestError(f"{where}: upload_id must be {UPLOAD_ID_HEX_DIGITS} hex digits, got {upload_id!r}")
        if (not isinstance(objects, dict) or not set(OBJECT_KINDS) <= set(objects)
                or not set(objects) <= set(OBJECT_KINDS) | set(OPTIONAL_OBJECT_KINDS)):
            raise CorruptManifestError(f"{where}: objects must map {list(OBJECT_KINDS)} and optionally "
                                       f"{list(OPTIONAL_OBJECT_KINDS)}, got {objects!r}")
        log, index, time_index = (_object_from_dict(where, kind, objects[kind]) for kind in OBJECT_KINDS)
        extras = tuple((kind, _object_from_dict(where, kind, objects[kind]))
                       for kind in OPTIONAL_OBJECT_KINDS if kind in objects)
        problem = _segment_inconsistency(
            metadata, upload_id, tuple(zip(OBJECT_KINDS, (log, index, time_index))) + extras)
        if problem is not None:
            raise CorruptManifestError(f"{where}: {problem}")
        return cls(metadata, upload_id, log, index, time_index, extras)


def _object_from_dict(where: str, kind: str, data: object) -> RemoteObject:
    if not isinstance(data, dict) or set(data) != {"name", "size_bytes", "crc32c"}:
        raise CorruptManifestError(f"{where}: object {kind!r} must have exactly name, size_bytes, crc32c: {data!r}")
    name, size, crc = data["name"], data["size_bytes"], data["crc32c"]
    if not isinstance(name, str) or not _is_int(size) or not _is_int(crc):
        raise CorruptManifestError(f"{where}: object {kind!r} has a field of the wrong type: {data!r}")
    return RemoteObject(name, size, crc)


def _segment_inconsistency(metadata: SegmentMetadata, upload_id: str,
                           objects: tuple[tuple[str, RemoteObject], ...]) -> str | None:
    """What makes this entry impossible, or None. `objects`: (kind, object), the log's first."""
    if not _UPLOAD_ID.fullmatch(upload_id):
        return f"upload id {upload_id!r} is not {UPLOAD_ID_HEX_DIGITS} hex digits"
    if metadata.next_offset <= metadata.base_offset:
        return "an empty segment is never tiered"
    for kind, obj in objects:
        expected = segment_object_name(metadata.base_offset, upload_id, kind)
        if obj.name != expected:
            return f"object {kind!r} is named {obj.name!r}, expected {expected!r}"
        if obj.size_bytes < 0 or not 0 <= obj.crc32c <= UINT32_MAX:
            return f"object {kind!r} has size {obj.size_bytes} and crc32c {obj.crc32c}"
    log = objects[0][1]
    if (log.size_bytes, log.crc32c) != (metadata.size_bytes, metadata.crc32c):
        return f"the log object's size and crc32c {log.size_bytes}, {log.crc32c} are not the segment's"
    return None


@dataclass(frozen=True, slots=True)
class PartitionManifest:
    """One version of a partition's manifest; see the module docstring for the fields."""

    topic: str
    partition: int
    topic_id: str = ""
    version: int = 0  # 0: nothing committed yet (no object holds version 0)
    log_start_offset: int = 0
    segments: tuple[RemoteSegment, ...] = ()
    leader_epoch: int = NO_LEADER_EPOCH
    format_version: int = FORMAT_VERSION
    _next_offsets: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problem = _manifest_inconsistency(self)
        if problem is not None:
            raise CorruptManifestError(f"manifest of {self.topic}-{self.partition} version {self.version}: {problem}")
        object.__setattr__(self, "_next_offsets", tuple(s.next_offset for s in self.segments))

    @classmethod
    def empty(cls, topic: str, partition: int, topic_id: str = "") -> PartitionManifest:
        """The manifest of a partition with nothing uploaded (version 0)."""
        return cls(topic, partition, topic_id)

    # --- offsets and sizes ---------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """One past the last offset held remotely; log_start_offset when no segment is."""
        return self.segments[-1].next_offset if self.segments else self.log_start_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of every remote `.log` (what remote retention.bytes counts)."""
        return sum(s.size_bytes for s in self.segments)

    @property
    def leader_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) at each change of leader epoch over the remote segments, oldest
        first: what a replica that restarts its log at the remote log end takes as its history."""
        changes: list[tuple[int, int]] = []
        for segment in self.segments:
            for epoch, start in segment.leader_epochs:
                if not changes or changes[-1][0] != epoch:
                    changes.append((epoch, start))
        return changes

    def segment_at(self, base_offset: int) -> RemoteSegment | None:
        """The segment based at exactly `base_offset` (tiering asks: is this one uploaded?)."""
        i = self._index_for(base_offset)
        found = self.segments[i] if i < len(self.segments) else None
        return found if found is not None and found.base_offset == base_offset else None

    def segment_for_offset(self, offset: int) -> RemoteSegment | None:
        """The segment a fetch from `offset` reads: the first one holding offsets >= `offset`
        (compaction leaves gaps, which belong to the segment after them). None if `offset` is
        below log_start_offset or at or past log_end_offset."""
        if not self.log_start_offset <= offset < self.log_end_offset:
            return None
        return self.segments[self._index_for(offset)]

    def _index_for(self, offset: int) -> int:
        """Index of the first segment whose next_offset > offset (len(segments) if none)."""
        return bisect_right(self._next_offsets, offset)

    def prune(self, start_offset: int | None = None, end_offset: int | None = None,
              min_timestamp: int | None = None, max_timestamp: int | None = None) -> tuple[RemoteSegment, ...]:
        """The segments that may hold records with offsets in [start_offset, end_offset) and
        timestamps in [min_timestamp, max_timestamp] (ms, inclusive); None leaves a side open.
        Conservative, as filter pushdown must be: every matching record is in a segment returned,
        and callers trim the first and last. Offsets below log_start_offset never match."""
        start = self.log_start_offset if start_offset is None else max(start_offset, self.log_start_offset)
        first = self._index_for(start)
        chosen = []
        for segment in self.segments[first:]:
            if end_offset is not None and segment.base_offset >= end_offset:
                break
            if max_timestamp is not None and segment.min_timestamp > max_timestamp:
                continue
            if min_timestamp is not None and segment.max_timestamp < min_timestamp:
                continue
            chosen.append(segment)
        return tuple(chosen)

    def expired_segments(self, now_ms: int, retention_ms: int = -1, retention_bytes: int = -1,
                         local_bytes: int = 0) -> tuple[RemoteSegment, ...]:
        """The oldest segments that remote retention deletes, in order (Kafka's rules; -1
        disables a limit): while a segment's max timestamp is older than `retention_ms`, or while
        the log (these segments plus `local_bytes` held only locally) exceeds `retention_bytes`.
        Commit `with_log_start_offset(expired[-1].next_offset)`, then delete their objects."""
        total = self.size_bytes + local_bytes
        expired = []
        for segment in self.segments:
            by_time = retention_ms >= 0 and segment.max_timestamp < now_ms - retention_ms
            by_size = retention_bytes >= 0 and total > retention_bytes
            if not (by_time or by_size):
                break
            expired.append(segment)
            total -= segment.size_bytes
        return tuple(expired)

    # --- changes (pure: a new manifest, same version) ----------------------------------------

    def with_segment(self, segment: RemoteSegment) -> PartitionManifest:
        """This manifest with `segment` appended. ValueError unless it starts at or after
        log_end_offset (tiering uploads segments in offset order, each once) and ends after
        log_start_offset. The first segment of an empty manifest moves log_start_offset up to its
        base offset when that is higher: offsets before it are not in the remote log."""
        if self.segments and segment.base_offset < self.log_end_offset:
            raise ValueError(f"segment {segment.base_offset}..{segment.next_offset} overlaps the remote log, "
                             f"which ends at {self.log_end_offset}")
        if segment.next_offset <= self.log_start_offset:
            raise ValueError(f"segment {segment.base_offset}..{segment.next_offset} is below the remote log start "
                             f"{self.log_start_offset}")
        start = self.log_start_offset if self.segments else max(self.log_start_offset, segment.base_offset)
        return replace(self, log_start_offset=start, segments=(*self.segments, segment))

    def with_log_start_offset(self, offset: int) -> PartitionManifest:
        """This manifest with its log start moved up to `offset` (never down: a lower offset
        changes nothing), without the segments that end at or before it. The dropped segments'
        objects are deleted after this manifest is committed."""
        if offset <= self.log_start_offset:
            return self
        kept = self.segments[self._index_for(offset):]
        if kept and offset < kept[0].base_offset:
            offset = kept[0].base_offset  # the offsets of a gap do not exist: the log starts after it
        return replace(self, log_start_offset=offset, segments=kept)

    def with_segments_replaced(self, replaced: Sequence[tuple[int, str]],
                               segments: Sequence[RemoteSegment]) -> PartitionManifest:
        """This manifest with a run of its segments swapped for others covering the same offsets:
        a compaction's output (fewer records, the same offsets, gaps where records went). `replaced`
        names the run by (base_offset, upload_id), oldest first; `segments` lie sorted and disjoint
        within [the run's first base offset, its last next offset). An empty `segments` removes
        the run's records altogether. When the run starts the log, the log start moves up to the
        first offset still held, as retention would (never down). The log end never moves: the
        last segment cannot be replaced (the local log continues after it, as Kafka's cleaner
        never compacts the active segment). ValueError when any of this does not hold."""
        names = [(segment.base_offset, segment.upload_id) for segment in self.segments]
        run = [(int(base), str(upload_id)) for base, upload_id in replaced]
        first = names.index(run[0]) if run and run[0] in names else -1
        if first < 0 or names[first:first + len(run)] != run:
            raise ValueError(f"segments {run} are not a run of the manifest's segments (version {self.version}): "
                             "it changed since they were read")
        last = first + len(run) - 1
        if last == len(self.segments) - 1:
            raise ValueError("the last remote segment cannot be replaced: the log end would move")
        low, high = self.segments[first].base_offset, self.segments[last].next_offset
        below = low
        for segment in segments:
            if segment.base_offset < below or segment.next_offset > high:
                raise ValueError(f"segment {segment.base_offset}..{segment.next_offset} is not within {low}..{high} "
                                 "after the segments before it")
            below = segment.next_offset
        kept = (*self.segments[:first], *segments, *self.segments[last + 1:])
        if first > 0:
            return replace(self, segments=kept)
        return replace(self, segments=kept, log_start_offset=kept[0].base_offset).with_log_start_offset(self.log_start_offset)

    def with_topic_id(self, topic_id: str) -> PartitionManifest:
        return replace(self, topic_id=topic_id)

    def with_leader_epoch(self, leader_epoch: int) -> PartitionManifest:
        """This manifest as the leader of `leader_epoch` commits it."""
        return replace(self, leader_epoch=leader_epoch)

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "version": self.version, "leader_epoch": self.leader_epoch,
                "topic": self.topic, "topic_id": self.topic_id, "partition": self.partition,
                "log_start_offset": self.log_start_offset, "segments": [s.to_dict() for s in self.segments]}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: object) -> PartitionManifest:
        """Parse `to_dict`'s output strictly; CorruptManifestError names what is wrong."""
        if not isinstance(data, dict):
            raise CorruptManifestError(f"a manifest must be a JSON object, got {type(data).__name__}")
        format_version = data.get("format_version")
        if not _is_int(format_version) or format_version not in READABLE_FORMAT_VERSIONS:  # first: another version may have other keys
            raise CorruptManifestError(f"manifest format version {format_version!r}, this reader knows "
                                       f"{list(READABLE_FORMAT_VERSIONS)}")
        keys = {"format_version", "version", "topic", "topic_id", "partition", "log_start_offset", "segments"}
        if format_version >= 2:
            keys.add("leader_epoch")
        if set(data) != keys:
            raise CorruptManifestError(f"manifest keys: missing {sorted(keys - set(data))}, unknown {sorted(set(data) - keys)}")
        # Version 1 is version 2 written before leaders had epochs: read it as one.
        data = {"leader_epoch": NO_LEADER_EPOCH, **data, "format_version": FORMAT_VERSION}
        for name in ("version", "partition", "log_start_offset", "leader_epoch"):
            if not _is_int(data[name]):
                raise CorruptManifestError(f"manifest {name} must be an integer, got {data[name]!r}")
        for name in ("topic", "topic_id"):
            if not isinstance(data[name], str):
                raise CorruptManifestError(f"manifest {name} must be a string, got {data[name]!r}")
        if not isinstance(data["segments"], list):
            raise CorruptManifestError(f"manifest segments must be a list, got {type(data['segments']).__name__}")
        if data["version"] < 1:
            raise CorruptManifestError(f"a stored manifest has a version >= 1, not {data['version']}")
        segments = tuple(RemoteSegment.from_dict(entry) for entry in data["segments"])
        values = {**data, "segments": segments}
        problem = _inconsistency_of(values)
        if problem is not None:
            raise CorruptManifestError(f"manifest of {data['topic']}-{data['partition']} version {data['version']}: {problem}")
        return cls(**values)

    @classmethod
    def from_json(cls, data: bytes | str) -> PartitionManifest:
        try:
            parsed = json.loads(data)
        except (ValueError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptManifestError(f"manifest is not JSON: {err}") from err
        return cls.from_dict(parsed)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _manifest_inconsistency(manifest: PartitionManifest) -> str | None:
    return _inconsistency_of({name: getattr(manifest, name) for name in
                              ("topic", "partition", "version", "log_start_offset", "segments", "format_version",
                               "leader_epoch")})


def _inconsistency_of(values: dict[str, Any]) -> str | None:
    """What makes these manifest field values impossible, or None."""
    try:
        validate_topic_name(values["topic"])
    except InvalidTopicError as err:
        return str(err)
    if values["partition"] < 0 or values["version"] < 0 or values["log_start_offset"] < 0:
        return f"partition {values['partition']}, version {values['version']}, log start {values['log_start_offset']}"
    if values["leader_epoch"] < NO_LEADER_EPOCH:
        return f"leader epoch {values['leader_epoch']}"
    segments: tuple[RemoteSegment, ...] = values["segments"]
    for before, after in zip(segments, segments[1:]):
        if after.base_offset < before.next_offset:
            return f"segment {after.base_offset} starts before {before.base_offset}..{before.next_offset} ends"
    if segments and not segments[0].base_offset <= values["log_start_offset"] < segments[0].next_offset:
        return (f"log start {values['log_start_offset']} is not in the first segment "
                f"{segments[0].base_offset}..{segments[0].next_offset}")
    return None
