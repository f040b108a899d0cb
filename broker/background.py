"""Background work that outlives its own failures.

Every periodic duty of the broker (retention, flush and checkpoint scheduling, idle connections,
tiering, group session timers, offset expiry) runs through `every`, and every other background
loop or task (the log cleaner's thread, a group append's completion) reports what it catches with
`report`: the exception is logged with its traceback, counted in `pymq_background_errors_total`
(label `task`), and the loop goes on with its next round. One bad log, one bug in a rare path must
never end session expiry, retention or cleaning for good, silently.

Counts are per process, which is per broker outside tests. Thread-safe.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

log = logging.getLogger("pymq.background")

_errors: Counter[str] = Counter()
_lock = threading.Lock()


def report(task: str) -> None:
    """Log the exception being handled (call it from an `except` block) and count it for `task`."""
    log.exception("background task %s failed; it keeps running", task)
    with _lock:
        _errors[task] += 1


def error_counts() -> dict[str, int]:
    """Errors reported so far, per task (what the metric serves)."""
    with _lock:
        return dict(_errors)


async def every(task: str, interval_s: float, duty: Callable[[], Awaitable[object] | object]) -> None:
    """Run `duty` every `interval_s` until cancelled; an exception is reported and the next round
    runs as usual. Cancellation (a stop) ends it at once, mid-round included."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            outcome = duty()
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            report(task)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passes; True if it was set. Cancellation always
    propagates: Python 3.11's `asyncio.wait_for(event.wait(), ...)` returns normally when the
    event is set in the loop turn the task is cancelled in (gh-86296), and a loop built on it
    (the controller's, a replica fetcher's) went on running, so a stop awaiting it hung until
    the process was killed (a broker stopped with the rest of its cluster, whose departures set
    the event, took the 30 s stop timeout)."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False
