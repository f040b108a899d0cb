"""Transactional offsets in the group coordinator, as a pure state machine: TxnOffsetCommit stores
pending offsets, a transaction's marker commits or drops them, replay rebuilds the same, and
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while they are pending."""
from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from broker.coordinator.group_records import decode_record, encode_key, encode_value
from broker.coordinator.results import NO_PRODUCER_ID, Result
from common.errors import (
    CoordinatorLoadInProgressError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InvalidGroupIdError,
    InvalidRequestError,
    KafkaStorageError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
    error_for_code,
)
from protocol.consumer_protocol import Assignment, Subscription
from protocol.messages.base import TopicRequest
from protocol.messages.group import (
    DeleteGroupsRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
)
from protocol.messages.transactions import TxnOffsetCommitRequest

TOPIC = "orders"
PRODUCER, OTHER_PRODUCER = 7, 8
EPOCH = 3
Entry = tuple[str, Any, Any, int]  # ("record", key bytes, value bytes, producer id) or ("marker", pid, committed, -1)


def code_of(response: Any) -> type | None:
    return None if response.error_code == 0 else type(error_for_code(response.error_code))


class Harness:
    """A coordinator leading every partition of `__consumer_offsets`, a log per partition that
    keeps each record's producer id and the markers (so that a second coordinator replays them),
    and appends that succeed unless `fail_appends` is set."""

    def __init__(self, partitions: int = 4, **config: Any) -> None:
        ids = itertools.count()
        self.config = GroupConfig(offsets_partitions=partitions, initial_rebalance_delay_ms=0,
                                  min_session_timeout_ms=1_000, **config)
        self.coordinator = GroupCoordinator(self.config, lambda prefix: f"{prefix or 'member'}-{next(ids)}")
        for p in range(partitions):
            self.coordinator.begin_load(p)
            self.coordinator.finish_load(p, 0)
        self.now = 0
        self.replies: dict[Any, Any] = {}
        self.log: dict[int, list[Entry]] = {p: [] for p in range(partitions)}
        self.appends: list[Any] = []
        self.fail_appends: Exception | None = None
        self._tokens = itertools.count()

    def apply(self, result: Result) -> None:
        for token, response in result.replies:
            self.replies[token] = response
        for append in result.appends:
            self.appends.append(append)
            if self.fail_appends is not None:
                self.apply(append.complete(self.fail_appends, self.now))
                continue
            producer_id = NO_PRODUCER_ID if append.producer is None else append.producer[0]
            self.log[append.partition].extend(("record", encode_key(k), encode_value(v), producer_id)
                                              for k, v in append.records)
            self.apply(append.complete(None, self.now))

    def call(self, method: str, request: Any, *extra: Any) -> Any:
        token = next(self._tokens)
        self.apply(getattr(self.coordinator, method)(request, token, self.now, *extra))
        return self.replies[token]

    def txn_commit(self, offsets: dict[int, int], group: str = "g", producer_id: int = PRODUCER,
                   generation: int = -1, member_id: str = "", instance: str | None = None, topic: str = TOPIC,
                   metadata: str | None = "txn", epoch: int = EPOCH) -> Any:
        request = TxnOffsetCommitRequest(f"tx-{producer_id}", group, producer_id, epoch, (TopicRequest(topic, tuple(
            OffsetCommitPartition(p, o, metadata=metadata) for p, o in offsets.items())),), generation, member_id, instance)
        return self.call("commit_txn_offsets", request, lambda t, p: t != "missing")

    def commit(self, offsets: dict[int, int], group: str = "g", generation: int = -1, member_id: str = "") -> Any:
        request = OffsetCommitRequest(group, generation, member_id, None, (TopicRequest(TOPIC, tuple(
            OffsetCommitPartition(p, o) for p, o in offsets.items())),))
        return self.call("commit_offsets", request, lambda t, p: True)

    def marker(self, committed: bool, group: str = "g", producer_id: int = PRODUCER) -> None:
        """The transaction coordinator's marker lands on the group's partition."""
        partition = self.coordinator.partition_of(group)
        self.log[partition].append(("marker", producer_id, committed, -1))
        self.coordinator.end_transaction(partition, producer_id, committed)

    def fetch(self, group: str = "g", partitions: tuple[int, ...] = (0, 1), require_stable: bool = False) -> dict[int, Any]:
        """partition -> committed offset, or the error class when the partition answered one."""
        response = self.coordinator.fetch_offsets(
            OffsetFetchRequest(group, (TopicRequest(TOPIC, partitions),), require_stable))
        assert code_of(response) is None
        return {p.partition: code_of(p) or p.committed_offset for t in response.topics for p in t.partitions}

    def replayed(self) -> GroupCoordinator:
        """A second coordinator that loads every partition from the log, as a new leader does."""
        fresh = GroupCoordinator(self.config)
        for partition, entries in self.log.items():
            fresh.begin_load(partition)
            for kind, first, second, producer_id in entries:
                if kind == "marker":
                    fresh.replay_marker(partition, first, second)
                else:
                    fresh.replay(partition, *decode_record(first, second), producer_id)
            fresh.finish_load(partition, self.now)
        return fresh

    def stable_member(self, group: str = "g", instance: str | None = None) -> tuple[str, int]:
        join = JoinGroupRequest(group, 10_000, 30_000, "", instance, "consumer",
                                (JoinGroupProtocol("range", Subscription(topics=(TOPIC,)).encode()),), "client")
        joined = self.call("join_group", join)
        if instance is None:
            joined = self.call("join_group", JoinGroupRequest(group, 10_000, 30_000, joined.member_id, None, "consumer",
                                                              join.protocols, "client"))
        member = joined.member_id
        assignment = Assignment(partitions=((TOPIC, 0), (TOPIC, 1))).encode()
        synced = self.call("sync_group", SyncGroupRequest(group, joined.generation_id, member, instance, "consumer",
                                                          "range", (SyncGroupAssignment(member, assignment),)))
        assert code_of(synced) is None
        return member, joined.generation_id


