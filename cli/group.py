"""`pymq group list | describe | delete | reset-offsets`: consumer groups, as Kafka's
`kafka-consumer-groups.sh` shows and manages them.

reset-offsets is a dry run unless `--execute`: it prints each partition's current and new offset
and changes nothing. Like Kafka's tool it refuses a group that has members (they would overwrite
the new offsets with their next commit), dry run or not; a group that does not exist yet is
created by `--execute`. Offsets given by --to-offset and --shift-by are clamped to the
partition's [log start offset, log end offset]; --to-datetime takes the first offset at or after
the time, or the log end offset when no record is that recent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from cli.common import admin_client, steps
from cli.consume import Timestamp
from common.cli_options import bootstrap_option, console
from common.errors import GroupIdNotFoundError, NonEmptyGroupError, PymqError
from common.topic_partition import TopicPartition

if TYPE_CHECKING:
    from client import Admin
    from client.admin import GroupDescription, PartitionLag


def _cell(value: object) -> str:
    """Kafka's tool prints '-' for what is not known (no commit, no owner)."""
    return "-" if value is None else str(value)


def _table(*headers: str, numeric: tuple[str, ...] = ()) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, justify="right" if header in numeric else "left", no_wrap=True)
    return table


@click.group("group")
def group_group() -> None:
    """List, describe and delete consumer groups, and reset their committed offsets."""


# -- list --------------------------------------------------------------------------------------


@group_group.command("list")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="only groups in this state: Empty, Stable, PreparingRebalance, CompletingRebalance "
                   "(case-insensitive, repeatable)")
@bootstrap_option
def list_groups(states: tuple[str, ...]) -> None:
    """List consumer groups with their state, protocol type and member count."""
    with admin_client() as admin:
        groups = admin.list_groups(states or None)
        members = _member_counts(admin, [g.group_id for g in groups])
    table = _table("GROUP", "STATE", "PROTOCOL-TYPE", "MEMBERS", numeric=("MEMBERS",))
    for g in groups:
        table.add_row(g.group_id, g.state, g.protocol_type or "-", _cell(members.get(g.group_id)))
    console().print(table)


def _member_counts(admin: "Admin", group_ids: list[str]) -> dict[str, int]:
    """Members per group; none at all if a group went away between listing and describing."""
    if not group_ids:
        return {}
    try:
        return {d.group_id: len(d.members) for d in admin.describe_groups(group_ids)}
    except PymqError:
        return {}


# -- describe ----------------------------------------------------------------------------------


@group_group.command("describe")
@click.argument("group")
@click.option("--members", "show_members", is_flag=True, help="show the members and their assigned partitions")
@click.option("--offsets", "show_offsets", is_flag=True,
              help="show committed offset, log end offset and lag per partition (the default)")
@bootstrap_option
def describe(group: str, show_members: bool, show_offsets: bool) -> None:
    """Describe GROUP: state, protocol and member count, then per partition its committed
    offset, log end offset, lag and owning member (--offsets, the default) and/or the members
    with their assigned partitions (--members)."""
    with admin_client() as admin:
        (description,) = admin.describe_groups([group])
        lags = admin.group_lag(group) if show_offsets or not show_members else []
    out = console()
    protocol = "/".join(p for p in (description.protocol_type, description.protocol) if p) or "-"
    out.print(f"group {description.group_id}  state {description.state}  protocol {protocol}  "
              f"members {len(description.members)}")
    if show_offsets or not show_members:
        if lags:
            out.print(_offsets_table(lags))
        else:
            out.print(f"group {group} has no committed offsets and no assigned partitions")
    if show_members:
        if description.members:
            out.print(_members_table(description))
        else:
            out.print(f"group {group} has no active members")


def _offsets_table(lags: list["PartitionLag"]) -> Table:
    table = _table("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER", "CLIENT",
                   numeric=("PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"))
    for row in lags:
        table.add_row(row.topic, str(row.partition), _cell(row.committed), _cell(row.log_end_offset),
                      _cell(row.lag), _cell(row.member_id), _cell(row.client_id))
    return table


def _members_table(description: "GroupDescription") -> Table:
    table = _table("MEMBER", "INSTANCE", "CLIENT", "#PARTITIONS", "ASSIGNMENT", numeric=("#PARTITIONS",))
    for m in description.members:
        table.add_row(m.member_id, _cell(m.group_instance_id), m.client_id or "-", str(len(m.assignment)),
                      format_assignment(m.assignment) or "-")
    return table


