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

from typing import Any, ClassVar

from common.errors import InvalidRequestError, PymqError
from protocol.fields import entries, field
from protocol.framing import ApiKey
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Message,
    Outcome,
    PartitionResponse,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    entry_error,
)
from protocol.messages.limits import (
    RequestLimits,
    check_group_instance_id,
    check_group_string,
    check_member_id,
)
from protocol.schema import (
    BOOL,
    BYTES,
    INT,
    STR,
    Check,
    Entries,
    REQUIRED,
    Kind,
    Seq,
    Topics,
    error_code_field,
    error_message_field,
    message,
    one_of,
    wire,
)
from segment_format.limits import INT64_MAX

GROUP_KEY_TYPE = 0  # FindCoordinator: the key is a group id
TRANSACTION_KEY_TYPE = 1  # FindCoordinator: the key is a transactional id
NO_GENERATION_ID = -1  # OffsetCommit from outside the group (an admin, a consumer with manual assignment)


# -- field kinds -------------------------------------------------------------------------------


class PartitionNumbers(Kind):
    """The request topics of OffsetFetch / OffsetDelete: names with bare partition numbers
    (`TopicRequest[int]`). A name that is not a string refuses the whole request: no entry is
    answered alone."""

    numbers = Seq(int)

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"(None if {v} is None else [{{'name': t.name, 'partitions': list(t.partitions)}} for t in {v}])"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        if absent is not REQUIRED and control.get(key) is None:
            return absent
        return tuple(TopicRequest(field(t, "name", str), self.numbers.decode(t, "partitions", REQUIRED))
                     for t in entries(control, key))


class Protocols(Entries):
    """JoinGroup's protocols: at least one, each named once."""

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        protocols = super().decode(control, key, absent)
        if not protocols:
            raise InvalidRequestError(f"field {key!r} must name at least one protocol")
        seen: set[str] = set()
        for protocol in protocols:
            if protocol.name in seen:
                raise InvalidRequestError(f"field {key!r} names protocol {protocol.name!r} more than once")
            seen.add(protocol.name)
        return protocols


# A response's own error travels as `result_error_code` / `result_error_message` beside the
# whole-request `error_code` 0 (see the module docstring).
RESULT_PREFIX = "result_"


def _check_member(member_id: str, group_instance_id: str | None) -> None:
    """The bounds of the ids a member speaks for itself with (`limits`)."""
    check_member_id("member_id", member_id)
    check_group_instance_id(group_instance_id)


# -- FindCoordinator ---------------------------------------------------------------------------


@message
class FindCoordinatorResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    node_id: int = wire(INT, -1)
    host: str = wire(STR, "")
    port: int = wire(INT, -1)


@message
class FindCoordinatorRequest(RequestMessage[FindCoordinatorResponse]):
    """The broker that coordinates `key`: a group id (key_type 0) or a transactional id (1)."""

    api_key: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    response_type: ClassVar[type[FindCoordinatorResponse]] = FindCoordinatorResponse
    key: str = wire(STR)
    key_type: int = wire(INT, GROUP_KEY_TYPE, check=one_of(
        (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE), "field {name!r} must be 0 (group) or 1 (transaction), got {value}"))


# -- JoinGroup ---------------------------------------------------------------------------------


@message
class JoinGroupMember:
    """A member of the new generation, as the leader sees it: `metadata` is its subscription
    for the group's chosen protocol."""

    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    metadata: bytes = wire(BYTES)


@message
class JoinGroupResponse(Outcome, Message):
    """Only the leader gets `members` (the others get an empty tuple). With MEMBER_ID_REQUIRED,
    `member_id` is the id the coordinator assigned: join again with it."""

    api_key: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    generation_id: int = wire(INT, -1)
    protocol_type: str | None = wire(STR, None)
    protocol_name: str | None = wire(STR, None)
    leader: str = wire(STR, "")
    skip_assignment: bool = wire(BOOL, False)
    member_id: str = wire(STR, "")
    members: tuple[JoinGroupMember, ...] = wire(Entries(JoinGroupMember), ())


@message
class JoinGroupProtocol:
    """A protocol (e.g. an assignor's name) the member supports, and its subscription for it."""

    name: str = wire(STR)
    metadata: bytes = wire(BYTES)


