"""The group coordinator as a pure state machine: requests and ticks in, replies and records out."""
from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from broker.coordinator.group_metadata import GroupState
from broker.coordinator.group_records import GroupKey, OffsetKey, decode_record, encode_key, encode_value
from broker.coordinator.results import Result
from common.errors import (
    CoordinatorLoadInProgressError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    KafkaStorageError,
    MemberIdRequiredError,
    NonEmptyGroupError,
    NotCoordinatorError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from protocol.consumer_protocol import Assignment, Subscription
from protocol.messages.base import TopicRequest
from protocol.messages.group import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
)

SESSION_MS = 10_000
REBALANCE_MS = 30_000
TOPIC = "orders"


def subscription(*topics: str) -> bytes:
    return Subscription(topics=tuple(sorted(topics or (TOPIC,)))).encode()


def assignment(*partitions: int, topic: str = TOPIC) -> bytes:
    return Assignment(partitions=tuple((topic, p) for p in partitions)).encode()


def code_of(response: Any) -> type | None:
    return None if response.error_code == 0 else type(error_for_code(response.error_code))


class Harness:
    """A coordinator leading every partition, a clock, and a store that keeps appended records
    (so a second coordinator can replay them). Appends succeed unless `fail_appends` is set."""

    def __init__(self, initial_delay_ms: int = 0, partitions: int = 4, **config: Any) -> None:
        ids = itertools.count()
        self.config = GroupConfig(offsets_partitions=partitions, initial_rebalance_delay_ms=initial_delay_ms,
                                  min_session_timeout_ms=1_000, **config)
        self.coordinator = GroupCoordinator(self.config, lambda prefix: f"{prefix or 'member'}-{next(ids)}")
        for p in range(partitions):
            self.coordinator.begin_load(p)
            self.coordinator.finish_load(p, 0)
        self.now = 0
        self.replies: dict[Any, Any] = {}
        self.log: dict[int, list[tuple[bytes, bytes | None]]] = {p: [] for p in range(partitions)}
        self.fail_appends: Exception | None = None
        self._tokens = itertools.count()

    def apply(self, result: Result) -> None:
        for token, response in result.replies:
            self.replies[token] = response
        for append in result.appends:
            if self.fail_appends is not None:
                self.apply(append.complete(self.fail_appends, self.now))
                continue
            self.log[append.partition].extend((encode_key(k), encode_value(v)) for k, v in append.records)
            self.apply(append.complete(None, self.now))

    def call(self, method: str, request: Any, *extra: Any) -> Any:
        """A request that may be parked: returns its token (look it up in `replies`)."""
        token = next(self._tokens)
        self.apply(getattr(self.coordinator, method)(request, token, self.now, *extra))
        return token

    def join(self, member_id: str = "", group: str = "g", instance: str | None = None, topics: tuple[str, ...] = (TOPIC,),
             session_ms: int = SESSION_MS, protocols: tuple[str, ...] = ("range",)) -> Any:
        request = JoinGroupRequest(group, session_ms, REBALANCE_MS, member_id, instance, "consumer",
                                   tuple(JoinGroupProtocol(name, subscription(*topics)) for name in protocols), "client")
        return self.call("join_group", request)

    def join_new(self, group: str = "g", **kwargs: Any) -> str:
        """KIP-394: the first join is refused with an id to rejoin with; returns the rejoin's token."""
        token = self.join("", group, **kwargs)
        first = self.replies.get(token)
        if kwargs.get("instance") is not None:
            return token  # static members are admitted at once
        assert code_of(first) is MemberIdRequiredError
        return self.join(first.member_id, group, **kwargs)

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None, group: str = "g",
             instance: str | None = None) -> Any:
        entries = tuple(SyncGroupAssignment(m, a) for m, a in (assignments or {}).items())
        return self.call("sync_group", SyncGroupRequest(group, generation, member_id, instance, "consumer", "range", entries))

    def heartbeat(self, member_id: str, generation: int, group: str = "g", instance: str | None = None) -> Any:
        return self.coordinator.heartbeat(HeartbeatRequest(group, generation, member_id, instance), self.now)

    def commit(self, member_id: str, generation: int, offsets: dict[int, int], group: str = "g", topic: str = TOPIC,
               instance: str | None = None) -> Any:
        request = OffsetCommitRequest(group, generation, member_id, instance, (TopicRequest(topic, tuple(
            OffsetCommitPartition(p, o, metadata="m") for p, o in offsets.items())),))
        return self.replies[self.call("commit_offsets", request, lambda topic, partition: topic != "missing")]

    def committed(self, group: str = "g") -> dict[tuple[str, int], int]:
        response = self.coordinator.fetch_offsets(OffsetFetchRequest(group, None))
        return {(t.name, p.partition): p.committed_offset for t in response.topics for p in t.partitions}

    def tick(self, advance_ms: int) -> None:
        self.now += advance_ms
        self.apply(self.coordinator.tick(self.now))

    def stable_group_of_one(self, group: str = "g", partitions: tuple[int, ...] = (0, 1, 2)) -> tuple[str, int]:
        joined = self.replies[self.join_new(group)]
        assert code_of(joined) is None and joined.leader == joined.member_id
        synced = self.replies[self.sync(joined.member_id, joined.generation_id, {joined.member_id: assignment(*partitions)},
                                        group)]
        assert code_of(synced) is None
        return joined.member_id, joined.generation_id