def test_txn_offsets_stay_pending_until_the_commit_marker() -> None:
    """Offsets of an open transaction are invisible; require_stable says UNSTABLE for their
    partitions only; the commit marker makes them the committed offsets."""
    h = Harness()
    h.commit({0: 10, 1: 11})
    answer = h.txn_commit({0: 20})
    assert code_of(answer) is None and code_of(answer.topics[0].partitions[0]) is None
    assert h.fetch() == {0: 10, 1: 11}
    assert h.fetch(require_stable=True) == {0: UnstableOffsetCommitError, 1: 11}
    h.marker(committed=True)
    assert h.fetch() == h.fetch(require_stable=True) == {0: 20, 1: 11}
    assert h.coordinator.groups["g"].offsets[(TOPIC, 0)].metadata == "txn"


def test_the_abort_marker_drops_the_pending_offsets() -> None:
    """An aborted transaction's offsets never become visible; the old committed offset stays."""
    h = Harness()
    h.commit({0: 10})
    h.txn_commit({0: 20, 1: 21})
    h.marker(committed=False)
    assert h.fetch(require_stable=True) == {0: 10, 1: -1}
    assert not h.coordinator.groups["g"].pending_offsets
    h.marker(committed=True)  # a later marker of the producer has nothing of that transaction to commit
    assert h.fetch() == {0: 10, 1: -1}


def test_the_offsets_are_one_transactional_batch_of_the_producer() -> None:
    """One append, carrying the producer id and epoch: the runtime writes it as the producer's
    transactional batch, which the marker then ends."""
    h = Harness()
    h.txn_commit({0: 20, 1: 21})
    [append] = h.appends
    assert append.producer == (PRODUCER, EPOCH) and len(append.records) == 2
    h.commit({0: 5})
    assert h.appends[-1].producer is None


def test_a_marker_ends_its_producer_s_transaction_in_every_group_of_its_partition_only() -> None:
    """The marker commits the producer's offsets of each group of that partition; another
    producer's pending offsets, and a group on another partition, wait for their own markers."""
    h = Harness(partitions=1)
    h.txn_commit({0: 1}, group="a")
    h.txn_commit({0: 2}, group="b")
    h.txn_commit({1: 3}, group="a", producer_id=OTHER_PRODUCER)
    h.marker(committed=True, group="a")
    assert h.fetch("a") == {0: 1, 1: -1} and h.fetch("b") == {0: 2, 1: -1}
    assert h.fetch("a", require_stable=True)[1] is UnstableOffsetCommitError
    two = Harness(partitions=2)
    groups = {two.coordinator.partition_of(g): g for g in ("a", "b", "c", "d")}
    assert len(groups) == 2
    first, second = groups[0], groups[1]
    two.txn_commit({0: 1}, group=first)
    two.txn_commit({0: 2}, group=second)
    two.marker(committed=True, group=first)
    assert two.fetch(first) == {0: 1, 1: -1} and two.fetch(second) == {0: -1, 1: -1}


