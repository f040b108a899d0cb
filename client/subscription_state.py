"""SubscriptionState: what a consumer reads and from where (Kafka's SubscriptionState).

Owns the subscription (topics or a pattern, for the group to assign from) or the user's own
assignment, never both; the assigned partitions; each partition's position (the next record
`poll` returns: what a commit commits) and fetch position (the next offset to fetch, ahead of
the position by what is buffered); the paused partitions; the partitions whose start is still
to be found: group-assigned ones waiting for their committed offset ("initializing") and those
with a reset requested (seek_to_beginning / seek_to_end, or auto_offset_reset when nothing was
committed), resolved by the `OffsetFetcher`; the partitions pending revocation (their records
are no longer fetched while on_revoke runs); and the fetch order: a partition a poll returned
records of goes to the back (Kafka's `movePartitionToEnd`), so the next fetches name the others
first.

Every change goes through a method that checks it: a position for a partition that is not
assigned is `PartitionNotAssignedToConsumerError` rather than a silent entry, assign and
subscribe exclude each other, a negative position is refused. Per partition the states are
Kafka's: initializing (no position, committed offset to look up), awaiting reset (a strategy
to resolve), fetching (a position), or none of these (no position and nothing will find one:
auto_offset_reset=none, so `poll` raises NoOffsetForPartitionError until a seek).

Thread rules: `lock` (re-entrant) guards the state, which the sync Consumer's application
thread reads and moves (a poll takes records without a hop through the loop); the fetcher's
buffer shares the lock, so a caller that must change the buffer in the same step as the
state holds it around both. Every method takes it itself.
"""
from __future__ import annotations

import re
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


def is_internal_topic(topic: str) -> bool:
    """Topics the broker keeps for itself (`__consumer_offsets`): a pattern never matches them."""
    return topic.startswith("__")


class PartitionNotAssignedToConsumerError(ValueError):
    """A position, pause or reset for a partition this consumer is not assigned (an application's
    mistake, or a caller's bug: never a silent entry for a partition nobody reads)."""


