"""`pymq produce`: one record per input line, like kafka-console-producer."""
from __future__ import annotations

from collections import deque
from typing import IO, Any, Iterable, Iterator

import click

from broker.cli.common import KEY_VALUE, bootstrap_option, producer_client, producer_config, producer_options

# Futures kept before checking the oldest for failures; bounds memory on endless input.
PENDING_WINDOW = 10_000


@click.command("produce")
@click.argument("topic")
@click.option("-f", "--file", "source", type=click.File("rb"), default="-",
              help="read records from this file [default: stdin]")
@click.option("--key-separator", default=None, metavar="SEP",
              help="split each line at the first SEP into key and value (a line without SEP is an error)")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="send every record to this partition [default: by key hash, or sticky when keyless]")
@producer_options
@click.option("-H", "--header", "headers", type=KEY_VALUE, multiple=True,
              help="add this header to every record, e.g. -H source=cli (repeatable)")
@bootstrap_option
def produce(topic: str, source: IO[bytes], key_separator: str | None, partition: int | None,
            headers: tuple[tuple[str, str], ...], **flags: Any) -> None:
    """Send each line of stdin or --file to TOPIC as one record (newline stripped).

    Waits until every record is acknowledged, then reports the count on stderr.
    """
    record_headers = [(key, value.encode()) for key, value in headers] or None
    separator = key_separator.encode() if key_separator is not None else None
    with producer_client(producer_config(flags)) as producer:
        pending: deque[Any] = deque()
        count = 0
        for key, value in split_lines(source, separator):
            pending.append(producer.send(topic, value, key, partition=partition, headers=record_headers))
            count += 1
            if len(pending) > PENDING_WINDOW:
                _check_done(pending)
        producer.flush()
        for future in pending:
            future.result()  # raises the first delivery failure
    click.echo(f"produced {count} records to {topic}", err=True)


def split_lines(lines: Iterable[bytes], separator: bytes | None) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) per line, newline stripped; key is None without a separator.

    Raises ValueError naming the line when a separator is given but missing from a line."""
    for number, line in enumerate(lines, 1):
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if separator is None:
            yield None, line
            continue
        key, found, value = line.partition(separator)
        if not found:
            raise ValueError(f"line {number} has no key separator {separator.decode()!r}")
        yield key, value


def _check_done(pending: deque[Any]) -> None:
    """Drop acknowledged futures from the front, raising the first failure."""
    while pending and pending[0].done():
        pending.popleft().result()
