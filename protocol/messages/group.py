"""Group coordination and committed offsets: FindCoordinator (10), JoinGroup (11), SyncGroup (14),
Heartbeat (12), LeaveGroup (13), OffsetCommit (8), OffsetFetch (9), ListGroups (16),
DescribeGroups (15), DeleteGroups (42), OffsetDelete (47).

    FindCoordinator  request  {key, key_type}
                     response {error_code: 0, result_error_code, result_error_message?, node_id, host, port}
    JoinGroup        request  {group_id, session_timeout_ms, rebalance_timeout_ms, member_id,
                               group_instance_id, protocol_type, protocols: [{name, metadata}],
                               client_id, reason}
                     response {error_code: 0, result_error_code, result_error_message?, generation_id,
                               protocol_type, protocol_name, leader, skip_assignment, member_id,
                               members: [{member_id, group_instance_id, metadata}]}
    SyncGroup        request  {group_id, generation_id, member_id, group_instance_id, protocol_type,
                               protocol_name, assignments: [{member_id, assignment}]}
                     response {error_code: 0, result_error_code, result_error_message?, protocol_type,
                               protocol_name, assignment}
    Heartbeat        request  {group_id, generation_id, member_id, group_instance_id}
                     response {error_code: 0, result_error_code, result_error_message?}
    LeaveGroup       request  {group_id, members: [{member_id, group_instance_id, reason}]}
                     response {error_code: 0, result_error_code, result_error_message?,
                               members: [{member_id, group_instance_id, error_code, error_message?}]}
    OffsetCommit     request  {group_id, generation_id, member_id, group_instance_id, topics: [{name,
                               partitions: [{partition, committed_offset, committed_leader_epoch, metadata}]}]}
                     response {error_code: 0, result_error_code, result_error_message?, topics: [{name,
                               partitions: [{partition, error_code, error_message?}]}]}
    OffsetFetch      request  {group_id, topics: [{name, partitions: [partition]}] | None, require_stable}
                     response {error_code: 0, result_error_code, result_error_message?, topics: [{name,
                               partitions: [{partition, committed_offset, committed_leader_epoch,
                               metadata, error_code, error_message?}]}]}
    ListGroups       request  {states_filter: [state]}
                     response {error_code: 0, result_error_code, result_error_message?,
                               groups: [{group_id, protocol_type, group_state}]}
    DescribeGroups   request  {groups: [group_id]}
                     response {error_code: 0, groups: [{group_id, error_code, error_message?, group_state,
                               protocol_type, protocol_data, members: [{member_id, group_instance_id,
                               client_id, client_host, member_metadata, member_assignment}]}]}
    DeleteGroups     request  {groups: [group_id]}
                     response {error_code: 0, results: [{group_id, error_code, error_message?}]}
    OffsetDelete     request  {group_id, topics: [{name, partitions: [partition]}]}
                     response {error_code: 0, result_error_code, result_error_message?, topics: [{name,
                               partitions: [{partition, error_code, error_message?}]}]}

Metadata, assignments and member metadata are opaque bytes (msgpack bin; a str is refused): the
coordinator stores and hands them back, only clients read them. Optional strings
(`group_instance_id`, `reason`, a commit's `metadata`, SyncGroup's protocol fields) may be None.

Errors. The top-level `error_code` of a control map is the whole-request path of every message
(`base`): always 0 here, or the only field when the request was malformed, and the client raises
it before decoding. The coordinator's answer to a well-formed request - the group's, the
member's or the coordinator lookup's error, e.g. NOT_COORDINATOR, REBALANCE_IN_PROGRESS - is
part of the response: the `error_code` / `error_message` fields of the response message, sent
as `result_error_code` / `result_error_message` so that the client decodes the rest beside it
(JoinGroup's MEMBER_ID_REQUIRED comes with the `member_id` the member must join again with).

Decoding. A `group_id` (or any other top-level field) of the wrong type is INVALID_REQUEST for
the whole request; an empty group id is well-formed here and the coordinator's INVALID_GROUP_ID.
JoinGroup must name at least one protocol, each once. An OffsetCommit partition entry whose
partition or offset is missing, mistyped or negative (or an offset past an int64), or whose metadata is not a string, keeps
that error on the entry (a topic whose name is not a string keeps it on the topic entry): the
coordinator answers those entries alone and commits the others. `rebalance_timeout_ms` -1 is
sent as is; the coordinator reads it as the session timeout.

Bounds (`check_bounds`, applied by `RequestMessage.decode` on the broker, `limits`): member ids,
group instance ids, client ids, protocol types and names, member metadata and assignments the
coordinator would store and echo to other members are INVALID_REQUEST past their bounds, before
the coordinator sees the request. A `reason` is neither stored nor echoed, and not bounded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

from common.errors import NONE, InvalidRequestError, PymqError
from protocol.fields import entries, entry_field, field
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Message,
    Outcome,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    decode_error,
    decode_topics,
    encode_topics,
    entry_error,
    own_field,
    put_error,
)
from protocol.messages.limits import (
    RequestLimits,
    check_group_instance_id,
    check_group_string,
    check_member_id,
)
from segment_format.limits import INT64_MAX

GROUP_KEY_TYPE = 0  # FindCoordinator: the key is a group id
TRANSACTION_KEY_TYPE = 1  # FindCoordinator: the key is a transactional id
NO_GENERATION_ID = -1  # OffsetCommit from outside the group (an admin, a consumer with manual assignment)

T = TypeVar("T")
P = TypeVar("P", bound=PartitionResponse)


# -- field helpers -----------------------------------------------------------------------------


def _optional_str(control: dict[str, Any], name: str) -> str | None:
    return field(control, name, str, None)


def _strs(control: dict[str, Any], name: str, default: Any = None) -> tuple[str, ...]:
    values = field(control, name, list) if default is None else field(control, name, list, default)
    for value in values:
        if not isinstance(value, str):
            raise InvalidRequestError(f"field {name!r} must be a list of strings, got a {type(value).__name__}")
    return tuple(values)


def _ints(control: dict[str, Any], name: str) -> tuple[int, ...]:
    values = field(control, name, list)
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequestError(f"field {name!r} must be a list of ints, got a {type(value).__name__}")
    return tuple(values)


def _listed(control: dict[str, Any], name: str, decode: Callable[[dict[str, Any]], T]) -> tuple[T, ...]:
    """The entries of a response list, each decoded; an absent list is empty."""
    return () if control.get(name) is None else tuple(decode(item) for item in entries(control, name))


def _result(response: Outcome, **fields: Any) -> dict[str, Any]:
    """A response's control map: the whole-request `error_code` 0, then its own error and fields."""
    out: dict[str, Any] = {"error_code": NONE, "result_error_code": response.error_code}
    if response.error_message is not None:
        out["result_error_message"] = response.error_message
    out.update(fields)
    return out


