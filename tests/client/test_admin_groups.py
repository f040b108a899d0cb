"""Admin's consumer-group methods against a real broker process: committing offsets from outside
a group and reading them back, listing, describing and deleting groups, deleting offsets, lag,
errors for unknown groups, and refusals while a group has an active member (joined with raw
JoinGroup / SyncGroup messages)."""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import pytest

from client import Admin, AdminError, Producer
from client.admin import GroupListing, MemberDescription, OffsetAndMetadata, PartitionLag
from broker.coordinator.group_records import GROUP_ID_MAX_BYTES
from common.errors import (
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    InvalidGroupIdError,
    InvalidRequestError,
    NonEmptyGroupError,
    UnknownTopicOrPartitionError,
)

# No initial rebalance delay, so that a member joining an empty group gets its generation at once.
BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0}
_group_ids = itertools.count()


@pytest.fixture
def admin(shared_broker) -> Iterator[Admin]:
    with Admin(shared_broker.bootstrap) as client:
        yield client


@pytest.fixture
def group_id(topic_name: str) -> str:
    return f"group-{topic_name}-{next(_group_ids)}"


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """`counts[p]` records into partition p, acknowledged."""
    with Producer(bootstrap) as producer:
        for partition, count in counts.items():
            for i in range(count):
                producer.send(topic, value=f"v{i}".encode(), partition=partition)


@pytest.fixture
def active_member(raw_group_members, shared_broker):
    """active_member(group_id, topic, partitions) -> member id of a consumer-protocol member that
    owns `partitions` of `topic` (Stable group); it leaves the group at teardown."""
    return functools.partial(raw_group_members, shared_broker.bootstrap)


# -- committed offsets -------------------------------------------------------------------------


def test_find_coordinator_is_the_single_broker(shared_broker, admin, group_id):
    """With one broker, every group's coordinator is broker 0 at the bootstrap address."""
    coordinator = admin.find_coordinator(group_id)
    assert (coordinator.node_id, f"{coordinator.host}:{coordinator.port}") == (0, shared_broker.bootstrap)


def test_altered_offsets_read_back_with_metadata(admin, new_topic, group_id):
    """Offsets committed from outside the group come back with their metadata; a subset can be asked for."""
    topic = new_topic(partitions=3)
    admin.alter_group_offsets(group_id, {(topic, 0): 5, (topic, 2): 0}, metadata="reset by test")
    expected = {(topic, 0): OffsetAndMetadata(5, "reset by test", None),
                (topic, 2): OffsetAndMetadata(0, "reset by test", None)}
    assert admin.list_group_offsets(group_id) == expected
    assert admin.list_group_offsets(group_id, [(topic, 0), (topic, 1)]) == {(topic, 0): expected[(topic, 0)]}
    admin.alter_group_offsets(group_id, {(topic, 0): 7})
    assert admin.list_group_offsets(group_id, [(topic, 0)]) == {(topic, 0): OffsetAndMetadata(7, None, None)}


def test_alter_offsets_of_unknown_partition_raises_its_error(admin, new_topic, group_id):
    """A partition that does not exist is refused as UNKNOWN_TOPIC_OR_PARTITION; the others are committed."""
    topic = new_topic(partitions=1)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.alter_group_offsets(group_id, {(topic, 0): 1, (topic, 9): 1})
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(1, None, None)}


def test_delete_group_offsets_removes_only_those_partitions(admin, new_topic, group_id):
    """OffsetDelete on an empty group drops the named partitions' offsets and keeps the rest."""
    topic = new_topic(partitions=2)
    admin.alter_group_offsets(group_id, {(topic, 0): 1, (topic, 1): 2})
    admin.delete_group_offsets(group_id, [(topic, 1)])
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(1, None, None)}


# -- listing, describing, deleting ---------------------------------------------------------------


def test_empty_group_is_listed_and_described(admin, new_topic, group_id):
    """A group with only committed offsets is Empty, with no protocol and no members; the state filter applies."""
    topic = new_topic()
    admin.alter_group_offsets(group_id, {(topic, 0): 0})
    assert GroupListing(group_id, "Empty", "") in admin.list_groups()
    assert group_id in [g.group_id for g in admin.list_groups(states=["empty"])]
    assert group_id not in [g.group_id for g in admin.list_groups(states=["Stable"])]
    (description,) = admin.describe_groups([group_id])
    assert (description.group_id, description.state, description.protocol_type, description.protocol,
            description.members) == (group_id, "Empty", "", "", [])


