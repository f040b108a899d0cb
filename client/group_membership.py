"""GroupMembership: a member's place in its group, on the consumer's event loop (Kafka's
AbstractCoordinator and its HeartbeatThread, classic protocol).

    unjoined ──poll──▶ joining ──────────────────────────────────────▶ stable ──┐ heartbeats
       ▲      JoinGroup (MEMBER_ID_REQUIRED: again with the id given), │
       │      the leader assigns, SyncGroup                            │ REBALANCE_IN_PROGRESS, new
       │                                                               │ subscription, metadata change,
       │                                                               ▼ cooperative revocation
       │                                                        rejoin at the next poll
       └── lost: UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID, or no poll within
           max.poll.interval.ms (a dynamic member sends LeaveGroup); the next poll joins again

It speaks the group protocol and nothing else: finds the coordinator broker (FindCoordinator,
again after NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS or a lost
connection, after `retry_backoff_ms`), joins and syncs, keeps the member id and generation,
heartbeats, leaves, and sends other requests to the coordinator (`request`). What the member
says in a JoinGroup and what the leader assigns are the `MembershipListener`'s (the
ConsumerCoordinator's: subscription, assignors), as is what losing the generation means
(Kafka's abstract `metadata`, `onLeaderElected` and the lost-partitions path).

Background task, from `start` to `stop`, independent of the application's poll loop (a slow
processing step does not lose the session):
  - a Heartbeat every `heartbeat_interval_ms` while the member has a generation and no
    JoinGroup/SyncGroup is in flight; REBALANCE_IN_PROGRESS asks for a rejoin at the next poll;
  - the poll timer: no poll for `max_poll_interval_ms` means the application is stuck, so the
    member leaves the group (LeaveGroup; a static member just stops, as Kafka's does) and its
    partitions are lost; the next poll joins again;
  - the listener's own periodic work (`background_step`: the consumer's metadata checks).

Stale answers are not believed: an error that resets the membership (ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID) does so only if the member is still in the generation the request was sent in
(an async commit from the previous generation cannot throw away the current one).

The JoinGroup's request timeout exceeds the rebalance timeout (`max_poll_interval_ms` + 5 s, as
Kafka's): the coordinator answers it only when the rebalance completes.

Loop-local, except `note_poll_start` / `note_poll_end` and reads of the plain attributes, which
the application's thread may do.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from client.cluster import Cluster
from client.connection import BrokerConnection
from common.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    IllegalGenerationError,
    MemberIdRequiredError,
    NetworkError,
    NotCoordinatorError,
    PymqError,
    RebalanceInProgressError,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from protocol.consumer_protocol import PROTOCOL_TYPE, Assignment
from protocol.messages.group import (
    NO_GENERATION_ID,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    SyncGroupAssignment,
    SyncGroupRequest,
)

log = logging.getLogger("pymq.consumer.group")

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


class MembershipListener(Protocol):
    """What the membership asks of the member's protocol (the ConsumerCoordinator)."""

    async def join_protocols(self) -> tuple[JoinGroupProtocol, ...]:
        """The protocols (assignors, with this member's metadata) a JoinGroup offers."""

    async def sync_assignments(self, joined: JoinGroupResponse) -> tuple[SyncGroupAssignment, ...]:
        """What SyncGroup sends: every member's assignment when this member leads, else nothing."""

    def generation_lost(self, reason: str) -> None:
        """The member's generation is gone: what it owned is someone else's now."""

    async def background_step(self, now: float) -> float:
        """Periodic work, asked at every turn of the background task (it does nothing until
        due); returns when it is due next (time.monotonic)."""