def _decode_result(control: dict[str, Any]) -> tuple[int, str | None]:
    """A response's own (error_code, error_message)."""
    return field(control, "result_error_code", int, NONE), field(control, "result_error_message", str, None)


def _topic_responses(control: dict[str, Any], parse: Callable[[dict[str, Any]], P]) -> tuple[TopicResponse[P], ...]:
    """The topics of an offsets response; absent with a group-level error."""
    return () if control.get("topics") is None else decode_topics(control, TopicResponse, parse)


def _offset_topics(topics: tuple[TopicRequest[int], ...]) -> list[dict[str, Any]]:
    """The request topics of OffsetFetch / OffsetDelete: names with bare partition numbers."""
    return [{"name": t.name, "partitions": list(t.partitions)} for t in topics]


def _decode_offset_topics(control: dict[str, Any]) -> tuple[TopicRequest[int], ...]:
    """A name that is not a string refuses the whole request here: no entry is answered alone."""
    return tuple(TopicRequest(field(t, "name", str), _ints(t, "partitions")) for t in entries(control, "topics"))


def _check_member(member_id: str, group_instance_id: str | None) -> None:
    """The bounds of the ids a member speaks for itself with (`limits`)."""
    check_member_id("member_id", member_id)
    check_group_instance_id(group_instance_id)


