"""Consumer groups end to end: real broker processes and real member processes
(tests/broker/group_member.py) that log every record they process, every assignment callback and
every commit, and are SIGKILLed at chosen moments. The tests read those logs afterwards: every
record processed at least once, per-partition order within each ownership period, duplicates
only where a crash allows them, partitions moving on a member's death within the session
timeout, cooperative rebalances revoking only what moves, static members rejoining without a
rebalance, pub-sub across groups and queueing within one, and the at-most-once / at-least-once
windows of the two commit orders."""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Admin, Producer
from client.admin import LATEST, GroupDescription
from common.errors import PymqError
from common.child_process import die_with_parent
from tests.broker.group_member import MemberLog
from common.topic_partition import TopicPartition
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
# Fast groups: no initial delay, short sessions allowed, a small offsets topic.
GROUP_BROKER = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 500,
                "offsets.topic.num.partitions": 3}
pytestmark = pytest.mark.timeout(120)


# -- processes -------------------------------------------------------------------------------------


class Processes:
    """Member and producer processes of one test, each killed by PID at teardown."""

    def __init__(self, tmp_path: Path, bootstrap: Callable[[], str]) -> None:
        self.tmp_path = tmp_path
        self.bootstrap = bootstrap
        self.started: list[subprocess.Popen[bytes]] = []
        self.stderr: dict[int, Path] = {}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        err = self.tmp_path / f"{name}.err"
        with open(err, "ab") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "tests.broker.group_member", *args], cwd=REPO,
                                    stdout=stderr, stderr=stderr, preexec_fn=die_with_parent)
        self.started.append(proc)
        self.stderr[proc.pid] = err
        return proc

    def member(self, name: str, group: str, topic: str, **options: Any) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a member; options are group_member's flags (crash_after_records=5 etc.)."""
        out = self.tmp_path / f"{name}.log"
        args = ["consume", "--bootstrap", self.bootstrap(), "--group", group, "--topic", topic, "--out", str(out)]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return self._spawn(name, args), out

    def producer(self, topic: str, records: int, partitions: int, rate: float = 0) -> subprocess.Popen[bytes]:
        """Start a producer of `records` values, record i to partition i % partitions, at `rate`/s."""
        return self._spawn("producer", ["produce", "--bootstrap", self.bootstrap(), "--topic", topic, "--records",
                                        str(records), "--partitions", str(partitions), "--rate", str(rate)])

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
        """SIGTERM (the member closes its consumer) and wait; fails if it does not exit cleanly."""
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout_s)
        assert code == 0, f"pid {proc.pid} exited with {code}:\n{self.stderr_of(proc)}"

    def stderr_of(self, proc: subprocess.Popen[bytes]) -> str:
        with contextlib.suppress(OSError):
            return self.stderr[proc.pid].read_text()[-3000:]
        return ""

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[[Any], Processes]]:
    made: list[Processes] = []

    def make(broker: Any) -> Processes:
        made.append(Processes(tmp_path, lambda: broker.bootstrap))
        return made[-1]

    yield make
    for procs in made:
        procs.kill_all()


# -- waiting and reading ---------------------------------------------------------------------------


# A member or broker being restarted answers errors meanwhile: those count as "not yet".
wait_for = functools.partial(wait_until, interval_s=0.1, tolerate=(PymqError, OSError))


def describe(admin: Admin, group: str) -> GroupDescription:
    (description,) = admin.describe_groups([group])
    return description


def balanced(admin: Admin, group: str, members: int, partitions: set[TopicPartition]) -> GroupDescription | None:
    """The group's description once it is Stable with `members` members that own every partition
    exactly once with sizes at most one apart; else None."""
    description = describe(admin, group)
    owned = [tp for m in description.members for tp in m.assignment]
    sizes = [len(m.assignment) for m in description.members]
    if (description.state == "Stable" and len(description.members) == members and Counter(owned) == Counter(partitions)
            and max(sizes) - min(sizes) <= 1):
        return description
    return None


def logs_own(paths: list[Path], partitions: set[TopicPartition]) -> list[MemberLog] | None:
    """The members' logs once their callbacks show them owning every partition exactly once and
    each at least one; else None."""
    logs = [MemberLog.read(p) for p in paths]
    owned = [tp for log in logs for tp in log.owned()]
    if Counter(owned) == Counter(partitions) and all(log.owned() for log in logs):
        return logs
    return None


