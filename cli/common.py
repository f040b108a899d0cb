"""Shared pieces of the `pymq` CLI: error reporting, lazily loaded command groups, client
construction, producer options, progress and Ctrl-C. The options and console that the Spark jobs'
commands share with the CLI are in common/cli_options.py.

Clients are imported inside the functions that build them so that `pymq --help` and
`pymq broker start` do not pay for (or depend on) the client stack.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

from common.cli_options import bootstrap, console
from common.errors import PymqError

if TYPE_CHECKING:
    from client import Admin, Consumer, Producer

# Errors the world causes (bad input, unreachable or refusing broker, missing file): reported in
# one red line instead of a traceback. Anything else is a bug and keeps its traceback.
OPERATING_ERRORS = (PymqError, ValueError, OSError)


# -- errors ------------------------------------------------------------------------------------


class OperatingError(click.ClickException):
    """An operating error turned into `error: NAME: message` on stderr and exit code 1."""

    exit_code = 1

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error

    def format_message(self) -> str:
        error = self.error
        name = error.name() if isinstance(error, PymqError) else type(error).__name__
        return f"error: {name}: {error or name}"

    def show(self, file: Any = None) -> None:
        click.secho(self.format_message(), err=True, fg="red")


class PymqGroup(click.Group):
    """The root group: converts operating errors raised by any subcommand into OperatingError."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # `pymq consume ... | head`: the reader left; stop quietly like other Unix tools.
            _silence_stdout()
            ctx.exit(0)
        except OPERATING_ERRORS as err:
            raise OperatingError(err) from err


class LazyGroup(click.Group):
    """A group whose commands live in modules imported only when one of them is asked for: the
    Spark jobs import pyspark and Delta Lake (seconds), which `pymq topic list` must not pay."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands  # name -> "module:attribute"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_commands:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = self.lazy_commands[cmd_name].partition(":")
        return getattr(importlib.import_module(module), attribute)


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - lives until exit


# -- bootstrap address and clients -------------------------------------------------------------


@contextlib.contextmanager
def admin_client() -> Iterator["Admin"]:
    from client import Admin

    # At a terminal an unreachable broker is reported at once (the command is rerun by hand),
    # not waited out for default.api.timeout.ms as a library caller's lookups are.
    with Admin(bootstrap(), default_api_timeout_ms=0) as admin:
        yield admin


@contextlib.contextmanager
def producer_client(config: dict[str, Any]) -> Iterator["Producer"]:
    """A Producer; closing it flushes and waits for every record's acknowledgement."""
    from client import Producer

    with Producer(bootstrap(), **config) as producer:
        yield producer


@contextlib.contextmanager
def consumer_client(**config: Any) -> Iterator["Consumer"]:
    from client import Consumer

    with Consumer(bootstrap(), **config) as consumer:
        yield consumer


def topic_partitions(topic: str, wanted: tuple[int, ...] = ()) -> list[tuple[str, int]]:
    """The (topic, partition) pairs to read: `wanted`, or every partition of the topic."""
    if wanted:
        return [(topic, p) for p in dict.fromkeys(wanted)]
    with admin_client() as admin:
        (description,) = admin.describe_topics([topic])
    return [(topic, p.partition) for p in description.partitions]


# -- producer options shared by `produce` and `perf produce` -----------------------------------

_PRODUCER_FLAGS = ("acks", "compression", "linger_ms", "batch_size")


def producer_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--acks, --compression, --linger-ms, --batch-size; unset ones keep the Producer's defaults."""
    options = [
        click.option("--acks", type=click.Choice(["0", "1", "all"]), default=None,
                     help="acknowledgements to wait for: 0 none, 1 the leader, all the ISR [producer default: 1]"),
        click.option("--compression", type=click.Choice(["none", "lz4", "zstd"]), default=None,
                     help="record batch body compression [producer default: none]"),
        click.option("--linger-ms", type=click.IntRange(min=0), default=None,
                     help="wait up to this long for a batch to fill [producer default: 5]"),
        click.option("--batch-size", type=click.IntRange(min=1), default=None,
                     help="seal a partition's batch at this many bytes [producer default: 262144]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def producer_config(flags: dict[str, Any], props: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """Producer keyword arguments: `props` (k=v, dotted or snake_case names), then explicit flags.

    Raises ValueError for a property the Producer does not take."""
    from client.producer import AsyncProducer

    parameters = inspect.signature(AsyncProducer.__init__).parameters.values()
    known = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    config: dict[str, Any] = {}
    for key, value in props:
        name = key.replace(".", "_").replace("-", "_")
        if name not in known:
            raise ValueError(f"unknown producer property {key!r}; known: {', '.join(sorted(known))}")
        config[name] = _number_or_text(value)
    config.update({name: flags[name] for name in _PRODUCER_FLAGS if flags.get(name) is not None})
    return config


def _number_or_text(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


# -- output ------------------------------------------------------------------------------------


def write_stdout(data: bytes) -> None:
    """All of `data` to stdout, then flushed. A signal handled while a write is blocked on a full
    pipe (Ctrl-C, as Interrupts defers it) makes the buffered writer return a partial count, which
    print() and click.echo drop without a word: so the rest is written until none is left."""
    out = click.get_binary_stream("stdout")
    view = memoryview(data)
    while view:
        view = view[out.write(view):]
    out.flush()


@contextlib.contextmanager
def steps() -> Iterator[Callable[[str], None]]:
    """Yield `step(text)`, which shows what a multi-step command is doing now (a spinner with the
    text on stderr) when stderr is a terminal, and does nothing otherwise: for commands made of a
    few long requests, where a bar of items has nothing to count."""
    if not sys.stderr.isatty():
        yield lambda text: None
        return
    with console(stderr=True).status("") as status:
        yield status.update


@contextlib.contextmanager
def progress_bar(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)`; draws a rich progress bar on stderr only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


# -- Ctrl-C ------------------------------------------------------------------------------------


class Interrupts:
    """Ctrl-C (SIGINT) that waits for the end of a step: inside `step()` the first Ctrl-C only
    sets `requested`, and KeyboardInterrupt is raised when the step ends, so a step (a record
    sent, a polled batch printed and counted) is done whole or not begun, and what a command
    reports after Ctrl-C is exact. Outside a step (waiting for input) Ctrl-C raises at once; a
    second Ctrl-C inside a step does too, for a step that hangs."""

    def __init__(self) -> None:
        self.requested = False
        self._in_step = False

    @contextlib.contextmanager
    def installed(self) -> Iterator["Interrupts"]:
        import signal

        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False
        if self.requested:
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._in_step and not self.requested:
            self.requested = True
            return
        self.requested = True
        raise KeyboardInterrupt
