"""`pymq table status TOPIC --table PATH_OR_URL`: how far a table topic has caught up with its topic.

The table's version, rows, files and bytes (Delta's own statistics), then per partition the
offsets the table holds, [log start, position), against the topic's log [start, end) on the
brokers, and the lag: records on the brokers past the table's position.
"""
from __future__ import annotations

from dataclasses import dataclass

import click
from pyspark.sql import SparkSession
from rich.table import Table

from client import Admin
from common.cli_options import bootstrap, bootstrap_option
from common.cli_options import console as cli_console
from common.cli_options import spark_conf_option
from spark_datasource.session import local_spark
from spark_datasource.table_topic import TableTopic


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    table_position: int | None  # next offset not in the table; None: never synced
    log_start: int
    log_end: int

    @property
    def lag(self) -> int:
        return self.log_end - max(self.table_position or 0, self.log_start)


@dataclass(frozen=True)
class TableStatus:
    topic: str
    location: str
    version: int
    rows: int
    files: int
    size_bytes: int
    value_format: str
    partitions: list[PartitionStatus]


def table_status(spark: SparkSession, location: str, bootstrap: str, topic: str | None = None) -> TableStatus:
    """The status of the table at `location` (which must mirror `topic`, when given)."""
    table = TableTopic(spark, location)
    topic = table.check_topic(topic)
    position = table.position()
    detail = table.delta().detail().select("numFiles", "sizeInBytes").first()
    rows = table.snapshot(position.version).count()
    with Admin(bootstrap) as admin:
        count = len(admin.describe_topics([topic])[0].partitions)
        starts = admin.list_offsets({(topic, p): -2 for p in range(count)})
        ends = admin.list_offsets({(topic, p): -1 for p in range(count)})
    value_format, _ = table.value_format()
    return TableStatus(topic, location, position.version, rows, int(detail["numFiles"]), int(detail["sizeInBytes"]),
                       value_format.kind, [PartitionStatus(p, position.offsets.get(p), starts[(topic, p)][0],
                                                           ends[(topic, p)][0]) for p in range(count)])


def status_tables(status: TableStatus) -> tuple[Table, Table]:
    head = Table(title=f"table topic {status.topic}", box=None, header_style="bold")
    for column in ("TABLE", "VERSION", "ROWS", "FILES", "BYTES", "VALUES"):
        head.add_column(column, justify="left" if column in ("TABLE", "VALUES") else "right")
    head.add_row(status.location, str(status.version), f"{status.rows:,}", str(status.files),
                 f"{status.size_bytes:,}", status.value_format)
    parts = Table(box=None, header_style="bold")
    for column in ("PARTITION", "TABLE HOLDS", "LOG", "LAG"):
        parts.add_column(column, justify="right")
    for p in status.partitions:
        held = "-" if p.table_position is None else f"[.., {p.table_position})"
        parts.add_row(str(p.partition), held, f"[{p.log_start}, {p.log_end})", f"{p.lag:,}")
    return head, parts


@click.command("status")
@click.argument("topic")
@click.option("--table", "table", required=True, help="the table topic's Delta table: a path or a Hadoop URL")
@bootstrap_option
@spark_conf_option
def status_command(topic: str, table: str, spark_conf: tuple[tuple[str, str], ...]) -> None:
    """How far the table topic of TOPIC has caught up. The table's version, rows, files and bytes; per partition the offsets it holds, the
    topic's log on the brokers, and the lag (records not in the table yet)."""
    spark = local_spark("pymq-table-status", **dict(spark_conf))
    try:
        status = table_status(spark, table, bootstrap(), topic)
    finally:
        spark.stop()
    for rendered in status_tables(status):
        cli_console().print(rendered)


main = status_command

if __name__ == "__main__":
    main()
