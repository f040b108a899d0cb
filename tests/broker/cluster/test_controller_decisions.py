"""The controller's decisions (broker/cluster/controller.py `decide`), as Kafka's: a dead leader
is replaced by the first live in-sync replica under a new epoch; with none the partition goes
offline keeping its ISR, unless unclean election is allowed; dead followers leave the ISR; the
preferred replica gets leadership back when asked. A broker's controlled shutdown hands what it
leads to another in-sync replica and leaves every ISR, and keeps what no other replica is in sync
for (`shutdown_decision`)."""
from __future__ import annotations

import pytest

from broker.cluster.controller import decide, shutdown_decision
from broker.cluster.topics import NO_LEADER, PartitionState

S = PartitionState


@pytest.mark.parametrize("state, live, unclean, expected", [
    (S(1, 4, (1, 2, 3), (1, 2, 3)), {1, 2, 3}, False, None),
    (S(1, 4, (1, 2, 3), (1, 2, 3)), {2, 3}, False, S(2, 5, (1, 2, 3), (2, 3))),
    (S(1, 4, (1, 2, 3), (1, 3)), {2, 3}, False, S(3, 5, (1, 2, 3), (3,))),
    (S(1, 4, (1, 2, 3), (1,)), {2, 3}, False, S(NO_LEADER, 5, (1, 2, 3), (1,))),
    (S(1, 4, (1, 2, 3), (1,)), {2, 3}, True, S(2, 5, (1, 2, 3), (2,))),
    (S(NO_LEADER, 5, (1, 2, 3), (1,)), {2, 3}, False, None),
    (S(NO_LEADER, 5, (1, 2, 3), (1,)), {1, 2, 3}, False, S(1, 6, (1, 2, 3), (1,))),
    (S(1, 4, (1, 2, 3), (1, 2, 3)), {1, 2}, False, S(1, 4, (1, 2, 3), (1, 2))),
], ids=["healthy", "leader-dead", "leader-dead-first-follower-out-of-sync", "no-isr-left-offline",
        "unclean-election", "offline-stays-offline", "last-isr-member-returns", "follower-dead-leaves-isr"])
def test_decide(state, live, unclean, expected):
    assert decide(state, live, unclean) == expected


def test_preferred_leader_election_only_to_a_live_in_sync_first_replica():
    moved = S(2, 5, (1, 2, 3), (2, 3, 1))
    assert decide(moved, {1, 2, 3}, False) is None
    assert decide(moved, {1, 2, 3}, False, preferred=True) == S(1, 6, (1, 2, 3), (2, 3, 1))
    assert decide(S(2, 5, (1, 2, 3), (2, 3)), {1, 2, 3}, False, preferred=True) is None  # 1 not in sync yet


def test_a_reassignment_completes_once_every_target_is_in_sync():
    """Moving (1, 2, 3) to (4, 2, 3): nothing happens until 4 is in the ISR; then the replicas
    become the targets and 1 leaves. A leader being removed hands over to the first in-sync
    target under a new epoch; a leader that stays keeps leading under its epoch. Cancelling goes
    back to the original replicas."""
    moving = S(1, 4, (1, 2, 3), (1, 2, 3)).reassigned((4, 2, 3))
    assert (moving.replicas, moving.adding, moving.removing) == ((4, 2, 3, 1), (4,), (1,))
    assert decide(moving, {1, 2, 3, 4}, False) is None  # 4 not in sync yet
    caught_up = S(1, 4, moving.replicas, (1, 2, 3, 4), moving.adding, moving.removing)
    assert decide(caught_up, {1, 2, 3, 4}, False) == S(2, 5, (4, 2, 3), (2, 3, 4))
    kept_leader = S(2, 4, (4, 2, 3, 1), (1, 2, 3, 4), (4,), (1,))
    assert decide(kept_leader, {1, 2, 3, 4}, False) == S(2, 4, (4, 2, 3), (2, 3, 4))
    assert moving.reassigned((1, 2, 3)) == S(1, 4, (1, 2, 3), (1, 2, 3))  # cancelled


def test_watched_changes_of_one_topic_are_applied_together():
    """The broker applies a topic's consecutive changes as one step (a new topic's replicas are
    created in one batch); a deletion stays a step of its own, in order."""
    from broker.cluster.topics import MetadataChange as C
    from broker.server import _by_topic

    changes = [C("topic", "a"), C("partition", "a", 0), C("partition", "a", 1), C("partition", "b", 3),
               C("partition", "b", 4), C("topic_deleted", "b"), C("topic", "b"), C("partition", "b", 0)]
    assert _by_topic(changes) == [("a", True, set()), ("b", False, {3, 4}), ("b", None, set()), ("b", True, set())]


@pytest.mark.parametrize("state, expected", [
    (S(1, 4, (1, 2, 3), (1, 2, 3)), S(2, 5, (1, 2, 3), (2, 3))),
    (S(1, 4, (1, 2, 3), (1, 3)), S(3, 5, (1, 2, 3), (3,))),
    (S(2, 4, (1, 2, 3), (2, 1, 3)), S(2, 4, (1, 2, 3), (2, 3))),
    (S(2, 4, (1, 2, 3), (2, 3)), None),
    (S(1, 4, (1, 2, 3), (1,)), None),
    (S(2, 4, (2, 3), (2, 3)), None),
], ids=["leader-hands-over", "to-the-first-in-sync-replica", "follower-leaves-isr", "not-in-isr",
        "no-other-in-sync-replica-keeps-leading", "not-a-replica"])
def test_controlled_shutdown_of_broker_1(state, expected):
    assert shutdown_decision(state, 1, {1, 2, 3}) == expected


def test_controlled_shutdown_hands_over_only_to_a_live_replica():
    assert shutdown_decision(S(1, 4, (1, 2, 3), (1, 2, 3)), 1, {1, 3}) == S(3, 5, (1, 2, 3), (3,))
    assert shutdown_decision(S(1, 4, (1, 2, 3), (1, 2)), 1, {1, 3}) is None