class SubscriptionState:
    def __init__(self, auto_offset_reset: str) -> None:
        if auto_offset_reset not in RESET_STRATEGIES:
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        self._default_reset = auto_offset_reset
        self.lock = threading.RLock()
        self._topics: frozenset[str] | None = None  # subscribed topics, or None
        self._pattern: re.Pattern[str] | None = None  # or a subscribed pattern
        self._user_assigned = False  # assign_from_user with partitions: subscribe must not be
        self._assigned: dict[TopicPartition, None] = {}  # in assignment order
        self._positions: dict[TopicPartition, int] = {}  # next offset poll returns, per partition
        self._fetch_positions: dict[TopicPartition, int] = {}  # next offset to fetch (ahead by the buffer)
        self._paused: set[TopicPartition] = set()
        self._initializing: set[TopicPartition] = set()  # group-assigned, committed offset to look up
        self._reset_requests: dict[TopicPartition, str] = {}  # partition -> "earliest" | "latest"
        self._pending_revocation: set[TopicPartition] = set()
        # When each partition was last moved to the back of the fetch order (a count of moves).
        self._moved_at: dict[TopicPartition, int] = {}
        self._moves = 0

    @property
    def auto_offset_reset(self) -> str:
        """The default reset strategy: "earliest", "latest" or "none"."""
        return self._default_reset

    # -- subscription ------------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None, pattern: re.Pattern[str] | None) -> bool:
        """Subscribe to `topics` or to every topic whose whole name matches `pattern`; whether the
        subscription changed. Raises ValueError while partitions are assigned by the user."""
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to either a list of topics or a pattern")
        with self.lock:
            if self._user_assigned:
                raise ValueError("assign() and subscribe() are mutually exclusive: this consumer has assigned "
                                 "partitions; call unsubscribe() (or assign([])) first")
            new_topics = frozenset(topics) if topics is not None else None
            changed = (new_topics, pattern and pattern.pattern) != (self._topics, self._pattern and self._pattern.pattern)
            self._topics, self._pattern = new_topics, pattern
            return changed

    @property
    def is_subscribed(self) -> bool:
        """Whether the group assigns the partitions (topics or a pattern subscribed)."""
        return self._topics is not None or self._pattern is not None

    @property
    def has_pattern_subscription(self) -> bool:
        return self._pattern is not None

    def matches(self, topic: str) -> bool:
        """Whether the subscription covers `topic`."""
        if self._topics is not None:
            return topic in self._topics
        return self._pattern is not None and not is_internal_topic(topic) and self._pattern.fullmatch(topic) is not None

    def subscribed_topics(self, known: Iterable[str]) -> frozenset[str]:
        """The topics subscribed now: the explicit ones, or the pattern's matches among `known`."""
        if self._topics is not None:
            return self._topics
        return frozenset(t for t in known if self.matches(t))

    def unsubscribe(self) -> set[TopicPartition]:
        """Forget the subscription and the assignment, user's or group's; the partitions that went."""
        with self.lock:
            self._topics, self._pattern = None, None
            self._user_assigned = False
            return self._set_assignment([])

    # -- assignment ------------------------------------------------------------------------------

    def assign_from_user(self, partitions: list[TopicPartition]) -> set[TopicPartition]:
        """The application's own assignment (`assign([])` ends it); new partitions have no
        position until the offset fetcher finds one. Raises ValueError while subscribed.
        Returns the partitions that went."""
        with self.lock:
            if self.is_subscribed:
                raise ValueError("assign() and subscribe() are mutually exclusive: this consumer is subscribed; "
                                 "call unsubscribe() first")
            self._user_assigned = bool(partitions)
            return self._set_assignment(partitions)

    def assign_from_subscribed(self, partitions: list[TopicPartition]) -> set[TopicPartition]:
        """The group's assignment (or what is left of it after a revocation); new partitions are
        initializing (their committed offset is looked up). Returns the partitions that went."""
        with self.lock:
            if self._user_assigned:
                raise ValueError("the group cannot assign partitions to a consumer the user assigned")
            removed = self._set_assignment(partitions)
            self._initializing.update(tp for tp in partitions if tp not in self._positions)
            return removed

    def _set_assignment(self, partitions: list[TopicPartition]) -> set[TopicPartition]:
        """Partitions that go lose all their state; those that stay keep theirs."""
        keep = dict.fromkeys(partitions)
        removed = {tp for tp in self._assigned if tp not in keep}
        self._assigned = keep
        for tp in removed:
            self._positions.pop(tp, None)
            self._fetch_positions.pop(tp, None)
            self._moved_at.pop(tp, None)
            self._reset_requests.pop(tp, None)
        self._paused &= keep.keys()
        self._initializing &= keep.keys()
        self._pending_revocation &= keep.keys()
        return removed

    def assigned_partitions(self) -> list[TopicPartition]:
        """The assigned partitions, in assignment order (a copy)."""
        with self.lock:
            return list(self._assigned)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._assigned

    def require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assigned:
            raise PartitionNotAssignedToConsumerError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")

    def mark_pending_revocation(self, tps: Iterable[TopicPartition]) -> None:
        """These partitions are about to be revoked (on_revoke runs): fetch no more of them."""
        with self.lock:
            self._pending_revocation.update(tp for tp in tps if tp in self._assigned)

    # -- pausing -----------------------------------------------------------------------------------

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching `tps`; their fetch positions go back to their positions (the caller drops
        what is buffered of them in the same step, `lock` held)."""
        tps = list(tps)
        with self.lock:
            for tp in tps:
                self.require_assigned(tp)
            for tp in tps:
                self._paused.add(tp)
                if tp in self._positions:
                    self._fetch_positions[tp] = self._positions[tp]

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        with self.lock:
            self._paused.difference_update(tps)

    def paused_partitions(self) -> list[TopicPartition]:
        with self.lock:
            return sorted(self._paused)

    def is_fetchable(self, tp: TopicPartition) -> bool:
        """Assigned with a fetch position, not paused, not about to be revoked."""
        return tp in self._fetch_positions and tp not in self._paused and tp not in self._pending_revocation

    def fetchable_partitions(self) -> list[TopicPartition]:
        with self.lock:
            return [tp for tp in self._assigned if self.is_fetchable(tp)]

    # -- positions ---------------------------------------------------------------------------------

    def position(self, tp: TopicPartition) -> int:
        """The position of `tp`; NoOffsetForPartitionError while it has none."""
        with self.lock:
            self.require_assigned(tp)
            if tp in self._initializing:
                raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position yet: its committed offset is looked "
                                                "up after on_assign (seek there to choose one)")
            if tp not in self._positions:
                raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position: seek first (auto_offset_reset=none)")
            return self._positions[tp]

    def has_valid_position(self, tp: TopicPartition) -> bool:
        return tp in self._positions

    def all_consumed(self) -> dict[TopicPartition, int]:
        """The position of every assigned partition that has one: what a commit commits (any thread)."""
        with self.lock:
            return {tp: self._positions[tp] for tp in self._assigned if tp in self._positions}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the position and fetch position of `tp`; any pending lookup or reset of
        it is dropped (what was sought wins)."""
        if offset < 0:
            raise ValueError(f"a position must not be negative, got {offset} for {tp[0]}-{tp[1]}")
        with self.lock:
            self.require_assigned(tp)
            self._positions[tp] = self._fetch_positions[tp] = offset
            self._initializing.discard(tp)
            self._reset_requests.pop(tp, None)

    def update_position(self, tp: TopicPartition, offset: int) -> None:
        """A poll returned records of `tp` up to `offset` (or stopped at a bad batch there)."""
        with self.lock:
            self.require_assigned(tp)
            self._positions[tp] = offset

    def clear_position(self, tp: TopicPartition) -> None:
        """`tp`'s position means nothing any more (its topic was re-created): none until a seek."""
        with self.lock:
            self._positions.pop(tp, None)
            self._fetch_positions.pop(tp, None)

    def missing_positions(self) -> list[TopicPartition]:
        """Assigned partitions with no position and nothing to find one: poll raises for them."""
        with self.lock:
            return [tp for tp in self._assigned if tp not in self._positions and tp not in self._initializing
                    and tp not in self._reset_requests]

    # -- fetch positions (the fetcher's) ------------------------------------------------------------

    def fetch_position(self, tp: TopicPartition) -> int | None:
        """The next offset to fetch for `tp`; None while it is not fetched (no position, or
        stopped at an error the poll has not reached yet)."""
        return self._fetch_positions.get(tp)

    def set_fetch_position(self, tp: TopicPartition, offset: int) -> None:
        """The fetcher buffered `tp`'s records up to `offset`, or an error sends it back to its position."""
        with self.lock:
            self.require_assigned(tp)
            self._fetch_positions[tp] = offset

    def reset_fetch_position(self, tp: TopicPartition, offset: int, *, with_position: bool) -> None:
        """Fetch `tp` from `offset` (out of range, or its topic re-created); its position follows
        `with_position` (when nothing before the jump is still buffered for poll)."""
        with self.lock:
            self.require_assigned(tp)
            self._fetch_positions[tp] = offset
            if with_position:
                self._positions[tp] = offset

    def stop_fetching(self, tp: TopicPartition) -> None:
        """Fetch nothing more of `tp` until the poll reaches the error buffered for it."""
        with self.lock:
            self._fetch_positions.pop(tp, None)

    def rewind_fetch_positions(self) -> None:
        """Fetch every partition from its position again (what was prefetched is dropped)."""
        with self.lock:
            self._fetch_positions = dict(self._positions)

    # -- start positions (found by the OffsetFetcher) ------------------------------------------------

    def initializing_partitions(self) -> list[TopicPartition]:
        """Group-assigned partitions whose committed offset is still to be looked up."""
        with self.lock:
            return sorted(self._initializing)

    def is_initializing(self, tp: TopicPartition) -> bool:
        return tp in self._initializing

    def initialization_done(self, tps: Iterable[TopicPartition]) -> None:
        """The committed offsets of `tps` were looked up (each has a position now, a reset
        requested, or none with auto_offset_reset=none)."""
        with self.lock:
            self._initializing.difference_update(tps)

    def request_offset_reset(self, tps: Iterable[TopicPartition], strategy: str | None = None) -> None:
        """Ask for `tps`' positions to be reset to the log's start or end (default: auto_offset_reset;
        "none" requests nothing). Resolved by `OffsetFetcher.reset_positions_if_needed`."""
        strategy = self._default_reset if strategy is None else strategy
        if strategy not in RESET_STRATEGIES:
            raise ValueError(f"unknown reset strategy {strategy!r}")
        tps = list(tps)
        with self.lock:
            for tp in tps:
                self.require_assigned(tp)
            if strategy != "none":
                self._reset_requests.update(dict.fromkeys(tps, strategy))

    def cancel_offset_reset(self, tps: Iterable[TopicPartition]) -> None:
        """Withdraw the reset requests of `tps` (their lookup failed: the positions stay as they were)."""
        with self.lock:
            for tp in tps:
                self._reset_requests.pop(tp, None)

    def partitions_needing_reset(self) -> dict[TopicPartition, str]:
        """Partition -> the strategy its reset asks for."""
        with self.lock:
            return dict(self._reset_requests)

    def maybe_seek_unvalidated(self, tp: TopicPartition, offset: int, strategy: str) -> bool:
        """Apply a reset's answer if `tp` still awaits that reset (a seek, another reset or an
        unassignment meanwhile wins); whether it was applied."""
        with self.lock:
            if self._reset_requests.get(tp) != strategy:
                return False
            self.seek(tp, offset)
            return True

    def seek_if_unpositioned(self, tp: TopicPartition, offset: int) -> bool:
        """A committed offset found for `tp` becomes its position unless it has one already
        (a seek inside on_assign wins) or left; whether it did."""
        with self.lock:
            if tp not in self._assigned or tp in self._positions:
                return False
            self.seek(tp, offset)
            return True

    # -- fetch order ---------------------------------------------------------------------------------

    def move_to_end(self, tps: Iterable[TopicPartition]) -> None:
        """Put `tps` (in this order) at the back of the fetch order."""
        with self.lock:
            for tp in tps:
                self._moves += 1
                self._moved_at[tp] = self._moves

    def in_fetch_order(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """`tps` in fetch order: never moved first (in the order given), then least recently moved."""
        return sorted(tps, key=lambda tp: self._moved_at.get(tp, 0))