def format_assignment(partitions: list[TopicPartition]) -> str:
    """[("a", 0), ("a", 1), ("b", 2)] -> "a(0,1) b(2)"."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}({','.join(map(str, ps))})" for t, ps in by_topic.items())


# -- delete ------------------------------------------------------------------------------------


@group_group.command("delete")
@click.argument("groups", metavar="GROUP...", nargs=-1, required=True)
@bootstrap_option
def delete(groups: tuple[str, ...]) -> None:
    """Delete groups that have no members, with their committed offsets."""
    from client import AdminError

    errors: dict[str, PymqError] = {}
    with admin_client() as admin:
        for group in dict.fromkeys(groups):
            try:
                admin.delete_groups([group])
            except PymqError as err:
                errors[group] = err
                continue
            click.echo(f"deleted group {group}")
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        raise AdminError(errors)


# -- reset-offsets -----------------------------------------------------------------------------


class TopicPartitions(click.ParamType):
    """`TOPIC` (every partition) or `TOPIC:P,P,...` -> (topic, (partitions...))."""

    name = "TOPIC[:P,P...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, tuple[int, ...]]:
        if isinstance(value, tuple):
            return value
        topic, sep, rest = str(value).partition(":")  # topic names cannot contain ':'
        if not topic:
            self.fail(f"{value!r} names no topic", param, ctx)
        if not sep:
            return topic, ()
        try:
            partitions = tuple(int(p) for p in rest.split(","))
        except ValueError:
            self.fail(f"{value!r}: partitions must be numbers separated by commas", param, ctx)
        if any(p < 0 for p in partitions):
            self.fail(f"{value!r}: partitions must be >= 0", param, ctx)
        return topic, tuple(dict.fromkeys(partitions))


@dataclass(frozen=True)
class ResetPlan:
    """How to compute new offsets: `mode` is one of RESET_MODES, `value` its argument."""

    mode: str
    value: int | None = None


RESET_MODES = ("to_earliest", "to_latest", "to_datetime", "shift_by", "to_offset")


class NoCommittedOffsetError(ValueError):
    """--shift-by needs a committed offset to shift (as Kafka's tool)."""


@group_group.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "topics", type=TopicPartitions(), multiple=True,
              help="reset this topic (all partitions) or TOPIC:P,P these partitions (repeatable)")
@click.option("--all-topics", is_flag=True, help="reset every partition the group has committed offsets for")
@click.option("--to-earliest", is_flag=True, help="to each partition's log start offset")
@click.option("--to-latest", is_flag=True, help="to each partition's log end offset (skip everything)")
@click.option("--to-datetime", type=Timestamp(), default=None, metavar="ISO8601",
              help="to the first offset at or after this time (UTC unless it names an offset; or epoch ms); "
                   "the log end offset when no record is that recent")
@click.option("--shift-by", type=int, default=None, metavar="N",
              help="move each committed offset by N (negative: back), clamped to the log")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, metavar="N",
              help="to offset N, clamped to each partition's log")
@click.option("--execute", is_flag=True, help="apply the new offsets (default: dry run, print them only)")
@bootstrap_option
def reset_offsets(group: str, topics: tuple[tuple[str, tuple[int, ...]], ...], all_topics: bool,
                  to_earliest: bool, to_latest: bool, to_datetime: int | None, shift_by: int | None,
                  to_offset: int | None, execute: bool) -> None:
    """Reset GROUP's committed offsets of some topics (--topic) or all of them (--all-topics)
    by one of --to-earliest, --to-latest, --to-datetime, --shift-by, --to-offset. Prints
    CURRENT-OFFSET -> NEW-OFFSET per partition; changes nothing without --execute. Refused
    while the group has members."""
    plan = _plan(to_earliest=to_earliest, to_latest=to_latest, to_datetime=to_datetime, shift_by=shift_by,
                 to_offset=to_offset)
    if bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    with admin_client() as admin, steps() as step:
        step(f"checking that group {group} has no members")
        _check_inactive(admin, group)
        step(f"reading the committed offsets of group {group}")
        committed = {tp: o.offset for tp, o in admin.list_group_offsets(group).items()}
        partitions = sorted(committed) if all_topics else _selected(admin, topics)
        step(f"reading the log bounds of {len(partitions):,} partitions")
        bounds = _log_bounds(admin, partitions)
        step(f"finding the new offsets of {len(partitions):,} partitions")
        new = new_offsets(plan, partitions, committed, bounds, _offsets_at(admin, partitions, plan))
        if execute and new:
            step(f"committing {len(new):,} offsets")
            admin.alter_group_offsets(group, new)
    out = console()
    table = _table("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET",
                   numeric=("PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"))
    for (topic, partition), offset in sorted(new.items()):
        table.add_row(topic, str(partition), _cell(committed.get((topic, partition))), str(offset))
    out.print(table)
    if not new:
        out.print(f"group {group}: no partitions to reset")
    elif execute:
        out.print(f"reset the offsets of group {group} on {len(new)} partitions")
    else:
        out.print("dry run: nothing changed; add --execute to apply")


