"""`pymq group` (cli/group.py): help and usage errors, the pure offset computation, and
list / describe / delete / reset-offsets run through the CLI against a real broker process,
including a group with an active member (joined with raw JoinGroup / SyncGroup messages)."""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner, Result

from cli import cli
from cli.group import NoCommittedOffsetError, ResetPlan, format_assignment, new_offsets
from client import Admin, Producer

T0_MS = 1_700_000_000_000  # record i of a partition has timestamp T0_MS + i * 1000
RECORDS = {0: 10, 1: 4}  # records per partition of each test's topic
COMMITTED = {0: 5, 1: 2}  # the group's offsets before each test resets them
_ids = itertools.count()


def run(*args: str) -> Result:
    """Run the CLI in-process, its output captured: not a terminal, so no table is cut to a width."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows(output: str, first: str) -> list[list[str]]:
    """The whitespace-split table rows of `output` whose first cell is `first`."""
    return [line.split() for line in output.splitlines() if line.split()[:1] == [first]]


# -- help and usage, no broker needed -------------------------------------------------------------

HELP_CASES = [
    (["group"], "List, describe and delete consumer groups"),
    (["group", "list"], "member count"),
    (["group", "describe"], "log end offset, lag and owning member"),
    (["group", "delete"], "Delete groups that have no members"),
    (["group", "reset-offsets"], "changes nothing without --execute"),
]


@pytest.mark.parametrize("command, purpose", HELP_CASES, ids=[" ".join(c) for c, _ in HELP_CASES])
def test_help_explains_every_group_command(command: list[str], purpose: str) -> None:
    """`--help` on `group` and each subcommand exits 0 and states what it is for."""
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert purpose in " ".join(result.stdout.split())


USAGE_ERRORS = [
    (["group", "reset-offsets", "g", "--topic", "t"], "give exactly one of --to-earliest"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-offset", "3"], "give exactly one of"),
    (["group", "reset-offsets", "g", "--to-latest"], "give --topic (repeatable) or --all-topics"),
    (["group", "reset-offsets", "g", "--topic", "t", "--all-topics", "--to-latest"], "give --topic"),
    (["group", "reset-offsets", "g", "--topic", "t:x", "--to-latest"], "partitions must be numbers"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to-datetime", "soon"], "neither milliseconds nor an ISO"),
    (["group", "describe"], "Missing argument 'GROUP'"),
    (["group", "delete"], "Missing argument 'GROUP...'"),
]


@pytest.mark.parametrize("args, message", USAGE_ERRORS, ids=[" ".join(a[1:]) for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2_before_any_request(args: list[str], message: str) -> None:
    """Missing or conflicting options are usage errors (exit 2) found without a broker."""
    result = run("-b", "127.0.0.1:1", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# -- pure offset computation -------------------------------------------------------------------

TP0, TP1 = ("t", 0), ("t", 1)
BOUNDS = {TP0: (2, 10), TP1: (0, 4)}  # (log start, log end)
NEW_OFFSET_CASES = [
    (ResetPlan("to_earliest"), {}, {TP0: 2, TP1: 0}),
    (ResetPlan("to_latest"), {}, {TP0: 10, TP1: 4}),
    (ResetPlan("to_datetime", 123), {TP0: 6, TP1: -1}, {TP0: 6, TP1: 4}),
    (ResetPlan("to_offset", 7), {}, {TP0: 7, TP1: 4}),
    (ResetPlan("to_offset", 0), {}, {TP0: 2, TP1: 0}),
    (ResetPlan("shift_by", -4), {}, {TP0: 2, TP1: 0}),
    (ResetPlan("shift_by", 3), {}, {TP0: 8, TP1: 4}),
]


@pytest.mark.parametrize("plan, at_time, expected", NEW_OFFSET_CASES,
                         ids=["earliest", "latest", "datetime-none-after-is-end", "offset-clamped-to-end",
                              "offset-clamped-to-start", "shift-back-clamped", "shift-forward-clamped"])
def test_new_offsets_follow_the_mode_and_stay_in_the_log(plan, at_time, expected) -> None:
    """Committed t-0 at 5 and t-1 at 3: each mode's new offsets, clamped to [log start, log end]."""
    assert new_offsets(plan, [TP0, TP1], {TP0: 5, TP1: 3}, BOUNDS, at_time) == expected