# -- FindCoordinator ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    error_code: int = 0
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1

    def to_control(self) -> dict[str, Any]:
        return _result(self, node_id=self.node_id, host=self.host, port=self.port)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FindCoordinatorResponse":
        return cls(*_decode_result(control), field(control, "node_id", int, -1), field(control, "host", str, ""),
                   field(control, "port", int, -1))


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest(RequestMessage[FindCoordinatorResponse]):
    """The broker that coordinates `key`: a group id (key_type 0) or a transactional id (1)."""

    api_key: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    response_type: ClassVar[type[FindCoordinatorResponse]] = FindCoordinatorResponse
    key: str
    key_type: int = GROUP_KEY_TYPE

    def to_control(self) -> dict[str, Any]:
        return {"key": self.key, "key_type": self.key_type}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "FindCoordinatorRequest":
        key = field(control, "key", str)
        key_type = field(control, "key_type", int, GROUP_KEY_TYPE)
        if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
            raise InvalidRequestError(f"field 'key_type' must be 0 (group) or 1 (transaction), got {key_type}")
        return cls(key, key_type)


# -- JoinGroup ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    """A member of the new generation, as the leader sees it: `metadata` is its subscription
    for the group's chosen protocol."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Outcome, Message):
    """Only the leader gets `members` (the others get an empty tuple). With MEMBER_ID_REQUIRED,
    `member_id` is the id the coordinator assigned: join again with it."""

    api_key: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    error_code: int = 0
    error_message: str | None = None
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    member_id: str = ""
    members: tuple[JoinGroupMember, ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, generation_id=self.generation_id, protocol_type=self.protocol_type,
                       protocol_name=self.protocol_name, leader=self.leader, skip_assignment=self.skip_assignment,
                       member_id=self.member_id, members=[
                           {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
                           for m in self.members])

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "JoinGroupResponse":
        members = _listed(control, "members", lambda m: JoinGroupMember(
            field(m, "member_id", str), _optional_str(m, "group_instance_id"), field(m, "metadata", bytes)))
        return cls(*_decode_result(control), field(control, "generation_id", int, -1),
                   _optional_str(control, "protocol_type"), _optional_str(control, "protocol_name"),
                   field(control, "leader", str, ""), field(control, "skip_assignment", bool, False),
                   field(control, "member_id", str, ""), members)


@dataclass(frozen=True, slots=True)
class JoinGroupProtocol:
    """A protocol (e.g. an assignor's name) the member supports, and its subscription for it."""

    name: str
    metadata: bytes


def _protocols(control: dict[str, Any]) -> tuple[JoinGroupProtocol, ...]:
    protocols = tuple(JoinGroupProtocol(field(p, "name", str), field(p, "metadata", bytes))
                      for p in entries(control, "protocols"))
    if not protocols:
        raise InvalidRequestError("field 'protocols' must name at least one protocol")
    seen: set[str] = set()
    for protocol in protocols:
        if protocol.name in seen:
            raise InvalidRequestError(f"field 'protocols' names protocol {protocol.name!r} more than once")
        seen.add(protocol.name)
    return protocols


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(RequestMessage[JoinGroupResponse]):
    """`member_id` is "" for a new member; `rebalance_timeout_ms` -1 means the session timeout.
    `protocols` are in the member's order of preference."""

    api_key: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    response_type: ClassVar[type[JoinGroupResponse]] = JoinGroupResponse
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[JoinGroupProtocol, ...]
    client_id: str = ""
    reason: str | None = None

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.group_instance_id, "protocol_type": self.protocol_type,
                "protocols": [{"name": p.name, "metadata": p.metadata} for p in self.protocols],
                "client_id": self.client_id, "reason": self.reason}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "JoinGroupRequest":
        return cls(field(control, "group_id", str), field(control, "session_timeout_ms", int),
                   field(control, "rebalance_timeout_ms", int), field(control, "member_id", str),
                   _optional_str(control, "group_instance_id"), field(control, "protocol_type", str),
                   _protocols(control), field(control, "client_id", str, ""), _optional_str(control, "reason"))

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)
        check_group_string("client_id", self.client_id)
        check_group_string("protocol_type", self.protocol_type)
        for protocol in self.protocols:
            check_group_string("protocols.name", protocol.name)
        limits.check_member_bytes("the protocols' metadata", sum(len(p.metadata) for p in self.protocols))


# -- SyncGroup ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Outcome, Message):
    """`assignment` is this member's, as the leader computed it."""

    api_key: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    error_code: int = 0
    error_message: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""

    def to_control(self) -> dict[str, Any]:
        return _result(self, protocol_type=self.protocol_type, protocol_name=self.protocol_name,
                       assignment=self.assignment)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "SyncGroupResponse":
        return cls(*_decode_result(control), _optional_str(control, "protocol_type"),
                   _optional_str(control, "protocol_name"), field(control, "assignment", bytes, b""))


