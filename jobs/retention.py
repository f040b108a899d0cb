"""`pymq job retention TOPIC --table PATH_OR_URL [--execute]`: a topic's retention applied to its table.

A table topic keeps what the topic keeps. A row has expired when the topic no longer holds its
record: its offset is below its partition's log start offset (which the broker's retention, by
time or by size, moves forward, the tier included), or, for a topic whose `cleanup.policy` has
`delete` and whose `retention.ms` is set, its timestamp is older than now - retention.ms (the
broker may not have run retention yet). Time retention is the `delete` policy's, as in Kafka: a
`compact` topic keeps each key's latest record whatever its age, so its old rows stay (the sync
deletes the rows its tombstones erase).

The report shows, per partition, what the table holds against the topic's log (local and tiered)
and its policy, and how many rows have expired. A dry run (the default) changes nothing; with
`--execute` the job deletes the expired rows (one Delta DELETE) and then VACUUMs the table past
`vacuum_horizon_hours` (conf/jobs.toml), which is also when the Parquet files of rows erased by a
compacted topic's tombstones leave storage.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import reduce

import click
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from rich.table import Table

from client import Admin
from common.cli_options import bootstrap, bootstrap_option
from common.cli_options import console as cli_console
from common.cli_options import spark_conf_option
from jobs.job_config import job_defaults
from spark_datasource.session import local_spark
from spark_datasource.table_topic import TableTopic

DELTA_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
DELTA_MIN_HORIZON_HOURS = 168


@dataclass(frozen=True)
class PartitionRetention:
    partition: int
    table_rows: int
    expired_rows: int
    log_start: int  # the topic's log start offset (tier included)
    local_start: int
    remote_start: int  # -1: not tiered
    log_end: int


@dataclass(frozen=True)
class TopicPolicy:
    """What of the topic's configs retention depends on."""

    retention_ms: int  # -1: no time limit
    cleanup_policy: str  # "delete", "compact" or "compact,delete"

    @property
    def by_time(self) -> bool:
        """Records expire by time: the `delete` policy (alone or with `compact`) with a retention.ms."""
        return "delete" in {word.strip() for word in self.cleanup_policy.split(",")} and self.retention_ms >= 0


@dataclass(frozen=True)
class RetentionReport:
    topic: str
    policy: TopicPolicy
    cutoff_ms: int | None  # rows older than this have expired by time (None: no time limit)
    partitions: list[PartitionRetention]
    deleted_rows: int = 0
    vacuumed: bool = False


def topic_policy(admin: Admin, topic: str) -> TopicPolicy:
    configs = admin.describe_configs([topic])[topic]
    return TopicPolicy(int(configs.get("retention.ms", {}).get("value", -1)),
                       str(configs.get("cleanup.policy", {}).get("value", "delete")))


def expired(log_starts: dict[int, int], cutoff_ms: int | None) -> Column:
    """Rows whose record the topic no longer holds."""
    below_start = reduce(lambda a, b: a | b, [(F.col("partition") == p) & (F.col("offset") < start)
                                              for p, start in log_starts.items()], F.lit(False))
    if cutoff_ms is None:
        return below_start
    return below_start | (F.col("timestamp") < F.timestamp_millis(F.lit(cutoff_ms)))