def test_shift_without_committed_offset_is_an_error() -> None:
    """--shift-by has nothing to shift on a partition the group never committed (as Kafka's tool)."""
    with pytest.raises(NoCommittedOffsetError, match="t-1"):
        new_offsets(ResetPlan("shift_by", 1), [TP0, TP1], {TP0: 5}, BOUNDS, {})


def test_format_assignment_groups_partitions_by_topic() -> None:
    """Assignments print as topic(p,p) per topic, sorted."""
    assert format_assignment([("b", 2), ("a", 1), ("a", 0)]) == "a(0,1) b(2)"
    assert format_assignment([]) == ""


# -- against a real broker process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bootstrap(module_broker_factory) -> str:
    # No initial rebalance delay: a member joining an empty group gets its generation at once.
    return module_broker_factory(**{"group.initial.rebalance.delay.ms": 0}).start().bootstrap


@pytest.fixture
def admin(bootstrap: str) -> Iterator[Admin]:
    with Admin(bootstrap) as client:
        yield client


@pytest.fixture
def setup(bootstrap: str, admin: Admin) -> tuple[str, str]:
    """(group, topic): a 2-partition topic with RECORDS (timestamps T0_MS + i s), and a group
    with COMMITTED offsets and no members."""
    n = next(_ids)
    group, topic = f"group-{n}", f"topic-{n}"
    admin.create_topic(topic, partitions=2)
    with Producer(bootstrap) as producer:
        for partition, count in RECORDS.items():
            for i in range(count):
                producer.send(topic, value=b"v", partition=partition, timestamp_ms=T0_MS + i * 1000)
    admin.alter_group_offsets(group, {(topic, p): o for p, o in COMMITTED.items()})
    return group, topic


def committed(admin: Admin, group: str) -> dict[int, int]:
    return {p: o.offset for (_, p), o in admin.list_group_offsets(group).items()}


@pytest.fixture
def active_member(raw_group_members, bootstrap):
    """active_member(group, topic, partitions) -> the id of a member owning them; it leaves at teardown."""
    return functools.partial(raw_group_members, bootstrap)


def test_list_shows_groups_with_state_and_members(bootstrap, setup) -> None:
    """An offsets-only group is listed as Empty with 0 members; --state filters it in or out."""
    group, _ = setup
    result = run("-b", bootstrap, "group", "list")
    assert result.exit_code == 0, result.output
    assert rows(result.stdout, group) == [[group, "Empty", "-", "0"]]
    assert rows(run("group", "list", "--state", "empty", "-b", bootstrap).stdout, group) == [[group, "Empty", "-", "0"]]
    assert rows(run("group", "list", "--state", "Stable", "-b", bootstrap).stdout, group) == []


