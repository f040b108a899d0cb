"""`pymq produce`: one record per input line, like kafka-console-producer.

With `--key-separator`, a line without the separator is bad input, and what happens to the other
lines must never be a guess. A file (or stdin redirected from one) is checked whole before
anything is sent: a bad line means nothing is stored, and the error lists the bad line numbers.
A stream (a pipe, a terminal) cannot be read twice and may never end (`tail -f | pymq produce`),
so its lines are sent as they arrive, as kafka-console-producer does; the first bad line stops
the command after every earlier line is acknowledged, and the error says exactly which lines
were stored.
"""
from __future__ import annotations

from collections import deque
from typing import IO, Any, Iterable, Iterator

import click

from cli.common import Interrupts, producer_client, producer_config, producer_options, progress_bar
from common.cli_options import KEY_VALUE, bootstrap_option

# Futures kept before checking the oldest for failures; bounds memory on endless input.
PENDING_WINDOW = 10_000
PROGRESS_LINES = 1000  # lines between progress bar updates
# Bad line numbers named in one error message; the rest are counted.
REPORTED_LINES = 10


class MissingSeparatorError(ValueError):
    """Line `line_number` (1-based) has no key separator."""

    def __init__(self, line_number: int, separator: bytes) -> None:
        super().__init__(f"line {line_number} has no key separator {separator.decode(errors='replace')!r}")
        self.line_number = line_number


@click.command("produce")
@click.argument("topic")
@click.option("-f", "--file", "source", type=click.File("rb"), default="-",
              help="read records from this file [default: stdin]")
@click.option("--key-separator", default=None, metavar="SEP",
              help="split each line at the first SEP into key and value; a line without SEP is an error "
                   "(see above for what is stored then)")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="send every record to this partition [default: by key hash, or sticky when keyless]")
@producer_options
@click.option("-H", "--header", "headers", type=KEY_VALUE, multiple=True,
              help="add this header to every record, e.g. -H source=cli (repeatable)")
@bootstrap_option
def produce(topic: str, source: IO[bytes], key_separator: str | None, partition: int | None,
            headers: tuple[tuple[str, str], ...], **flags: Any) -> None:
    """Send each line of stdin or --file to TOPIC as one record (newline stripped).

    Waits until every record is acknowledged, then reports the count on stderr. A file shows a
    progress bar on a terminal. Ctrl-C stops reading, waits for what was sent to be acknowledged
    and says which lines were stored (exit code 130).

    \b
    Lines without the --key-separator (exit code 1, error naming the lines):
      a file, or stdin redirected from a file: every line is checked first;
        if any lacks the separator, nothing is sent and the first bad line
        numbers are listed.
      a pipe or terminal: lines are sent as they arrive; the first bad line
        stops the command once the lines before it are acknowledged, and the
        error says which lines were stored (lines 1 to N-1) and that nothing
        from line N on was sent.
    """
    record_headers = [(key, value.encode()) for key, value in headers] or None
    separator = key_separator.encode() if key_separator is not None else None
    if separator is not None and source.seekable():
        start = source.tell()
        _check_every_line(source, separator)
        source.seek(start)
    config = producer_config(flags)
    interrupts = Interrupts()
    with interrupts.installed(), producer_client(config) as producer, progress_bar(_size(source), "produce") as advance:
        pending: deque[Any] = deque()
        count = 0
        read = source.tell() if source.seekable() else 0  # the progress bar's bytes, for a file
        try:
            for key, value in split_lines(source, separator):  # Ctrl-C while reading: at once
                with interrupts.step():  # Ctrl-C while sending: after the line is sent whole
                    pending.append(producer.send(topic, value, key, partition=partition, headers=record_headers))
                    count += 1
                if len(pending) > PENDING_WINDOW:
                    _check_done(pending)
                if count % PROGRESS_LINES == 0 and source.seekable():
                    advance(source.tell() - read)
                    read = source.tell()
            _wait_acknowledged(producer, pending)
        except MissingSeparatorError as err:
            _wait_acknowledged(producer, pending)
            raise _stopped_at(err, count, config) from err
        except KeyboardInterrupt:
            _wait_acknowledged(producer, pending)  # a second Ctrl-C here ends the command at once
            click.echo(f"interrupted: {_lines(count)} {_stored(config)}, nothing after line {count} was sent",
                       err=True)
            raise click.exceptions.Exit(130) from None  # 128 + SIGINT, as a shell reports it
    click.echo(f"produced {count} records to {topic}", err=True)


def _size(source: IO[bytes]) -> int | None:
    """Bytes left to read in a file (for the progress bar); None for a stream."""
    if not source.seekable():
        return None
    here = source.tell()
    end = source.seek(0, 2)
    source.seek(here)
    return end - here


def _lines(count: int) -> str:
    return "no line" if count == 0 else "line 1 (1 record)" if count == 1 else f"lines 1-{count} ({count} records)"


def _stored(config: dict[str, Any]) -> str:
    return "were sent without acknowledgement (--acks 0)" if str(config.get("acks")) == "0" else "were stored"


def split_lines(lines: Iterable[bytes], separator: bytes | None) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) per line, newline stripped; key is None without a separator.

    Raises MissingSeparatorError (a ValueError) naming the line when a separator is given but
    missing from a line; the lines before it have been yielded."""
    for number, line in enumerate(lines, 1):
        line = _without_newline(line)
        if separator is None:
            yield None, line
            continue
        key, found, value = line.partition(separator)
        if not found:
            raise MissingSeparatorError(number, separator)
        yield key, value


def _without_newline(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return line


def lines_without_separator(lines: Iterable[bytes], separator: bytes) -> tuple[list[int], int]:
    """(the first REPORTED_LINES numbers of lines lacking `separator`, how many lack it in all)."""
    first: list[int] = []
    total = 0
    for number, line in enumerate(lines, 1):
        if separator not in _without_newline(line):
            total += 1
            if len(first) < REPORTED_LINES:
                first.append(number)
    return first, total


def _check_every_line(source: IO[bytes], separator: bytes) -> None:
    """Raise ValueError naming the bad lines of a file before anything is sent."""
    first, total = lines_without_separator(source, separator)
    if not total:
        return
    named = ", ".join(map(str, first)) + (f" and {total - len(first)} more" if total > len(first) else "")
    plural = "lines" if total > 1 else "line"
    raise ValueError(f"{plural} {named} {'have' if total > 1 else 'has'} no key separator "
                     f"{separator.decode(errors='replace')!r}; nothing was sent")


def _stopped_at(err: MissingSeparatorError, sent: int, config: dict[str, Any]) -> ValueError:
    """The error for a stream stopped at a bad line: which lines it left stored (every one sent was
    acknowledged before this is called)."""
    assert sent == err.line_number - 1, (sent, err.line_number)
    if sent == 0:
        return ValueError(f"{err}; nothing was sent")
    return ValueError(f"{err}; stopped there: {_lines(sent)} {_stored(config)}, nothing from line {err.line_number} on was sent")


def _wait_acknowledged(producer: Any, pending: deque[Any]) -> None:
    """Flush and raise the first delivery failure among `pending`."""
    producer.flush()
    for future in pending:
        future.result()


def _check_done(pending: deque[Any]) -> None:
    """Drop acknowledged futures from the front, raising the first failure."""
    while pending and pending[0].done():
        pending.popleft().result()
