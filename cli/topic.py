"""`pymq topic create | list | describe | alter | delete`."""
from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from broker.config import TOPIC_CONFIGS, parse_topic_configs
from cli.common import admin_client
from common.cli_options import KEY_VALUE, bootstrap_option, console
from common.errors import InvalidConfigError
from segment_format.layout import validate_topic_name


@click.group("topic")
def topic_group() -> None:
    """Create, list, describe, alter and delete topics."""


@topic_group.command("create")
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(min=1), default=None,
              help="number of partitions [default: the broker's num.partitions]")
@click.option("-r", "--replication-factor", type=click.IntRange(min=1), default=None,
              help="copies of each partition [default: the broker's]")
@click.option("-c", "--config", "configs", type=KEY_VALUE, multiple=True,
              help="topic config override, e.g. -c retention.ms=3600000 (repeatable)")
@bootstrap_option
def create(name: str, partitions: int | None, replication_factor: int | None,
           configs: tuple[tuple[str, str], ...]) -> None:
    """Create topic NAME with optional partition count, replication factor and configs."""
    validate_topic_name(name)
    settings = _checked_configs(configs)
    with admin_client() as admin:
        admin.create_topic(name, partitions or -1, replication_factor or -1, settings)
    click.echo(f"created topic {name}")


@topic_group.command("list")
@bootstrap_option
def list_topics() -> None:
    """List topic names, one per line."""
    with admin_client() as admin:
        names = admin.list_topics()
    for name in names:
        click.echo(name)


@topic_group.command("describe")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@bootstrap_option
def describe(names: tuple[str, ...]) -> None:
    """Show each topic's partitions (leader, epoch, replicas, ISR, log start and end offsets) and
    its configs, marking the ones overridden on the topic."""
    from client import EARLIEST, LATEST

    with admin_client() as admin:
        descriptions = admin.describe_topics(list(names))
        tps = [(d.name, p.partition) for d in descriptions for p in d.partitions]
        starts = admin.list_offsets({tp: EARLIEST for tp in tps}) if tps else {}
        ends = admin.list_offsets({tp: LATEST for tp in tps}) if tps else {}
    out = console()
    for description in descriptions:
        out.print(f"topic {description.name}  id {description.topic_id}  partitions {len(description.partitions)}")
        out.print(_partition_table(description, starts, ends))
        out.print(_config_table(description.configs))


def _partition_table(description: Any, starts: dict[Any, tuple[int, int]], ends: dict[Any, tuple[int, int]]) -> Table:
    table = Table(title=f"{description.name} partitions")
    for header in ("partition", "leader", "epoch", "replicas", "isr", "log start offset", "end offset"):
        table.add_column(header, justify="right" if header not in ("replicas", "isr") else "left")
    for p in description.partitions:
        tp = (description.name, p.partition)
        table.add_row(str(p.partition), str(p.leader), str(p.leader_epoch), ",".join(map(str, p.replicas)),
                      ",".join(map(str, p.isr)), str(starts.get(tp, ("?",))[0]), str(ends.get(tp, ("?",))[0]))
    return table


def _config_table(configs: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="configs (override = set on this topic)")
    for header in ("config", "value", "source"):
        table.add_column(header)
    for name, entry in sorted(configs.items()):
        override = entry["source"] == "topic"
        table.add_row(name, str(entry["value"]), "override" if override else "default",
                      style="bold yellow" if override else None)
    return table


@topic_group.command("alter")
@click.argument("name")
@click.option("--add-partitions", type=click.IntRange(min=1), default=None,
              help="add this many partitions (partitions are never removed)")
@click.option("-c", "--config", "configs", type=KEY_VALUE, multiple=True,
              help="set a topic config, e.g. -c retention.ms=3600000 (repeatable)")
@click.option("--delete-config", "delete_configs", multiple=True, metavar="KEY",
              help="remove a topic's override so the broker default applies again (repeatable)")
@bootstrap_option
def alter(name: str, add_partitions: int | None, configs: tuple[tuple[str, str], ...],
          delete_configs: tuple[str, ...]) -> None:
    """Add partitions to topic NAME, set configs, or reset configs to the broker default."""
    if not (add_partitions or configs or delete_configs):
        raise click.UsageError("nothing to alter: give --add-partitions, -c/--config or --delete-config")
    settings = _checked_configs(configs)
    for key in delete_configs:
        _check_known(key)
    with admin_client() as admin:
        if settings or delete_configs:
            admin.alter_configs(name, settings, list(delete_configs))
            click.echo(f"altered configs of {name}")
        if add_partitions:
            (description,) = admin.describe_topics([name])
            count = len(description.partitions) + add_partitions
            admin.create_partitions(name, count)
            click.echo(f"topic {name} now has {count} partitions")


@topic_group.command("delete")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@bootstrap_option
def delete(names: tuple[str, ...], yes: bool) -> None:
    """Delete topics and all their data (asks first unless --yes)."""
    if not yes:
        click.confirm(f"delete {', '.join(names)} and all their data?", abort=True, err=True)
    with admin_client() as admin:
        admin.delete_topics(list(names))
    for name in names:
        click.echo(f"deleted topic {name}")


def _checked_configs(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Validate topic configs before sending them, so typos fail fast with the list of keys."""
    settings = dict(pairs)
    parse_topic_configs(settings)
    return settings


def _check_known(key: str) -> None:
    if key not in TOPIC_CONFIGS:
        raise InvalidConfigError(f"unknown topic config {key!r}; known: {', '.join(sorted(TOPIC_CONFIGS))}")
