"""SubscriptionState without a broker: what an assignment change keeps and drops, and when a
partition has a position."""
from __future__ import annotations

import pytest

from client.subscription_state import SubscriptionState
from common.errors import NoOffsetForPartitionError

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def test_a_new_assignment_keeps_the_positions_of_partitions_that_stay_and_drops_the_rest():
    """A and B consumed and paused; the assignment becomes [B, C]: A goes with its positions and
    pause, B keeps its own, C starts without one."""
    subs = SubscriptionState("earliest")
    subs.set_assigned([A, B], needs_position=False)
    subs.consumed.update({A: 5, B: 7})
    subs.fetch_positions.update({A: 9, B: 8})
    subs.paused.update({A, B})
    removed = subs.set_assigned([B, C], needs_position=False)
    assert removed == {A}
    assert (subs.assigned, subs.consumed, subs.fetch_positions, subs.paused) == ([B, C], {B: 7}, {B: 8}, {B})
    assert subs.missing_positions() == [C]


def test_group_assigned_partitions_without_a_position_wait_for_one():
    """With needs_position, only the partitions without a position wait (and are not missing);
    position() names the wait, and a partition leaving stops waiting."""
    subs = SubscriptionState("none")
    subs.set_assigned([A], needs_position=False)
    subs.consumed[A] = 3
    subs.set_assigned([A, B, C], needs_position=True)
    assert (subs.needs_position, subs.missing_positions(), subs.position(A)) == ({B, C}, [], 3)
    with pytest.raises(NoOffsetForPartitionError, match="looked up after on_assign"):
        subs.position(B)
    subs.set_assigned([A, B], needs_position=False)
    assert subs.needs_position == {B}


@pytest.mark.parametrize("assigned, message", [([A], "seek first"), ([], "not assigned")],
                         ids=["no-position", "not-assigned"])
def test_position_of_a_partition_without_one_is_a_named_error(assigned, message):
    """auto_offset_reset=none leaves an assigned partition without a position until a seek."""
    subs = SubscriptionState("none")
    subs.set_assigned(assigned, needs_position=False)
    with pytest.raises((NoOffsetForPartitionError, ValueError), match=message):
        subs.position(A)
    assert subs.positions() == {}


def test_an_unknown_reset_strategy_is_refused():
    with pytest.raises(ValueError, match="auto_offset_reset"):
        SubscriptionState("smallest")


def test_a_partition_moved_to_the_end_is_fetched_after_the_others():
    """Kafka's movePartitionToEnd: partitions never moved keep the given order, those moved come
    after them, least recently moved first; a partition that leaves forgets its place."""
    subs = SubscriptionState("earliest")
    subs.set_assigned([A, B, C], needs_position=False)
    subs.move_to_end([A])
    assert subs.in_fetch_order([A, B, C]) == [B, C, A]
    subs.move_to_end([B])
    assert subs.in_fetch_order([A, B, C]) == [C, A, B]
    subs.set_assigned([B, C], needs_position=False)
    subs.set_assigned([A, B, C], needs_position=False)
    assert subs.in_fetch_order([A, B, C]) == [A, C, B]