@dataclass(frozen=True, slots=True)
class SyncGroupAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(RequestMessage[SyncGroupResponse]):
    """The leader sends every member's `assignments`; the others send none."""

    api_key: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    response_type: ClassVar[type[SyncGroupResponse]] = SyncGroupResponse
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: tuple[SyncGroupAssignment, ...]

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
                "group_instance_id": self.group_instance_id, "protocol_type": self.protocol_type,
                "protocol_name": self.protocol_name,
                "assignments": [{"member_id": a.member_id, "assignment": a.assignment} for a in self.assignments]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "SyncGroupRequest":
        assignments = tuple(SyncGroupAssignment(field(a, "member_id", str), field(a, "assignment", bytes))
                            for a in entries(control, "assignments"))
        return cls(field(control, "group_id", str), field(control, "generation_id", int),
                   field(control, "member_id", str), _optional_str(control, "group_instance_id"),
                   _optional_str(control, "protocol_type"), _optional_str(control, "protocol_name"), assignments)

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)
        check_group_string("protocol_type", self.protocol_type)
        check_group_string("protocol_name", self.protocol_name)
        for entry in self.assignments:
            check_member_id("assignments.member_id", entry.member_id)
            limits.check_member_bytes("an assignment", len(entry.assignment))


# -- Heartbeat ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Outcome, Message):
    """REBALANCE_IN_PROGRESS tells the member to join again."""

    api_key: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    error_code: int = 0
    error_message: str | None = None

    def to_control(self) -> dict[str, Any]:
        return _result(self)

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "HeartbeatResponse":
        return cls(*_decode_result(control))


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(RequestMessage[HeartbeatResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    response_type: ClassVar[type[HeartbeatResponse]] = HeartbeatResponse
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
                "group_instance_id": self.group_instance_id}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "HeartbeatRequest":
        return cls(field(control, "group_id", str), field(control, "generation_id", int),
                   field(control, "member_id", str), _optional_str(control, "group_instance_id"))

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)


