"""Replica assignment (broker/cluster/assignment.py): leaders and followers spread evenly, racks
used before any rack gets a second replica, and too few brokers refused."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from broker.cluster.assignment import assign_replicas
from common.errors import InvalidReplicationFactorError


@pytest.mark.parametrize("brokers, partitions, factor", [(3, 30, 3), (5, 50, 3), (4, 8, 2), (1, 4, 1), (6, 600, 3)])
def test_leaders_and_replicas_spread_evenly(brokers, partitions, factor):
    """Every broker leads partitions/brokers partitions and holds factor*partitions/brokers
    replicas (exactly, when the numbers divide); no partition has a broker twice."""
    assigned = assign_replicas({b: "" for b in range(brokers)}, partitions, factor, rng=random.Random(7))
    assert sorted(assigned) == list(range(partitions))
    assert all(len(set(r)) == factor for r in assigned.values())
    leaders = Counter(r[0] for r in assigned.values())
    replicas = Counter(b for r in assigned.values() for b in r)
    assert set(leaders.values()) == {partitions // brokers}
    assert set(replicas.values()) == {partitions * factor // brokers}


def test_followers_of_one_broker_are_spread_over_the_others():
    """The shift grows every n partitions: a broker's partitions are followed by every other
    broker, so its death spreads their load (Kafka's reason for the shift)."""
    assigned = assign_replicas({b: "" for b in range(4)}, 40, 2, rng=random.Random(1))
    followers_of_0 = Counter(r[1] for r in assigned.values() if r[0] == 0)
    assert set(followers_of_0) == {1, 2, 3}


def test_racks_are_all_used_before_any_gets_a_second_replica():
    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assigned = assign_replicas(racks, 60, 3, rng=random.Random(3))
    assert all(len({racks[b] for b in r}) == 3 for r in assigned.values())
    uneven = {0: "a", 1: "a", 2: "a", 3: "b"}
    for replicas in assign_replicas(uneven, 20, 3, rng=random.Random(5)).values():
        assert {uneven[b] for b in replicas} == {"a", "b"} and len(set(replicas)) == 3


def test_added_partitions_continue_the_pattern():
    """Partitions added later are assigned as if the topic had been created with them."""
    brokers = {b: "" for b in range(3)}
    whole = assign_replicas(brokers, 9, 2, rng=random.Random(11))
    added = assign_replicas(brokers, 3, 2, first_partition=6, rng=random.Random(11))
    assert added == {p: whole[p] for p in (6, 7, 8)}


@pytest.mark.parametrize("factor", [0, 4])
def test_a_factor_the_live_brokers_cannot_hold_is_refused(factor):
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas({0: "", 1: "", 2: ""}, 3, factor)