def retention(spark: SparkSession, location: str, bootstrap_servers: str, topic: str | None = None, *,
              execute: bool = False, vacuum_horizon_hours: float | None = None, now_ms: int | None = None) -> RetentionReport:
    """Report (and with `execute`, apply) the topic's retention on its table."""
    table = TableTopic(spark, location)
    topic = table.check_topic(topic)
    with Admin(bootstrap_servers) as admin:
        policy = topic_policy(admin, topic)
        tiering = {t.partition: t for t in admin.describe_tiering([topic])}
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    cutoff_ms = now_ms - policy.retention_ms if policy.by_time else None
    log_starts = {p: t.log_start_offset for p, t in tiering.items()}
    condition = expired(log_starts, cutoff_ms)
    rows = table.snapshot(table.position().version)
    counts = {r["partition"]: (r["rows"], r["expired"]) for r in rows.groupBy("partition").agg(
        F.count("*").alias("rows"), F.sum(condition.cast("long")).alias("expired")).collect()}
    partitions = [PartitionRetention(p, *(int(n or 0) for n in counts.get(p, (0, 0))), t.log_start_offset,
                                     t.local_log_start_offset, t.remote_log_start_offset if t.tiered else -1,
                                     t.log_end_offset) for p, t in sorted(tiering.items())]
    report = RetentionReport(topic, policy, cutoff_ms, partitions)
    if not execute:
        return report
    deleted = sum(p.expired_rows for p in partitions)
    if deleted:
        table.delta().delete(condition)
    horizon = vacuum_horizon_hours if vacuum_horizon_hours is not None else job_defaults("retention")["vacuum_horizon_hours"]
    if horizon < DELTA_MIN_HORIZON_HOURS:  # below Delta's floor: lift its check for this vacuum only
        before = spark.conf.get(DELTA_RETENTION_CHECK, None)
        spark.conf.set(DELTA_RETENTION_CHECK, "false")
        try:
            table.delta().vacuum(float(horizon))
        finally:
            if before is None:
                spark.conf.unset(DELTA_RETENTION_CHECK)
            else:
                spark.conf.set(DELTA_RETENTION_CHECK, before)
    else:
        table.delta().vacuum(float(horizon))
    return RetentionReport(topic, policy, cutoff_ms, partitions, deleted, True)


def report_table(report: RetentionReport) -> Table:
    policy = f"cleanup.policy={report.policy.cleanup_policy}, " + (
        f"retention.ms={report.policy.retention_ms}" if report.cutoff_ms is not None else
        "retention.ms=-1 (no time limit)" if report.policy.retention_ms < 0 else
        f"retention.ms={report.policy.retention_ms} (not applied: no delete policy)")
    table = Table(title=f"retention of {report.topic}'s table ({policy})", header_style="bold")
    for column in ("PARTITION", "TABLE ROWS", "EXPIRED", "TOPIC LOG", "LOCAL FROM", "TIER FROM"):
        table.add_column(column, justify="right")
    for p in report.partitions:
        table.add_row(str(p.partition), f"{p.table_rows:,}", f"{p.expired_rows:,}", f"[{p.log_start}, {p.log_end})",
                      str(p.local_start), "-" if p.remote_start < 0 else str(p.remote_start))
    return table


@click.command("retention")
@click.argument("topic")
@click.option("--table", "table", required=True, help="the table topic's Delta table: a path or a Hadoop URL")
@click.option("--execute", is_flag=True, help="delete the expired rows and vacuum (default: report only)")
@click.option("--vacuum-horizon-hours", type=float, default=None,
              help="keep files newer versions may need for this long [conf/jobs.toml: 168]")
@bootstrap_option
@spark_conf_option
def retention_command(topic: str, table: str, execute: bool, vacuum_horizon_hours: float | None,
                      spark_conf: tuple[tuple[str, str], ...]) -> None:
    """Apply TOPIC's retention to its table: rows whose records the topic no longer holds (below
    the log start offset, or, with cleanup.policy delete, older than retention.ms). A dry run
    unless --execute."""
    spark = local_spark("pymq-job-retention", **dict(spark_conf))
    try:
        report = retention(spark, table, bootstrap(), topic, execute=execute, vacuum_horizon_hours=vacuum_horizon_hours)
    finally:
        spark.stop()
    console = cli_console()
    console.print(report_table(report))
    expired_rows = sum(p.expired_rows for p in report.partitions)
    if execute:
        console.print(f"deleted {report.deleted_rows:,} expired rows; vacuumed")
    else:
        console.print(f"dry run: {expired_rows:,} rows would be deleted (--execute to apply)")


main = retention_command

if __name__ == "__main__":
    main()
