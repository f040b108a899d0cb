"""ConsumerCoordinator: what a consumer does as a group member, on the consumer's event loop
(Kafka's ConsumerCoordinator, classic protocol).

Division of labour. `GroupMembership` (client/group_membership.py, Kafka's AbstractCoordinator
and HeartbeatThread) keeps the membership: the coordinator broker, JoinGroup/SyncGroup, the
generation, heartbeats, the poll timer, LeaveGroup. This class is the consumer's side of it:
  - what the member joins with: the subscription (the SubscriptionState's topics or pattern),
    the assignors offered, and under the cooperative protocol the partitions it owns; as the
    leader, every member's assignment from the assignor the coordinator chose;
  - offsets: commit (sync and async), fetch committed offsets, auto-commit;
  - the choreography around a rebalance (Kafka's ConsumerCoordinator.poll, onJoinPrepare,
    onJoinComplete, close): `poll_steps` and `leave_steps` are generators that the consumer
    drives from its `poll`, `unsubscribe` and `close` with `client.steps.run_steps` (the sync
    Consumer too, on its application thread). Application code (the rebalance listener, commit
    callbacks) runs in the generator, on the application's thread as in Kafka; each coroutine
    the generator yields runs on the consumer's loop. What the background task found (a lost
    generation, a completed commit, a fatal error) waits in `events` and the membership's
    `fatal` for the next poll's steps;
  - metadata, on the membership's background task: every `metadata_max_age_ms` (with backoff
    while the leader assigned without a subscribed topic that does not exist:
    `_awaits_missing_topic`), a pattern subscription that now matches other topics, or (on the
    leader) a subscribed topic whose partition count changed, asks for a rejoin. The leader
    compares the counts also whenever the fetcher refreshes metadata (Kafka's coordinator checks
    its metadata snapshot on every update): a subscribed topic deleted, or re-created with
    another partition count, is revoked and reassigned without waiting for metadata_max_age_ms.

The consumer's parts come in through the constructor: the SubscriptionState whose assignment the
group changes, the Fetcher that keeps its buffer in step with that assignment and is woken when
the group needs the poller, and `init_positions` (the OffsetFetcher's lookup of start positions
for newly assigned partitions: committed offsets, else `auto_offset_reset`).

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
from client.fetcher import METADATA_BACKOFF_MAX_S, Fetcher
from client.group_membership import GroupMembership, GroupMetadata
from client.retry import Retry
from client.steps import Steps
from client.subscription_state import SubscriptionState
from common.errors import InvalidRequestError, PymqError
from common.topic_partition import TopicPartition
from protocol.consumer_protocol import NO_GENERATION, Subscription
from protocol.messages.base import TopicRequest
from protocol.messages.group import (
    NO_GENERATION_ID,
    JoinGroupMember,
    JoinGroupProtocol,
    JoinGroupResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupAssignment,
)

log = logging.getLogger("pymq.consumer.group")

RebalanceProtocol = Literal["eager", "cooperative"]
CommitCallback = Callable[[dict[TopicPartition, int], PymqError | None], Any]
RebalanceCallback = Callable[[list[TopicPartition]], Any]

T = TypeVar("T")


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


class ConsumerCoordinator:
    """One consumer's part in its group; see the module docstring. Lost partitions leave the
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
        self.membership = GroupMembership(
            cluster, self, group_id, group_instance_id=group_instance_id, client_id=client_id,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, wake_poller=fetcher.wake_poller)
        self.group_id = group_id
        self.assignors = list(assignors)
        self.protocol: RebalanceProtocol = rebalance_protocol(assignors)
        self.request_timeout_s = request_timeout_ms / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.owned: frozenset[TopicPartition] = frozenset()  # the assignment while subscribed
        self._owned_generation = NO_GENERATION  # the generation `owned` was assigned in
        self.events: deque[LostEvent | CommitEvent] = deque()  # for the application's thread
        self.listener = RebalanceListener()
        self._joined_topics: frozenset[str] = frozenset()  # the topics of the last JoinGroup
        self._leader_counts: dict[str, int] = {}  # as the leader: the partition counts it assigned from
        self._next_metadata: float | None = None  # when the background task checks metadata next
        self._missing_backoff = self.retry_backoff_s
        self._positions_retry = Retry(self.retry_backoff_s)  # start-position lookups that failed
        self._positions_not_before = 0.0
        self.committed_offsets: dict[TopicPartition, int] = {}  # what this member last committed or read
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        self._commits: set[asyncio.Task[None]] = set()

    # -- state the consumer reads ----------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return self._subs.is_subscribed

    def metadata(self) -> GroupMetadata:
        return self.membership.metadata()

    def note_poll_start(self) -> None:
        """The application is in poll (any thread): it is not stuck, however long poll waits."""
        self.membership.note_poll_start()

    def note_poll_end(self) -> None:
        self.membership.note_poll_end()

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
        changed = self._subs.subscribe(topics, pattern)
        self.listener = listener
        if changed or not self.membership.in_group():
            self.membership.request_rejoin("the subscription changed")
        self.membership.start()

    def subscribed_topics(self) -> frozenset[str]:
        """The topics to subscribe to now: the explicit ones, or the pattern's matches among the
        topics the cluster metadata knows."""
        return self._subs.subscribed_topics(self.cluster.topics)

    # -- what the membership asks (MembershipListener) -------------------------------------------------

    async def join_protocols(self) -> tuple[JoinGroupProtocol, ...]:
        """This member's JoinGroup metadata, offered with each assignor. Eager members own nothing
        when they join (they revoked everything first) and send neither partitions nor a
        generation: identical metadata lets a restarted static member take its place back without
        a rebalance."""
        if self._subs.has_pattern_subscription:
            await self.cluster.refresh()  # resolve the pattern against current metadata
        topics = self.subscribed_topics()
        self._joined_topics = topics
        if self.protocol == "eager":
            subscription = Subscription(tuple(topics))
        else:
            subscription = Subscription(tuple(topics), tuple(self.owned), self._owned_generation)
        metadata = subscription.encode()
        return tuple(JoinGroupProtocol(name, metadata) for name in self.assignors)

    async def sync_assignments(self, joined: JoinGroupResponse) -> tuple[SyncGroupAssignment, ...]:
        """As the leader, every member's assignment (none when a static leader restarted: the group
        keeps its assignment); as a follower, nothing."""
        if joined.leader != joined.member_id:
            self._leader_counts = {}
            return ()
        if joined.skip_assignment:
            self._leader_counts = await self._partition_counts(self._group_topics(joined.members))
            return ()
        return await self._assign(joined.protocol_name or "", joined.members)

    def generation_lost(self, reason: str) -> None:
        """The membership lost its generation: the partitions owned are lost (on_lost at the next poll)."""
        lost = sorted(self.owned)
        self.owned, self._owned_generation = frozenset(), NO_GENERATION
        if lost:
            self.events.append(LostEvent(lost, reason))
            gone = set(lost)
            self._keep_assigned([tp for tp in self._subs.assigned_partitions() if tp not in gone])

    async def background_step(self, now: float) -> float:
        """Check metadata when due (see the module docstring); when it is due next."""
        if self._next_metadata is None:
            self._next_metadata = now + self.metadata_max_age_s
        if now >= self._next_metadata:
            await self._check_metadata()
            if self._awaits_missing_topic():
                self._next_metadata = now + self._missing_backoff
                self._missing_backoff = min(2 * self._missing_backoff, max(METADATA_BACKOFF_MAX_S, self.retry_backoff_s))
            else:
                self._next_metadata = now + self.metadata_max_age_s
                self._missing_backoff = self.retry_backoff_s
        elif self._awaits_missing_topic() and self._missing_backoff == self.retry_backoff_s:  # just began
            self._next_metadata = min(self._next_metadata, now + self._missing_backoff)
        return self._next_metadata

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

    # -- metadata ------------------------------------------------------------------------------------------

    def _awaits_missing_topic(self) -> bool:
        """As the leader, it assigned while a subscribed topic did not exist (deleted, or not
        created yet): metadata is then checked with backoff (retry_backoff_ms doubling up to
        METADATA_BACKOFF_MAX_S) rather than every metadata_max_age_ms, so that the topic is
        assigned soon after it is created (Kafka's consumer asks for metadata of an unknown
        subscribed topic at each retry)."""
        return self.membership.generation >= 0 and 0 in self._leader_counts.values()

    async def _check_metadata(self) -> None:
        """Rejoin if the pattern now matches other topics, or (as the leader) a subscribed topic's
        partition count changed since the assignment."""
        try:
            if self._subs.has_pattern_subscription:
                await self.cluster.refresh()
                if self.membership.in_group() and self.subscribed_topics() != self._joined_topics:
                    self.membership.request_rejoin("the topics matching the subscribed pattern changed")
            if self._leader_counts and self.membership.generation >= 0:
                await self._partition_counts(self._leader_counts)
                self._metadata_updated()
        except PymqError as err:
            log.info("group %s: metadata refresh failed: %s", self.group_id, err)

    def _metadata_updated(self) -> None:
        """Metadata was refreshed (loop): as the leader, rejoin if a subscribed topic's partition
        count (0: deleted) differs from the one it assigned from."""
        if self._leader_counts and self.membership.generation >= 0:
            counts = {topic: len(self.cluster.topics.get(topic, ())) for topic in self._leader_counts}
            if counts != self._leader_counts:
                self.membership.request_rejoin("the partition count of a subscribed topic changed")

    # -- offsets -------------------------------------------------------------------------------------------

    def _commit_identity(self) -> tuple[int, str]:
        """(generation, member id) a commit goes with: the member's while it is in a generation;
        from outside the group (manual assignment) -1 and "", which the coordinator accepts only
        while the group has no members."""
        membership = self.membership
        if self.subscribed and membership.generation >= 0:
            return membership.generation, membership.member_id
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
        request = OffsetCommitRequest(self.group_id, generation, member_id, self.membership.group_instance_id,
                                      tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()))
        deadline = time.monotonic() + (self.request_timeout_s if retry else 0)
        response = await self.membership.request(lambda: request, deadline)
        err = response.error()
        if err is not None:
            self.membership.membership_error(err, (member_id, generation))
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
        response = await self.membership.request(lambda: request, time.monotonic() + self.request_timeout_s)
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

    async def unsubscribe(self) -> None:
        """Forget the subscription and stop the background task (the caller left the group)."""
        with self._subs.lock:
            self._fetcher.assignment_changed(self._subs.unsubscribe())
        self._leader_counts = {}
        self._next_metadata = None
        await self.membership.stop()

    async def close(self) -> None:
        await self.unsubscribe()
        for task in list(self._commits):
            task.cancel()
        await self.membership.close()

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
        membership = self.membership
        self._fetcher.clear_attention()
        errors: list[Exception] = []
        yield from self._run_events(errors)
        if membership.fatal is not None:
            raise membership.fatal
        if self.enable_auto_commit and self.auto_commit_due():
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_in_background(offsets)
        if self.subscribed:
            if membership.needs_rejoin and not membership.joining:
                yield from self._prepare_rejoin(errors)
                yield self._start_join()
            if membership.joining:
                wait_s = 0.0 if self._subs.assigned_partitions() else max(deadline - time.monotonic(), 0.0)
                if (yield membership.wait_join(wait_s)):
                    yield from self._complete_rejoin(errors)
        if self._subs.initializing_partitions():
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
            owned = sorted(self._subs.assigned_partitions())
            if owned:
                listener = self.listener
                in_generation = self.membership.generation >= 0
                callback = listener.on_revoke if in_generation else (listener.on_lost or listener.on_revoke)
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
            revoked = sorted(self._subs.assigned_partitions())
        else:
            revoked = sorted(tp for tp in self._subs.assigned_partitions() if not self._subs.matches(tp[0]))
        if revoked:
            yield self._mark_pending_revocation(revoked)
            yield from self._invoke(self.listener.on_revoke, revoked, errors)
            yield self._revoke(revoked)

    def _complete_rejoin(self, errors: list[Exception]) -> Steps[None]:
        """Kafka's onJoinComplete: revoke what moved away (cooperative; then rejoin at once so the
        follow-up rebalance places it), take the new assignment, on_assign (cooperative: the added
        partitions; eager: all); the new partitions' committed offsets are looked up after it."""
        assignment = yield self.membership.take_join_result()
        if assignment is None:
            return
        assigned = list(assignment.partitions)
        revoked, added = revocations(set(self._subs.assigned_partitions()), set(assigned))
        if revoked:
            yield self._mark_pending_revocation(revoked)
            yield from self._invoke(self.listener.on_revoke, sorted(revoked), errors)
        yield self._apply_assignment(assigned, rejoin=bool(revoked) and self.protocol == "cooperative")
        yield from self._invoke(self.listener.on_assign, sorted(added) if self.protocol == "cooperative" else assigned,
                                errors)

    async def _start_join(self) -> None:
        self.membership.start_join()

    def _keep_assigned(self, partitions: list[TopicPartition]) -> None:
        """Shrink the assignment to `partitions` (loop); while subscribed, they are what it owns."""
        with self._subs.lock:
            self._fetcher.assignment_changed(self._subs.assign_from_subscribed(partitions))
        if self.subscribed:
            self.owned = frozenset(partitions)

    async def _mark_pending_revocation(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch no more of partitions about to be revoked while on_revoke runs (Kafka's markPendingRevocation)."""
        self._subs.mark_pending_revocation(partitions)
        self._fetcher.replan()

    async def _revoke(self, partitions: list[TopicPartition]) -> None:
        gone = set(partitions)
        self._keep_assigned([tp for tp in self._subs.assigned_partitions() if tp not in gone])

    async def _apply_assignment(self, partitions: list[TopicPartition], rejoin: bool) -> None:
        with self._subs.lock:
            self._fetcher.assignment_changed(self._subs.assign_from_subscribed(partitions))
        self.owned = frozenset(partitions)
        self._owned_generation = self.membership.generation
        self.membership.restart_heartbeats()
        if rejoin:
            self.membership.request_rejoin("partitions were revoked: the follow-up rebalance places them")

    async def _init_pending_positions(self) -> None:
        """Start positions of newly assigned partitions; a retriable failure (the coordinator
        moved, a leader is unknown or down) is retried by a later poll, after retry_backoff_ms
        doubling (the offset fetcher has refreshed metadata meanwhile)."""
        if time.monotonic() < self._positions_not_before:
            return
        try:
            await self._init_positions(self._subs.initializing_partitions())
        except PymqError as err:
            if not err.retriable:
                raise
            delay_s = self._positions_retry.next_delay_s()
            self._positions_not_before = time.monotonic() + delay_s
            log.info("start positions of %d partitions not known yet (%s); retrying in %.2f s",
                     len(self._subs.initializing_partitions()), err, delay_s)
        else:
            self._positions_retry.reset()

    def _uncommitted_positions(self) -> dict[TopicPartition, int]:
        """Positions that differ from what this member last committed: what auto-commit sends. Not
        those of a topic that metadata shows deleted or re-created since they were fetched: an
        offset of the old topic committed for the new one would skip its records."""
        return {tp: offset for tp, offset in self._subs.all_consumed().items()
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
        await self.membership.leave(reason)
        self._owned_generation = NO_GENERATION
        await self.unsubscribe()
