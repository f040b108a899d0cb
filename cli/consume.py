"""`pymq consume`: print a topic's records as text, JSON lines, rich tables or CSV."""
from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

import click

from cli.common import Interrupts, consumer_client, topic_partitions, write_stdout
from common.cli_options import bootstrap_option, console

if TYPE_CHECKING:
    import pyarrow as pa

    from client import Consumer

POLL_MS = 500  # longest single poll, so Ctrl-C and --timeout-ms are noticed promptly
CSV_COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "value"]
PRINT_FORMATS = ("auto", "utf8", "hex", "base64", "raw")


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
@click.option("--print-format", "print_format", type=click.Choice(PRINT_FORMATS), default=None,
              help="how keys, values and header values are printed: utf8 (invalid bytes replaced), hex, base64, "
                   "raw (the bytes as they are; text format only), auto (UTF-8 when valid, else base64, marked: "
                   "{\"base64\": ...} in json, 'base64:...' otherwise) [default: auto for json, utf8 otherwise]")
@click.option("-g", "--group", "group_id", default=None, metavar="GROUP",
              help="consume as a member of consumer group GROUP: partitions are assigned by the group, "
                   "start at its committed offsets (else the end, or the beginning with --from-beginning), "
                   "and what is printed is committed; Ctrl-C leaves the group")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True,
              help="read_committed: only records of committed transactions (and plain ones), up to each "
                   "partition's last stable offset; read_uncommitted: every record (Kafka's console consumer's default)")
@click.option("--print-key", is_flag=True, help="text format: print the key before the value")
@click.option("--print-offset", is_flag=True, help="text format: print partition:offset first")
@click.option("--key-separator", default="\t", show_default="tab", metavar="SEP",
              help="text format: separator between offset, key and value")
@bootstrap_option
def consume(topic: str, partitions: tuple[int, ...], from_beginning: bool, offset: int | None, timestamp: int | None,
            max_messages: int | None, timeout_ms: int | None, output_format: str, print_format: str | None,
            group_id: str | None, isolation_level: str, print_key: bool, print_offset: bool, key_separator: str) -> None:
    """Print records of TOPIC as they arrive, by default from the end of every partition.

    Reports the number of records printed on stderr when it stops (Ctrl-C included: a polled
    batch is printed whole before Ctrl-C takes effect, so the count is exact).
    """
    if sum([from_beginning, offset is not None, timestamp is not None]) > 1:
        raise click.UsageError("give at most one of --from-beginning, --offset and --timestamp")
    if group_id is not None and (partitions or offset is not None or timestamp is not None):
        raise click.UsageError("--group takes the partitions and positions the group gives: "
                               "--partition, --offset and --timestamp go without it")
    bytes_format = print_format or ("auto" if output_format == "json" else "utf8")
    if bytes_format == "raw" and output_format != "text":
        raise click.UsageError("--print-format raw prints bytes as they are: only with --format text")
    writer = RecordWriter(emitter(output_format, bytes_format, print_key, print_offset, key_separator))
    reset = "earliest" if from_beginning else "latest"
    interrupts = Interrupts()
    with interrupts.installed():
        try:
            if group_id is None:
                tps = topic_partitions(topic, partitions)
                # Start where assign() puts the partitions when that is what was asked: a seek right after
                # assign waits out the long-poll fetch already in flight (up to fetch_max_wait_ms).
                with consumer_client(auto_offset_reset=reset, isolation_level=isolation_level) as consumer:
                    consumer.assign(tps)
                    _position(consumer, tps, offset, timestamp)
                    drain(consumer, writer, interrupts, max_messages, timeout_ms)
            else:
                # Auto-commit commits positions, and a position moves only with a batch printed whole.
                with consumer_client(group_id=group_id, auto_offset_reset=reset, client_id="pymq-console-consumer",
                                     isolation_level=isolation_level) as consumer:
                    consumer.subscribe([topic])
                    drain(consumer, writer, interrupts, max_messages, timeout_ms)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how an unbounded consume ends; leaving the `with` closed the consumer
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


def drain(consumer: "Consumer", writer: "RecordWriter", interrupts: Interrupts, max_messages: int | None,
          timeout_ms: int | None) -> None:
    """Poll and write until `max_messages` records, `timeout_ms` without data, or Ctrl-C. A poll
    and the printing of what it returned are one step: Ctrl-C ends the loop between steps."""
    last_data = time.monotonic()
    while max_messages is None or writer.count < max_messages:
        wait_ms = POLL_MS
        if timeout_ms is not None:
            wait_ms = max(0, min(POLL_MS, int(timeout_ms - (time.monotonic() - last_data) * 1000)))
        limit = None if max_messages is None else max_messages - writer.count
        with interrupts.step():
            table = consumer.poll_arrow(timeout_ms=wait_ms, max_records=limit)
            if table.num_rows:
                writer(table)
        if table.num_rows:
            last_data = time.monotonic()
        elif timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= timeout_ms:
            break


# -- output formats ----------------------------------------------------------------------------


Emit = Callable[["pa.Table"], None]


