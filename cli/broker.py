"""`pymq broker start` and `pymq broker configs`."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from broker.config import BROKER_CONFIGS, BrokerConfig, ConfigDef
from cli.common import admin_client
from common.cli_options import KEY_VALUE, bootstrap_option, console
from common.errors import LogDirInUseError
from segment_format.limits import INT32_MAX, INT64_MAX

DEFAULT_CONFIG = Path("conf/broker.toml")


@click.group("broker")
def broker_group() -> None:
    """Run a broker and list the broker's configuration keys."""


@broker_group.command("start")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help=f"TOML config file [default: {DEFAULT_CONFIG} if it exists, else built-in defaults]")
@click.option("-o", "--override", "overrides", type=KEY_VALUE, multiple=True,
              help="set a broker config key, e.g. -o port=0 -o log.dir=/tmp/pymq (repeatable; wins over the file)")
def start(config_path: Path | None, overrides: tuple[tuple[str, str], ...]) -> None:
    """Start a broker in the foreground; SIGTERM or Ctrl-C stops it cleanly.

    Prints "pymq broker ID listening on HOST:PORT" once it accepts connections.
    See `pymq broker configs` for every key.
    """
    if config_path is None and DEFAULT_CONFIG.is_file():
        config_path = DEFAULT_CONFIG
    config = BrokerConfig.load(config_path, dict(overrides))
    from broker import server  # the whole broker stack, only when a broker is really started

    try:
        server.run(config)
    except LogDirInUseError as err:
        raise click.ClickException(str(err)) from err


@broker_group.command("configs")
def configs() -> None:
    """List every broker config key with its type, default, valid values and meaning."""
    table = Table(title="broker configs", show_lines=False)
    for header in ("key", "type", "default", "valid values", "meaning"):
        table.add_column(header, overflow="fold", no_wrap=header == "key")
    for definition in sorted(BROKER_CONFIGS.values(), key=lambda d: d.name):
        table.add_row(definition.name, definition.kind.__name__, _show(definition.default), _valid_values(definition),
                      definition.doc)
    console().print(table)


def _valid_values(definition: ConfigDef) -> str:
    if definition.choices:
        return ", ".join(definition.choices)
    if definition.minimum is None and definition.maximum is None:
        return ""
    low = "" if definition.minimum is None else _show(definition.minimum)
    high = "" if definition.maximum is None else _show(definition.maximum)
    return f"{low}..{high}"


def _show(value: object) -> str:
    """Values as a user types them; the int limits by name, not as 19 digits."""
    if value is True or value is False:
        return str(value).lower()
    return {INT64_MAX: "2^63-1", INT32_MAX: "2^31-1"}.get(value, str(value)) if isinstance(value, int) else str(value)


@broker_group.command("decommission")
@click.argument("broker_id", type=int)
@click.option("--execute", is_flag=True, help="start the moves (without it, only show the plan)")
@click.option("--wait/--no-wait", default=True, show_default=True, help="with --execute: wait until done")
@click.option("--timeout", "timeout_s", type=float, default=1800, show_default=True, help="seconds to wait")
@bootstrap_option
def decommission(broker_id: int, execute: bool, wait: bool, timeout_s: float) -> None:
    """Move every replica (and with it every leadership) off BROKER_ID onto the other brokers,
    evenly; once done the broker holds nothing and can be stopped for good."""
    from cli.partition import decommission_plan, follow_moves, show_plan

    with admin_client() as admin:
        cluster = admin.describe_cluster()
        if broker_id not in {b.node_id for b in cluster.brokers}:
            raise click.ClickException(f"broker {broker_id} is not a live broker of this cluster")
        moves = decommission_plan(cluster, broker_id)
        if not moves:
            click.echo(f"broker {broker_id} holds no replicas")
            return
        show_plan(moves, cluster)
        if not execute:
            click.echo("dry run: add --execute to start these moves")
            return
        admin.alter_partition_reassignments(moves)
        click.echo(f"started {len(moves)} partition moves off broker {broker_id}")
        if wait:
            left = [p for p in follow_moves(admin, set(moves), timeout_s).partitions if broker_id in p.replicas]
            if left:
                raise click.ClickException(f"{len(left)} partitions still have a replica on broker {broker_id}")
            click.echo(f"broker {broker_id} holds no replicas: it can be stopped")