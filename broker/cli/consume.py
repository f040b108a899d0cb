"""`pymq consume`: print a topic's records as text, JSON lines, rich tables or CSV."""
from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

import click

from broker.cli.common import bootstrap_option, console, consumer_client, topic_partitions

if TYPE_CHECKING:
    import pyarrow as pa

    from broker.client import Consumer

POLL_MS = 500  # longest single poll, so Ctrl-C and --timeout-ms are noticed promptly
CSV_COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "value"]


class Timestamp(click.ParamType):
    """Milliseconds since the epoch, or an ISO 8601 date-time (UTC unless it names an offset)."""

    name = "ISO8601|MS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{value!r} is neither milliseconds nor an ISO 8601 date-time", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)


@click.command("consume")
@click.argument("topic")
@click.option("-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="read only this partition (repeatable) [default: all]")
@click.option("--from-beginning", is_flag=True, help="start at each partition's log start offset")
@click.option("--offset", type=click.IntRange(min=0), default=None, help="start every partition at this offset")
@click.option("--timestamp", type=Timestamp(), default=None,
              help="start at the first record at or after this time (ISO 8601, UTC unless given; or epoch ms)")
@click.option("-n", "--max-messages", type=click.IntRange(min=1), default=None, help="stop after this many records")
@click.option("--timeout-ms", type=click.IntRange(min=0), default=None,
              help="stop after this long without new records [default: run until --max-messages or Ctrl-C]")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "table", "csv"]), default="text",
              show_default=True, help="text: value per line; json: one object per line; table; csv (without record headers)")
@click.option("--print-key", is_flag=True, help="text format: print the key before the value")
@click.option("--print-offset", is_flag=True, help="text format: print partition:offset first")
@click.option("--key-separator", default="\t", show_default="tab", metavar="SEP",
              help="text format: separator between offset, key and value")
@bootstrap_option
def consume(topic: str, partitions: tuple[int, ...], from_beginning: bool, offset: int | None, timestamp: int | None,
            max_messages: int | None, timeout_ms: int | None, output_format: str, print_key: bool,
            print_offset: bool, key_separator: str) -> None:
    """Print records of TOPIC as they arrive, by default from the end of every partition.

    Reports the number of records consumed on stderr when it stops.
    """
    if sum([from_beginning, offset is not None, timestamp is not None]) > 1:
        raise click.UsageError("give at most one of --from-beginning, --offset and --timestamp")
    writer = RecordWriter(emitter(output_format, print_key, print_offset, key_separator))
    tps = topic_partitions(topic, partitions)
    # Start where assign() puts the partitions when that is what was asked: a seek right after
    # assign waits out the long-poll fetch already in flight (up to fetch_max_wait_ms).
    with consumer_client(auto_offset_reset="earliest" if from_beginning else "latest") as consumer:
        consumer.assign(tps)
        _position(consumer, tps, offset, timestamp)
        try:
            drain(consumer, writer, max_messages, timeout_ms)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how an unbounded consume ends
    click.echo(f"consumed {writer.count} records", err=True)


def _position(consumer: "Consumer", tps: list[tuple[str, int]], offset: int | None, timestamp: int | None) -> None:
    if offset is not None:
        for tp in tps:
            consumer.seek(tp, offset)
    elif timestamp is not None:
        for tp, found in consumer.offsets_for_times({tp: timestamp for tp in tps}).items():
            if found is None:
                consumer.seek_to_end(tp)  # nothing that new yet: wait for new records
            else:
                consumer.seek(tp, found[0])


def drain(consumer: "Consumer", writer: "RecordWriter", max_messages: int | None, timeout_ms: int | None) -> None:
    """Poll and write until `max_messages` records or `timeout_ms` without data."""
    last_data = time.monotonic()
    while max_messages is None or writer.count < max_messages:
        wait_ms = POLL_MS
        if timeout_ms is not None:
            wait_ms = max(0, min(POLL_MS, int(timeout_ms - (time.monotonic() - last_data) * 1000)))
        limit = None if max_messages is None else max_messages - writer.count
        table = consumer.poll_arrow(timeout_ms=wait_ms, max_records=limit)
        if table.num_rows:
            writer(table)
            last_data = time.monotonic()
        elif timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= timeout_ms:
            break