def test_delete_groups_removes_the_group_and_its_offsets(admin, new_topic, group_id):
    """A deleted group is no longer listed, its offsets are gone, and deleting it again is GROUP_ID_NOT_FOUND."""
    topic = new_topic()
    admin.alter_group_offsets(group_id, {(topic, 0): 3})
    admin.delete_groups([group_id])
    assert group_id not in [g.group_id for g in admin.list_groups()]
    assert admin.list_group_offsets(group_id) == {}
    with pytest.raises(GroupIdNotFoundError):
        admin.delete_groups([group_id])


def test_delete_groups_attempts_all_and_reports_every_failure(admin, new_topic, group_id):
    """One good and two unknown groups: the good one is deleted, AdminError names both failures."""
    topic = new_topic()
    admin.alter_group_offsets(group_id, {(topic, 0): 3})
    with pytest.raises(AdminError) as caught:
        admin.delete_groups([f"{group_id}-x", group_id, f"{group_id}-y"])
    assert {name: type(err) for name, err in caught.value.errors.items()} == {
        f"{group_id}-x": GroupIdNotFoundError, f"{group_id}-y": GroupIdNotFoundError}
    assert group_id not in [g.group_id for g in admin.list_groups()]


@pytest.mark.parametrize("call", [
    lambda admin, g: admin.describe_groups([g]),
    lambda admin, g: admin.group_lag(g),
    lambda admin, g: admin.delete_groups([g]),
    lambda admin, g: admin.delete_group_offsets(g, [("t", 0)]),
], ids=["describe_groups", "group_lag", "delete_groups", "delete_group_offsets"])
def test_unknown_group_is_group_id_not_found(admin, group_id, call):
    """Calls about one group that does not exist raise GroupIdNotFoundError."""
    with pytest.raises(GroupIdNotFoundError):
        call(admin, group_id)


def test_unknown_group_has_no_offsets(admin, group_id):
    """Reading the offsets of a group that does not exist gives none (as Kafka's OffsetFetch)."""
    assert admin.list_group_offsets(group_id) == {}


# -- lag ---------------------------------------------------------------------------------------


def test_group_lag_after_producing(shared_broker, admin, new_topic, group_id):
    """Lag is the high watermark minus the committed offset, for every partition of a committed
    topic; a partition without a commit has no committed offset and no lag."""
    topic = new_topic(partitions=3)
    produce(shared_broker.bootstrap, topic, {0: 10, 1: 4, 2: 7})
    admin.alter_group_offsets(group_id, {(topic, 0): 3, (topic, 1): 4})
    assert admin.group_lag(group_id) == [
        PartitionLag(topic, 0, 3, 10, 7, None, None),
        PartitionLag(topic, 1, 4, 4, 0, None, None),
        PartitionLag(topic, 2, None, 7, None, None, None),
    ]


# -- a group with an active member ---------------------------------------------------------------


def test_active_group_is_described_with_assignments_and_lag(shared_broker, admin, new_topic, group_id,
                                                            active_member):
    """A Stable consumer group shows its member's decoded assignment; lag rows cover every
    partition of the assigned topic and name the owner of the assigned one."""
    topic = new_topic(partitions=2)
    produce(shared_broker.bootstrap, topic, {0: 5})
    member_id = active_member(group_id, topic, [0])
    (description,) = admin.describe_groups([group_id])
    assert (description.state, description.protocol_type, description.protocol) == ("Stable", "consumer", "range")
    assert description.members == [MemberDescription(member_id, None, "test-member", [(topic, 0)])]
    assert GroupListing(group_id, "Stable", "consumer") in admin.list_groups(states=["Stable"])
    assert admin.group_lag(group_id) == [PartitionLag(topic, 0, None, 5, None, member_id, "test-member"),
                                         PartitionLag(topic, 1, None, 0, None, None, None)]


