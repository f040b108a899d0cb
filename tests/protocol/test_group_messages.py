"""Group coordination messages (protocol/messages/group.py): malformed requests are refused naming
the field, or (OffsetCommit partitions) keep the error on their entry; opaque bytes refuse str;
the coordinator's own errors travel in the response, apart from the whole-request error path.
(The round trip of every message: test_message_schema.py.)"""
from __future__ import annotations

from typing import Any

import msgpack
import pytest

import protocol
from client.connection import decode_reply
from common.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    MemberIdRequiredError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    error_for_code,
)
from protocol import (
    GROUP_REQUEST_TYPES,
    REQUEST_TYPES,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    Message,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionResponse,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicResponse,
)

EMPTY = memoryview(b"")


def wire(message: Message) -> dict[str, Any]:
    """The control map a peer receives: msgpack-encoded and decoded as the framing does."""
    return msgpack.unpackb(msgpack.packb(message.to_control(), use_bin_type=True), raw=False, strict_map_key=True)


def round_trip(message: Message) -> Message:
    return type(message).from_control(wire(message), EMPTY)


# The round trip of every message is tests/protocol/test_message_schema.py's, with strategies
# derived from each message's declaration.


def test_group_request_types_cover_the_group_api_keys():
    """GROUP_REQUEST_TYPES holds the eleven group APIs, each naming its response type (and, once
    its handler is registered, in REQUEST_TYPES as itself)."""
    keys = {cls.api_key for cls in GROUP_REQUEST_TYPES}
    assert len(keys) == len(GROUP_REQUEST_TYPES) == 11
    assert keys | set(REQUEST_TYPES) == set(protocol.ApiKey)
    for cls in GROUP_REQUEST_TYPES:
        assert cls.response_type.api_key == cls.api_key
        assert REQUEST_TYPES.get(cls.api_key, cls) is cls


def test_member_id_required_is_decoded_with_the_assigned_member_id():
    """A JoinGroup answered with MEMBER_ID_REQUIRED reaches the client as a typed response (not a
    raised whole-request error) carrying the member id to join again with."""
    request = JoinGroupRequest("g", 10_000, -1, "", None, "consumer", (JoinGroupProtocol("range", b"\x01"),))
    response = JoinGroupResponse(error_code=MemberIdRequiredError.code, member_id="client-1-uuid")
    control = wire(response)
    assert control["error_code"] == 0
    decoded = decode_reply(request, control, EMPTY)
    assert decoded == response
    assert isinstance(decoded.error(), MemberIdRequiredError) and decoded.member_id == "client-1-uuid"


def test_a_group_level_error_is_the_responses_own_error_code():
    """OffsetCommit refused for the whole group (NOT_COORDINATOR) decodes as a response whose
    error() names it, with its message."""
    request = OffsetCommitRequest("g", 3, "m", None, ())
    response = OffsetCommitResponse(NotCoordinatorError.code, "broker 2 coordinates g")
    decoded = decode_reply(request, wire(response), EMPTY)
    assert isinstance(decoded.error(), NotCoordinatorError) and str(decoded.error()) == "broker 2 coordinates g"


def test_a_malformed_request_error_is_still_raised_by_the_client():
    """The whole-request path is unchanged: a top-level error_code is raised before decoding."""
    with pytest.raises(InvalidRequestError, match="group_id"):
        decode_reply(HeartbeatRequest("g", 1, "m", None),
                     {"error_code": InvalidRequestError.code, "error_message": "field 'group_id' has type int"}, EMPTY)


@pytest.mark.parametrize("response_type", [
    FindCoordinatorResponse, JoinGroupResponse, SyncGroupResponse, HeartbeatResponse, LeaveGroupResponse,
    OffsetCommitResponse, OffsetFetchResponse, ListGroupsResponse, OffsetDeleteResponse], ids=lambda t: t.__name__)
def test_responses_decode_with_every_optional_field_absent(response_type):
    """A response control with only the whole-request error_code decodes to the message's defaults."""
    assert response_type.from_control({"error_code": 0}, EMPTY) == response_type()


def test_list_responses_decode_absent_lists_as_empty():
    """DescribeGroups and DeleteGroups without their lists decode as empty."""
    assert DescribeGroupsResponse.from_control({"error_code": 0}, EMPTY) == DescribeGroupsResponse(())
    assert DeleteGroupsResponse.from_control({"error_code": 0}, EMPTY) == DeleteGroupsResponse(())


