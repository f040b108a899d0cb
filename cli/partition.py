"""`pymq partition reassign` and the plan `pymq broker decommission` submits.

A reassignment moves a partition's replicas to other brokers: the new ones catch up as followers
(at `replica.throttle.bytes.per.second` while out of sync), and the controller completes the move
once all are in sync, handing leadership over if the leader is moved away (docs/cluster.md,
Reassignment).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import click

from cli.common import admin_client, steps
from common.cli_options import bootstrap_option, console

if TYPE_CHECKING:
    from client import Admin
    from client.admin import ClusterDescription

Moves = dict[tuple[str, int], "tuple[int, ...] | None"]


@click.group("partition")
def partition_group() -> None:
    """Move partitions between brokers."""


def _broker_ids(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of broker ids") from None


@partition_group.command("reassign")
@click.option("--topic", help="the topic of the partition to move")
@click.option("--partition", "partitions", type=int, multiple=True, help="partition number (repeatable)")
@click.option("--replicas", help="the new replicas, preferred leader first, e.g. 3,1,2")
@click.option("--plan", "plan_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='a JSON plan: {"partitions": [{"topic": T, "partition": P, "replicas": [ids]}]}')
@click.option("--cancel", is_flag=True, help="cancel the moves of these partitions (back to their replicas)")
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait until every move completed")
@click.option("--timeout", "timeout_s", type=float, default=600, show_default=True, help="seconds to wait")
@bootstrap_option
def reassign(topic: str | None, partitions: tuple[int, ...], replicas: str | None, plan_path: Path | None,
             cancel: bool, wait: bool, timeout_s: float) -> None:
    """Move partitions to other brokers (one partition with --topic/--partition/--replicas, or a
    --plan file), and follow the moves until they complete."""
    moves = _moves(topic, partitions, replicas, plan_path, cancel)
    with admin_client() as admin:
        admin.alter_partition_reassignments(moves)
        click.echo(f"{'cancelled' if cancel else 'started'} {len(moves)} partition moves")
        if wait and not cancel:
            follow_moves(admin, set(moves), timeout_s)


def _moves(topic: str | None, partitions: tuple[int, ...], replicas: str | None, plan_path: Path | None,
           cancel: bool) -> Moves:
    if plan_path is not None:
        try:
            plan = json.loads(plan_path.read_text())
            return {(entry["topic"], int(entry["partition"])): None if cancel else tuple(int(b) for b in entry["replicas"])
                    for entry in plan["partitions"]}
        except (ValueError, KeyError, TypeError) as err:
            raise click.BadParameter(f"{plan_path}: not a plan ({err})", param_hint="--plan") from None
    if topic is None or not partitions or (replicas is None and not cancel):
        raise click.UsageError("give --topic, --partition and --replicas (or --cancel), or --plan")
    target = None if cancel else _broker_ids(replicas or "")
    return {(topic, p): target for p in partitions}


def follow_moves(admin: "Admin", moving: set[tuple[str, int]], timeout_s: float) -> "ClusterDescription":
    """Until none of `moving` is being reassigned; shows how many are left."""
    deadline = time.monotonic() + timeout_s
    with steps() as step:
        while True:
            cluster = admin.describe_cluster()
            left = [p for p in cluster.reassigning if (p.topic, p.partition) in moving]
            if not left:
                click.echo(f"all {len(moving)} moves completed")
                return cluster
            if time.monotonic() > deadline:
                raise click.ClickException(f"{len(left)} moves still in progress after {timeout_s:.0f} s, e.g. "
                                           f"{left[0].topic}-{left[0].partition} to {list(left[0].target_replicas)} "
                                           f"(in sync: {list(left[0].isr)})")
            step(f"{len(left)} of {len(moving)} moves in progress (new replicas catching up)")
            time.sleep(0.5)


def decommission_plan(cluster: "ClusterDescription", broker: int) -> Moves:
    """Every replica on `broker` moved to another live broker: for each partition, the broker
    with the fewest replicas (counting the plan so far) that does not hold one yet takes its place
    in the replica list (so it also takes its place as preferred leader)."""
    others = [b.node_id for b in cluster.brokers if b.node_id != broker]
    load = Counter({b: 0 for b in others})
    for p in cluster.partitions:
        load.update(r for r in (p.target_replicas or p.replicas) if r in load)
    moves: Moves = {}
    for p in cluster.partitions:
        current = p.target_replicas or p.replicas
        if broker not in current:
            continue
        candidates = [b for b in others if b not in current]
        if not candidates:
            raise click.ClickException(f"{p.topic}-{p.partition} has {len(current)} replicas and there are only "
                                       f"{len(others)} other brokers: nowhere to move its replica")
        chosen = min(candidates, key=lambda b: (load[b], b))
        load[chosen] += 1
        moves[(p.topic, p.partition)] = tuple(chosen if r == broker else r for r in current)
    return moves


def show_plan(moves: Moves, cluster: "ClusterDescription") -> None:
    from rich.table import Table

    current = {(p.topic, p.partition): p.replicas for p in cluster.partitions}
    table = Table(title=f"{len(moves)} partition moves")
    for header in ("topic", "partition", "replicas", "to"):
        table.add_column(header)
    for (topic, partition), target in sorted(moves.items()):
        table.add_row(topic, str(partition), _ids(current.get((topic, partition), ())), _ids(target or ()))
    console().print(table)


def _ids(ids: Iterable[int]) -> str:
    return ",".join(map(str, ids))
