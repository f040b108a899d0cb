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

from typing import Any, ClassVar

from common.errors import InvalidRequestError
from protocol.fields import entries, field
from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, PartitionResponse, RequestMessage
from protocol.schema import (
    BOOL,
    INT,
    STR,
    Check,
    Entries,
    Kind,
    Seq,
    error_code_field,
    error_message_field,
    message,
    wire,
)
from segment_format.manifest import CorruptManifestError, RemoteSegment


@message
class TieringPartition(PartitionResponse):
    errors_last: ClassVar[bool] = False
    tiered: bool = wire(BOOL, False)
    log_start_offset: int = wire(INT, -1)
    local_log_start_offset: int = wire(INT, -1)
    log_end_offset: int = wire(INT, -1)
    high_watermark: int = wire(INT, -1)
    local_bytes: int = wire(INT, 0)
    remote_log_start_offset: int = wire(INT, -1)
    remote_log_end_offset: int = wire(INT, -1)  # one past the last offset held remotely
    remote_bytes: int = wire(INT, 0)
    remote_segments: int = wire(INT, 0)
    manifest_version: int = wire(INT, -1)  # -1: no manifest read (not tiered, or not read yet); 0: nothing committed
    upload_lag_offsets: int = wire(INT, 0)  # -1: unknown (manifest not read yet)
    upload_lag_bytes: int = wire(INT, 0)
    failures: int = wire(INT, 0)  # tiering runs failed in a row
    last_error: str | None = wire(STR, None)

    @property
    def remote_known(self) -> bool:
        """Whether the remote fields describe a manifest (tiered and its manifest read)."""
        return self.tiered and self.manifest_version >= 0


@message
class TieringTopic(Outcome):
    name: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    partitions: tuple[TieringPartition, ...] = wire(Entries(TieringPartition), ())


@message
class DescribeTieringResponse(Message):
    """One entry per topic (of the request, in its order; or every topic with partitions led
    here, by name), its partitions by number."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TIERING
    topics: tuple[TieringTopic, ...] = wire(Entries(TieringTopic), absent=())


@message
class DescribeTieringRequest(RequestMessage[DescribeTieringResponse]):
    """`topics` None: every topic with partitions led by this broker."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TIERING
    response_type: ClassVar[type[DescribeTieringResponse]] = DescribeTieringResponse
    topics: tuple[str, ...] | None = wire(Seq(str), None)


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




class ReplacedSegments(Kind):
    """The segments a ReplaceRemoteSegments request replaces: (base_offset, upload_id) pairs,
    sent as maps."""

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[{{'base_offset': base, 'upload_id': upload_id}} for base, upload_id in {v}]"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        return tuple((field(entry, "base_offset", int), field(entry, "upload_id", str))
                     for entry in entries(control, key))


class RemoteSegments(Kind):
    """Segments as a manifest lists them (`RemoteSegment.to_dict`); a malformed one is the
    request's INVALID_REQUEST."""

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[segment.to_dict() for segment in {v}]"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        try:
            return tuple(RemoteSegment.from_dict(entry) for entry in entries(control, key))
        except CorruptManifestError as err:
            raise InvalidRequestError(f"field {key!r}: {err}") from None


@message
class ReplaceRemoteSegmentsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.REPLACE_REMOTE_SEGMENTS
    errors_last: ClassVar[bool] = True
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    manifest_version: int = wire(INT, -1)  # the committed manifest's version; -1 on error


@message
class ReplaceRemoteSegmentsRequest(RequestMessage[ReplaceRemoteSegmentsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.REPLACE_REMOTE_SEGMENTS
    response_type: ClassVar[type[ReplaceRemoteSegmentsResponse]] = ReplaceRemoteSegmentsResponse
    topic: str = wire(STR)
    partition: int = wire(INT)
    topic_id: str = wire(STR, absent="")
    expected_manifest_version: int = wire(INT)
    replaced: tuple[tuple[int, str], ...] = wire(
        ReplacedSegments(), check=Check(len, "field 'replaced' names no segment"))
    segments: tuple[RemoteSegment, ...] = wire(RemoteSegments())