@message
class JoinGroupRequest(RequestMessage[JoinGroupResponse]):
    """`member_id` is "" for a new member; `rebalance_timeout_ms` -1 means the session timeout.
    `protocols` are in the member's order of preference."""

    api_key: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    response_type: ClassVar[type[JoinGroupResponse]] = JoinGroupResponse
    group_id: str = wire(STR)
    session_timeout_ms: int = wire(INT)
    rebalance_timeout_ms: int = wire(INT)
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    protocol_type: str = wire(STR)
    protocols: tuple[JoinGroupProtocol, ...] = wire(Protocols(JoinGroupProtocol))
    client_id: str = wire(STR, "")
    reason: str | None = wire(STR, None)

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)
        check_group_string("client_id", self.client_id)
        check_group_string("protocol_type", self.protocol_type)
        for protocol in self.protocols:
            check_group_string("protocols.name", protocol.name)
        limits.check_member_bytes("the protocols' metadata", sum(len(p.metadata) for p in self.protocols))


# -- SyncGroup ---------------------------------------------------------------------------------


@message
class SyncGroupResponse(Outcome, Message):
    """`assignment` is this member's, as the leader computed it."""

    api_key: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    protocol_type: str | None = wire(STR, None)
    protocol_name: str | None = wire(STR, None)
    assignment: bytes = wire(BYTES, b"")


@message
class SyncGroupAssignment:
    member_id: str = wire(STR)
    assignment: bytes = wire(BYTES)


@message
class SyncGroupRequest(RequestMessage[SyncGroupResponse]):
    """The leader sends every member's `assignments`; the others send none."""

    api_key: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    response_type: ClassVar[type[SyncGroupResponse]] = SyncGroupResponse
    group_id: str = wire(STR)
    generation_id: int = wire(INT)
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    protocol_type: str | None = wire(STR, absent=None)
    protocol_name: str | None = wire(STR, absent=None)
    assignments: tuple[SyncGroupAssignment, ...] = wire(Entries(SyncGroupAssignment))

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)
        check_group_string("protocol_type", self.protocol_type)
        check_group_string("protocol_name", self.protocol_name)
        for entry in self.assignments:
            check_member_id("assignments.member_id", entry.member_id)
            limits.check_member_bytes("an assignment", len(entry.assignment))


# -- Heartbeat ---------------------------------------------------------------------------------


@message
class HeartbeatResponse(Outcome, Message):
    """REBALANCE_IN_PROGRESS tells the member to join again."""

    api_key: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)


@message
class HeartbeatRequest(RequestMessage[HeartbeatResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    response_type: ClassVar[type[HeartbeatResponse]] = HeartbeatResponse
    group_id: str = wire(STR)
    generation_id: int = wire(INT)
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)


# -- LeaveGroup --------------------------------------------------------------------------------


@message
class LeaveGroupMemberResponse(Outcome):
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()


@message
class LeaveGroupResponse(Outcome, Message):
    """One entry per member of the request, in its order."""

    api_key: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    members: tuple[LeaveGroupMemberResponse, ...] = wire(Entries(LeaveGroupMemberResponse), ())


@message
class MemberIdentity:
    """A member that leaves: by `member_id`, or by `group_instance_id` for a static member."""

    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, None)
    reason: str | None = wire(STR, None)


