"""`pymq tier status [TOPIC]`: how far each partition is tiered to the remote store.

One row per partition, as its leader knows it (DescribeTiering, broker/handlers/tiering.py):
the local segments' offsets [start, end), the remote log's [start, end) from the manifest the
broker holds, their bytes, the remote segment count, the upload lag (records and bytes of the
local segments at or above the remote end, the active one included), and the status: `ok`,
`failing: N x ERROR` (N tiering runs failed in a row, the last with ERROR), `not tiered`, or
`pending` while the broker has not read the partition's manifest yet. `--json` prints the same
as one JSON array of objects (every field of `Admin.describe_tiering`, bytes as numbers).
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import click
from rich.table import Table

from cli.common import admin_client
from common.cli_options import bootstrap_option, console

if TYPE_CHECKING:
    from client.admin import PartitionTiering

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(size: int) -> str:
    """1536 -> '1.5 KiB'; below 1 KiB exact bytes ('512 B')."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in _UNITS[1:]:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def offset_range(start: int, end: int) -> str:
    """'[start, end)', or '-' when unknown."""
    return "-" if start < 0 or end < 0 else f"[{start}, {end})"


def status_text(row: "PartitionTiering") -> str:
    if not row.tiered:
        return "not tiered"
    if row.failures:
        return f"failing: {row.failures} x {row.last_error or 'unknown error'}"
    if row.manifest_version < 0:
        return "pending (manifest not read yet)"
    return "ok"


def upload_lag(row: "PartitionTiering") -> str:
    if not row.tiered or row.upload_lag_offsets < 0:
        return "-"
    return f"{row.upload_lag_offsets} ({human_bytes(row.upload_lag_bytes)})"


def status_table(rows: list["PartitionTiering"]) -> Table:
    numeric = ("PARTITION", "LOCAL-BYTES", "REMOTE-BYTES", "SEGMENTS", "UPLOAD-LAG")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("TOPIC", "PARTITION", "LOCAL", "REMOTE", "LOCAL-BYTES", "REMOTE-BYTES", "SEGMENTS",
                   "UPLOAD-LAG", "STATUS"):
        table.add_column(header, justify="right" if header in numeric else "left", no_wrap=header != "STATUS")
    for row in rows:
        remote = row.tiered and row.manifest_version >= 0
        table.add_row(
            row.topic, str(row.partition), offset_range(row.local_log_start_offset, row.log_end_offset),
            offset_range(row.remote_log_start_offset, row.remote_log_end_offset) if remote else "-",
            human_bytes(row.local_bytes), human_bytes(row.remote_bytes) if remote else "-",
            str(row.remote_segments) if remote else "-", upload_lag(row), status_text(row))
    return table


@click.group("tier")
def tier_group() -> None:
    """Inspect tiered storage: what each partition holds locally and in the remote store."""


@tier_group.command("status")
@click.argument("topic", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the rows as one JSON array of objects")
@bootstrap_option
def status(topic: str | None, as_json: bool) -> None:
    """Per partition of TOPIC (default: every topic): local and remote offset ranges [start, end),
    local and remote bytes, remote segments, upload lag (records and bytes not uploaded yet) and
    the tiering status (ok, failing: N x ERROR, not tiered)."""
    with admin_client() as admin:
        rows = admin.describe_tiering(None if topic is None else [topic])
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(row) for row in rows]))
        return
    if not rows:
        console().print(f"topic {topic} has no partitions" if topic is not None else "no partitions")
        return
    console().print(status_table(rows))