def end_offsets(admin: Admin, topic: str, partitions: int) -> dict[TopicPartition, int]:
    found = admin.list_offsets({(topic, p): LATEST for p in range(partitions)})
    return {tp: offset for tp, (offset, _) in found.items()}


def processed_all(paths: list[Path], ends: dict[TopicPartition, int]) -> list[MemberLog] | None:
    """The logs once together they hold every offset below `ends`; else None."""
    logs = [MemberLog.read(p) for p in paths]
    seen = {((t, p), o) for log in logs for t, p, o, _ in log.records}
    return logs if len(seen) == sum(ends.values()) and all(o < ends[tp] for tp, o in seen) else None


def wait_processed(paths: list[Path], ends: dict[TopicPartition, int], timeout_s: float) -> list[MemberLog]:
    """The logs once every record below `ends` is in one of them; on timeout, fail with what is
    missing per partition and what each member last saw."""
    try:
        return wait_until(lambda: processed_all(paths, ends), timeout_s, "every record processed", 0.1)
    except AssertionError:
        pass  # fail below with what is missing
    logs = [MemberLog.read(p) for p in paths]
    seen = {((t, p), o) for log in logs for t, p, o, _ in log.records}
    missing = {tp: [o for o in range(end) if (tp, o) not in seen] for tp, end in ends.items()}
    report = [f"{tp}: {len(m)} missing from {m[0]}" for tp, m in sorted(missing.items()) if m]
    for log in logs:
        report.append(f"{log.path.name}: owns {sorted(log.owned())}, last events "
                      f"{[(e.name, e.fields[:4]) for _, e in log.events if e.name != 'commit'][-6:]}")
    pytest.fail(f"not every record processed in {timeout_s} s:\n" + "\n".join(report))


def assert_every_record_processed(logs: list[MemberLog], ends: dict[TopicPartition, int]) -> None:
    seen = {((t, p), o) for log in logs for t, p, o, _ in log.records}
    missing = {tp: sorted(o for o in range(end) if (tp, o) not in seen) for tp, end in ends.items()}
    assert not any(missing.values()), f"never processed: { {tp: m[:10] for tp, m in missing.items() if m} }"
    assert all(o < ends[tp] for tp, o in seen), "processed an offset past the end of its partition"


def assert_partition_order(logs: list[MemberLog]) -> None:
    """Within each ownership period of each member, every partition's offsets strictly increase."""
    for log in logs:
        for run in log.ownership_runs():
            last: dict[TopicPartition, int] = {}
            for tp, offset in run:
                assert offset > last.get(tp, -1), f"{log.path.name}: {tp} offset {offset} after {last[tp]}"
                last[tp] = offset


def duplicates(logs: list[MemberLog]) -> dict[tuple[TopicPartition, int], int]:
    counts = Counter(((t, p), o) for log in logs for t, p, o, _ in log.records)
    return {key: n for key, n in counts.items() if n > 1}


def make_topic(admin: Admin, topic: str, partitions: int) -> set[TopicPartition]:
    admin.create_topic(topic, partitions=partitions)
    return {(topic, p) for p in range(partitions)}


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    """`records` small values, record i to partition i % partitions, every one acknowledged."""
    with Producer(bootstrap, linger_ms=5) as producer:
        futures = [producer.send(topic, b"%d" % i, partition=i % partitions) for i in range(records)]
        producer.flush()
    assert all(f.exception(0) is None for f in futures)


