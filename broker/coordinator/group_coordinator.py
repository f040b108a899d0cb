"""The group coordinator: Kafka's classic consumer group protocol as a pure state machine.

Requests and timer ticks go in with the time; `Result`s come out (`results`): replies to send,
and records for `__consumer_offsets` (`group_records`) with what to do once they are stored. No
I/O, no clock, no event loop: it is a `runtime.StateMachine`, and the `CoordinatorRuntime`
appends the records and replays them when it takes over a partition of the topic, so state
survives restarts and moves with partition leadership in a cluster unchanged.

Membership (see `group_metadata` for the states):
- JoinGroup. A new dynamic member first gets MEMBER_ID_REQUIRED with an id to rejoin with
  (KIP-394: a client that times out never leaves a ghost member). A join that changes the group
  (a new member, new protocol metadata, the leader rejoining) starts a rebalance; the rebalance
  completes when every member rejoined, or at the rebalance deadline (the largest
  `rebalance_timeout_ms`, the consumer's max.poll.interval.ms) without those that did not. The
  first rebalance of an empty group waits `group.initial.rebalance.delay.ms` for more members.
  Each completed rebalance is a new generation: the leader gets every member's metadata, assigns,
  and sends the assignments with its SyncGroup; they are stored, then every member gets its own.
- Static members (`group.instance.id`, KIP-345): a member that restarts with the same instance id
  takes over its old member id's place and assignment without a rebalance; the old one is
  fenced (FENCED_INSTANCE_ID).
- Heartbeats keep a member; one silent for its session timeout is removed and the group
  rebalances. The broker bounds session timeouts by group.min/max.session.timeout.ms.
- Stale members are fenced: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS.

Offsets: commits from the current generation's members (or, for a group without members, from
anyone: generation -1), each partition checked against the member's assignment for the consumer
protocol (PARTITION_NOT_ASSIGNED); they apply once stored. Empty groups' offsets expire after
offsets.retention.minutes counted from when the group became empty (standalone commits: from the
commit), and a group left without offsets is removed (KIP-211).

Transactional offsets (TxnOffsetCommit, KIP-98/KIP-447): a transactional producer commits its
consumer group's offsets inside its transaction. The coordinator checks them as an OffsetCommit
(group id, partitions that exist, metadata size; no assignment check, as Kafka), and, when the
request names a generation or member (KIP-447), that they are the group's current ones; without
them (generation -1, member "") any group takes them. They are stored as ONE transactional
batch of the producer (its id and epoch) and are then PENDING: kept per producer id in the group
(`Group.pending_offsets`), invisible to OffsetFetch. The transaction coordinator ends the
transaction with a marker on the group's `__consumer_offsets` partition; when it lands
(`end_transaction`, also replayed from the log) a commit makes the producer's pending offsets of
every group of that partition the committed ones, an abort drops them. A plain OffsetCommit of a
partition with pending offsets is visible at once; at the commit marker, whichever offset was
written to the log later wins (Kafka's completePendingTxnOffsetCommit; `CommittedOffset.log_order`).
OffsetFetch with `require_stable` answers UNSTABLE_OFFSET_COMMIT for a partition with pending
offsets (the client retries); without it, the committed offset as before.

What else does with pending offsets (Kafka's new coordinator, OffsetMetadataManager, does the same):
- Offset expiry leaves a partition with pending offsets alone until their marker, and a group
  with pending offsets is not removed with its expired ones.
- DeleteGroups, OffsetDelete and a deleted topic write tombstones for the partitions' committed
  AND pending offsets: a tombstone drops both, live and on replay, so a later commit marker
  brings nothing back (Kafka's deleteAllOffsets deletes the pending transactional offsets too).
- Bounds: pending offsets meet the checks committed ones do (a partition that exists, metadata
  within offset.metadata.max.bytes), and one producer holds at most one pending offset per
  partition per group (a later TxnOffsetCommit of its transaction replaces it). A transaction that
  never ends is timed out and aborted by its transaction coordinator, whose abort marker drops
  its offsets. Not verified: that the producer id is in a transaction that holds the group's
  partition (Kafka verifies it with the transaction coordinator since KIP-890).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from broker.config import BrokerConfig
from broker.coordinator.group_metadata import Group, GroupState, Member, owned_partitions
from broker.coordinator.group_records import (
    CommittedOffset,
    GroupKey,
    OffsetKey,
    RecordKey,
    RecordValue,
    StoredGroup,
    check_group_id,
    partition_for,
)
from broker.coordinator.results import NO_PRODUCER_ID, Append, Result
from broker.coordinator.transaction_records import check_transactional_id
from common.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    CorruptMessageError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupSubscribedToTopicError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    MemberIdRequiredError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    PartitionNotAssignedError,
    PymqError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
)
from common.topic_partition import TopicPartition
from protocol.messages.base import PartitionResponse, TopicRequest, TopicResponse, code_and_message
from protocol.messages.group import (
    DeletedGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupMemberResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from protocol.messages.transactions import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from segment_format.limits import INT64_MAX

log = logging.getLogger("pymq.group_coordinator")

PartitionExists = Callable[[str, int], bool]
INT16_MAX = 2**15 - 1  # a record batch header's producer_epoch is an int16
OpenTransactions = dict[int, set[str]]  # producer id -> the groups its open transaction has offsets in


@dataclass(slots=True)
class _Replay:
    """What the replay of one partition built so far. `groups` hold only the offsets (committed
    and pending) until `finish_load` makes them groups; `markers` are those stored on the
    partition while it loaded (after every replayed record: see `end_transaction`)."""

    stored: dict[str, StoredGroup | None] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    open_transactions: OpenTransactions = field(default_factory=dict)
    markers: list[tuple[int, bool]] = field(default_factory=list)


def _end_transaction(groups: dict[str, Group], open_transactions: OpenTransactions, producer_id: int,
                     committed: bool) -> None:
    """Commit or abort `producer_id`'s pending offsets in the groups of one partition."""
    for group_id in open_transactions.pop(producer_id, ()):
        group = groups.get(group_id)
        if group is not None:
            group.end_transaction(producer_id, committed)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The broker configs the coordinator obeys (Kafka's names in `of`)."""

    offsets_partitions: int = 50
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 86_400_000
    offset_metadata_max_bytes: int = 4096

    @classmethod
    def of(cls, config: BrokerConfig) -> "GroupConfig":
        return cls(config["offsets.topic.num.partitions"], config["group.min.session.timeout.ms"],
                   config["group.max.session.timeout.ms"], config["group.initial.rebalance.delay.ms"],
                   config["group.max.size"], config["offsets.retention.minutes"] * 60_000,
                   config["offset.metadata.max.bytes"])


def _new_member_id(prefix: str) -> str:
    return f"{prefix or 'member'}-{uuid.uuid4()}"


class GroupCoordinator:
    """The groups of the `__consumer_offsets` partitions this broker leads. Loop-local."""

    def __init__(self, config: GroupConfig, new_member_id: Callable[[str], str] = _new_member_id) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        self._new_member_id = new_member_id
        self._partitions: dict[int, bool] = {}  # partition -> loaded (False while its records replay)
        self._loading: dict[int, _Replay] = {}
        self._open_transactions: dict[int, OpenTransactions] = {}  # by partition of __consumer_offsets
        # Numbers offset records in the order they go to the log (appended or replayed): see
        # CommittedOffset.log_order. One counter: its next() is atomic, replays run on a pool.
        self._log_order = itertools.count()
        self._timers: list[tuple[int, str]] = []  # heap of (deadline, group id); stale entries skipped
        self._scheduled: dict[str, int] = {}  # group id -> the deadline its live heap entry has

    # -- partitions of __consumer_offsets --------------------------------------------------------

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.config.offsets_partitions)

    def begin_load(self, partition: int) -> None:
        """This broker became the leader of `partition`: its groups answer
        COORDINATOR_LOAD_IN_PROGRESS until `finish_load`, after every `replay`."""
        self._partitions[partition] = False
        self._loading[partition] = _Replay()

    def replay(self, partition: int, key: RecordKey, value: RecordValue, producer_id: int) -> None:
        """One record of the partition, in offset order: the latest per key wins, a tombstone
        erases (an offset's pending ones too); an offset of a transactional batch (`producer_id`
        not -1) is pending until its producer's marker."""
        replay = self._loading[partition]
        if isinstance(key, GroupKey):
            replay.stored[key.group_id] = value  # type: ignore[assignment]
            return
        group = replay.groups.get(key.group_id)
        if group is None:
            group = replay.groups[key.group_id] = Group(key.group_id)
        tp = (key.topic, key.partition)
        if value is None:
            group.drop_offsets([tp])
            return
        if not isinstance(value, CommittedOffset):
            raise CorruptMessageError(f"the offset record of group {key.group_id!r} {key.topic}-{key.partition} "
                                      f"holds a group's metadata")
        offset = replace(value, log_order=next(self._log_order))
        if producer_id == NO_PRODUCER_ID:
            group.offsets[tp] = offset
        else:
            group.add_pending(producer_id, {tp: offset})
            replay.open_transactions.setdefault(producer_id, set()).add(key.group_id)

    def replay_marker(self, partition: int, producer_id: int, committed: bool) -> None:
        """A transaction's marker, in offset order with the records: the producer's offsets
        replayed so far are committed or dropped."""
        replay = self._loading[partition]
        _end_transaction(replay.groups, replay.open_transactions, producer_id, committed)

    def finish_load(self, partition: int, now_ms: int) -> None:
        replay = self._loading.pop(partition)
        for producer_id, committed in replay.markers:
            _end_transaction(replay.groups, replay.open_transactions, producer_id, committed)
        for group_id in replay.stored.keys() | replay.groups.keys():
            value, replayed = replay.stored.get(group_id), replay.groups.get(group_id, Group(group_id))
            if value is not None:
                group = Group.restored(group_id, value, replayed, now_ms)
            elif replayed.offsets or replayed.pending_offsets:
                group = replayed
                group.state_timestamp = now_ms
            else:
                continue  # deleted
            self.groups[group_id] = group
            self._schedule(group)
        self._open_transactions[partition] = replay.open_transactions
        self._partitions[partition] = True
        log.info("loaded %d groups of %s partition %d", sum(self.partition_of(g) == partition for g in self.groups),
                 "__consumer_offsets", partition)

    def unload(self, partition: int) -> Result:
        """This broker no longer leads `partition`: its groups go (their new coordinator replays
        them), and requests parked on them are told NOT_COORDINATOR so that members find it."""
        self._partitions.pop(partition, None)
        self._loading.pop(partition, None)
        self._open_transactions.pop(partition, None)
        result = Result()
        err = NotCoordinatorError(f"__consumer_offsets partition {partition} moved")
        for group_id in [g for g in self.groups if self.partition_of(g) == partition]:
            group = self.groups.pop(group_id)
            for member in group.members.values():
                result.add(self._fail_parked(member, err))
        return result

    def live_groups(self) -> list[Group]:
        """The groups of the partitions this broker leads, but those being deleted. Safe to call
        from another thread (the metrics server's): it iterates over a copy."""
        return [g for g in list(self.groups.values()) if not g.is_(GroupState.DEAD)]

    def owns(self, group_id: str) -> bool:
        return self._partitions.get(self.partition_of(group_id)) is True

    def _check(self, group_id: str) -> None:
        check_group_id(group_id)
        loaded = self._partitions.get(self.partition_of(group_id))
        if loaded is None:
            raise NotCoordinatorError(f"this broker does not coordinate group {group_id!r}")
        if not loaded:
            raise CoordinatorLoadInProgressError(f"the state of group {group_id!r} is still being loaded")

    # -- JoinGroup ---------------------------------------------------------------------------------

    def join_group(self, request: JoinGroupRequest, token: Any, now_ms: int) -> Result:
        try:
            self._check(request.group_id)
            self._check_join(request)
            group = self.groups.get(request.group_id)
            if group is None and request.member_id:
                raise UnknownMemberIdError(f"group {request.group_id!r} has no member {request.member_id!r}")
            if group is not None and group.is_(GroupState.DEAD):
                raise CoordinatorNotAvailableError(f"group {request.group_id!r} is being deleted")
            protocols = tuple((p.name, p.metadata) for p in request.protocols)
            if group is not None and not group.supports(request.protocol_type, protocols):
                raise InconsistentGroupProtocolError(
                    f"protocol type {request.protocol_type!r} / protocols {[n for n, _ in protocols]} do not match "
                    f"group {request.group_id!r}")
            if group is None:
                group = self.groups[request.group_id] = Group(request.group_id, state_timestamp=now_ms)
            if not request.member_id:
                return self._join_new(group, request, protocols, token, now_ms)
            return self._join_known(group, request, protocols, token, now_ms)
        except PymqError as err:
            return Result.reply(token, JoinGroupResponse(*code_and_message(err), member_id=request.member_id))

    def _check_join(self, request: JoinGroupRequest) -> None:
        low, high = self.config.min_session_timeout_ms, self.config.max_session_timeout_ms
        if not low <= request.session_timeout_ms <= high:
            raise InvalidSessionTimeoutError(
                f"session.timeout.ms {request.session_timeout_ms} is outside the broker's bounds "
                f"[{low}, {high}] (group.min/max.session.timeout.ms)")
        if not request.protocol_type or not request.protocols:
            raise InconsistentGroupProtocolError("a join names a protocol type and at least one protocol")

    @staticmethod
    def _rebalance_timeout(request: JoinGroupRequest) -> int:
        return request.rebalance_timeout_ms if request.rebalance_timeout_ms >= 0 else request.session_timeout_ms

    def _join_new(self, group: Group, request: JoinGroupRequest, protocols: tuple[tuple[str, bytes], ...],
                  token: Any, now_ms: int) -> Result:
        instance = request.group_instance_id
        if instance is not None and instance in group.static_members:
            return self._replace_static(group, request, protocols, token, now_ms)
        if len(group.members) + len(group.pending_members) >= self.config.max_size:
            raise GroupMaxSizeReachedError(f"group {group.group_id!r} has {self.config.max_size} members (group.max.size)")
        member_id = self._new_member_id(instance or request.client_id)
        if instance is not None:  # static members get their id at once: they rejoin with it anyway
            return self._add_member(group, member_id, request, protocols, token, now_ms)
        group.pending_members[member_id] = now_ms + request.session_timeout_ms
        self._schedule(group)
        err = MemberIdRequiredError("rejoin with the member id this response carries")
        return Result.reply(token, JoinGroupResponse(*code_and_message(err), member_id=member_id))

    def _join_known(self, group: Group, request: JoinGroupRequest, protocols: tuple[tuple[str, bytes], ...],
                    token: Any, now_ms: int) -> Result:
        if request.member_id in group.pending_members:
            del group.pending_members[request.member_id]
            return self._add_member(group, request.member_id, request, protocols, token, now_ms)
        member = self._member(group, request.member_id, request.group_instance_id)
        changed = not member.same_protocols(protocols)
        if group.is_(GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and not changed and (
                group.is_(GroupState.COMPLETING_REBALANCE) or member.member_id != group.leader):
            # Nothing changes: the member missed the answer to its join; give it again.
            return Result.reply(token, self._join_response(group, member))
        result = Result()
        if member.awaiting_join is not None:  # the client gave up on its earlier join and retried
            result.add(Result.reply(member.awaiting_join, JoinGroupResponse(
                *code_and_message(RebalanceInProgressError("superseded by a newer join")), member_id=member.member_id)))
        member.protocols = protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = self._rebalance_timeout(request)
        member.awaiting_join = token
        return result.add(self._prepare_rebalance(group, now_ms, f"member {member.member_id} rejoined"))

    def _add_member(self, group: Group, member_id: str, request: JoinGroupRequest,
                    protocols: tuple[tuple[str, bytes], ...], token: Any, now_ms: int) -> Result:
        member = Member(member_id, request.group_instance_id, request.client_id, request.session_timeout_ms,
                        self._rebalance_timeout(request), request.protocol_type, protocols,
                        heartbeat_deadline_ms=now_ms + request.session_timeout_ms, awaiting_join=token)
        group.add(member)
        if group.is_(GroupState.PREPARING_REBALANCE) and group.initial_join and group.join_deadline_ms is not None:
            # Kafka's InitialDelayedJoin: each new member waits one more delay, up to the rebalance timeout.
            group.join_deadline_ms = min(now_ms + self.config.initial_rebalance_delay_ms,
                                         group.state_timestamp + member.rebalance_timeout_ms)
            self._schedule(group)
        return self._prepare_rebalance(group, now_ms, f"member {member_id} joined")

    def _replace_static(self, group: Group, request: JoinGroupRequest, protocols: tuple[tuple[str, bytes], ...],
                        token: Any, now_ms: int) -> Result:
        """A static member restarted: the new member id takes the old one's place (and, in a stable
        group with unchanged metadata, its assignment, without a rebalance); the old is fenced."""
        instance = request.group_instance_id
        assert instance is not None
        old_id = group.static_members[instance]
        old = group.members[old_id]
        new_id = self._new_member_id(instance)
        result = self._fail_parked(old, FencedInstanceIdError(f"group instance {instance!r} rejoined as {new_id}"))
        del group.members[old_id]
        member = replace(old, member_id=new_id, client_id=request.client_id, awaiting_join=None, awaiting_sync=None,
                         session_timeout_ms=request.session_timeout_ms,
                         rebalance_timeout_ms=self._rebalance_timeout(request),
                         heartbeat_deadline_ms=now_ms + request.session_timeout_ms)
        group.members[new_id] = member
        group.static_members[instance] = new_id
        if group.leader == old_id:
            group.leader = new_id
        self._schedule(group)
        if group.is_(GroupState.STABLE) and member.same_subscription(protocols):
            # Stored again so that a coordinator restart knows the new member id.
            response = self._join_response(group, member, skip_assignment=True)
            append = self._store(group, now_ms, lambda err, now: Result.reply(
                token, response if err is None else JoinGroupResponse(*code_and_message(err), member_id=new_id)))
            return result.add(Result(appends=[append]))
        member.protocols = protocols
        member.awaiting_join = token
        return result.add(self._prepare_rebalance(group, now_ms, f"static member {instance} rejoined"))

    def _join_response(self, group: Group, member: Member, skip_assignment: bool = False) -> JoinGroupResponse:
        is_leader = member.member_id == group.leader
        members = tuple(JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(group.protocol or ""))
                        for m in group.members.values()) if is_leader else ()
        return JoinGroupResponse(generation_id=group.generation, protocol_type=group.protocol_type,
                                 protocol_name=group.protocol, leader=group.leader or "",
                                 skip_assignment=skip_assignment and is_leader, member_id=member.member_id,
                                 members=members)

    # -- rebalancing -------------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now_ms: int, reason: str) -> Result:
        """Start a rebalance (or, in one already, see whether it can complete)."""
        if group.is_(GroupState.PREPARING_REBALANCE):
            return self._maybe_complete_join(group, now_ms)
        result = Result()
        if group.is_(GroupState.COMPLETING_REBALANCE):
            result.add(self._reset_sync(group, RebalanceInProgressError(f"group {group.group_id!r} rebalances again")))
        initial = group.is_(GroupState.EMPTY) and self.config.initial_rebalance_delay_ms > 0
        group.transition(GroupState.PREPARING_REBALANCE, now_ms)
        group.initial_join = initial
        longest = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.join_deadline_ms = now_ms + (min(self.config.initial_rebalance_delay_ms, longest) if initial else longest)
        log.info("group %s rebalances (generation %d): %s", group.group_id, group.generation, reason)
        self._schedule(group)
        return result.add(self._maybe_complete_join(group, now_ms))

    def _maybe_complete_join(self, group: Group, now_ms: int) -> Result:
        if group.is_(GroupState.PREPARING_REBALANCE) and not group.initial_join and group.all_joined():
            return self._complete_join(group, now_ms)
        return Result()

    def _complete_join(self, group: Group, now_ms: int) -> Result:
        """The next generation: members that did not rejoin are out; the leader gets everyone's
        metadata; each member then syncs to get its assignment."""
        for member in [m for m in group.members.values() if m.awaiting_join is None]:
            log.info("group %s: member %s did not rejoin in time; removed", group.group_id, member.member_id)
            group.remove(member.member_id)
        group.pending_members.clear()
        group.join_deadline_ms, group.initial_join = None, False
        group.generation += 1
        if not group.members:
            group.protocol, group.leader = None, None
            group.transition(GroupState.EMPTY, now_ms)
            self._schedule(group)
            return Result(appends=[self._store(group, now_ms, lambda err, now: Result())])
        group.protocol = group.select_protocol()
        group.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        result = Result()
        for member in group.members.values():
            result.add(Result.reply(member.awaiting_join, self._join_response(group, member)))
            member.awaiting_join, member.is_new = None, False
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        group.sync_deadline_ms = now_ms + max(m.rebalance_timeout_ms for m in group.members.values())
        self._schedule(group)
        log.info("group %s: generation %d with %d members, protocol %s", group.group_id, group.generation,
                 len(group.members), group.protocol)
        return result

    def _reset_sync(self, group: Group, err: PymqError) -> Result:
        result = Result()
        for member in group.members.values():
            if member.awaiting_sync is not None:
                result.add(Result.reply(member.awaiting_sync, SyncGroupResponse(*code_and_message(err))))
                member.awaiting_sync = None
        group.sync_deadline_ms = None
        return result

    def _fail_parked(self, member: Member, err: PymqError) -> Result:
        result = Result()
        if member.awaiting_join is not None:
            result.add(Result.reply(member.awaiting_join, JoinGroupResponse(*code_and_message(err), member_id=member.member_id)))
        if member.awaiting_sync is not None:
            result.add(Result.reply(member.awaiting_sync, SyncGroupResponse(*code_and_message(err))))
        member.awaiting_join = member.awaiting_sync = None
        return result

    def _remove_members(self, group: Group, member_ids: list[str], err: PymqError, now_ms: int, reason: str) -> Result:
        result = Result()
        for member_id in member_ids:
            member = group.remove(member_id)
            if member is not None:
                result.add(self._fail_parked(member, err))
        if group.is_(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return result.add(self._prepare_rebalance(group, now_ms, reason))
        return result.add(self._maybe_complete_join(group, now_ms))

    # -- SyncGroup ---------------------------------------------------------------------------------

    def sync_group(self, request: SyncGroupRequest, token: Any, now_ms: int) -> Result:
        try:
            self._check(request.group_id)
            group = self._live_group(request.group_id, UnknownMemberIdError)
            member = self._member(group, request.member_id, request.group_instance_id)
            if request.generation_id != group.generation:
                raise IllegalGenerationError(f"generation {request.generation_id} is not the group's {group.generation}")
            if (request.protocol_type is not None and request.protocol_type != group.protocol_type) or (
                    request.protocol_name is not None and request.protocol_name != group.protocol):
                raise InconsistentGroupProtocolError(
                    f"protocol {request.protocol_type}/{request.protocol_name} is not the group's "
                    f"{group.protocol_type}/{group.protocol}")
            if group.is_(GroupState.PREPARING_REBALANCE):
                raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing: rejoin")
            if group.is_(GroupState.EMPTY):
                raise UnknownMemberIdError(f"group {group.group_id!r} has no members")
            if group.is_(GroupState.STABLE):
                return Result.reply(token, self._sync_response(group, member))
            if member.member_id != group.leader:
                member.awaiting_sync = token
                return Result()
            assignments = self._leader_assignments(group, request)
        except PymqError as err:
            return Result.reply(token, SyncGroupResponse(*code_and_message(err)))
        member.awaiting_sync = token
        generation = group.generation
        stored = self._stored_with(group, assignments, now_ms)

        def complete(err: PymqError | None, now: int) -> Result:
            if self.groups.get(group.group_id) is not group or group.generation != generation or not group.is_(
                    GroupState.COMPLETING_REBALANCE):
                return Result()  # superseded by a later rebalance, which answered the parked syncs
            if err is not None:
                return self._reset_sync(group, err).add(self._prepare_rebalance(group, now, f"storing failed: {err}"))
            for member_id, assignment in assignments.items():
                group.members[member_id].take_assignment(group.protocol_type, assignment)
            group.transition(GroupState.STABLE, now)
            group.sync_deadline_ms = None
            self._schedule(group)
            result = Result()
            for m in group.members.values():
                if m.awaiting_sync is not None:
                    result.add(Result.reply(m.awaiting_sync, self._sync_response(group, m)))
                    m.awaiting_sync = None
            return result

        return Result(appends=[Append(self.partition_of(group.group_id), [(GroupKey(group.group_id), stored)], complete)])

    @staticmethod
    def _sync_response(group: Group, member: Member) -> SyncGroupResponse:
        return SyncGroupResponse(protocol_type=group.protocol_type, protocol_name=group.protocol,
                                 assignment=member.assignment)

    @staticmethod
    def _leader_assignments(group: Group, request: SyncGroupRequest) -> dict[str, bytes]:
        """The leader's assignment of every member, checked: only members, each once, and (for the
        consumer protocol) well formed, with no partition given to two members."""
        assignments: dict[str, bytes] = {}
        owners: dict[TopicPartition, str] = {}
        for entry in request.assignments:
            if entry.member_id not in group.members:
                raise InvalidRequestError(f"the assignment names {entry.member_id!r}, not a member of generation "
                                          f"{group.generation}")
            if entry.member_id in assignments:
                raise InvalidRequestError(f"the assignment names member {entry.member_id!r} twice")
            assignments[entry.member_id] = entry.assignment
            for tp in owned_partitions(group.protocol_type, entry.assignment) or ():
                if tp in owners:
                    raise InvalidRequestError(f"partition {tp[0]}-{tp[1]} is assigned to both {owners[tp]!r} "
                                              f"and {entry.member_id!r}: one consumer per partition")
                owners[tp] = entry.member_id
        for member_id in group.members:
            assignments.setdefault(member_id, b"")
        return assignments

    # -- Heartbeat and LeaveGroup ------------------------------------------------------------------

    def heartbeat(self, request: HeartbeatRequest, now_ms: int) -> HeartbeatResponse:
        try:
            self._check(request.group_id)
            group = self._live_group(request.group_id, UnknownMemberIdError)
            if group.is_(GroupState.EMPTY):
                raise UnknownMemberIdError(f"group {group.group_id!r} has no members")
            member = self._member(group, request.member_id, request.group_instance_id)
            if request.generation_id != group.generation:
                raise IllegalGenerationError(f"generation {request.generation_id} is not the group's {group.generation}")
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            self._schedule(group)
            if group.is_(GroupState.PREPARING_REBALANCE):
                raise RebalanceInProgressError(f"group {group.group_id!r} is rebalancing: rejoin")
        except PymqError as err:
            return HeartbeatResponse(*code_and_message(err))
        return HeartbeatResponse()

    def leave_group(self, request: LeaveGroupRequest, now_ms: int) -> tuple[LeaveGroupResponse, Result]:
        """The answer to the leave, and what the members' departure sets off (a rebalance)."""
        try:
            self._check(request.group_id)
            group = self._live_group(request.group_id, UnknownMemberIdError)
        except PymqError as err:
            return LeaveGroupResponse(*code_and_message(err)), Result()
        answers, leaving = [], []
        for identity in request.members:
            try:
                member_id = self._leaving_member(group, identity.member_id, identity.group_instance_id)
                if member_id in group.pending_members:
                    del group.pending_members[member_id]
                else:
                    leaving.append(member_id)
                answers.append(LeaveGroupMemberResponse(identity.member_id, identity.group_instance_id))
            except PymqError as err:
                answers.append(LeaveGroupMemberResponse(identity.member_id, identity.group_instance_id,
                                                        *code_and_message(err)))
        response = LeaveGroupResponse(members=tuple(answers))
        if not leaving:
            return response, Result()
        gone = UnknownMemberIdError("the member left the group")
        return response, self._remove_members(group, leaving, gone, now_ms, f"{len(leaving)} member(s) left")

    def _leaving_member(self, group: Group, member_id: str, instance: str | None) -> str:
        if not member_id and instance is not None:  # an admin removing a static member by instance id
            if instance not in group.static_members:
                raise UnknownMemberIdError(f"no member has group instance id {instance!r}")
            return group.static_members[instance]
        if member_id in group.pending_members:
            return member_id
        return self._member(group, member_id, instance).member_id

    # -- timers ------------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        while self._timers and self._scheduled.get(self._timers[0][1]) != self._timers[0][0]:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def tick(self, now_ms: int) -> Result:
        """Everything whose time came: sessions that expired, pending members that never rejoined,
        rebalances whose deadline passed, syncs that never came."""
        result = Result()
        while (deadline := self.next_deadline()) is not None and deadline <= now_ms:
            _, group_id = heapq.heappop(self._timers)
            del self._scheduled[group_id]
            group = self.groups.get(group_id)
            if group is not None:
                result.add(self._expire(group, now_ms))
                self._schedule(group)
        return result

    def _expire(self, group: Group, now_ms: int) -> Result:
        result = Result()
        for member_id, deadline in list(group.pending_members.items()):
            if deadline <= now_ms:
                del group.pending_members[member_id]
        expired = [m.member_id for m in group.members.values()
                   if m.awaiting_join is None and m.awaiting_sync is None and m.heartbeat_deadline_ms <= now_ms]
        if expired:
            log.info("group %s: session of %s expired", group.group_id, ", ".join(expired))
            result.add(self._remove_members(group, expired, UnknownMemberIdError("the session expired"), now_ms,
                                            "session timeout"))
        if group.is_(GroupState.PREPARING_REBALANCE) and group.join_deadline_ms is not None \
                and group.join_deadline_ms <= now_ms:
            result.add(self._complete_join(group, now_ms))
        elif group.is_(GroupState.PREPARING_REBALANCE):
            result.add(self._maybe_complete_join(group, now_ms))
        if group.is_(GroupState.COMPLETING_REBALANCE) and group.sync_deadline_ms is not None \
                and group.sync_deadline_ms <= now_ms:
            late = [m.member_id for m in group.members.values() if m.awaiting_sync is None]
            result.add(self._reset_sync(group, RebalanceInProgressError("members did not sync in time")))
            result.add(self._remove_members(group, late, UnknownMemberIdError("did not sync in time"), now_ms,
                                            "sync timeout"))
        return result

    def _schedule(self, group: Group) -> None:
        deadlines = [d for d in (group.join_deadline_ms, group.sync_deadline_ms) if d is not None]
        deadlines += group.pending_members.values()
        deadlines += [m.heartbeat_deadline_ms for m in group.members.values()
                      if m.awaiting_join is None and m.awaiting_sync is None]
        if not deadlines:
            return
        deadline = min(deadlines)
        current = self._scheduled.get(group.group_id)
        if current is None or deadline < current:
            self._scheduled[group.group_id] = deadline
            heapq.heappush(self._timers, (deadline, group.group_id))

    # -- offsets -----------------------------------------------------------------------------------

    def commit_offsets(self, request: OffsetCommitRequest, token: Any, now_ms: int,
                       partition_exists: PartitionExists) -> Result:
        try:
            self._check(request.group_id)
            group, member = self._committer(request, now_ms)
        except PymqError as err:
            return Result.reply(token, OffsetCommitResponse(*code_and_message(err)))
        errors: dict[TopicPartition, PymqError] = {}
        commits: dict[TopicPartition, CommittedOffset] = {}
        owned = self._owned_by_others(group, member)
        for topic in request.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition)
                err = topic.error or p.error or self._commit_error(tp, p.metadata, member, owned, partition_exists)
                if err is not None:
                    errors[tp] = err
                else:
                    commits[tp] = CommittedOffset(p.committed_offset, p.committed_leader_epoch, p.metadata, now_ms,
                                                  next(self._log_order))

        def respond(stored_error: PymqError | None) -> OffsetCommitResponse:
            return OffsetCommitResponse(topics=_partition_answers(request.topics, errors, stored_error))

        if not commits:
            return Result.reply(token, respond(None))

        def complete(err: PymqError | None, now: int) -> Result:
            if err is None:
                live = self.groups.setdefault(group.group_id, group)
                live.offsets.update(commits)
            return Result.reply(token, respond(err))

        records: list[tuple[RecordKey, RecordValue]] = [
            (OffsetKey(group.group_id, t, p), c) for (t, p), c in commits.items()]
        return Result(appends=[Append(self.partition_of(group.group_id), records, complete)])

    def _committer(self, request: OffsetCommitRequest, now_ms: int) -> tuple[Group, Member | None]:
        """The group a commit goes to and the member making it (None: a commit from outside the
        group, allowed only while it has no members), or the error that refuses it."""
        group = self.groups.get(request.group_id)
        if group is None:
            if request.generation_id >= 0:
                raise UnknownMemberIdError(f"group {request.group_id!r} does not exist; commit with generation -1")
            return Group(request.group_id, state_timestamp=now_ms), None
        if group.is_(GroupState.DEAD):
            raise CoordinatorNotAvailableError(f"group {request.group_id!r} is being deleted")
        if request.generation_id < 0 and group.is_(GroupState.EMPTY):
            return group, None
        if group.is_(GroupState.COMPLETING_REBALANCE):
            raise RebalanceInProgressError(f"group {group.group_id!r} is completing a rebalance: commit after syncing")
        member = self._member(group, request.member_id, request.group_instance_id)
        if request.generation_id != group.generation:
            raise IllegalGenerationError(f"generation {request.generation_id} is not the group's {group.generation}")
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms  # a commit shows the member alive
        return group, member

    def commit_txn_offsets(self, request: TxnOffsetCommitRequest, token: Any, now_ms: int,
                           partition_exists: PartitionExists) -> Result:
        """TxnOffsetCommit: the offsets are stored as one transactional batch of the producer and
        wait, pending, for the transaction's marker (`end_transaction`)."""
        try:
            self._check(request.group_id)
            self._check_producer(request)
            group = self._txn_committer(request, now_ms)
        except PymqError as err:
            return Result.reply(token, TxnOffsetCommitResponse(*code_and_message(err)))
        errors: dict[TopicPartition, PymqError] = {}
        commits: dict[TopicPartition, CommittedOffset] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition)
                err = topic.error or p.error or self._commit_error(tp, p.metadata, None, set(), partition_exists)
                if err is not None:
                    errors[tp] = err
                else:
                    commits[tp] = CommittedOffset(p.committed_offset, p.committed_leader_epoch, p.metadata, now_ms,
                                                  next(self._log_order))

        def respond(stored_error: PymqError | None) -> TxnOffsetCommitResponse:
            return TxnOffsetCommitResponse(topics=_partition_answers(request.topics, errors, stored_error))

        if not commits:
            return Result.reply(token, respond(None))
        partition, producer_id = self.partition_of(group.group_id), request.producer_id

        def complete(err: PymqError | None, now: int) -> Result:
            if err is None and self.owns(group.group_id):
                live = self.groups.setdefault(group.group_id, group)
                live.add_pending(producer_id, commits)
                self._open_transactions.setdefault(partition, {}).setdefault(producer_id, set()).add(group.group_id)
            return Result.reply(token, respond(err))

        records: list[tuple[RecordKey, RecordValue]] = [
            (OffsetKey(group.group_id, t, p), c) for (t, p), c in commits.items()]
        return Result(appends=[Append(partition, records, complete, (producer_id, request.producer_epoch))])

    @staticmethod
    def _check_producer(request: TxnOffsetCommitRequest) -> None:
        """INVALID_REQUEST for a transactional id, producer id or epoch no transaction can have
        (the epoch goes into an int16 header field)."""
        check_transactional_id(request.transactional_id)
        if not 0 <= request.producer_id <= INT64_MAX:
            raise InvalidRequestError(f"producer id {request.producer_id} is not a transactional producer's")
        if not 0 <= request.producer_epoch <= INT16_MAX:
            raise InvalidRequestError(f"producer epoch {request.producer_epoch} is outside [0, {INT16_MAX}]")

    def _txn_committer(self, request: TxnOffsetCommitRequest, now_ms: int) -> Group:
        """The group a TxnOffsetCommit goes to (Kafka's validateOffsetCommit, transactional): a
        request that names a generation, member or instance (KIP-447) must be the group's current
        member and generation; one that names none is taken by any group (a producer without the
        consumer's group metadata); a rebalance does not refuse it."""
        names_member = request.generation_id >= 0 or bool(request.member_id) or request.group_instance_id is not None
        group = self.groups.get(request.group_id)
        if group is None:
            if names_member:
                raise UnknownMemberIdError(f"group {request.group_id!r} does not exist; commit with generation -1")
            return Group(request.group_id, state_timestamp=now_ms)
        if group.is_(GroupState.DEAD):
            raise CoordinatorNotAvailableError(f"group {request.group_id!r} is being deleted")
        if request.generation_id < 0 and group.is_(GroupState.EMPTY):
            return group
        if names_member:
            self._member(group, request.member_id, request.group_instance_id)
            if request.generation_id != group.generation:
                raise IllegalGenerationError(f"generation {request.generation_id} is not the group's {group.generation}")
        return group

    def end_transaction(self, partition: int, producer_id: int, committed: bool) -> None:
        """A transaction's marker was stored on `partition` of `__consumer_offsets` (led here):
        the producer's pending offsets in its groups are committed or dropped. While the
        partition loads, the marker waits for the replay to end: it was written after every
        record the replay reads (the coordinator appends nothing to a loading partition), or,
        if the replay read it too, applying it again changes nothing (its offsets are gone)."""
        replay = self._loading.get(partition)
        if replay is not None:
            replay.markers.append((producer_id, committed))
            return
        open_transactions = self._open_transactions.get(partition)
        if open_transactions is not None:
            _end_transaction(self.groups, open_transactions, producer_id, committed)

    @staticmethod
    def _owned_by_others(group: Group, member: Member | None) -> set[TopicPartition]:
        if member is None or not member.revoking:
            return set()
        return {tp for m in group.members.values() if m is not member and m.owned for tp in m.owned}

    def _commit_error(self, tp: TopicPartition, metadata: str | None, member: Member | None,
                      owned_by_others: set[TopicPartition], partition_exists: PartitionExists) -> PymqError | None:
        """Why one partition's commit is refused, if it is. A member commits the partitions it owns,
        and (cooperative protocol) those it is revoking that nobody owns yet."""
        if not partition_exists(*tp):
            return UnknownTopicOrPartitionError(f"unknown topic-partition {tp[0]}-{tp[1]}")
        if metadata is not None and len(metadata.encode()) > self.config.offset_metadata_max_bytes:
            return OffsetMetadataTooLargeError(
                f"metadata of {len(metadata.encode())} bytes exceeds offset.metadata.max.bytes "
                f"{self.config.offset_metadata_max_bytes}")
        if member is not None and member.owned is not None and tp not in member.owned and (
                tp not in member.revoking or tp in owned_by_others):
            return PartitionNotAssignedError(f"{tp[0]}-{tp[1]} is not assigned to member {member.member_id}")
        return None

    def fetch_offsets(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        try:
            self._check(request.group_id)
        except PymqError as err:
            return OffsetFetchResponse(*code_and_message(err))
        group = self.groups.get(request.group_id)
        offsets = group.offsets if group is not None else {}
        if request.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partitions) for t in request.topics}
        unstable = group is not None and request.require_stable and group.pending_offsets
        return OffsetFetchResponse(topics=tuple(
            TopicResponse(topic, tuple(
                self._unstable(p) if unstable and group.has_pending((topic, p)) else self._fetched(offsets.get((topic, p)), p)
                for p in partitions))
            for topic, partitions in wanted.items()))

    @staticmethod
    def _unstable(partition: int) -> OffsetFetchPartitionResponse:
        """A partition whose offset an open transaction is about to change (KIP-447): the
        client asked for stable offsets, and retries."""
        err = UnstableOffsetCommitError(f"partition {partition} has pending transactional offsets: retry")
        return OffsetFetchPartitionResponse(partition, *code_and_message(err))

    @staticmethod
    def _fetched(committed: CommittedOffset | None, partition: int) -> OffsetFetchPartitionResponse:
        if committed is None:
            return OffsetFetchPartitionResponse(partition)
        return OffsetFetchPartitionResponse(partition, committed_offset=committed.offset,
                                            committed_leader_epoch=committed.leader_epoch, metadata=committed.metadata)

    def delete_offsets(self, request: OffsetDeleteRequest, token: Any, now_ms: int) -> Result:
        try:
            self._check(request.group_id)
            group = self._live_group(request.group_id, GroupIdNotFoundError)
        except PymqError as err:
            return Result.reply(token, OffsetDeleteResponse(*code_and_message(err)))
        subscribed = group.subscribed_topics() if group.members else set()
        errors: dict[TopicPartition, PymqError] = {}
        for topic in request.topics:
            for partition in topic.partitions:
                if subscribed is None or topic.name in subscribed:
                    errors[(topic.name, partition)] = GroupSubscribedToTopicError(
                        f"group {group.group_id!r} has members subscribed to {topic.name!r}")
        doomed = [(t.name, p) for t in request.topics for p in t.partitions
                  if (t.name, p) not in errors and ((t.name, p) in group.offsets or group.has_pending((t.name, p)))]

        def respond(stored_error: PymqError | None) -> OffsetDeleteResponse:
            return OffsetDeleteResponse(topics=tuple(TopicResponse(t.name, tuple(
                PartitionResponse(p, *code_and_message(errors.get((t.name, p), stored_error)))
                for p in t.partitions)) for t in request.topics))

        if not doomed:
            return Result.reply(token, respond(None))

        def complete(err: PymqError | None, now: int) -> Result:
            if err is None:
                group.drop_offsets(doomed)
            return Result.reply(token, respond(err))

        return Result(appends=[Append(self.partition_of(group.group_id),
                                      [(OffsetKey(group.group_id, *tp), None) for tp in doomed], complete)])

    def expire_offsets(self, now_ms: int) -> Result:
        """Tombstones for the offsets whose retention passed (KIP-211): an empty group's counted
        from when it became empty (standalone commits: from the commit); a stable consumer
        group's offsets of topics no member subscribes to, from the commit. An empty group left
        without offsets is deleted with them."""
        result = Result()
        retention = self.config.offsets_retention_ms
        for group in list(self.groups.values()):
            if not self.owns(group.group_id) or group.is_(GroupState.DEAD):
                continue
            if group.is_(GroupState.EMPTY):
                expired = [tp for tp, c in group.offsets.items()
                           if now_ms - (group.state_timestamp if group.protocol_type is not None else c.commit_timestamp) >= retention]
            elif group.is_(GroupState.STABLE) and (subscribed := group.subscribed_topics()) is not None:
                expired = [tp for tp, c in group.offsets.items()
                           if tp[0] not in subscribed and now_ms - c.commit_timestamp >= retention]
            else:
                continue
            expired = [tp for tp in expired if not group.has_pending(tp)]  # until their marker (Kafka)
            if expired:
                result.add(Result(appends=[self._expire_append(group, expired)]))
        return result

    def delete_topic_offsets(self, topic: str) -> Result:
        """Tombstones for every offset this coordinator's groups committed for `topic`, which was
        deleted (Kafka's GroupCoordinator.onPartitionsDeleted): a topic re-created under its name
        is a new topic, and its consumers must start per auto.offset.reset, not at an offset of the
        old one. An empty group left without offsets is deleted with them."""
        result = Result()
        for group in list(self.groups.values()):
            if not self.owns(group.group_id) or group.is_(GroupState.DEAD):
                continue
            doomed = [tp for tp in group.offsets.keys() | _pending_partitions(group) if tp[0] == topic]
            if doomed:
                result.add(Result(appends=[self._expire_append(group, doomed, f"of deleted topic {topic}")]))
        return result

    def _expire_append(self, group: Group, expired: list[TopicPartition], why: str = "expired") -> Append:
        records: list[tuple[RecordKey, RecordValue]] = [(OffsetKey(group.group_id, *tp), None) for tp in expired]
        deletes_group = group.is_(GroupState.EMPTY) and len(expired) == len(group.offsets) and not group.pending_offsets
        if deletes_group:
            records.append((GroupKey(group.group_id), None))

        def complete(err: PymqError | None, now: int) -> Result:
            if err is not None:
                log.warning("removing %d offsets (%s) of group %s failed: %s", len(expired), why, group.group_id, err)
                return Result()
            group.drop_offsets(expired)
            if deletes_group and not group.members and not group.offsets and not group.pending_offsets \
                    and self.groups.get(group.group_id) is group:
                group.transition(GroupState.DEAD, now)
                del self.groups[group.group_id]
            log.info("group %s: %d offsets removed (%s)%s", group.group_id, len(expired), why,
                     ", group removed" if deletes_group else "")
            return Result()

        return Append(self.partition_of(group.group_id), records, complete)

    # -- admin -------------------------------------------------------------------------------------

    def list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        wanted = {s.lower() for s in request.states_filter}
        return ListGroupsResponse(groups=tuple(
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
            for g in sorted(self.groups.values(), key=lambda g: g.group_id)
            if self.owns(g.group_id) and not g.is_(GroupState.DEAD) and (not wanted or g.state.value.lower() in wanted)))

    def describe_groups(self, request: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return DescribeGroupsResponse(tuple(self.describe_group(group_id) for group_id in request.groups))

    def describe_group(self, group_id: str) -> DescribedGroup:
        """One group of a DescribeGroups (the runtime answers many of them in slices)."""
        try:
            self._check(group_id)
            group = self._live_group(group_id, GroupIdNotFoundError)
        except PymqError as err:
            return DescribedGroup(group_id, *code_and_message(err), group_state=GroupState.DEAD.value)
        return DescribedGroup(group_id, group_state=group.state.value, protocol_type=group.protocol_type or "",
                              protocol_data=group.protocol or "", members=tuple(
                                  DescribedMember(m.member_id, m.group_instance_id, m.client_id, "",
                                                  m.metadata(group.protocol or ""), m.assignment)
                                  for m in group.members.values()))

    def delete_groups(self, request: DeleteGroupsRequest, token: Any, now_ms: int) -> Result:
        """Delete empty groups with their offsets; one reply once every deletion is stored."""
        outcomes: dict[str, PymqError | None] = {}
        appends: list[Append] = []
        waiting = set()

        def respond() -> Result:
            return Result.reply(token, DeleteGroupsResponse(tuple(
                DeletedGroupResult(g, *code_and_message(outcomes[g])) for g in dict.fromkeys(request.groups))))

        for group_id in dict.fromkeys(request.groups):
            try:
                self._check(group_id)
                group = self._live_group(group_id, GroupIdNotFoundError)
                if group.members or not group.is_(GroupState.EMPTY):
                    raise NonEmptyGroupError(f"group {group_id!r} has members ({group.state.value}); stop them first")
            except PymqError as err:
                outcomes[group_id] = err
                continue
            waiting.add(group_id)
            records: list[tuple[RecordKey, RecordValue]] = [
                (OffsetKey(group_id, *tp), None) for tp in group.offsets.keys() | _pending_partitions(group)]
            records.append((GroupKey(group_id), None))
            appends.append(Append(self.partition_of(group_id), records, self._deleted(group, outcomes, waiting, respond)))
        if not appends:
            return respond()
        return Result(appends=appends)

    def _deleted(self, group: Group, outcomes: dict[str, PymqError | None], waiting: set[str],
                 respond: Callable[[], Result]) -> Callable[[PymqError | None, int], Result]:
        def complete(err: PymqError | None, now: int) -> Result:
            outcomes[group.group_id] = err
            if err is None and self.groups.get(group.group_id) is group:
                group.transition(GroupState.DEAD, now)
                del self.groups[group.group_id]
                log.info("group %s deleted", group.group_id)
            waiting.discard(group.group_id)
            return respond() if not waiting else Result()
        return complete

    # -- shared checks -----------------------------------------------------------------------------

    def _live_group(self, group_id: str, missing: type[PymqError]) -> Group:
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            raise missing(f"group {group_id!r} does not exist")
        return group

    @staticmethod
    def _member(group: Group, member_id: str, instance: str | None) -> Member:
        """The member a request speaks for; a static member whose instance id now belongs to a
        newer member id is fenced (it is a zombie of a restarted process)."""
        if instance is not None:
            current = group.static_members.get(instance)
            if current is not None and current != member_id:
                raise FencedInstanceIdError(f"group instance {instance!r} is now member {current}; "
                                            f"{member_id or 'this member'} is fenced")
        member = group.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {group.group_id!r} has no member {member_id!r}")
        return member

    def _stored_with(self, group: Group, assignments: dict[str, bytes], now_ms: int) -> StoredGroup:
        stored = group.stored()
        return replace(stored, state_timestamp=now_ms, members=tuple(
            replace(m, assignment=assignments.get(m.member_id, m.assignment)) for m in stored.members))

    def _store(self, group: Group, now_ms: int, then: Callable[[PymqError | None, int], Result]) -> Append:
        """Store the group as it is now (a new generation, or a static member's new id)."""
        return Append(self.partition_of(group.group_id), [(GroupKey(group.group_id), self._stored_with(group, {}, now_ms))],
                      then)


def _pending_partitions(group: Group) -> set[TopicPartition]:
    """The partitions an open transaction holds offsets of (their tombstones drop those too)."""
    return {tp for pending in group.pending_offsets.values() for tp in pending}


def _partition_answers(topics: tuple[TopicRequest[OffsetCommitPartition], ...], errors: dict[TopicPartition, PymqError],
                       stored_error: PymqError | None) -> tuple[TopicResponse[PartitionResponse], ...]:
    """Each partition's answer to an (Txn)OffsetCommit: its own error, else the append's outcome."""
    return tuple(TopicResponse(t.name, tuple(PartitionResponse(
        p.partition, *code_and_message(errors.get((t.name, p.partition), stored_error))) for p in t.partitions))
        for t in topics)
