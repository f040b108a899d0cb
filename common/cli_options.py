"""The options and output that the `pymq` CLI and the Spark jobs' commands (jobs/) share: the
bootstrap address (`-b`), Spark settings (`-c`), KEY=VALUE parameters and the console.

It lives outside `cli` because the jobs' commands use it and `cli` loads the jobs
(by name, when one of their commands is asked for): a module of `cli` here would make the
two packages import each other. It imports only click and rich, so neither side pays for more.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import click
from rich.console import Console

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "PYMQ_BOOTSTRAP"
_BOOTSTRAP_KEY = "pymq.bootstrap"


# -- KEY=VALUE parameters -------------------------------------------------------------------------


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


# -- the bootstrap address and Spark settings --------------------------------------------------


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