# -- the scenarios ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_member_partitions_move_and_only_its_uncommitted_records_repeat(broker_factory, processes):
    """3 members on 6 partitions while 200,000 records are produced; SIGKILL one: the other two
    own all 6 within the session timeout (+ a margin), every record is processed, order holds per
    partition, and only records at or after the dead member's last commit are processed twice."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    session_ms, margin_s = 2000, 6.0
    with Admin(broker.bootstrap) as admin:
        partitions = make_topic(admin, "events", 6)
        members = [procs.member(f"m{i}", "g1", "events", session_timeout_ms=session_ms) for i in range(3)]
        wait_for(lambda: balanced(admin, "g1", 3, partitions), 30, "3 members owning 2 partitions each")
        producer = procs.producer("events", 200_000, 6, rate=30_000)
        victim, victim_log = members[0]
        wait_for(lambda: len(MemberLog.read(victim_log).named("commit")) >= 3
                 and sum(len(MemberLog.read(p).records) for _, p in members) >= 30_000, 30,
                 "the members to have processed 30,000 records and the victim to have committed")
        victim.kill()
        victim.wait()
        wait_for(lambda: balanced(admin, "g1", 2, partitions), session_ms / 1000 + margin_s,
                 "the 2 survivors to own all 6 partitions")
        assert producer.wait(60) == 0, procs.stderr_of(producer)
        ends = end_offsets(admin, "events", 6)
        assert sum(ends.values()) == 200_000
        paths = [p for _, p in members]
        wait_processed(paths, ends, 60)
        for proc, _ in members[1:]:
            procs.stop(proc)
    logs = [MemberLog.read(p) for p in paths]
    dead = logs[0]
    assert dead.records and not dead.named("closed"), "the victim processed records and never closed"
    assert_every_record_processed(logs, ends)
    assert_partition_order(logs)
    last_commit = dead.last_commit()
    dead_processed = {((t, p), o) for t, p, o, _ in dead.records}
    for (tp, offset), count in duplicates(logs).items():
        assert (tp, offset) in dead_processed and count == 2, f"{tp} {offset} processed {count} times"
        assert offset >= last_commit.get(tp, 0), f"{tp} {offset} repeated below the victim's last commit"


@pytest.mark.slow
def test_group_and_commits_survive_a_broker_sigkill(broker_factory, processes):
    """SIGKILL the broker while 2 members consume, restart it on the same port and log dir: the
    committed offsets are at least what members were told was committed, the group is whole again,
    the members go on, and every record (before and after the crash) is processed."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    with Admin(broker.bootstrap, request_timeout_ms=5000) as admin:
        partitions = make_topic(admin, "orders", 4)
    produce(broker.bootstrap, "orders", 20_000, 4)
    members = [procs.member(f"m{i}", "g2", "orders", session_timeout_ms=6000, max_records=100, poll_delay_ms=20)
               for i in range(2)]
    paths = [p for _, p in members]
    wait_for(lambda: sum(len(MemberLog.read(p).named("commit")) for p in paths) >= 10
             and sum(len(MemberLog.read(p).records) for p in paths) >= 4000, 30, "members to process and commit")
    broker.kill()
    told = {}  # every commit acknowledged before the crash is in a log by now (or in none)
    for log in (MemberLog.read(p) for p in paths):
        for tp, offset in log.last_commit().items():
            told[tp] = max(told.get(tp, 0), offset)
    processed_before = sum(len(MemberLog.read(p).records) for p in paths)
    assert 0 < processed_before < 20_000, "the crash must come mid-run"
    time.sleep(1.0)  # the members retry against a dead port meanwhile
    broker.start()
    with Admin(broker.bootstrap, request_timeout_ms=5000) as admin:
        committed = wait_for(lambda: admin.list_group_offsets("g2"), 30, "committed offsets after the restart")
        for tp, offset in told.items():
            assert committed[tp].offset >= offset, f"{tp}: committed {committed[tp].offset} < {offset} acknowledged"
        produce(broker.bootstrap, "orders", 10_000, 4)
        ends = end_offsets(admin, "orders", 4)
        assert sum(ends.values()) == 30_000
        wait_processed(paths, ends, 60)
        wait_for(lambda: balanced(admin, "g2", 2, partitions), 30, "the group to be whole again")
        final = wait_for(lambda: (c := admin.list_group_offsets("g2")) and all(c[tp].offset == ends[tp] for tp in ends)
                         and c, 30, "the final commits")
        assert {tp: c.offset for tp, c in final.items()} == ends
        for proc, _ in members:
            assert proc.poll() is None, f"a member died: {procs.stderr_of(proc)}"
            procs.stop(proc)
    logs = [MemberLog.read(p) for p in paths]
    assert_every_record_processed(logs, ends)
    assert_partition_order(logs)