class GroupMembership:
    """One member's place in its group; see the module docstring. `wake_poller` interrupts a
    poll waiting for records, so that it handles what the background task found."""

    def __init__(self, cluster: Cluster, listener: MembershipListener, group_id: str, *,
                 group_instance_id: str | None, client_id: str, session_timeout_ms: int, heartbeat_interval_ms: int,
                 max_poll_interval_ms: int, request_timeout_ms: int, retry_backoff_ms: int,
                 wake_poller: Callable[[], None]) -> None:
        self.cluster = cluster
        self._listener = listener
        self._wake_poller = wake_poller
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.max_poll_interval_s = max_poll_interval_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.join_timeout_s = max(self.request_timeout_s, self.max_poll_interval_s + JOIN_TIMEOUT_MARGIN_S)
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.member_id = ""
        self.generation = NO_GENERATION_ID
        self.leader = ""
        self.needs_rejoin = False
        self.fatal: PymqError | None = None  # FENCED_INSTANCE_ID: every poll raises it
        self._coordinator: BrokerConnection | None = None
        self._finding: asyncio.Lock | None = None
        self._join_task: asyncio.Task[tuple[int, Assignment]] | None = None
        self._background: asyncio.Task[None] | None = None
        self._background_wake: asyncio.Event | None = None
        self._polling = False
        self._last_poll = time.monotonic()
        self._next_heartbeat = 0.0

    # -- state ---------------------------------------------------------------------------------------

    @property
    def joining(self) -> bool:
        """A JoinGroup/SyncGroup round is running or finished with a result not yet taken."""
        return self._join_task is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self) -> GroupMetadata:
        return GroupMetadata(self.group_id, self.generation, self.member_id, self.group_instance_id)

    def in_group(self) -> bool:
        """In a generation, or joining one."""
        return self.generation >= 0 or self._join_task is not None

    def current(self, sent: tuple[str, int]) -> bool:
        """Whether the member is still in the (member id, generation) a request was sent with."""
        return sent == (self.member_id, self.generation)

    # -- the poll timer (any thread) ---------------------------------------------------------------

    def note_poll_start(self) -> None:
        """The application is in poll: it is not stuck, however long poll waits."""
        self._polling = True
        self._last_poll = time.monotonic()

    def note_poll_end(self) -> None:
        self._last_poll = time.monotonic()
        self._polling = False

    # -- the background task -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background task (loop) if it is not running; the poll timer starts now."""
        self._last_poll = time.monotonic()
        if self._background is None or self._background.done():
            self._background_wake = asyncio.Event()
            self._background = asyncio.get_running_loop().create_task(self._run_background())

    async def stop(self) -> None:
        """Stop the background task and any join in flight (the member left, or is closing)."""
        self.needs_rejoin = False
        for task in (self._join_task, self._background):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._join_task, self._background) if t is not None), return_exceptions=True)
        self._join_task = self._background = None

    async def close(self) -> None:
        await self.stop()
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def request_rejoin(self, reason: str) -> None:
        if not self.needs_rejoin:
            log.info("group %s: rejoin requested: %s", self.group_id, reason)
        self.needs_rejoin = True
        self._wake_poller()

    def _can_heartbeat(self) -> bool:
        return self.generation >= 0 and bool(self.member_id) and (self._join_task is None or self._join_task.done())

    def _poll_deadline(self) -> float:
        return float("inf") if self._polling or not self.in_group() else self._last_poll + self.max_poll_interval_s

    async def _run_background(self) -> None:
        wake = self._background_wake
        assert wake is not None
        while True:
            now = time.monotonic()
            try:
                if now >= self._poll_deadline():
                    await self._leave_after_poll_timeout()
                next_step = await self._listener.background_step(now)
                if self._can_heartbeat() and now >= self._next_heartbeat:
                    self._next_heartbeat = now + self.heartbeat_interval_s
                    await self._heartbeat()
            except Exception:  # noqa: BLE001 - a bug here must not stop the heartbeats for good
                log.exception("group %s: background task step failed; going on", self.group_id)
                await asyncio.sleep(self.retry_backoff_s)
                next_step = time.monotonic()
            now = time.monotonic()
            next_beat = self._next_heartbeat if self._can_heartbeat() else now + self.heartbeat_interval_s
            wait_s = min(next_beat, next_step, self._poll_deadline()) - now
            wake.clear()
            try:  # asyncio.timeout, not wait_for, which on 3.11 can swallow close()'s cancel
                async with asyncio.timeout(max(wait_s, 0.001)):
                    await wake.wait()
            except TimeoutError:
                pass

    def wake_background(self) -> None:
        """Let the background task look at its schedule again (it changed)."""
        if self._background_wake is not None:
            self._background_wake.set()

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
            if self.current(sent):
                self.request_rejoin("the group is rebalancing")
        elif self.membership_error(err, sent):
            return  # the generation is lost, or the member fenced
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

    # -- joining -------------------------------------------------------------------------------------

    def start_join(self) -> None:
        """Start a JoinGroup/SyncGroup round (loop); `wait_join` and `take_join_result` follow."""
        if self._join_task is None:
            self.needs_rejoin = False
            self._join_task = asyncio.get_running_loop().create_task(self._join_group())
            self._join_task.add_done_callback(lambda _: self._wake_poller())

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

    def restart_heartbeats(self) -> None:
        """The member took its assignment: the next heartbeat is a full interval away."""
        self._next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        self.wake_background()

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

    async def _join(self, conn: BrokerConnection) -> JoinGroupResponse | None:
        """One JoinGroup; its answer, or None to join again (after acting on its error)."""
        request = JoinGroupRequest(self.group_id, self.session_timeout_ms, int(self.max_poll_interval_s * 1000),
                                   self.member_id, self.group_instance_id, PROTOCOL_TYPE,
                                   await self._listener.join_protocols(), self.client_id)
        response = await conn.send(request, timeout_s=self.join_timeout_s)
        err = response.error()
        if err is None:
            self.member_id, self.generation, self.leader = response.member_id, response.generation_id, response.leader
            return response
        if isinstance(err, MemberIdRequiredError):  # KIP-394: join again with the id the coordinator gave
            self.member_id = response.member_id
            return None
        self._join_error(err, (request.member_id, self.generation), "JoinGroup")
        return None

    async def _sync(self, conn: BrokerConnection, joined: JoinGroupResponse) -> Assignment | None:
        """SyncGroup (the leader sends every member's assignment); this member's assignment, or
        None to join again."""
        assignments = await self._listener.sync_assignments(joined)
        request = SyncGroupRequest(self.group_id, joined.generation_id, joined.member_id, self.group_instance_id,
                                   PROTOCOL_TYPE, joined.protocol_name, assignments)
        response = await conn.send(request, timeout_s=self.join_timeout_s)
        err = response.error()
        if err is None:
            return Assignment.decode(response.assignment) if response.assignment else Assignment()
        self._join_error(err, (joined.member_id, joined.generation_id), "SyncGroup")
        return None

    def _join_error(self, err: PymqError, sent: tuple[str, int], what: str) -> None:
        """Act on a JoinGroup/SyncGroup error: retriable ones return (the caller joins again),
        fatal ones are raised to the application."""
        if isinstance(err, RebalanceInProgressError):
            return  # a newer rebalance began (or this join was superseded): join again at once
        if self.membership_error(err, sent) and not isinstance(err, FencedInstanceIdError):
            return  # the generation is lost: join again
        if isinstance(err, COORDINATOR_ERRORS):
            raise err  # the join loop finds the coordinator again
        log.error("group %s: %s failed: %s", self.group_id, what, err)
        raise err

    # -- losing the generation -------------------------------------------------------------------------

    def membership_error(self, err: PymqError, sent: tuple[str, int]) -> bool:
        """Act on an answer that says the member is not what it thinks (UNKNOWN_MEMBER_ID,
        ILLEGAL_GENERATION: the generation is lost; FENCED_INSTANCE_ID: this process must stop)
        for a request sent as `sent` (member id, generation); whether `err` was one of those."""
        if isinstance(err, (UnknownMemberIdError, IllegalGenerationError)):
            self._reset_membership(err, sent, forget_member=isinstance(err, UnknownMemberIdError))
            return True
        if isinstance(err, FencedInstanceIdError):
            self._fence(err, sent)
            return True
        return False

    def _reset_membership(self, err: PymqError, sent: tuple[str, int], *, forget_member: bool) -> None:
        """The coordinator no longer knows this member in that generation: what it owned is lost."""
        if not self.current(sent):
            return
        log.warning("group %s: member %s lost generation %d: %s", self.group_id, self.member_id, self.generation, err)
        if forget_member:
            self.member_id = ""
        self._lose(f"{err.name()}: {err}")

    def _fence(self, err: PymqError, sent: tuple[str, int]) -> None:
        """Another process joined with this group.instance.id: this one must stop (every poll raises)."""
        if self.current(sent) or self.fatal is None:
            log.error("group %s: static member %s is fenced: %s", self.group_id, self.group_instance_id, err)
            self.fatal = err
            self._lose(f"fenced: {err}")

    def _lose(self, reason: str) -> None:
        self.generation = NO_GENERATION_ID
        if self._join_task is None or self._join_task.done():
            self.needs_rejoin = True  # (a join in flight goes on: it is the rejoin)
        self._listener.generation_lost(reason)
        self._wake_poller()

    # -- leaving ---------------------------------------------------------------------------------------

    async def leave(self, reason: str) -> None:
        """Leave the group: LeaveGroup for a dynamic member (its partitions move at once); a static
        member sends nothing, so that a restart within the session timeout is no rebalance. Either
        way this member's generation ends here. Failures are logged: the session timeout removes
        a member that could not say goodbye."""
        if self.member_id and not self.is_static:
            request = LeaveGroupRequest(self.group_id, (MemberIdentity(self.member_id, None, reason),))
            try:
                response = await self.request(lambda: request, time.monotonic() + self.request_timeout_s)
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

    async def request(self, make: Callable[[], Any], deadline: float) -> Any:
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