def test_describe_shows_offsets_and_lag(bootstrap, setup) -> None:
    """The header names state, protocol and member count; one row per partition with lag."""
    group, topic = setup
    result = run("-b", bootstrap, "group", "describe", group)
    assert result.exit_code == 0, result.output
    assert f"group {group}  state Empty  protocol -  members 0" in result.stdout
    assert rows(result.stdout, "TOPIC") == [["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                             "MEMBER", "CLIENT"]]
    assert rows(result.stdout, topic) == [[topic, "0", "5", "10", "5", "-", "-"],
                                          [topic, "1", "2", "4", "2", "-", "-"]]


def test_describe_active_group_shows_members_and_owners(bootstrap, setup, active_member) -> None:
    """A Stable group: --members lists the member with its assignment; offset rows name the owner."""
    group, topic = setup
    live = f"{group}-live"
    member_id = active_member(live, topic, [0, 1])
    result = run("-b", bootstrap, "group", "describe", live, "--members", "--offsets")
    assert result.exit_code == 0, result.output
    assert f"group {live}  state Stable  protocol consumer/range  members 1" in result.stdout
    assert rows(result.stdout, member_id) == [[member_id, "-", "test-member", "2", f"{topic}(0,1)"]]
    assert rows(result.stdout, topic) == [[topic, "0", "-", "10", "-", member_id, "test-member"],
                                          [topic, "1", "-", "4", "-", member_id, "test-member"]]


def test_describe_unknown_group_is_an_error(bootstrap) -> None:
    """An unknown group prints GROUP_ID_NOT_FOUND on stderr and exits 1."""
    result = run("-b", bootstrap, "group", "describe", "no-such-group")
    assert result.exit_code == 1
    assert "error: GROUP_ID_NOT_FOUND: group 'no-such-group' does not exist" in result.stderr


def test_reset_dry_run_changes_nothing(bootstrap, admin, setup) -> None:
    """Without --execute the table shows CURRENT -> NEW and the committed offsets stay."""
    group, topic = setup
    result = run("-b", bootstrap, "group", "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert result.exit_code == 0, result.output
    assert rows(result.stdout, topic) == [[topic, "0", "5", "0"], [topic, "1", "2", "0"]]
    assert "dry run: nothing changed" in result.stdout
    assert committed(admin, group) == COMMITTED


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


RESET_CASES = [
    (["--to-earliest"], {0: 0, 1: 0}),
    (["--to-latest"], {0: 10, 1: 4}),
    (["--to-datetime", _iso(T0_MS + 3_000)], {0: 3, 1: 3}),
    (["--to-datetime", _iso(T0_MS + 3_500)], {0: 4, 1: 4}),  # partition 1 has nothing that late: its end
    (["--shift-by", "-3"], {0: 2, 1: 0}),  # 2 - 3 clamped to the log start
    (["--shift-by", "4"], {0: 9, 1: 4}),  # 2 + 4 clamped to the log end
    (["--to-offset", "7"], {0: 7, 1: 4}),
]


@pytest.mark.parametrize("mode, expected", RESET_CASES,
                         ids=["to-earliest", "to-latest", "to-datetime", "to-datetime-past-the-end",
                              "shift-by-back", "shift-by-forward", "to-offset"])
def test_reset_execute_applies_each_mode(bootstrap, admin, setup, mode, expected) -> None:
    """--execute commits the new offsets the table shows (committed 5 and 2 before)."""
    group, topic = setup
    result = run("-b", bootstrap, "group", "reset-offsets", group, "--topic", topic, *mode, "--execute")
    assert result.exit_code == 0, result.output
    assert rows(result.stdout, topic) == [[topic, str(p), str(COMMITTED[p]), str(expected[p])] for p in (0, 1)]
    assert committed(admin, group) == expected


def test_reset_selected_partitions_and_all_topics(bootstrap, admin, setup) -> None:
    """--topic T:P resets only P; --all-topics resets every committed partition."""
    group, topic = setup
    assert run("-b", bootstrap, "group", "reset-offsets", group, "--topic", f"{topic}:1", "--to-latest",
               "--execute").exit_code == 0
    assert committed(admin, group) == {0: 5, 1: 4}
    assert run("-b", bootstrap, "group", "reset-offsets", group, "--all-topics", "--to-offset", "1",
               "--execute").exit_code == 0
    assert committed(admin, group) == {0: 1, 1: 1}


def test_reset_active_group_is_refused_and_changes_nothing(bootstrap, admin, setup, active_member) -> None:
    """A group with a member: dry run and --execute both exit 1 with NON_EMPTY_GROUP, offsets stay."""
    group, topic = setup
    active_member(group, topic, [0, 1])
    for execute in ([], ["--execute"]):
        result = run("-b", bootstrap, "group", "reset-offsets", group, "--topic", topic, "--to-earliest", *execute)
        assert result.exit_code == 1
        assert "error: NON_EMPTY_GROUP: offsets of group" in result.stderr
        assert "Stable with 1 member(s)" in result.stderr
        assert rows(result.stdout, topic) == []
    assert committed(admin, group) == COMMITTED


def test_reset_shift_needs_committed_offset(bootstrap, admin, setup) -> None:
    """--shift-by on a partition the group never committed exits 1 naming the partition."""
    group, topic = setup
    admin.delete_group_offsets(group, [(topic, 1)])
    result = run("-b", bootstrap, "group", "reset-offsets", group, "--topic", topic, "--shift-by", "1", "--execute")
    assert result.exit_code == 1
    assert f"error: NoCommittedOffsetError: cannot shift {topic}-1" in result.stderr
    assert committed(admin, group) == {0: 5}


def test_delete_groups(bootstrap, admin, setup, active_member) -> None:
    """Deleting an empty group removes it; an unknown group and an active group fail (exit 1)
    with their named errors after the others are deleted."""
    group, topic = setup
    live = f"{group}-live"
    active_member(live, topic, [0])
    result = run("-b", bootstrap, "group", "delete", group, live, "no-such-group")
    assert result.exit_code == 1
    assert f"deleted group {group}" in result.stdout
    assert "NON_EMPTY_GROUP" in result.stderr and "GROUP_ID_NOT_FOUND" in result.stderr
    listed = [g.group_id for g in admin.list_groups()]
    assert group not in listed and live in listed
    assert admin.list_group_offsets(group) == {}