@pytest.mark.slow
def test_cooperative_sticky_revokes_only_partitions_that_move(broker_factory, processes):
    """2 cooperative-sticky members own 3 of 6 partitions each; a third joins: each old member's
    on_revoke names only partitions the newcomer ends up owning, it keeps the others throughout,
    and nothing is lost."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    with Admin(broker.bootstrap) as admin:
        partitions = make_topic(admin, "coop", 6)
        produce(broker.bootstrap, "coop", 3000, 6)
        old = [procs.member(f"old{i}", "g3", "coop", strategy="cooperative-sticky") for i in range(2)]
        wait_for(lambda: balanced(admin, "g3", 2, partitions), 30, "2 members owning 3 partitions each")
        before = wait_for(lambda: logs_own([p for _, p in old], partitions), 10, "the old members' callbacks")
        seen = [len(log.events) for log in before]
        owned_before = [log.owned() for log in before]
        new = procs.member("new", "g3", "coop", strategy="cooperative-sticky")
        wait_for(lambda: balanced(admin, "g3", 3, partitions), 30, "3 members owning 2 partitions each")
        logs = wait_for(lambda: logs_own([p for _, p in old] + [new[1]], partitions), 10, "every member's callbacks")
        for proc, _ in old + [new]:
            procs.stop(proc)
    newcomer = logs[2].owned()
    assert len(newcomer) == 2
    for log, kept_before, start in zip(logs[:2], owned_before, seen):
        later = [e for _, e in log.events[start:]]
        revoked = set().union(*(e.partitions for e in later if e.name == "revoke"))
        assert not [e for e in later if e.name == "lost"], f"{log.path.name} lost partitions"
        assert revoked and revoked <= newcomer, f"{log.path.name} revoked {revoked}; the newcomer owns {newcomer}"
        assert log.owned() == kept_before - revoked, f"{log.path.name} lost a partition it kept"
        assert not set().union(*(e.partitions for e in later if e.name == "assign")), "an old member gained partitions"


@pytest.mark.slow
def test_static_member_restarted_within_session_timeout_keeps_its_partitions(broker_factory, processes):
    """A static member (group_instance_id) closed and restarted within its session timeout gets
    the same partitions back in the same generation: no rebalance, the other member sees no
    callback at all."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    session_ms = 10_000
    with Admin(broker.bootstrap) as admin:
        partitions = make_topic(admin, "static", 4)
        produce(broker.bootstrap, "static", 2000, 4)
        static = procs.member("static", "g4", "static", instance_id="static-1", session_timeout_ms=session_ms)
        other = procs.member("other", "g4", "static", instance_id="other-1", session_timeout_ms=session_ms)
        group = wait_for(lambda: balanced(admin, "g4", 2, partitions), 30, "2 members owning 2 partitions each")
        logs = wait_for(lambda: logs_own([static[1], other[1]], partitions), 10, "both members' callbacks")
        other_seen, static_owned = len(logs[1].events), logs[0].owned()
        generation = logs[0].generations()[-1]
        assert logs[1].generations()[-1] == generation
        closed_at = time.monotonic()
        procs.stop(static[0])
        after_close = describe(admin, "g4")
        assert sorted(m.group_instance_id for m in after_close.members) == ["other-1", "static-1"], \
            "a static member's close must not leave the group"
        again = procs.member("static-again", "g4", "static", instance_id="static-1", session_timeout_ms=session_ms)
        back = wait_for(lambda: MemberLog.read(again[1]).owned(), 20, "the restarted member's assignment")
        assert time.monotonic() - closed_at < session_ms / 1000, "the restart must fit in the session timeout"
        time.sleep(1.5)  # a rebalance, had one started, would reach the other member by now (heartbeat 300 ms)
        regroup = describe(admin, "g4")
        other_log, again_log = MemberLog.read(other[1]), MemberLog.read(again[1])  # before close() revokes
        procs.stop(again[0])
        procs.stop(other[0])
    assert back == static_owned
    assert again_log.generations() == [generation], "the restarted static member joined a new generation"
    callbacks = [e for _, e in other_log.events[other_seen:] if e.name in ("assign", "revoke", "lost")]
    assert not callbacks, f"the other member saw a rebalance: {callbacks}"
    assert regroup.state == "Stable"
    assert {m.group_instance_id: sorted(m.assignment) for m in regroup.members} == \
        {m.group_instance_id: sorted(m.assignment) for m in group.members}