def test_a_single_member_joins_syncs_and_is_stable() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one()
    group = h.coordinator.groups["g"]
    assert group.state is GroupState.STABLE and generation == 1
    assert Assignment.decode(group.members[member].assignment).partitions == ((TOPIC, 0), (TOPIC, 1), (TOPIC, 2))
    assert code_of(h.heartbeat(member, generation)) is None
    stored = [decode_record(k, v) for k, v in h.log[h.coordinator.partition_of("g")]]
    assert stored[-1][0] == GroupKey("g") and stored[-1][1].generation == 1


def test_a_second_member_triggers_a_rebalance_that_both_complete() -> None:
    h = Harness()
    first, generation = h.stable_group_of_one()
    second_token = h.join_new()
    assert second_token not in h.replies  # parked until the first member rejoins
    assert code_of(h.heartbeat(first, generation)) is RebalanceInProgressError
    first_token = h.join(first)
    leader, follower = h.replies[first_token], h.replies[second_token]
    assert leader.generation_id == follower.generation_id == 2
    assert leader.leader == first and {m.member_id for m in leader.members} == {first, follower.member_id}
    assert follower.members == ()
    follower_sync = h.sync(follower.member_id, 2)
    assert follower_sync not in h.replies  # waits for the leader's assignment
    h.sync(first, 2, {first: assignment(0, 1), follower.member_id: assignment(2)})
    assert Assignment.decode(h.replies[follower_sync].assignment).partitions == ((TOPIC, 2),)
    assert h.coordinator.groups["g"].state is GroupState.STABLE


def test_a_silent_member_is_evicted_after_its_session_timeout() -> None:
    h = Harness()
    first, _ = h.stable_group_of_one()
    h.tick(SESSION_MS - 1)
    assert first in h.coordinator.groups["g"].members
    h.tick(2)
    group = h.coordinator.groups["g"]
    assert not group.members and group.state is GroupState.EMPTY and group.generation == 2
    assert code_of(h.heartbeat(first, 1)) is UnknownMemberIdError