# -- LeaveGroup --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaveGroupMemberResponse(Outcome):
    member_id: str
    group_instance_id: str | None
    error_code: int = 0
    error_message: str | None = None

    def to_control(self) -> dict[str, Any]:
        return put_error({"member_id": self.member_id, "group_instance_id": self.group_instance_id},
                         self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "LeaveGroupMemberResponse":
        return cls(field(control, "member_id", str), _optional_str(control, "group_instance_id"), *decode_error(control))


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Outcome, Message):
    """One entry per member of the request, in its order."""

    api_key: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    error_code: int = 0
    error_message: str | None = None
    members: tuple[LeaveGroupMemberResponse, ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, members=[m.to_control() for m in self.members])

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "LeaveGroupResponse":
        return cls(*_decode_result(control), _listed(control, "members", LeaveGroupMemberResponse.from_control))


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    """A member that leaves: by `member_id`, or by `group_instance_id` for a static member."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(RequestMessage[LeaveGroupResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    response_type: ClassVar[type[LeaveGroupResponse]] = LeaveGroupResponse
    group_id: str
    members: tuple[MemberIdentity, ...]

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "reason": m.reason}
            for m in self.members]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "LeaveGroupRequest":
        group_id = field(control, "group_id", str)
        return cls(group_id, tuple(
            MemberIdentity(field(m, "member_id", str), _optional_str(m, "group_instance_id"), _optional_str(m, "reason"))
            for m in entries(control, "members")))

    def check_bounds(self, limits: RequestLimits) -> None:
        for member in self.members:
            _check_member(member.member_id, member.group_instance_id)


# -- OffsetCommit ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Outcome, Message):
    """A group-level error (NOT_COORDINATOR, ILLEGAL_GENERATION, ...) is the response's own
    `error_code`, and then `topics` may be empty; otherwise each partition has its outcome."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    error_code: int = 0
    error_message: str | None = None
    topics: tuple[TopicResponse[PartitionResponse], ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, topics=encode_topics(self.topics))

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetCommitResponse":
        return cls(*_decode_result(control), _topic_responses(control, PartitionResponse.from_control))


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition:
    """`error` is set when the entry is malformed: its partition or offset is missing, not an
    int, negative or (the offset) past an int64, or its metadata is not a string."""

    partition: int
    committed_offset: int
    committed_leader_epoch: int = NO_LEADER_EPOCH
    metadata: str | None = None
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"partition": self.partition, "committed_offset": self.committed_offset,
                "committed_leader_epoch": self.committed_leader_epoch, "metadata": self.metadata}

    @classmethod
    def from_control(cls, item: dict[str, Any]) -> "OffsetCommitPartition":
        partition, partition_error = entry_field(item, "partition", int, -1)
        if partition_error is None and partition < 0:
            partition_error = InvalidRequestError(f"partition {partition} must be >= 0")
        offset, offset_error = entry_field(item, "committed_offset", int, -1)
        if offset_error is None and not 0 <= offset <= INT64_MAX:
            offset_error = InvalidRequestError(f"committed_offset {offset} must be >= 0 and fit in an int64")
        epoch, epoch_error = entry_field(item, "committed_leader_epoch", int, NO_LEADER_EPOCH, NO_LEADER_EPOCH)
        metadata, metadata_error = entry_field(item, "metadata", str, None, None)
        return cls(partition, offset, epoch, metadata,
                   partition_error or offset_error or epoch_error or metadata_error)


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest(RequestMessage[OffsetCommitResponse]):
    """From a group member: its `generation_id`, `member_id` (and `group_instance_id` if static).
    From outside the group: generation_id -1 (NO_GENERATION_ID) and member_id ""."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    response_type: ClassVar[type[OffsetCommitResponse]] = OffsetCommitResponse
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    topics: tuple[TopicRequest[OffsetCommitPartition], ...]

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
                "group_instance_id": self.group_instance_id, "topics": encode_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetCommitRequest":
        group_id, generation_id = field(control, "group_id", str), field(control, "generation_id", int)
        member_id, instance_id = field(control, "member_id", str), _optional_str(control, "group_instance_id")
        return cls(group_id, generation_id, member_id, instance_id,
                   decode_topics(control, TopicRequest, OffsetCommitPartition.from_control))

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)


# -- OffsetFetch -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetFetchPartitionResponse(PartitionResponse):
    """No committed offset: committed_offset -1 and no error."""

    committed_offset: int = own_field(-1)
    committed_leader_epoch: int = own_field(NO_LEADER_EPOCH)
    metadata: str | None = own_field(None, str)


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    error_code: int = 0
    error_message: str | None = None
    topics: tuple[TopicResponse[OffsetFetchPartitionResponse], ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, topics=encode_topics(self.topics))

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetFetchResponse":
        return cls(*_decode_result(control), _topic_responses(control, OffsetFetchPartitionResponse.from_control))


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(RequestMessage[OffsetFetchResponse]):
    """`topics` None: every partition the group has committed. `require_stable`: wait for
    pending transactional commits instead of answering without them."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    response_type: ClassVar[type[OffsetFetchResponse]] = OffsetFetchResponse
    group_id: str
    topics: tuple[TopicRequest[int], ...] | None
    require_stable: bool = False

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "require_stable": self.require_stable,
                "topics": None if self.topics is None else _offset_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetFetchRequest":
        group_id = field(control, "group_id", str)
        topics = None if control.get("topics") is None else _decode_offset_topics(control)
        return cls(group_id, topics, field(control, "require_stable", bool, False))


# -- ListGroups --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    error_code: int = 0
    error_message: str | None = None
    groups: tuple[ListedGroup, ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, groups=[{"group_id": g.group_id, "protocol_type": g.protocol_type,
                                      "group_state": g.group_state} for g in self.groups])

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ListGroupsResponse":
        return cls(*_decode_result(control), _listed(control, "groups", lambda g: ListedGroup(
            field(g, "group_id", str), field(g, "protocol_type", str, ""), field(g, "group_state", str, ""))))