def test_an_offset_committed_after_the_transaction_s_offsets_wins_at_the_commit_marker() -> None:
    """Kafka's rule: a plain commit is visible at once; at the commit marker, the offset whose
    record was written to the log later is the committed one."""
    h = Harness()
    h.commit({1: 100})  # before the transaction's record: the transaction's offset replaces it
    h.txn_commit({0: 20, 1: 21})
    h.commit({0: 30})  # after it: stays
    assert h.fetch() == {0: 30, 1: 100}
    h.marker(committed=True)
    assert h.fetch() == {0: 30, 1: 21}
    assert h.replayed().fetch_offsets(OffsetFetchRequest("g", None)) == h.coordinator.fetch_offsets(
        OffsetFetchRequest("g", None))


def test_a_member_s_txn_commit_must_be_of_the_current_generation() -> None:
    """KIP-447: a producer that sends the consumer's group metadata is fenced as OffsetCommit
    fences (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID); without it (-1, "") the
    commit is taken from any group; an empty group takes generation -1."""
    h = Harness()
    member, generation = h.stable_member()
    assert code_of(h.txn_commit({0: 1}, member_id=member, generation=generation)) is None
    assert code_of(h.txn_commit({0: 1}, member_id=member, generation=generation + 1)) is IllegalGenerationError
    assert code_of(h.txn_commit({0: 1}, member_id="ghost", generation=generation)) is UnknownMemberIdError
    assert code_of(h.txn_commit({0: 1})) is None
    static, static_generation = h.stable_member("s", instance="i-1")
    assert code_of(h.txn_commit({0: 1}, group="s", member_id="old-id", generation=static_generation,
                                instance="i-1")) is FencedInstanceIdError
    assert code_of(h.txn_commit({0: 1}, group="s", member_id=static, generation=static_generation,
                                instance="i-1")) is None
    assert code_of(h.txn_commit({0: 1}, group="new", member_id="m", generation=1)) is UnknownMemberIdError
    assert code_of(h.txn_commit({0: 1}, group="empty")) is None


@pytest.mark.parametrize("field, value, error", [
    ("producer_id", -1, InvalidRequestError),
    ("producer_epoch", -1, InvalidRequestError),
    ("producer_epoch", 1 << 15, InvalidRequestError),
    ("transactional_id", "", InvalidRequestError),
    ("group_id", "", InvalidGroupIdError),
], ids=["no-producer-id", "negative-epoch", "epoch-past-int16", "no-transactional-id", "no-group-id"])
def test_a_txn_commit_no_transaction_can_send_is_refused_whole(field: str, value: Any, error: type) -> None:
    """Fields the batch header or the group cannot hold are refused before anything is stored."""
    h = Harness()
    fields = dict(transactional_id="tx", group_id="g", producer_id=PRODUCER, producer_epoch=EPOCH,
                  topics=(TopicRequest(TOPIC, (OffsetCommitPartition(0, 1),)),))
    fields[field] = value
    assert code_of(h.call("commit_txn_offsets", TxnOffsetCommitRequest(**fields), lambda t, p: True)) is error
    assert not h.appends


def test_partitions_are_checked_as_offset_commit_checks_them() -> None:
    """An unknown partition or oversized metadata is refused per partition; the rest is stored."""
    h = Harness(offset_metadata_max_bytes=8)
    answer = h.txn_commit({0: 1}, topic="missing")
    assert code_of(answer.topics[0].partitions[0]) is UnknownTopicOrPartitionError and not h.appends
    answer = h.txn_commit({0: 1}, metadata="x" * 9)
    assert code_of(answer.topics[0].partitions[0]) is OffsetMetadataTooLargeError and not h.appends


