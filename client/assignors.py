"""Partition assignors: the code the group leader's consumer runs to split the subscribed topics'
partitions among the members (Kafka's `ConsumerPartitionAssignor` implementations).

The coordinator collects every member's `Subscription`, picks the assignor every member supports
(in the first member's order of preference), and lets the leader compute one `Assignment` per
member; the leader sends them back in SyncGroup. Assignors are pure: no I/O, deterministic for
the same input, so a test can replay any rebalance.

    range               per topic, each subscribed member takes a consecutive range (eager)
    roundrobin          all partitions, dealt to the members in turn (eager)
    cooperative-sticky  keeps what members own, balanced; never hands a partition over directly
                        (cooperative: the owner revokes it first, a follow-up rebalance places it)

Members are ordered by `member_order` (member id -> sort key): the group instance id of static
members, so that a static member that restarts under a new member id gets the same place in the
order and hence the same partitions. Without a key, a member sorts by its id. Topics that no
member's metadata knows of (not in `partitions_per_topic`: unknown or deleted) are skipped, and
every member gets an assignment, possibly empty.
"""
from __future__ import annotations

import bisect
import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Set
from typing import ClassVar, Literal

from common.topic_partition import TopicPartition
from protocol.consumer_protocol import NO_GENERATION, Assignment, Subscription

RebalanceProtocol = Literal["eager", "cooperative"]


class PartitionAssignor(ABC):
    """One assignment strategy. `rebalance_protocol` is the most it supports: a "cooperative"
    assignor also works when the group rebalances eagerly (members revoke everything first, so
    nobody owns anything), as in Kafka, so a consumer runs cooperatively only when every assignor
    it offers is cooperative."""

    name: ClassVar[str]
    rebalance_protocol: ClassVar[RebalanceProtocol]

    @abstractmethod
    def assign(self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
               member_order: Mapping[str, str] | None = None) -> dict[str, Assignment]:
        """One assignment per member id of `subscriptions`, from the topics' partition counts."""


def _ordered_members(subscriptions: Mapping[str, Subscription], member_order: Mapping[str, str] | None) -> list[str]:
    """Member ids sorted by their order key (the member id breaks ties between equal keys)."""
    keys = member_order or {}
    return sorted(subscriptions, key=lambda member: (keys.get(member, member), member))


def _subscribers(partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
                 members: list[str]) -> dict[str, list[str]]:
    """Each known subscribed topic (sorted by name) with its subscribers, in member order."""
    subscribers: dict[str, list[str]] = {}
    for member in members:
        for topic in subscriptions[member].topics:
            if topic in partitions_per_topic:
                subscribers.setdefault(topic, []).append(member)
    return dict(sorted(subscribers.items()))


def _assignments(assigned: Mapping[str, list[TopicPartition]]) -> dict[str, Assignment]:
    return {member: Assignment(tuple(partitions)) for member, partitions in assigned.items()}


def revocations(owned: Set[TopicPartition], assigned: Set[TopicPartition]
                ) -> tuple[set[TopicPartition], set[TopicPartition]]:
    """(revoked, added) when a member that owns `owned` receives `assigned`. Under the cooperative
    protocol a member that revoked anything must rejoin at once: the partitions it gave up were
    withheld from their new owner, and only the next rebalance places them."""
    return set(owned) - set(assigned), set(assigned) - set(owned)


# -- range and round robin (eager) -----------------------------------------------------------------


def _ranges(partitions: int, members: int) -> Iterator[range]:
    """Consecutive ranges of `partitions`, one per member; the first `partitions % members` get one more."""
    per_member, extra = divmod(partitions, members)
    start = 0
    for index in range(members):
        end = start + per_member + (index < extra)
        yield range(start, end)
        start = end


class RangeAssignor(PartitionAssignor):
    """Kafka's range assignor: per topic, its subscribers in member order each take a consecutive
    range. Members subscribed to the same topics get the same partition numbers of each, which
    keeps co-partitioned topics (joins by key) together; the first members of every topic get
    the extra partitions, so many topics can leave them more loaded."""

    name = "range"
    rebalance_protocol = "eager"

    def assign(self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
               member_order: Mapping[str, str] | None = None) -> dict[str, Assignment]:
        members = _ordered_members(subscriptions, member_order)
        assigned: dict[str, list[TopicPartition]] = {member: [] for member in members}
        for topic, subscribers in _subscribers(partitions_per_topic, subscriptions, members).items():
            for member, numbers in zip(subscribers, _ranges(partitions_per_topic[topic], len(subscribers))):
                assigned[member].extend((topic, number) for number in numbers)
        return _assignments(assigned)


