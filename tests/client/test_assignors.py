"""Partition assignors (client/assignors.py): every partition of a subscribed topic goes to
exactly one subscribed member; range and round robin match Kafka's worked examples; the
cooperative sticky assignor balances, keeps what members own, and over the two-round cooperative
protocol never hands a partition straight from one member to another."""
from __future__ import annotations

import time
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNORS,
    CooperativeStickyAssignor,
    PartitionAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    revocations,
)
from protocol.consumer_protocol import Assignment, Subscription
from common.topic_partition import TopicPartition

ALL_ASSIGNORS = [RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor()]
STICKY = CooperativeStickyAssignor()
Owned = dict[str, set[TopicPartition]]


def tps(*names: str) -> tuple[TopicPartition, ...]:
    """("t1-0", "t2-3") -> (("t1", 0), ("t2", 3)): Kafka's test notation."""
    return tuple((name.rpartition("-")[0], int(name.rpartition("-")[2])) for name in names)


def partitions(result: Mapping[str, Assignment]) -> dict[str, tuple[TopicPartition, ...]]:
    return {member: assignment.partitions for member, assignment in result.items()}


def all_partitions(partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
                   ) -> set[TopicPartition]:
    """Every partition of every known topic some member subscribes to."""
    subscribed = {topic for subscription in subscriptions.values() for topic in subscription.topics}
    return {(topic, number) for topic in subscribed & set(partitions_per_topic)
            for number in range(partitions_per_topic[topic])}


def assert_valid(partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
                 result: Mapping[str, Assignment], complete: bool = True) -> None:
    """Every member has an entry; each partition goes to at most one member (exactly one when
    `complete`), which subscribes to its topic; nothing outside the known topics is assigned."""
    assert set(result) == set(subscriptions)
    seen: set[TopicPartition] = set()
    for member, assignment in result.items():
        for partition in assignment.partitions:
            assert partition not in seen, f"{partition} assigned twice"
            seen.add(partition)
            assert partition[0] in subscriptions[member].topics, f"{member} got {partition} it does not subscribe to"
    expected = all_partitions(partitions_per_topic, subscriptions)
    assert seen <= expected
    if complete:
        assert seen == expected


def loads(result: Mapping[str, Assignment]) -> list[int]:
    return [len(assignment.partitions) for assignment in result.values()]


# -- strategies --------------------------------------------------------------------------------

TOPIC_NAMES = ["a", "b", "c", "d"]
partition_counts = st.dictionaries(st.sampled_from(TOPIC_NAMES), st.integers(0, 12), min_size=1)
member_ids = st.lists(st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=6, unique=True)
# "gone" is a topic members may subscribe to that does not exist (unknown or deleted).
topic_sets = st.lists(st.sampled_from(TOPIC_NAMES + ["gone"]), max_size=5).map(tuple)


@st.composite
def groups(draw: st.DrawFn, identical: bool = False) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
    """(partitions_per_topic, topics each member subscribes to)."""
    counts = draw(partition_counts)
    members = draw(member_ids)
    if identical:
        shared = draw(topic_sets)
        return counts, {member: shared for member in members}
    return counts, {member: draw(topic_sets) for member in members}


def fresh(topics_of: Mapping[str, tuple[str, ...]]) -> dict[str, Subscription]:
    return {member: Subscription(topics) for member, topics in topics_of.items()}


