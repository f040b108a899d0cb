"""SubscriptionState: what a consumer reads and from where (Kafka's SubscriptionState).

Owns the assigned partitions (by hand or by the group), each partition's consumed position (the
next record `poll` returns: what a commit commits) and fetch position (the next offset to fetch,
ahead of the consumed one by what is buffered), the paused partitions, the reset strategy
(`auto_offset_reset`), the group-assigned partitions still waiting for a start position, and the
fetch order: a partition a poll returned records of goes to the back (Kafka's
`movePartitionToEnd`), so the next fetches name the others first.
It holds values only: the consumer changes them, the fetcher reads and advances them.

Thread rules: `lock` guards the positions and `needs_position`, which the sync Consumer's
application thread reads and moves (a poll takes records without a hop through the loop); the
fetcher's buffer shares the same lock so that taking records and moving positions is one step.
Everything else is changed on the consumer's loop only.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable

import protocol
from common.errors import NoOffsetForPartitionError
from common.topic_partition import TopicPartition

RESET_STRATEGIES = ("earliest", "latest", "none")
# auto.offset.reset values of Kafka's old consumer, which users still paste.
RESET_ALIASES = {"smallest": "earliest", "largest": "latest"}


def reset_timestamp(strategy: str) -> int:
    """The ListOffsets timestamp that finds the log's start ("earliest") or end ("latest")."""
    return protocol.EARLIEST_TIMESTAMP if strategy == "earliest" else protocol.LATEST_TIMESTAMP


class SubscriptionState:
    def __init__(self, auto_offset_reset: str) -> None:
        if auto_offset_reset not in RESET_STRATEGIES:
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        self.auto_offset_reset = auto_offset_reset
        self.lock = threading.Lock()
        self.assigned: list[TopicPartition] = []
        self.consumed: dict[TopicPartition, int] = {}  # next offset poll returns, per partition
        self.fetch_positions: dict[TopicPartition, int] = {}  # next offset to fetch (ahead by the buffer)
        self.paused: set[TopicPartition] = set()
        # Group-assigned partitions whose committed offset is still to be looked up (`lock`).
        self.needs_position: set[TopicPartition] = set()
        self.manual = False  # assign() was called with partitions: subscribe() must not be
        # When each partition was last moved to the back of the fetch order (a count of moves).
        self._moved_at: dict[TopicPartition, int] = {}
        self._moves = 0

    def require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self.assigned:
            raise ValueError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")

    def position(self, tp: TopicPartition) -> int:
        """The consumed position of `tp`; NoOffsetForPartitionError while it has none."""
        self.require_assigned(tp)
        if tp in self.needs_position:
            raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position yet: its committed offset is looked "
                                            "up after on_assign (seek there to choose one)")
        if tp not in self.consumed:
            raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position: seek first (auto_offset_reset=none)")
        return self.consumed[tp]

    def positions(self) -> dict[TopicPartition, int]:
        """The position of every assigned partition that has one (any thread)."""
        with self.lock:
            return {tp: self.consumed[tp] for tp in self.assigned if tp in self.consumed}

    def missing_positions(self) -> list[TopicPartition]:
        """Assigned partitions with no position and none being looked up (`lock` held)."""
        return [tp for tp in self.assigned if tp not in self.consumed and tp not in self.needs_position]

    def set_assigned(self, partitions: list[TopicPartition], *, needs_position: bool) -> set[TopicPartition]:
        """Make `partitions` the assignment (`lock` held); those that go lose their positions,
        those that stay keep theirs. With `needs_position`, new partitions wait for a start
        position. Returns the partitions that went."""
        keep = set(partitions)
        removed = {tp for tp in self.assigned if tp not in keep}
        self.assigned = list(partitions)
        for tp in removed:
            self.consumed.pop(tp, None)
            self.fetch_positions.pop(tp, None)
            self._moved_at.pop(tp, None)
        self.paused &= keep
        self.needs_position &= keep
        if needs_position:
            self.needs_position.update(tp for tp in partitions if tp not in self.consumed)
        return removed

    def move_to_end(self, tps: Iterable[TopicPartition]) -> None:
        """Put `tps` (in this order) at the back of the fetch order (`lock` held)."""
        for tp in tps:
            self._moves += 1
            self._moved_at[tp] = self._moves

    def in_fetch_order(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """`tps` in fetch order: never moved first (in the order given), then least recently moved."""
        return sorted(tps, key=lambda tp: self._moved_at.get(tp, 0))
