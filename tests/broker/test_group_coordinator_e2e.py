"""The group coordinator in a real broker process, over raw TCP with the typed messages: the
offsets topic appears on first FindCoordinator, a group forms and commits, and after SIGKILL the
restarted broker replays `__consumer_offsets`: the group is Stable in the same generation, its
member keeps heartbeating without a rebalance, and the committed offsets read back."""
from __future__ import annotations

from typing import Any

import pytest

from segment_format import batch_body, record
from client import Admin
from broker.coordinator.group_records import OFFSETS_TOPIC, partition_for
from common.errors import NONE, InvalidTopicError, MemberIdRequiredError, error_for_code
from protocol import Message, RequestMessage
from protocol.consumer_protocol import Assignment, Subscription
from protocol.messages import (
    DeleteTopicsRequest,
    ProducePartition,
    ProduceRequest,
    TopicRef,
    TopicRequest,
)
from protocol.messages.group import (
    DescribeGroupsRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    ListGroupsRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
)
from tests.waiting import wait_until

TOPIC = "events"
GROUP_SETTINGS = {"offsets.topic.num.partitions": 3, "group.initial.rebalance.delay.ms": 0,
                  "group.min.session.timeout.ms": 500}


def send(client: Any, request: RequestMessage[Any]) -> Any:
    payload = b"".join(bytes(p) for p in request.payload())  # type: ignore[arg-type]
    control, reply = client.request(request.api_key, request.to_control(), payload)
    assert control["error_code"] == NONE, control
    return request.response_type.from_control(control, memoryview(bytearray(reply)))


def error_type(response: Message) -> type | None:
    err = response.error()  # type: ignore[attr-defined]
    return None if err is None else type(err)


def form_group(client: Any) -> tuple[str, int]:
    """One member that owns partitions 0 and 1 of TOPIC; returns (member id, generation)."""
    found = send(client, FindCoordinatorRequest("g1"))
    assert error_type(found) is None and found.node_id == 0
    join = JoinGroupRequest("g1", 30_000, 30_000, "", None, "consumer",
                            (JoinGroupProtocol("range", Subscription((TOPIC,)).encode()),), "e2e")
    first = send(client, join)
    assert error_type(first) is MemberIdRequiredError and first.member_id
    joined = send(client, _rejoin(join, first.member_id))
    assert error_type(joined) is None and joined.leader == joined.member_id
    synced = send(client, SyncGroupRequest("g1", joined.generation_id, joined.member_id, None, "consumer", "range", (
        SyncGroupAssignment(joined.member_id, Assignment(((TOPIC, 0), (TOPIC, 1))).encode()),)))
    assert error_type(synced) is None
    assert Assignment.decode(synced.assignment).partitions == ((TOPIC, 0), (TOPIC, 1))
    return joined.member_id, joined.generation_id


def _rejoin(join: JoinGroupRequest, member_id: str) -> JoinGroupRequest:
    return JoinGroupRequest(join.group_id, join.session_timeout_ms, join.rebalance_timeout_ms, member_id,
                            join.group_instance_id, join.protocol_type, join.protocols, join.client_id)


def commit(client: Any, member: str, generation: int, offsets: dict[int, int]) -> Any:
    return send(client, OffsetCommitRequest("g1", generation, member, None, (TopicRequest(TOPIC, tuple(
        OffsetCommitPartition(p, o, metadata=f"at {o}") for p, o in offsets.items())),)))


@pytest.fixture
def server(broker_factory):
    broker = broker_factory("groups", **GROUP_SETTINGS).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=3)
    return broker


@pytest.mark.slow
def test_groups_and_offsets_survive_sigkill(server, raw_client) -> None:
    with raw_client(server.port) as client:
        member, generation = form_group(client)
        committed = commit(client, member, generation, {0: 10, 1: 20})
        assert all(p.error_code == NONE for t in committed.topics for p in t.partitions)
        assert commit(client, member, generation, {0: 11}).topics[0].partitions[0].error_code == NONE
        refused = commit(client, member, generation, {2: 5})
        assert refused.topics[0].partitions[0].error().name() == "PARTITION_NOT_ASSIGNED"
    server.kill()
    server.start()
    with raw_client(server.port) as client:
        fetched = send(client, OffsetFetchRequest("g1", None))
        assert {(t.name, p.partition): (p.committed_offset, p.metadata) for t in fetched.topics for p in t.partitions} \
            == {(TOPIC, 0): (11, "at 11"), (TOPIC, 1): (20, "at 20")}
        beat = send(client, HeartbeatRequest("g1", generation, member, None))
        assert error_type(beat) is None  # the replayed group is Stable in the same generation: no rebalance
        described = send(client, DescribeGroupsRequest(("g1",))).groups[0]
        assert described.group_state == "Stable" and [m.member_id for m in described.members] == [member]
        listed = send(client, ListGroupsRequest(()))
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("g1", "Stable")]


@pytest.mark.slow
def test_the_offsets_topic_is_internal(server, raw_client) -> None:
    with raw_client(server.port) as client:
        send(client, FindCoordinatorRequest("any"))
        batch = bytes(record.encode_batch(batch_body.make_body([b"forged"], [b"key"])))
        produced = send(client, ProduceRequest((TopicRequest(OFFSETS_TOPIC, (ProducePartition(0, (batch,)),)),)))
        assert type(produced.topics[0].partitions[0].error()) is InvalidTopicError
        deleted = send(client, DeleteTopicsRequest((TopicRef(OFFSETS_TOPIC),)))
        assert type(error_for_code(deleted.topics[0].error_code)) is InvalidTopicError
    with Admin(server.bootstrap) as admin:
        assert OFFSETS_TOPIC in admin.list_topics()


def partition_bytes(server: Any, partition: int) -> int:
    """Bytes of the partition's segment files; a file the cleaner swaps away while we look is skipped."""
    total = 0
    for path in (server.log_dir / f"{OFFSETS_TOPIC}-{partition}").glob("*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


@pytest.mark.slow
def test_the_log_cleaner_keeps_the_offsets_topic_bounded(broker_factory, raw_client) -> None:
    """Thousands of commits to two keys: the cleaner compacts `__consumer_offsets` so its size stays
    bounded, and after a restart (replay of the compacted log) the offsets are the last commits."""
    server = broker_factory("cleaned", **GROUP_SETTINGS, **{
        "offsets.topic.segment.bytes": 16 << 10, "log.cleaner.backoff.ms": 50,
        "log.cleaner.min.cleanable.ratio": 0.01}).start()
    with Admin(server.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=3)
    partition = partition_for("g1", GROUP_SETTINGS["offsets.topic.num.partitions"])
    with raw_client(server.port) as client:
        member, generation = form_group(client)
        for offset in range(2400):  # ~300 KiB of records: many 16 KiB segments
            commit(client, member, generation, {0: offset, 1: offset + 1})
    wait_until(lambda: partition_bytes(server, partition) <= 64 << 10, 20, "the cleaner compacts the offsets partition")
    server.kill()
    server.start()
    with raw_client(server.port) as client:
        fetched = send(client, OffsetFetchRequest("g1", None))
        assert {(t.name, p.partition): p.committed_offset for t in fetched.topics for p in t.partitions} \
            == {(TOPIC, 0): 2399, (TOPIC, 1): 2400}
