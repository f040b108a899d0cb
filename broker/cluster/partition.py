"""Partition: one topic partition as this broker hosts it (Kafka's cluster.Partition).

Sits between the request handlers and the log. It owns what the log cannot know: whether this
broker leads the partition and under which leader epoch, the replica set and ISR, and the high
watermark policy. Requests are checked against it first: a broker that is not the leader answers
NOT_LEADER; a request naming an older leader epoch gets FENCED_LEADER_EPOCH, a newer one
UNKNOWN_LEADER_EPOCH (the sender's metadata, or ours, is stale).

High watermark: the minimum log end offset of the ISR (on a single broker, the leader's own LEO),
and never past what the topic's flush policy lets count as committed (`durable_end_offset`): an
append whose policy demands an fsync becomes visible to consumers, and acknowledged, only once
flushed. Follower log end offsets arrive with replica fetches (a later step); until then the ISR
is the leader alone.

Loop-local: call from the event-loop thread (the log itself is thread-safe).
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from broker.errors import FencedLeaderEpochError, NotLeaderError, UnknownLeaderEpochError
from broker.log import UnifiedLog

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


class Partition:
    def __init__(self, log: UnifiedLog, broker_id: int, state: LeaderAndIsr, executor: BoundedExecutor) -> None:
        self.log = log
        self._executor = executor  # where leader-epoch files are written
        self.topic = log.topic
        self.partition = log.partition
        self.broker_id = broker_id
        self.state = state
        self._follower_end_offsets: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, leader {self.state.leader}, epoch {self.state.leader_epoch})"

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.broker_id

    async def make_leader(self, state: LeaderAndIsr) -> bool:
        """Take over as leader under `state.leader_epoch`: the epoch starts at our LEO (recorded
        off the event loop), and the high watermark moves to what the new ISR has. Returns True if
        the high watermark moved."""
        assert state.leader == self.broker_id, (state, self.broker_id)
        self.state = state
        self._follower_end_offsets = {}
        await self._executor.run(self.log.assign_epoch_start_offset, state.leader_epoch)
        return self.maybe_increment_high_watermark()

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

    def maybe_increment_high_watermark(self) -> bool:
        """Advance the high watermark to the minimum LEO of the ISR, capped by what the flush
        policy lets count; True if it moved (fetches and acks=all produces waiting on it wake)."""
        candidate = self.log.durable_end_offset
        for replica in self.state.isr:
            if replica != self.broker_id:
                candidate = min(candidate, self._follower_end_offsets.get(replica, 0))
        return self.log.maybe_increment_high_watermark(candidate)
