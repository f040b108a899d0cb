"""Consumer groups against a real broker process: membership, rebalancing (eager and cooperative),
static members, session and poll-interval expiry, commits and delivery semantics.

Every test has its own group and topic on the module's broker, which starts rebalances at once
(group.initial.rebalance.delay.ms=0) and allows short sessions, so that each takes seconds. A
member "stops heartbeating" by having its I/O loop blocked; a member "crashes" by having its
loop stopped without close() (no commit, no LeaveGroup). Waits are conditions, never timings.
"""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.coordinator.group_records import partition_for
from client import Admin, Consumer, ConsumerRecord, Producer
from common.errors import NoOffsetForPartitionError, PartitionNotAssignedError
from common.topic_partition import TopicPartition
from tests.waiting import wait_until

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 500,
                    "offsets.topic.num.partitions": 3}
FAST = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 200, "fetch_max_wait_ms": 100,
        "auto_offset_reset": "earliest"}


class Member:
    """One consumer of a test group, with every callback it saw and every record it received."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.events: list[tuple[str, list[TopicPartition]]] = []
        self.records: list[ConsumerRecord] = []
        self.callback_threads: set[str] = set()

    def _note(self, kind: str) -> Callable[[list[TopicPartition]], None]:
        def note(partitions: list[TopicPartition]) -> None:
            self.callback_threads.add(threading.current_thread().name)
            self.events.append((kind, partitions))
        return note

    def subscribe(self, topics: list[str] | None = None, pattern: str | None = None) -> "Member":
        self.consumer.subscribe(topics, pattern=pattern, on_assign=self._note("assign"),
                                on_revoke=self._note("revoke"), on_lost=self._note("lost"))
        return self

    def poll(self, timeout_ms: int = 50) -> list[ConsumerRecord]:
        got = self.consumer.poll(timeout_ms=timeout_ms)
        self.records += got
        return got

    def assignment(self) -> list[TopicPartition]:
        return sorted(self.consumer.assignment())

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


@pytest.fixture
def members(shared_broker) -> Iterator[Callable[..., Member]]:
    """members(group_id, **settings) -> a subscribed-later Member; closed at teardown (a crashed
    one is skipped: its loop is gone)."""
    made: list[Member] = []

    def make(group_id: str, **settings: Any) -> Member:
        member = Member(Consumer(shared_broker.bootstrap, group_id=group_id, **{**FAST, **settings}))
        made.append(member)
        return member

    yield make
    for member in made:
        try:
            member.consumer.close()
        except Exception:  # a test that broke the member on purpose
            pass


def produce(bootstrap: str, topic: str, n: int, start: int = 0) -> list[bytes]:
    values = [b"v%d" % i for i in range(start, start + n)]
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic, v, key=v) for v in values]
        producer.flush()
        for future in futures:
            future.result(10)
    return values


def poll_until(group: list[Member], condition: Callable[[], bool], timeout_s: float = 20.0,
               what: str = "condition") -> None:
    """Poll every member in turn until `condition()` holds; fail naming `what` and the members' state."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for member in group:
            member.poll()
        if condition():
            return
    raise AssertionError(f"{what} not reached: " + "; ".join(
        f"{m.consumer.group_metadata().member_id[:20]} owns {m.assignment()} events {m.events}" for m in group))


def split_evenly(group: list[Member], partitions: list[TopicPartition]) -> Callable[[], bool]:
    """Every partition owned by exactly one member, and the members' shares differ by at most one."""
    def check() -> bool:
        owned = [m.assignment() for m in group]
        flat = sorted(tp for share in owned for tp in share)
        sizes = [len(share) for share in owned]
        return flat == sorted(partitions) and max(sizes) - min(sizes) <= 1
    return check


