"""ConsumerCoordinator: a consumer's membership in its group, on the consumer's event loop (Kafka's
ConsumerCoordinator and AbstractCoordinator, classic protocol).

    unjoined ──poll──▶ joining ──────────────────────────────────────▶ stable ──┐ heartbeats
       ▲      JoinGroup (MEMBER_ID_REQUIRED: again with the id given), │
       │      the leader assigns, SyncGroup                            │ REBALANCE_IN_PROGRESS, new
       │                                                               │ subscription, metadata change,
       │                                                               ▼ cooperative revocation
       │                                                        rejoin at the next poll
       └── lost: UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID, or no poll within
           max.poll.interval.ms (a dynamic member sends LeaveGroup); the next poll joins again

Division of labour. This class speaks the group protocol: it finds the coordinator broker
(FindCoordinator, again after NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS or a lost connection, after `retry_backoff_ms`), joins and syncs,
computes every member's assignment when it is the leader, heartbeats, commits and fetches
offsets, and leaves. It also owns the choreography around them (Kafka's ConsumerCoordinator.poll,
onJoinPrepare, onJoinComplete, close): `poll_steps` and `leave_steps` are generators that the
consumer drives from its `poll`, `unsubscribe` and `close` with `client.steps.run_steps` (the sync
Consumer too, on its application thread). Application code (the rebalance listener, commit callbacks)
runs in the generator, on the application's thread as in Kafka; each coroutine the generator
yields runs on the consumer's loop. What the background task found (a lost generation, a
completed commit, a fatal error) waits in `events` and `fatal` for the next poll's steps.

The consumer's parts come in through the constructor: the SubscriptionState whose assignment the
group changes, the Fetcher that keeps its buffer in step with that assignment and is woken when
the group needs the poller, and `init_positions` (the consumer's lookup of start positions for
newly assigned partitions: committed offsets, else `auto_offset_reset`).

Background task, from `subscribe` to `unsubscribe`/`close`, independent of the application's
poll loop (a slow processing step does not lose the session):
  - a Heartbeat every `heartbeat_interval_ms` while the member has a generation and no
    JoinGroup/SyncGroup is in flight; REBALANCE_IN_PROGRESS asks for a rejoin at the next poll;
  - the poll timer: no poll for `max_poll_interval_ms` means the application is stuck, so the
    member leaves the group (LeaveGroup; a static member just stops, as Kafka's does) and its
    partitions are lost; the next poll joins again;
  - metadata every `metadata_max_age_ms` (with backoff while the leader assigned without a
    subscribed topic that does not exist: `_awaits_missing_topic`): a pattern subscription that
    now matches other topics, or (on the leader) a subscribed topic whose partition count
    changed, asks for a rejoin. The leader compares the counts also whenever the fetcher
    refreshes metadata (Kafka's coordinator checks its metadata snapshot on every update): a
    subscribed topic deleted, or re-created with another partition count, is revoked and
    reassigned without waiting for metadata_max_age_ms.

Stale answers are not believed: an error that resets the membership (ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID) does so only if the member is still in the generation the request was sent in
(an async commit from the previous generation cannot throw away the current one).

The JoinGroup's request timeout exceeds the rebalance timeout (`max_poll_interval_ms` + 5 s, as
Kafka's): the coordinator answers it only when the rebalance completes.

Loop-local, except `note_poll_start` / `note_poll_end`, the bodies of `poll_steps` /
`leave_steps` (the application's thread; the coroutines they yield run on the loop) and reads of
the plain attributes, which the application's thread may do.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, Literal, NamedTuple, TypeVar

from client.assignors import ASSIGNORS, PartitionAssignor, revocations
from client.cluster import Cluster
from client.connection import BrokerConnection
from client.fetcher import METADATA_BACKOFF_MAX_S, Fetcher
from client.steps import Steps
from client.subscription_state import SubscriptionState
from common.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InvalidRequestError,
    MemberIdRequiredError,
    NetworkError,
    NotCoordinatorError,
    PymqError,
    RebalanceInProgressError,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from common.topic_partition import TopicPartition
from protocol.consumer_protocol import NO_GENERATION, PROTOCOL_TYPE, Assignment, Subscription
from protocol.messages.base import TopicRequest
from protocol.messages.group import (
    NO_GENERATION_ID,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupMember,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
)

log = logging.getLogger("pymq.consumer.group")

RebalanceProtocol = Literal["eager", "cooperative"]
CommitCallback = Callable[[dict[TopicPartition, int], PymqError | None], Any]
RebalanceCallback = Callable[[list[TopicPartition]], Any]

T = TypeVar("T")

# Answers that mean "find the coordinator again, after a backoff".
COORDINATOR_ERRORS = (NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
                      NetworkError, RequestTimedOutError)
JOIN_TIMEOUT_MARGIN_S = 5.0  # Kafka: a JoinGroup may take the rebalance timeout plus this


class GroupMetadata(NamedTuple):
    """Who the consumer is in its group now (Kafka's ConsumerGroupMetadata): generation -1 and
    member id "" while it is not in a generation."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


class LostEvent(NamedTuple):
    """The member's partitions were taken away without a chance to commit (on_lost)."""

    partitions: list[TopicPartition]
    reason: str


class CommitEvent(NamedTuple):
    """An async commit completed; its callback runs on the application's thread."""

    callback: CommitCallback
    offsets: dict[TopicPartition, int]
    error: PymqError | None


class RebalanceListener(NamedTuple):
    """The application's rebalance callbacks (Kafka's ConsumerRebalanceListener), each called
    with a sorted list of partitions; `on_lost` None means `on_revoke`. A callback may return an
    awaitable (an AsyncConsumer's coroutine functions): it is awaited."""

    on_assign: RebalanceCallback | None = None
    on_revoke: RebalanceCallback | None = None
    on_lost: RebalanceCallback | None = None


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def rebalance_protocol(assignors: Iterable[str]) -> RebalanceProtocol:
    """Cooperative only when every assignor offered is (see client.assignors)."""
    names = list(assignors)
    return "cooperative" if all(ASSIGNORS[name].rebalance_protocol == "cooperative" for name in names) else "eager"


def is_internal_topic(topic: str) -> bool:
    """Topics the broker keeps for itself (`__consumer_offsets`): a pattern never matches them."""
    return topic.startswith("__")


class ConsumerCoordinator:
    """One consumer's group membership; see the module docstring. Lost partitions leave the
    `subscriptions`' assignment (and the `fetcher`'s buffer) on the loop the moment they are
    lost; `fetcher.wake_poller()` interrupts a poll waiting for records, so that it handles what
    the background task found. `init_positions(partitions)` (a coroutine on the loop) gives newly
    assigned partitions their start positions; a retriable failure is retried at the next poll."""

    def __init__(self, cluster: Cluster, subscriptions: SubscriptionState, fetcher: Fetcher, group_id: str, *,
                 group_instance_id: str | None, client_id: str, session_timeout_ms: int, heartbeat_interval_ms: int,
                 max_poll_interval_ms: int, assignors: list[str], request_timeout_ms: int, retry_backoff_ms: int,
                 metadata_max_age_ms: int, enable_auto_commit: bool, auto_commit_interval_ms: int,
                 init_positions: Callable[[list[TopicPartition]], Awaitable[None]]) -> None:
        self.cluster = cluster
        self._subs = subscriptions
        self._fetcher = fetcher
        fetcher.metadata_listener = self._metadata_updated
        self._init_positions = init_positions
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.max_poll_interval_s = max_poll_interval_ms / 1000
        self.assignors = list(assignors)
        self.protocol: RebalanceProtocol = rebalance_protocol(assignors)
        self.request_timeout_s = request_timeout_ms / 1000
        self.join_timeout_s = max(self.request_timeout_s, self.max_poll_interval_s + JOIN_TIMEOUT_MARGIN_S)
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        # Membership.
        self.member_id = ""
        self.generation = NO_GENERATION_ID
        self.leader = ""
        self.owned: frozenset[TopicPartition] = frozenset()  # the assignment while subscribed
        self._owned_generation = NO_GENERATION  # the generation `owned` was assigned in
        self.needs_rejoin = False
        self.fatal: PymqError | None = None  # FENCED_INSTANCE_ID: every poll raises it
        self.events: deque[LostEvent | CommitEvent] = deque()  # for the application's thread
        # Subscription.
        self.topics: frozenset[str] | None = None  # explicit topics, or None
        self.pattern: re.Pattern[str] | None = None
        self.listener = RebalanceListener()
        self._joined_topics: frozenset[str] = frozenset()  # the topics of the last JoinGroup
        self._leader_counts: dict[str, int] = {}  # as the leader: the partition counts it assigned from
        # Offsets.
        self.committed_offsets: dict[TopicPartition, int] = {}  # what this member last committed or read
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        self._commits: set[asyncio.Task[None]] = set()
        # Runtime.
        self._coordinator: BrokerConnection | None = None
        self._finding: asyncio.Lock | None = None
        self._join_task: asyncio.Task[tuple[int, Assignment]] | None = None
        self._background: asyncio.Task[None] | None = None
        self._background_wake: asyncio.Event | None = None
        self._polling = False
        self._last_poll = time.monotonic()
        self._next_heartbeat = 0.0

    # -- state the consumer reads ----------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return self.topics is not None or self.pattern is not None

    @property
    def joining(self) -> bool:
        """A JoinGroup/SyncGroup round is running or finished with a result not yet taken."""
        return self._join_task is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self) -> GroupMetadata:
        return GroupMetadata(self.group_id, self.generation, self.member_id, self.group_instance_id)

    def wants_topic(self, topic: str) -> bool:
        """Whether the subscription covers `topic`."""
        if self.topics is not None:
            return topic in self.topics
        return self.pattern is not None and not is_internal_topic(topic) and self.pattern.fullmatch(topic) is not None

    # -- the poll timer (any thread) ---------------------------------------------------------------

    def note_poll_start(self) -> None:
        """The application is in poll: it is not stuck, however long poll waits."""
        self._polling = True
        self._last_poll = time.monotonic()

    def note_poll_end(self) -> None:
        self._last_poll = time.monotonic()
        self._polling = False

    def auto_commit_due(self) -> bool:
        """True once per `auto_commit_interval_ms` (any thread: the poll asks)."""
        now = time.monotonic()
        if now < self._next_auto_commit:
            return False
        self._next_auto_commit = now + self.auto_commit_interval_s
        return True

    # -- subscription --------------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None, pattern: re.Pattern[str] | None,
                  listener: RebalanceListener) -> None:
        """Set the subscription and its listener (loop); the next poll joins, or rejoins if the
        subscription changed."""
        self.listener = listener
        new_topics = frozenset(topics) if topics is not None else None
        changed = (new_topics, pattern and pattern.pattern) != (self.topics, self.pattern and self.pattern.pattern)
        self.topics, self.pattern = new_topics, pattern
        if changed or not self._in_group():
            self.request_rejoin("the subscription changed")
        self._last_poll = time.monotonic()
        if self._background is None or self._background.done():
            self._background_wake = asyncio.Event()
            self._background = asyncio.get_running_loop().create_task(self._run_background())

    def subscribed_topics(self) -> frozenset[str]:
        """The topics to subscribe to now: the explicit ones, or the pattern's matches among the
        topics the cluster metadata knows."""
        if self.topics is not None:
            return self.topics
        return frozenset(t for t in self.cluster.topics if self.wants_topic(t))

    def request_rejoin(self, reason: str) -> None:
        if not self.needs_rejoin:
            log.info("group %s: rejoin requested: %s", self.group_id, reason)
        self.needs_rejoin = True
        self._fetcher.wake_poller()

    # -- joining -------------------------------------------------------------------------------------

    def start_join(self) -> None:
        """Start a JoinGroup/SyncGroup round (loop); `wait_join` and `take_join_result` follow."""
        if self._join_task is None:
            self.needs_rejoin = False
            self._join_task = asyncio.get_running_loop().create_task(self._join_group())
            self._join_task.add_done_callback(lambda _: self._fetcher.wake_poller())

    async def wait_join(self, timeout_s: float) -> bool:
        """Whether the round finished within `timeout_s` (it goes on either way)."""
        task = self._join_task
        if task is None:
            return False
        if not task.done() and timeout_s > 0:
            await asyncio.wait({task}, timeout=timeout_s)
        return task.done()

    async def take_join_result(self) -> Assignment | None:
        """The finished round's assignment; None if the generation it was for is lost already
        (the next poll joins again). The round's error is raised, and the next poll joins again."""
        task, self._join_task = self._join_task, None
        if task is None or not task.done():
            raise RuntimeError("no finished join to take")  # a bug in the consumer's poll, not the wire
        try:
            generation, assignment = task.result()
        except asyncio.CancelledError:
            self.needs_rejoin = True
            return None
        except PymqError:
            self.needs_rejoin = True
            raise
        if generation != self.generation:
            self.needs_rejoin = True
            return None
        return assignment

    def assignment_applied(self, partitions: Iterable[TopicPartition]) -> None:
        """The consumer now owns exactly `partitions` of the current generation."""
        self.owned = frozenset(partitions)
        self._owned_generation = self.generation
        self._next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        if self._background_wake is not None:
            self._background_wake.set()

    async def _join_group(self) -> tuple[int, Assignment]:
        """JoinGroup then SyncGroup until this member has an assignment in a generation:
        (that generation, the assignment)."""
        while True:
            try:
                conn = await self._coordinator_connection()
                joined = await self._join(conn)
                if joined is None:
                    continue
                assignment = await self._sync(conn, joined)
                if assignment is not None:
                    log.info("group %s: generation %d, member %s%s, assigned %d partitions", self.group_id,
                             self.generation, self.member_id, " (leader)" if joined.leader == joined.member_id else "",
                             len(assignment.partitions))
                    return joined.generation_id, assignment
            except COORDINATOR_ERRORS as err:
                self._coordinator_dead(err)
                await asyncio.sleep(self.retry_backoff_s)

    def _subscription(self) -> Subscription:
        """This member's JoinGroup metadata. Eager members own nothing when they join (they revoked
        everything first) and send neither partitions nor a generation: identical metadata lets a
        restarted static member take its place back without a rebalance."""
        topics = self.subscribed_topics()
        self._joined_topics = topics
        if self.protocol == "eager":
            return Subscription(tuple(topics))
        return Subscription(tuple(topics), tuple(self.owned), self._owned_generation)

    async def _join(self, conn: BrokerConnection) -> JoinGroupResponse | None:
        """One JoinGroup; its answer, or None to join again (after acting on its error)."""
        if self.pattern is not None:
            await self.cluster.refresh()  # resolve the pattern against current metadata
        metadata = self._subscription().encode()
        request = JoinGroupRequest(self.group_id, self.session_timeout_ms, int(self.max_poll_interval_s * 1000),
                                   self.member_id, self.group_instance_id, PROTOCOL_TYPE,
                                   tuple(JoinGroupProtocol(name, metadata) for name in self.assignors), self.client_id)
        response = await conn.send(request, timeout_s=self.join_timeout_s)
        err = response.error()
        if err is None:
            self.member_id, self.generation, self.leader = response.member_id, response.generation_id, response.leader
            return response
        if isinstance(err, MemberIdRequiredError):  # KIP-394: join again with the id the coordinator gave
            self.member_id = response.member_id
            return None
        self._membership_error(err, (request.member_id, self.generation), "JoinGroup")
        return None

    async def _sync(self, conn: BrokerConnection, joined: JoinGroupResponse) -> Assignment | None:
        """SyncGroup (the leader sends every member's assignment); this member's assignment, or
        None to join again."""
        assignments: tuple[SyncGroupAssignment, ...] = ()
        if joined.leader == joined.member_id:
            if joined.skip_assignment:  # a static leader restarted: the group keeps its assignment
                self._leader_counts = await self._partition_counts(self._group_topics(joined.members))
            else:
                assignments = await self._assign(joined.protocol_name or "", joined.members)
        else:
            self._leader_counts = {}
        request = SyncGroupRequest(self.group_id, joined.generation_id, joined.member_id, self.group_instance_id,
                                   PROTOCOL_TYPE, joined.protocol_name, assignments)
        response = await conn.send(request, timeout_s=self.join_timeout_s)
        err = response.error()
        if err is None:
            return Assignment.decode(response.assignment) if response.assignment else Assignment()
        self._membership_error(err, (joined.member_id, joined.generation_id), "SyncGroup")
        return None

    def _membership_error(self, err: PymqError, sent: tuple[str, int], what: str) -> None:
        """Act on a JoinGroup/SyncGroup error: retriable ones return (the caller joins again),
        fatal ones are raised to the application."""
        if isinstance(err, RebalanceInProgressError):
            return  # a newer rebalance began (or this join was superseded): join again at once
        if isinstance(err, (UnknownMemberIdError, IllegalGenerationError)):
            self._reset_membership(err, sent, forget_member=isinstance(err, UnknownMemberIdError))
            return
        if isinstance(err, FencedInstanceIdError):
            self._fence(err, sent)
        if isinstance(err, COORDINATOR_ERRORS):
            raise err  # the join loop finds the coordinator again
        log.error("group %s: %s failed: %s", self.group_id, what, err)
        raise err

    # -- the leader's assignment -----------------------------------------------------------------------

    @staticmethod
    def _decoded(members: tuple[JoinGroupMember, ...]) -> dict[str, Subscription]:
        subscriptions = {}
        for member in members:
            try:
                subscriptions[member.member_id] = Subscription.decode(member.metadata)
            except InvalidRequestError as err:  # a peer's bytes: it gets nothing rather than failing the group
                log.warning("member %s sent a malformed subscription; it gets no partitions: %s", member.member_id, err)
                subscriptions[member.member_id] = Subscription(())
        return subscriptions

    def _group_topics(self, members: tuple[JoinGroupMember, ...]) -> set[str]:
        return {topic for subscription in self._decoded(members).values() for topic in subscription.topics}

    async def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Each topic's partition count from fresh metadata; 0 for a topic that does not exist (yet)."""
        wanted = sorted(topics)
        if wanted:
            await self.cluster.refresh(wanted)
        return {topic: len(self.cluster.topics.get(topic, ())) for topic in wanted}

    async def _assign(self, protocol: str, members: tuple[JoinGroupMember, ...]) -> tuple[SyncGroupAssignment, ...]:
        assignor_type = ASSIGNORS.get(protocol)
        if assignor_type is None or protocol not in self.assignors:
            raise InvalidRequestError(f"the coordinator chose assignor {protocol!r}, which this member does not offer")
        assignor: PartitionAssignor = assignor_type()
        subscriptions = self._decoded(members)
        counts = await self._partition_counts({t for s in subscriptions.values() for t in s.topics})
        self._leader_counts = counts
        order = {m.member_id: m.group_instance_id for m in members if m.group_instance_id is not None}
        assigned = assignor.assign({t: n for t, n in counts.items() if n > 0}, subscriptions, order)
        log.info("group %s: leader assigned %d partitions to %d members with %s", self.group_id,
                 sum(len(a.partitions) for a in assigned.values()), len(assigned), protocol)
        return tuple(SyncGroupAssignment(member, assignment.encode()) for member, assignment in assigned.items())

    # -- losing the generation -------------------------------------------------------------------------

    def _current(self, sent: tuple[str, int]) -> bool:
        """Whether the member is still in the (member id, generation) a request was sent with."""
        return sent == (self.member_id, self.generation)

    def _reset_membership(self, err: PymqError, sent: tuple[str, int], *, forget_member: bool) -> None:
        """The coordinator no longer knows this member in that generation: what it owned is lost."""
        if not self._current(sent):
            return
        log.warning("group %s: member %s lost generation %d: %s", self.group_id, self.member_id, self.generation, err)
        if forget_member:
            self.member_id = ""
        self._lose(f"{err.name()}: {err}")

    def _fence(self, err: PymqError, sent: tuple[str, int]) -> None:
        """Another process joined with this group.instance.id: this one must stop (every poll raises)."""
        if self._current(sent) or self.fatal is None:
            log.error("group %s: static member %s is fenced: %s", self.group_id, self.group_instance_id, err)
            self.fatal = err
            self._lose(f"fenced: {err}")

    def _lose(self, reason: str) -> None:
        lost = sorted(self.owned)
        self.generation = NO_GENERATION_ID
        self.owned, self._owned_generation = frozenset(), NO_GENERATION
        if self._join_task is None or self._join_task.done():
            self.needs_rejoin = True  # (a join in flight goes on: it is the rejoin)
        if lost:
            self.events.append(LostEvent(lost, reason))
            gone = set(lost)
            self._keep_assigned([tp for tp in self._subs.assigned if tp not in gone])
        self._fetcher.wake_poller()

    # -- background: heartbeats, the poll timer, metadata ---------------------------------------------------

    def _in_group(self) -> bool:
        return self.generation >= 0 or self._join_task is not None

    def _can_heartbeat(self) -> bool:
        return self.generation >= 0 and bool(self.member_id) and (self._join_task is None or self._join_task.done())

    def _poll_deadline(self) -> float:
        return float("inf") if self._polling or not self._in_group() else self._last_poll + self.max_poll_interval_s

    async def _run_background(self) -> None:
        next_metadata = time.monotonic() + self.metadata_max_age_s
        missing_backoff = self.retry_backoff_s
        wake = self._background_wake
        assert wake is not None
        while True:
            now = time.monotonic()
            try:
                if now >= self._poll_deadline():
                    await self._leave_after_poll_timeout()
                if now >= next_metadata:
                    await self._check_metadata()
                    if self._awaits_missing_topic():
                        next_metadata = now + missing_backoff
                        missing_backoff = min(2 * missing_backoff, max(METADATA_BACKOFF_MAX_S, self.retry_backoff_s))
                    else:
                        next_metadata = now + self.metadata_max_age_s
                        missing_backoff = self.retry_backoff_s
                elif self._awaits_missing_topic() and missing_backoff == self.retry_backoff_s:  # just began
                    next_metadata = min(next_metadata, now + missing_backoff)
                if self._can_heartbeat() and now >= self._next_heartbeat:
                    self._next_heartbeat = now + self.heartbeat_interval_s
                    await self._heartbeat()
            except Exception:  # noqa: BLE001 - a bug here must not stop the heartbeats for good
                log.exception("group %s: background task step failed; going on", self.group_id)
                await asyncio.sleep(self.retry_backoff_s)
            now = time.monotonic()
            next_beat = self._next_heartbeat if self._can_heartbeat() else now + self.heartbeat_interval_s
            wait_s = min(next_beat, next_metadata, self._poll_deadline()) - now
            wake.clear()
            try:  # asyncio.timeout, not wait_for, which on 3.11 can swallow close()'s cancel
                async with asyncio.timeout(max(wait_s, 0.001)):
                    await wake.wait()
            except TimeoutError:
                pass

    async def _heartbeat(self) -> None:
        sent = (self.member_id, self.generation)
        try:
            conn = await self._coordinator_connection()
            response = await conn.send(HeartbeatRequest(self.group_id, self.generation, self.member_id,
                                                        self.group_instance_id), timeout_s=self.request_timeout_s)
        except PymqError as err:  # COORDINATOR_ERRORS, or FindCoordinator's own
            self._coordinator_dead(err)
            self._next_heartbeat = time.monotonic() + self.retry_backoff_s
            return
        err = response.error()
        if err is None:
            return
        if isinstance(err, RebalanceInProgressError):
            if self._current(sent):
                self.request_rejoin("the group is rebalancing")
        elif isinstance(err, (UnknownMemberIdError, IllegalGenerationError)):
            self._reset_membership(err, sent, forget_member=isinstance(err, UnknownMemberIdError))
        elif isinstance(err, FencedInstanceIdError):
            self._fence(err, sent)
        elif isinstance(err, COORDINATOR_ERRORS):
            self._coordinator_dead(err)
            self._next_heartbeat = time.monotonic() + self.retry_backoff_s
        else:
            log.warning("group %s: heartbeat failed: %s", self.group_id, err)

    async def _leave_after_poll_timeout(self) -> None:
        """Kafka's heartbeat thread on an expired poll timer: the application is stuck in its
        processing, so the member leaves (its partitions go to others at once instead of after the
        rebalance timeout) and joins again at its next poll."""
        log.warning("group %s: no poll within max.poll.interval.ms (%.0f ms): leaving the group; the next poll "
                    "rejoins. Poll more often, process less per poll (max_records), or raise max.poll.interval.ms",
                    self.group_id, self.max_poll_interval_s * 1000)
        if self._join_task is not None:
            self._join_task.cancel()
            self._join_task = None
        await self.leave("consumer poll timeout has expired")
        self._lose("no poll within max.poll.interval.ms")

    def _awaits_missing_topic(self) -> bool:
        """As the leader, it assigned while a subscribed topic did not exist (deleted, or not
        created yet): metadata is then checked with backoff (retry_backoff_ms doubling up to
        METADATA_BACKOFF_MAX_S) rather than every metadata_max_age_ms, so that the topic is
        assigned soon after it is created (Kafka's consumer asks for metadata of an unknown
        subscribed topic at each retry)."""
        return self.generation >= 0 and 0 in self._leader_counts.values()

    async def _check_metadata(self) -> None:
        """Rejoin if the pattern now matches other topics, or (as the leader) a subscribed topic's
        partition count changed since the assignment."""
        try:
            if self.pattern is not None:
                await self.cluster.refresh()
                if self._in_group() and self.subscribed_topics() != self._joined_topics:
                    self.request_rejoin("the topics matching the subscribed pattern changed")
            if self._leader_counts and self.generation >= 0:
                await self._partition_counts(self._leader_counts)
                self._metadata_updated()
        except PymqError as err:
            log.info("group %s: metadata refresh failed: %s", self.group_id, err)

    def _metadata_updated(self) -> None:
        """Metadata was refreshed (loop): as the leader, rejoin if a subscribed topic's partition
        count (0: deleted) differs from the one it assigned from."""
        if self._leader_counts and self.generation >= 0:
            counts = {topic: len(self.cluster.topics.get(topic, ())) for topic in self._leader_counts}
            if counts != self._leader_counts:
                self.request_rejoin("the partition count of a subscribed topic changed")

    # -- the coordinator broker ------------------------------------------------------------------------

    async def _coordinator_connection(self) -> BrokerConnection:
        """The connection to the group's coordinator, found first if unknown. A connection of its
        own (as Kafka's): heartbeats never queue behind fetches. Raises a retriable error when no
        broker names a coordinator now."""
        conn = self._coordinator
        if conn is not None and not conn.closed:
            return conn
        if self._finding is None:
            self._finding = asyncio.Lock()
        async with self._finding:
            if self._coordinator is not None and not self._coordinator.closed:
                return self._coordinator
            found = await self.cluster.send(None, FindCoordinatorRequest(self.group_id))
            err = found.error()
            if isinstance(err, CoordinatorNotAvailableError):
                # Brokers here answer only for the partitions they lead: ask each one.
                for node in list(self.cluster.brokers):
                    try:
                        answer = await self.cluster.send(node, FindCoordinatorRequest(self.group_id))
                    except (NetworkError, RequestTimedOutError):
                        continue  # that one is down; another may be the coordinator
                    if answer.error() is None:
                        found, err = answer, None
                        break
            if err is not None:
                raise err
            self._coordinator = await BrokerConnection.open(found.host, found.port, self.request_timeout_s)
            log.info("group %s: coordinator is broker %d at %s:%d", self.group_id, found.node_id, found.host, found.port)
            return self._coordinator

    def _coordinator_dead(self, err: PymqError) -> None:
        if self._coordinator is not None:
            log.info("group %s: coordinator unavailable (%s); finding it again", self.group_id, err)
            self._coordinator.close()
            self._coordinator = None

    async def _request(self, make: Callable[[], Any], deadline: float) -> Any:
        """Send the request `make()` builds to the coordinator until its answer carries no
        coordinator error, retrying after a backoff until `deadline` (then that error is raised).
        Each attempt may take the request timeout: the deadline bounds retries, not answers."""
        while True:
            try:
                conn = await self._coordinator_connection()
                response = await conn.send(make(), timeout_s=self.request_timeout_s)
                err = response.error()
                if not isinstance(err, COORDINATOR_ERRORS):
                    return response
            except COORDINATOR_ERRORS as caught:
                err = caught
            self._coordinator_dead(err)
            if time.monotonic() + self.retry_backoff_s >= deadline:
                raise err
            await asyncio.sleep(self.retry_backoff_s)

    # -- offsets -------------------------------------------------------------------------------------------

    def _commit_identity(self) -> tuple[int, str]:
        """(generation, member id) a commit goes with: the member's while it is in a generation;
        from outside the group (manual assignment) -1 and "", which the coordinator accepts only
        while the group has no members."""
        if self.subscribed and self.generation >= 0:
            return self.generation, self.member_id
        return NO_GENERATION_ID, ""

    async def commit(self, offsets: dict[TopicPartition, int], metadata: str | None = None, *,
                     retry: bool = True) -> None:
        """Commit `offsets` (each the next record to consume). Retries coordinator errors until
        the request timeout when `retry`. Raises the group's error (REBALANCE_IN_PROGRESS: poll to
        finish the rebalance; ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID: the partitions are lost and
        the next poll rejoins) or the first partition's error (e.g. PartitionNotAssignedError)."""
        if not offsets:
            return
        generation, member_id = self._commit_identity()
        by_topic: dict[str, list[OffsetCommitPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(OffsetCommitPartition(partition, offset, metadata=metadata))
        request = OffsetCommitRequest(self.group_id, generation, member_id, self.group_instance_id,
                                      tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()))
        deadline = time.monotonic() + (self.request_timeout_s if retry else 0)
        response = await self._request(lambda: request, deadline)
        err = response.error()
        if err is not None:
            if isinstance(err, (UnknownMemberIdError, IllegalGenerationError)):
                self._reset_membership(err, (member_id, generation), forget_member=isinstance(err, UnknownMemberIdError))
            elif isinstance(err, FencedInstanceIdError):
                self._fence(err, (member_id, generation))
            raise err
        first: PymqError | None = None
        for t in response.topics:
            for p in t.partitions:
                tp = (t.name, p.partition)
                failed = p.error()
                if failed is None and tp in offsets:
                    self.committed_offsets[tp] = offsets[tp]
                elif failed is not None and first is None:
                    first = failed
        if first is not None:
            raise first

    def commit_in_background(self, offsets: dict[TopicPartition, int], metadata: str | None,
                             callback: CommitCallback | None) -> None:
        """Commit without waiting (loop), one attempt (a retried async commit could overtake a
        later one and move the offset back). The outcome goes to `callback` on the application's
        thread at its next poll; without one, a failure is logged."""
        async def run() -> None:
            error: PymqError | None = None
            try:
                await self.commit(offsets, metadata, retry=False)
            except PymqError as err:
                error = err
                if callback is None:
                    log.warning("group %s: async commit of %d partitions failed: %s", self.group_id, len(offsets), err)
            if callback is not None:
                self.events.append(CommitEvent(callback, offsets, error))
                self._fetcher.wake_poller()

        task = asyncio.get_running_loop().create_task(run())
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def flush_commits(self, timeout_s: float) -> None:
        """Wait for the async commits in flight (close does, so that its own commit is the last)."""
        if self._commits:
            await asyncio.wait(set(self._commits), timeout=timeout_s)

    async def fetch_committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        by_topic: dict[str, list[int]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(partition)
        request = OffsetFetchRequest(self.group_id, tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()))
        response = await self._request(lambda: request, time.monotonic() + self.request_timeout_s)
        err = response.error()
        if err is not None:
            raise err
        found: dict[TopicPartition, int | None] = dict.fromkeys(wanted)
        for t in response.topics:
            for p in t.partitions:
                failed = p.error()
                if failed is not None:
                    raise failed
                if (t.name, p.partition) in found and p.committed_offset >= 0:
                    found[(t.name, p.partition)] = p.committed_offset
                    self.committed_offsets[(t.name, p.partition)] = p.committed_offset
        return found

    # -- leaving ---------------------------------------------------------------------------------------------

    async def leave(self, reason: str) -> None:
        """Leave the group: LeaveGroup for a dynamic member (its partitions move at once); a static
        member sends nothing, so that a restart within the session timeout is no rebalance. Either
        way this member's generation ends here. Failures are logged: the session timeout removes
        a member that could not say goodbye."""
        if self.member_id and not self.is_static:
            request = LeaveGroupRequest(self.group_id, (MemberIdentity(self.member_id, None, reason),))
            try:
                response = await self._request(lambda: request, time.monotonic() + self.request_timeout_s)
                err = response.error() or next((m.error() for m in response.members if m.error() is not None), None)
                if err is not None:
                    log.info("group %s: LeaveGroup answered %s", self.group_id, err)
                else:
                    log.info("group %s: member %s left (%s)", self.group_id, self.member_id, reason)
            except PymqError as err:
                log.warning("group %s: LeaveGroup failed (the session timeout will remove the member): %s",
                            self.group_id, err)
            self.member_id = ""
        self.generation = NO_GENERATION_ID
        self._owned_generation = NO_GENERATION

    async def unsubscribe(self) -> None:
        """Forget the subscription and stop the background task (the caller left the group)."""
        self.topics, self.pattern = None, None
        self.needs_rejoin = False
        self._leader_counts = {}
        for task in (self._join_task, self._background):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._join_task, self._background) if t is not None), return_exceptions=True)
        self._join_task = self._background = None

    async def close(self) -> None:
        await self.unsubscribe()
        for task in list(self._commits):
            task.cancel()
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    # -- the poll's group work, driven from the application's thread ---------------------------------------
    #
    # Kafka's ConsumerCoordinator.poll, onJoinPrepare, onJoinComplete and close. Each generator
    # runs on the application's thread (so the listener and commit callbacks do); the coroutines
    # it yields do the loop's part. `client.steps.run_steps` drives them.

    def poll_steps(self, deadline: float) -> Steps[None]:
        """A poll's group work: queued events (on_lost, commit callbacks), the fatal error of a
        fenced static member, auto-commit when due, and the rebalance if one is needed. Waits
        for a join only while the consumer has no partitions to read (up to `deadline`). A
        callback's exception is raised once this bookkeeping is done."""
        self._fetcher.clear_attention()
        errors: list[Exception] = []
        yield from self._run_events(errors)
        if self.fatal is not None:
            raise self.fatal
        if self.enable_auto_commit and self.auto_commit_due():
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_in_background(offsets)
        if self.subscribed:
            if self.needs_rejoin and not self.joining:
                yield from self._prepare_rejoin(errors)
                yield self._start_join()
            if self.joining:
                wait_s = 0.0 if self._subs.assigned else max(deadline - time.monotonic(), 0.0)
                if (yield self.wait_join(wait_s)):
                    yield from self._complete_rejoin(errors)
        if self._subs.needs_position:
            yield self._init_pending_positions()
        if errors:
            raise errors[0]

    def leave_steps(self, reason: str) -> Steps[list[Exception]]:
        """Kafka's close/unsubscribe, the group's part: wait for async commits, auto-commit,
        on_revoke (on_lost if the generation is gone) for the partitions held, and leave the
        group (a dynamic member; a static one only stops). Returns the callbacks' exceptions for
        the caller to raise once it has released the rest of the assignment."""
        errors: list[Exception] = []
        yield self.flush_commits(self.request_timeout_s)
        if self.enable_auto_commit:
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_quietly(offsets)
        yield from self._run_events(errors)
        if self.subscribed:
            owned = sorted(self._subs.assigned)
            if owned:
                listener = self.listener
                callback = listener.on_revoke if self.generation >= 0 else (listener.on_lost or listener.on_revoke)
                yield from self._invoke(callback, owned, errors)
            yield self._leave_group(reason)
        return errors

    def _run_events(self, errors: list[Exception]) -> Steps[None]:
        while self.events:
            event = self.events.popleft()
            if isinstance(event, LostEvent):
                log.warning("partitions lost (%s): %s", event.reason, event.partitions)
                yield from self._invoke(self.listener.on_lost or self.listener.on_revoke, event.partitions, errors)
            else:
                yield from self._invoke(partial(event.callback, event.offsets), event.error, errors)

    @staticmethod
    def _invoke(callback: Callable[[Any], Any] | None, argument: Any, errors: list[Exception]) -> Steps[None]:
        """Call an application callback here, on the application's thread (an awaitable it
        returns is awaited). Its exception is kept for the poll to raise once the group's
        bookkeeping is done, as Kafka does."""
        if callback is None:
            return
        try:
            result = callback(argument)
            if inspect.isawaitable(result):
                yield _awaited(result)
        except Exception as err:  # the application's: raised from poll afterwards
            log.error("consumer callback %r failed: %s", callback, err)
            errors.append(err)

    def _prepare_rejoin(self, errors: list[Exception]) -> Steps[None]:
        """Kafka's onJoinPrepare: commit what was consumed (auto-commit), then revoke everything
        (eager) or the partitions of topics no longer subscribed (cooperative)."""
        if self.enable_auto_commit:
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_quietly(offsets)
        if self.protocol == "eager":
            revoked = sorted(self._subs.assigned)
        else:
            revoked = sorted(tp for tp in self._subs.assigned if not self.wants_topic(tp[0]))
        if revoked:
            yield from self._invoke(self.listener.on_revoke, revoked, errors)
            yield self._revoke(revoked)

    def _complete_rejoin(self, errors: list[Exception]) -> Steps[None]:
        """Kafka's onJoinComplete: revoke what moved away (cooperative; then rejoin at once so the
        follow-up rebalance places it), take the new assignment, on_assign (cooperative: the added
        partitions; eager: all); the new partitions' committed offsets are looked up after it."""
        assignment = yield self.take_join_result()
        if assignment is None:
            return
        assigned = list(assignment.partitions)
        revoked, added = revocations(set(self._subs.assigned), set(assigned))
        if revoked:
            yield from self._invoke(self.listener.on_revoke, sorted(revoked), errors)
        yield self._apply_assignment(assigned, rejoin=bool(revoked) and self.protocol == "cooperative")
        yield from self._invoke(self.listener.on_assign, sorted(added) if self.protocol == "cooperative" else assigned,
                                errors)

    async def _start_join(self) -> None:
        self.start_join()

    def _keep_assigned(self, partitions: list[TopicPartition]) -> None:
        """Shrink the assignment to `partitions` (loop); while subscribed, they are what it owns."""
        self._fetcher.assign(partitions, needs_position=False)
        if self.subscribed:
            self.owned = frozenset(partitions)

    async def _revoke(self, partitions: list[TopicPartition]) -> None:
        gone = set(partitions)
        self._keep_assigned([tp for tp in self._subs.assigned if tp not in gone])

    async def _apply_assignment(self, partitions: list[TopicPartition], rejoin: bool) -> None:
        self._fetcher.assign(partitions, needs_position=True)
        self.assignment_applied(partitions)
        if rejoin:
            self.request_rejoin("partitions were revoked: the follow-up rebalance places them")

    async def _init_pending_positions(self) -> None:
        """Start positions of newly assigned partitions; a retriable failure (the coordinator
        moved, a leader is unknown) is retried at the next poll."""
        try:
            await self._init_positions(sorted(self._subs.needs_position))
        except PymqError as err:
            if not err.retriable:
                raise
            log.info("start positions of %d partitions not known yet (%s); the next poll retries",
                     len(self._subs.needs_position), err)

    def _uncommitted_positions(self) -> dict[TopicPartition, int]:
        """Positions that differ from what this member last committed: what auto-commit sends. Not
        those of a topic that metadata shows deleted or re-created since they were fetched: an
        offset of the old topic committed for the new one would skip its records."""
        return {tp: offset for tp, offset in self._subs.positions().items()
                if self.committed_offsets.get(tp) != offset and self._fetcher.positions_are_current(tp[0])}

    async def _commit_in_background(self, offsets: dict[TopicPartition, int]) -> None:
        self.commit_in_background(offsets, None, None)

    async def _commit_quietly(self, offsets: dict[TopicPartition, int]) -> None:
        """Auto-commit before giving partitions up: a failure is logged (the records will be
        delivered again: at least once), not raised."""
        try:
            await self.commit(offsets)
        except PymqError as err:
            log.warning("auto-commit of %d partitions before a rebalance failed: %s", len(offsets), err)

    async def _leave_group(self, reason: str) -> None:
        self._keep_assigned([])
        await self.leave(reason)
        await self.unsubscribe()