def test_a_partition_not_led_or_loading_refuses_txn_commits() -> None:
    """NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS as for every group request."""
    coordinator = GroupCoordinator(GroupConfig(offsets_partitions=2))
    request = TxnOffsetCommitRequest("tx", "g", PRODUCER, EPOCH, (TopicRequest(TOPIC, (OffsetCommitPartition(0, 1),)),))
    answer = coordinator.commit_txn_offsets(request, "t", 0, lambda t, p: True).replies[0][1]
    assert code_of(answer) is NotCoordinatorError
    coordinator.begin_load(coordinator.partition_of("g"))
    answer = coordinator.commit_txn_offsets(request, "t", 0, lambda t, p: True).replies[0][1]
    assert code_of(answer) is CoordinatorLoadInProgressError


def test_a_failed_append_leaves_nothing_pending() -> None:
    """The offsets are pending only once stored: a failed append answers its error and changes nothing."""
    h = Harness()
    h.fail_appends = KafkaStorageError("disk gone")
    answer = h.txn_commit({0: 20})
    assert code_of(answer.topics[0].partitions[0]) is KafkaStorageError
    assert "g" not in h.coordinator.groups or not h.coordinator.groups["g"].pending_offsets


def test_replay_rebuilds_pending_committed_and_aborted_offsets() -> None:
    """A new coordinator replaying the log answers as the old one did, require_stable included,
    and a marker landing after the replay ends the transaction the replay left open."""
    h = Harness(partitions=1)
    h.commit({0: 10, 1: 11})
    h.txn_commit({0: 20})
    h.marker(committed=True)
    h.txn_commit({1: 21})
    h.marker(committed=False)
    h.txn_commit({1: 31}, producer_id=OTHER_PRODUCER)  # still open
    fresh = h.replayed()
    for coordinator in (h.coordinator, fresh):
        stable = coordinator.fetch_offsets(OffsetFetchRequest("g", (TopicRequest(TOPIC, (0, 1)),), True))
        assert [code_of(p) or p.committed_offset for p in stable.topics[0].partitions] == [20, UnstableOffsetCommitError]
    h.coordinator = fresh
    h.marker(committed=True, producer_id=OTHER_PRODUCER)
    assert h.fetch(require_stable=True) == {0: 20, 1: 31}


def test_a_marker_stored_while_the_partition_loads_applies_after_the_replay() -> None:
    """The runtime appends no record to a loading partition, but a marker can land there: it
    waits for the replay to end instead of being lost (or applied before the records it ends)."""
    h = Harness(partitions=1)
    h.txn_commit({0: 20})
    fresh = GroupCoordinator(h.config)
    fresh.begin_load(0)
    fresh.end_transaction(0, PRODUCER, True)  # lands before the replay reached the record
    for kind, key, value, producer_id in h.log[0]:
        fresh.replay(0, *decode_record(key, value), producer_id)
    fresh.finish_load(0, 0)
    assert fresh.groups["g"].offsets[(TOPIC, 0)].offset == 20 and not fresh.groups["g"].pending_offsets


def test_expiry_leaves_pending_offsets_and_their_group_until_the_marker() -> None:
    """Kafka: a partition with pending offsets does not expire, nor does a group with pending
    offsets go with its expired ones; once the transaction ends they expire as any."""
    h = Harness(offsets_retention_ms=1_000)
    h.commit({0: 10, 1: 11})
    h.txn_commit({0: 20})
    h.now = 5_000
    h.apply(h.coordinator.expire_offsets(h.now))
    group = h.coordinator.groups["g"]
    assert h.fetch() == {0: 10, 1: -1} and group.pending_offsets
    h.marker(committed=False)
    h.apply(h.coordinator.expire_offsets(h.now))
    assert "g" not in h.coordinator.groups
    h.txn_commit({0: 20}, group="pending-only")
    h.apply(h.coordinator.expire_offsets(h.now + 10_000))
    assert h.coordinator.groups["pending-only"].pending_offsets


def test_deleting_a_group_drops_its_pending_offsets_for_good() -> None:
    """DeleteGroups writes tombstones for pending partitions too (Kafka's deleteAllOffsets): the
    later commit marker brings nothing back, live or replayed."""
    h = Harness()
    h.commit({0: 10})
    h.txn_commit({0: 20, 1: 21})
    deleted = h.call("delete_groups", DeleteGroupsRequest(("g",)))
    assert code_of(deleted.results[0]) is None
    h.marker(committed=True)
    assert "g" not in h.coordinator.groups
    assert "g" not in h.replayed().groups