def _plan(**given: Any) -> ResetPlan:
    chosen = [(mode, value) for mode, value in given.items() if value not in (None, False)]
    if len(chosen) != 1:
        flags = ", ".join("--" + m.replace("_", "-") for m in RESET_MODES)
        raise click.UsageError(f"give exactly one of {flags}")
    mode, value = chosen[0]
    return ResetPlan(mode, None if value is True else value)


def _check_inactive(admin: "Admin", group: str) -> None:
    """Kafka's rule: offsets are reset only while no member could commit over them."""
    try:
        (description,) = admin.describe_groups([group])
    except GroupIdNotFoundError:
        return  # a new group: --execute creates it
    if description.members:
        raise NonEmptyGroupError(
            f"offsets of group {group!r} can only be reset while it has no members, but it is "
            f"{description.state} with {len(description.members)} member(s); stop its consumers first")


def _selected(admin: "Admin", topics: tuple[tuple[str, tuple[int, ...]], ...]) -> list[TopicPartition]:
    """The partitions --topic names; a whole topic means every partition it has now."""
    out: list[TopicPartition] = []
    whole = [topic for topic, partitions in topics if not partitions]
    counts = {d.name: len(d.partitions) for d in admin.describe_topics(whole)} if whole else {}
    for topic, partitions in topics:
        out.extend((topic, p) for p in (partitions or range(counts[topic])))
    return sorted(set(out))


def _log_bounds(admin: "Admin", partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
    """(log start offset, log end offset) per partition."""
    from client import EARLIEST, LATEST

    if not partitions:
        return {}
    starts = admin.list_offsets({tp: EARLIEST for tp in partitions})
    ends = admin.list_offsets({tp: LATEST for tp in partitions})
    return {tp: (starts[tp][0], ends[tp][0]) for tp in partitions}


def _offsets_at(admin: "Admin", partitions: list[TopicPartition], plan: ResetPlan) -> dict[TopicPartition, int]:
    """--to-datetime: the first offset at or after the time per partition (-1: none)."""
    if plan.mode != "to_datetime" or not partitions:
        return {}
    assert plan.value is not None
    return {tp: offset for tp, (offset, _) in admin.list_offsets({tp: plan.value for tp in partitions}).items()}


def new_offsets(plan: ResetPlan, partitions: list[TopicPartition], committed: dict[TopicPartition, int],
                bounds: dict[TopicPartition, tuple[int, int]], at_time: dict[TopicPartition, int]
                ) -> dict[TopicPartition, int]:
    """The new offset of each partition (pure: every broker answer is passed in)."""
    out = {}
    for tp in partitions:
        start, end = bounds[tp]
        if plan.mode == "to_earliest":
            out[tp] = start
        elif plan.mode == "to_latest":
            out[tp] = end
        elif plan.mode == "to_datetime":
            out[tp] = end if at_time[tp] < 0 else at_time[tp]
        elif plan.mode == "to_offset":
            assert plan.value is not None
            out[tp] = min(max(plan.value, start), end)
        else:
            assert plan.mode == "shift_by" and plan.value is not None
            if tp not in committed:
                raise NoCommittedOffsetError(f"cannot shift {tp[0]}-{tp[1]}: the group has no committed offset there")
            out[tp] = min(max(committed[tp] + plan.value, start), end)
    return out
