"""One consumer group as its coordinator holds it: state, generation, members (Kafka's
GroupMetadata and MemberMetadata of the classic protocol).

    Empty ──join──▶ PreparingRebalance ──all joined / deadline──▶ CompletingRebalance
      ▲                    ▲     │                                      │ leader's SyncGroup
      │                    │     └──no member left──▶ Empty             ▼ stored
      └──last member gone──┴──────── member joins, leaves, dies ─── Stable
    Dead: deleted (DeleteGroups, or every offset of an empty group expired); never reused.

A member is in the group from its first JoinGroup that was answered until it leaves, is evicted
(session timeout, no rejoin within the rebalance timeout) or is fenced by a newer member with its
group instance id. `awaiting_join` / `awaiting_sync` hold the runtime's tokens of the member's
parked JoinGroup / SyncGroup: those are answered when the rebalance gets that far.

Pure data and small queries; the transitions live in `group_coordinator`.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from broker.coordinator.group_records import CommittedOffset, StoredGroup, StoredMember
from common.errors import InvalidRequestError
from common.topic_partition import TopicPartition
from protocol.consumer_protocol import PROTOCOL_TYPE, Assignment, Subscription


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's preference order
    heartbeat_deadline_ms: int = 0
    assignment: bytes = b""
    owned: frozenset[TopicPartition] | None = None  # the decoded assignment (consumer protocol only)
    # Partitions the last rebalance took from this member: under the cooperative protocol the
    # member revokes them (and commits their offsets) after it learnt its new assignment.
    revoking: frozenset[TopicPartition] = frozenset()
    awaiting_join: Any = None
    awaiting_sync: Any = None
    is_new: bool = True  # joined during the current rebalance: not yet given a generation

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def supports(self, names: set[str]) -> bool:
        return names <= {name for name, _ in self.protocols}

    def same_protocols(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return self.protocols == protocols

    def same_subscription(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        """Whether `protocols` subscribe to what this member's do. For the consumer protocol that
        is the protocol names and each one's topics: the owned partitions and generation a
        cooperative member sends change with every rebalance and say nothing about what it wants."""
        if [name for name, _ in protocols] != [name for name, _ in self.protocols]:
            return False
        if self.protocol_type != PROTOCOL_TYPE:
            return self.protocols == protocols
        try:
            return all(Subscription.decode(mine).topics == Subscription.decode(theirs).topics
                       for (_, mine), (_, theirs) in zip(self.protocols, protocols))
        except InvalidRequestError:
            return self.protocols == protocols

    def take_assignment(self, protocol_type: str | None, assignment: bytes) -> None:
        """The assignment of a new generation; what it no longer holds is being revoked."""
        owned = owned_partitions(protocol_type, assignment)
        self.revoking = self.owned - owned if self.owned is not None and owned is not None else frozenset()
        self.assignment, self.owned = assignment, owned


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp: int = 0  # when the group last changed state (offset expiry of an empty group)
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> deadline (MEMBER_ID_REQUIRED)
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    # Offsets of open transactions, by producer id (Kafka's pendingTransactionalOffsetCommits):
    # stored, invisible to OffsetFetch until the transaction's marker commits them.
    pending_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = field(default_factory=dict)
    join_deadline_ms: int | None = None
    initial_join: bool = False  # the first rebalance of an empty group waits group.initial.rebalance.delay.ms
    sync_deadline_ms: int | None = None

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader is None:
            self.leader = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        return member

    # -- offsets ---------------------------------------------------------------------------------

    def add_pending(self, producer_id: int, offsets: dict[TopicPartition, CommittedOffset]) -> None:
        """A transaction's offsets, stored: they wait for its marker (a later one of the same
        transaction replaces an earlier one per partition)."""
        self.pending_offsets.setdefault(producer_id, {}).update(offsets)

    def end_transaction(self, producer_id: int, committed: bool) -> None:
        """The producer's transaction ended. A commit makes its offsets the committed ones, except
        where an offset written to the log after the transaction's is committed already (Kafka's
        completePendingTxnOffsetCommit: the later record wins); an abort drops them."""
        pending = self.pending_offsets.pop(producer_id, None)
        if not committed or not pending:
            return
        for tp, offset in pending.items():
            current = self.offsets.get(tp)
            if current is None or current.log_order < offset.log_order:
                self.offsets[tp] = offset

    def drop_offsets(self, partitions: list[TopicPartition]) -> None:
        """Tombstones of these partitions were stored: their committed offsets and every open
        transaction's pending ones go (Kafka's new coordinator replays a tombstone so too)."""
        for tp in partitions:
            self.offsets.pop(tp, None)
        for producer_id, pending in list(self.pending_offsets.items()):
            for tp in partitions:
                pending.pop(tp, None)
            if not pending:
                del self.pending_offsets[producer_id]

    def has_pending(self, tp: TopicPartition) -> bool:
        """Whether an open transaction holds an offset of `tp` (OffsetFetch answers it unstable)."""
        return any(tp in pending for pending in self.pending_offsets.values())

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join is not None for m in self.members.values())

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        members = iter(self.members.values())
        first = next(members, None)
        if first is None:
            return set()
        names = {name for name, _ in first.protocols}
        for member in members:
            names &= {name for name, _ in member.protocols}
        return names

    def supports(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        """Whether a member with these protocols may join: same protocol type, and at least one
        protocol in common with every member (Kafka's supportsProtocols)."""
        if not self.members:
            return bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def select_protocol(self) -> str:
        """Of the protocols every member supports, the one most members prefer (Kafka's vote)."""
        candidates = self.candidate_protocols()
        votes = Counter(next(name for name, _ in m.protocols if name in candidates) for m in self.members.values())
        return max(sorted(votes), key=lambda name: votes[name])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol); None when unknown (other protocols)."""
        if self.protocol_type != PROTOCOL_TYPE or self.protocol is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics.update(Subscription.decode(member.metadata(self.protocol)).topics)
            except InvalidRequestError:
                return None
        return topics

    def stored(self) -> StoredGroup:
        return StoredGroup(self.protocol_type, self.generation, self.protocol, self.leader, self.state_timestamp,
                           tuple(StoredMember(m.member_id, m.group_instance_id, m.client_id, m.session_timeout_ms,
                                              m.rebalance_timeout_ms, m.metadata(self.protocol or ""), m.assignment)
                                 for m in self.members.values()))

    @classmethod
    def restored(cls, group_id: str, stored: StoredGroup, replayed: "Group", now_ms: int) -> "Group":
        """A group replayed from its last record: Empty without members, else Stable with the stored
        assignments; its members must heartbeat within their session timeout from now. `replayed`
        holds the offsets (committed and pending) its offset records left."""
        group = cls(group_id, GroupState.STABLE if stored.members else GroupState.EMPTY, stored.state_timestamp,
                    stored.generation, stored.protocol_type, stored.protocol, stored.leader,
                    offsets=replayed.offsets, pending_offsets=replayed.pending_offsets)
        for m in stored.members:
            member = Member(m.member_id, m.group_instance_id, m.client_id, m.session_timeout_ms,
                            m.rebalance_timeout_ms, stored.protocol_type or "", ((stored.protocol or "", m.subscription),),
                            heartbeat_deadline_ms=now_ms + m.session_timeout_ms, assignment=m.assignment,
                            owned=owned_partitions(stored.protocol_type, m.assignment), is_new=False)
            group.add(member)
        group.leader = stored.leader if stored.leader in group.members else next(iter(group.members), None)
        return group


def owned_partitions(protocol_type: str | None, assignment: bytes) -> frozenset[TopicPartition] | None:
    """The partitions a consumer-protocol assignment gives; None for other protocols (opaque)."""
    if protocol_type != PROTOCOL_TYPE:
        return None
    if not assignment:  # a member the leader gave nothing (Kafka sends empty bytes)
        return frozenset()
    return frozenset(Assignment.decode(assignment).partitions)