# -- the contract every assignor keeps -------------------------------------------------------------


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
@given(group=groups())
def test_every_partition_goes_to_one_subscribed_member(assignor: PartitionAssignor,
                                                       group: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """Any group, fresh members: each partition of a subscribed, known topic goes to exactly one subscriber."""
    counts, topics_of = group
    subscriptions = fresh(topics_of)
    assert_valid(counts, subscriptions, assignor.assign(counts, subscriptions))


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
def test_unknown_topics_are_skipped_and_every_member_gets_an_entry(assignor: PartitionAssignor) -> None:
    """A member subscribed only to a topic that does not exist gets an empty assignment, not an error."""
    result = assignor.assign({"t": 2}, {"m1": Subscription(("t",)), "m2": Subscription(("gone",))})
    assert partitions(result) == {"m1": tps("t-0", "t-1"), "m2": ()}


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
def test_no_members_no_assignments(assignor: PartitionAssignor) -> None:
    """An empty group gets an empty result."""
    assert assignor.assign({"t": 3}, {}) == {}


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
@given(group=groups())
def test_static_members_keep_their_partitions_across_member_id_changes(
        assignor: PartitionAssignor, group: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """The same instance ids under new member ids get the same partitions: order follows the instance id."""
    counts, topics_of = group
    instances = sorted(topics_of)
    before = {f"id-{index}": instance for index, instance in enumerate(instances)}
    after = {f"new-{len(instances) - index}": instance for index, instance in enumerate(instances)}

    def by_instance(ids: dict[str, str]) -> dict[str, tuple[TopicPartition, ...]]:
        subscriptions = {member: Subscription(topics_of[instance]) for member, instance in ids.items()}
        return {ids[member]: assigned for member, assigned in partitions(assignor.assign(counts, subscriptions, ids)).items()}

    assert by_instance(before) == by_instance(after)


def test_registry_and_defaults() -> None:
    """Assignors are found by their protocol name; the defaults are Kafka's, range first."""
    assert {name: type_.name for name, type_ in ASSIGNORS.items()} == {
        "range": "range", "roundrobin": "roundrobin", "cooperative-sticky": "cooperative-sticky"}
    assert DEFAULT_ASSIGNORS == ("range", "cooperative-sticky")
    assert [ASSIGNORS[name].rebalance_protocol for name in ASSIGNORS] == ["eager", "eager", "cooperative"]


def test_revocations_splits_revoked_and_added() -> None:
    """What a member gives up and what it gains when a new assignment replaces what it owns."""
    assert revocations(set(tps("t-0", "t-1")), set(tps("t-1", "t-2"))) == (set(tps("t-0")), set(tps("t-2")))
    assert revocations(set(), set()) == (set(), set())


# -- range: Kafka's RangeAssignorTest ----------------------------------------------------------------

RANGE_CASES = [
    ("one consumer one topic", {"t": 3}, {"c1": ("t",)}, {"c1": tps("t-0", "t-1", "t-2")}),
    ("only subscribed topics", {"t": 3, "other": 3}, {"c1": ("t",)}, {"c1": tps("t-0", "t-1", "t-2")}),
    ("two consumers one partition", {"t": 1}, {"c1": ("t",), "c2": ("t",)}, {"c1": tps("t-0"), "c2": ()}),
    ("two consumers two partitions", {"t": 2}, {"c1": ("t",), "c2": ("t",)}, {"c1": tps("t-0"), "c2": tps("t-1")}),
    ("mixed topics", {"t1": 3, "t2": 2}, {"c1": ("t1",), "c2": ("t1", "t2"), "c3": ("t1",)},
     {"c1": tps("t1-0"), "c2": tps("t1-1", "t2-0", "t2-1"), "c3": tps("t1-2")}),
    ("two consumers two topics six partitions", {"t1": 3, "t2": 3}, {"c1": ("t1", "t2"), "c2": ("t1", "t2")},
     {"c1": tps("t1-0", "t1-1", "t2-0", "t2-1"), "c2": tps("t1-2", "t2-2")}),
]


@pytest.mark.parametrize("counts, topics_of, expected", [case[1:] for case in RANGE_CASES],
                         ids=[case[0] for case in RANGE_CASES])
def test_range_matches_kafka(counts: dict[str, int], topics_of: dict[str, tuple[str, ...]],
                             expected: dict[str, tuple[TopicPartition, ...]]) -> None:
    """Kafka's range examples: consecutive ranges per topic, the first members take the extra partitions."""
    assert partitions(RangeAssignor().assign(counts, fresh(topics_of))) == expected


@given(group=groups())
def test_range_balances_each_topic(group: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """Per topic, the subscribers' shares differ by at most one and are consecutive."""
    counts, topics_of = group
    result = RangeAssignor().assign(counts, fresh(topics_of))
    for topic in set(counts) & {t for topics in topics_of.values() for t in topics}:
        shares = [[n for t, n in result[m].partitions if t == topic] for m in topics_of if topic in topics_of[m]]
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert all(share == list(range(share[0], share[0] + len(share))) for share in shares if share)


# -- round robin: Kafka's RoundRobinAssignorTest and javadoc --------------------------------------------

ROUND_ROBIN_CASES = [
    ("mixed topics", {"t1": 3, "t2": 2}, {"c1": ("t1",), "c2": ("t1", "t2"), "c3": ("t1",)},
     {"c1": tps("t1-0"), "c2": tps("t1-1", "t2-0", "t2-1"), "c3": tps("t1-2")}),
    ("two consumers two topics six partitions", {"t1": 3, "t2": 3}, {"c1": ("t1", "t2"), "c2": ("t1", "t2")},
     {"c1": tps("t1-0", "t1-2", "t2-1"), "c2": tps("t1-1", "t2-0", "t2-2")}),
    ("javadoc: unequal subscriptions", {"t0": 1, "t1": 2, "t2": 3},
     {"C0": ("t0",), "C1": ("t0", "t1"), "C2": ("t0", "t1", "t2")},
     {"C0": tps("t0-0"), "C1": tps("t1-0"), "C2": tps("t1-1", "t2-0", "t2-1", "t2-2")}),
]


@pytest.mark.parametrize("counts, topics_of, expected", [case[1:] for case in ROUND_ROBIN_CASES],
                         ids=[case[0] for case in ROUND_ROBIN_CASES])
def test_round_robin_matches_kafka(counts: dict[str, int], topics_of: dict[str, tuple[str, ...]],
                                   expected: dict[str, tuple[TopicPartition, ...]]) -> None:
    """Kafka's round robin examples: sorted partitions dealt in turn, skipping non-subscribers."""
    assert partitions(RoundRobinAssignor().assign(counts, fresh(topics_of))) == expected


@given(group=groups(identical=True))
def test_round_robin_balances_identical_subscriptions(group: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """Identical subscriptions: member loads differ by at most one."""
    counts, topics_of = group
    member_loads = loads(RoundRobinAssignor().assign(counts, fresh(topics_of)))
    assert max(member_loads) - min(member_loads) <= 1


# -- cooperative sticky: worked examples ---------------------------------------------------------------


def test_sticky_javadoc_example_identical_subscriptions() -> None:
    """Kafka's AbstractStickyAssignor example 1: three members, four topics of two partitions, then C1 leaves:
    the survivors keep theirs and share C1's."""
    counts = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}
    topics = tuple(counts)
    first = partitions(STICKY.assign(counts, fresh({"C0": topics, "C1": topics, "C2": topics})))
    assert first == {"C0": tps("t0-0", "t1-1", "t3-0"), "C1": tps("t0-1", "t2-0", "t3-1"), "C2": tps("t1-0", "t2-1")}
    survivors = {member: Subscription(topics, first[member], 1) for member in ("C0", "C2")}
    second = partitions(STICKY.assign(counts, survivors))
    assert second == {"C0": tps("t0-0", "t1-1", "t2-0", "t3-0"), "C2": tps("t0-1", "t1-0", "t2-1", "t3-1")}


def test_sticky_javadoc_example_unequal_subscriptions() -> None:
    """Kafka's AbstractStickyAssignor example 2: C0 on t0, C1 on t0-t1, C2 on t0-t2; then C0 leaves and
    only its t0-0 moves (round robin would move three partitions)."""
    counts = {"t0": 1, "t1": 2, "t2": 3}
    topics_of = {"C0": ("t0",), "C1": ("t0", "t1"), "C2": ("t0", "t1", "t2")}
    first = partitions(STICKY.assign(counts, fresh(topics_of)))
    assert first == {"C0": tps("t0-0"), "C1": tps("t1-0", "t1-1"), "C2": tps("t2-0", "t2-1", "t2-2")}
    survivors = {member: Subscription(topics_of[member], first[member], 1) for member in ("C1", "C2")}
    assert partitions(STICKY.assign(counts, survivors)) == {
        "C1": tps("t0-0", "t1-0", "t1-1"), "C2": tps("t2-0", "t2-1", "t2-2")}


def test_sticky_new_member_waits_for_the_revocation() -> None:
    """Kafka's add-consumer case: a second member joins a one-topic group; the owner gives up one
    partition this round and the newcomer gets it only in the next."""
    counts = {"t": 3}
    round1 = partitions(STICKY.assign(counts, {"c1": Subscription(("t",), tps("t-0", "t-1", "t-2"), 1),
                                               "c2": Subscription(("t",))}))
    assert round1 == {"c1": tps("t-0", "t-1"), "c2": ()}
    round2 = partitions(STICKY.assign(counts, {"c1": Subscription(("t",), round1["c1"], 2),
                                               "c2": Subscription(("t",), (), 2)}))
    assert round2 == {"c1": tps("t-0", "t-1"), "c2": tps("t-2")}


def test_sticky_ignores_claims_from_an_older_generation() -> None:
    """A member that missed a rebalance claims partitions given away since: the owners of the later
    generation keep them, and the stale claimant does not get them back."""
    counts = {"t": 2}
    result = partitions(STICKY.assign(counts, {"old": Subscription(("t",), tps("t-0", "t-1"), 3),
                                               "new": Subscription(("t",), tps("t-0"), 4),
                                               "other": Subscription(("t",), tps("t-1"), 4)}))
    assert result == {"new": tps("t-0"), "other": tps("t-1"), "old": ()}


def test_sticky_stale_claim_still_withholds_the_partition_from_another_member() -> None:
    """A lapsed claim is not honoured, but the claimant may still be reading the partition, so
    nobody else gets it until the claimant has revoked it."""
    counts = {"t": 1}
    result = partitions(STICKY.assign(counts, {"b": Subscription(("t",), (), 5),
                                               "z": Subscription(("t",), tps("t-0"), 3)}))
    assert result == {"b": (), "z": ()}


def test_sticky_same_generation_double_claim_is_withheld_from_both() -> None:
    """Two members claiming one partition in the same generation: neither keeps it this round."""
    counts = {"t": 2}
    result = partitions(STICKY.assign(counts, {"a": Subscription(("t",), tps("t-0", "t-1"), 2),
                                               "b": Subscription(("t",), tps("t-0"), 2)}))
    assert result == {"a": tps("t-1"), "b": ()}


def test_sticky_unsubscribed_topic_is_revoked_before_it_moves() -> None:
    """A member that drops a topic loses its partitions, which reach the other member a round later."""
    counts = {"x": 1, "y": 1}
    result = partitions(STICKY.assign(counts, {"a": Subscription(("y",), tps("x-0", "y-0"), 1),
                                               "b": Subscription(("x", "y"), (), 1)}))
    assert result == {"a": tps("y-0"), "b": ()}


# -- cooperative sticky: properties --------------------------------------------------------------------


def subscriptions_of(topics_of: Mapping[str, tuple[str, ...]], owned: Owned,
                     generations: Mapping[str, int]) -> dict[str, Subscription]:
    return {member: Subscription(topics, tuple(owned.get(member, ())), generations.get(member, -1))
            for member, topics in topics_of.items()}


def rebalance(counts: Mapping[str, int], topics_of: Mapping[str, tuple[str, ...]], owned: Owned,
              generation: int, max_rounds: int) -> tuple[Owned, int]:
    """Run the cooperative protocol to a stable assignment: each round members join with what they
    own, get the leader's assignment, revoke and add; anyone who revoked rejoins. Checks every
    round that no partition is handed to a member while another still owns it. Returns the final
    ownership and the number of rounds."""
    owned = {member: set(owned.get(member, ())) for member in topics_of}
    generations = {member: generation for member in topics_of if owned[member]}
    for round_number in range(1, max_rounds + 1):
        subscriptions = subscriptions_of(topics_of, owned, generations)
        result = STICKY.assign(counts, subscriptions)
        assert_valid(counts, subscriptions, result, complete=False)
        revoked_any = False
        for member, assignment in result.items():
            revoked, added = revocations(owned[member], set(assignment.partitions))
            for other, theirs in owned.items():
                assert other == member or not (added & theirs), f"{added & theirs} moved from {other} to {member}"
            revoked_any |= bool(revoked)
        owned = {member: set(assignment.partitions) for member, assignment in result.items()}
        generation += 1
        generations = dict.fromkeys(topics_of, generation)
        if not revoked_any:
            assert_valid(counts, subscriptions, result)
            return owned, round_number
    raise AssertionError(f"no stable assignment after {max_rounds} rounds")


def as_result(owned: Owned) -> dict[str, Assignment]:
    return {member: Assignment(tuple(partitions)) for member, partitions in owned.items()}


@given(group=groups(identical=True), joiners=member_ids, leavers=st.integers(0, 3))
@settings(max_examples=150)
def test_sticky_balances_and_keeps_what_members_own(group: tuple[dict[str, int], dict[str, tuple[str, ...]]],
                                                    joiners: list[str], leavers: int) -> None:
    """Identical subscriptions: loads differ by at most one after any membership change; survivors
    keep all but what balance takes from them; no member both gains and loses; two rounds suffice."""
    counts, topics_of = group
    before, _ = rebalance(counts, topics_of, {}, -1, max_rounds=1)
    shared = next(iter(topics_of.values()))
    survivors = sorted(topics_of)[leavers:]
    new_topics_of = {member: shared for member in survivors + [f"new-{j}" for j in joiners]}
    after, _ = rebalance(counts, new_topics_of, {m: before[m] for m in survivors}, 1, max_rounds=2)
    assert max(map(len, after.values())) - min(map(len, after.values())) <= 1
    floor_quota = len(all_partitions(counts, fresh(new_topics_of))) // len(new_topics_of)
    for member in survivors:
        kept = before[member] & after[member]
        assert len(kept) >= min(len(before[member]), floor_quota)
        assert not (before[member] - after[member]) or after[member] <= before[member], f"{member} swapped partitions"
    if len(new_topics_of) <= len(topics_of):
        assert all(before[member] <= after[member] for member in survivors), "a survivor lost a partition"


@given(group=groups())
@settings(max_examples=150)
def test_sticky_unchanged_membership_keeps_the_assignment(group: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """Any subscriptions: once stable, rebalancing the same members gives each exactly what it owns."""
    counts, topics_of = group
    owned, _ = rebalance(counts, topics_of, {}, -1, max_rounds=1)
    again = STICKY.assign(counts, subscriptions_of(topics_of, owned, dict.fromkeys(topics_of, 7)))
    assert partitions(again) == partitions(as_result(owned))


@given(group=groups(), changed=groups())
@settings(max_examples=200)
def test_sticky_never_hands_a_partition_over_directly(group: tuple[dict[str, int], dict[str, tuple[str, ...]]],
                                                      changed: tuple[dict[str, int], dict[str, tuple[str, ...]]]) -> None:
    """Any group changing into any other (members, subscriptions and topics all change): every round
    of the cooperative protocol is safe, and it settles on a complete assignment. A fresh group settles
    at once; with unequal subscriptions a change can take more than two rounds (each round's plan starts
    from what members hold then): up to 4 seen in over 20k random changes of up to 25 members, hence the 6."""
    counts, topics_of = group
    owned, _ = rebalance(counts, topics_of, {}, -1, max_rounds=1)
    new_counts, new_topics_of = changed
    rebalance(new_counts, new_topics_of, owned, 1, max_rounds=6)


def test_sticky_cooperative_rounds_with_identical_subscriptions_worked() -> None:
    """Three members own 12 partitions 4/4/4; a fourth joins: round 1 each owner revokes one and the
    newcomer gets nothing; round 2 the newcomer gets the three; nobody else changes."""
    counts, topics = {"t": 12}, ("t",)
    start = {"m1": set(tps("t-0", "t-1", "t-2", "t-3")), "m2": set(tps("t-4", "t-5", "t-6", "t-7")),
             "m3": set(tps("t-8", "t-9", "t-10", "t-11"))}
    topics_of = {member: topics for member in ("m1", "m2", "m3", "m4")}
    round1 = STICKY.assign(counts, subscriptions_of(topics_of, start, dict.fromkeys(start, 1)))
    assert partitions(round1) == {"m1": tps("t-0", "t-1", "t-2"), "m2": tps("t-4", "t-5", "t-6"),
                                  "m3": tps("t-8", "t-9", "t-10"), "m4": ()}
    owned = {member: set(assignment.partitions) for member, assignment in round1.items()}
    round2 = STICKY.assign(counts, subscriptions_of(topics_of, owned, dict.fromkeys(topics_of, 2)))
    assert partitions(round2) == {**partitions(round1), "m4": tps("t-3", "t-7", "t-11")}


# -- size ------------------------------------------------------------------------------------------------


def big_group(topic_count: int, partitions_per_topic: int, members: int) -> tuple[dict[str, int], dict[str, Subscription]]:
    counts = {f"topic-{index:03d}": partitions_per_topic for index in range(topic_count)}
    return counts, {f"member-{index:03d}": Subscription(tuple(counts)) for index in range(members)}


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
def test_hundred_partitions_three_members(assignor: PartitionAssignor) -> None:
    """100 partitions over 3 members: complete and balanced to one partition."""
    counts, subscriptions = big_group(1, 100, 3)
    result = assignor.assign(counts, subscriptions)
    assert_valid(counts, subscriptions, result)
    assert sorted(loads(result)) == [33, 33, 34]


@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=lambda assignor: assignor.name)
def test_ten_thousand_partitions_fifty_members(assignor: PartitionAssignor, capsys: pytest.CaptureFixture[str]) -> None:
    """10k partitions over 50 members, fresh and (sticky) after one member owned everything; prints the time."""
    counts, subscriptions = big_group(100, 100, 50)
    started = time.perf_counter()
    result = assignor.assign(counts, subscriptions)
    elapsed = time.perf_counter() - started
    assert_valid(counts, subscriptions, result)
    skewed = ""
    if isinstance(assignor, CooperativeStickyAssignor):
        everything = tuple(p for assignment in result.values() for p in assignment.partitions)
        one_owner = {member: Subscription(tuple(counts), everything if member == "member-000" else (), 1)
                     for member in subscriptions}
        started = time.perf_counter()
        moved = assignor.assign(counts, one_owner)
        skewed = f", {time.perf_counter() - started:.3f}s when one member owned all"
        assert loads(moved).count(0) == 49 and len(moved["member-000"].partitions) == 200
    with capsys.disabled():
        print(f"\n{assignor.name}: 10k partitions x 50 members in {elapsed:.3f}s{skewed}")