def test_active_group_refuses_alter_delete_and_offset_delete(admin, new_topic, group_id, active_member):
    """While a member is in the group: altering offsets is NON_EMPTY_GROUP and commits nothing,
    deleting the group is NON_EMPTY_GROUP, deleting a subscribed topic's offsets is refused."""
    topic = new_topic(partitions=1)
    admin.alter_group_offsets(group_id, {(topic, 0): 2})
    active_member(group_id, topic, [0])
    with pytest.raises(NonEmptyGroupError):
        admin.alter_group_offsets(group_id, {(topic, 0): 9})
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(2, None, None)}
    with pytest.raises(NonEmptyGroupError):
        admin.delete_groups([group_id])
    with pytest.raises(GroupSubscribedToTopicError):
        admin.delete_group_offsets(group_id, [(topic, 0)])
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(2, None, None)}


def test_alter_offsets_accepted_once_the_member_left(shared_broker, admin, new_topic, group_id, raw_group_members):
    """After the last member leaves, the group is Empty and takes commits from outside again."""
    topic = new_topic(partitions=1)
    member_id = raw_group_members(shared_broker.bootstrap, group_id, topic, [0])
    raw_group_members.leave(shared_broker.bootstrap, group_id, member_id)
    admin.alter_group_offsets(group_id, {(topic, 0): 4})
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(4, None, None)}
    assert admin.describe_groups([group_id])[0].state == "Empty"


# -- group ids and offsets no group can have --------------------------------------------------------


def test_group_ids_no_group_can_have_are_invalid_group_id(admin, new_topic):
    """Empty, or longer than Kafka's protocol carries (a STRING: 32,767 UTF-8 bytes, counted in
    bytes, not characters): INVALID_GROUP_ID, as Kafka answers. The longest id works."""
    topic = new_topic(partitions=1)
    for bad in ("", "g" * (GROUP_ID_MAX_BYTES + 1), "é" * (GROUP_ID_MAX_BYTES // 2 + 1)):
        with pytest.raises(InvalidGroupIdError):
            admin.find_coordinator(bad)
        with pytest.raises(InvalidGroupIdError):
            admin.alter_group_offsets(bad, {(topic, 0): 1})
    longest = "g" * GROUP_ID_MAX_BYTES
    admin.alter_group_offsets(longest, {(topic, 0): 3})
    assert admin.list_group_offsets(longest) == {(topic, 0): OffsetAndMetadata(3, None, None)}


def test_an_offset_past_int64_is_refused(admin, new_topic, group_id):
    topic = new_topic(partitions=1)
    with pytest.raises(InvalidRequestError, match="fit in an int64"):
        admin.alter_group_offsets(group_id, {(topic, 0): 2**63})
    admin.alter_group_offsets(group_id, {(topic, 0): 2**63 - 1})
    assert admin.list_group_offsets(group_id) == {(topic, 0): OffsetAndMetadata(2**63 - 1, None, None)}


def test_requests_with_huge_group_ids_stall_no_other_client(shared_broker, new_topic, group_id):
    """Requests naming a 16 MiB group id, sent straight to the coordinator, are refused at once:
    meanwhile a consumer of another group, whose session expires after 6 s without a heartbeat,
    stays in its generation (a hash per character kept the broker's event loop ~25 s per such
    request, and evicted it)."""
    import asyncio

    from client import AsyncAdmin, Consumer
    from protocol import FindCoordinatorRequest, OffsetCommitPartition, OffsetCommitRequest, TopicRequest

    topic = new_topic(partitions=1)
    with Consumer(shared_broker.bootstrap, group_id=group_id, session_timeout_ms=6000,
                  heartbeat_interval_ms=500) as consumer:
        consumer.subscribe([topic])
        while not consumer.assignment():
            consumer.poll(200)
        generation = consumer.group_metadata().generation_id
        huge = "g" * (16 << 20)

        async def flood() -> list[BaseException | None]:
            client = AsyncAdmin(shared_broker.bootstrap)
            try:
                errors = []
                for _ in range(3):
                    found = await client.cluster.send(0, FindCoordinatorRequest(huge))
                    committed = await client.cluster.send(0, OffsetCommitRequest(
                        huge, -1, "", None, (TopicRequest(topic, (OffsetCommitPartition(0, 1),)),)))
                    errors += [found.error(), committed.error()]
                return errors
            finally:
                await client.close()

        assert all(isinstance(err, InvalidGroupIdError) for err in asyncio.run(flood()))
        consumer.poll(200)
        assert consumer.group_metadata().generation_id == generation
    with Admin(shared_broker.bootstrap) as admin:
        assert admin.describe_groups([group_id])[0].state == "Empty"  # it left by itself, at close
