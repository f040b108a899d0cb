"""The suite's one way to wait: poll a condition until it holds, never a bare sleep. `wait_until`
for threads, `wait_until_async` for coroutines on an event loop (it yields to the loop between polls)."""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05, *,
               tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """The first truthy value of `condition()`, polled every `interval_s`; AssertionError naming
    `what` if none comes within `timeout_s`.

    Exceptions from `condition` propagate, except those of a type in `tolerate`: they count as
    "not yet" (a broker restarting answers errors meanwhile), and the last one is named on timeout."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
        except tolerate as err:
            value, last_error = None, err
        if value:
            return value
        if time.monotonic() > deadline:
            cause = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError(f"not within {timeout_s} s: {what}{cause}")
        time.sleep(interval_s)


async def wait_until_async(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.01, *,
                           tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """`wait_until` on an event loop: the first truthy value of `condition()` (awaited if it returns
    an awaitable), polled every `interval_s` with the loop running meanwhile; AssertionError
    naming `what` if none comes within `timeout_s` of loop time. `tolerate` as for `wait_until`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except tolerate as err:
            value, last_error = None, err
        if value:
            return value
        if loop.time() > deadline:
            cause = f" (last error: {last_error!r})" if last_error is not None else ""
            raise AssertionError(f"not within {timeout_s} s: {what}{cause}")
        await asyncio.sleep(interval_s)