class RoundRobinAssignor(PartitionAssignor):
    """Kafka's round robin assignor: every partition of the subscribed topics, sorted by topic
    and number, dealt to the members in turn, skipping a member not subscribed to the partition's
    topic. Balanced to one partition when subscriptions are identical."""

    name = "roundrobin"
    rebalance_protocol = "eager"

    def assign(self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
               member_order: Mapping[str, str] | None = None) -> dict[str, Assignment]:
        members = _ordered_members(subscriptions, member_order)
        topics_of = {member: frozenset(subscriptions[member].topics) for member in members}
        assigned: dict[str, list[TopicPartition]] = {member: [] for member in members}
        turn = 0
        for topic in _subscribers(partitions_per_topic, subscriptions, members):
            for number in range(partitions_per_topic[topic]):
                while topic not in topics_of[members[turn]]:  # ends: the topic has a subscriber
                    turn = (turn + 1) % len(members)
                assigned[members[turn]].append((topic, number))
                turn = (turn + 1) % len(members)
        return _assignments(assigned)


# -- cooperative sticky ----------------------------------------------------------------------------


def _owners(partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
            ) -> dict[TopicPartition, str]:
    """The owner of each partition whose ownership stickiness honours. Only claims made in the
    latest generation any member reports count: a member reporting an older one missed a
    rebalance, and what it claims was given away since (so when two members claim a partition in
    different generations, the later one wins). A claim also lapses when the member no longer
    subscribes to the topic or the partition no longer exists. A partition two members claim in
    the same generation (a bug elsewhere) belongs to neither."""
    latest = max((subscription.generation_id for subscription in subscriptions.values()), default=NO_GENERATION)
    owners: dict[TopicPartition, str] = {}
    contested: set[TopicPartition] = set()
    for member, subscription in subscriptions.items():
        if subscription.generation_id < latest:
            continue
        topics = frozenset(subscription.topics)
        for partition in subscription.owned_partitions:
            topic, number = partition
            if topic in topics and number < partitions_per_topic.get(topic, 0):
                if partition in owners:
                    contested.add(partition)
                owners[partition] = member
    for partition in contested:
        del owners[partition]
    return owners


def _claimants(subscriptions: Mapping[str, Subscription]) -> dict[TopicPartition, list[str]]:
    """Every member that says it owns each partition, valid claim or not."""
    claimants: dict[TopicPartition, list[str]] = {}
    for member, subscription in subscriptions.items():
        for partition in subscription.owned_partitions:
            claimants.setdefault(partition, []).append(member)
    return claimants


def _withhold_transfers(assigned: Mapping[str, list[TopicPartition]], owners: Mapping[TopicPartition, str],
                        claimants: Mapping[TopicPartition, list[str]]) -> dict[str, list[TopicPartition]]:
    """The cooperative adjustment: a member gets a partition only if it owns it or no other member
    may still hold it. Any other member's claim, even a lapsed one, withholds it this round: that
    member revokes it on seeing its own assignment and rejoins, and the next rebalance places it.
    So no partition is ever held by two members at once."""
    def may_take(member: str, partition: TopicPartition) -> bool:
        return owners.get(partition) == member or all(other == member for other in claimants.get(partition, ()))

    return {member: [partition for partition in partitions if may_take(member, partition)]
            for member, partitions in assigned.items()}