@dataclass(frozen=True, slots=True)
class ListGroupsRequest(RequestMessage[ListGroupsResponse]):
    """`states_filter` empty: groups in any state."""

    api_key: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    response_type: ClassVar[type[ListGroupsResponse]] = ListGroupsResponse
    states_filter: tuple[str, ...] = ()

    def to_control(self) -> dict[str, Any]:
        return {"states_filter": list(self.states_filter)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "ListGroupsRequest":
        return cls(_strs(control, "states_filter", []))


# -- DescribeGroups ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes

    def to_control(self) -> dict[str, Any]:
        return {"member_id": self.member_id, "group_instance_id": self.group_instance_id, "client_id": self.client_id,
                "client_host": self.client_host, "member_metadata": self.member_metadata,
                "member_assignment": self.member_assignment}

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "DescribedMember":
        return cls(field(control, "member_id", str), _optional_str(control, "group_instance_id"),
                   field(control, "client_id", str, ""), field(control, "client_host", str, ""),
                   field(control, "member_metadata", bytes, b""), field(control, "member_assignment", bytes, b""))


@dataclass(frozen=True, slots=True)
class DescribedGroup(Outcome):
    """`protocol_data` is the chosen protocol's name (Kafka's field name)."""

    group_id: str
    error_code: int = 0
    error_message: str | None = None
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()

    def to_control(self) -> dict[str, Any]:
        return put_error({"group_id": self.group_id, "group_state": self.group_state,
                          "protocol_type": self.protocol_type, "protocol_data": self.protocol_data,
                          "members": [m.to_control() for m in self.members]}, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "DescribedGroup":
        return cls(field(control, "group_id", str), *decode_error(control), field(control, "group_state", str, ""),
                   field(control, "protocol_type", str, ""), field(control, "protocol_data", str, ""),
                   _listed(control, "members", DescribedMember.from_control))


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse(Message):
    """One entry per group of the request, in its order, each with its own error."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUPS
    groups: tuple[DescribedGroup, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": NONE, "groups": [g.to_control() for g in self.groups]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeGroupsResponse":
        return cls(_listed(control, "groups", DescribedGroup.from_control))


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest(RequestMessage[DescribeGroupsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUPS
    response_type: ClassVar[type[DescribeGroupsResponse]] = DescribeGroupsResponse
    groups: tuple[str, ...]

    def to_control(self) -> dict[str, Any]:
        return {"groups": list(self.groups)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeGroupsRequest":
        return cls(_strs(control, "groups"))


# -- DeleteGroups ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeletedGroupResult(Outcome):
    group_id: str
    error_code: int = 0
    error_message: str | None = None

    def to_control(self) -> dict[str, Any]:
        return put_error({"group_id": self.group_id}, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "DeletedGroupResult":
        return cls(field(control, "group_id", str), *decode_error(control))


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse(Message):
    """One result per group of the request, in its order."""

    api_key: ClassVar[ApiKey] = ApiKey.DELETE_GROUPS
    results: tuple[DeletedGroupResult, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": NONE, "results": [r.to_control() for r in self.results]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DeleteGroupsResponse":
        return cls(_listed(control, "results", DeletedGroupResult.from_control))


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest(RequestMessage[DeleteGroupsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_GROUPS
    response_type: ClassVar[type[DeleteGroupsResponse]] = DeleteGroupsResponse
    groups: tuple[str, ...]

    def to_control(self) -> dict[str, Any]:
        return {"groups": list(self.groups)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DeleteGroupsRequest":
        return cls(_strs(control, "groups"))


# -- OffsetDelete ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse(Outcome, Message):
    """A group-level error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, ...) is the response's own
    `error_code`; GROUP_SUBSCRIBED_TO_TOPIC is answered per partition."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_DELETE
    error_code: int = 0
    error_message: str | None = None
    topics: tuple[TopicResponse[PartitionResponse], ...] = ()

    def to_control(self) -> dict[str, Any]:
        return _result(self, topics=encode_topics(self.topics))

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetDeleteResponse":
        return cls(*_decode_result(control), _topic_responses(control, PartitionResponse.from_control))


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequest(RequestMessage[OffsetDeleteResponse]):
    """Delete the group's committed offsets of these partitions."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_DELETE
    response_type: ClassVar[type[OffsetDeleteResponse]] = OffsetDeleteResponse
    group_id: str
    topics: tuple[TopicRequest[int], ...]

    def to_control(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "topics": _offset_topics(self.topics)}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "OffsetDeleteRequest":
        group_id = field(control, "group_id", str)
        return cls(group_id, _decode_offset_topics(control))

