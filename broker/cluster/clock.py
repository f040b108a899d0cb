"""Clock: the time source of lease deadlines, injectable so tests move time by hand (Kafka's `Time`).

A store asks the clock for the current monotonic time and for a timer at the next lease
deadline. `SystemClock` uses `time.monotonic` and the running event loop's timers; a test clock
advances on request and fires its due timers synchronously, so lease expiry needs no sleeping.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic seconds and one-shot timers. Timers call back on the event loop's thread."""

    def monotonic(self) -> float: ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer: ...


class SystemClock:
    """Real time: `time.monotonic` and `loop.call_later` (call only from a running loop)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(delay_s, 0.0), callback)
