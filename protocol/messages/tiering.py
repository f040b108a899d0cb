"""DescribeTiering (API key 1000, pymq's own): how far each partition this broker leads is tiered
to the remote store (`pymq tier status`).

    request  control = {topics: [name] | None}
    response control = {error_code: 0, topics: [{name, error_code, error_message?, partitions: [
                        {partition, error_code, error_message?, tiered, log_start_offset,
                         local_log_start_offset, log_end_offset, high_watermark, local_bytes,
                         remote_log_start_offset, remote_log_end_offset, remote_bytes, remote_segments,
                         manifest_version, upload_lag_offsets, upload_lag_bytes, failures, last_error}]}]}

`topics` None: every topic with partitions led by the broker asked; a topic named in the request
that the broker does not know answers UNKNOWN_TOPIC_OR_PARTITION on its entry. Only partitions
led by the broker asked are listed (their leader is the one that tiers them).

Per partition: the whole log's start (`log_start_offset`, below the local segments once tiered),
the local segments' range [local_log_start_offset, log_end_offset) and their `local_bytes`; the
remote log's range [remote_log_start_offset, remote_log_end_offset), its `.log` bytes and segment
count, and the version of the manifest the broker holds. Upload lag: the offsets and bytes of the
local segments at or above the remote log end (not uploaded yet, the active segment included).
`failures` tiering runs failed in a row, `last_error` the last one's error (None once a run
succeeds). A partition that is not tiered has `tiered` false, remote offsets and the manifest
version -1, and every count 0; so does a tiered one whose manifest the broker has not read yet,
except that its upload lag is -1 (unknown).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import NONE, InvalidRequestError
from protocol.fields import entries, field
from protocol.framing import ApiKey
from protocol.messages.base import (
    Message,
    Outcome,
    PartitionResponse,
    RequestMessage,
    decode_error,
    own_field,
    put_error,
)
from segment_format.manifest import CorruptManifestError, RemoteSegment


@dataclass(frozen=True, slots=True)
class TieringPartition(PartitionResponse):
    error_first: ClassVar[bool] = True
    tiered: bool = own_field(False)
    log_start_offset: int = own_field(-1)
    local_log_start_offset: int = own_field(-1)
    log_end_offset: int = own_field(-1)
    high_watermark: int = own_field(-1)
    local_bytes: int = own_field(0)
    remote_log_start_offset: int = own_field(-1)
    remote_log_end_offset: int = own_field(-1)  # one past the last offset held remotely
    remote_bytes: int = own_field(0)
    remote_segments: int = own_field(0)
    manifest_version: int = own_field(-1)  # -1: no manifest read (not tiered, or not read yet); 0: nothing committed
    upload_lag_offsets: int = own_field(0)  # -1: unknown (manifest not read yet)
    upload_lag_bytes: int = own_field(0)
    failures: int = own_field(0)  # tiering runs failed in a row
    last_error: str | None = own_field(None, str)

    @property
    def remote_known(self) -> bool:
        """Whether the remote fields describe a manifest (tiered and its manifest read)."""
        return self.tiered and self.manifest_version >= 0


@dataclass(frozen=True, slots=True)
class TieringTopic(Outcome):
    name: str
    error_code: int = 0
    error_message: str | None = None
    partitions: tuple[TieringPartition, ...] = ()

    def to_control(self) -> dict[str, Any]:
        out = put_error({"name": self.name}, self.error_code, self.error_message)
        out["partitions"] = [p.to_control() for p in self.partitions]
        return out

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "TieringTopic":
        partitions = () if control.get("partitions") is None else tuple(
            TieringPartition.from_control(p) for p in entries(control, "partitions"))
        return cls(field(control, "name", str), *decode_error(control), partitions)


@dataclass(frozen=True, slots=True)
class DescribeTieringResponse(Message):
    """One entry per topic (of the request, in its order; or every topic with partitions led
    here, by name), its partitions by number."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TIERING
    topics: tuple[TieringTopic, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": NONE, "topics": [t.to_control() for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeTieringResponse":
        topics = () if control.get("topics") is None else tuple(
            TieringTopic.from_control(t) for t in entries(control, "topics"))
        return cls(topics)


@dataclass(frozen=True, slots=True)
class DescribeTieringRequest(RequestMessage[DescribeTieringResponse]):
    """`topics` None: every topic with partitions led by this broker."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TIERING
    response_type: ClassVar[type[DescribeTieringResponse]] = DescribeTieringResponse
    topics: tuple[str, ...] | None = None

    def to_control(self) -> dict[str, Any]:
        return {"topics": None if self.topics is None else list(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeTieringRequest":
        if control.get("topics") is None:
            return cls(None)
        names = field(control, "topics", list)
        for name in names:
            if not isinstance(name, str):
                raise InvalidRequestError(f"field 'topics' must be a list of strings, got a {type(name).__name__}")
        return cls(tuple(names))


# --- ReplaceRemoteSegments ---------------------------------------------------------------------
#
# ReplaceRemoteSegments (API key 1001, pymq's own): swap a run of a partition's remote segments
# for others covering the same offsets (the compaction job's output, already uploaded), against
# the manifest version the job read. Sent to the partition's leader, the only manifest writer.
#
#     request  control = {topic, partition, topic_id, expected_manifest_version,
#                         replaced: [{base_offset, upload_id}], segments: [segment as in a manifest]}
#     response control = {error_code, error_message?, manifest_version}
#
# STALE_MANIFEST when the manifest is no longer at `expected_manifest_version` (nothing changed);
# INVALID_REQUEST when the segments are not a run of the manifest or do not fit it;
# NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, INCONSISTENT_TOPIC_ID as for a fetch; a
# remote store failure (objects missing or not as described) is KAFKA_STORAGE_ERROR.


@dataclass(frozen=True, slots=True)
class ReplaceRemoteSegmentsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.REPLACE_REMOTE_SEGMENTS
    error_code: int = NONE
    error_message: str | None = None
    manifest_version: int = -1  # the committed manifest's version; -1 on error

    def to_control(self) -> dict[str, Any]:
        return put_error({"manifest_version": self.manifest_version}, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ReplaceRemoteSegmentsResponse":
        return cls(*decode_error(control), field(control, "manifest_version", int, -1))


@dataclass(frozen=True, slots=True)
class ReplaceRemoteSegmentsRequest(RequestMessage[ReplaceRemoteSegmentsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.REPLACE_REMOTE_SEGMENTS
    response_type: ClassVar[type[ReplaceRemoteSegmentsResponse]] = ReplaceRemoteSegmentsResponse
    topic: str
    partition: int
    topic_id: str
    expected_manifest_version: int
    replaced: tuple[tuple[int, str], ...]
    segments: tuple[RemoteSegment, ...]

    def to_control(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "topic_id": self.topic_id,
                "expected_manifest_version": self.expected_manifest_version,
                "replaced": [{"base_offset": base, "upload_id": upload_id} for base, upload_id in self.replaced],
                "segments": [segment.to_dict() for segment in self.segments]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ReplaceRemoteSegmentsRequest":
        replaced = tuple((field(entry, "base_offset", int), field(entry, "upload_id", str))
                         for entry in entries(control, "replaced"))
        if not replaced:
            raise InvalidRequestError("field 'replaced' names no segment")
        try:
            segments = tuple(RemoteSegment.from_dict(entry) for entry in entries(control, "segments"))
        except CorruptManifestError as err:
            raise InvalidRequestError(f"field 'segments': {err}") from None
        return cls(field(control, "topic", str), field(control, "partition", int), field(control, "topic_id", str, ""),
                   field(control, "expected_manifest_version", int), replaced, segments)