# -- output formats ----------------------------------------------------------------------------


Emit = Callable[["pa.Table"], None]


def emitter(output_format: str, print_key: bool, print_offset: bool, separator: str) -> Emit:
    """The function that writes one polled RECORD_SCHEMA table to stdout in `output_format`."""
    if output_format == "text":
        return lambda table: click.echo(text_lines(table, print_key, print_offset, separator), nl=False)
    if output_format == "json":
        return lambda table: click.echo(json_lines(table), nl=False)
    if output_format == "table":
        return lambda table: console().print(rich_table(table))
    return CsvEmitter()


class RecordWriter:
    """Writes polled RECORD_SCHEMA tables to stdout in one format and counts the records."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.count = 0

    def __call__(self, table: "pa.Table") -> None:
        self.emit(table)
        self.count += table.num_rows


def decode_text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


def text_lines(table: "pa.Table", print_key: bool, print_offset: bool, separator: str) -> str:
    values = [decode_text(v) for v in table.column("value").to_pylist()]
    columns: list[list[str]] = []
    if print_offset:
        columns.append([f"{p}:{o}" for p, o in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())])
    if print_key:
        columns.append([decode_text(k) for k in table.column("key").to_pylist()])
    rows = zip(*columns, values) if columns else ((v,) for v in values)
    return "".join(separator.join(row) + "\n" for row in rows)


def json_text(data: bytes | None) -> str | None:
    """UTF-8 text, or base64 when the bytes are not valid UTF-8."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii")


def iso_time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_lines(table: "pa.Table") -> str:
    names = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    lines = []
    for topic, partition, offset, ts, key, value, headers in zip(*(table.column(n).to_pylist() for n in names)):
        record = {"topic": topic, "partition": partition, "offset": offset, "timestamp": iso_time(ts),
                  "key": json_text(key), "value": json_text(value),
                  "headers": [[h["key"], json_text(h["value"])] for h in headers or []]}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return "".join(lines)


def rich_table(table: "pa.Table") -> Any:
    from rich.table import Table

    out = Table()
    for header in ("partition", "offset", "timestamp", "key", "value"):
        out.add_column(header, overflow="fold", justify="right" if header in ("partition", "offset") else "left")
    names = ["partition", "offset", "timestamp", "key", "value"]
    for partition, offset, ts, key, value in zip(*(table.column(n).to_pylist() for n in names)):
        out.add_row(str(partition), str(offset), iso_time(ts), decode_text(key), decode_text(value))
    return out


class CsvEmitter:
    """Writes CSV to stdout with a header row before the first table only."""

    def __init__(self) -> None:
        self.include_header = True

    def __call__(self, table: "pa.Table") -> None:
        click.get_binary_stream("stdout").write(csv_bytes(table, self.include_header))
        self.include_header = False


def csv_bytes(table: "pa.Table", include_header: bool) -> bytes:
    """The table's CSV_COLUMNS as CSV, key and value as UTF-8 (invalid bytes replaced)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    selected = table.select(CSV_COLUMNS)
    for name in ("key", "value"):
        selected = selected.set_column(selected.schema.get_field_index(name), name, _utf8(selected.column(name)))
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(selected, sink, pa_csv.WriteOptions(include_header=include_header))
    return sink.getvalue().to_pybytes()


def _utf8(column: "pa.ChunkedArray") -> "pa.ChunkedArray":
    import pyarrow as pa

    try:
        return column.cast(pa.string())  # validates UTF-8 in C++: the common case
    except pa.ArrowInvalid:
        return pa.chunked_array([pa.array([None if b is None else b.decode("utf-8", errors="replace")
                                           for b in column.to_pylist()], pa.string())])