@pytest.mark.slow
def test_two_groups_each_get_every_record_and_split_it_among_members(broker_factory, processes):
    """Pub-sub across groups, queue within one: two groups of 2 members on a 4-partition topic;
    each group processes every record exactly once, its members owning disjoint partitions."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    with Admin(broker.bootstrap) as admin:
        partitions = make_topic(admin, "news", 4)
        groups = {g: [procs.member(f"{g}-m{i}", g, "news") for i in range(2)] for g in ("ga", "gb")}
        for group in groups:  # both members in before the records come, so neither group's first member takes all
            wait_for(lambda: balanced(admin, group, 2, partitions), 30, f"{group}'s 2 members owning 2 partitions each")
        produce(broker.bootstrap, "news", 4000, 4)
        ends = end_offsets(admin, "news", 4)
        final = {}
        for group, members in groups.items():
            wait_processed([p for _, p in members], ends, 30)
            final[group] = [MemberLog.read(p).owned() for _, p in members]  # before close() revokes them
        for members in groups.values():
            for proc, _ in members:
                procs.stop(proc)
    for group, members in groups.items():
        logs = [MemberLog.read(p) for _, p in members]
        assert_every_record_processed(logs, ends)
        assert not duplicates(logs), f"{group} processed records twice"
        assert all(log.records for log in logs), f"{group}: a member processed nothing"
        owned = final[group]
        assert owned[0] and owned[1] and not owned[0] & owned[1] and owned[0] | owned[1] == partitions


@pytest.mark.parametrize("commit", ["before", "after"], ids=["at-most-once", "at-least-once"])
@pytest.mark.slow
def test_crash_at_the_worst_moment_loses_or_repeats_exactly_one_poll(broker_factory, processes, commit):
    """A member SIGKILLs itself right after committing a poll it never processes (commit before:
    at-most-once, those records are lost and nothing repeats) or right after processing a poll it
    never commits (commit after: at-least-once, those records repeat and nothing is lost); a
    second member takes over from the last commit."""
    broker = broker_factory(**GROUP_BROKER).start()
    procs = processes(broker)
    with Admin(broker.bootstrap) as admin:
        make_topic(admin, "pay", 2)
        produce(broker.bootstrap, "pay", 3000, 2)
        ends = end_offsets(admin, "pay", 2)
        crashing, crash_log = procs.member("crashing", "g6", "pay", commit=commit, max_records=100,
                                           crash_after_records=1000, session_timeout_ms=1000)
        assert crashing.wait(30) == -signal.SIGKILL, procs.stderr_of(crashing)
        taker, taker_log = procs.member("taker", "g6", "pay", commit=commit, session_timeout_ms=1000)
        wait_for(lambda: {tp: c.offset for tp, c in admin.list_group_offsets("g6").items()} == ends, 30,
                 "the second member to commit the end of every partition")
        procs.stop(taker)
    crashed, took = MemberLog.read(crash_log), MemberLog.read(taker_log)
    assert crashed.named("crash") and crashed.named("commit")
    processed_next = {tp: max(offsets) + 1 for tp, offsets in crashed.processed().items()}
    last_commit = crashed.last_commit()
    took_first = {tp: min(offsets) for tp, offsets in took.processed().items()}
    everything = {(tp, o) for tp, end in ends.items() for o in range(end)}
    done = [((t, p), o) for log in (crashed, took) for t, p, o, _ in log.records]
    if commit == "before":
        window = {(tp, o) for tp, end in last_commit.items() for o in range(processed_next.get(tp, 0), end)}
        assert window, "the crash must come after committing records it did not process"
        assert everything - set(done) == window, "lost records outside the committed-but-unprocessed poll"
        assert len(done) == len(set(done)), "at-most-once processed a record twice"
    else:
        window = {(tp, o) for tp, end in processed_next.items() for o in range(last_commit.get(tp, 0), end)}
        assert window, "the crash must come after processing records it did not commit"
        assert set(done) == everything, "at-least-once lost records"
        assert set(duplicates([crashed, took])) == window, "repeated records outside the uncommitted poll"
    assert all(took_first[tp] == last_commit.get(tp, 0) for tp in took_first), "the taker did not start at the commit"