# -- invalid requests: the whole message is refused ----------------------------------------------


def _join(**fields: Any) -> dict[str, Any]:
    control = JoinGroupRequest("g", 10_000, -1, "", None, "consumer", (JoinGroupProtocol("range", b"m"),)).to_control()
    return control | fields


def _sync(**fields: Any) -> dict[str, Any]:
    return SyncGroupRequest("g", 1, "m", None, "consumer", "range", (SyncGroupAssignment("m", b"a"),)).to_control() | fields


def _commit(**fields: Any) -> dict[str, Any]:
    return {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None, "topics": []} | fields


INVALID = [
    # id, message type, control, (error class, words the message must contain)
    ("find-coordinator-key-int", FindCoordinatorRequest, {"key": 5}, "'key' has type int"),
    ("find-coordinator-key-type-2", FindCoordinatorRequest, {"key": "g", "key_type": 2},
     "'key_type' must be 0 (group) or 1 (transaction), got 2"),
    ("join-group-id-int", JoinGroupRequest, _join(group_id=7), "'group_id' has type int"),
    ("join-group-id-missing", JoinGroupRequest, _join(group_id=None), "missing field 'group_id'"),
    ("join-session-timeout-str", JoinGroupRequest, _join(session_timeout_ms="10000"), "'session_timeout_ms' has type str"),
    ("join-session-timeout-float", JoinGroupRequest, _join(session_timeout_ms=1e4), "'session_timeout_ms' has type float"),
    ("join-rebalance-timeout-bool", JoinGroupRequest, _join(rebalance_timeout_ms=True),
     "'rebalance_timeout_ms' must not be a bool"),
    ("join-member-id-bytes", JoinGroupRequest, _join(member_id=b"m"), "'member_id' has type bytes"),
    ("join-instance-id-int", JoinGroupRequest, _join(group_instance_id=1), "'group_instance_id' has type int"),
    ("join-protocols-empty", JoinGroupRequest, _join(protocols=[]), "'protocols' must name at least one protocol"),
    ("join-protocols-twice", JoinGroupRequest,
     _join(protocols=[{"name": "range", "metadata": b""}, {"name": "range", "metadata": b"x"}]),
     "names protocol 'range' more than once"),
    ("join-protocol-metadata-str", JoinGroupRequest, _join(protocols=[{"name": "range", "metadata": "topics"}]),
     "'metadata' has type str"),
    ("join-protocol-name-missing", JoinGroupRequest, _join(protocols=[{"metadata": b""}]), "missing field 'name'"),
    ("join-reason-int", JoinGroupRequest, _join(reason=3), "'reason' has type int"),
    ("sync-generation-str", SyncGroupRequest, _sync(generation_id="1"), "'generation_id' has type str"),
    ("sync-assignment-str", SyncGroupRequest, _sync(assignments=[{"member_id": "m", "assignment": "t-0"}]),
     "'assignment' has type str"),
    ("sync-assignments-a-map", SyncGroupRequest, _sync(assignments={"m": b""}), "'assignments' has type dict"),
    ("heartbeat-group-id-list", HeartbeatRequest,
     {"group_id": ["g"], "generation_id": 1, "member_id": "m"}, "'group_id' has type list"),
    ("heartbeat-member-id-missing", HeartbeatRequest, {"group_id": "g", "generation_id": 1}, "missing field 'member_id'"),
    ("leave-member-id-int", LeaveGroupRequest, {"group_id": "g", "members": [{"member_id": 1}]},
     "'member_id' has type int"),
    ("leave-members-missing", LeaveGroupRequest, {"group_id": "g"}, "missing field 'members'"),
    ("commit-group-id-int", OffsetCommitRequest, _commit(group_id=1), "'group_id' has type int"),
    ("commit-generation-str", OffsetCommitRequest, _commit(generation_id="1"), "'generation_id' has type str"),
    ("commit-topic-entry-a-string", OffsetCommitRequest, _commit(topics=["t"]), "entries of 'topics' must be maps"),
    ("fetch-group-id-bytes", OffsetFetchRequest, {"group_id": b"g", "topics": None}, "'group_id' has type bytes"),
    ("fetch-partitions-strings", OffsetFetchRequest, {"group_id": "g", "topics": [{"name": "t", "partitions": ["0"]}]},
     "'partitions' must be a list of ints, got a str"),
    ("fetch-topic-name-int", OffsetFetchRequest, {"group_id": "g", "topics": [{"name": 1, "partitions": [0]}]},
     "'name' has type int"),
    ("fetch-require-stable-int", OffsetFetchRequest, {"group_id": "g", "topics": None, "require_stable": 1},
     "'require_stable' has type int"),
    ("list-states-filter-ints", ListGroupsRequest, {"states_filter": [1]}, "'states_filter' must be a list of strings"),
    ("describe-groups-a-string", DescribeGroupsRequest, {"groups": "g"}, "'groups' has type str"),
    ("describe-group-id-int", DescribeGroupsRequest, {"groups": ["g", 5]}, "'groups' must be a list of strings, got a int"),
    ("delete-groups-missing", DeleteGroupsRequest, {}, "missing field 'groups'"),
    ("offset-delete-partitions-bools", OffsetDeleteRequest,
     {"group_id": "g", "topics": [{"name": "t", "partitions": [True]}]}, "'partitions' must be a list of ints"),
    ("offset-delete-topics-missing", OffsetDeleteRequest, {"group_id": "g"}, "missing field 'topics'"),
]