def poll_first(member: Member, max_records: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """The first non-empty poll's records (the member joins on the way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = member.consumer.poll(timeout_ms=200, max_records=max_records)
        if got:
            return got
    raise AssertionError("no records")


def crash(member: Member) -> None:
    """Stop the member's I/O loop without close(): no commit, no LeaveGroup, no heartbeats."""
    member.consumer._thread.stop()
    member.consumer._core._closed = True


def values_of(records: list[ConsumerRecord]) -> list[bytes]:
    return sorted(r.value for r in records)  # type: ignore[misc]


# -- one member --------------------------------------------------------------------------------


def test_single_member_consumes_commits_and_a_restart_resumes_after_the_commit(shared_broker, new_topic, members):
    """30 records consumed and committed by hand; a new member of the group reads only the 10 produced after."""
    topic = new_topic(3)
    first = produce(shared_broker.bootstrap, topic, 30)
    member = members("solo", enable_auto_commit=False).subscribe([topic])
    poll_until([member], lambda: len(member.records) == 30, what="30 records")
    assert values_of(member.records) == sorted(first)
    assert member.events == [("assign", [(topic, 0), (topic, 1), (topic, 2)])]
    member.consumer.commit()
    committed = member.consumer.committed([(topic, p) for p in range(3)])
    assert sum(committed.values()) == 30  # each the next offset to consume
    assert committed == {(topic, p): member.consumer.position((topic, p)) for p in range(3)}
    member.consumer.close()

    later = produce(shared_broker.bootstrap, topic, 10, start=30)
    restarted = members("solo").subscribe([topic])
    poll_until([restarted], lambda: len(restarted.records) >= 10, what="10 new records")
    assert values_of(restarted.records) == sorted(later)


def test_close_auto_commits_what_poll_returned(shared_broker, new_topic, members):
    """With auto-commit, close() commits the positions; the group's next member starts there."""
    topic = new_topic(2)
    produce(shared_broker.bootstrap, topic, 20)
    member = members("autoclose").subscribe([topic])
    poll_until([member], lambda: len(member.records) == 20, what="20 records")
    member.consumer.close()
    again = members("autoclose").subscribe([topic])
    poll_until([again], lambda: bool(again.assignment()), what="assignment")
    assert sum(again.consumer.committed([(topic, 0), (topic, 1)]).values()) == 20  # type: ignore[arg-type]
    assert again.poll(timeout_ms=300) == []


def test_records_returned_but_not_followed_by_another_poll_are_delivered_again(shared_broker, new_topic, members):
    """At least once: a member that polled 5 records and crashed before polling again committed
    nothing, so the group's next member gets those 5 again."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 10)
    doomed = members("alo", session_timeout_ms=1000, auto_commit_interval_ms=1).subscribe([topic])
    first = poll_first(doomed, max_records=5)
    assert [r.offset for r in first] == [0, 1, 2, 3, 4]
    crash(doomed)
    survivor = members("alo").subscribe([topic])
    poll_until([survivor], lambda: len(survivor.records) >= 10, what="all 10 records")
    assert [r.offset for r in survivor.records] == list(range(10))


def test_the_next_poll_auto_commits_what_the_previous_poll_returned(shared_broker, new_topic, members):
    """The second poll commits the positions after the first poll's 5 records (not its own):
    after a crash, the next member starts at offset 5."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 10)
    doomed = members("alo2", session_timeout_ms=1000, auto_commit_interval_ms=50).subscribe([topic])
    first = poll_first(doomed, max_records=5)
    time.sleep(0.1)  # not a condition, the point: the auto-commit interval (50 ms) passes, so the next poll commits
    second = doomed.consumer.poll(timeout_ms=200, max_records=5)
    assert [r.offset for r in first + second] == list(range(10))
    wait_until(lambda: doomed.consumer.committed([(topic, 0)])[(topic, 0)] == 5, 10, "the auto-commit of offset 5")
    crash(doomed)
    survivor = members("alo2").subscribe([topic])
    poll_until([survivor], lambda: len(survivor.records) >= 5, what="5 records")
    assert [r.offset for r in survivor.records] == list(range(5, 10))


# -- several members and groups -------------------------------------------------------------------


def test_two_members_split_six_partitions_and_each_record_is_consumed_once(shared_broker, new_topic, members):
    """Queue semantics: once two members share 6 partitions 3/3, 120 records are each consumed by exactly one."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    group = [members("queue").subscribe([topic]), members("queue").subscribe([topic])]
    poll_until(group, split_evenly(group, partitions), what="a 3/3 split")
    assert all(len(m.assignment()) == 3 for m in group)
    sent = produce(shared_broker.bootstrap, topic, 120)
    poll_until(group, lambda: sum(len(m.records) for m in group) >= 120, what="120 records")
    for _ in range(5):
        for member in group:
            member.poll()
    received = [r for m in group for r in m.records]
    assert values_of(received) == sorted(sent)  # complete, no duplicates
    for member in group:
        assert {(r.topic, r.partition) for r in member.records} <= set(member.assignment())
    assert all(m.callback_threads == {threading.current_thread().name} for m in group)


def test_two_groups_each_receive_every_record(shared_broker, new_topic, members):
    """Pub-sub: two groups on one topic each get all 50 records."""
    topic = new_topic(2)
    sent = produce(shared_broker.bootstrap, topic, 50)
    readers = [members("pubsub-a").subscribe([topic]), members("pubsub-b").subscribe([topic])]
    poll_until(readers, lambda: all(len(m.records) >= 50 for m in readers), what="50 records in each group")
    assert values_of(readers[0].records) == values_of(readers[1].records) == sorted(sent)


# -- rebalance protocols --------------------------------------------------------------------------


def test_eager_member_join_revokes_everything_before_reassigning(shared_broker, new_topic, members):
    """range: the first member gets 6, revokes all 6 when a second joins, and is assigned 3."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    first = members("eager", partition_assignment_strategy=["range"]).subscribe([topic])
    poll_until([first], lambda: first.assignment() == partitions, what="all 6 to the first member")
    second = members("eager", partition_assignment_strategy=["range"]).subscribe([topic])
    poll_until([first, second], split_evenly([first, second], partitions), what="a 3/3 split")
    assert first.events == [("assign", partitions), ("revoke", partitions), ("assign", first.assignment())]
    assert second.events == [("assign", second.assignment())]


def test_cooperative_member_join_revokes_only_the_moved_partitions(shared_broker, new_topic, members):
    """cooperative-sticky: when a second member joins, the first revokes just the 3 partitions that
    move (and keeps reading the other 3 throughout); the second gets them in the follow-up rebalance."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    settings = {"partition_assignment_strategy": ["cooperative-sticky"]}
    first = members("coop", **settings).subscribe([topic])
    poll_until([first], lambda: first.assignment() == partitions, what="all 6 to the first member")
    second = members("coop", **settings).subscribe([topic])
    group = [first, second]
    held: list[set[TopicPartition]] = []

    def settled() -> bool:
        held.append(set(first.assignment()))
        return split_evenly(group, partitions)()

    poll_until(group, settled, what="a 3/3 split")
    kept = set(first.assignment())
    moved = sorted(set(partitions) - kept)
    assert all(kept <= owned for owned in held)  # never gave up what it keeps
    assert [e for e in first.events if e[0] == "revoke"] == [("revoke", moved)]
    assert first.events[0] == ("assign", partitions)
    assert [e for e in first.events[1:] if e[0] == "assign"] == [("assign", [])] * (len(first.events) - 2)
    assert ("assign", moved) in second.events and second.assignment() == moved
    assert [p for kind, ps in second.events if kind == "assign" for p in ps] == moved


def test_cooperative_member_commits_the_partitions_it_revokes_inside_on_revoke(shared_broker, new_topic, members):
    """Under the cooperative protocol on_revoke runs after the new generation began; committing
    the revoked partitions' positions there is accepted (nobody owns them yet)."""
    topic = new_topic(4)
    produce(shared_broker.bootstrap, topic, 40)
    partitions = [(topic, p) for p in range(4)]
    settings = {"partition_assignment_strategy": ["cooperative-sticky"], "enable_auto_commit": False}
    first = members("coop-commit", **settings)
    committed: dict[TopicPartition, int] = {}

    def on_revoke(revoked: list[TopicPartition]) -> None:
        offsets = {tp: first.consumer.position(tp) for tp in revoked}
        first.consumer.commit(offsets)
        committed.update(offsets)

    first.consumer.subscribe([topic], on_revoke=on_revoke)
    poll_until([first], lambda: len(first.records) == 40, what="every record by the first member")
    second = members("coop-commit", **settings).subscribe([topic])
    poll_until([first, second], split_evenly([first, second], partitions), what="a 2/2 split")
    assert committed and committed == first.consumer.end_offsets(list(committed))  # all 40 were consumed
    assert first.consumer.committed(list(committed)) == committed


# -- static membership ----------------------------------------------------------------------------


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_static_member_restarted_within_the_session_timeout_gets_its_partitions_without_a_rebalance(
        shared_broker, new_topic, members, assignor):
    """A static member closes (no LeaveGroup) and a new process with its instance id takes its place:
    same partitions, same generation, and the other member sees no revocation (a cooperative
    member's subscription names the partitions it owned, which must not count as a change)."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    settings = {"session_timeout_ms": 5000, "partition_assignment_strategy": [assignor]}
    group = f"static-{assignor}"
    static = members(group, group_instance_id="static-a", **settings).subscribe([topic])
    other = members(group, **settings).subscribe([topic])
    poll_until([static, other], split_evenly([static, other], partitions), what="a 3/3 split")
    owned, generation = static.assignment(), other.consumer.group_metadata().generation_id
    other_events = list(other.events)
    static.consumer.close()
    assert static.events[-1] == ("revoke", owned)

    restarted = members(group, group_instance_id="static-a", **settings).subscribe([topic])
    poll_until([restarted, other], lambda: restarted.assignment() == owned, timeout_s=10, what="the old partitions")
    assert restarted.events == [("assign", owned)]
    assert restarted.consumer.group_metadata().generation_id == generation
    end = time.monotonic() + 1.0  # several heartbeats: a rebalance would show on the other member
    while time.monotonic() < end:
        other.poll()
        restarted.poll()
    assert other.events == other_events
    assert other.consumer.group_metadata().generation_id == generation


# -- failures -------------------------------------------------------------------------------------


def test_member_that_stops_heartbeating_is_evicted_and_its_partitions_move(shared_broker, new_topic, members):
    """A member whose I/O loop is blocked past its session timeout is removed; the other member
    takes its partitions, and the blocked one learns it lost them (on_lost) and rejoins."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    settings = {"session_timeout_ms": 1000}
    alive, stuck = members("evict", **settings).subscribe([topic]), members("evict", **settings).subscribe([topic])
    poll_until([alive, stuck], split_evenly([alive, stuck], partitions), what="a 3/3 split")
    lost = stuck.assignment()
    unblock = threading.Event()
    stuck.consumer._thread.call_soon(unblock.wait, 20.0)  # no heartbeats, no fetches
    try:
        poll_until([alive], lambda: alive.assignment() == partitions, what="all 6 to the live member")
    finally:
        unblock.set()
    poll_until([alive, stuck], split_evenly([alive, stuck], partitions), what="a 3/3 split again")
    assert ("lost", lost) in stuck.events
    assert ("revoke", lost) not in stuck.events


def test_slow_processing_keeps_membership_while_heartbeats_run_in_the_background(shared_broker, new_topic, members):
    """Sleeping longer than the session timeout (but within max.poll.interval) between polls
    loses nothing: same generation, same partitions, no on_lost."""
    topic = new_topic(2)
    member = members("slow", session_timeout_ms=800, max_poll_interval_ms=10_000).subscribe([topic])
    poll_until([member], lambda: len(member.assignment()) == 2, what="assignment")
    generation = member.consumer.group_metadata().generation_id
    for _ in range(2):
        time.sleep(1.5)  # not a condition, the point: "processing" for longer than the session timeout
        member.poll()
    assert member.consumer.group_metadata().generation_id == generation
    assert member.kinds() == ["assign"]


def test_exceeding_max_poll_interval_leaves_the_group_and_the_next_poll_rejoins(shared_broker, new_topic, members):
    """A member that does not poll within max.poll.interval.ms leaves at once (its partitions go to
    the other member) and, when it polls again, loses them (on_lost) and rejoins."""
    topic = new_topic(6)
    partitions = [(topic, p) for p in range(6)]
    settings = {"max_poll_interval_ms": 1500}
    busy, steady = members("maxpoll", **settings).subscribe([topic]), members("maxpoll", **settings).subscribe([topic])
    poll_until([busy, steady], split_evenly([busy, steady], partitions), what="a 3/3 split")
    held = busy.assignment()
    poll_until([steady], lambda: steady.assignment() == partitions, what="all 6 to the polling member")
    assert busy.consumer.group_metadata().member_id == ""  # it left
    assert busy.assignment() == []
    poll_until([busy, steady], split_evenly([busy, steady], partitions), what="a 3/3 split again")
    assert ("lost", held) in busy.events


# -- offsets and API rules --------------------------------------------------------------------------


def test_auto_offset_reset_none_raises_without_a_committed_offset(shared_broker, new_topic, members):
    """No committed offset and auto.offset.reset none: poll raises NoOffsetForPartitionError until a seek."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 3)
    member = members("reset-none", auto_offset_reset="none").subscribe([topic])
    deadline = time.monotonic() + 15
    with pytest.raises(NoOffsetForPartitionError):
        while time.monotonic() < deadline:
            member.poll()
    member.consumer.seek((topic, 0), 1)
    poll_until([member], lambda: len(member.records) == 2, what="2 records after the seek")
    assert [r.offset for r in member.records] == [1, 2]


def test_commit_of_a_partition_owned_by_another_member_is_refused(shared_broker, new_topic, members):
    """The coordinator refuses a member's commit for a partition it was not assigned."""
    topic = new_topic(2)
    group = [members("unowned").subscribe([topic]), members("unowned").subscribe([topic])]
    poll_until(group, split_evenly(group, [(topic, 0), (topic, 1)]), what="a 1/1 split")
    theirs = group[1].assignment()[0]
    with pytest.raises(PartitionNotAssignedError):
        group[0].consumer.commit({theirs: 1})
    group[0].consumer.commit({group[0].assignment()[0]: 0})  # its own partition is fine


def test_subscribe_and_assign_are_mutually_exclusive(shared_broker, new_topic, members):
    """assign() while subscribed and subscribe() after assign() raise; unsubscribe() clears either."""
    topic = new_topic(1)
    member = members("exclusive").subscribe([topic])
    with pytest.raises(ValueError, match="mutually exclusive"):
        member.consumer.assign([(topic, 0)])
    member.consumer.unsubscribe()
    member.consumer.assign([(topic, 0)])
    with pytest.raises(ValueError, match="mutually exclusive"):
        member.consumer.subscribe([topic])
    member.consumer.unsubscribe()
    member.subscribe([topic])
    poll_until([member], lambda: member.assignment() == [(topic, 0)], what="assignment")


def test_commit_async_reports_to_its_callback_on_the_polling_thread(shared_broker, new_topic, members):
    """commit_async returns at once; its callback runs inside a later poll, on the polling thread."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 4)
    member = members("async-commit", enable_auto_commit=False).subscribe([topic])
    poll_until([member], lambda: len(member.records) == 4, what="4 records")
    outcomes: list[tuple[dict, Any, str]] = []
    member.consumer.commit_async(callback=lambda offsets, error: outcomes.append(
        (offsets, error, threading.current_thread().name)))
    poll_until([member], lambda: bool(outcomes), what="the commit callback")
    assert outcomes == [({(topic, 0): 4}, None, threading.current_thread().name)]
    assert member.consumer.committed([(topic, 0)]) == {(topic, 0): 4}


def test_pattern_subscription_picks_up_a_new_matching_topic(shared_broker, new_topic, topic_name, members):
    """A pattern subscription rejoins when metadata shows a new matching topic, and reads it."""
    from client import Admin

    prefix = f"{topic_name}-pat"
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(f"{prefix}-a", partitions=1)
    member = members("pattern", metadata_max_age_ms=300).subscribe(pattern=f"{prefix}-.*")
    poll_until([member], lambda: member.assignment() == [(f"{prefix}-a", 0)], what="the first topic")
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic(f"{prefix}-b", partitions=1)
    produce(shared_broker.bootstrap, f"{prefix}-b", 3)
    poll_until([member], lambda: len(member.records) == 3, what="the new topic's records")
    assert member.assignment() == [(f"{prefix}-a", 0), (f"{prefix}-b", 0)]


def test_paused_partitions_return_nothing_until_resumed(shared_broker, new_topic, members):
    """A paused partition stays assigned but returns no records; after resume, it returns them all."""
    topic = new_topic(2)
    member = members("pause").subscribe([topic])
    poll_until([member], lambda: len(member.assignment()) == 2, what="assignment")
    member.consumer.pause((topic, 0))
    assert member.consumer.paused() == [(topic, 0)]
    with Producer(shared_broker.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, b"p%d" % i, partition=i % 2)
        producer.flush()
    poll_until([member], lambda: len(member.records) == 5, what="partition 1's records")
    for _ in range(5):
        member.poll()
    assert {r.partition for r in member.records} == {1}
    member.consumer.resume((topic, 0))
    poll_until([member], lambda: len(member.records) == 10, what="partition 0's records after resume")


def test_group_settings_take_kafka_names_and_are_checked(shared_broker):
    """Dotted Kafka names and class names are accepted; contradictions fail at construction."""
    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "cfg", "enable.auto.commit": "false",
                         "partition.assignment.strategy": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"})
    try:
        assert consumer._core.enable_auto_commit is False
        assert consumer._core._coordinator is not None and consumer._core._coordinator.protocol == "cooperative"
    finally:
        consumer.close()
    bad: list[dict[str, Any]] = [
        {"group_id": "g", "heartbeat_interval_ms": 3000, "session_timeout_ms": 3000},
        {"group_id": "g", "partition_assignment_strategy": ["sticky-ish"]},
        {"enable_auto_commit": True},
        {"group_instance_id": "x"},
        {"group_id": ""},
    ]
    for settings in bad:
        with pytest.raises(ValueError):
            Consumer(shared_broker.bootstrap, **settings)
    plain = Consumer(shared_broker.bootstrap)
    try:
        with pytest.raises(ValueError, match="group_id"):
            plain.subscribe(["t"])
        with pytest.raises(ValueError, match="group_id"):
            plain.commit()
    finally:
        plain.close()


def test_on_assign_sees_the_committed_position_and_a_seek_there_wins(shared_broker, new_topic, members):
    """Inside on_assign, position() is the committed offset; a seek there (a replay from the
    start) is where consumption starts."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 6)
    first = members("replay").subscribe([topic])
    poll_until([first], lambda: len(first.records) == 6, what="6 records")
    first.consumer.close()  # commits 6
    replayer = Consumer(shared_broker.bootstrap, group_id="replay", **FAST)
    seen: list[int] = []

    def rewind(partitions: list[TopicPartition]) -> None:
        seen.extend(replayer.position(tp) for tp in partitions)
        replayer.seek_to_beginning(*partitions)

    try:
        replayer.subscribe([topic], on_assign=rewind)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + 20
        while len(records) < 6 and time.monotonic() < deadline:
            records += replayer.poll(timeout_ms=100)
        assert seen == [6]
        assert [r.offset for r in records] == list(range(6))
    finally:
        replayer.close()


def test_a_second_process_with_the_same_instance_id_fences_the_first(shared_broker, new_topic, members):
    """Two live consumers with one group.instance.id: the newer takes over, the older one's poll
    raises FencedInstanceIdError (and its partitions are lost) instead of consuming alongside."""
    from common.errors import FencedInstanceIdError

    topic = new_topic(2)
    older = members("fence", group_instance_id="same").subscribe([topic])
    poll_until([older], lambda: len(older.assignment()) == 2, what="assignment")
    newer = members("fence", group_instance_id="same").subscribe([topic])
    poll_until([newer], lambda: len(newer.assignment()) == 2, what="the newer member's assignment")
    with pytest.raises(FencedInstanceIdError):
        poll_until([older], lambda: False, timeout_s=10, what="the fence")
    assert older.assignment() == []
    assert ("lost", [(topic, 0), (topic, 1)]) in older.events


def test_async_consumer_joins_commits_and_awaits_coroutine_callbacks(shared_broker, new_topic):
    """AsyncConsumer: subscribe, coroutine callbacks awaited inside poll, commit, close (which revokes)."""
    import asyncio

    from client import AsyncConsumer

    topic = new_topic(2)
    produce(shared_broker.bootstrap, topic, 8)
    events: list[tuple[str, list[TopicPartition]]] = []

    async def scenario() -> None:
        consumer = await AsyncConsumer(shared_broker.bootstrap, group_id="async", **FAST).start()
        try:
            async def on_assign(partitions: list[TopicPartition]) -> None:
                await asyncio.sleep(0)  # a loop turn: the callback really suspends, as a coroutine may
                events.append(("assign", partitions))

            await consumer.subscribe([topic], on_assign=on_assign, on_revoke=lambda ps: events.append(("revoke", ps)))
            records: list[ConsumerRecord] = []
            while len(records) < 8:
                records += await consumer.poll(timeout_ms=100)
            await consumer.commit()
            assert await consumer.committed([(topic, 0), (topic, 1)]) == {
                (topic, p): consumer.position((topic, p)) for p in range(2)}
        finally:
            await consumer.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert events == [("assign", [(topic, 0), (topic, 1)]), ("revoke", [(topic, 0), (topic, 1)])]


def test_breaking_out_of_the_record_loop_commits_only_what_was_yielded(shared_broker, new_topic, members):
    """`for record in consumer` stopped after 3 records of a 10-record batch: close() commits 3,
    and the group's next member reads records 3..9 (the rest of the batch was not consumed)."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, linger_ms=50) as producer:  # one batch
        for i in range(10):
            producer.send(topic, b"r%d" % i)
        producer.flush()
    member = members("iterate").subscribe([topic])
    taken = []
    for record in member.consumer:
        taken.append(record.offset)
        if len(taken) == 3:
            break
    assert taken == [0, 1, 2]
    assert member.consumer.position((topic, 0)) == 3
    member.consumer.close()
    successor = members("iterate").subscribe([topic])
    poll_until([successor], lambda: len(successor.records) == 7, what="the 7 records not consumed")
    assert [r.offset for r in successor.records] == list(range(3, 10))


def test_member_survives_a_coordinator_restart_without_a_rebalance(broker_factory):
    """SIGKILL and restart the broker under a live member: it finds the coordinator again, keeps
    its generation and partitions (the group is replayed from __consumer_offsets), and goes on
    consuming from where it was."""
    from client import Admin

    broker = broker_factory(**BROKER_OVERRIDES).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("failover", partitions=2)
    produce(broker.bootstrap, "failover", 10)
    consumer = Consumer(broker.bootstrap, group_id="failover", **{**FAST, "session_timeout_ms": 15_000,
                                                                   "request_timeout_ms": 5000})
    member = Member(consumer).subscribe(["failover"])
    try:
        poll_until([member], lambda: len(member.records) == 10, what="10 records")
        generation = consumer.group_metadata().generation_id
        consumer.commit()
        broker.kill()
        broker.start()
        produce(broker.bootstrap, "failover", 10, start=10)
        poll_until([member], lambda: len(member.records) == 20, timeout_s=30, what="the 10 records after the restart")
        assert values_of(member.records) == sorted(b"v%d" % i for i in range(20))
        assert consumer.group_metadata().generation_id == generation
        assert member.kinds() == ["assign"]
    finally:
        consumer.close()


def test_member_whose_coordinator_forgot_the_group_rejoins_and_goes_on_consuming(broker_factory):
    """The coordinator comes back without the group (its __consumer_offsets partition lost, as a
    new coordinator that replayed too little had it): the member's next commit is answered
    UNKNOWN_MEMBER_ID ("group does not exist"), its partitions are lost, and it joins again as a
    new member and goes on consuming, with no error and no help from the application. Heartbeats
    are rare and auto-commits frequent, so a commit, not a heartbeat, finds it out."""
    broker = broker_factory(**BROKER_OVERRIDES).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("forgotten", partitions=2)
    produce(broker.bootstrap, "forgotten", 10)
    consumer = Consumer(broker.bootstrap, group_id="forgotten", **{
        **FAST, "session_timeout_ms": 15_000, "heartbeat_interval_ms": 5000, "auto_commit_interval_ms": 100,
        "request_timeout_ms": 5000})
    member = Member(consumer).subscribe(["forgotten"])
    try:
        poll_until([member], lambda: len(member.records) == 10, what="10 records")
        broker.kill()
        offsets_partition = partition_for("forgotten", BROKER_OVERRIDES["offsets.topic.num.partitions"])
        for directory in broker.log_dir.glob(f"**/__consumer_offsets-{offsets_partition}"):
            shutil.rmtree(directory)
        broker.start()
        poll_until([member], lambda: "lost" in member.kinds(), timeout_s=30, what="the loss of the generation")
        produce(broker.bootstrap, "forgotten", 10, start=10)
        poll_until([member], lambda: set(values_of(member.records)) == {b"v%d" % i for i in range(20)},
                   timeout_s=30, what="the records produced after the rejoin")
        assert member.kinds() == ["assign", "lost", "assign"]
    finally:
        consumer.close()


# -- a subscribed topic deleted and re-created ---------------------------------------------------


@pytest.mark.parametrize("partitions_after", [1, 2], ids=["same-partition-count", "more-partitions"])
def test_member_whose_subscribed_topic_is_recreated_gets_the_new_records(shared_broker, new_topic, members,
                                                                           partitions_after):
    """Issue 34 item 6 (group mode): a member read 5 records of its one-partition topic, which is
    then deleted and re-created (with 1 or 2 partitions) and given 8 new records: the member owns
    every partition of the new topic and receives exactly the 8 new records, each once, without
    waiting for metadata.max.age.ms (5 minutes here); the auto-commit before a rebalance does not
    commit the old topic's positions for the new one."""
    topic = new_topic(1)
    old = produce(shared_broker.bootstrap, topic, 5)
    member = members("recreated", metadata_max_age_ms=300_000, auto_commit_interval_ms=300_000).subscribe([topic])
    poll_until([member], lambda: len(member.records) == 5, what="the old records")
    with Admin(shared_broker.bootstrap) as admin:
        admin.delete_topics([topic])
        admin.create_topic(topic, partitions=partitions_after)
    new = produce(shared_broker.bootstrap, topic, 8, start=100)
    poll_until([member], lambda: len(member.records) >= 13 and len(member.assignment()) == partitions_after,
               what="the new records")
    assert values_of(member.records) == sorted(old + new)
    assert member.assignment() == [(topic, p) for p in range(partitions_after)]


def test_member_whose_subscribed_topic_is_deleted_loses_it_and_gets_it_back_when_recreated(shared_broker, new_topic,
                                                                                            members):
    """A subscribed topic deleted: the member's partitions are revoked (the leader rejoins, as
    Kafka's does). Created again later, with 2 partitions and 6 records: the member is assigned
    both and receives the 6, without waiting for metadata.max.age.ms (5 minutes here)."""
    topic = new_topic(1)
    old = produce(shared_broker.bootstrap, topic, 3)
    member = members("deleted-then-recreated", metadata_max_age_ms=300_000,
                     auto_commit_interval_ms=300_000).subscribe([topic])
    poll_until([member], lambda: len(member.records) == 3, what="the old records")
    with Admin(shared_broker.bootstrap) as admin:
        admin.delete_topics([topic])
        poll_until([member], lambda: member.assignment() == [], what="the deleted topic revoked")
        # Past the fetcher's last metadata refresh for the deleted topic (its backoff is 1 s at most).
        fetcher = member.consumer._core._fetcher
        poll_until([member], lambda: fetcher._leaderless is None or fetcher._leaderless.done(), what="the fetcher idle")
        admin.create_topic(topic, partitions=2)
    new = produce(shared_broker.bootstrap, topic, 6, start=100)
    poll_until([member], lambda: len(member.records) >= 9 and len(member.assignment()) == 2, what="the new records")
    assert values_of(member.records) == sorted(old + new)


def test_deleting_a_topic_deletes_its_committed_offsets(shared_broker, new_topic, members):
    """A group committed offset 5 of a topic that is then deleted and re-created with 3 records:
    the old offset is gone (it belonged to the old topic, as Kafka's coordinator deletes it with
    the topic), so the group's next consumer starts per auto_offset_reset and reads all 3, where
    the old offset would have skipped them without an error."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, 5)
    member = members("offsets-of-deleted", enable_auto_commit=False)
    member.consumer.assign([(topic, 0)])
    member.consumer.commit({(topic, 0): 5})
    with Admin(shared_broker.bootstrap) as admin:
        admin.delete_topics([topic])
        admin.create_topic(topic, partitions=1)
    wait_until(lambda: member.consumer.committed([(topic, 0)]) == {(topic, 0): None}, 30,
               "the deleted topic's committed offset removed", 0.2, tolerate=(Exception,))
    new = produce(shared_broker.bootstrap, topic, 3)
    reader = members("offsets-of-deleted", enable_auto_commit=False, auto_offset_reset="earliest")
    reader.consumer.assign([(topic, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(new) and time.monotonic() < deadline:
        got += [r.value for r in reader.consumer.poll(timeout_ms=500)]
    assert sorted(got) == sorted(new)