@message
class LeaveGroupRequest(RequestMessage[LeaveGroupResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    response_type: ClassVar[type[LeaveGroupResponse]] = LeaveGroupResponse
    group_id: str = wire(STR)
    members: tuple[MemberIdentity, ...] = wire(Entries(MemberIdentity))

    def check_bounds(self, limits: RequestLimits) -> None:
        for member in self.members:
            _check_member(member.member_id, member.group_instance_id)


# -- OffsetCommit ------------------------------------------------------------------------------


@message
class OffsetCommitResponse(Outcome, Message):
    """A group-level error (NOT_COORDINATOR, ILLEGAL_GENERATION, ...) is the response's own
    `error_code`, and then `topics` may be empty; otherwise each partition has its outcome."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse), ())


@message
class OffsetCommitPartition:
    """`error` is set when the entry is malformed: its partition or offset is missing, not an
    int, negative or (the offset) past an int64, or its metadata is not a string."""

    partition: int = wire(INT, entry=True, placeholder=-1,
                          check=Check(lambda v: v >= 0, "partition {value} must be >= 0"))
    committed_offset: int = wire(INT, entry=True, placeholder=-1, check=Check(
        lambda v: 0 <= v <= INT64_MAX, "committed_offset {value} must be >= 0 and fit in an int64"))
    committed_leader_epoch: int = wire(INT, NO_LEADER_EPOCH, entry=True)
    metadata: str | None = wire(STR, None, entry=True)
    error: PymqError | None = entry_error()


@message
class OffsetCommitRequest(RequestMessage[OffsetCommitResponse]):
    """From a group member: its `generation_id`, `member_id` (and `group_instance_id` if static).
    From outside the group: generation_id -1 (NO_GENERATION_ID) and member_id ""."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    response_type: ClassVar[type[OffsetCommitResponse]] = OffsetCommitResponse
    group_id: str = wire(STR)
    generation_id: int = wire(INT)
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    topics: tuple[TopicRequest[OffsetCommitPartition], ...] = wire(Topics(TopicRequest, OffsetCommitPartition))

    def check_bounds(self, limits: RequestLimits) -> None:
        _check_member(self.member_id, self.group_instance_id)


# -- OffsetFetch -------------------------------------------------------------------------------


@message
class OffsetFetchPartitionResponse(PartitionResponse):
    """No committed offset: committed_offset -1 and no error."""

    committed_offset: int = wire(INT, -1)
    committed_leader_epoch: int = wire(INT, NO_LEADER_EPOCH)
    metadata: str | None = wire(STR, None)


@message
class OffsetFetchResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    topics: tuple[TopicResponse[OffsetFetchPartitionResponse], ...] = wire(
        Topics(TopicResponse, OffsetFetchPartitionResponse), ())


@message
class OffsetFetchRequest(RequestMessage[OffsetFetchResponse]):
    """`topics` None: every partition the group has committed. `require_stable`: wait for
    pending transactional commits instead of answering without them."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    response_type: ClassVar[type[OffsetFetchResponse]] = OffsetFetchResponse
    wire_order: ClassVar[tuple[str, ...]] = ("group_id", "require_stable", "topics")
    group_id: str = wire(STR)
    topics: tuple[TopicRequest[int], ...] | None = wire(PartitionNumbers(), absent=None)
    require_stable: bool = wire(BOOL, False)


# -- ListGroups --------------------------------------------------------------------------------


@message
class ListedGroup:
    group_id: str = wire(STR)
    protocol_type: str = wire(STR, absent="")
    group_state: str = wire(STR, absent="")


@message
class ListGroupsResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    groups: tuple[ListedGroup, ...] = wire(Entries(ListedGroup), ())


@message
class ListGroupsRequest(RequestMessage[ListGroupsResponse]):
    """`states_filter` empty: groups in any state."""

    api_key: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    response_type: ClassVar[type[ListGroupsResponse]] = ListGroupsResponse
    states_filter: tuple[str, ...] = wire(Seq(str), ())


# -- DescribeGroups ----------------------------------------------------------------------------


@message
class DescribedMember:
    member_id: str = wire(STR)
    group_instance_id: str | None = wire(STR, absent=None)
    client_id: str = wire(STR, absent="")
    client_host: str = wire(STR, absent="")
    member_metadata: bytes = wire(BYTES, absent=b"")
    member_assignment: bytes = wire(BYTES, absent=b"")


@message
class DescribedGroup(Outcome):
    """`protocol_data` is the chosen protocol's name (Kafka's field name)."""

    errors_last: ClassVar[bool] = True
    group_id: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    group_state: str = wire(STR, "")
    protocol_type: str = wire(STR, "")
    protocol_data: str = wire(STR, "")
    members: tuple[DescribedMember, ...] = wire(Entries(DescribedMember), ())


@message
class DescribeGroupsResponse(Message):
    """One entry per group of the request, in its order, each with its own error."""

    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUPS
    groups: tuple[DescribedGroup, ...] = wire(Entries(DescribedGroup), absent=())


@message
class DescribeGroupsRequest(RequestMessage[DescribeGroupsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUPS
    response_type: ClassVar[type[DescribeGroupsResponse]] = DescribeGroupsResponse
    groups: tuple[str, ...] = wire(Seq(str))


# -- DeleteGroups ------------------------------------------------------------------------------


@message
class DeletedGroupResult(Outcome):
    group_id: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()


@message
class DeleteGroupsResponse(Message):
    """One result per group of the request, in its order."""

    api_key: ClassVar[ApiKey] = ApiKey.DELETE_GROUPS
    results: tuple[DeletedGroupResult, ...] = wire(Entries(DeletedGroupResult), absent=())


@message
class DeleteGroupsRequest(RequestMessage[DeleteGroupsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_GROUPS
    response_type: ClassVar[type[DeleteGroupsResponse]] = DeleteGroupsResponse
    groups: tuple[str, ...] = wire(Seq(str))


# -- OffsetDelete ------------------------------------------------------------------------------


@message
class OffsetDeleteResponse(Outcome, Message):
    """A group-level error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, ...) is the response's own
    `error_code`; GROUP_SUBSCRIBED_TO_TOPIC is answered per partition."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_DELETE
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse), ())


@message
class OffsetDeleteRequest(RequestMessage[OffsetDeleteResponse]):
    """Delete the group's committed offsets of these partitions."""

    api_key: ClassVar[ApiKey] = ApiKey.OFFSET_DELETE
    response_type: ClassVar[type[OffsetDeleteResponse]] = OffsetDeleteResponse
    group_id: str = wire(STR)
    topics: tuple[TopicRequest[int], ...] = wire(PartitionNumbers())
