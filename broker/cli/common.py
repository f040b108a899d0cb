"""Shared pieces of the `pymq` CLI: error reporting, KEY=VALUE options, the bootstrap address,
client construction, producer options, consoles and progress bars.

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
from rich.console import Console

from broker.errors import PymqError

if TYPE_CHECKING:
    from broker.client import Admin, Consumer, Producer

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "PYMQ_BOOTSTRAP"
_BOOTSTRAP_KEY = "pymq.bootstrap"

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


# -- KEY=VALUE options -------------------------------------------------------------------------


class KeyValue(click.ParamType):
    """`key=value` -> ("key", "value"); the value may be empty and may contain '='."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, rest = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key.strip(), rest


KEY_VALUE = KeyValue()


# -- bootstrap address and clients -------------------------------------------------------------


def remember_bootstrap(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Option callback: the last `-b` given (root group or command) wins for this invocation."""
    if value is not None:
        ctx.meta[_BOOTSTRAP_KEY] = value
    return value


def bootstrap_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Let a client command take `-b/--bootstrap-server` after its name too, as Kafka's tools do."""
    return click.option(
        "-b", "--bootstrap-server", default=None, expose_value=False, callback=remember_bootstrap,
        help=f"broker address host:port[,host:port...] [default: ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP}]",
    )(command)


def spark_conf_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`-c/--conf KEY=VALUE` (repeatable) for the commands that run Spark jobs."""
    return click.option(
        "-c", "--conf", "spark_conf", multiple=True, type=KeyValue(), metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.hadoop.fs.s3a.endpoint=http://... or spark.driver.memory=4g",
    )(command)


def bootstrap() -> str:
    return click.get_current_context().meta.get(_BOOTSTRAP_KEY, DEFAULT_BOOTSTRAP)


@contextlib.contextmanager
def admin_client() -> Iterator["Admin"]:
    from broker.client import Admin

    # At a terminal an unreachable broker is reported at once (the command is rerun by hand),
    # not waited out for default.api.timeout.ms as a library caller's lookups are.
    with Admin(bootstrap(), default_api_timeout_ms=0) as admin:
        yield admin


@contextlib.contextmanager
def producer_client(config: dict[str, Any]) -> Iterator["Producer"]:
    """A Producer; closing it flushes and waits for every record's acknowledgement."""
    from broker.client import Producer

    with Producer(bootstrap(), **config) as producer:
        yield producer


@contextlib.contextmanager
def consumer_client(**config: Any) -> Iterator["Consumer"]:
    from broker.client import Consumer

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
    from broker.client.producer import AsyncProducer

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


# The width of output that goes to a file or a pipe: wide enough that no table cell is ever folded
# or cut with an ellipsis (rich would otherwise take 80 columns, or COLUMNS), since what reads it
# (grep, awk, a file) has no screen to fit.
UNBOUNDED_WIDTH = 1 << 20


def console(stderr: bool = False) -> Console:
    """A rich console that never interprets markup in user data (values may contain '[...]'), as
    wide as the terminal, or unbounded when the output is piped or redirected."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False,
                   width=None if stream.isatty() else UNBOUNDED_WIDTH)


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