def emitter(output_format: str, bytes_format: str, print_key: bool, print_offset: bool, separator: str) -> Emit:
    """The function that writes one polled RECORD_SCHEMA table to stdout in `output_format`, with
    keys and values printed as `bytes_format` says. Everything goes through write_stdout, so a
    batch is written whole even when Ctrl-C arrives while the pipe is full."""
    if output_format == "text":
        if bytes_format == "raw":
            return lambda table: write_stdout(raw_lines(table, print_key, print_offset, separator.encode()))
        text = bytes_text(bytes_format)
        return lambda table: write_stdout(text_lines(table, text, print_key, print_offset, separator).encode())
    if output_format == "json":
        value = json_bytes(bytes_format)
        return lambda table: write_stdout(json_lines(table, value).encode())
    if output_format == "table":
        text = bytes_text(bytes_format)
        return lambda table: write_stdout(rendered(rich_table(table, text)).encode())
    return CsvEmitter(bytes_format)


def rendered(renderable: Any) -> str:
    """What the console would print: with the terminal's width and colours, or unbounded when piped."""
    out = console()
    with out.capture() as captured:
        out.print(renderable)
    return captured.get()


class RecordWriter:
    """Writes polled RECORD_SCHEMA tables to stdout in one format and counts the records."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.count = 0

    def __call__(self, table: "pa.Table") -> None:
        self.emit(table)
        self.count += table.num_rows


def bytes_text(bytes_format: str) -> Callable[[bytes | None], str]:
    """Key, value or header value as text: `null` for none, else as `bytes_format` says."""
    def text(data: bytes | None) -> str:
        if data is None:
            return "null"
        if bytes_format == "hex":
            return data.hex()
        if bytes_format == "base64":
            return base64.b64encode(data).decode("ascii")
        if bytes_format == "auto":
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return "base64:" + base64.b64encode(data).decode("ascii")
        return data.decode("utf-8", errors="replace")

    return text


def json_bytes(bytes_format: str) -> Callable[[bytes | None], Any]:
    """Key, value or header value as a JSON value: null, a string, or for `auto` bytes that are
    not UTF-8, {"base64": ...}, so a reader never mistakes base64 for text."""
    if bytes_format != "auto":
        text = bytes_text(bytes_format)
        return lambda data: None if data is None else text(data)

    def value(data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(data).decode("ascii")}

    return value


def text_lines(table: "pa.Table", text: Callable[[bytes | None], str], print_key: bool, print_offset: bool,
               separator: str) -> str:
    values = [text(v) for v in table.column("value").to_pylist()]
    columns: list[list[str]] = []
    if print_offset:
        columns.append([f"{p}:{o}" for p, o in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist())])
    if print_key:
        columns.append([text(k) for k in table.column("key").to_pylist()])
    rows = zip(*columns, values) if columns else ((v,) for v in values)
    return "".join(separator.join(row) + "\n" for row in rows)


def raw_lines(table: "pa.Table", print_key: bool, print_offset: bool, separator: bytes) -> bytes:
    """Text lines with keys and values as their bytes (null for none), for binary-safe pipes."""
    def raw(data: bytes | None) -> bytes:
        return b"null" if data is None else data

    columns: list[list[bytes]] = []
    if print_offset:
        columns.append([f"{p}:{o}".encode() for p, o in zip(table.column("partition").to_pylist(),
                                                             table.column("offset").to_pylist())])
    if print_key:
        columns.append([raw(k) for k in table.column("key").to_pylist()])
    columns.append([raw(v) for v in table.column("value").to_pylist()])
    return b"".join(separator.join(row) + b"\n" for row in zip(*columns))


def iso_time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_lines(table: "pa.Table", value: Callable[[bytes | None], Any]) -> str:
    names = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    lines = []
    for topic, partition, offset, ts, key, data, headers in zip(*(table.column(n).to_pylist() for n in names)):
        record = {"topic": topic, "partition": partition, "offset": offset, "timestamp": iso_time(ts),
                  "key": value(key), "value": value(data),
                  "headers": [[h["key"], value(h["value"])] for h in headers or []]}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return "".join(lines)


def rich_table(table: "pa.Table", text: Callable[[bytes | None], str]) -> Any:
    from rich.table import Table

    out = Table()
    for header in ("partition", "offset", "timestamp", "key", "value"):
        out.add_column(header, overflow="fold", justify="right" if header in ("partition", "offset") else "left")
    names = ["partition", "offset", "timestamp", "key", "value"]
    for partition, offset, ts, key, value in zip(*(table.column(n).to_pylist() for n in names)):
        out.add_row(str(partition), str(offset), iso_time(ts), text(key), text(value))
    return out


class CsvEmitter:
    """Writes CSV to stdout with a header row before the first table only."""

    def __init__(self, bytes_format: str) -> None:
        self.bytes_format = bytes_format
        self.include_header = True

    def __call__(self, table: "pa.Table") -> None:
        write_stdout(csv_bytes(table, self.include_header, self.bytes_format))
        self.include_header = False


def csv_bytes(table: "pa.Table", include_header: bool, bytes_format: str = "utf8") -> bytes:
    """The table's CSV_COLUMNS as CSV, key and value as `bytes_format` prints them (an empty
    cell for none)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    selected = table.select(CSV_COLUMNS)
    text = bytes_text(bytes_format)
    for name in ("key", "value"):
        column = selected.column(name)
        as_text = _utf8(column) if bytes_format == "utf8" else pa.chunked_array(
            [pa.array([None if b is None else text(b) for b in column.to_pylist()], pa.string())])
        selected = selected.set_column(selected.schema.get_field_index(name), name, as_text)
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
