"""Partition: one topic partition as this broker hosts it (Kafka's cluster.Partition).

Sits between the request handlers and the log. It owns what the log cannot know: whether this
broker leads the partition or follows, under which leader epoch, the replica set and ISR, and the
high watermark policy. Requests are checked against it first: a broker that is not the leader
answers NOT_LEADER; a request naming an older leader epoch gets FENCED_LEADER_EPOCH, a newer one
UNKNOWN_LEADER_EPOCH (the sender's metadata, or ours, is stale).

As leader it tracks each follower from its fetches (Kafka's Replica): the follower's log end
offset is the offset it fetches from, and it is caught up when that reaches the leader's log end
offset as it was at this fetch or at the previous one (`last_caught_up_ms`). The ISR is the leader
and the followers that caught up within `replica.lag.time.max.ms`; the leader proposes changes
(`isr_to_shrink`, `isr_to_expand`), the replica manager writes them to the metadata store with a
compare-and-set, and `committed_state` installs what was written.

High watermark: the minimum log end offset of the ISR (of the ISR plus a follower whose addition
is being written, which is caught up already: Kafka's "maximal ISR"), never past what the topic's
flush policy lets count as committed (`durable_end_offset`): an append whose policy demands an
fsync becomes visible to consumers, and acknowledged, only once flushed. As a follower, the high
watermark is the leader's, as far as this log reaches.

Loop-local: call from the event-loop thread (the log itself is thread-safe).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from broker.log import UnifiedLog
from common.errors import (
    FencedLeaderEpochError,
    NotLeaderError,
    OffsetOutOfRangeError,
    ReplicaNotAvailableError,
    UnknownLeaderEpochError,
)

if TYPE_CHECKING:
    from broker.cluster.topics import PartitionState
    from broker.executors import BoundedExecutor

NO_EPOCH = -1  # a request that does not name the leader epoch it expects


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @classmethod
    def of(cls, state: "PartitionState") -> "LeaderAndIsr":
        """The leadership part of a partition's stored metadata."""
        return cls(state.leader, state.leader_epoch, tuple(state.replicas), tuple(state.isr))


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower, from its fetches."""

    log_end_offset: int = 0
    last_caught_up_ms: int = 0
    last_fetch_leader_end: int = 0
    last_fetch_ms: int = 0


class Partition:
    def __init__(self, log: UnifiedLog, broker_id: int, state: LeaderAndIsr, executor: BoundedExecutor) -> None:
        self.log = log
        self._executor = executor  # where leader-epoch files are written
        self.topic = log.topic
        self.partition = log.partition
        self.broker_id = broker_id
        self.state = state
        self._followers: dict[int, FollowerState] = {}
        self.pending_isr: tuple[int, ...] | None = None  # an ISR change being written to the store

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, leader {self.state.leader}, epoch {self.state.leader_epoch})"

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.broker_id

    async def make_leader(self, state: LeaderAndIsr, now_ms: int = 0) -> bool:
        """Take over as leader under `state.leader_epoch`: the epoch starts at our LEO (recorded
        off the event loop), and the high watermark moves to what the new ISR has. Followers start
        as caught up now (Kafka resets them so none is dropped from the ISR before it could fetch).
        Returns True if the high watermark moved."""
        assert state.leader == self.broker_id, (state, self.broker_id)
        self.state = state
        self.pending_isr = None
        self._followers = {r: FollowerState(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
                           for r in state.replicas if r != self.broker_id}
        await self._executor.run(self.log.assign_epoch_start_offset, state.leader_epoch)
        return self.maybe_increment_high_watermark()

    def make_follower(self, state: LeaderAndIsr) -> None:
        assert state.leader != self.broker_id, (state, self.broker_id)
        self.state = state
        self.pending_isr = None
        self._followers = {}

    def committed_state(self, state: LeaderAndIsr) -> bool:
        """A change of replicas or ISR under the same leader and epoch was stored (this leader's
        ISR change, or the controller's); returns True if the high watermark moved."""
        self.state = state
        self.pending_isr = None
        # Replicas a reassignment added are tracked from their first fetch; removed ones are forgotten.
        self._followers = {r: self._followers.get(r) or FollowerState() for r in state.replicas if r != self.broker_id}
        return self.maybe_increment_high_watermark() if self.is_leader else False

    def check_leader(self, current_leader_epoch: int = NO_EPOCH) -> None:
        """Raise unless this broker leads the partition under the epoch the request expects."""
        if not self.is_leader:
            raise NotLeaderError(f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
                                 f"(leader is {self.state.leader})")
        self.check_epoch(current_leader_epoch)

    def check_epoch(self, current_leader_epoch: int) -> None:
        if current_leader_epoch == NO_EPOCH or current_leader_epoch == self.state.leader_epoch:
            return
        if current_leader_epoch < self.state.leader_epoch:
            raise FencedLeaderEpochError(f"{self.topic}-{self.partition}: leader epoch {current_leader_epoch} is fenced "
                                         f"(current {self.state.leader_epoch})")
        raise UnknownLeaderEpochError(f"{self.topic}-{self.partition}: leader epoch {current_leader_epoch} is newer "
                                      f"than {self.state.leader_epoch}")

    # --- followers, as seen by the leader ---------------------------------------------------

    def update_follower_fetch_state(self, replica: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from `fetch_offset` (so it holds everything below it). Raises
        ReplicaNotAvailableError for a broker that is not a replica, and OffsetOutOfRangeError for
        an offset past this leader's log end (no follower can hold what the leader never wrote:
        taken as progress, it would acknowledge acks=all records no other replica has); either
        way nothing is recorded. Returns True if the high watermark moved (acks=all produces and
        consumer fetches wake)."""
        follower = self._followers.get(replica)
        if follower is None or replica not in self.state.replicas:
            raise ReplicaNotAvailableError(f"broker {replica} is not a replica of {self.topic}-{self.partition} "
                                           f"(replicas {list(self.state.replicas)})")
        leader_end = self.log.log_end_offset
        if fetch_offset > leader_end:
            raise OffsetOutOfRangeError(f"{self.topic}-{self.partition}: broker {replica} fetches from {fetch_offset}, "
                                        f"past the leader's log end {leader_end}")
        if fetch_offset >= leader_end:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        elif fetch_offset >= follower.last_fetch_leader_end:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.log_end_offset = fetch_offset
        follower.last_fetch_leader_end = leader_end
        follower.last_fetch_ms = now_ms
        return self.maybe_increment_high_watermark()

    def follower_end_offset(self, replica: int) -> int:
        follower = self._followers.get(replica)
        return -1 if follower is None else follower.log_end_offset

    def isr_to_expand(self, replica: int) -> tuple[int, ...] | None:
        """The ISR with `replica` added, when it should join: it is a replica outside the ISR, it
        holds everything up to the high watermark, and it reached the current epoch's start (so
        what it has is this leader's history). None otherwise or while a change is being written."""
        if not self.is_leader or self.pending_isr is not None or replica in self.state.isr:
            return None
        follower = self._followers.get(replica)
        if follower is None or replica not in self.state.replicas:
            return None
        epoch_start = next((start for epoch, start in reversed(self.log.leader_epoch_entries)
                            if epoch == self.state.leader_epoch), 0)
        if follower.log_end_offset >= self.log.high_watermark and follower.log_end_offset >= epoch_start:
            return tuple(r for r in self.state.replicas if r in self.state.isr or r == replica)
        return None

    def isr_to_shrink(self, now_ms: int, max_lag_ms: int) -> tuple[int, ...] | None:
        """The ISR without the followers that have not caught up for `max_lag_ms`; None when all
        are in sync or a change is being written."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        leader_end = self.log.log_end_offset
        lagging = {r for r in self.state.isr if r != self.broker_id and not self._caught_up(r, leader_end, now_ms, max_lag_ms)}
        if not lagging:
            return None
        return tuple(r for r in self.state.isr if r not in lagging)

    def _caught_up(self, replica: int, leader_end: int, now_ms: int, max_lag_ms: int) -> bool:
        follower = self._followers.get(replica)
        if follower is None:
            return False
        return follower.log_end_offset >= leader_end or now_ms - follower.last_caught_up_ms <= max_lag_ms

    def with_isr(self, isr: tuple[int, ...]) -> LeaderAndIsr:
        return replace(self.state, isr=isr)

    # --- high watermark ---------------------------------------------------------------------

    def maybe_increment_high_watermark(self) -> bool:
        """Advance the high watermark to the minimum LEO of the ISR (plus a follower being added),
        capped by what the flush policy lets count; True if it moved (fetches and acks=all
        produces waiting on it wake)."""
        if not self.is_leader:
            return False
        candidate = self.log.durable_end_offset
        for replica in set(self.state.isr) | set(self.pending_isr or ()):
            if replica != self.broker_id:
                candidate = min(candidate, self.follower_end_offset(replica) if replica in self._followers else 0)
        return self.log.maybe_increment_high_watermark(candidate)
