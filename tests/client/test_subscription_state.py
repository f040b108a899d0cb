"""SubscriptionState without a broker: what an assignment change keeps and drops, when a
partition has a position, and the guards on every change."""
from __future__ import annotations

import re

import pytest

from client.subscription_state import PartitionNotAssignedToConsumerError, SubscriptionState
from common.errors import NoOffsetForPartitionError

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def user_assigned(strategy: str, partitions: list, positions: dict | None = None) -> SubscriptionState:
    subs = SubscriptionState(strategy)
    subs.assign_from_user(partitions)
    for tp, offset in (positions or {}).items():
        subs.seek(tp, offset)
    return subs


def test_a_new_assignment_keeps_the_positions_of_partitions_that_stay_and_drops_the_rest():
    """A and B consumed and paused; the assignment becomes [B, C]: A goes with its positions and
    pause, B keeps its own, C starts without one."""
    subs = user_assigned("earliest", [A, B], {A: 5, B: 7})
    subs.set_fetch_position(A, 9)
    subs.set_fetch_position(B, 8)
    subs.pause([A, B])  # a pause sends the fetch positions back to the positions
    subs.set_fetch_position(B, 8)
    removed = subs.assign_from_user([B, C])
    assert removed == {A}
    assert subs.assigned_partitions() == [B, C]
    assert (subs.all_consumed(), subs.fetch_position(A), subs.fetch_position(B)) == ({B: 7}, None, 8)
    assert subs.paused_partitions() == [B]
    assert subs.missing_positions() == [C]


def test_group_assigned_partitions_without_a_position_wait_for_one():
    """Group-assigned partitions without a position are initializing (not missing); position()
    names the wait, and a partition leaving stops waiting."""
    subs = SubscriptionState("none")
    subs.subscribe(["t"], None)
    subs.assign_from_subscribed([A])
    subs.seek(A, 3)
    subs.assign_from_subscribed([A, B, C])
    assert (subs.initializing_partitions(), subs.missing_positions(), subs.position(A)) == ([B, C], [], 3)
    with pytest.raises(NoOffsetForPartitionError, match="looked up after on_assign"):
        subs.position(B)
    subs.assign_from_subscribed([A, B])
    assert subs.initializing_partitions() == [B]
    subs.initialization_done([B])  # nothing committed, auto_offset_reset=none: missing now
    assert subs.missing_positions() == [B]


@pytest.mark.parametrize("assigned, message", [([A], "seek first"), ([], "not assigned")],
                         ids=["no-position", "not-assigned"])
def test_position_of_a_partition_without_one_is_a_named_error(assigned, message):
    """auto_offset_reset=none leaves an assigned partition without a position until a seek."""
    subs = user_assigned("none", assigned)
    with pytest.raises((NoOffsetForPartitionError, PartitionNotAssignedToConsumerError), match=message):
        subs.position(A)
    assert subs.all_consumed() == {}


@pytest.mark.parametrize("change", [
    lambda subs: subs.seek(B, 4),
    lambda subs: subs.update_position(B, 4),
    lambda subs: subs.set_fetch_position(B, 4),
    lambda subs: subs.reset_fetch_position(B, 4, with_position=True),
    lambda subs: subs.pause([A, B]),
    lambda subs: subs.request_offset_reset([B], "earliest"),
], ids=["seek", "update_position", "set_fetch_position", "reset_fetch_position", "pause", "request_offset_reset"])
def test_a_position_or_state_for_an_unassigned_partition_is_a_named_error(change):
    """Every change names the partition that is not assigned and leaves no entry behind (a pause
    of [A, B] does not pause A either)."""
    subs = user_assigned("earliest", [A], {A: 1})
    with pytest.raises(PartitionNotAssignedToConsumerError, match="t-1 is not assigned"):
        change(subs)
    assert (subs.all_consumed(), subs.fetch_position(B), subs.paused_partitions(), subs.partitions_needing_reset()) \
        == ({A: 1}, None, [], {})
    assert subs.fetchable_partitions() == [A]


def test_a_negative_position_is_refused():
    subs = user_assigned("earliest", [A])
    with pytest.raises(ValueError, match="negative"):
        subs.seek(A, -1)
    assert not subs.has_valid_position(A)


def test_assign_and_subscribe_exclude_each_other_until_unsubscribe():
    """subscribe after assign (and assign after subscribe) is refused; assign([]) or unsubscribe
    ends the user's assignment, and the group cannot assign to a user-assigned consumer."""
    subs = user_assigned("earliest", [A])
    with pytest.raises(ValueError, match="mutually exclusive"):
        subs.subscribe(["t"], None)
    with pytest.raises(ValueError, match="user assigned"):
        subs.assign_from_subscribed([B])
    assert subs.unsubscribe() == {A}
    assert subs.subscribe(None, re.compile("t.*")) is True
    assert subs.subscribe(None, re.compile("t.*")) is False  # the same pattern: no change
    with pytest.raises(ValueError, match="mutually exclusive"):
        subs.assign_from_user([A])
    assert subs.matches("t1") and not subs.matches("__consumer_offsets") and not subs.matches("u")
    assert subs.subscribed_topics(["t1", "u", "__t"]) == frozenset({"t1"})


def test_a_reset_answer_applies_only_while_its_request_is_pending():
    """Kafka's maybeSeekUnvalidated: a seek (or another reset) made while the ListOffsets was out
    wins over its answer; a partition awaiting a reset is neither fetched nor missing."""
    subs = user_assigned("none", [A, B])
    subs.request_offset_reset([A, B], "earliest")
    assert subs.partitions_needing_reset() == {A: "earliest", B: "earliest"}
    assert subs.missing_positions() == []
    subs.seek(B, 9)
    subs.request_offset_reset([A], "latest")
    assert subs.maybe_seek_unvalidated(A, 0, "earliest") is False
    assert subs.maybe_seek_unvalidated(B, 0, "earliest") is False
    assert subs.maybe_seek_unvalidated(A, 50, "latest") is True
    assert (subs.all_consumed(), subs.partitions_needing_reset()) == ({A: 50, B: 9}, {})


def test_auto_offset_reset_none_requests_no_reset():
    subs = user_assigned("none", [A])
    subs.request_offset_reset([A])
    assert (subs.partitions_needing_reset(), subs.missing_positions()) == ({}, [A])


def test_partitions_pending_revocation_and_paused_ones_are_not_fetchable():
    subs = SubscriptionState("earliest")
    subs.subscribe(["t"], None)
    subs.assign_from_subscribed([A, B, C])
    for tp in (A, B, C):
        subs.seek(tp, 0)
    subs.mark_pending_revocation([A])
    subs.pause([B])
    assert subs.fetchable_partitions() == [C]
    subs.assign_from_subscribed([B, C])
    subs.resume([B])
    assert subs.fetchable_partitions() == [B, C]


def test_an_unknown_reset_strategy_is_refused():
    with pytest.raises(ValueError, match="auto_offset_reset"):
        SubscriptionState("smallest")


def test_a_partition_moved_to_the_end_is_fetched_after_the_others():
    """Kafka's movePartitionToEnd: partitions never moved keep the given order, those moved come
    after them, least recently moved first; a partition that leaves forgets its place."""
    subs = user_assigned("earliest", [A, B, C])
    subs.move_to_end([A])
    assert subs.in_fetch_order([A, B, C]) == [B, C, A]
    subs.move_to_end([B])
    assert subs.in_fetch_order([A, B, C]) == [C, A, B]
    subs.assign_from_user([B, C])
    subs.assign_from_user([A, B, C])
    assert subs.in_fetch_order([A, B, C]) == [A, C, B]
