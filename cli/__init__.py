"""The `pymq` command-line interface (console script `pymq = cli:main`).

Commands:
    pymq broker start [--config FILE] [-o KEY=VALUE ...]    run a broker in the foreground
    pymq broker configs                                      every broker config key, default and meaning
    pymq cluster start [-n 3] [--dir DIR] [--config FILE]     etcd and N brokers on 127.0.0.1..N, until Ctrl-C
    pymq cluster describe                                    brokers, controller, under-replicated and offline partitions
    pymq partition reassign (--topic T --partition P --replicas 1,2,3 | --plan FILE) [--cancel] [--wait]
    pymq broker decommission ID [--execute]                  move every replica off a broker
    pymq topic create NAME [-p N] [-r N] [-c KEY=VALUE ...]  create a topic
    pymq topic list                                          topic names
    pymq topic describe NAME...                              partitions, offsets and configs
    pymq topic alter NAME [--add-partitions N] [-c KEY=VALUE ...] [--delete-config KEY ...]
    pymq topic delete NAME... [--yes]                        delete topics and their data
    pymq produce TOPIC [--file F] [--key-separator SEP]      one record per input line
    pymq consume TOPIC [--from-beginning|--offset N|--timestamp T] [--format text|json|table|csv]
    pymq perf produce TOPIC -n N -s BYTES [--mode send|batch] [--json]
    pymq perf consume TOPIC [-n N] [--mode arrow|records] [--json]
    pymq group list [--state S]                              consumer groups, state, members
    pymq group describe GROUP [--members] [--offsets]        offsets, lag and members of a group
    pymq group delete GROUP...                               delete groups without members
    pymq group reset-offsets GROUP (--topic T[:P,P] | --all-topics) (--to-earliest | --to-latest |
        --to-datetime T | --shift-by N | --to-offset N) [--execute]
    pymq tier status [TOPIC] [--json]                        local and remote ranges, bytes, upload lag
    pymq table sync TOPIC --table PATH_OR_URL [--value-format json --value-schema DDL] [--trigger 30s]
    pymq table status TOPIC --table PATH_OR_URL              table version, rows, offsets held, lag
    pymq job retention TOPIC --table PATH_OR_URL [--execute] the topic's retention applied to its table
    pymq job compact TOPIC... --remote-storage URL            compaction of compacted topics' tiered segments

Client commands take `-b/--bootstrap-server` (before or after the command; default
$PYMQ_BOOTSTRAP or 127.0.0.1:9092). Operating errors print `error: NAME: message` on stderr and
exit with 1; usage errors exit with 2.
"""
from __future__ import annotations

import click

from cli.broker import broker_group
from cli.cluster import cluster_group
from cli.common import PymqGroup
from cli.consume import consume
from cli.group import group_group
from cli.partition import partition_group
from cli.perf import perf_group
from cli.produce import produce
from cli.table import job_group, table_group
from cli.tier import tier_group
from cli.topic import topic_group
from common.cli_options import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP, remember_bootstrap

__all__ = ["cli", "main"]


@click.group(cls=PymqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-b", "--bootstrap-server", envvar=BOOTSTRAP_ENV, default=DEFAULT_BOOTSTRAP, show_default=True,
              expose_value=False, callback=remember_bootstrap,
              help=f"broker address host:port[,host:port...] for client commands (env {BOOTSTRAP_ENV})")
@click.version_option(package_name="pymq", prog_name="pymq")
def cli() -> None:
    """pymq: a Kafka-like broker with Arrow record batches. Run a broker, manage topics and
    consumer groups, inspect tiered storage, produce and consume records, mirror topics into Delta
    tables, and measure performance."""


for _command in (broker_group, cluster_group, partition_group, topic_group, produce, consume, perf_group, group_group, tier_group, table_group, job_group):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="pymq")
