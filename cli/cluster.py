"""`pymq cluster start` (a local cluster in one command) and `pymq cluster describe`.

`start` runs an etcd and N brokers on this machine until Ctrl-C: broker i listens on
127.0.0.{i+1}:PORT (every broker on the same port, each on its own loopback address), its data in
DIR/broker-i, etcd's in DIR/etcd, with the cluster settings of `--config` (conf/cluster-3.toml
if it exists). `describe` shows the brokers, the controller, and the partitions that are
under-replicated or offline.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import click
from rich.table import Table

from cli.common import admin_client
from common.cli_options import KEY_VALUE, bootstrap_option, console

DEFAULT_CLUSTER_CONFIG = Path("conf/cluster-3.toml")


@click.group("cluster")
def cluster_group() -> None:
    """Run a local cluster and see the state of a cluster."""


@cluster_group.command("start")
@click.option("-n", "--brokers", type=click.IntRange(1, 9), default=3, show_default=True, help="broker processes")
@click.option("--dir", "root", type=click.Path(file_okay=False, path_type=Path), default=Path("data/cluster"),
              show_default=True, help="where etcd and the brokers keep their data")
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True,
              help="each broker's port on its own address 127.0.0.{id+1} (0: free ports)")
@click.option("--etcd-port", type=click.IntRange(0, 65535), default=2379, show_default=True,
              help="etcd's client port on 127.0.0.1 (0: a free one)")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help=f"TOML config shared by the brokers [default: {DEFAULT_CLUSTER_CONFIG} if it exists]")
@click.option("-o", "--override", "overrides", type=KEY_VALUE, multiple=True,
              help="set a broker config key on every broker (repeatable; wins over the file)")
def start(brokers: int, root: Path, port: int, etcd_port: int, config_path: Path | None,
          overrides: tuple[tuple[str, str], ...]) -> None:
    """Start etcd and BROKERS brokers in the foreground; Ctrl-C stops them all cleanly.

    Prints the bootstrap list clients use once every broker is serving."""
    from broker.cluster.etcd_process import EtcdProcess
    from broker.cluster.local_cluster import LocalCluster

    if config_path is None and DEFAULT_CLUSTER_CONFIG.is_file():
        config_path = DEFAULT_CLUSTER_CONFIG
    etcd = EtcdProcess(root / "etcd" / "data", client_port=etcd_port)
    settings = {"port": port, **dict(overrides)}
    local = LocalCluster(root, brokers, settings, etcd=etcd, config_file=config_path)
    with console().status(f"starting etcd and {brokers} brokers"):
        etcd.start()
        try:
            local.start()
        except BaseException:
            etcd.stop()
            raise
    table = Table(title=f"local cluster ({root})")
    for header in ("broker", "address", "data", "output"):
        table.add_column(header)
    for i, broker in enumerate(local.brokers):
        table.add_row(str(i), broker.bootstrap, str(broker.log_dir), str(broker.output))
    table.add_row("etcd", etcd.endpoint, str(etcd.data_dir), str(etcd.output))
    console().print(table)
    click.echo(f"bootstrap: {local.bootstrap}")
    click.echo("Ctrl-C stops the cluster.")
    stop = threading.Event()
    # Ctrl-C and SIGTERM stop the cluster even when this process inherited them ignored or
    # blocked (a parent that ignores SIGINT, or spawned us from a thread that blocks it).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            for broker in local.brokers:
                if broker.proc is not None and broker.proc.poll() is not None:
                    click.echo(f"broker {broker.overrides['broker.id']} exited ({broker.proc.returncode}); "
                               f"see {broker.output}", err=True)
                    broker.proc = None
    except KeyboardInterrupt:
        pass
    finally:
        with console().status("stopping the brokers and etcd"):
            local.stop()
            etcd.stop()


@cluster_group.command("describe")
@bootstrap_option
def describe() -> None:
    """Brokers, the controller, and every partition that is under-replicated, offline or moving."""
    with admin_client() as admin:
        cluster = admin.describe_cluster()
    brokers = Table(title="brokers")
    for header in ("id", "address", "role", "leads", "replicas"):
        brokers.add_column(header)
    for broker in cluster.brokers:
        leads = sum(p.leader == broker.node_id for p in cluster.partitions)
        replicas = sum(broker.node_id in p.replicas for p in cluster.partitions)
        role = "controller" if broker.node_id == cluster.controller_id else ""
        brokers.add_row(str(broker.node_id), f"{broker.host}:{broker.port}", role, str(leads), str(replicas))
    console().print(brokers)
    troubled = cluster.offline + cluster.under_replicated + [p for p in cluster.reassigning if p.leader >= 0
                                                             and len(p.isr) == len(p.replicas)]
    if not troubled:
        click.echo(f"{len(cluster.partitions)} partitions, all fully replicated and led")
        return
    table = Table(title=f"{len(cluster.offline)} offline, {len(cluster.under_replicated)} under-replicated, "
                        f"{len(cluster.reassigning)} moving, of {len(cluster.partitions)} partitions")
    for header in ("topic", "partition", "leader", "epoch", "replicas", "isr", "state"):
        table.add_column(header)
    for p in troubled:
        if p.leader < 0:
            state = "offline"
        elif p.target_replicas:
            state = f"moving to {','.join(map(str, p.target_replicas))}"
        else:
            state = "under-replicated"
        table.add_row(p.topic, str(p.partition), str(p.leader), str(p.leader_epoch), ",".join(map(str, p.replicas)),
                      ",".join(map(str, p.isr)), state)
    console().print(table)