@pytest.mark.parametrize("message_type, control, words", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_request_is_refused_naming_the_field(message_type, control, words):
    """A request control that breaks the message's shape raises INVALID_REQUEST naming the field."""
    with pytest.raises(InvalidRequestError) as raised:
        message_type.from_control(control, EMPTY)
    assert type(raised.value) is InvalidRequestError and words in str(raised.value)


def test_an_empty_group_id_is_well_formed():
    """An empty group id decodes: it is the coordinator's INVALID_GROUP_ID, not a malformed request."""
    assert HeartbeatRequest.from_control({"group_id": "", "generation_id": 1, "member_id": "m"}, EMPTY).group_id == ""


def test_join_group_keeps_an_unresolved_rebalance_timeout():
    """rebalance_timeout_ms -1 is decoded as sent; the coordinator reads it as the session timeout."""
    assert JoinGroupRequest.from_control(_join(rebalance_timeout_ms=-1), EMPTY).rebalance_timeout_ms == -1


# -- invalid OffsetCommit entries: kept on the entry, the rest decodes ------------------------------


def _partition(**fields: Any) -> dict[str, Any]:
    return {"partition": 0, "committed_offset": 5, "committed_leader_epoch": 1, "metadata": None} | fields


ENTRY_ERRORS = [
    # id, partition control, words
    ("partition-str", _partition(partition="0"), "'partition' has type str"),
    ("partition-negative", _partition(partition=-1), "partition -1 must be >= 0"),
    ("partition-missing", _partition(partition=None), "missing field 'partition'"),
    ("offset-negative", _partition(committed_offset=-1), "committed_offset -1 must be >= 0"),
    ("offset-float", _partition(committed_offset=5.0), "'committed_offset' has type float"),
    ("offset-missing", _partition(committed_offset=None), "missing field 'committed_offset'"),
    ("epoch-str", _partition(committed_leader_epoch="1"), "'committed_leader_epoch' has type str"),
    ("metadata-bytes", _partition(metadata=b"x"), "'metadata' has type bytes"),
    ("metadata-int", _partition(metadata=1), "'metadata' has type int"),
]


@pytest.mark.parametrize("partition, words", [c[1:] for c in ENTRY_ERRORS], ids=[c[0] for c in ENTRY_ERRORS])
def test_invalid_commit_entry_keeps_its_error_and_the_others_decode(partition, words):
    """A malformed commit partition is that entry's INVALID_REQUEST, answered alone; the valid
    partition beside it decodes without an error."""
    control = _commit(topics=[{"name": "t", "partitions": [partition, _partition(partition=1)]}])
    bad, good = OffsetCommitRequest.from_control(control, EMPTY).topics[0].partitions
    assert type(bad.error) is InvalidRequestError and words in str(bad.error), bad.error
    assert good == OffsetCommitPartition(1, 5, 1, None) and good.error is None


def test_a_commit_topic_name_that_is_not_a_string_is_the_topic_entrys_error():
    """A topic named by an int keeps the error on its entry (the coordinator answers each of its
    partitions with it), its partitions still decode; another topic decodes without one."""
    control = _commit(topics=[{"name": 7, "partitions": [_partition(), _partition(partition=1)]},
                              {"name": "t", "partitions": [_partition()]}])
    bad, good = OffsetCommitRequest.from_control(control, EMPTY).topics
    assert isinstance(bad.error, InvalidRequestError) and "'name' has type int" in str(bad.error)
    assert len(bad.partitions) == 2 and all(p.error is None for p in bad.partitions)
    assert good.name == "t" and good.error is None and good.partitions[0].error is None


def test_commit_defaults_apply_to_absent_optional_entry_fields():
    """A commit partition without leader epoch or metadata decodes to -1 and None."""
    control = _commit(topics=[{"name": "t", "partitions": [{"partition": 2, "committed_offset": 0}]}])
    assert OffsetCommitRequest.from_control(control, EMPTY).topics[0].partitions == (OffsetCommitPartition(2, 0),)


def test_offset_fetch_topics_none_means_every_committed_partition():
    """topics None travels as None (not an empty list, which asks for nothing)."""
    assert round_trip(OffsetFetchRequest("g", None)) == OffsetFetchRequest("g", None)
    assert round_trip(OffsetFetchRequest("g", ())) == OffsetFetchRequest("g", ())


# -- bytes are bytes -----------------------------------------------------------------------------


BYTES_FIELDS = [
    ("join-request-protocol-metadata", JoinGroupRequest, _join(protocols=[{"name": "r", "metadata": "x"}])),
    ("join-response-member-metadata", JoinGroupResponse,
     {"error_code": 0, "members": [{"member_id": "m", "group_instance_id": None, "metadata": "x"}]}),
    ("sync-request-assignment", SyncGroupRequest, _sync(assignments=[{"member_id": "m", "assignment": "x"}])),
    ("sync-response-assignment", SyncGroupResponse, {"error_code": 0, "assignment": "x"}),
    ("describe-member-metadata", DescribeGroupsResponse, {"error_code": 0, "groups": [
        {"group_id": "g", "error_code": 0, "members": [{"member_id": "m", "member_metadata": "x"}]}]}),
    ("describe-member-assignment", DescribeGroupsResponse, {"error_code": 0, "groups": [
        {"group_id": "g", "error_code": 0, "members": [{"member_id": "m", "member_assignment": "x"}]}]}),
]


@pytest.mark.parametrize("message_type, control", [c[1:] for c in BYTES_FIELDS], ids=[c[0] for c in BYTES_FIELDS])
def test_opaque_bytes_refuse_a_string(message_type, control):
    """Metadata and assignments are msgpack bin: a str in their place is refused, naming its type."""
    with pytest.raises(InvalidRequestError, match="has type str"):
        message_type.from_control(control, EMPTY)


def test_bytes_travel_as_msgpack_bin():
    """Opaque bytes are packed as bin (a str would decode as text on the other side)."""
    packed = msgpack.packb(SyncGroupResponse(assignment=b"\xff\x00").to_control(), use_bin_type=True)
    assert msgpack.unpackb(packed, raw=False)["assignment"] == b"\xff\x00"


# -- error codes ---------------------------------------------------------------------------------


GROUP_ERRORS = [CoordinatorLoadInProgressError, CoordinatorNotAvailableError, NotCoordinatorError,
                InconsistentGroupProtocolError, InvalidGroupIdError, UnknownMemberIdError, InvalidSessionTimeoutError,
                OffsetMetadataTooLargeError, NonEmptyGroupError, GroupIdNotFoundError, MemberIdRequiredError,
                GroupMaxSizeReachedError, FencedInstanceIdError, GroupSubscribedToTopicError, PartitionNotAssignedError,
                IllegalGenerationError, RebalanceInProgressError]


@pytest.mark.parametrize("error", GROUP_ERRORS, ids=lambda e: e.name())
def test_every_group_error_code_comes_back_as_its_class_through_a_response(error):
    """A partition outcome naming a group error code decodes, via error_for_code, to that class."""
    assert type(error_for_code(error.code)) is error
    response = OffsetCommitResponse(topics=(TopicResponse("t", (
        PartitionResponse(0, error.code, "why"),)),))
    found = round_trip(response).topics[0].partitions[0].error()
    assert type(found) is error and str(found) == "why"
