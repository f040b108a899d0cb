"""Group handler: the group APIs, answered by the `GroupCoordinator` state machine running on the
coordinator runtime (docs/architecture.md, Coordinator).

The runtime (`broker.coordinator.runtime`) loads, replays and unloads the partitions of
`__consumer_offsets` this broker leads, appends the records the coordinator returns and drives
its timers. What is left here is the groups' own business: FindCoordinator (which creates
`__consumer_offsets` on first use, compacted, `offsets.topic.num.partitions` partitions, as
Kafka does), each request handed to the coordinator with its token and the time, offset expiry
(`offsets.retention.check.interval.ms`), the offsets of deleted topics, and transactional
offsets (TxnOffsetCommit), pending until the transaction's marker lands on the group's partition
(`on_transaction_marker`).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from broker.coordinator.group_metadata import Group
from broker.coordinator.group_records import OFFSETS_TOPIC, GroupRecordSerde, RecordKey, RecordValue, check_group_id
from broker.coordinator.runtime import CoordinatorRuntime
from broker.handlers.internal_topic import InternalTopic
from broker.handlers.slices import answer_in_slices
from broker.replica_manager import ReplicaManager
from common.errors import CoordinatorNotAvailableError, InvalidRequestError, PymqError
from protocol.messages.base import Message, code_and_message
from protocol.messages.group import (
    GROUP_KEY_TYPE,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
)
from protocol.messages.transactions import TxnOffsetCommitRequest

log = logging.getLogger("pymq.group_handler")


class GroupHandler:
    """Loop-local: call from the event-loop thread only. `runtime` is started and stopped by the
    server (with every coordinator runtime: `RequestHandlers.coordinators`)."""

    def __init__(self, config: BrokerConfig, registry: TopicRegistry, replicas: ReplicaManager, create_topic: Any,
                 advertised: Callable[[], tuple[str, int]],
                 address_of: Callable[[int], tuple[str, int] | None] = lambda broker: None) -> None:
        self.config = config
        self.advertised = advertised  # this broker's host and port
        self.address_of = address_of  # another broker's host and port (a coordinator elsewhere)
        self.registry = registry
        self.broker_id: int = config["broker.id"]
        self.coordinator = GroupCoordinator(GroupConfig.of(config))
        self.runtime: CoordinatorRuntime[RecordKey, RecordValue] = CoordinatorRuntime(
            "group", OFFSETS_TOPIC, self.coordinator, GroupRecordSerde(), replicas, replicas.executors.group_load)
        self.runtime.every("offset-expiry", config["offsets.retention.check.interval.ms"] / 1000,
                           self.coordinator.expire_offsets)
        self.offsets_topic = InternalTopic(
            OFFSETS_TOPIC, registry, create_topic, config["offsets.topic.num.partitions"],
            {"cleanup.policy": "compact", "segment.bytes": config["offsets.topic.segment.bytes"]},
            "offsets.topic.replication.factor", self.runtime.loaded)
        replicas.deletion_listeners.append(self.on_topic_deleted)

    def live_groups(self) -> list[Group]:
        """The groups this broker coordinates (what the group metrics count)."""
        return self.coordinator.live_groups()

    def on_topic_deleted(self, topic: str) -> None:
        """Drop what this broker's groups committed for a deleted topic: a topic re-created under
        the same name is another topic, and an old offset would make its consumers skip records."""
        self.runtime.apply(self.coordinator.delete_topic_offsets(topic))

    # -- requests ----------------------------------------------------------------------------------

    async def find_coordinator(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
        try:
            if request.key_type != GROUP_KEY_TYPE:
                raise InvalidRequestError("transaction coordinators arrive with transactions (key_type 1)")
            check_group_id(request.key)
            await self.offsets_topic.ensure()
            partition = self.coordinator.partition_of(request.key)
            leader = self.registry.get(OFFSETS_TOPIC).partitions[partition].leader
            address = self.advertised() if leader == self.broker_id else self.address_of(leader)
            if address is None:
                raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC}-{partition} has no live leader (broker {leader})")
        except PymqError as err:
            return FindCoordinatorResponse(*code_and_message(err))
        host, port = address
        return FindCoordinatorResponse(node_id=leader, host=host, port=port)

    def join_group(self, request: JoinGroupRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.join_group(request, token, now))

    def sync_group(self, request: SyncGroupRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.sync_group(request, token, now))

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return self.coordinator.heartbeat(request, self.runtime.clock())

    def leave_group(self, request: LeaveGroupRequest) -> LeaveGroupResponse:
        response, effects = self.coordinator.leave_group(request, self.runtime.clock())
        self.runtime.apply(effects)
        return response

    def offset_commit(self, request: OffsetCommitRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(
            lambda token, now: self.coordinator.commit_offsets(request, token, now, self._partition_exists))

    def offset_fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        return self.coordinator.fetch_offsets(request)

    def offset_delete(self, request: OffsetDeleteRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.delete_offsets(request, token, now))

    def list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        return self.coordinator.list_groups(request)

    def describe_groups(self, request: DescribeGroupsRequest) -> DescribeGroupsResponse | Awaitable[DescribeGroupsResponse]:
        """Many groups are described in slices (`answer_in_slices`): each is as it was at its turn."""
        return answer_in_slices(request.groups, self.coordinator.describe_group,
                                lambda groups: DescribeGroupsResponse(tuple(groups)))

    def delete_groups(self, request: DeleteGroupsRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.delete_groups(request, token, now))

    def txn_offset_commit(self, request: TxnOffsetCommitRequest) -> Message | Awaitable[Message]:
        """A transactional producer's offsets: stored now, pending until its transaction's marker."""
        return self.runtime.call(
            lambda token, now: self.coordinator.commit_txn_offsets(request, token, now, self._partition_exists))

    def on_transaction_marker(self, topic: str, partition: int, producer_id: int, committed: bool) -> None:
        """A transaction's marker was stored on a partition led here (TransactionHandler's
        marker listener): on `__consumer_offsets`, the producer's pending offsets there are
        committed or dropped."""
        if topic == OFFSETS_TOPIC:
            self.coordinator.end_transaction(partition, producer_id, committed)

    def _partition_exists(self, topic: str, partition: int) -> bool:
        info = self.registry.topics.get(topic)
        return info is not None and 0 <= partition < info.partition_count