class _StickyPlan:
    """The sticky assignment under construction: what each member holds and how many.

    Topics with the same subscribers form a group (usually a single one: identical
    subscriptions), and a member's holdings are kept per group, so a move only looks at the
    groups the giver and the receiver share. Each holding list has the member's owned partitions
    first and new ones after; moves take from the end, so a member passes on what it just got
    before giving up what it owned."""

    def __init__(self, members: list[str], subscribers: Mapping[str, list[str]]) -> None:
        self.rank = {member: index for index, member in enumerate(members)}
        self.load = dict.fromkeys(members, 0)
        self.held: dict[str, dict[int, list[TopicPartition]]] = {member: {} for member in members}
        self.groups_of: dict[str, set[int]] = {member: set() for member in members}
        self.group_of: dict[str, int] = {}  # topic -> its group
        groups: dict[tuple[str, ...], int] = {}
        for topic, topic_subscribers in subscribers.items():
            group = self.group_of[topic] = groups.setdefault(tuple(topic_subscribers), len(groups))
            for member in topic_subscribers:
                self.groups_of[member].add(group)
        self.by_load: list[tuple[int, int, str]] = []  # (load, rank, member), ascending; kept by `balance`

    def give(self, member: str, partition: TopicPartition) -> None:
        self.held[member].setdefault(self.group_of[partition[0]], []).append(partition)
        self.load[member] += 1

    def keep_owned(self, owners: Mapping[TopicPartition, str]) -> None:
        for partition, member in sorted(owners.items()):
            self.give(member, partition)

    def place_unowned(self, partitions_per_topic: Mapping[str, int], subscribers: Mapping[str, list[str]],
                      owners: Mapping[TopicPartition, str]) -> None:
        """Each unowned partition to its least-loaded subscriber. Topics with the fewest
        subscribers go first: their partitions have the fewest places to go."""
        for topic in sorted(subscribers, key=lambda name: (len(subscribers[name]), name)):
            heap = [(self.load[member], self.rank[member], member) for member in subscribers[topic]]
            heapq.heapify(heap)
            for number in range(partitions_per_topic[topic]):
                if (topic, number) not in owners:
                    _, rank, member = heap[0]
                    self.give(member, (topic, number))
                    heapq.heapreplace(heap, (self.load[member], rank, member))

    def balance(self) -> None:
        """Move single partitions from the most loaded member to the least loaded one that may
        take them until no member holds two more than one that may take its partitions. Always
        giving from the most loaded keeps a member from giving past its share and then getting
        partitions back; every move lowers the sum of squared loads, so this ends. With identical
        subscriptions it ends with loads differing by at most one, moving only what exceeds them."""
        self.by_load = sorted((load, self.rank[member], member) for member, load in self.load.items())
        while self._balance_pass():
            pass  # another pass: a member that gave may now take from one that could not give before

    def _balance_pass(self) -> bool:
        """One sweep over the members, most loaded first; True if anything moved."""
        heap = [(-load, rank, member) for load, rank, member in self.by_load]
        heapq.heapify(heap)
        moved = False
        while heap:
            negative_load, rank, giver = heapq.heappop(heap)
            if -negative_load != self.load[giver]:
                continue  # stale: the member's load changed and a current entry was pushed
            move = self._move_from(giver)
            if move is not None:
                group, receiver = move
                self._shift_load(giver, -1)
                self._shift_load(receiver, +1)
                self.held[receiver].setdefault(group, []).append(self.held[giver][group].pop())
                heapq.heappush(heap, (-self.load[giver], rank, giver))
                heapq.heappush(heap, (-self.load[receiver], self.rank[receiver], receiver))
                moved = True
        return moved

    def _move_from(self, giver: str) -> tuple[int, str] | None:
        """(group, receiver) for one of `giver`'s partitions: the least-loaded member that shares
        a group with it and holds at least two fewer (one fewer would only swap the imbalance)."""
        giving = [group for group, partitions in self.held[giver].items() if partitions]
        most = self.load[giver] - 2
        for load, _, receiver in self.by_load:
            if load > most:
                return None
            shared = self.groups_of[receiver]
            for group in giving:
                if group in shared:
                    return group, receiver
        return None

    def _shift_load(self, member: str, delta: int) -> None:
        entry = (self.load[member], self.rank[member], member)
        del self.by_load[bisect.bisect_left(self.by_load, entry)]
        self.load[member] += delta
        bisect.insort(self.by_load, (self.load[member], self.rank[member], member))

    def assignment(self) -> dict[str, list[TopicPartition]]:
        return {member: [partition for partitions in groups.values() for partition in partitions]
                for member, groups in self.held.items()}


class CooperativeStickyAssignor(PartitionAssignor):
    """Kafka's cooperative sticky assignor: as balanced as round robin, but members keep as many
    of the partitions they own as balance allows, so a rebalance moves few partitions and the
    others keep being consumed without a pause.

    Steps: honour valid ownership (see `_owners`); give every unowned partition to its
    least-loaded subscriber; move partitions one at a time from the most to the least loaded
    members until balanced; then withhold every partition that would change hands (see
    `_withhold_transfers`), which its current owner revokes before a follow-up rebalance assigns
    it. Membership unchanged and nothing to move gives back exactly what members own."""

    name = "cooperative-sticky"
    rebalance_protocol = "cooperative"

    def assign(self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
               member_order: Mapping[str, str] | None = None) -> dict[str, Assignment]:
        members = _ordered_members(subscriptions, member_order)
        subscribers = _subscribers(partitions_per_topic, subscriptions, members)
        owners = _owners(partitions_per_topic, subscriptions)
        plan = _StickyPlan(members, subscribers)
        plan.keep_owned(owners)
        plan.place_unowned(partitions_per_topic, subscribers, owners)
        plan.balance()
        return _assignments(_withhold_transfers(plan.assignment(), owners, _claimants(subscriptions)))


ASSIGNORS: dict[str, type[PartitionAssignor]] = {
    assignor.name: assignor for assignor in (RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor)}
DEFAULT_ASSIGNORS: tuple[str, ...] = ("range", "cooperative-sticky")  # Kafka 3.x's default, in preference order