def test_heartbeats_keep_a_member_across_many_session_timeouts() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one()
    for _ in range(10):
        h.tick(SESSION_MS // 2)
        assert code_of(h.heartbeat(member, generation)) is None
    assert h.coordinator.groups["g"].state is GroupState.STABLE


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed() -> None:
    h = Harness()
    first, generation = h.stable_group_of_one()
    second_token = h.join_new()
    for _ in range(REBALANCE_MS // 5_000):  # the first member heartbeats but never rejoins (a stuck poll loop)
        h.tick(5_000)
        h.heartbeat(first, generation)
    h.tick(1)
    second = h.replies[second_token]
    assert code_of(second) is None and second.generation_id == 2 and second.leader == second.member_id
    assert set(h.coordinator.groups["g"].members) == {second.member_id}


def test_session_timeouts_outside_the_broker_bounds_are_refused() -> None:
    h = Harness(max_session_timeout_ms=60_000)
    assert code_of(h.replies[h.join(session_ms=500)]) is InvalidSessionTimeoutError
    assert code_of(h.replies[h.join(session_ms=60_001)]) is InvalidSessionTimeoutError
    assert "g" not in h.coordinator.groups or not h.coordinator.groups["g"].members


def test_a_static_member_restarting_gets_its_partitions_back_without_a_rebalance() -> None:
    h = Harness()
    joined = h.replies[h.join_new(instance="pod-1")]
    member = joined.member_id
    h.sync(member, 1, {member: assignment(0, 1, 2)})
    records_before = len(h.log[h.coordinator.partition_of("g")])
    restarted = h.replies[h.join(instance="pod-1")]
    assert code_of(restarted) is None and restarted.generation_id == 1 and restarted.member_id != member
    assert restarted.skip_assignment  # it was the leader: it must not assign again
    synced = h.replies[h.sync(restarted.member_id, 1, instance="pod-1")]
    assert Assignment.decode(synced.assignment).partitions == ((TOPIC, 0), (TOPIC, 1), (TOPIC, 2))
    assert h.coordinator.groups["g"].generation == 1 and h.coordinator.groups["g"].state is GroupState.STABLE
    assert len(h.log[h.coordinator.partition_of("g")]) == records_before + 1  # the new member id is stored
    assert code_of(h.heartbeat(member, 1, instance="pod-1")) is FencedInstanceIdError
    assert code_of(h.commit(member, 1, {0: 5}, instance="pod-1")) is FencedInstanceIdError


def test_commits_are_fenced_by_generation_member_and_assignment() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one(partitions=(0, 1))
    ok = h.commit(member, generation, {0: 10, 1: 20})
    assert code_of(ok) is None and all(code_of(p) is None for t in ok.topics for p in t.partitions)
    assert code_of(h.commit(member, generation + 1, {0: 11})) is IllegalGenerationError
    assert code_of(h.commit("someone", generation, {0: 11})) is UnknownMemberIdError
    not_mine = h.commit(member, generation, {0: 12, 2: 30})
    outcomes = {p.partition: code_of(p) for t in not_mine.topics for p in t.partitions}
    assert outcomes == {0: None, 2: PartitionNotAssignedError}
    missing = h.commit(member, generation, {0: 1}, topic="missing")
    assert code_of(missing.topics[0].partitions[0]) is UnknownTopicOrPartitionError
    assert h.committed() == {(TOPIC, 0): 12, (TOPIC, 1): 20}


def test_commits_while_a_rebalance_completes_are_refused() -> None:
    h = Harness()
    first, generation = h.stable_group_of_one()
    h.join_new()
    h.join(first)  # both joined: generation 2 awaits the leader's sync
    assert h.coordinator.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert code_of(h.commit(first, 2, {0: 1})) is RebalanceInProgressError


def test_commits_during_a_rebalance_from_the_current_generation_are_accepted() -> None:
    """Eager consumers commit what they processed when they learn of a rebalance, before rejoining."""
    h = Harness()
    first, generation = h.stable_group_of_one()
    h.join_new()
    assert h.coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert code_of(h.commit(first, generation, {0: 7})) is None
    assert h.committed()[(TOPIC, 0)] == 7


def test_a_commit_topic_with_a_malformed_name_answers_its_partitions_and_commits_the_other_topic() -> None:
    """A topic entry whose name is not a string answers each of its partitions INVALID_REQUEST;
    the other topic of the request is committed."""
    h = Harness()
    control = {"group_id": "solo", "generation_id": -1, "member_id": "", "topics": [
        {"name": 7, "partitions": [{"partition": 0, "committed_offset": 5}, {"partition": 1, "committed_offset": 6}]},
        {"name": TOPIC, "partitions": [{"partition": 0, "committed_offset": 9}]}]}
    request = OffsetCommitRequest.from_control(control, memoryview(b""))
    response = h.replies[h.call("commit_offsets", request, lambda t, p: True)]
    bad, good = response.topics
    assert [code_of(p) for p in bad.partitions] == [InvalidRequestError, InvalidRequestError]
    assert [code_of(p) for p in good.partitions] == [None]
    assert h.committed("solo") == {(TOPIC, 0): 9}


def test_a_malformed_assignment_is_refused_and_changes_nothing() -> None:
    h = Harness()
    joined = h.replies[h.join_new()]
    member = joined.member_id
    bad = h.replies[h.sync(member, 1, {member: b"\x01not msgpack"})]
    assert code_of(bad) is InvalidRequestError
    assert h.coordinator.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert code_of(h.replies[h.sync(member, 1, {"ghost": assignment(0)})]) is InvalidRequestError
    good = h.replies[h.sync(member, 1, {member: assignment(0)})]
    assert code_of(good) is None and h.coordinator.groups["g"].state is GroupState.STABLE


def test_an_assignment_giving_one_partition_to_two_members_is_refused() -> None:
    h = Harness()
    first, _ = h.stable_group_of_one()
    second_token = h.join_new()
    h.join(first)
    second = h.replies[second_token].member_id
    refused = h.replies[h.sync(first, 2, {first: assignment(0, 1), second: assignment(1, 2)})]
    assert code_of(refused) is InvalidRequestError and "one consumer per partition" in refused.error_message


def test_a_failed_append_leaves_offsets_and_group_as_they_were() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one()
    h.commit(member, generation, {0: 5})
    h.fail_appends = KafkaStorageError("disk gone")
    failed = h.commit(member, generation, {0: 6})
    assert code_of(failed.topics[0].partitions[0]) is KafkaStorageError
    assert h.committed() == {(TOPIC, 0): 5}


def test_leave_group_rebalances_the_rest_and_the_last_leave_empties_the_group() -> None:
    h = Harness()
    first, _ = h.stable_group_of_one()
    second_token = h.join_new()
    h.join(first)
    second = h.replies[second_token].member_id
    h.sync(first, 2, {first: assignment(0, 1), second: assignment(2)})
    response, effects = h.coordinator.leave_group(LeaveGroupRequest("g", (MemberIdentity(second, None, "bye"),)), h.now)
    h.apply(effects)
    assert code_of(response) is None and code_of(response.members[0]) is None
    group = h.coordinator.groups["g"]
    assert group.state is GroupState.PREPARING_REBALANCE
    rejoined = h.replies[h.join(first)]
    assert rejoined.generation_id == 3 and [m.member_id for m in rejoined.members] == [first]
    response, effects = h.coordinator.leave_group(LeaveGroupRequest("g", (MemberIdentity(first, None, None),)), h.now)
    h.apply(effects)
    assert group.state is GroupState.EMPTY and not group.members
    unknown, _ = h.coordinator.leave_group(LeaveGroupRequest("g", (MemberIdentity("ghost", None, None),)), h.now)
    assert code_of(unknown.members[0]) is UnknownMemberIdError


def test_replay_restores_groups_members_and_offsets() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one()
    h.commit(member, generation, {0: 40, 1: 41})
    h.commit(member, generation, {0: 42})
    standalone = OffsetCommitRequest("solo", -1, "", None, (TopicRequest(TOPIC, (OffsetCommitPartition(3, 9),)),))
    h.call("commit_offsets", standalone, lambda t, p: True)
    fresh = GroupCoordinator(h.config)
    for partition, records in h.log.items():
        fresh.begin_load(partition)
        for key, value in records:
            fresh.replay(partition, *decode_record(key, value), -1)
        fresh.finish_load(partition, h.now)
    group = fresh.groups["g"]
    assert group.state is GroupState.STABLE and group.generation == generation and set(group.members) == {member}
    assert {tp: c.offset for tp, c in group.offsets.items()} == {(TOPIC, 0): 42, (TOPIC, 1): 41}
    assert group.offsets[(TOPIC, 0)].metadata == "m"
    assert fresh.groups["solo"].offsets[(TOPIC, 3)].offset == 9
    assert code_of(fresh.heartbeat(HeartbeatRequest("g", generation, member, None), h.now)) is None


def test_groups_of_partitions_not_led_or_still_loading_are_refused() -> None:
    coordinator = GroupCoordinator(GroupConfig(offsets_partitions=2, min_session_timeout_ms=1_000))
    request = HeartbeatRequest("g", 1, "m", None)
    assert code_of(coordinator.heartbeat(request, 0)) is NotCoordinatorError
    coordinator.begin_load(coordinator.partition_of("g"))
    assert code_of(coordinator.heartbeat(request, 0)) is CoordinatorLoadInProgressError


def test_unloading_a_partition_answers_parked_joins_with_not_coordinator() -> None:
    h = Harness()
    first, _ = h.stable_group_of_one()
    second_token = h.join_new()
    h.apply(h.coordinator.unload(h.coordinator.partition_of("g")))
    assert code_of(h.replies[second_token]) is NotCoordinatorError
    assert "g" not in h.coordinator.groups


def test_offsets_of_an_empty_group_expire_after_the_retention_and_the_group_goes() -> None:
    h = Harness(offsets_retention_ms=60_000)
    member, generation = h.stable_group_of_one()
    h.commit(member, generation, {0: 3})
    h.apply(h.coordinator.leave_group(LeaveGroupRequest("g", (MemberIdentity(member, None, None),)), h.now)[1])
    assert h.coordinator.groups["g"].state is GroupState.EMPTY
    h.now += 59_999
    h.apply(h.coordinator.expire_offsets(h.now))
    assert h.committed() == {(TOPIC, 0): 3}
    h.now += 1
    h.apply(h.coordinator.expire_offsets(h.now))
    assert "g" not in h.coordinator.groups and h.committed() == {}
    tombstones = [decode_record(k, v) for k, v in h.log[h.coordinator.partition_of("g")][-2:]]
    assert tombstones == [(OffsetKey("g", TOPIC, 0), None), (GroupKey("g"), None)]


def test_deleting_a_topic_removes_its_offsets_from_every_group_and_an_empty_group_without_offsets() -> None:
    """Offsets of a deleted topic go from every group: a stable group keeps its members, a
    standalone group keeps its other topic's offset, and one whose only offsets were of the
    deleted topic goes with them (tombstones for both)."""
    h = Harness()
    member, generation = h.stable_group_of_one()
    h.commit(member, generation, {0: 3})

    def standalone(group: str, topic: str, partition: int, offset: int) -> None:
        h.call("commit_offsets", OffsetCommitRequest(group, -1, "", None, (TopicRequest(topic, (
            OffsetCommitPartition(partition, offset),)),)), lambda t, p: True)

    standalone("mixed", TOPIC, 0, 5)
    standalone("mixed", "other", 0, 7)
    standalone("idle", TOPIC, 1, 2)
    h.apply(h.coordinator.delete_topic_offsets(TOPIC))
    assert h.committed("g") == {} and h.coordinator.groups["g"].state is GroupState.STABLE
    assert h.committed("mixed") == {("other", 0): 7}
    assert "idle" not in h.coordinator.groups
    written = [decode_record(k, v) for k, v in h.log[h.coordinator.partition_of("idle")]]
    assert (OffsetKey("idle", TOPIC, 1), None) in written and (GroupKey("idle"), None) in written
    assert h.coordinator.delete_topic_offsets(TOPIC).appends == []


def test_delete_groups_refuses_unknown_and_active_groups_and_deletes_empty_ones() -> None:
    h = Harness()
    h.stable_group_of_one("active")
    h.call("commit_offsets", OffsetCommitRequest("idle", -1, "", None, (TopicRequest(TOPIC, (
        OffsetCommitPartition(0, 1),)),)), lambda t, p: True)
    token = h.call("delete_groups", DeleteGroupsRequest(("active", "idle", "nope")))
    results = {r.group_id: code_of(r) for r in h.replies[token].results}
    assert results == {"active": NonEmptyGroupError, "idle": None, "nope": GroupIdNotFoundError}
    assert "idle" not in h.coordinator.groups and "active" in h.coordinator.groups
    described = h.coordinator.describe_groups(DescribeGroupsRequest(("idle",))).groups[0]
    assert code_of(described) is GroupIdNotFoundError


def test_offset_delete_refuses_topics_the_group_subscribes_to() -> None:
    h = Harness()
    member, generation = h.stable_group_of_one()
    h.commit(member, generation, {0: 1})
    token = h.call("delete_offsets", OffsetDeleteRequest("g", (TopicRequest(TOPIC, (0,)),)))
    assert code_of(h.replies[token].topics[0].partitions[0]) is GroupSubscribedToTopicError
    assert h.committed() == {(TOPIC, 0): 1}


def test_list_and_describe_show_state_members_and_assignments() -> None:
    h = Harness()
    member, _ = h.stable_group_of_one()
    listed = h.coordinator.list_groups(ListGroupsRequest(()))
    assert [(g.group_id, g.group_state, g.protocol_type) for g in listed.groups] == [("g", "Stable", "consumer")]
    assert h.coordinator.list_groups(ListGroupsRequest(("empty",))).groups == ()
    described = h.coordinator.describe_groups(DescribeGroupsRequest(("g",))).groups[0]
    assert described.group_state == "Stable" and described.protocol_data == "range"
    assert Assignment.decode(described.members[0].member_assignment).partitions[0] == (TOPIC, 0)


def test_the_initial_rebalance_delay_gathers_members_that_start_together() -> None:
    h = Harness(initial_delay_ms=3_000)
    first = h.join_new()
    h.tick(1_000)
    second = h.join_new()
    assert first not in h.replies and second not in h.replies
    h.tick(2_999)
    assert first not in h.replies  # each new member waits one more delay
    h.tick(1)
    assert h.replies[first].generation_id == h.replies[second].generation_id == 1


def test_a_protocol_no_member_shares_is_refused() -> None:
    h = Harness()
    h.stable_group_of_one()
    refused = h.replies[h.join(protocols=("roundrobin",))]
    assert refused.error_message and "do not match" in refused.error_message


def test_the_protocol_most_members_prefer_among_common_ones_wins() -> None:
    h = Harness()
    a = h.join_new(protocols=("cooperative-sticky", "range"))
    b_first = h.replies[h.join("", protocols=("range", "cooperative-sticky"))]
    assert h.replies[a].protocol_name == "cooperative-sticky"
    h.join(b_first.member_id, protocols=("range", "cooperative-sticky"))
    c = h.join_new(protocols=("cooperative-sticky",))
    h.join(h.replies[a].member_id, protocols=("cooperative-sticky", "range"))
    assert h.replies[c].protocol_name == "cooperative-sticky"


@pytest.mark.parametrize("group_id", [""])
def test_an_empty_group_id_is_invalid(group_id: str) -> None:
    h = Harness()
    assert h.replies[h.join(group=group_id)].error_code != 0


def test_a_cooperative_member_commits_partitions_it_revokes_until_another_member_owns_them() -> None:
    """Under the cooperative protocol on_revoke runs after the new assignment arrived: commits of
    the revoked partitions must still be accepted while nobody owns them (they are withheld from
    their next owner until the follow-up rebalance)."""
    h = Harness()
    first, _ = h.stable_group_of_one(partitions=(0, 1, 2))
    second_token = h.join_new()
    h.join(first)
    second = h.replies[second_token].member_id
    h.sync(first, 2, {first: assignment(0, 1), second: assignment()})  # 2 is withheld this round
    assert code_of(h.commit(first, 2, {2: 50}).topics[0].partitions[0]) is None
    h.join(first)  # the follow-up rebalance hands partition 2 to the second member
    h.join(second)
    h.sync(first, 3, {first: assignment(0, 1), second: assignment(2)})
    late = h.commit(first, 3, {2: 51})
    assert code_of(late.topics[0].partitions[0]) is PartitionNotAssignedError
    assert h.committed()[(TOPIC, 2)] == 50


def test_a_revoked_partition_already_given_to_another_member_cannot_be_committed() -> None:
    h = Harness()
    first, _ = h.stable_group_of_one(partitions=(0, 1, 2))
    second_token = h.join_new()
    h.join(first)
    second = h.replies[second_token].member_id
    h.sync(first, 2, {first: assignment(0, 1), second: assignment(2)})  # an eager-style handover
    assert code_of(h.commit(first, 2, {2: 50}).topics[0].partitions[0]) is PartitionNotAssignedError


def test_a_static_cooperative_member_restarting_with_new_owned_partitions_does_not_rebalance() -> None:
    """Its subscription carries the partitions it owned and their generation; those change across
    restarts and rebalances, yet the member wants the same topics: no rebalance."""
    h = Harness()
    cooperative = ("cooperative-sticky",)
    token = h.call("join_group", JoinGroupRequest("g", SESSION_MS, REBALANCE_MS, "", "pod-1", "consumer", (
        JoinGroupProtocol("cooperative-sticky", Subscription((TOPIC,)).encode()),), "client"))
    member = h.replies[token].member_id
    h.call("sync_group", SyncGroupRequest("g", 1, member, "pod-1", "consumer", cooperative[0], (
        SyncGroupAssignment(member, assignment(0, 1)),)))
    restarted = JoinGroupRequest("g", SESSION_MS, REBALANCE_MS, "", "pod-1", "consumer", (JoinGroupProtocol(
        "cooperative-sticky", Subscription((TOPIC,), ((TOPIC, 0), (TOPIC, 1)), generation_id=1).encode()),), "client")
    again = h.replies[h.call("join_group", restarted)]
    assert code_of(again) is None and again.generation_id == 1
    assert h.coordinator.groups["g"].state is GroupState.STABLE
